"""Provision and destroy times of the local target for 1, 4 and 10 nodes (needs root).

Targets on a 2-core machine: 10 nodes up in 10 s or less, destroyed in 5 s or less.
Usage: .venv/bin/python bench/perf/provision_perf.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scalelab.cluster.targets.local import LocalCluster  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="1,4,10")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="scalelab-perf-")
    os.environ.setdefault("SCALELAB_HOME", tmp)
    os.environ.setdefault("SCALELAB_INVENTORIES", os.path.join(tmp, "inventories"))
    print(f"{'nodes':>5} {'up_s (median)':>14} {'down_s (median)':>16}  runs")
    for n in [int(x) for x in args.sizes.split(",")]:
        ups, downs = [], []
        for r in range(args.repeats):
            lc = LocalCluster(f"perf{n}r{r}")
            t0 = time.perf_counter()
            lc.provision(n, bandwidth="1gbit")
            t1 = time.perf_counter()
            lc.destroy()
            t2 = time.perf_counter()
            ups.append(t1 - t0)
            downs.append(t2 - t1)
        print(f"{n:>5} {statistics.median(ups):>14.2f} {statistics.median(downs):>16.2f}  "
              f"{args.repeats} (up includes waiting for every sshd to answer)")


if __name__ == "__main__":
    main()
