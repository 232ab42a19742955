"""scalelab's model against published multi-node scaling tables (issue 27).

Prints, for every point in scalelab/model/published.py (which points and why the others are left
out are in its docstring): the published efficiency; the overlap model's prediction on the
ideal fabric (the line rate as tc gives it, what scalelab's emulation assumed before fabric
profiles); on the table's fabric profile (bench/fabrics/ethernet-tcp.yml or rdma.yml); and on
the profile with the GPU-side cost of the table's own one-node point (1 / its efficiency, where
the table has one), with that last prediction's miss in points. Then, per table, whether every
point is within the aim of 10 points, and at each point outside it the cost the model leaves
out.

Usage: .venv/bin/python bench/perf/published_check.py [--markdown]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scalelab.model import fabric  # noqa: E402
from scalelab.model.published import AIM_POINTS, POINTS, best, efficiency  # noqa: E402


def rows() -> list[tuple]:
    """Per point: (point, ideal, profile, profile + GPU-side cost or None, miss in points)."""
    out = []
    for p in POINTS:
        fab = fabric.load(p.fabric)
        side = efficiency(p, fab, 1 / p.one_node) if p.one_node else None
        out.append((p, efficiency(p, None), efficiency(p, fab), side,
                    (best(p) - p.published) * 100))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="the rows as a Markdown table")
    a = ap.parse_args()
    table = rows()
    if a.markdown:
        print("| table | nodes x GPUs | published | ideal fabric | profile | + GPU-side cost "
              "| miss (points) | note |\n|---|---|---|---|---|---|---|---|")
        for p, ideal, prof, side, miss in table:
            side_text = f"{side * 100:.1f} %" if side is not None else "-"
            print(f"| {p.table} | {p.nodes} x {p.gpus_per_node} | {p.published * 100:.1f} % | "
                  f"{ideal * 100:.1f} % | {prof * 100:.1f} % | {side_text} | {miss:+.1f} | "
                  f"{p.note} |")
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
    for p, ideal, prof, side, miss in table:
        worst[p.table] = max(worst.get(p.table, 0.0), abs(miss))
        side_text = f"{side * 100:8.1f}%" if side is not None else f"{'-':>9}"
        print(f"{p.table:<36} {p.nodes}x{p.gpus_per_node:<3} {p.published * 100:8.1f}% "
              f"{ideal * 100:5.1f}% {prof * 100:6.1f}% {side_text} {miss:+6.1f}  {p.note}")
    print()
    for name, w in worst.items():
        print(f"{name:<36} largest miss {w:4.1f} points: "
              f"{'within' if w <= AIM_POINTS else 'OUTSIDE'} the aim of {AIM_POINTS:g}")
    for p, *_, miss in table:
        if abs(miss) > AIM_POINTS:
            print(f"  {p.table} {p.nodes}x{p.gpus_per_node}: missing cost: "
                  f"{p.missing or 'not known'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
