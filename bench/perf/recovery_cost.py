"""What a failure costs at each node count: one node's ranks killed mid-run, on the local target.

A local cluster of max(--nodes) nodes, one more with --to nfs (needs root). One `invoke bench`
sweep trains --model (ResNet-50 by default) on emulated --accelerator devices (V100 by
default) at each node count, saving a checkpoint every --every timed steps to each node's own
disk (--to nodes, links native) or to an NFS server on the cluster's last node, a node of its
own (--to nfs, every link at --bandwidth, 1gbit by default), each run twice: as is
(--inject-failure off) and with the last node's ranks killed after timed step --fail-after
(--inject-failure STEP@K). Under --engine ddp torchrun's agents restart every rank, which go
on from the last checkpoint on disk; under --engine horovod (2 nodes or more) Horovod's
elastic driver starts the killed node's ranks again and the others hand them the state they
committed at the last checkpoint. Prints per node count the checkpoint's blocking time C, and for the failed run
the seconds from the kill until the first restarted rank's process started, every rank had
joined the group again and every rank was ready to train (R), the checkpoint load, the steps
recomputed. The cluster is destroyed at the end, also on a failure.

Seconds are the host's own (not dilated): start-up, rendezvous and load are what this host
takes; on an emulated cluster only the steps are in the device's time, and with --to nfs
the checkpoint's blocking time C (its writes cross the dilated links).

Usage: .venv/bin/python bench/perf/recovery_cost.py [--nodes 1,2,4] [--every 5]
       [--steps 20] [--fail-after 12] [--model resnet50] [--accelerator v100]
       [--batch-size 32] [--to nodes|nfs] [--bandwidth 1gbit] [--engine ddp|horovod]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _state import destroy, invoke, private_state  # noqa: E402


def _num(value) -> float:
    return float("nan") if value is None or value == "" else float(value)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--every", type=int, default=5, help="timed steps between checkpoints")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--fail-after", type=int, default=12, help="the timed step to kill after")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--accelerator", default="v100")
    ap.add_argument("--batch-size", default="32")
    ap.add_argument("--to", choices=["nodes", "nfs"], default="nodes")
    ap.add_argument("--bandwidth", default="1gbit", help="--to nfs: every link's rate")
    ap.add_argument("--engine", choices=["ddp", "horovod"], default="ddp")
    a = ap.parse_args()
    counts = sorted({int(x) for x in a.nodes.split(",")})
    if not (counts[0] >= 1 and counts[-1] <= 16 and 1 <= a.every <= a.steps <= 200
            and 1 <= a.fail_after < a.steps):
        ap.error("--nodes 1-16, 1 <= --every <= --steps <= 200, 1 <= --fail-after < --steps")
    if a.engine == "horovod" and counts[0] < 2:
        ap.error("--engine horovod: --nodes from 2 (Horovod's elastic driver needs another "
                 "node to go on with)")
    private_state()
    name = f"rc{uuid.uuid4().hex[:4]}"
    size = counts[-1] + (a.to == "nfs")
    invoke("provision", "--target", "local", "--cluster", name, "--nodes", str(size))
    place = f"nfs@{name}-n{size - 1}" if a.to == "nfs" else "nodes"
    rate = a.bandwidth if a.to == "nfs" else "native"
    runs: list[dict] = []
    try:
        for n in counts:  # the last node of each run fails
            invoke("bench", "--cluster", name, "--no-report", "--sweep", "ci", "--nodes",
                   str(n), "--engine", a.engine, "--batch-size", a.batch_size, "--model", a.model,
                   "--accelerator", a.accelerator, "--steps", str(a.steps), "--repeats", "1",
                   "--bandwidth", rate, "--checkpoint-every", str(a.every),
                   "--checkpoint-to", place, "--allreduce-sizes", "16M",
                   "--inject-failure", f"off,{a.fail_after}@{n - 1}", "--timeout", "3600",
                   timeout=7200)
            reports = Path(os.environ["SCALELAB_REPORTS"])
            sweep_dir = reports / os.readlink(reports / "latest")
            runs += [r for r in map(json.loads, (sweep_dir / "runs.jsonl").read_text()
                                    .splitlines()) if r["kind"] == "train"]
    finally:
        destroy(name)
    where = (f"an NFS server on a node of its own, links at {rate}" if a.to == "nfs"
             else "each node's own disk")
    print(f"{a.engine}: {a.model} on emulated {a.accelerator}, batch {a.batch_size}, a checkpoint every "
          f"{a.every} of {a.steps} timed steps to {where}; the last node's ranks killed after "
          f"step {a.fail_after}")
    print(f"{'N':>3} {'status':>7} {'C s':>6} {'back s':>7} {'joined s':>9} {'R s':>6} "
          f"{'load s':>7} {'killed':>7} {'from':>5} {'redone':>7}")
    plain = {r["params"]["nodes"]: r for r in runs if not r.get("failure")}
    for r in sorted((r for r in runs if r.get("failure")), key=lambda r: r["params"]["nodes"]):
        n = r["params"]["nodes"]
        base = plain.get(n) or {}
        f, back = r["failure"], r["failure"].get("recovery") or {}
        c = (base.get("checkpoint") or {}).get("blocked_s_mean")
        print(f"{n:>3} {r['status']:>7} {_num(c):>6.3f} {_num(back.get('back_s')):>7.2f} "
              f"{_num(back.get('joined_s')):>9.2f} {_num(back.get('ready_s')):>6.2f} "
              f"{_num(back.get('load_s')):>7.3f} {_num(f.get('killed_step')):>7.0f} "
              f"{_num(back.get('from_step')):>5.0f} {_num(back.get('recomputed_steps')):>7.0f}")
        if r["status"] != "ok":
            print(f"    {r['error'][:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
