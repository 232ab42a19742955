"""The training image: what ranks run in under `invoke bench --runtime container`.

build() makes it offline, without a Docker engine or a registry:

- a Debian root file system from Debian's packages (mmdebstrap, minbase);
- a virtual environment at /opt/scalelab/venv holding the Python stack from the same
  wheelhouse the offline bundle is made of (scalelab.cluster.bundle: the roles' requirements under
  constraints.txt, and the Horovod wheel scripts/build_horovod.sh built once);
- scalelab's workloads under /opt/scalelab/bench/workloads;

proved inside the root file system (torch and horovod.torch import, Horovod built with
PyTorch), then written as a Docker image archive: the file `docker load` reads, one layer.
Its image id (the sha256 of its configuration, which names the layer by its own sha256) is
the digest every run records; a build with other inputs cannot have the same id.

Images are cached by the hash of their inputs (FORMAT, suite, packages, requirements, the
constraints file, the local wheels and the workloads) under $SCALELAB_IMAGE_CACHE, default
~/.cache/scalelab/images/<key>/ (image.tar and image.json): a second build with the same
inputs is a file check.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scalelab.cluster import bundle as bundles
from scalelab.cluster import packages
from scalelab.core.errors import ScalelabError
from scalelab.core.state import PROJECT_ROOT

log = logging.getLogger(__name__)

FORMAT = 2  # 2: bytecode compiled unchecked (see _mmdebstrap_argv)
REPO = "scalelab/train"
SUITE = "bookworm"
# the interpreter and what torch and Horovod load at run time; procps and iproute2 for a
# person looking inside a running rank
APT_PACKAGES = ("python3", "python3-venv", "libgomp1", "libstdc++6", "procps", "iproute2",
                "ca-certificates")
PREFIX = "/opt/scalelab"
PYTHON = f"{PREFIX}/venv/bin/python"
# where configure unpacks the image into an OCI bundle for Slurm's srun --container (the
# docker_nvidia role's docker_nvidia_oci_dir)
OCI_DIR = f"{PREFIX}/oci"
WORKLOADS = PROJECT_ROOT / "bench" / "workloads"
ARCHIVE = "image.tar"
META = "image.json"
BUILD_TIMEOUT_S = 1800.0
# what a rank needs from an image, and how each is checked inside it
NEEDS = {"torch": "import torch; print(torch.__version__, torch.version.cuda)",
         "horovod": "import horovod, horovod.torch as h; print(horovod.__version__, "
                    "h.gloo_built(), h.nccl_built())"}
# the one proof run inside an image (Debian's or on a vendor's base): the Python version, then
# what NEEDS finds, read back by parse_contents
CHECKS = "; ".join(["import sys; print('SCALELAB_PY', *sys.version_info[:2])",
                    *(f"print('SCALELAB_HAS', '{k}', end=' '); {code}" for k, code in NEEDS.items())])


class ImageError(ScalelabError):
    """The training image could not be built or read."""


def bundle_path(image_id: str) -> str:
    """The OCI bundle of an image on every node, named by its id as the role names it.

    >>> bundle_path("sha256:0123456789abcdef" + "0" * 48)
    '/opt/scalelab/oci/0123456789ab'
    """
    return f"{OCI_DIR}/{image_id[7:19]}"


def cache_root() -> Path:
    return Path(os.environ.get("SCALELAB_IMAGE_CACHE")
                or Path.home() / ".cache" / "scalelab" / "images")


def inputs(requirements: Sequence[str], constraints: Path, local_wheels: Sequence[Path],
           workloads: Path = WORKLOADS) -> dict[str, Any]:
    """Everything the image is made from, as a JSON-able document (hashed into its key)."""
    return {
        "format": FORMAT, "suite": SUITE, "apt": list(APT_PACKAGES),
        "requirements": list(requirements), "constraints": constraints.read_text(),
        "wheels": {w.name: bundles.sha256_of(w) for w in sorted(local_wheels)},
        "workloads": workloads_now(workloads),
    }


def key_of(doc: dict[str, Any]) -> str:
    """The cache key of an image's inputs.

    >>> key_of({"a": 1}) == key_of({"a": 1}) != key_of({"a": 2})
    True
    """
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def read_meta(archive: Path) -> dict[str, Any]:
    """The record build() wrote beside an image archive; ImageError with the fix if absent."""
    archive = Path(archive).expanduser()
    meta = archive.parent / META
    if not archive.is_file():
        raise ImageError(f"image archive {archive} does not exist; build one with invoke image")
    try:
        doc = json.loads(meta.read_text())
    except (OSError, ValueError):
        raise ImageError(f"{archive} has no readable {META} beside it: not an image invoke "
                         "image built; build one with invoke image") from None
    for k in ("id", "tag", "contents"):
        if k not in doc:
            raise ImageError(f"{meta} lacks {k!r}; rebuild the image with invoke image")
    return doc


def workloads_now(workloads: Path = WORKLOADS) -> dict[str, str]:
    """The checkout's workloads as an image records them (file name -> sha256)."""
    return {p.name: bundles.sha256_of(p) for p in sorted(workloads.iterdir())
            if p.is_file() and p.suffix in (".py", ".json")}


