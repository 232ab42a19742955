"""Real-data input pipeline for resnet.py: ImageNet-style JPEGs decoded and augmented on CPU
DataLoader workers with PIL, sharded across ranks. No torchvision.

Two layouts are read, from a local path or a shared mount:

* class folders: ``ROOT/<class>/<image>.jpg`` (classes = sorted sub-directory names);
* webdataset tar shards: ``ROOT/*.tar`` (or one .tar file), each sample a pair of members
  ``<key>.jpg`` + ``<key>.cls`` (the label as decimal text), members of a sample adjacent.

Training augmentation is the usual ImageNet one: random-resized-crop (scale 0.08-1, aspect
3/4-4/3), horizontal flip with p=0.5, ImageNet mean/std normalisation.

Sharding: class folders use DistributedSampler (every rank the same number of samples). Tar
shards are split by shard across (rank, worker) when there are enough shards, else by sample
index. Both streams repeat epochs, so every rank can draw exactly warmup+steps batches and no
rank runs dry before the others (which would hang the collective).
"""

from __future__ import annotations

import io
import math
import os
import random
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".JPEG", ".JPG", ".PNG")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def random_resized_crop_box(
    width: int,
    height: int,
    rng: random.Random,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a crop covering `scale` of the area with aspect in `ratio`
    (log-uniform), 10 tries, then a centre crop clamped to `ratio` (Szegedy et al. 2015)."""
    area = width * height
    log_r = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_r))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            left = rng.randint(0, width - w)
            top = rng.randint(0, height - h)
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


class TrainTransform:
    """PIL image -> normalised float CHW tensor of size x size."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size = size
        self.rng = random.Random(seed)
        self.mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def reseed(self, seed: int) -> None:
        self.rng.seed(seed)

    def __call__(self, img: Image.Image) -> torch.Tensor:
        img = img.convert("RGB")
        box = random_resized_crop_box(img.width, img.height, self.rng)
        # resize(box=...) crops and scales in one resampling pass.
        img = img.resize((self.size, self.size), Image.Resampling.BILINEAR, box=box)
        if self.rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        # frombuffer shares the bytes object's memory, which is read-only: clone via .float().
        t = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        t = t.view(self.size, self.size, 3).permute(2, 0, 1).float().div_(255.0)
        return t.sub_(self.mean).div_(self.std)


def decode(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


class FolderDataset(Dataset):
    """ImageFolder equivalent: ROOT/<class>/<file>; labels are indices of sorted class names."""

    def __init__(self, root: str, transform: TrainTransform) -> None:
        self.root = root
        self.transform = transform
        self.classes = sorted(d.name for d in os.scandir(root) if d.is_dir() and not d.name.startswith("."))
        if not self.classes:
            raise ValueError(f"{root}: no class sub-directories")
        self.samples: list[tuple[str, int]] = []
        for idx, name in enumerate(self.classes):
            cdir = os.path.join(root, name)
            for f in sorted(os.listdir(cdir)):
                if f.endswith(IMAGE_EXTS):
                    self.samples.append((os.path.join(cdir, f), idx))
        if not self.samples:
            raise ValueError(f"{root}: no images ({', '.join(IMAGE_EXTS)}) in class folders")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[i]
        with open(path, "rb") as f:
            return self.transform(decode(f.read())), label


def iter_tar_samples(path: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yield (key, {ext: bytes}) for each sample of a webdataset shard, streaming."""
    key, parts = None, {}
    with tarfile.open(path, mode="r|*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            base = os.path.basename(member.name)
            if "." not in base:
                continue
            k, ext = base.split(".", 1)
            k = os.path.join(os.path.dirname(member.name), k)
            if k != key:
                if key is not None:
                    yield key, parts
                key, parts = k, {}
            f = tar.extractfile(member)
            parts[ext.lower()] = f.read() if f else b""
    if key is not None:
        yield key, parts


def _image_part(parts: dict[str, bytes]) -> bytes | None:
    for ext in ("jpg", "jpeg", "png"):
        if ext in parts:
            return parts[ext]
    return None


class TarShardDataset(IterableDataset):
    """Webdataset-layout shards, split over (rank, worker), repeating epochs forever."""

    def __init__(self, shards: list[str], transform: TrainTransform, rank: int, world: int, seed: int = 0) -> None:
        if not shards:
            raise ValueError("no .tar shards")
        self.shards = sorted(shards)
        self.transform = transform
        self.rank, self.world, self.seed = rank, world, seed

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        info = torch.utils.data.get_worker_info()
        wid, nworkers = (info.id, info.num_workers) if info else (0, 1)
        slots = self.world * nworkers
        slot = self.rank * nworkers + wid
        self.transform.reseed(self.seed * 1_000_003 + slot)
        by_shard = len(self.shards) >= slots
        for epoch in range(1 << 30):  # bounded by the caller, which draws a fixed batch count
            order = list(self.shards)
            random.Random(self.seed + epoch).shuffle(order)  # same order on every rank
            if by_shard:
                mine = order[slot::slots]
            else:
                mine = order
            n = 0
            for shard in mine:
                for i, (key, parts) in enumerate(iter_tar_samples(shard)):
                    if not by_shard and i % slots != slot:
                        continue
                    img = _image_part(parts)
                    if img is None or "cls" not in parts:
                        raise ValueError(f"{shard}: sample {key} lacks .jpg/.cls")
                    n += 1
                    yield self.transform(decode(img)), int(parts["cls"].decode().strip())
            if n == 0:
                raise ValueError(
                    f"rank {self.rank} worker {wid}: no samples in its share of {len(self.shards)} shard(s)"
                )


def find_shards(path: str) -> list[str]:
    if os.path.isfile(path) and path.endswith(".tar"):
        return [path]
    if os.path.isdir(path):
        return sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".tar"))
    return []


def tar_num_classes(shards: list[str]) -> int:
    """max label + 1 over all shards (reads every .cls member; pass --num-classes to skip)."""
    top = -1
    for shard in shards:
        with tarfile.open(shard, mode="r|*") as tar:
            for m in tar:
                if m.isfile() and m.name.endswith(".cls"):
                    f = tar.extractfile(m)
                    top = max(top, int(f.read().decode().strip()) if f else -1)
    if top < 0:
        raise ValueError("no .cls members in the shards")
    return top + 1


@dataclass
class RealData:
    loader: DataLoader
    num_classes: int
    layout: str  # "folders" | "shards"
    num_samples: int | None  # None for shards (not counted up front)
    _sampler: DistributedSampler | None = None

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless batches (epochs repeat); the caller takes a fixed count."""
        for epoch in range(1 << 30):
            if self._sampler is not None:
                self._sampler.set_epoch(epoch)
            got = 0
            for batch in self.loader:
                got += 1
                yield batch
            if got == 0:
                raise ValueError("dataset yields no full batch for this rank; lower --batch-size or add images")


def make_loader(
    path: str,
    *,
    image_size: int,
    batch_size: int,
    workers: int,
    rank: int,
    world: int,
    num_classes: int | None,
    pin_memory: bool,
    seed: int = 0,
    timeout_s: float = 0.0,
) -> RealData:
    """A DataLoader over `path` (folders or tar shards), this rank's share of it.
    timeout_s bounds the wait for a batch from the workers (0 = no bound; needs workers > 0)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"--data {path}: no such file or directory")
    shards = find_shards(path)
    common = dict(
        batch_size=batch_size,
        num_workers=workers,
        pin_memory=pin_memory,
        drop_last=True,
        timeout=timeout_s if workers > 0 else 0.0,
    )
    if shards:
        ds = TarShardDataset(shards, TrainTransform(image_size, seed), rank, world, seed)
        k = num_classes or tar_num_classes(shards)
        return RealData(DataLoader(ds, **common), k, "shards", None)
    ds = FolderDataset(path, TrainTransform(image_size, seed + rank))
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=False)
    loader = DataLoader(ds, sampler=sampler, worker_init_fn=_reseed_worker, **common)
    return RealData(loader, num_classes or ds.num_classes, "folders", len(ds), sampler)


def _reseed_worker(worker_id: int) -> None:
    # Each worker holds a copy of the transform; give each its own augmentation stream.
    info = torch.utils.data.get_worker_info()
    ds = info.dataset
    if isinstance(ds, FolderDataset):
        ds.transform.reseed(info.seed % (1 << 32))
