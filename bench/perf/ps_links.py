"""The parameter servers' exchange alone over shaped links: where the dedicated layout loses time.

Provisions a local cluster with every link at --bandwidth and runs bench/perf/ps_exchange.py's
exchange (ResNet-50's 102 MB of fp32 gradients in DDP's 25 MB buckets, pushed to the servers
in pieces and pulled back; no model, no training) for each layout given, N workers and K
dedicated servers on nodes of their own, and DDP's ring allreduce of the same buckets. Prints
each layout's milliseconds a step (the median of --repeats runs of --steps steps) beside what
the busiest NIC's bytes take at the link's rate (the model's network time, engines.md), so that
the exchange can be told apart from the training around it. Needs root.

Usage: .venv/bin/python bench/perf/ps_links.py [--layouts 1x1,2x1,2x2] [--bandwidth 1gbit]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scalelab.cluster.targets.local import LocalCluster  # noqa: E402
from scalelab.core.units import parse_rate_mbit  # noqa: E402
from scalelab.model import layouts  # noqa: E402
from scalelab.run import commands, launch  # noqa: E402
from scalelab.run.launch import Runtime  # noqa: E402

PARAMS = 25_557_032  # ResNet-50's, as ps_exchange.py
EXCHANGE = ROOT / "bench" / "perf" / "ps_exchange.py"


def layout(text: str) -> tuple[int, int]:
    """'2x2' -> (2 workers, 2 servers); 'ring2' -> (2, 0), the ring."""
    if text.startswith("ring"):
        return int(text[4:]), 0
    n, _, k = text.partition("x")
    return int(n), int(k)


def busiest_bytes(n: int, k: int) -> float:
    """Bytes the busiest NIC carries each way a step (the model's, scalelab.model.layouts)."""
    shape = layouts.Layout(n, 1, k, layouts.DEDICATED) if k else layouts.Layout(n, 1)
    return layouts.busiest(shape, PARAMS * 4)[1]


def one(lc: LocalCluster, n: int, k: int, steps: int, port: int, bucket_mb: int = 25) -> float:
    """Milliseconds a step of the exchange, N workers and K servers (K = 0: the ring)."""
    nodes = lc.nodes()[: n + k]
    rt = Runtime(sys.executable, str(ROOT), lc.load()["known_hosts"])
    cmds = []
    for i, node in enumerate(nodes):
        env = commands.rank_env(node, 1)
        # psengine.serves(1): the last local rank serves; a worker is rank 0 of 2 here
        env.update(RANK=str(i), WORLD_SIZE=str(n + k), LOCAL_RANK="0",
                   LOCAL_WORLD_SIZE="1" if i >= n else "2", MASTER_ADDR=nodes[0].private_address,
                   MASTER_PORT=str(port), SCALELAB_BUCKET_MB=str(bucket_mb))
        argv = [sys.executable, str(EXCHANGE), "--rank", "ps" if k else "ring",
                "--steps", str(steps)]
        cmds.append(commands.RankCommand(node, argv, env))
    res = launch.run(cmds, rt, timeout_s=600)
    if res.status != "ok" and not res.outcomes:
        raise SystemExit(f"{n}x{k}: {res.error}")
    out = "".join(o.stdout for o in res.outcomes if o is not None)
    if "STEP_MS" not in out:
        raise SystemExit(f"{n}x{k}: no step time ({res.error})")
    return float(out.split("STEP_MS")[1].split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", default="1x1,2x1,2x2,ring2",
                    help="NxK: N workers and K dedicated servers; ringN: the ring of N")
    ap.add_argument("--bandwidth", default="1gbit")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bucket-mb", type=int, default=25, help="the buckets' size (DDP's: 25)")
    a = ap.parse_args()
    wanted = [layout(t) for t in a.layouts.split(",")]
    if not (1 <= a.steps <= 50 and 1 <= a.repeats <= 5 and 1 <= a.bucket_mb <= 1024) or \
            not all(1 <= n and 0 <= k and n + k <= 8 for n, k in wanted):
        ap.error("--steps 1-50, --repeats 1-5, --bucket-mb 1-1024, at most 8 nodes a layout")
    mbit = parse_rate_mbit(a.bandwidth)
    tmp = tempfile.mkdtemp(prefix="scalelab-perf-")
    os.environ.setdefault("SCALELAB_HOME", tmp)
    os.environ.setdefault("SCALELAB_INVENTORIES", os.path.join(tmp, "inventories"))
    lc = LocalCluster(f"psl{os.getpid() % 10000}")
    lc.provision(max(n + k for n, k in wanted), bandwidth=a.bandwidth)
    try:
        print(f"ResNet-50's gradients in {a.bucket_mb} MB buckets, {a.bandwidth} links, "
              f"{a.steps} steps, median of {a.repeats}:")
        print(f"{'layout':>10} {'ms a step':>10} {'busiest NIC':>12} {'at the rate':>12} "
              f"{'ratio':>6}")
        for j, (n, k) in enumerate(wanted):
            got = [one(lc, n, k, a.steps, 29700 + 10 * j + r, a.bucket_mb)
                   for r in range(a.repeats)]
            ms = statistics.median(got)
            wire = busiest_bytes(n, k) * 8 / (mbit * 1e6) * 1e3 if mbit else 0.0
            name = f"ring {n}" if k == 0 else f"{n}w x {k}s"
            print(f"{name:>10} {ms:>10.1f} {busiest_bytes(n, k) / 1e6:>9.1f} MB "
                  f"{wire:>9.1f} ms {ms / wire if wire else float('nan'):>6.2f}", flush=True)
    finally:
        lc.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
