"""TCP throughput node to node on the local target, at each link rate (needs root, iperf3).

Two emulated nodes; for each rate the link is set as `invoke shape` sets it (a tbf on each
node's end), then iperf3 runs from node 1 to node 0 inside their namespaces: one stream for
--seconds, as many times as --repeats, median printed. The cluster is destroyed at the end,
by its record, also on Ctrl-C or a failure.

Usage: .venv/bin/python bench/perf/link_rates.py [--rates 100mbit,1gbit,10gbit,native]
       [--seconds 5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scalelab.cluster.targets import localhost  # noqa: E402
from scalelab.cluster.targets.local import LocalCluster  # noqa: E402
from scalelab.core import sh  # noqa: E402


def _listening(netns: str, port: int, timeout_s: float = 10.0) -> None:
    """Wait, bounded, until something in netns listens on the TCP port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = sh.run(["ip", "netns", "exec", netns, "ss", "-Hltn", f"sport = :{port}"],
                     check=False).stdout
        if out.strip():
            return
        time.sleep(0.05)
    raise SystemExit(f"iperf3 did not listen in {netns} within {timeout_s:g} s")


def mbit(lc: LocalCluster, seconds: float) -> float:
    """One iperf3 stream from node 1 to node 0 for `seconds`, in Mbit/s received."""
    server = lc.nodes()[0].address
    pidfile = lc.dir / "iperf.pid"
    ns0, ns1 = localhost.netns_name(lc.name, 0), localhost.netns_name(lc.name, 1)
    sh.run(["ip", "netns", "exec", ns0, "iperf3", "-s", "-1", "-D", "-B", server,
            "--pidfile", str(pidfile)])
    try:
        _listening(ns0, 5201)
        out = sh.run(["ip", "netns", "exec", ns1, "iperf3", "-c", server, "-t", f"{seconds:g}",
                      "-J"], timeout=seconds + 20).stdout
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:  # the server this script started, by its pid
        if pidfile.exists() and pidfile.read_text().strip():
            localhost.end_pids([int(pidfile.read_text().strip())])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="100mbit,1gbit,10gbit,native")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("error: needs root (network namespaces and tc); run it as root", file=sys.stderr)
        return 1
    if subprocess.run(["sh", "-c", "command -v iperf3"], capture_output=True).returncode:
        print("error: iperf3 is not installed; ./bootstrap.sh installs it", file=sys.stderr)
        return 1
    tmp = tempfile.mkdtemp(prefix="scalelab-perf-")
    os.environ.setdefault("SCALELAB_HOME", tmp)
    os.environ.setdefault("SCALELAB_INVENTORIES", os.path.join(tmp, "inventories"))
    lc = LocalCluster(f"lr{uuid.uuid4().hex[:4]}")
    print(f"{'rate':>8} {'Mbit/s (median)':>16}  runs ({args.seconds:g} s, one stream)")
    try:
        lc.provision(2)
        for rate in args.rates.split(","):
            lc.set_bandwidth(rate)
            got = [mbit(lc, args.seconds) for _ in range(args.repeats)]
            print(f"{rate:>8} {statistics.median(got):16.0f}  "
                  + " ".join(f"{g:.0f}" for g in got), flush=True)
    finally:
        lc.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
