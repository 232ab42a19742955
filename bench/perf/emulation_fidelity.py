"""How faithful the emulated accelerator is on this host, and what the models get wrong.

Provisions a local cluster, runs one `invoke bench` sweep with an emulated accelerator (default:
ResNet-50 on a V100 profile, batch 32, nodes 1,4,8,10, 1gbit and 10gbit links, dilation picked
by scalelab) as a user would, and prints per point:
  * k, the dilation the run used;
  * compute-wait error: each rank's emulated compute per step against the profile's (the worst
    rank; aim: within 5 % at every N);
  * link: the netprobe's rate against the requested one, both in the device's time (aim: within
    10 %), and the share of it the training kept busy in its timed steps;
  * host idle: the host's CPU idle share in the timed steps (the worst rank's);
  * efficiency measured, and the ring and overlap models' predictions with their errors (aim for
    the overlap model: within 5 points);
  * the fidelity flag;
and the sweep's wall time. Needs root.

Usage: .venv/bin/python bench/perf/emulation_fidelity.py [--nodes 1,4,8,10] [--bandwidth 1gbit,10gbit]
       [--accelerator v100] [--batch-size 32] [-- MORE BENCH OPTIONS]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from _state import bench_on_local_cluster, private_state  # noqa: E402

from scalelab.report.data import analyse, load_sweep_data  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,4,8,10")
    ap.add_argument("--bandwidth", default="1gbit,10gbit")
    ap.add_argument("--batch-size", default="32")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--accelerator", default="v100")
    ap.add_argument("--steps", default="3")
    ap.add_argument("bench_args", nargs="*", help="more `invoke bench` options, after --")
    a = ap.parse_args()
    private_state()
    most = max(int(x) for x in a.nodes.replace("-", ",").split(","))
    wall, sweep_dir = bench_on_local_cluster(
        "perfemu", most, "--nodes", a.nodes, "--batch-size", a.batch_size, "--bandwidth",
        a.bandwidth, "--model", a.model, "--accelerator", a.accelerator, "--steps", a.steps,
        "--repeats", "1", *a.bench_args)
    records = [json.loads(x) for x in (sweep_dir / "runs.jsonl").read_text().splitlines()]
    train = {r["run_id"]: r for r in records if r["kind"] == "train"}
    a_ = analyse([load_sweep_data(sweep_dir)], None, False)
    m = a_.modelled.set_index(["bandwidth", "batch_size", "world_size"])
    print(f"{a.model} on emulated {a.accelerator}, batch {a.batch_size}, nodes {a.nodes}, "
          f"{a.bandwidth}: invoke bench took {wall:.0f} s for {len(records)} runs "
          f"({len(train)} training)")
    print(f"{'link':>7} {'N':>3} {'k':>4} {'compute err':>11} {'link/req':>8} {'busy':>5} "
          f"{'idle':>5} {'eff':>6} {'ring':>6} {'err':>5} {'overlap':>7} {'err':>5}  fidelity")
    worst = {"compute": 0.0, "link": 0.0, "overlap": 0.0, "ring": 0.0}
    for rid in sorted(train, key=lambda r: (train[r]["params"]["bandwidth_mbit"] or 0,
                                            train[r]["params"]["world_size"])):
        r = train[rid]
        p = r["params"]
        if r["status"] != "ok":
            print(f"{rid}: {r['status']}: {r['error']}")
            continue
        prof = r["accelerator"]["profile_step_s"]
        cerr = max(abs(x["compute_time_mean_s"] / prof - 1) for x in r["ranks"])
        idle = min(x["host_cpu_idle"] for x in r["ranks"] if x["host_cpu_idle"] is not None)
        req = p["bandwidth_mbit"]
        share = (r["link_mbit_measured"] or math.nan) / req if req else math.nan
        bw = next(iter(set(a_.runs.loc[a_.runs["run_id"] == rid, "bandwidth"])))
        row = m.loc[(bw, p["batch_size"], p["world_size"])]
        busy = float(a_.runs.loc[a_.runs["run_id"] == rid, "link_utilisation"].iloc[0])
        eff, ring, ovl = (float(row["eff_mean"]), float(row["predicted_eff"]),
                          float(row.get("overlap_eff", math.nan)))
        worst["compute"] = max(worst["compute"], cerr)
        if p["world_size"] > 1:
            worst["link"] = max(worst["link"], abs(share - 1))
            worst["ring"] = max(worst["ring"], abs(ring - eff))
            worst["overlap"] = max(worst["overlap"], abs(ovl - eff))
        fid = a_.runs.loc[a_.runs["run_id"] == rid, "fidelity"].iloc[0] or "faithful"
        print(f"{bw:>7} {p['world_size']:>3} {p['dilation']:>4g} {cerr * 100:>10.1f}% "
              f"{share * 100:>7.0f}% {busy * 100:>4.0f}% {idle * 100:>4.0f}% {eff * 100:>5.1f}% "
              f"{ring * 100:>5.1f}% {abs(ring - eff) * 100:>4.1f} {ovl * 100:>6.1f}% "
              f"{abs(ovl - eff) * 100:>4.1f}  {fid}")
    print(f"worst: compute-wait error {worst['compute'] * 100:.1f} % (aim 5), link off its rate "
          f"{worst['link'] * 100:.0f} % (aim 10), ring model {worst['ring'] * 100:.1f} points, "
          f"overlap model {worst['overlap'] * 100:.1f} points (aim 5)")


if __name__ == "__main__":
    main()
