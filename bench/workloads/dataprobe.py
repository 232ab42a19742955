#!/usr/bin/env python3
"""What a node gets from a data source: its storage read rate, or its decode rate per core.

    python dataprobe.py read --data SOURCE --slot I --slots N --streams W --seconds T
    python dataprobe.py decode --data SOURCE --seconds T [--image-size 224]

read: W streams at once, each reading whole shards of this node's share (the shards of slots
I*W .. I*W+W-1 of N*W, in the order the loaders use, as a rank's W loader workers read them) for
T seconds from --start-at, and counting the bytes, sampled every SAMPLE_S as (wall clock,
bytes so far); every node of a storage probe starts at the same instant, and the controller
counts the bytes of the window all nodes were reading in, so that what it gives is what the
storage delivers to N nodes reading together.
decode: one thread decodes and crops the images of the first shard (the model's input pipeline:
JPEG decode, random-resized crop, flip, normalise) for T seconds: images/s on one core.

Prints one SCALELAB_RESULT line; the time is bounded by T whatever the storage does (a stream
still reading at T is cut off, its bytes so far counted).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit_result  # noqa: E402
from shards import Counted, open_shard, shard_urls  # noqa: E402

# small reads, so that a stream's count trails what it has received by at most one read (a
# 1 MB read at a node's share of a 100 Mbit/s link is a second of lag: a window that starts
# after the first instant would count bytes received before it)
CHUNK = 64 << 10
SAMPLE_S = 0.05


def read(a: argparse.Namespace, urls: list[str]) -> dict:
    slots = a.slots * a.streams
    if len(urls) < slots:
        raise SystemExit(f"{a.data}: {len(urls)} shard(s) for {slots} reading streams")
    order = list(urls)
    random.Random(0).shuffle(order)  # the loaders' first epoch order (seed 0)
    # every node of a probe starts at the same instant (the controller's --start-at, bounded)
    time.sleep(min(max(0.0, a.start_at - time.time()), 60.0))
    deadline = time.monotonic() + a.seconds
    counts = [0] * a.streams
    errors: list[str] = []

    def stream(j: int) -> None:
        mine = order[a.slot * a.streams + j::slots]
        while time.monotonic() < deadline:
            for url in mine:
                done, f = counts[j], Counted(open_shard(url))
                try:
                    while time.monotonic() < deadline and f.read(CHUNK):
                        counts[j] = done + f.count
                finally:
                    counts[j] = done + f.count
                    try:
                        f.close()
                    except OSError as exc:  # a reader cut off at the deadline is no error
                        if time.monotonic() < deadline:
                            errors.append(str(exc))
                if errors or time.monotonic() >= deadline:
                    return

    start = time.monotonic()
    samples = [[round(time.time(), 4), 0]]
    threads = [threading.Thread(target=stream, args=(j,), daemon=True) for j in range(a.streams)]
    for t in threads:
        t.start()
    # (wall clock, bytes so far) while the streams read: the controller takes the window
    # every node read in (bounded: the streams stop at the deadline, or 30 s after it)
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline + 30:
        time.sleep(SAMPLE_S)
        samples.append([round(time.time(), 4), sum(counts)])
    for t in threads:
        t.join(1)
    seconds = time.monotonic() - start
    if errors:
        raise SystemExit(f"{a.data}: {errors[0]}")
    if not sum(counts):
        raise SystemExit(f"{a.data}: read nothing in {a.seconds:g} s")
    samples.append([round(time.time(), 4), sum(counts)])
    return {"bytes": sum(counts), "seconds": round(seconds, 4), "streams": a.streams,
            "samples": samples}


def decode(a: argparse.Namespace, urls: list[str]) -> dict:
    import imagedata
    import torch
    from webdataset.tariterators import group_by_keys, tar_file_expander

    torch.set_num_threads(1)
    with open_shard(urls[0]) as f:
        images = [s["jpg"] for s in group_by_keys(tar_file_expander([{"url": urls[0],
                                                                       "stream": f}]))
                  if "jpg" in s]
    if not images:
        raise SystemExit(f"{urls[0]}: no .jpg samples")
    transform = imagedata.TrainTransform(a.image_size, seed=0)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < a.seconds:
        transform(imagedata.decode(images[done % len(images)]))
        done += 1
    seconds = time.perf_counter() - start
    return {"images": done, "seconds": round(seconds, 4),
            "img_s_per_core": round(done / seconds, 2),
            "jpeg_bytes_mean": round(sum(map(len, images)) / len(images))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["read", "decode"])
    p.add_argument("--data", required=True)
    p.add_argument("--slot", type=int, default=0)
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--start-at", type=float, default=0.0,
                   help="read: start at this time (seconds since the epoch; at most 60 s on)")
    a = p.parse_args()
    if not (0 <= a.slot < a.slots and a.streams >= 1 and 0 < a.seconds <= 600):
        p.error("need 0 <= --slot < --slots, --streams >= 1 and 0 < --seconds <= 600")
    urls = shard_urls(a.data)
    if not urls:
        raise SystemExit(f"{a.data}: no .tar shards there")
    emit_result(read(a, urls) if a.what == "read" else decode(a, urls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
