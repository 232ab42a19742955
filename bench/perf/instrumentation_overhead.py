"""Does scalelab's measurement slow what it measures? Its workload against a bare training loop.

For each engine, one worker runs, in alternation, round after round:
  * scalelab's workload (bench/workloads/resnet.py: per-step clocks, the DDP communication hook
    or Horovod synchronize() timing, in-flight intervals), reporting its own images/s;
  * a bare loop in the manner of Horovod's examples/pytorch/pytorch_synthetic_benchmark.py
    (the same model from bench/workloads/models.py, the same SGD, synthetic batch, DDP or
    hvd.DistributedOptimizer, no per-step instrumentation), timed from outside over
    --iters iterations of --batches-per-iter batches, images/s = batch x batches / time.
Same model, batch, threads and steps for both; it prints every round, the medians, the ratio
of the medians and the spread of the per-round ratios (aim: 99 % or more, i.e. instrumentation
costs at most 1 %). With --cpu (default: the last CPU, on a host with two or more) every program
is pinned to that one CPU and runs one thread, so the rest of the host's work lands on the
other CPUs instead of in the figures: on a 2-core host that is what makes 1 % resolvable.

Usage: .venv/bin/python bench/perf/instrumentation_overhead.py [--model resnet50] [--batch 8]
       [--threads 2] [--rounds 3] [--engines ddp,horovod] [--cpu N|none]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
WORKLOADS = ROOT / "bench" / "workloads"


def bare_loop(a: argparse.Namespace) -> None:
    """The reference: a plain loop, one worker, no per-step timing; prints images/s."""
    sys.path.insert(0, str(WORKLOADS))
    import models
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = models.build_model(a.model)
    spec = models.spec(a.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    if a.engine == "horovod":
        import horovod.torch as hvd

        hvd.init()
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        # gradients only, as Horovod communicates: no broadcast of BatchNorm buffers in every
        # forward (DDP's default), which the workload turns off too
        kw = ("forward_sync_buffers" if "forward_sync_buffers"
              in inspect.signature(DistributedDataParallel.__init__).parameters
              else "broadcast_buffers")
        model = DistributedDataParallel(model, **{kw: False})
    x = torch.randn(a.batch, 3, spec.default_image_size, spec.default_image_size)
    y = torch.randint(0, spec.default_num_classes, (a.batch,))

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    took = time.perf_counter() - start
    print("SCALELAB_RESULT " + json.dumps({"images_per_sec": a.batch * a.steps / took}))


def images_per_sec(a: argparse.Namespace, engine: str, bare: bool) -> float:
    """One worker's images/s: scalelab's workload, or (bare) this file's plain loop."""
    from scalelab.run.launch import parse_result

    program = [__file__, "--bare", "--batch"] if bare else [str(WORKLOADS / "resnet.py"),
                                                            "--batch-size"]
    argv = [sys.executable, *program, str(a.batch), "--engine", engine, "--model", a.model,
            "--threads", str(a.threads), "--steps", str(a.steps), "--warmup", str(a.warmup)]
    pin = (lambda: os.sched_setaffinity(0, {a.cpu})) if a.cpu is not None else None
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": str(a.threads)},
                         preexec_fn=pin).stdout
    return float(parse_result(out)["images_per_sec"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engines", default="ddp,horovod")
    ap.add_argument("--cpu", default="auto",
                    help="pin every program to this CPU, with one thread (auto: the last CPU "
                         "when there are two or more; none: no pinning)")
    ap.add_argument("--engine", default="ddp", help=argparse.SUPPRESS)
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.bare:
        bare_loop(a)
        return
    cpus = sorted(os.sched_getaffinity(0))
    if a.cpu == "auto":
        a.cpu = cpus[-1] if len(cpus) > 1 else None
    elif a.cpu == "none":
        a.cpu = None
    elif not a.cpu.isdigit() or int(a.cpu) not in cpus:
        sys.exit(f"error: --cpu {a.cpu!r} is not one of this process's CPUs {cpus}; "
                 "give one of them, auto or none")
    else:
        a.cpu = int(a.cpu)
    if a.cpu is not None:
        a.threads = 1
    where = f"pinned to CPU {a.cpu}" if a.cpu is not None else "not pinned"
    print(f"{a.model}, batch {a.batch}, {a.threads} threads, {where}, {a.steps} timed steps "
          f"after {a.warmup}, one worker, {a.rounds} rounds in alternation")
    for engine in a.engines.split(","):
        ours, bare = [], []
        for r in range(a.rounds):
            ours.append(images_per_sec(a, engine, bare=False))
            bare.append(images_per_sec(a, engine, bare=True))
            print(f"  {engine} round {r + 1}: scalelab {ours[-1]:.2f} img/s, bare loop "
                  f"{bare[-1]:.2f} img/s", flush=True)
        o, b = statistics.median(ours), statistics.median(bare)
        paired = sorted(100 * x / y for x, y in zip(ours, bare, strict=True))
        print(f"{engine}: scalelab median {o:.2f} img/s, bare loop median {b:.2f} img/s, "
              f"ratio {100 * o / b:.1f} % (aim 99 %); per-round ratios "
              f"{', '.join(f'{r:.1f}' for r in paired)} %", flush=True)


if __name__ == "__main__":
    main()
