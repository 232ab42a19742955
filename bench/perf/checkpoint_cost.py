"""What a checkpoint costs at each node count, synchronous against asynchronous, on the local target.

A local cluster of max(--nodes) nodes, one more with --to nfs (needs root). One `invoke
bench` sweep trains --model (ResNet-50 by default, 25.6 M parameters: a checkpoint of about
205 MB with its momentum) on emulated --accelerator devices (V100 by default) at each node
count, saving a checkpoint every --every timed steps, sync and async in the same sweep:

* --to nodes (the default): to each node's own disk (--checkpoint-to nodes), links native;
* --to nfs: to an NFS server on the cluster's last node, a node of its own (--checkpoint-to
  nfs@NODE), every link at --bandwidth (1gbit by default).

Prints per node count and mode the checkpoint's size (all writers), the seconds training was
blocked (the slowest rank's, the mean over the run's checkpoints), the seconds an async write
went on after that, the write's MB/s, and the async blocking time against the sync one. The
cluster is destroyed at the end, also on a failure.

To nodes, the seconds are the host's own: the disk is not dilated, so these are what this
host's disk and memory copies take, not an emulated cluster's storage. To nfs, they are the
emulated cluster's: the writes cross its dilated links, and are divided by the dilation.

Usage: .venv/bin/python bench/perf/checkpoint_cost.py [--nodes 1,2,4] [--every 5]
       [--steps 20] [--model resnet50] [--accelerator v100] [--batch-size 32]
       [--to nodes|nfs] [--bandwidth 1gbit]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _state import destroy, invoke, private_state  # noqa: E402


def _num(text: str) -> float:
    return float(text) if str(text).strip() else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--every", type=int, default=5, help="timed steps between checkpoints")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--accelerator", default="v100")
    ap.add_argument("--batch-size", default="32")
    ap.add_argument("--to", choices=["nodes", "nfs"], default="nodes")
    ap.add_argument("--bandwidth", default="1gbit", help="--to nfs: every link's rate")
    a = ap.parse_args()
    counts = sorted({int(x) for x in a.nodes.split(",")})
    if not (counts[0] >= 1 and counts[-1] <= 16 and 1 <= a.every <= a.steps <= 200):
        ap.error("--nodes 1-16, 1 <= --every <= --steps <= 200")
    private_state()
    name = f"ck{uuid.uuid4().hex[:4]}"
    size = counts[-1] + (a.to == "nfs")
    invoke("provision", "--target", "local", "--cluster", name, "--nodes", str(size))
    place = f"nfs@{name}-n{size - 1}" if a.to == "nfs" else "nodes"
    rate = a.bandwidth if a.to == "nfs" else "native"
    try:
        invoke("bench", "--cluster", name, "--no-report", "--sweep", "ci", "--nodes",
               ",".join(map(str, counts)), "--batch-size", a.batch_size, "--model", a.model,
               "--accelerator", a.accelerator, "--steps", str(a.steps), "--repeats", "1",
               "--bandwidth", rate, "--checkpoint-every", str(a.every),
               "--checkpoint-to", place, "--checkpoint-mode", "sync,async",
               "--allreduce-sizes", "16M", "--timeout", "3600", timeout=7200)
        reports = Path(os.environ["SCALELAB_REPORTS"])
        sweep_dir = reports / os.readlink(reports / "latest")
        with open(sweep_dir / "results.csv") as fh:
            rows = [r for r in csv.DictReader(fh) if r["run_id"].startswith("train")]
    finally:
        destroy(name)
    where = (f"an NFS server on a node of its own, links at {rate}" if a.to == "nfs"
             else "each node's own disk")
    print(f"{a.model} on emulated {a.accelerator}, batch {a.batch_size}, a checkpoint every "
          f"{a.every} of {a.steps} timed steps to {where}")
    print(f"{'N':>3} {'mode':>6} {'status':>7} {'MB':>7} {'blocked s':>10} {'background s':>13} "
          f"{'write MB/s':>11}")
    blocked: dict[tuple[int, str], float] = {}
    for r in sorted(rows, key=lambda r: (int(r["nodes"]), r["checkpoint_mode"])):
        n, mode = int(r["nodes"]), r["checkpoint_mode"]
        blocked[(n, mode)] = _num(r["checkpoint_blocked_s"])
        print(f"{n:>3} {mode:>6} {r['status']:>7} {_num(r['checkpoint_bytes']) / 1e6:>7.1f} "
              f"{_num(r['checkpoint_blocked_s']):>10.3f} "
              f"{_num(r['checkpoint_background_s']):>13.3f} "
              f"{_num(r['checkpoint_write_mb_s']):>11.1f}")
    for n in counts:
        s, asy = blocked.get((n, "sync")), blocked.get((n, "async"))
        if s and asy:
            print(f"N = {n}: async blocks training {asy:.3f} s against sync's {s:.3f} s "
                  f"({asy / s:.0%} of it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
