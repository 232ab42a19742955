"""Emulated accelerators during a sweep: the dilation factor of each link rate, and the device
profiles staged on the nodes.

k (time dilation) is the sweep's when it gives one. Otherwise, on a target whose nodes share one
host, the first emulated run calibrates what the host can move (one TCP stream between two
nodes, links unshaped) and every link rate gets the smallest whole k at which all the nodes that
rate is planned for can send at rate / k together within half of that (accel.auto_dilation); on
a real cluster every node has its own NIC, so k is 1.
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
from collections.abc import Callable
from typing import Any

from scalelab import accel, ssh
from scalelab.errors import ClusterError
from scalelab.nodes import Node

log = logging.getLogger(__name__)


class Emulation:
    def __init__(self, runs: list, nodes: list[Node], known_hosts: str, workdir: str,
                 shared_host: bool, calibrate: Callable[[], float | None]) -> None:
        self.nodes = nodes
        self.known_hosts = known_hosts
        self.workdir = workdir
        self.shared_host = shared_host
        self._calibrate = calibrate
        self.host_mbit: float | None = None
        self._calibrated = False
        self._k: dict[Any, float] = {}
        self._staged: set[str] = set()
        self._most_nodes: dict[Any, int] = {}
        for r in runs:
            rate = r.params.get("bandwidth_mbit")
            self._most_nodes[rate] = max(self._most_nodes.get(rate, 1), r.params["nodes"])

    def dilation(self, run) -> float:
        """k for this run: 1 when it computes for real."""
        p = run.params
        if not p.get("accelerator"):
            return 1.0
        if p.get("dilation"):
            return float(p["dilation"])
        rate = p.get("bandwidth_mbit")
        if rate not in self._k:
            if self.shared_host and rate and not self._calibrated:
                self.host_mbit = self._calibrate()
                self._calibrated = True
                log.info("host calibration: one stream moves %s Mbit/s",
                         f"{self.host_mbit:.0f}" if self.host_mbit else "(failed)")
            self._k[rate] = (accel.auto_dilation(self._most_nodes.get(rate, 1), rate, self.host_mbit)
                             if self.shared_host else 1.0)
        return self._k[rate]

    def with_dilation(self, run, k: float):
        """The run as recorded: params carry the k it ran at."""
        if not run.params.get("accelerator"):
            return run
        return dataclasses.replace(run, params={**run.params, "dilation": k})

    def stage(self, run) -> str | None:
        """Put the run's profile on every node (once per content); its path there."""
        p = run.params
        if not p.get("accelerator") or run.kind != "train":
            return None
        doc = accel.resolve(p["accelerator"], p["model"], p["precision"], p["batch_size"],
                            p["image_size"])
        rel = accel.staged_path(doc)
        path = f"{self.workdir}/bench/workloads/{rel}"
        if rel not in self._staged:
            text = accel.canonical(doc)
            line = (f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && printf %s "
                    f"{shlex.quote(text)} > {shlex.quote(path)}.tmp && mv {shlex.quote(path)}.tmp "
                    f"{shlex.quote(path)}")
            _, errors = ssh.on_each(self.nodes, lambda n: ssh.run(n, self.known_hosts, line))
            bad = ssh.first_error(self.nodes, errors)
            if bad:
                raise ClusterError(f"cannot stage the {p['accelerator']} profile on node {bad[0]}: "
                                   f"{bad[1]}")
            self._staged.add(rel)
        return path
