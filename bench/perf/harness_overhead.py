"""Harness overhead: images/s the driver reports vs the same workload started by hand.

Provisions a local cluster, runs one configuration through scalelab's launcher (what
`invoke bench` does for every run) and the same torchrun command lines typed by hand over
plain ssh, alternating, and prints both and their ratio (aim: 98 % or more). Needs root.

Usage: .venv/bin/python bench/perf/harness_overhead.py [--nodes 2] [--batch 32] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scalelab import launch  # noqa: E402
from scalelab.targets.local import LocalCluster  # noqa: E402


def by_hand(lc: LocalCluster, nodes, args: list[str], port: int) -> float:
    """torchrun on every node over plain ssh, as a user would type it; rank 0's result line."""
    py = str(Path(sys.executable).parent / "python")
    procs = []
    for i, n in enumerate(nodes):
        cmd = (f"cd {ROOT} && GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 {py} -m torch.distributed.run "
               f"--nnodes {len(nodes)} --nproc-per-node 1 --node-rank {i} "
               f"--master-addr {nodes[0].address} --master-port {port} "
               f"bench/workloads/resnet.py {' '.join(args)}")
        procs.append(subprocess.Popen(
            ["ssh", "-i", str(lc.key), "-o", f"UserKnownHostsFile={lc.known_hosts}",
             "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{n.address}", cmd],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    return float(launch.parse_result(outs[0])["images_per_sec"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="resnet20")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="scalelab-perf-")
    os.environ.setdefault("SCALELAB_HOME", tmp)
    os.environ.setdefault("SCALELAB_INVENTORIES", os.path.join(tmp, "inventories"))
    lc = LocalCluster("perfh")
    lc.provision(a.nodes)
    try:
        rec = lc.load()
        rt = launch.default_runtime(rec)
        nodes = lc.nodes()
        params = {"model": a.model, "batch_size": a.batch, "precision": "fp32", "steps": a.steps,
                  "warmup": 5, "engine": "ddp", "image_size": None, "data": "synthetic"}
        args = launch.workload_args(params)
        driver, hand = [], []
        for r in range(a.repeats):
            res = launch.run(launch.torchrun_commands(nodes, 1, "resnet.py", args, rt, 29300 + r),
                             rt, timeout_s=600)
            driver.append(float(res.result["images_per_sec"]))
            hand.append(by_hand(lc, nodes, args, 29350 + r))
        d, h = statistics.median(driver), statistics.median(hand)
        print(json.dumps({"driver": driver, "by_hand": hand}))
        print(f"{a.model} batch {a.batch}, {a.nodes} nodes, {a.steps} steps, {a.repeats} repeats")
        print(f"driver median {d:.1f} img/s, by hand median {h:.1f} img/s, "
              f"ratio {100 * d / h:.1f} %")
    finally:
        lc.destroy()


if __name__ == "__main__":
    main()
