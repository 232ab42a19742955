"""Allreduce bus bandwidth on a shaped local cluster vs the link rate (aim: 90 % or more).

Provisions a local cluster with every link at --bandwidth, measures the link with netprobe,
runs bench/workloads/allreduce.py across the nodes with torchrun (gloo) and prints busbw per
message size and, for the largest, its ratio to the configured rate. Needs root.

Usage: .venv/bin/python bench/perf/busbw_vs_link.py [--nodes 2] [--bandwidth 1gbit]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scalelab.cluster import targets  # noqa: E402
from scalelab.cluster.targets.local import LocalCluster  # noqa: E402
from scalelab.core.units import parse_rate_mbit  # noqa: E402
from scalelab.run import commands, driver, launch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--bandwidth", default="1gbit")
    ap.add_argument("--max-bytes", default=str(64 << 20))
    a = ap.parse_args()
    mbit = parse_rate_mbit(a.bandwidth)
    tmp = tempfile.mkdtemp(prefix="scalelab-perf-")
    os.environ.setdefault("SCALELAB_HOME", tmp)
    os.environ.setdefault("SCALELAB_INVENTORIES", os.path.join(tmp, "inventories"))
    lc = LocalCluster("perfb")
    lc.provision(a.nodes, bandwidth=a.bandwidth)
    try:
        rec = lc.load()
        rt = targets.of(rec).runtime(rec)
        nodes = lc.nodes()
        link, why = driver.measure_link(nodes, rt, 29600, seconds=2.0)
        if link is None:
            raise SystemExit(f"link probe failed: {why}")
        args = ["--min-bytes", str(1 << 20), "--max-bytes", a.max_bytes, "--factor", "4",
                "--iters", "5", "--warmup", "2"]
        res = launch.run(commands.torchrun_commands(nodes, 1, "allreduce.py", args, rt, 29610),
                         rt, timeout_s=600)
        if res.status != "ok":
            raise SystemExit(f"allreduce failed: {res.error}")
        print(f"{a.nodes} nodes at {a.bandwidth}: netprobe {link:.0f} Mbit/s")
        print(f"{'size':>10} {'time_s':>9} {'algbw MB/s':>11} {'busbw MB/s':>11}")
        for s in res.result["sizes"]:
            print(f"{s['size_bytes']:>10} {s['time_s']:>9.4f} {s['algbw_mb_s']:>11.1f} "
                  f"{s['busbw_mb_s']:>11.1f}")
        top = res.result["sizes"][-1]["busbw_mb_s"]
        if mbit:
            # MB/s here are 10^6 bytes/s; the link carries mbit/8 MB/s
            print(f"busbw at the largest size: {top:.1f} MB/s = "
                  f"{100 * top * 8 / mbit:.1f} % of the {a.bandwidth} link")
    finally:
        lc.destroy()


if __name__ == "__main__":
    main()
