"""Real-data input pipeline for resnet.py: ImageNet-style JPEGs decoded and augmented on CPU
DataLoader workers with PIL, sharded across ranks. No torchvision.

Two layouts are read, from a local path or a shared mount:

* class folders: ``ROOT/<class>/<image>.jpg`` (classes = sorted sub-directory names);
* webdataset tar shards: ``ROOT/*.tar``, one .tar file or shard URLs, each sample a pair of members
  ``<key>.jpg`` + ``<key>.cls`` (the label as decimal text), members of a sample adjacent.

Training augmentation is the usual ImageNet one: random-resized-crop (scale 0.08-1, aspect
3/4-4/3), horizontal flip with p=0.5, ImageNet mean/std normalisation.

Shards are read with WebDataset's tar expansion and sample grouping, from a path, or from
http(s):// URLs through curl and nfs:// URLs through nfs-cat, a {000000..000127} range naming a
set; the loader counts the bytes it reads from storage. Shards whose class count is not given
(--num-classes) are taken to have ImageNet's 1,000 classes (counting them would read the set).

Sharding: class folders use DistributedSampler (every rank the same number of samples). Tar
shards are split by shard across the (rank, worker) slots, and a set with fewer shards than
slots is refused. Both streams repeat epochs, so every rank can draw exactly warmup+steps
batches and no rank runs dry before the others (which would hang the collective).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import random
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image
from shards import Counted, open_shard, shard_urls
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset
from webdataset.tariterators import group_by_keys, tar_file_expander

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

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int, float]:
        path, label = self.samples[i]
        with open(path, "rb") as f:
            data = f.read()
        read_at = time.perf_counter()
        return self.transform(decode(data)), label, len(data), read_at


class DataReadError(RuntimeError):
    """A shard could not be read to its end: which, how far, and what the reader said."""


# curl's exit codes a storage that fails mid-run gives
CURL_EXITS = {7: "could not connect: the server is down or the port closed",
              18: "the transfer ended early: the server went away mid-shard",
              22: "the server answered with an HTTP error", 28: "timed out",
              52: "the server sent nothing", 56: "the connection was cut"}


def read_failure(stream: Counted, exc: BaseException) -> str:
    """One line: the shard, the bytes read of it, and the reader's exit status or error."""
    proc = getattr(stream.stream, "proc", None)
    status = None
    if proc is not None:
        with contextlib.suppress(Exception):
            status = proc.wait(timeout=5)
    said = f"{getattr(stream, 'url', '?')}: reading stopped after {stream.count} bytes"
    if status:
        tool = "curl" if "curl" in str(proc.args) else "nfs-cat"
        return f"{said}: {tool} exit {status} ({CURL_EXITS.get(status, 'see its stderr')})"
    return f"{said}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def _image_part(sample: dict[str, Any]) -> bytes | None:
    for ext in ("jpg", "jpeg", "png"):
        if ext in sample:
            return sample[ext]
    return None


class TarShardDataset(IterableDataset):
    """WebDataset shards split by shard over the (rank, worker) slots, every slot at least one
    shard (make_loader refuses fewer), in an order shuffled per epoch the same on every rank;
    epochs repeat forever. Yields (image, label, bytes read from storage since the last)."""

    def __init__(self, shards: list[str], transform: TrainTransform, rank: int, world: int,
                 seed: int = 0, charge_s: float | None = None) -> None:
        if not shards:
            raise ValueError("no .tar shards")
        self.shards = sorted(shards)
        self.transform = transform
        self.rank, self.world, self.seed = rank, world, seed
        # an emulated device's input: the bytes read, the decode charged (seconds an image)
        self.charge_s = charge_s

    def _prepare(self, img: bytes) -> torch.Tensor:
        if self.charge_s is None:
            return self.transform(decode(img))
        time.sleep(self.charge_s)
        return torch.zeros(1)

    def _opened(self, mine: list[str], counters: list[Counted]) -> Iterator[dict[str, Any]]:
        for url in mine:
            stream = Counted(open_shard(url))
            stream.url = url
            counters.append(stream)
            try:
                yield {"url": url, "stream": stream}
            except GeneratorExit:  # left mid-shard: a reader cut off is no error of its own
                with contextlib.suppress(OSError):
                    stream.close()
                raise
            stream.close()  # a reader that failed after its last byte fails here

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int, int, float]]:
        info = torch.utils.data.get_worker_info()
        wid, nworkers = (info.id, info.num_workers) if info else (0, 1)
        slots = self.world * nworkers
        slot = self.rank * nworkers + wid
        if len(self.shards) < slots:
            raise ValueError(f"{len(self.shards)} shard(s) for {slots} (rank, worker) slots")
        self.transform.reseed(self.seed * 1_000_003 + slot)
        for epoch in range(1 << 30):  # bounded by the caller, which draws a fixed batch count
            order = list(self.shards)
            random.Random(self.seed + epoch).shuffle(order)  # same order on every rank
            counters: list[Counted] = []
            told = 0
            samples = group_by_keys(tar_file_expander(self._opened(order[slot::slots], counters)))
            while True:
                try:
                    sample = next(samples, None)
                except (OSError, tarfile.TarError) as exc:
                    raise DataReadError(read_failure(counters[-1], exc)) from None
                if sample is None:
                    break
                img = _image_part(sample)
                if img is None or "cls" not in sample:
                    raise ValueError(f"{sample['__url__']}: sample {sample['__key__']} lacks "
                                     ".jpg/.cls")
                read, read_at = sum(c.count for c in counters), time.perf_counter()
                yield (self._prepare(img), int(sample["cls"].decode().strip()), read - told,
                       read_at)
                told = read


