"""scalelab's model against published multi-node scaling tables (issue 27).

For every point of the published data-parallel ResNet tables in docs/dev/published-scaling-tables.md
that states its network and lies at 32 GPUs or fewer, this sets up what was published (model,
precision, batch per GPU, GPUs per node, nodes, line rate, Horovod's fusion threshold of the
time) and predicts the scaling efficiency with scalelab's overlap model:

  * the device: the shipped V100 profile of the model and precision, its per-layer times
    scaled so that one GPU trains at the table's own single-GPU images/s (so only the
    communication is predicted, never the compute);
  * between nodes: a ring of all N x G GPUs over the line rate times the fabric profile's
    allreduce share for nodes of several GPUs (bench/fabrics/), and its
    per-hop latency; inside a node: the intra-node rate of the node kind (NVLink or PCIe);
  * two columns of prediction: the ideal fabric (the line rate as tc gives it, what
    scalelab's emulation assumed before fabric profiles) and the fabric profile.

It prints one row per point (published against predicted, in points) and, per table, whether
every point is within the aim of 10 points. Nothing here is fitted to the published
efficiencies; the single-GPU rate is the table's own baseline.

Usage: .venv/bin/python bench/perf/published_check.py [--markdown]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scalelab import fabric  # noqa: E402
from scalelab.published import AIM_POINTS, POINTS, efficiency  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="the rows as a Markdown table")
    a = ap.parse_args()
    if a.markdown:
        print("| table | nodes x GPUs | published | ideal fabric | profile | + GPU-side cost "
              "| miss (points) | note |\n|---|---|---|---|---|---|---|---|")
        for p in POINTS:
            fab = fabric.load(p.fabric)
            ideal, prof = efficiency(p, None), efficiency(p, fab)
            side = efficiency(p, fab, 1 / p.one_node) if p.one_node else None
            best = side if side is not None else prof
            side_text = f"{side * 100:.1f} %" if side is not None else "-"
            print(f"| {p.table} | {p.nodes} x {p.gpus_per_node} | {p.published * 100:.1f} % | "
                  f"{ideal * 100:.1f} % | {prof * 100:.1f} % | {side_text} | "
                  f"{(best - p.published) * 100:+.1f} | {p.note} |")
        return 0
    for name in sorted({p.fabric for p in POINTS}):
        print(f"fabric profile {fabric.load(name).summary()}")
    print("columns: published; predicted on the ideal fabric (network only); with the fabric "
          "profile (network only); with the profile and the GPU-side cost of the table's own "
          "one-node point (1 / its efficiency, where the table has one); the miss of the last "
          "prediction there is, in points\n")
    print(f"{'table':<36} {'GPUs':>5} {'published':>9} {'ideal':>6} {'profile':>7} "
          f"{'+GPU side':>9} {'miss':>6}  note")
    worst: dict[str, float] = {}
    for p in POINTS:
        fab = fabric.load(p.fabric)
        ideal = efficiency(p, None)
        prof = efficiency(p, fab)
        side = efficiency(p, fab, 1 / p.one_node) if p.one_node else float("nan")
        best = side if p.one_node else prof
        miss = (best - p.published) * 100
        worst[p.table] = max(worst.get(p.table, 0.0), abs(miss))
        gpus = f"{p.nodes}x{p.gpus_per_node}"
        side_text = f"{side * 100:8.1f}%" if p.one_node else f"{'-':>9}"
        print(f"{p.table:<36} {gpus:>5} {p.published * 100:8.1f}% {ideal * 100:5.1f}% "
              f"{prof * 100:6.1f}% {side_text} {miss:+6.1f}  {p.note}")
    print()
    for table, w in worst.items():
        print(f"{table:<36} largest miss {w:4.1f} points: "
              f"{'within' if w <= AIM_POINTS else 'OUTSIDE'} the aim of {AIM_POINTS:g}")
    for p in POINTS:
        fab = fabric.load(p.fabric)
        best = efficiency(p, fab, 1 / p.one_node) if p.one_node else efficiency(p, fab)
        if abs(best - p.published) * 100 > AIM_POINTS:
            print(f"  {p.table} {p.nodes}x{p.gpus_per_node}: missing cost: "
                  f"{p.missing or 'not known'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
