#!/usr/bin/env python3
"""nccl-tests-style allreduce bandwidth probe over torch.distributed (gloo on CPU, nccl on GPU).

    torchrun --nproc-per-node N [--nnodes ...] bench/workloads/allreduce.py \
        [--min-bytes 4K] [--max-bytes 64M] [--factor 4] [--iters 20] [--warmup 5] \
        [--dtype float32] [--device auto|cpu|cuda] [--backend auto|gloo|nccl]

For each message size (min, min*factor, ... <= max) every rank runs `warmup` untimed then
`iters` timed back-to-back allreduces (sum) of one tensor, after a barrier; its time is the mean
per allreduce. Rank 0 gathers every rank's time and prints one `SCALELAB_RESULT {json}`:

    {"world_size", "backend", "dtype", "iters", "warmup",
     "sizes": [{"size_bytes", "time_s", "algbw_mb_s", "busbw_mb_s", "per_rank_time_s": [...]}]}

time_s is the slowest rank's time (a collective is done when its last rank is), and, as in
nccl-tests (doc/PERFORMANCE.md), with MB = 1e6 bytes:

    algbw_mb_s = size_bytes / time_s / 1e6
    busbw_mb_s = algbw_mb_s * 2 * (n - 1) / n

busbw is what each rank's link carries in a ring allreduce, comparable to the link speed
whatever the rank count (and 0 for one rank, which moves nothing).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def message_sizes(min_bytes: int, max_bytes: int, factor: int, elem_bytes: int = 4) -> list[int]:
    """Sizes from min to max (inclusive) multiplying by factor, rounded down to whole elements.

    >>> message_sizes(4096, 65536, 4)
    [4096, 16384, 65536]
    >>> message_sizes(6, 40, 2)
    [4, 12, 24]
    """
    if min_bytes < elem_bytes or max_bytes < min_bytes:
        raise ValueError(f"need {elem_bytes} <= min-bytes <= max-bytes, got {min_bytes}, {max_bytes}")
    if factor < 2:
        raise ValueError(f"--factor must be >= 2, got {factor}")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s - s % elem_bytes)
        s *= factor
    return sizes


def bandwidths(size_bytes: int, time_s: float, world_size: int) -> tuple[float, float]:
    """(algbw_mb_s, busbw_mb_s) for one allreduce of size_bytes taking time_s on world_size ranks.

    >>> bandwidths(64_000_000, 0.5, 4)
    (128.0, 192.0)
    """
    if time_s <= 0:
        raise ValueError(f"time must be > 0, got {time_s}")
    algbw = size_bytes / time_s / 1e6
    return algbw, algbw * 2 * (world_size - 1) / world_size


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="allreduce bandwidth probe (nccl-tests style)")
    p.add_argument("--min-bytes", default="4K", help="smallest message (suffix K/M/G = 2^10..)")
    p.add_argument("--max-bytes", default="64M", help="largest message")
    p.add_argument("--factor", type=int, default=4, help="size multiplier between steps")
    p.add_argument("--iters", type=int, default=20, help="timed allreduces per size")
    p.add_argument("--warmup", type=int, default=5, help="untimed allreduces per size")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--timeout-s", type=float, default=600.0, help="collective timeout")
    p.add_argument(
        "--dilation",
        type=float,
        default=1.0,
        help="time dilation k of an emulated cluster (links shaped to rate/k): times are reported divided by k",
    )
    a = p.parse_args(argv)
    try:
        a.sizes = message_sizes(
            common.parse_size(a.min_bytes), common.parse_size(a.max_bytes), a.factor, DTYPES[a.dtype]
        )
    except ValueError as e:
        p.error(str(e))
    if a.iters < 1 or a.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    if not a.dilation >= 1:
        p.error(f"--dilation must be >= 1, got {a.dilation}")
    return a


def run(a: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    device = common.resolve_device(a.device, int(os.environ.get("LOCAL_RANK", "0")))
    backend = a.backend if a.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    rank, world, _ = common.init_torch_distributed(backend, a.timeout_s)
    dtype = getattr(torch, a.dtype)
    common.log("rank %d/%d on %s backend %s, %d sizes", rank, world, socket.gethostname(), backend, len(a.sizes))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    mine = []
    for size in a.sizes:
        t = torch.ones(size // DTYPES[a.dtype], dtype=dtype, device=device)
        for _ in range(a.warmup):
            dist.all_reduce(t)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            dist.all_reduce(t)
        sync()
        mine.append((time.perf_counter() - t0) / a.iters / a.dilation)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "host": socket.gethostname(), "times": mine})
    if rank == 0:
        gathered.sort(key=lambda g: g["rank"])
        sizes = []
        for i, size in enumerate(a.sizes):
            per_rank = [g["times"][i] for g in gathered]
            time_s = max(per_rank)
            algbw, busbw = bandwidths(size, time_s, world)
            sizes.append(
                {
                    "size_bytes": size,
                    "time_s": time_s,
                    "algbw_mb_s": algbw,
                    "busbw_mb_s": busbw,
                    "per_rank_time_s": per_rank,
                }
            )
        common.emit_result(
            {
                "world_size": world,
                "backend": backend,
                "dilation": a.dilation,
                "dtype": a.dtype,
                "iters": a.iters,
                "warmup": a.warmup,
                "sizes": sizes,
                "hosts": [g["host"] for g in gathered],
                "env": common.env_fingerprint([g["host"] for g in gathered]),
            }
        )
    # as in resnet.py: every rank's last sends are done before any rank tears its group down
    # and leaves (a peer's sockets closing under a collective still in flight aborts gloo)
    dist.barrier()
    dist.destroy_process_group()
    return 0


@common.recorded
def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    common.exit_now(main())
