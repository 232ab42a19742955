"""Where a sweep's wall time goes: training steps against everything scalelab and the frameworks
add around them.

Provisions a local cluster, runs a sweep through `invoke bench` as a user would (default: the
demo sweep, bench/sweeps/demo.yml), and prints
  * the sweep's wall time against the time rank 0 spent in warm-up and timed steps (aim: steps
    at least 60 % of the wall time);
  * the rest split: per run (medians over the training runs) launch (ssh and the launcher until
    rank 0's interpreter runs), import (torch and the workload), rendezvous, setup (model,
    optimiser, engine), finish (gather, leave the group, exit) and reap (end what is left, close
    ssh); and per sweep the allreduce probes, the link measurements and shaping, and the
    driver's own time between runs (aim: at most 2 s per run beyond the framework's own
    start-up, i.e. launch + reap + the driver's share).
Needs root.

Usage: .venv/bin/python bench/perf/sweep_overhead.py [--sweep demo] [--nodes 8] [-- BENCH OPTIONS]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from _state import bench_on_local_cluster, private_state  # noqa: E402

from scalelab.results import store  # noqa: E402

PHASES = store.TIMELINE_KEYS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", default="demo")
    ap.add_argument("--nodes", type=int, default=8, help="nodes to provision")
    ap.add_argument("bench_args", nargs="*", help="more `invoke bench` options, after --")
    a = ap.parse_args()
    private_state()
    wall, sweep_dir = bench_on_local_cluster("perfsw", a.nodes, "--sweep", a.sweep, *a.bench_args)
    runs = [json.loads(x) for x in (sweep_dir / "runs.jsonl").read_text().splitlines()]
    train = [r for r in runs if r["kind"] == "train" and r["status"] == "ok" and r.get("timeline")]
    probes = [r for r in runs if r["kind"] == "allreduce"]
    steps = sum(r["timeline"]["warmup_s"] + r["timeline"]["timed_s"] for r in train)
    in_runs = sum(r["duration_s"] for r in runs)
    print(f"sweep {a.sweep} on {a.nodes} local nodes: {len(train)} ok training runs with a "
          f"timeline, {len(probes)} allreduce probes, {len(runs)} runs in all")
    print(f"wall time of invoke bench: {wall:.1f} s; in warm-up and timed steps: {steps:.1f} s "
          f"= {100 * steps / wall:.1f} % (aim 60 %)")
    print("\nper training run, median (s):")
    for ph in PHASES:
        vals = [r["timeline"][ph] for r in train]
        print(f"  {ph.removesuffix('_s'):<11} {statistics.median(vals):6.2f}   "
              f"(sum {sum(vals):6.1f} s)")
    beyond = [sum(r["timeline"][p] for p in PHASES if p not in ("warmup_s", "timed_s"))
              for r in train]
    ours = [r["timeline"]["launch_s"] + r["timeline"]["reap_s"] for r in train]
    print(f"  beyond the steps: median {statistics.median(beyond):.2f} s per run; of that "
          f"launch + reap {statistics.median(ours):.2f} s")
    print("\nper sweep (s):")
    print(f"  allreduce probes          {sum(r['duration_s'] for r in probes):7.1f}")
    between = wall - in_runs
    print(f"  outside runs (start-up, links measured and shaped, store, between runs) "
          f"{between:7.1f} = {between / max(len(runs), 1):.2f} s per run")


if __name__ == "__main__":
    main()
