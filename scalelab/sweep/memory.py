"""Will a training run fit in memory? Refuse a batch size no node can hold, before any run.

A rank needs its model state, four copies of the parameters in fp32 (weights, gradients, SGD
momentum, the engine's communication buffers), plus the activations autograd saves for
backward: the registry's measured bytes per image (bench/workloads/models.json), scaled by the
image area, halved under amp, with BACKWARD_SLACK for the transient buffers of backward, plus a
fixed runtime (CUDA context and workspaces on a GPU, the interpreter and torch on a CPU).

On a GPU node each rank has its own GPU's memory. On a CPU node the ranks of every node that
shares one memory pool (the facts' ``memory_pool``: emulated nodes on one host share the
host's) divide HOST_SHARE of it, less a warm-start server per such node where the sweep forks
its ranks from them (bench/workloads/warm.py). Nodes whose memory is unknown are not checked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scalelab.cluster.nodes import Node
from scalelab.core.errors import InputError

STATE_COPIES = 4  # weights, gradients, momentum, communication buffers (fp32)
BACKWARD_SLACK = 1.1  # transient gradient buffers while backward runs
GPU_RUNTIME_BYTES = 1 << 30  # CUDA context, cuDNN/cuBLAS workspaces, allocator slack
CPU_RUNTIME_BYTES = 512 << 20  # the interpreter, torch and the engine on a CPU rank
HOST_SHARE = 0.9  # of a host's memory, the rest left to the system
AMP_ACTIVATION_FACTOR = 0.5  # activations kept in 16 bits
# a warm-start server, resident for the sweep on each node that shares a host: VmRSS of
# `warm.py serve` with torch 2.13, DDP and the workloads imported, 297,052 kB measured; a rank
# forked from it shares those pages, and still counts its own runtime above
WARM_SERVER_BYTES = 304_000_000


def rank_bytes(params: int, activation_bytes: int, batch: int, *, gpu: bool,
               image_scale: float = 1.0, amp: bool = False) -> int:
    """Bytes one training rank needs at a per-rank batch size.

    Worked example, resnet50 (25,557,032 params, 85,909,504 bytes per image) at batch 32 on a
    GPU in fp32: state 4 x 4 x 25.56e6 = 409 MB; activations 32 x 85.9 MB x 1.1 = 3.02 GB;
    plus 1 GiB runtime: 4.51 GB.

    >>> round(rank_bytes(25_557_032, 85_909_504, 32, gpu=True) / 1e9, 2)
    4.51
    """
    state = STATE_COPIES * 4 * params
    act = activation_bytes * image_scale * (AMP_ACTIVATION_FACTOR if amp else 1.0)
    runtime = GPU_RUNTIME_BYTES if gpu else CPU_RUNTIME_BYTES
    return int(state + batch * act * BACKWARD_SLACK + runtime)


def largest_batch(params: int, activation_bytes: int, budget: float, *, gpu: bool,
                  image_scale: float = 1.0, amp: bool = False) -> int:
    """The largest per-rank batch whose rank_bytes fit in budget bytes (0 if none does).

    >>> largest_batch(25_557_032, 85_909_504, 16e9, gpu=True)  # a 16 GB GPU, fp32
    153
    """
    fixed = rank_bytes(params, activation_bytes, 0, gpu=gpu, image_scale=image_scale, amp=amp)
    per = rank_bytes(params, activation_bytes, 1, gpu=gpu, image_scale=image_scale,
                     amp=amp) - fixed
    return max(0, math.floor((budget - fixed) / per)) if per > 0 else 0


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def check(nodes: Sequence[Node], node_counts: Sequence[int], procs_per_node: Sequence[int],
          batch_sizes: Sequence[int], *, model: str, params: int, activation_bytes: int,
          image_scale: float = 1.0, amp: bool = False, warm_servers: bool = False) -> None:
    """Raise InputError (one line, with the largest batch that fits) if a planned run cannot fit.

    nodes are the cluster's, in the order runs take them (a run on n nodes uses the first n).
    The tightest planned layout decides, so the batch the message offers fits every run: the
    most nodes (more of them share a host's memory) at the most procs per node. warm_servers:
    the ranks are forked from warm-start servers, one per node of a shared pool.
    """
    used, ppn = list(nodes[:max(node_counts)]), max(procs_per_node)
    # (bytes per rank, ranks sharing them, where, on a GPU) for every GPU and host memory pool
    budgets = [(_gpu_mb(u) * (1 << 20), 1, f"node {u.name}'s {_gib(_gpu_mb(u) * (1 << 20))} GPU",
                True) for u in used if u.gpus > 0 and _gpu_mb(u)]
    pools: dict[str, list[Node]] = {}
    for u in used:
        if u.gpus == 0 and _host_mb(u):
            pools.setdefault(str(u.facts.get("memory_pool") or u.name), []).append(u)
    for members in pools.values():
        host = _host_mb(members[0]) * (1 << 20) * HOST_SHARE
        where = (f"node {members[0].name}'s {_gib(host)}" if len(members) == 1 else
                 f"the {_gib(host)} that nodes {members[0].name}-{members[-1].name} share")
        servers = len(members) * WARM_SERVER_BYTES if warm_servers \
            and members[0].facts.get("memory_pool") else 0
        if servers:
            where += f" (less {_gib(servers)} for their warm-start servers)"
        budgets.append(((host - servers) / (ppn * len(members)), ppn * len(members), where,
                        False))
    if not budgets:
        return  # memory unknown: nothing to check against
    budget, ranks, where, gpu = min(budgets, key=lambda b: b[0])
    fits = largest_batch(params, activation_bytes, budget, gpu=gpu, image_scale=image_scale,
                         amp=amp)
    b = max(batch_sizes)
    if b <= fits:
        return
    need = rank_bytes(params, activation_bytes, b, gpu=gpu, image_scale=image_scale, amp=amp)
    held = f"each of {ranks} ranks" if ranks > 1 else "its rank"
    fix = (f"use --batch-size {fits} or less" if fits >= 1 else
           "use fewer nodes or procs per node, or nodes with more memory")
    raise InputError(f"--batch-size {b}: {model} needs about {_gib(need)} per rank at batch {b}, "
                     f"more than {where} give {held}; the largest batch that fits every planned "
                     f"run is {fits}: {fix}")


def _gpu_mb(node: Node) -> float:
    return float(node.facts.get("gpu_memory_mb") or 0)


def _host_mb(node: Node) -> float:
    return float(node.facts.get("memory_mb") or 0)
