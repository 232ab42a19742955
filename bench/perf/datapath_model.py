"""The datapath model against measurement: emulated GPUs reading shards over a shaped storage link.

A local cluster of N + 1 nodes (needs root): the last is the storage node and serves a staged
set of photo-sized JPEGs (about 112 KB each) over HTTP (`invoke stage --to http`) and, with
--stores http,nfs, over NFS from its own NFS-Ganesha (`invoke stage --to nfs --node`). One
`invoke bench` sweep per store trains ResNet-50 on emulated V100s (the default) at each node
count, reading real batches through the storage node's link at --storage-bandwidth, with the
decode charged at the measured cost per image. Prints per point the measured and modelled
efficiency (against 1 node on the same store), their gap, the storage probe's MB/s and what the
ranks read, and where the input becomes the bottleneck: by the model (its verdict) and by
measurement (the first node count whose loaders read at least --saturated of what the storage
probe gave). Aims: the gap within 5 points at every point, and the two node counts the same.

Usage: .venv/bin/python bench/perf/datapath_model.py [--nodes 1,2,4,8] [--stores http,nfs]
       [--storage-bandwidth 1gbit] [--accelerator v100] [--batch-size 32] [--steps 20]
       [--repeats 1]
       [-- MORE BENCH OPTIONS]
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import shlex
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _state import destroy, invoke, private_state  # noqa: E402

from scalelab.report.data import analyse, load_sweep_data  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,2,4,8")
    ap.add_argument("--stores", default="http,nfs", help="http, nfs or both")
    ap.add_argument("--storage-bandwidth", default="1gbit")
    ap.add_argument("--bandwidth", default="10gbit", help="the cluster network's rate")
    ap.add_argument("--accelerator", default="v100")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-size", default="32")
    ap.add_argument("--steps", default="20")
    ap.add_argument("--repeats", default="1", help="runs a point (the report's mean)")
    ap.add_argument("--images-per-shard", type=int, default=20)
    ap.add_argument("--saturated", type=float, default=0.85, help="the share of the storage "
                    "probe's MB/s at which the loaders count as reading all it gives")
    ap.add_argument("bench_args", nargs="*", help="more `invoke bench` options, after --")
    a = ap.parse_args()
    stores = a.stores.split(",")
    if not set(stores) <= {"http", "nfs"}:
        ap.error("--stores: http, nfs or http,nfs")
    counts = sorted({int(x) for x in a.nodes.split(",")})
    private_state()
    name = f"dm{uuid.uuid4().hex[:4]}"
    most = max(counts)
    shards = most * 2 * 2  # two loader workers a rank, every worker whole shards, twice over
    out: list[str] = []
    t0 = time.monotonic()
    try:
        invoke("provision", "--target", "local", "--cluster", name, "--nodes", str(most + 1))
        storage_node = f"{name}-n{most}"
        sources = {}
        for store in stores:
            out_ = invoke("stage", "--cluster", name, "--to", store, "--node", storage_node,
                          "--name", f"on{store}", "--images",
                          str(shards * a.images_per_shard), "--classes", "100",
                          "--shard-size", str(a.images_per_shard))
            sources[store] = shlex.split(re.search(r"--data (.+)$", out_, re.MULTILINE)[1])[0]
        staged = time.monotonic() - t0
        for store in stores:
            t1 = time.monotonic()
            invoke("bench", "--cluster", name, "--nodes", ",".join(map(str, counts)),
                   "--batch-size", a.batch_size, "--model", a.model, "--accelerator",
                   a.accelerator, "--bandwidth", a.bandwidth, "--steps", a.steps,
                   "--repeats", a.repeats, "--data", sources[store], "--storage-bandwidth",
                   a.storage_bandwidth, "--no-report", *a.bench_args)
            wall = time.monotonic() - t1
            reports = Path(os.environ["SCALELAB_REPORTS"])
            sweep_dir = reports / os.readlink(reports / "latest")
            out += table(sweep_dir, store, counts, a, wall)
    finally:
        destroy(name)
    print(f"{a.model} on emulated {a.accelerator}, batch {a.batch_size} a rank, cluster links "
          f"{a.bandwidth}, the storage node's link {a.storage_bandwidth}; staging took "
          f"{staged:.0f} s")
    print("\n".join(out))
    return 0


def table(sweep_dir: Path, store: str, counts: list[int], a, wall: float) -> list[str]:
    with open(sweep_dir / "results.csv") as fh:
        every = list(csv.DictReader(fh))
    rows = {int(r["nodes"]): r for r in every if r["repeat"] == "0"}
    bad = [f"{r['nodes']}: {r['status']} {r.get('error', '')}" for r in every
           if r["status"] != "ok"]
    if bad:
        sys.exit(f"error: runs failed on {store}: " + "; ".join(bad))
    an = analyse([load_sweep_data(sweep_dir)], None, False)
    m = {int(r["world_size"]): r for _, r in an.modelled.iterrows()}
    lines = [f"\n{store}: invoke bench took {wall:.0f} s for {len(every)} runs (img/s, MB/s: "
             "the first repeat's; eff: the mean of the repeats)",
             f"{'N':>3} {'k':>4} {'img/s':>7} {'eff':>6} {'model':>6} {'gap':>5} "
             f"{'store MB/s':>10} {'read MB/s':>9} {'read/store':>10}  verdict"]
    worst = 0.0
    model_at = measured_at = None
    for n in counts:
        r, p = rows[n], m[n]
        eff, model = float(p["eff_mean"]), float(p["model_eff"])
        gap = abs(eff - model) * 100
        worst = max(worst, gap)
        # a probe that failed (its reason is in the record) has no figure: NaN, said so
        store_mb, read_mb = (float(r[k]) if str(r[k]).strip() else math.nan
                             for k in ("storage_read_mb_s", "data_read_mb_s"))
        share = read_mb / store_mb if store_mb else math.nan
        if p["verdict"] == "input-bound" and model_at is None:
            model_at = n
        if share >= a.saturated and measured_at is None:
            measured_at = n
        lines.append(f"{n:>3} {float(r['dilation']):>4g} {float(r['images_per_sec']):>7.0f} "
                     f"{eff:>6.1%} {model:>6.1%} {gap:>5.1f} {store_mb:>10.1f} {read_mb:>9.1f} "
                     f"{share:>10.0%}  {p['verdict']}"
                     + (f" ({p['input_limit']})" if p["verdict"] == "input-bound" else ""))
    lines.append(f"worst gap {worst:.1f} points (aim: 5); input-bound from N = {model_at} by "
                 f"the model, from N = {measured_at} measured (loaders reading at least "
                 f"{a.saturated:.0%} of the storage probe's MB/s)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