def missing_for(contents: dict[str, Any], engines: Sequence[str]) -> list[str]:
    """What an image lacks for runs of these engines (torch always; horovod for Horovod).

    >>> missing_for({"torch": "2.13.0", "horovod": None}, ["ddp", "horovod"])
    ['horovod']
    >>> missing_for({"torch": "2.13.0", "horovod": "0.28.1"}, ["horovod"])
    []
    """
    lacking = [] if contents.get("torch") else ["torch"]
    if "horovod" in engines and not contents.get("horovod"):
        lacking.append("horovod")
    return lacking


# ------------------------------------------------------------------ the Docker archive

def write_archive(rootfs_tar: Path, out: Path, tag: str, labels: dict[str, str],
                  created: str) -> str:
    """Write a one-layer Docker image archive (docker save's format) of a root-fs tarball.

    Returns the image id, "sha256:<hex of the configuration>", which is what `docker load`
    and `docker image inspect` report for it.
    """
    diff = bundles.sha256_of(rootfs_tar)
    config = {
        "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine,
                                                                      os.uname().machine),
        "os": "linux", "created": created,
        "config": {"Env": [f"PATH={PREFIX}/venv/bin:/usr/local/sbin:/usr/local/bin:"
                           "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONUNBUFFERED=1",
                           "LANG=C.UTF-8"],
                   "WorkingDir": PREFIX, "Cmd": [PYTHON], "Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff}"]},
        "history": [{"created": created, "created_by": "scalelab invoke image (mmdebstrap)"}],
    }
    blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    image_id = hashlib.sha256(blob).hexdigest()
    manifest = [{"Config": f"{image_id}.json", "RepoTags": [tag],
                 "Layers": [f"{diff}/layer.tar"]}]
    repo, _, version = tag.rpartition(":")
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        add_bytes(tar, f"{image_id}.json", blob)
        info = tar.gettarinfo(str(rootfs_tar), arcname=f"{diff}/layer.tar")
        info.mode, info.uid, info.gid, info.uname, info.gname = 0o644, 0, 0, "", ""
        with open(rootfs_tar, "rb") as fh:
            tar.addfile(info, fh)
        add_bytes(tar, "manifest.json", json.dumps(manifest).encode())
        add_bytes(tar, "repositories", json.dumps({repo: {version: diff}}).encode())
    return f"sha256:{image_id}"


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    import io

    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    tar.addfile(info, io.BytesIO(data))


# ------------------------------------------------------------------ build