IMAGENET_CLASSES = 1000  # the classes of shards whose count is not given (--num-classes)


@dataclass
class RealData:
    loader: DataLoader
    num_classes: int
    layout: str  # "folders" | "shards"
    num_samples: int | None  # None for shards (not counted up front)
    _sampler: DistributedSampler | None = None
    bytes_read: int = 0  # bytes the loader's workers read from storage for the batches yielded
    # each sample yielded: when a loader worker had read it from storage (perf_counter, the
    # host's monotonic clock every process shares) and its bytes
    reads: list[tuple[float, int]] = field(default_factory=list)

    def start_window(self) -> int:
        """Forget the samples yielded so far: a window's rate counts none of them, as all
        were read before it began (read_between). The bytes read so far."""
        self.reads.clear()
        return self.bytes_read

    def read_between(self, t0: float, t1: float) -> tuple[int, float] | None:
        """(bytes, seconds) the workers read from storage between t0 and t1 (perf_counter), of
        the samples yielded so far: from the first sample they finished reading in that span
        to the last, in time, the bytes of those after the first. Not the samples read ahead
        before t0 while the workers ran in front of the steps; a sample under way at either
        end of the span counts about as much at one end as it is left out at the other (with
        several workers, whose batches come whole). None with fewer than two samples read in
        the span (a short run the read-ahead covered): no rate to give.

        >>> d = RealData(None, 1, "shards", None,
        ...              reads=[(1.0, 10), (3.0, 40), (2.0, 20), (3.5, 30), (9.0, 5)])
        >>> d.read_between(1.5, 4.0), d.read_between(2.5, 3.25)
        ((70, 1.5), None)
        """
        inside = sorted((at, n) for at, n in self.reads if t0 <= at <= t1)
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return None
        return sum(n for _, n in inside[1:]), inside[-1][0] - inside[0][0]

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless batches (epochs repeat); the caller takes a fixed count."""
        for epoch in range(1 << 30):
            if self._sampler is not None:
                self._sampler.set_epoch(epoch)
            got = 0
            try:
                for x, y, nbytes, read_at in self.loader:
                    got += 1
                    self.bytes_read += int(nbytes.sum())
                    self.reads += zip(read_at.tolist(), nbytes.tolist(), strict=True)
                    yield x, y
            except DataReadError as exc:
                # a worker's error comes with its traceback: the run's reason is its last line
                lines = [ln for ln in str(exc).splitlines() if ln.strip()]
                raise DataReadError(lines[-1].split("DataReadError: ", 1)[-1]) from None
            if got == 0:
                raise ValueError("dataset yields no full batch for this rank; lower --batch-size or add images")

    def take(self, n: int, convert: Any) -> Any:
        """A generator function of n batches, each (x, y) given through convert."""

        def batches() -> Iterator[Any]:
            src = self.batches()
            try:
                for _ in range(n):
                    yield convert(*next(src))
            finally:
                src.close()

        return batches


def make_loader(
    source: str,
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
    charge_s: float | None = None,
) -> RealData:
    """A DataLoader over `source` (class folders, or tar shards at a path or URLs), this rank's
    share of it. timeout_s bounds the wait for a batch from the workers (0 = no bound; needs
    workers > 0). charge_s: an emulated device's input, its bytes read and charge_s seconds of
    decode slept per image instead of decoding (shards only)."""
    if "://" not in source and not os.path.exists(source):
        raise FileNotFoundError(f"--data {source}: no such file or directory")
    shards = shard_urls(source)
    common = dict(
        batch_size=batch_size,
        num_workers=workers,
        pin_memory=pin_memory,
        drop_last=True,
        timeout=timeout_s if workers > 0 else 0.0,
    )
    if shards:
        slots = world * max(workers, 1)
        if len(shards) < slots:
            raise ValueError(f"--data {source}: {len(shards)} shard(s) for {world} rank(s) x "
                             f"{max(workers, 1)} loader worker(s): every worker reads whole "
                             f"shards, so give at least {slots} shards or fewer loader workers")
        ds = TarShardDataset(shards, TrainTransform(image_size, seed), rank, world, seed,
                             charge_s)
        return RealData(DataLoader(ds, **common), num_classes or IMAGENET_CLASSES, "shards", None)
    if charge_s is not None:
        raise ValueError(f"--data {source}: an emulated device reads tar shards; stage the set "
                         "as shards (invoke stage)")
    ds = FolderDataset(source, TrainTransform(image_size, seed + rank))
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=False)
    loader = DataLoader(ds, sampler=sampler, worker_init_fn=_reseed_worker, **common)
    return RealData(loader, num_classes or ds.num_classes, "folders", len(ds), sampler)


def _reseed_worker(worker_id: int) -> None:
    # Each worker holds a copy of the transform; give each its own augmentation stream.
    info = torch.utils.data.get_worker_info()
    ds = info.dataset
    if isinstance(ds, FolderDataset):
        ds.transform.reseed(info.seed % (1 << 32))
