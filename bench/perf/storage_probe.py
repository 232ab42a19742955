"""What the storage probe measures of a shaped storage link, from one node and from N at once.

A local cluster of N + 1 nodes (needs root): the last serves a staged set over HTTP as
`invoke stage --to http` puts it there (photo-sized JPEGs, about 112 KB each, --shard-size a
shard),
and its link is set to each --rates value as --storage-bandwidth sets it; the others read the
shards with the sweep's storage probe (scalelab.run.storageprobe: --streams readers a node, whole
shards, --seconds) from 1 node and from N at once. Prints MB/s and the share of the link's
rate for each, the median of --repeats. The cluster is destroyed at the end, also on a failure.

Usage: .venv/bin/python bench/perf/storage_probe.py [--nodes 8] [--rates 100mbit,1gbit]
       [--streams 2] [--seconds 5] [--repeats 3] [--shard-size 100]
"""

from __future__ import annotations

import argparse
import re
import shlex
import statistics
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _state import destroy, invoke, private_state  # noqa: E402

from scalelab.cluster import targets  # noqa: E402
from scalelab.cluster.nodes import nodes_of  # noqa: E402
from scalelab.core.state import load_cluster  # noqa: E402
from scalelab.core.units import parse_rate_mbit  # noqa: E402
from scalelab.run import storageprobe  # noqa: E402
from scalelab.run.shaping import Shaper  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8, help="readers at most (the set is served "
                    "by one more node)")
    ap.add_argument("--rates", default="100mbit,1gbit")
    ap.add_argument("--streams", type=int, default=2, help="readers a node (loader workers)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shard-size", type=int, default=100, help="images a shard (stage's own "
                    "default; WebDataset's shards are often larger)")
    a = ap.parse_args()
    if not (1 <= a.nodes <= 16 and 1 <= a.streams <= 8 and 0 < a.seconds <= 60
            and 1 <= a.repeats <= 10 and 1 <= a.shard_size <= 1000):
        ap.error("--nodes 1-16, --streams 1-8, --seconds up to 60, --repeats 1-10, "
                 "--shard-size 1-1000")
    private_state()
    name = f"sp{uuid.uuid4().hex[:4]}"
    shards = a.nodes * a.streams
    try:
        invoke("provision", "--target", "local", "--cluster", name, "--nodes", str(a.nodes + 1))
        out = invoke("stage", "--cluster", name, "--images", str(shards * a.shard_size),
                     "--classes", "4", "--shard-size", str(a.shard_size))
        url = shlex.split(re.search(r"--data (.+)$", out, re.MULTILINE)[1])[0]
        rec = load_cluster(name)
        nodes = nodes_of(rec)
        target = targets.of(rec)
        rt = target.runtime(rec)
        shaper = Shaper(target.links(name, rec, nodes))
        print(f"{'link':>8} {'readers':>7} {'MB/s (median)':>14} {'of the link':>11}  runs "
              f"({a.seconds:g} s, {a.streams} streams a node, shards of {a.shard_size} x 112 KB)")
        try:
            for rate in a.rates.split(","):
                mbit = parse_rate_mbit(rate)
                shaper.set(None)
                shaper.set_server(nodes[-1].name, mbit)
                for n in dict.fromkeys((1, a.nodes)):
                    got = []
                    for _ in range(a.repeats):
                        p = storageprobe.measure_read(nodes[:n], rt, url, a.streams, a.seconds)
                        if p.mb_s is None:
                            sys.exit(f"error: the probe failed: {p.error}")
                        got.append(p.mb_s)
                    med = statistics.median(got)
                    share = f"{med * 8 / mbit:.1%}" if mbit else "-"
                    print(f"{rate:>8} {n:>7} {med:14.2f} {share:>11}  "
                          + " ".join(f"{g:.2f}" for g in got), flush=True)
        finally:
            shaper.restore()
    finally:
        destroy(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
