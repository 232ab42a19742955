"""The parameter servers' push and pull against DDP's allreduce, alone: ResNet-50's gradients.

Two processes on this host over Gloo (loopback TCP), no model and no training: --mode ring
allreduces ResNet-50's 25.6 M fp32 gradients in 25 MB buckets, as DDP does; --mode ps pushes
the same buckets from one worker to one server (bench/workloads/psengine.py, its pieces and
all) and pulls the sums back. Both move the same bytes each way per process. Prints the
milliseconds a step of each takes, the median of --repeats runs of --steps steps, so that the
engine's own exchange can be told apart from what a training run adds around it.

Usage: .venv/bin/python bench/perf/ps_exchange.py [--steps 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARAMS = 25_557_032  # ResNet-50's
# DDP's 25 MB buckets, in fp32 elements (ps_links.py --bucket-mb sets another size)
BUCKET = int(os.environ.get("SCALELAB_BUCKET_MB", "25")) * (1 << 20) // 4


def _buckets():
    import torch

    sizes, left = [], PARAMS
    while left > 0:
        sizes.append(min(BUCKET, left))
        left -= sizes[-1]
    return [torch.randn(s) for s in sizes]


class _Timer:  # what psengine.Pusher asks of engines.CommTimer
    lock = threading.Lock()
    launches: list = []
    intervals: list = []
    average = True

    class clock:  # noqa: N801 - the attribute psengine reads
        @staticmethod
        def mark() -> float:
            return time.perf_counter()


def rank(mode: str, steps: int) -> None:
    """One process of the pair (run under torchrun)."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "bench" / "workloads"))
    import psengine

    dist.init_process_group("gloo")
    bufs = _buckets()
    if mode == "ring":
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            for w in [dist.all_reduce(b, async_op=True) for b in bufs]:
                w.wait()
        took = (time.perf_counter() - t0) / steps
    else:
        roles = psengine.roles(1)
        if roles.server:
            psengine.serve(roles, "here")
            took = None
        else:
            pusher = psengine.Pusher(roles, _Timer, None, True)
            t0 = time.perf_counter()
            for _ in range(steps):
                futs = []
                for i, b in enumerate(bufs):
                    fut: torch.futures.Future = torch.futures.Future()
                    pusher.submit(b, fut, i == len(bufs) - 1)
                    futs.append(fut)
                for fut in futs:
                    fut.wait()
            took = (time.perf_counter() - t0) / steps
            pusher.finish()
            psengine.server_records(None)
    if dist.get_rank() == 0 and took is not None:
        print(f"STEP_MS {took * 1e3:.2f}", flush=True)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rank", choices=["ring", "ps"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank:
        rank(a.rank, a.steps)
        return 0
    if not (1 <= a.steps <= 100 and 1 <= a.repeats <= 10):
        ap.error("--steps 1-100, --repeats 1-10")
    got: dict[str, list[float]] = {"ring": [], "ps": []}
    for _ in range(a.repeats):
        for mode in got:
            torchrun = Path(sys.executable).parent / "torchrun"
            out = subprocess.run(
                [str(torchrun), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                 "--master-port", str(29400 + os.getpid() % 500), __file__, "--rank", mode,
                 "--steps", str(a.steps)], capture_output=True, text=True, timeout=300,
                check=True).stdout
            got[mode].append(float(out.split("STEP_MS")[1].split()[0]))
    ring, ps = (statistics.median(got[m]) for m in ("ring", "ps"))
    print(f"ResNet-50's gradients ({PARAMS * 4 / 1e6:.0f} MB fp32, "
          f"{BUCKET * 4 >> 20} MB buckets), 2 processes "
          f"over loopback, median of {a.repeats}: allreduce {ring:.1f} ms a step; one worker "
          f"and one server, push and pull, {ps:.1f} ms ({ps / ring - 1:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
