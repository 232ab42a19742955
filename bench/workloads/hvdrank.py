#!/usr/bin/env python3
"""Start a node's Horovod ranks without horovodrun.

For ranks in containers: horovodrun starts the ranks of other nodes over SSH, which would
need an SSH server in every container. Here the launcher gives each node its place instead
(HOROVOD_SLOTS, every node's name and rank count; HOROVOD_NODE_INDEX, this node's place in
it; the gloo rendezvous address and interface), and this script sets per rank what
horovodrun's gloo mode would:

    HOROVOD_SLOTS=lab-n0:2,lab-n1:2 HOROVOD_NODE_INDEX=1 ... hvdrank.py resnet.py --steps 20

runs the node's ranks of resnet.py, each with its HOROVOD_RANK, HOROVOD_LOCAL_RANK,
HOROVOD_CROSS_RANK and HOROVOD_HOSTNAME: one in this process, several as child processes,
exiting with the first non-zero exit among them. Node 0 also serves the gloo rendezvous
(Horovod's own HTTP rendezvous server, as horovodrun runs it) on HOROVOD_GLOO_RENDEZVOUS_PORT.
"""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
import threading
from types import SimpleNamespace


def slots(spec: str) -> list[tuple[str, int]]:
    """HOROVOD_SLOTS "a:2,b:2" as [(host, ranks)].

    >>> slots("lab-n0:2,lab-n1:1")
    [('lab-n0', 2), ('lab-n1', 1)]
    """
    out = []
    for item in spec.split(","):
        host, _, n = item.rpartition(":")
        out.append((host, int(n)))
    return out


def plan(hosts: list[tuple[str, int]]) -> list[SimpleNamespace]:
    """One slot per rank, numbered host by host, as Horovod's host assignment does.

    >>> [(s.rank, s.hostname, s.local_rank, s.cross_rank, s.cross_size)
    ...  for s in plan([("a", 2), ("b", 1)])]
    [(0, 'a', 0, 0, 2), (1, 'a', 1, 0, 1), (2, 'b', 0, 1, 2)]
    """
    size = sum(n for _, n in hosts)
    out, rank = [], 0
    for host, n in hosts:
        for local in range(n):
            # the ranks with this local rank, one per host that has that many
            cross = [h for h, m in hosts if m > local]
            out.append(SimpleNamespace(rank=rank, size=size, hostname=host, local_rank=local,
                                       local_size=n, cross_rank=cross.index(host),
                                       cross_size=len(cross)))
            rank += 1
    return out


def serve(port: int, slots_plan: list[SimpleNamespace]) -> None:
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    server = RendezvousHTTPServer(("0.0.0.0", port), RendezvousHandler, 0)
    server.init(slots_plan)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def rank_env(slot: SimpleNamespace) -> dict[str, str]:
    return {"HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank),
            "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank),
            "HOROVOD_CROSS_SIZE": str(slot.cross_size), "HOROVOD_HOSTNAME": slot.hostname,
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: hvdrank.py SCRIPT [ARGS...] (with HOROVOD_SLOTS and HOROVOD_CROSS_RANK "
              "set by the launcher)", file=sys.stderr)
        return 2
    hosts = slots(os.environ["HOROVOD_SLOTS"])
    node = int(os.environ["HOROVOD_NODE_INDEX"])
    every = plan(hosts)
    mine = [s for s in every if s.hostname == hosts[node][0]]
    if node == 0:
        serve(int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]), every)
    script, args = sys.argv[1], sys.argv[2:]
    if len(mine) == 1:
        os.environ.update(rank_env(mine[0]))
        sys.argv = [script, *args]
        runpy.run_path(script, run_name="__main__")
        return 0
    # several ranks here: one child each
    procs = [subprocess.Popen([sys.executable, script, *args], env={**os.environ,
                                                                   **rank_env(s)})
             for s in mine]

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
