"""Ring allreduce against parameter servers: the bytes each NIC carries, and which is faster.

A step's gradients, S bytes a worker, are summed across W = N x G workers (N nodes of G
ranks). Every link is full duplex, so what paces a step is the busiest NIC's bytes in one
direction:

* ring allreduce: each rank sends and receives 2(W-1)/W x S (reduce-scatter, allgather);
* parameter servers on K nodes of their own (BytePS's CPU servers): a worker node sends its
  G workers' S each (push) and receives as much (pull); a server node receives W x S/K
  (its shard from every worker) and sends as much back;
* parameter servers colocated, one on every worker node: a node pushes the (N-1)/N of its
  workers' gradients that other nodes' servers hold and answers the other nodes' workers
  with its own shard, 2 G (N-1)/N x S in each direction, the ring's bytes.

So K dedicated servers beat the ring at N > 2 nodes of one rank when max(S, N S/K) is below
2(N-1)/N x S: from K > N^2 / (2(N-1)) servers, and by at most 2(N-1)/N (BytePS's analysis
of its summation service comes to the same bound). A bucket is pushed, summed and pulled:
two hops of latency against the ring's 2(W-1).

Pure functions of numbers; the timeline that overlaps them with backward is
bucket_model's, the report's tables are scalelab.report's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DEDICATED, COLOCATED = "dedicated", "colocated"


@dataclass(frozen=True)
class Layout:
    """Where a run's gradients are summed: ring (servers 0) or K parameter servers."""

    nodes: int  # the nodes the workers run on
    procs_per_node: int = 1
    servers: int = 0  # K; colocated: one a worker node
    placement: str = ""  # DEDICATED or COLOCATED for parameter servers, "" for the ring

    @property
    def ps(self) -> bool:
        return self.placement in (DEDICATED, COLOCATED)

    @property
    def workers(self) -> int:
        return self.nodes * self.procs_per_node


def of_row(row: Any) -> Layout:
    """A run's or a summary row's layout (engine, nodes, procs_per_node, ps_placement,
    ps_servers); rows of the other engines are rings.

    >>> of_row({"engine": "ps", "nodes": 4, "procs_per_node": 1, "ps_placement": "dedicated",
    ...         "ps_servers": 2.0})
    Layout(nodes=4, procs_per_node=1, servers=2, placement='dedicated')
    >>> of_row({"engine": "ps", "nodes": 4, "procs_per_node": 1, "ps_placement": "colocated"})
    Layout(nodes=4, procs_per_node=1, servers=4, placement='colocated')
    """
    def get(key: str) -> Any:
        v = row.get(key) if hasattr(row, "get") else None
        return None if isinstance(v, float) and math.isnan(v) else v

    nodes, ppn = int(get("nodes") or 1), int(get("procs_per_node") or 1)
    if get("engine") != "ps":
        return Layout(nodes, ppn)
    placement = str(get("ps_placement") or DEDICATED)
    servers = nodes if placement == COLOCATED else int(get("ps_servers") or 1)
    return Layout(nodes, ppn, servers, placement)


def nic_bytes(layout: Layout, nbytes: float) -> dict[str, float]:
    """Bytes one NIC carries in each direction to sum nbytes of every worker's gradients:
    {"worker": a worker node's, "server": a dedicated server node's (dedicated only)}.

    >>> nic_bytes(Layout(4, 1), 100.0)
    {'worker': 150.0}
    >>> nic_bytes(Layout(4, 1, 2, DEDICATED), 100.0)
    {'worker': 100.0, 'server': 200.0}
    >>> nic_bytes(Layout(4, 1, 4, COLOCATED), 100.0)
    {'worker': 150.0}
    """
    n, g, w = layout.nodes, layout.procs_per_node, layout.workers
    if layout.placement == DEDICATED:
        return {"worker": g * nbytes, "server": w * nbytes / layout.servers}
    if layout.placement == COLOCATED:
        return {"worker": 2 * g * nbytes * (n - 1) / n}
    # a flat ring of W ranks, G of them behind each NIC (the model's ring, analysis.py)
    return {"worker": 2 * (w - 1) / w * nbytes if w > 1 else 0.0}


def busiest(layout: Layout, nbytes: float) -> tuple[str, float]:
    """The NIC that paces the step and its bytes in each direction.

    >>> busiest(Layout(4, 1, 1, DEDICATED), 100.0)
    ('server', 400.0)
    >>> busiest(Layout(4, 1, 8, DEDICATED), 100.0)
    ('worker', 100.0)
    """
    per = nic_bytes(layout, nbytes)
    return max(per.items(), key=lambda kv: (kv[1], kv[0] == "worker"))


def hops(layout: Layout) -> int:
    """The per-message latencies one bucket pays: push and pull, or the ring's 2(W-1)."""
    if layout.ps:
        return 2
    return 2 * (layout.workers - 1) if layout.workers > 1 else 0


def transfer_s(layout: Layout, nbytes: float, link_mbit: float) -> tuple[float, float]:
    """(the link time of one bucket in its busiest direction, the time the last bucket's pull
    adds after it): dedicated servers push on a worker's egress and pull on its ingress, so
    the pull of one bucket rides beside the push of the next and only the last one's shows;
    colocated servers and the ring carry both on every NIC's egress.

    >>> transfer_s(Layout(2, 1, 1, DEDICATED), 125e6, 1000.0)
    (2.0, 2.0)
    >>> transfer_s(Layout(2, 1), 125e6, 1000.0)
    (1.0, 0.0)
    """
    if not link_mbit or math.isinf(link_mbit):
        return 0.0, 0.0
    x = busiest(layout, nbytes)[1] / (link_mbit * 1e6 / 8)
    return x, (x if layout.placement == DEDICATED else 0.0)


def comm_time_s(layout: Layout, nbytes: float, link_mbit: float, alpha_s: float) -> float:
    """One step's gradients summed with nothing overlapped (the ring model's counterpart).

    >>> round(comm_time_s(Layout(4, 1), 100e6, 1000.0, 0.0), 3)        # the ring: 1.5 x S/B
    1.2
    >>> round(comm_time_s(Layout(4, 1, 4, DEDICATED), 100e6, 1000.0, 0.0), 3)  # S/B, twice
    1.6
    """
    x, tail = transfer_s(layout, nbytes, link_mbit)
    return x + tail + hops(layout) * alpha_s


def servers_to_beat_ring(nodes: int) -> int | None:
    """The fewest dedicated servers whose busiest NIC carries fewer bytes than the ring's, for
    N nodes of one rank; None where no count does (up to two nodes a worker's own S each way
    is already the ring's 2(N-1)/N x S).

    >>> [servers_to_beat_ring(n) for n in (1, 2, 3, 4, 8, 16)]
    [None, None, 3, 3, 5, 9]
    """
    if nodes <= 2:
        return None
    return math.floor(nodes * nodes / (2 * (nodes - 1))) + 1


def best_speedup(nodes: int) -> float:
    """The most dedicated servers can gain over the ring in bytes: 2(N-1)/N.

    >>> best_speedup(8)
    1.75
    """
    return 2 * (nodes - 1) / nodes if nodes > 1 else 1.0
