"""How many emulated H100s each storage setup here sustains, in MLPerf Storage's terms.

MLPerf Storage's ResNet-50 workload: samples of 114,660 bytes, an H100 computing 1,786 samples/s,
and a storage setup passes with N accelerators while each stays at least 90 % busy (compute time
over wall time), which takes 0.9 x 1,786 x 114,660 B = 184.3 MB/s per accelerator.

A local cluster of N + 1 nodes (needs root). The last node serves a staged set of photo-sized
JPEGs (about 112 KB each) over HTTP and from its own NFS-Ganesha, its link shaped at each
--storage-bandwidth value. For each setup:
  1. the storage probe reads the set from 1..N nodes at once (--streams readers a node), in
     real time: the supply curve in MB/s of this host's server behind the shaped link, and the
     most accelerators (one a node) it feeds at 184.3 MB/s each ("fed");
  2. emulated H100s, one a node, train ResNet-50 on real batches read from it: the H100 profile
     scaled to MLPerf's 1,786 samples/s (bench/profiles/h100-resnet50-fp32.json, every layer x
     the same factor), batch --batch-size, --loader-workers a rank, the decode charged at the
     decode probe's cost in the loader workers (sleeping, so that enough workers hide it as
     MLPerf's reader threads do). Time dilation slows the storage link by k as it does the
     others, so in the devices' time the link is the storage's limit, not this host's server:
     the runs are at the count the link's rate feeds (95 % of it, as the probe reads) and one
     more; prints each run's accelerator busy (results.csv accel_busy) against 90 %, and the
     most nodes with at least 90 % ("sustained").
"fed" is what this host's server gives undilated; "sustained" what a storage node with this
link gives emulated accelerators where its server keeps up with its link.

Usage: .venv/bin/python bench/perf/mlperf_storage.py [--nodes 8] [--stores http,nfs]
       [--storage-bandwidth 1gbit,10gbit] [--batch-size 64] [--loader-workers 8] [--steps 20]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import sys
import tempfile
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

SAMPLE_BYTES = 114_660
H100_SAMPLES_S = 1_786.0
BUSY = 0.90
PER_ACCEL_MB_S = BUSY * H100_SAMPLES_S * SAMPLE_BYTES / 1e6  # 184.3
LINK_SHARE = 0.95  # what the storage probe reads of a shaped link (docs/figures.md)


def mlperf_profile(batch: int, out: Path) -> Path:
    """The H100 ResNet-50 profile with every time scaled so that a step at `batch` runs at
    MLPerf Storage's 1,786 samples/s."""
    prof = json.loads((ROOT / "bench/profiles/h100-resnet50-fp32.json").read_text())
    scale_batch = batch / prof["batch_size"]  # the emulation scales a profile's times by batch
    step = prof["optimizer_s"] + sum(x["fwd_s"] + x["bwd_s"] for x in prof["layers"]) * scale_batch
    f = (batch / H100_SAMPLES_S) / step
    for x in prof["layers"]:
        x["fwd_s"] *= f
        x["bwd_s"] *= f
    prof["optimizer_s"] *= f
    prof.pop("memory_format", None)  # a layout of its own: none (the runs' default is fine)
    prof["provenance"] = ("MLPerf Storage's emulated H100 (1,786 ResNet-50 samples/s): "
                          f"scalelab's measured H100 profile with every time x {f:.4f}; "
                          + prof["provenance"])
    out.write_text(json.dumps(prof, indent=1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8, help="accelerators at most (one a node)")
    ap.add_argument("--stores", default="http,nfs")
    ap.add_argument("--storage-bandwidth", default="1gbit,10gbit")
    ap.add_argument("--bandwidth", default="100gbit", help="the cluster network's rate")
    ap.add_argument("--streams", type=int, default=4, help="probe readers a node")
    ap.add_argument("--seconds", type=float, default=4.0, help="each probe's reading time")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--loader-workers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--images-per-shard", type=int, default=16)
    a = ap.parse_args()
    stores = a.stores.split(",")
    if not set(stores) <= {"http", "nfs"} or not 1 <= a.nodes <= 16:
        ap.error("--stores: http, nfs or http,nfs; --nodes 1-16")
    rates = [(r, parse_rate_mbit(r)) for r in a.storage_bandwidth.split(",")]
    tmp = private_state()
    profile = mlperf_profile(a.batch_size, Path(tempfile.mkdtemp(dir=tmp)) / "mlperf-h100.json")
    name = f"ml{uuid.uuid4().hex[:4]}"
    shards = a.nodes * a.loader_workers * 2
    lines = []
    try:
        invoke("provision", "--target", "local", "--cluster", name, "--nodes", str(a.nodes + 1))
        storage_node = f"{name}-n{a.nodes}"
        sources = {}
        for store in stores:
            out = invoke("stage", "--cluster", name, "--to", store, "--node", storage_node,
                         "--name", f"on{store}", "--images", str(shards * a.images_per_shard),
                         "--classes", "100", "--shard-size", str(a.images_per_shard))
            sources[store] = shlex.split(re.search(r"--data (.+)$", out, re.MULTILINE)[1])[0]
        rec = load_cluster(name)
        nodes = nodes_of(rec)
        target = targets.of(rec)
        rt = target.runtime(rec)
        for store in stores:
            for rate, mbit in rates:
                shaper = Shaper(target.links(name, rec, nodes))
                try:
                    shaper.set(None)
                    shaper.set_server(nodes[-1].name, mbit)
                    curve = {}
                    for n in range(1, a.nodes + 1):
                        p = storageprobe.measure_read(nodes[:n], rt, sources[store], a.streams,
                                                      a.seconds)
                        # a probe that fails (nodes that could not start together on this
                        # busy host) leaves its point out, said
                        curve[n] = p.mb_s if p.mb_s is not None else float("nan")
                finally:
                    shaper.restore()
                fed = max([n for n, mb in curve.items() if mb >= n * PER_ACCEL_MB_S], default=0)
                # the emulated devices' storage is the link in their time (dilated: the
                # server's CPU here is not what limits it): the count its rate feeds, and one
                # more
                link_fed = min(int(mbit / 8 * LINK_SHARE / PER_ACCEL_MB_S), a.nodes)
                runs = sorted({max(link_fed, 1), min(link_fed + 1, a.nodes)})
                busy = emulate(name, sources[store], rate, runs, profile, a)
                sustained = max([n for n, b in busy.items() if b >= BUSY], default=0)
                lines.append(
                    f"{store:>5} {rate:>7} " + " ".join(f"{curve[n]:7.0f}" if curve[n] == curve[n] else f"{'-':>7}"
                               for n in curve)
                    + f"   {fed:>3}   " + ", ".join(f"{n}: {b:.0%}" for n, b in busy.items())
                    + f"   {sustained:>3}")
    finally:
        destroy(name)
    print(f"MLPerf Storage's ResNet-50 terms: {SAMPLE_BYTES:,} B a sample, an H100 at "
          f"{H100_SAMPLES_S:,.0f} samples/s, {BUSY:.0%} busy: {PER_ACCEL_MB_S:.1f} MB/s an "
          f"accelerator; emulated H100s at batch {a.batch_size}, {a.loader_workers} loader "
          f"workers a rank, one a node, cluster links {a.bandwidth}")
    print(f"{'store':>5} {'link':>7} " + " ".join(f"{f'{n} MB/s':>7}" for n in range(1, a.nodes + 1))
          + "   fed   accelerator busy by nodes   sustained")
    print("\n".join(lines))
    return 0


def emulate(cluster: str, source: str, rate: str, counts: list[int], profile: Path,
            a) -> dict[int, float]:
    """Each count's accelerator busy (the ranks' mean) from one sweep of emulated H100s."""
    invoke("bench", "--cluster", cluster, "--nodes", ",".join(map(str, counts)), "--batch-size",
           str(a.batch_size), "--model", "resnet50", "--accelerator", str(profile),
           "--bandwidth", a.bandwidth, "--steps", str(a.steps), "--repeats", "1", "--data",
           source, "--storage-bandwidth", rate, "--loader-workers", str(a.loader_workers),
           "--no-report")
    reports = Path(os.environ["SCALELAB_REPORTS"])
    with open(reports / os.readlink(reports / "latest") / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    bad = [f"{r['nodes']}: {r['status']} {r['error']}" for r in rows if r["status"] != "ok"]
    if bad:
        sys.exit("error: runs failed: " + "; ".join(bad))
    return {int(r["nodes"]): float(r["accel_busy"]) for r in sorted(rows, key=lambda r: int(r["nodes"]))}


if __name__ == "__main__":
    sys.exit(main())