def _mmdebstrap_argv(wheels: Path, workloads: Path, requirements: Sequence[str],
                     out: Path) -> list[str]:
    install = " ".join(f"'{r}'" for r in requirements)
    hooks = [
        f'mkdir -p "$1{PREFIX}/bench" "$1/tmp/scalelab-wheels"',
        f"copy-in {workloads} {PREFIX}/bench",
        f'cp -a {wheels}/. "$1/tmp/scalelab-wheels/"',
        f'chroot "$1" python3 -m venv {PREFIX}/venv',
        f'chroot "$1" {PYTHON} -m pip install -q --no-index --no-cache-dir --no-compile '
        f'--disable-pip-version-check --find-links /tmp/scalelab-wheels '
        f'-c /tmp/scalelab-wheels/constraints.txt {install}',
        f'rm -rf "$1/tmp/scalelab-wheels" "$1{PREFIX}/bench/workloads/__pycache__"',
        # the tarball clamps the files' times to mmdebstrap's start, which would void pip's
        # time-stamped bytecode and make every rank compile torch's ~800 modules again (2.5 s
        # instead of 1.4 s for import torch here): bytecode never checked against its source,
        # which in an image never changes
        f'chroot "$1" {PYTHON} -m compileall -q --invalidation-mode unchecked-hash '
        f'{PREFIX}/venv/lib {PREFIX}/bench/workloads || true',  # (as pip: a few test files
        # of some packages are not valid Python 3.11, and need no bytecode)
        f'chroot "$1" {PYTHON} -c "{CHECKS}" > "$1/.scalelab-contents"',
    ]
    argv = ["mmdebstrap", "--variant=minbase", "--format=tar",
            f"--include={','.join(APT_PACKAGES)}", "--aptopt=Acquire::Retries 3"]
    argv += [f"--customize-hook={h}" for h in hooks]
    return [*argv, SUITE, str(out)]


def _contents(rootfs_tar: Path) -> dict[str, Any]:
    """What the proof step inside the root file system printed (see _mmdebstrap_argv)."""
    with tarfile.open(rootfs_tar) as tar:
        member = next((m for m in tar if m.name.removeprefix("./") == ".scalelab-contents"),
                      None)
        text = tar.extractfile(member).read().decode() if member else ""
    found = parse_contents(text)
    found.pop("python")  # the record of a Debian image keeps its keys
    return found


def parse_contents(text: str) -> dict[str, Any]:
    """What the checks inside an image printed: torch (and the CUDA it was built with, None for
    a CPU build), Horovod and the Python version.

    >>> parse_contents("SCALELAB_PY 3 11\\nSCALELAB_HAS torch 2.13.0+cpu None\\nSCALELAB_HAS horovod 0.28.1 True False")
    {'torch': '2.13.0+cpu', 'horovod': '0.28.1', 'horovod_gloo': True, 'horovod_nccl': False, 'python': '3.11', 'torch_cuda': None}
    >>> parse_contents("SCALELAB_HAS torch 2.4.0a0+3bcc3cd 12.4")["torch_cuda"]
    '12.4'
    >>> parse_contents("SCALELAB_PY 3 10\\nSCALELAB_HAS torch 2.4.0a0\\nSCALELAB_HAS horovod Traceback")["horovod"] is None
    True
    """
    found: dict[str, Any] = {"torch": None, "horovod": None, "horovod_gloo": False,
                             "horovod_nccl": False, "python": None, "torch_cuda": None}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "SCALELAB_PY":
            found["python"] = f"{parts[1]}.{parts[2]}"
        for chunk in line.split("SCALELAB_HAS ")[1:]:
            bits = chunk.split()
            if len(bits) >= 2 and bits[0] == "torch" and bits[1][:1].isdigit():
                found["torch"] = bits[1]
                if len(bits) >= 3 and bits[2][:1].isdigit():
                    found["torch_cuda"] = bits[2]
            if len(bits) >= 4 and bits[0] == "horovod" and bits[1][:1].isdigit():
                found["horovod"] = bits[1]
                found["horovod_gloo"], found["horovod_nccl"] = bits[2] == "True", bits[3] == "True"
    return found


