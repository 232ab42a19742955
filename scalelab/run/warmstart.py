"""Warm-start servers for a sweep on nodes that share one host's cores (the local target).

One `bench/workloads/warm.py serve` per node imports torch once per sweep; every run's ranks
are then forked from it (commands.direct_commands with warm=...), each a new process with a new
model and process group. The servers are a launch like any run's: a process group per node
found by its token, listed in the sweep's .warm.json while they live, so that a driver killed
with SIGKILL leaves them to `--resume` (or destroy) to end.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from pathlib import Path

from scalelab.cluster.nodes import Node
from scalelab.cluster.targets.interface import Runtime
from scalelab.run import commands, launch, reap

log = logging.getLogger(__name__)

WARM = ".warm.json"  # in the sweep directory
READY = "SCALELAB_WARM ready"


class WarmPool:
    """The warm-start servers of one sweep execution."""

    def __init__(self, nodes: list[Node], rt: Runtime, marker: Path) -> None:
        # a fresh name per execution: a server left by a killed driver (older code, perhaps)
        # is never used by the next one
        self.name = f"scalelab-warm-{secrets.token_hex(6)}"
        self.marker = marker
        self.known_hosts = rt.known_hosts
        self.launch = launch.Launch(
            [commands.RankCommand(n, [rt.python, f"{rt.workdir}/{commands.WORKLOADS}/warm.py",
                                    "serve", self.name], commands.rank_env(n, 1))
             for n in nodes], rt)

    def start(self, timeout_s: float = 120.0, stop: threading.Event | None = None) -> bool:
        """Start a server on every node and wait until each listens.

        False (and nothing left running) when one did not come up: the ranks then start cold,
        which is slower and measures the same.
        """
        t0 = time.monotonic()
        # servers an earlier driver listed and could not end stay listed until ended
        self.launch.pending = reap.end_leftovers(self.marker, self.known_hosts)
        self.launch.start(self.marker)
        n = len(self.launch.commands)
        while time.monotonic() - t0 < timeout_s and not (stop is not None and stop.is_set()):
            up = [READY in self.launch.printed(i) for i in range(n)]
            if all(up):
                reap.save_inflight(self.marker, self.launch.entries())  # with the group ids
                log.info("warm-start servers up on %d nodes in %.1f s", n, time.monotonic() - t0)
                return True
            if any(c is not None for c in self.launch.exited()):
                break
            time.sleep(0.1)
        outs = self.launch.outcomes()
        why = next((launch.rank_reason(o.stderr, o.returncode) for o in outs
                    if o.returncode not in (None, 0)), "not ready in time")
        log.warning("warm start unavailable (%s): ranks start cold", why)
        self.stop()
        return False

    def stop(self) -> None:
        """End every server (TERM, then KILL, by process group) and forget them."""
        self.launch.reap()
        try:
            reap.save_inflight(self.marker, self.launch.pending)
        except reap.LaunchError as exc:
            log.warning("%s", exc)
