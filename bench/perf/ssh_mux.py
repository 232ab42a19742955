"""What multiplexing SSH saves: scalelab's own per-run overhead with one connection per node
against one connection per command (SCALELAB_SSH_MUX=0).

Two measurements, each alternating the two settings:
  1. commands: `--commands` short commands (`true`) to one node, directly and through a
     bastion (another emulated machine), one after the other; prints the median time of one;
  2. sweeps: `invoke bench --sweep ci` (resnet20, 2 nodes, native and 1gbit, 6 runs) on a local
     cluster, `--rounds` times each way; prints per training run the launch and reap phases
     (median), the time outside runs per run, the wall time, and the connections each run
     opened and rode (runs.jsonl "ssh").
The local target's machines are reached over SSH exactly as static hosts are (scalelab.ssh).
Needs root and sshd.

Usage: .venv/bin/python bench/perf/ssh_mux.py [--rounds 2] [--commands 30]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from _state import bench_on_local_cluster, private_state  # noqa: E402

from scalelab import ssh  # noqa: E402
from scalelab.targets.local import LocalCluster  # noqa: E402


def _set_mux(on: bool) -> None:
    os.environ[ssh.MUX_ENV] = "1" if on else "0"


def commands(n: int) -> None:
    lc = LocalCluster("perfmx")
    lc.provision(2)
    try:
        nodes = lc.nodes()
        kh = str(lc.known_hosts)
        behind = dataclasses.replace(nodes[1], bastion=f"{nodes[0].ssh_user}@{nodes[0].address}")
        times: dict[tuple[str, bool], list[float]] = {}
        for i in range(n):
            for route, node in (("direct", nodes[1]), ("through a bastion", behind)):
                for on in (True, False) if i % 2 == 0 else (False, True):
                    _set_mux(on)
                    t0 = time.perf_counter()
                    ssh.run(node, kh, "true", timeout=30)
                    times.setdefault((route, on), []).append(time.perf_counter() - t0)
        _set_mux(True)
        print(f"one short command to a node (median of {n}, ms):")
        for route in ("direct", "through a bastion"):
            on = statistics.median(times[(route, True)]) * 1e3
            off = statistics.median(times[(route, False)]) * 1e3
            print(f"  {route:<18} multiplexed {on:6.1f}   a connection each {off:6.1f}   "
                  f"saved {off - on:6.1f}")
    finally:
        lc.destroy()


def sweeps(rounds: int) -> None:
    got: dict[bool, list[dict]] = {True: [], False: []}
    for i in range(rounds):
        for on in (True, False) if i % 2 == 0 else (False, True):
            _set_mux(on)
            wall, sweep_dir = bench_on_local_cluster(f"perfmx{i}{int(on)}", 2, "--sweep", "ci",
                                                     "--steps", "10")
            runs = [json.loads(x) for x in (sweep_dir / "runs.jsonl").read_text().splitlines()]
            got[on].append({"wall": wall, "runs": runs})
    _set_mux(True)
    print(f"\nsweep ci (2 local nodes, 6 runs, 10 timed steps), {rounds} each way, medians:")
    print(f"  {'':<22}{'launch s':>9}{'reap s':>8}{'outside/run s':>15}{'wall s':>8}"
          f"{'opened/run':>12}{'shared/run':>12}")
    for on in (True, False):
        train = [r for s in got[on] for r in s["runs"] if r["kind"] == "train"
                 and r["status"] == "ok"]
        every = [r for s in got[on] for r in s["runs"]]
        outside = [(s["wall"] - sum(r["duration_s"] for r in s["runs"])) / len(s["runs"])
                   for s in got[on]]
        med = statistics.median
        print(f"  {'multiplexed' if on else 'a connection each':<22}"
              f"{med(r['timeline']['launch_s'] for r in train):9.2f}"
              f"{med(r['timeline']['reap_s'] for r in train):8.2f}{med(outside):15.2f}"
              f"{med(s['wall'] for s in got[on]):8.1f}"
              f"{statistics.mean(r['ssh']['opened'] for r in every):12.1f}"
              f"{statistics.mean(r['ssh']['shared'] for r in every):12.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="sweeps each way")
    ap.add_argument("--commands", type=int, default=30, help="short commands each way")
    a = ap.parse_args()
    private_state()
    commands(a.commands)
    sweeps(a.rounds)


if __name__ == "__main__":
    main()