def prune(root: Path, keep: Path, newest: int = 2) -> None:
    """Keep the image just built and the newest others, up to `newest` in all: an image is
    over a GB, and a cluster's record names the archive it loaded (invoke configure --image)."""
    built = sorted((d for d in root.iterdir() if d.is_dir() and (d / META).is_file()
                    and d != keep), key=lambda d: d.stat().st_mtime, reverse=True)
    for old in built[newest - 1:]:
        shutil.rmtree(old, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What an image of these inputs holds, and where it is kept: build() and --dry-run."""

    requirements: list[str]
    local_wheels: list[Path]
    inputs: dict[str, Any]
    key: str
    dir: Path

    def describe(self) -> list[str]:
        return [f"image {REPO}:{self.key}: Debian {SUITE} ({', '.join(APT_PACKAGES)}), "
                f"{', '.join(self.requirements)} from the wheelhouse "
                f"({', '.join(w.name for w in self.local_wheels) or 'no local wheels'}), "
                "bench/workloads",
                f"archive: {self.dir / ARCHIVE}"]


def plan(wheel_dirs: Sequence[Path], constraints: Path, cache: Path | None = None) -> Plan:
    """The image these wheel directories and constraints make, changing nothing."""
    _apt, requirements = bundles.default_contents(slurm=False)
    local = packages.pick_local_wheels(wheel_dirs, packages.torch_pin(requirements, constraints))
    doc = inputs(requirements, constraints, local)
    key = key_of(doc)
    return Plan(list(requirements), list(local), doc, key, Path(cache or cache_root()) / key)


def build(*, wheel_dirs: Sequence[Path], constraints: Path,
          progress: Callable[[str], None] | None = None, force: bool = False,
          cache: Path | None = None) -> dict[str, Any]:
    """Build the training image (or find it in the cache); return its record, with "archive"."""
    say = progress or (lambda _m: None)
    if shutil.which("mmdebstrap") is None:
        raise ImageError("mmdebstrap is not installed; install it (apt-get install mmdebstrap, "
                         "as ./bootstrap.sh does) and run invoke image again")
    if os.geteuid() != 0:
        raise ImageError("invoke image builds a Debian root file system with mmdebstrap and "
                         "runs as root; run it as root (sudo invoke image)")
    planned = plan(wheel_dirs, constraints, cache)
    requirements, local, doc, key = (planned.requirements, planned.local_wheels,
                                     planned.inputs, planned.key)
    final = planned.dir
    root = final.parent
    if (final / META).is_file() and (final / ARCHIVE).is_file() and not force:
        meta = read_meta(final / ARCHIVE)
        say(f"image: {meta['tag']} {meta['id'][:19]} from the cache ({final})")
        return {**meta, "archive": str(final / ARCHIVE), "cached": True}
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.build-", dir=root))
    started = time.monotonic()
    try:
        wheels = staging / "wheels"
        wheels.mkdir()
        work = staging / "work"
        work.mkdir()
        say(f"image: wheelhouse of {len(requirements)} requirements")
        entries = bundles.build_wheels(wheels, requirements, constraints, local, None, say, work)
        shutil.copy2(constraints, wheels / "constraints.txt")
        rootfs = staging / "rootfs.tar"
        say(f"image: Debian {SUITE} root file system with mmdebstrap, then the Python stack")
        argv = _mmdebstrap_argv(wheels, WORKLOADS, requirements, rootfs)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ImageError(f"mmdebstrap did not finish in {BUILD_TIMEOUT_S:g} s") from None
        if proc.returncode != 0:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise ImageError(f"mmdebstrap failed (rc {proc.returncode}): {' | '.join(last)}")
        contents = _contents(rootfs)
        lacking = missing_for(contents, ["horovod"])
        if lacking:
            raise ImageError(f"the built image cannot import {', '.join(lacking)}; see "
                             "scripts/build_horovod.sh for Horovod's wheel")
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        tag = f"{REPO}:{key}"
        say("image: writing the Docker image archive")
        image_id = write_archive(rootfs, staging / ARCHIVE, tag,
                                 {"org.scalelab.inputs": key}, created)
        rootfs.unlink()
        shutil.rmtree(wheels)
        shutil.rmtree(work)
        meta = {"id": image_id, "tag": tag, "key": key, "created_at": created,
                "size": (staging / ARCHIVE).stat().st_size, "contents": contents,
                "wheels": [{k: e[k] for k in ("name", "version")} for e in entries],
                "suite": SUITE, "build_s": round(time.monotonic() - started, 1),
                "workloads": doc["workloads"]}
        (staging / META).write_text(json.dumps(meta, indent=2) + "\n")
        os.chmod(staging, 0o755)
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging, final)
        prune(root, keep=final)
        say(f"image: {tag} {image_id[:19]} built in {meta['build_s']:.0f} s")
        return {**meta, "archive": str(final / ARCHIVE), "cached": False}
    finally:
        if staging.exists():
            shutil.rmtree(staging)
