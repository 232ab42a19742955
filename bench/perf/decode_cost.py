"""What one CPU core's input pipeline delivers on ImageNet-like photos: the decode cost.

Writes --images photo-sized JPEGs weighing what ImageNet's do (bench/workloads/make_dataset.py
--like imagenet: about 112 KB each, mostly 500 px on the long side) in memory, then on one thread, pinned to one CPU,
times over --rounds rounds:
  * decode: the JPEG to an RGB image (PIL, as the workloads' DataLoader workers do);
  * pipeline: decode, random-resized crop to --size, flip, to a normalised tensor
    (bench/workloads/imagedata.py's TrainTransform, what a rank's loader runs per image).
It prints the mean JPEG size, each stage's images/s per core (the median round, with the
slowest and fastest), and the cores per rank a GPU of a given speed needs to be fed:
images/s of the GPU / images/s per core.

Usage: .venv/bin/python bench/perf/decode_cost.py [--images 200] [--rounds 5] [--size 224]
       [--cpu N|none]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "workloads"))

from imagedata import TrainTransform, decode  # noqa: E402
from make_dataset import imagenet_like_jpeg  # noqa: E402

# images/s per GPU to be fed, for the cores-per-rank line: ResNet-50 amp channels_last at
# batch 256 on one H200 (docs/dev/gpu-runs/2026-11-27-h200.log)
GPU_IPS = {"H200, ResNet-50 amp": 5567.0}


def rate(fn, items: list, rounds: int) -> tuple[float, float, float]:
    """Items per second over each round: (median, slowest, fastest)."""
    rates = []
    for _ in range(rounds):
        t = time.perf_counter()
        for item in items:
            fn(item)
        rates.append(len(items) / (time.perf_counter() - t))
    return statistics.median(rates), min(rates), max(rates)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--cpu", default=str((os.cpu_count() or 1) - 1),
                   help="the CPU to pin to, or none")
    a = p.parse_args()
    if a.images < 1 or a.rounds < 1 or a.size < 8:
        p.error("--images and --rounds must be 1 or more, --size 8 or more")
    if a.cpu != "none":
        os.sched_setaffinity(0, {int(a.cpu)})
    torch.set_num_threads(1)
    rng = random.Random(0)
    jpegs = [imagenet_like_jpeg(rng) for _ in range(a.images)]
    mean_kb = sum(map(len, jpegs)) / len(jpegs) / 1000
    transform = TrainTransform(a.size, seed=0)
    dec = rate(decode, jpegs, a.rounds)
    pipe = rate(lambda b: transform(decode(b)), jpegs, a.rounds)
    print(f"{a.images} ImageNet-like JPEGs, mean {mean_kb:.1f} KB; one thread on CPU {a.cpu}, "
          f"{a.rounds} rounds (median, slowest-fastest)")
    print(f"  decode only             {dec[0]:7.1f} images/s per core ({dec[1]:.1f}-{dec[2]:.1f})"
          f"  {1000 / dec[0]:.2f} ms/image")
    print(f"  decode + crop {a.size} + flip + normalise  {pipe[0]:7.1f} images/s per core "
          f"({pipe[1]:.1f}-{pipe[2]:.1f})  {1000 / pipe[0]:.2f} ms/image")
    print(f"  bytes read at that rate {pipe[0] * mean_kb / 1000:.1f} MB/s per core")
    for gpu, ips in GPU_IPS.items():
        print(f"  cores to feed one {gpu} ({ips:.0f} images/s): {ips / pipe[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
