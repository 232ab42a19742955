#!/usr/bin/env python3
"""Write a small synthetic ImageNet-style dataset of random JPEGs, for tests and demos.

    python bench/workloads/make_dataset.py --out /tmp/ds --classes 4 --images-per-class 16 \
        [--size 96 | --like imagenet] [--layout both|folders|shards] [--shard-size 32] [--seed 0]

Writes OUT/folders/class_NNN/NNNNNN.jpg and/or OUT/shards/shard-NNNNNN.tar (webdataset layout:
members NNNNNN.jpg + NNNNNN.cls, the label as decimal text), plus OUT/dataset.json describing
both. Images are smooth random colour fields with noise (a blurred upscale of a tiny random
image), so JPEG sizes and decode costs resemble photos more than white noise would. With
--like imagenet the images are photo-sized (500 px on the long side three times in four, else
300-800 px; 4:3 or 3:2 mostly) and built of detail at every scale, saved at JPEG quality 90:
about 112 KB each, as ImageNet's training photos average 110-115 KB, so that reading and
decoding them costs about what ImageNet's do.
The same seed gives byte-identical images. Prints one `SCALELAB_RESULT {json}` line.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
import tarfile
import time

from PIL import Image, ImageFilter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit_result  # noqa: E402


def random_jpeg(rng: random.Random, size: int, quality: int = 85) -> bytes:
    """One random JPEG of size x size (roughly; aspect varies by up to 25%)."""
    w = max(8, int(size * rng.uniform(0.75, 1.25)))
    h = max(8, int(size * rng.uniform(0.75, 1.25)))
    tiny = Image.frombytes("RGB", (4, 4), rng.randbytes(4 * 4 * 3))
    img = tiny.resize((w, h), Image.Resampling.BICUBIC)
    noise = Image.frombytes("RGB", (w, h), rng.randbytes(w * h * 3))
    img = Image.blend(img, noise.filter(ImageFilter.GaussianBlur(1)), 0.25)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


# aspect ratios (width:height) and how often each is drawn for --like imagenet
_ASPECTS = ((4 / 3, 0.5), (3 / 2, 0.25), (3 / 4, 0.15), (1.0, 0.1))


def imagenet_like_jpeg(rng: random.Random) -> bytes:
    """One photo-sized JPEG weighing what an ImageNet training photo does (112 KB on average):
    500 px on the long side three times in four, else 300-800 px; detail at five scales, the
    finest as strong as a photo's texture, saved at quality 90."""
    aspect = rng.choices([a for a, _ in _ASPECTS], [w for _, w in _ASPECTS])[0]
    long_side = 500 if rng.random() < 0.75 else rng.randint(300, 800)
    w, h = (long_side, round(long_side / aspect)) if aspect >= 1 else \
        (round(long_side * aspect), long_side)
    img = None
    for (tw, th), weight in (((4, 3), 1.0), ((16, 12), 0.5), ((64, 48), 0.35),
                             ((max(1, w // 4), max(1, h // 4)), 0.25), ((w, h), 0.36)):
        layer = Image.frombytes("RGB", (tw, th), rng.randbytes(tw * th * 3)).resize(
            (w, h), Image.Resampling.BICUBIC)
        img = layer if img is None else Image.blend(img, layer, weight / (1 + weight))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0  # reproducible shards
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def make_dataset(
    out: str, classes: int, per_class: int, size: int = 96, layout: str = "both", shard_size: int = 32, seed: int = 0,
    like: str = "",
) -> dict:
    """Write the dataset; return its description (also written to OUT/dataset.json). like:
    "imagenet" for images sized and detailed like ImageNet's (size is then not used)."""
    if classes < 1 or per_class < 1 or size < 8 or shard_size < 1:
        raise ValueError("need classes >= 1, images-per-class >= 1, size >= 8, shard-size >= 1")
    if layout not in ("both", "folders", "shards"):
        raise ValueError(f"unknown layout {layout!r} (both|folders|shards)")
    if like not in ("", "imagenet"):
        raise ValueError(f"unknown --like {like!r} (imagenet, or leave it out)")
    rng = random.Random(seed)
    samples = []  # (index, label, jpeg bytes), in class order
    for label in range(classes):
        for _ in range(per_class):
            data = imagenet_like_jpeg(rng) if like else random_jpeg(rng, size)
            samples.append((len(samples), label, data))
    desc: dict = {
        "classes": classes,
        "images_per_class": per_class,
        "num_images": len(samples),
        "image_size": None if like else size,
        "like": like or None,
        "mean_bytes": round(sum(len(d) for _, _, d in samples) / len(samples)),
        "seed": seed,
        "layouts": {},
    }
    os.makedirs(out, exist_ok=True)
    if layout in ("both", "folders"):
        root = os.path.join(out, "folders")
        for idx, label, data in samples:
            cdir = os.path.join(root, f"class_{label:03d}")
            os.makedirs(cdir, exist_ok=True)
            with open(os.path.join(cdir, f"{idx:06d}.jpg"), "wb") as f:
                f.write(data)
        desc["layouts"]["folders"] = root
    if layout in ("both", "shards"):
        root = os.path.join(out, "shards")
        os.makedirs(root, exist_ok=True)
        # Shuffle before sharding so every shard mixes classes, as real webdataset shards do.
        order = list(samples)
        random.Random(seed + 1).shuffle(order)
        nshards = 0
        for start in range(0, len(order), shard_size):
            path = os.path.join(root, f"shard-{nshards:06d}.tar")
            with tarfile.open(path, "w") as tar:
                for idx, label, data in order[start : start + shard_size]:
                    _add_bytes(tar, f"{idx:06d}.jpg", data)
                    _add_bytes(tar, f"{idx:06d}.cls", str(label).encode())
            nshards += 1
        desc["layouts"]["shards"] = root
        desc["num_shards"] = nshards
    with open(os.path.join(out, "dataset.json"), "w", encoding="utf-8") as f:
        json.dump(desc, f, indent=2)
    return desc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--classes", type=int, default=4, help="number of classes")
    p.add_argument("--images-per-class", type=int, default=16, help="images per class")
    p.add_argument("--size", type=int, default=96, help="nominal image side in pixels")
    p.add_argument("--like", default="", choices=["", "imagenet"],
                   help="imagenet: images sized and detailed like ImageNet's (about 110 KB)")
    p.add_argument("--layout", default="both", choices=["both", "folders", "shards"])
    p.add_argument("--shard-size", type=int, default=32, help="samples per tar shard")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        desc = make_dataset(a.out, a.classes, a.images_per_class, a.size, a.layout, a.shard_size, a.seed,
                            a.like)
    except (ValueError, OSError) as e:
        print(f"make_dataset: error: {e}", file=sys.stderr)
        return 2
    desc["seconds"] = round(time.perf_counter() - t0, 3)
    emit_result(desc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
