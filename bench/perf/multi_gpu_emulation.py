"""Nodes of several emulated GPUs on one small machine: 8 nodes x 4 emulated V100s (32 GPUs).

Provisions 8 local nodes and runs ResNet-50 (batch 64 per GPU) on emulated V100s at 1, 2, 4 and
8 nodes x 4 GPUs per node over 10 Gbit/s on the ethernet-tcp fabric profile, as `invoke bench`
does for a user, then prints per point the dilation k, the measured scaling efficiency against
one node of 4, the overlap model's, and the fidelity guard's verdict (empty: faithful). The
reduced form (2 nodes x 2) runs in CI: tests/test_bench.py.

With --intra-link (pcie3, pcie4, nvlink-v100 or a rate) the path between the GPUs of a node
is shaped on each node's loopback at that rate and modelled; without it the loopback runs as
fast as the host copies and the model takes the path as free.

Usage: .venv/bin/python bench/perf/multi_gpu_emulation.py [--nodes 8] [--gpus 4] [--steps 10]
       [--intra-link pcie3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from _state import bench_on_local_cluster, private_state  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=4, help="emulated GPUs per node")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--bandwidth", default="10gbit")
    ap.add_argument("--intra-link", default="", help="the path between a node's GPUs")
    a = ap.parse_args()
    private_state()
    counts = ",".join(str(n) for n in (1, 2, 4, 8, 16) if n <= a.nodes)
    wall, sweep_dir = bench_on_local_cluster(
        "perfmg", a.nodes, "--nodes", counts, "--procs-per-node", str(a.gpus),
        "--accelerator", "v100", "--model", "resnet50", "--batch-size", "64",
        "--bandwidth", a.bandwidth, "--fabric-profile", "ethernet-tcp", "--steps",
        str(a.steps), "--repeats", "1", "--allreduce-sizes", "4K,64K,1M,16M",
        *(["--intra-link", a.intra_link] if a.intra_link else []))
    from scalelab.report.data import analyse, load_sweep_data

    modelled = analyse([load_sweep_data(sweep_dir)], None, False).modelled
    print(f"{a.nodes} nodes x {a.gpus} emulated V100s, ResNet-50 batch 64, {a.bandwidth} on "
          f"ethernet-tcp, between a node's GPUs {a.intra_link or 'unshaped'}: invoke bench "
          f"took {wall:.0f} s")
    print(f"{'GPUs':>5} {'k':>4} {'images/s':>9} {'step ms':>8} {'model ms':>8} {'measured':>9} "
          f"{'model':>7}  fidelity")
    for _, r in modelled.sort_values("world_size").iterrows():
        print(f"{int(r['world_size']):>5} {r['dilation']:4.0f} {r['thr_mean']:9.0f} "
              f"{r['step_time_mean_s'] * 1e3:8.1f} {r['model_step_s'] * 1e3:8.1f} "
              f"{r['eff_mean'] * 100:8.1f}% {r['model_eff'] * 100:6.1f}%  "
              f"{r['fidelity'] or 'faithful'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
