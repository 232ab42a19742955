"""Ring allreduce against parameter servers, measured and modelled on emulated GPUs.

A local cluster of max(--nodes) + max(--servers) nodes (needs root). Two sweeps train ResNet-50
on emulated V100s (the defaults) over links shaped at --bandwidth: DDP's ring, and --engine ps
with its servers colocated on the worker nodes and on K dedicated nodes for each K in
--servers. Prints per layout and node count the measured and modelled efficiency (against one
node of the same layout) and their gap, the images/s, which layout was fastest at each node
count measured and by the model, and the fewest dedicated servers that beat the ring by the
model's bytes (K > N^2 / (2(N-1))).

Then the engine's own cost: one node, no shaping, an emulated V100 in every process: DDP over
two ranks against one worker and one colocated server, the same bytes each way over loopback,
the second at the dilation k the first ran at; the images/s of a worker (aim: the parameter
servers within 3 % of DDP).

Usage: .venv/bin/python bench/perf/ps_layouts.py [--nodes 2,4,8] [--servers 1,2,4]
       [--bandwidth 1gbit] [--accelerator v100] [--model resnet50] [--batch-size 32]
       [--steps 10] [--dilation auto] [--skip-overhead]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _state import destroy, invoke, private_state  # noqa: E402

from scalelab.model import layouts  # noqa: E402
from scalelab.report.data import analyse, load_sweep_data  # noqa: E402


def _sweep(*args: str) -> Path:
    invoke("bench", "--no-report", *args, timeout=7200)
    reports = Path(os.environ["SCALELAB_REPORTS"])
    return reports / os.readlink(reports / "latest")


def _label(row) -> str:
    if row["engine"] != "ps":
        return "ring"
    if row.get("ps_placement") == "colocated":
        return "colocated"
    return f"dedicated K={int(row['ps_servers'])}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="2,4,8", help="node counts above 1 (1 is the baseline)")
    ap.add_argument("--servers", default="1,2,4", help="dedicated server counts K")
    ap.add_argument("--bandwidth", default="1gbit")
    ap.add_argument("--accelerator", default="v100")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-size", default="32")
    ap.add_argument("--steps", default="10")
    ap.add_argument("--dilation", default="auto", help="the emulation's k for every layout "
                    "(auto: the smallest that fits each point's links and the host)")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--overhead-only", action="store_true", help="only the engine's own cost "
                    "(one node)")
    a = ap.parse_args()
    if a.skip_overhead and a.overhead_only:
        ap.error("--skip-overhead and --overhead-only ask for nothing")
    counts = sorted({1, *(int(x) for x in a.nodes.split(","))})
    ks = sorted(int(x) for x in a.servers.split(","))
    private_state()
    name = f"pl{uuid.uuid4().hex[:4]}"
    common = ["--accelerator", a.accelerator, "--model", a.model, "--batch-size", a.batch_size,
              "--steps", a.steps, "--repeats", "1", "--sweep", "ci", "--timeout", "3600"]
    invoke("provision", "--target", "local", "--cluster", name, "--nodes",
           "1" if a.overhead_only else str(max(counts) + max(ks)))
    try:
        if not a.overhead_only:
            _layouts(a, name, common, counts)
        if not a.skip_overhead:
            _overhead(name, common)
    finally:
        destroy(name)
    return 0


def _layouts(a: argparse.Namespace, name: str, common: list[str], counts: list[int]) -> None:
    """The ring and the parameter servers' layouts at each node count, measured and modelled."""
    nodes = ",".join(map(str, counts))
    shaped = [*common, "--nodes", nodes, "--bandwidth", a.bandwidth, "--dilation", a.dilation]
    ring = _sweep("--cluster", name, "--engine", "ddp", *shaped)
    ps = _sweep("--cluster", name, "--engine", "ps", *shaped, "--ps-placement",
                "dedicated,colocated", "--ps-servers", a.servers)
    an = analyse([load_sweep_data(ring), load_sweep_data(ps)], None, True)
    rows = an.modelled.assign(layout=[_label(r) for _, r in an.modelled.iterrows()])
    print(f"{a.model} on emulated {a.accelerator}, batch {a.batch_size} a worker, one a "
          f"node, links {a.bandwidth}; efficiency against 1 node of the same layout")
    print(f"{'layout':>16} {'N':>3} {'k':>4} {'img/s':>8} {'eff':>7} {'model':>7} {'gap':>5}  "
          f"verdict")
    gaps = []
    for _, r in rows.sort_values(["layout", "world_size"]).iterrows():
        gap = abs(float(r["eff_mean"]) - float(r["model_eff"])) * 100
        if int(r["world_size"]) > 1 and not math.isnan(gap):
            gaps.append(gap)
        k = f"{float(r['dilation']):g}" if "dilation" in r else "?"
        print(f"{r['layout']:>16} {int(r['world_size']):>3} {k:>4} {float(r['thr_mean']):8.1f} "
              f"{float(r['eff_mean']):7.1%} {float(r['model_eff']):7.1%} {gap:5.1f}  "
              f"{r.get('verdict') or ''}")
    print(f"worst gap {max(gaps, default=math.nan):.1f} points (aim: 5)")
    for n in counts[1:]:
        at = rows[rows["world_size"] == n]
        if at.empty:
            continue
        fast = at.loc[at["thr_mean"].astype(float).idxmax()]
        # the model's images/s (efficiency is each layout's own, against its one node)
        predicted = n * at["batch_per_worker"].astype(float) / at["model_step_s"].astype(float)
        model = at.loc[predicted.idxmax()]
        ring_ips = at.loc[at["layout"] == "ring", "thr_mean"]
        beaten = [r["layout"] for _, r in at.iterrows() if r["layout"].startswith("dedicated")
                  and len(ring_ips) and float(r["thr_mean"]) > float(ring_ips.iloc[0])]
        print(f"N = {n}: fastest measured {fast['layout']}, by the model {model['layout']}; "
              f"dedicated layouts faster than the ring measured: "
              f"{', '.join(beaten) or 'none'}; by the bytes from K = "
              f"{layouts.servers_to_beat_ring(n) or 'never'}")


def _overhead(name: str, common: list[str]) -> None:
    """One node, unshaped: DDP over two ranks against one worker and one colocated server."""
    one = [*common, "--nodes", "1", "--bandwidth", "native"]
    ddp = _sweep("--cluster", name, "--engine", "ddp", *one, "--procs-per-node", "2")
    d = analyse([load_sweep_data(ddp)], None, False).modelled
    # at the k DDP's sweep ran at: an emulated second's worth of host work is then the same
    ps1 = _sweep("--cluster", name, "--engine", "ps", *one, "--ps-placement", "colocated",
                 "--dilation", f"{float(d['dilation'].iloc[0]):g}")
    p = analyse([load_sweep_data(ps1)], None, False).modelled
    d_w = float(d["per_worker_mean"].iloc[0])
    p_w = float(p["per_worker_mean"].iloc[0])
    k = [f"{float(x['dilation'].iloc[0]):g}" if "dilation" in x else "?" for x in (d, p)]
    print(f"one node, unshaped: DDP over 2 ranks {d_w:.1f} images/s a rank (k = {k[0]}); "
          f"1 worker and 1 colocated server {p_w:.1f} images/s (k = {k[1]}; "
          f"{p_w / d_w - 1:+.1%}; aim within 3 %)")


if __name__ == "__main__":
    sys.exit(main())
