"""The training image on a vendor's base: `invoke image --base REF`.

A vendor's image (NGC's PyTorch, a site's own) is kept as it is, and one layer of scalelab's
goes on top: /opt/scalelab/venv, a venv over the base's own Python that sees its packages
(--system-site-packages: the vendor's torch, CUDA and NCCL are used as built), Horovod from the
wheelhouse where the base lacks it and the wheel fits (the same torch release and Python), and
the workloads. The base's layers go into the archive unchanged; the record says what the image
holds (proved inside it) and what it lacks, and the cache key includes the base's configuration.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scalelab.cluster import bundle as bundles
from scalelab.cluster import packages
from scalelab.cluster.image import (
    ARCHIVE,
    BUILD_TIMEOUT_S,
    CHECKS,
    META,
    PREFIX,
    PYTHON,
    REPO,
    WORKLOADS,
    ImageError,
    add_bytes,
    cache_root,
    key_of,
    parse_contents,
    prune,
    read_meta,
    workloads_now,
)
from scalelab.cluster.layers import is_dir, remove, unpack_layers
from scalelab.core.errors import ScalelabError

log = logging.getLogger(__name__)

ARCHIVE_PREFIX = "docker-archive:"
BASE_FORMAT = 1


def base_archive(ref: str, work: Path) -> Path:
    """The docker-save archive of a base: docker-archive:PATH as given, or a tag that a
    Docker engine on this controller holds (docker image save). ImageError with the fix."""
    if ref.startswith(ARCHIVE_PREFIX):
        path = Path(ref[len(ARCHIVE_PREFIX):]).expanduser()
        if not path.is_file():
            raise ImageError(f"--base {ref}: {path} does not exist; give the archive docker "
                             "save wrote, e.g. docker save -o base.tar nvcr.io/nvidia/pytorch:TAG")
        return path
    docker = shutil.which("docker")
    if docker is None or not Path("/var/run/docker.sock").exists():
        raise ImageError(f"--base {ref}: no Docker engine on this controller to take it from; "
                         f"run docker pull {ref} and docker save -o base.tar {ref} where a "
                         "registry is reachable, then give --base docker-archive:base.tar")
    out = work / "base.tar"
    proc = subprocess.run([docker, "image", "save", "-o", str(out), ref], capture_output=True,
                          text=True, timeout=BUILD_TIMEOUT_S)
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise ImageError(f"--base {ref}: docker image save failed ({' '.join(last)}); docker "
                         f"pull {ref} first, or give --base docker-archive:PATH")
    return out


def archive_parts(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest entry, image configuration) of a docker-save archive holding one image."""
    try:
        with tarfile.open(path) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))
            if not isinstance(manifest, list) or len(manifest) != 1:
                raise ImageError(f"{path} holds {len(manifest)} images; save exactly one")
            entry = manifest[0]
            config = json.load(tar.extractfile(entry["Config"]))
    except (tarfile.TarError, KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ImageError(f"{path} is not an image archive of docker save ({exc}); give "
                         "docker-archive:PATH of one") from None
    return entry, config


def _real_dir(root: Path, rel: str, ref: str, make: bool = False) -> Path:
    """root/rel, where the controller is about to write or read as root, when each component
    below root is a directory and none a link (the base, or its code that ran, may have put a
    link there, which the controller would follow out of the tree); ImageError otherwise.
    Missing directories are made when make, owned by BUILD_UID."""
    here = root
    for part in [p for p in rel.split("/") if p]:
        if part in (".", ".."):  # a name the base's code printed (its Python's version, say)
            raise ImageError(f"--base {ref}: /{rel.strip('/')} is no path inside the image")
        here = here / part
        if not os.path.lexists(here) and make:
            here.mkdir(0o755)
            os.lchown(here, BUILD_UID, BUILD_UID)
        if not is_dir(here):
            what = "a link" if here.is_symlink() else "missing" if not os.path.lexists(
                here) else "a file"
            raise ImageError(f"--base {ref}: /{here.relative_to(root)} in the base is {what}, "
                             f"not a directory; scalelab's layer goes into {PREFIX}, which "
                             "must be a plain directory of the image (a base whose code makes "
                             "it a link is refused)")
    return here


# The uid and gid that own the unpacked base and run its code on the controller: no user of
# the controller has it, so that code owns its tree and nothing else. Below 2^31 (tools that
# read ids as signed), above the ranges distributions hand out, subuid ranges included.
BUILD_UID = 2_147_000_000


def in_root(root: Path, script: str, path_env: str, timeout: float = 600.0
            ) -> subprocess.CompletedProcess:
    """Run a shell script inside an unpacked root file system, as BUILD_UID with no
    capability (an empty bounding set, no new privileges: set-user-id files and file
    capabilities give it none), chrooted, in mount, pid, network, IPC and UTS namespaces of its
    own (proc and the few device files Python reads; gone with them). It cannot chroot out
    (no CAP_SYS_CHROOT), mount, make device nodes, write a sysctl or a file of the
    controller's, reach a host process or the network; it owns its tree and nothing else."""
    import shlex

    for d, mode in (("proc", 0o555), ("dev", 0o755), ("tmp", 0o1777)):
        if not is_dir(root / d):  # a link there would be followed by the mounts below
            remove(root / d)
            (root / d).mkdir()
            os.chmod(root / d, mode)
            os.lchown(root / d, BUILD_UID, BUILD_UID)
    r = shlex.quote(str(root))
    devs = " ".join(f"touch {r}/dev/{d} && mount --bind /dev/{d} {r}/dev/{d} &&"
                    for d in ("null", "zero", "random", "urandom"))
    ids = f"{BUILD_UID}:{BUILD_UID}"
    # setpriv leaves chroot only what chroot needs to enter the root and become BUILD_UID;
    # becoming it clears even those, and no-new-privs keeps them cleared across exec
    drop = ("setpriv --no-new-privs --inh-caps=-all "
            "--bounding-set=-all,+sys_chroot,+setuid,+setgid "
            f"chroot --userspec={ids} --groups={BUILD_UID} {r}")
    line = (f"mount -t proc -o nosuid,nodev,noexec proc {r}/proc && "
            f"mount -t tmpfs -o mode=755,nosuid none {r}/dev && {devs} "
            f"exec {drop} /usr/bin/env -i PATH={shlex.quote(path_env)} HOME=/root USER=root "
            f"LOGNAME=root LANG=C.UTF-8 /bin/sh -c {shlex.quote(script)}")
    try:
        # its own mount, pid, IPC, UTS and (empty) network namespaces: the base's code sees no
        # host process and reaches no network, and dies with unshare
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "--pid",
                               "--net", "--ipc", "--uts", "--fork", "--kill-child", "sh", "-c",
                               line], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ImageError(f"a step inside the base did not finish in {timeout:g} s") from None


def _check(rootfs: Path, path_env: str) -> dict[str, Any]:
    """What the image's venv holds, proved inside it (image.CHECKS)."""
    return parse_contents(in_root(rootfs, f'{PYTHON} -c "{CHECKS}" 2>&1 || true', path_env).stdout)


def _env_path(config: dict[str, Any]) -> str:
    for item in (config.get("config") or {}).get("Env") or []:
        if item.startswith("PATH="):
            return item[5:]
    return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _horovod_fits(found: dict[str, Any], wheel: Path | None) -> str:
    """Why the wheelhouse's Horovod cannot go into this base ("" when it can).

    >>> w = Path("/c/horovod-0.28.1_torch-2.13.0+cpu_cp311/horovod-0.28.1-cp311-cp311-linux_x86_64.whl")
    >>> _horovod_fits({"torch": "2.13.0+cpu", "python": "3.11"}, w)
    ''
    >>> print(_horovod_fits({"torch": "2.4.0a0+3bcc3cd", "python": "3.10"}, w))
    its Horovod wheel is built for torch 2.13.0 and Python 3.11, the base has torch 2.4.0a0 and Python 3.10: build Horovod inside the base (HOROVOD_GPU_OPERATIONS=NCCL pip install horovod) or use DDP

    A base whose torch has CUDA takes only a wheel built with NCCL operations (build_horovod.sh
    marks its cache key _nccl): without them Horovod reduces GPU tensors through host memory.

    >>> print(_horovod_fits({"torch": "2.13.0+cu128", "python": "3.11", "torch_cuda": "12.8"}, w))
    its Horovod wheel was built without NCCL operations and the base's torch has CUDA 12.8: build Horovod with them inside the base (HOROVOD_GPU_OPERATIONS=NCCL pip install horovod, or scripts/build_horovod.sh) or use DDP
    >>> _horovod_fits({"torch": "2.13.0+cu128", "python": "3.11", "torch_cuda": "12.8"},
    ...               Path("/c/horovod-0.28.1_torch-2.13.0+cu128_cp311_nccl_cc90/horovod-0.28.1-cp311-cp311-linux_x86_64.whl"))
    ''
    """
    if wheel is None:
        return "there is no Horovod wheel (scripts/build_horovod.sh builds one)"
    import re

    m = re.search(r"_torch-([^_+]+)(?:\+[^_]*)?_", wheel.parent.name)
    want_torch = m[1] if m else None  # a wheel outside build_horovod.sh's cache: not known
    tag = re.search(r"-cp(\d)(\d+)-", wheel.name)
    want_py = f"{tag[1]}.{tag[2]}" if tag else "?"
    have_torch = (found.get("torch") or "none").split("+")[0]
    if have_torch == (want_torch or have_torch) and found.get("python") == want_py:
        if found.get("torch_cuda") and "_nccl" not in wheel.parent.name:
            return (f"its Horovod wheel was built without NCCL operations and the base's torch "
                    f"has CUDA {found['torch_cuda']}: build Horovod with them inside the base "
                    "(HOROVOD_GPU_OPERATIONS=NCCL pip install horovod, or "
                    "scripts/build_horovod.sh) or use DDP")
        return ""
    return (f"its Horovod wheel is built for torch {want_torch} and Python {want_py}, the base "
            f"has torch {have_torch} and Python {found.get('python')}: build Horovod inside the "
            "base (HOROVOD_GPU_OPERATIONS=NCCL pip install horovod) or use DDP")


def base_plan(ref: str, wheel_dirs: Sequence[Path], constraints: Path,
              archive: Path) -> dict[str, Any]:
    """The inputs of an image on a base (hashed into its key)."""
    entry, config = archive_parts(archive)
    blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    # every wheel that could go in (which Horovod wheel does depends on the base's torch) and
    # the constraints its dependencies are resolved under
    wheels = sorted(w for d in wheel_dirs if Path(d).is_dir() for w in Path(d).rglob("*.whl"))
    return {"format": BASE_FORMAT, "base": ref, "base_config": hashlib.sha256(blob).hexdigest(),
            "wheels": {str(w): bundles.sha256_of(w) for w in wheels},
            "constraints": constraints.read_text() if constraints.is_file() else "",
            "workloads": workloads_now()}


def build_on_base(ref: str, *, wheel_dirs: Sequence[Path], constraints: Path,
                  progress: Callable[[str], None] | None = None, force: bool = False,
                  cache: Path | None = None) -> dict[str, Any]:
    """The training image on a vendor's base (see above); its record, with "archive"."""
    say = progress or (lambda _m: None)
    if os.geteuid() != 0:
        raise ImageError("invoke image --base unpacks the base as root and runs its Python in "
                         "namespaces of its own as a uid with no privileges, which needs root to "
                         "set up; run it as root (sudo invoke image)")
    missing = [t for t in ("unshare", "setpriv", "chroot") if shutil.which(t) is None]
    if missing:
        raise ImageError(f"invoke image --base runs the base's Python without privileges, with "
                         f"{' and '.join(missing)}, which this controller lacks; install them "
                         "(apt-get install util-linux coreutils)")
    root_dir = Path(cache or cache_root())
    root_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".base.build-", dir=root_dir))
    started = time.monotonic()
    try:
        base = base_archive(ref, staging)
        doc = base_plan(ref, wheel_dirs, constraints, base)
        key = key_of(doc)
        final = root_dir / key
        if (final / META).is_file() and (final / ARCHIVE).is_file() and not force:
            meta = read_meta(final / ARCHIVE)
            say(f"image: {meta['tag']} {meta['id'][:19]} from the cache ({final})")
            return {**meta, "archive": str(final / ARCHIVE), "cached": True}
        entry, config = archive_parts(base)
        rootfs = staging / "root"
        rootfs.mkdir()
        say(f"image: unpacking the base's {len(entry['Layers'])} layers")
        unpack_layers(base, entry["Layers"], rootfs, base=ref, owner=BUILD_UID)
        _real_dir(rootfs, PREFIX, ref, make=True)  # where the base's code makes the venv
        path_env = f"{PREFIX}/venv/bin:{_env_path(config)}"
        made = in_root(rootfs, f"python3 -m venv --without-pip --system-site-packages "
                               f"{PREFIX}/venv && {PYTHON} -c 'import sys'", path_env)
        if made.returncode != 0:
            raise ImageError(f"--base {ref}: its python3 cannot make a virtual environment "
                             f"({(made.stderr or made.stdout).strip().splitlines()[-1:]})")
        found = _check(rootfs, path_env)
        if not found["torch"]:
            raise ImageError(f"--base {ref}: its python3 cannot import torch; pick a base that "
                             "holds PyTorch (e.g. nvcr.io/nvidia/pytorch), or build without "
                             "--base")
        found, notes = _horovod_into_base(rootfs, found, wheel_dirs, constraints, staging,
                                          path_env, say, ref)
        # the base's code has run: what it left at these paths is looked at, never followed
        prefix = _real_dir(rootfs, PREFIX, ref)
        remove(prefix / "bench")
        shutil.copytree(WORKLOADS, prefix / "bench" / "workloads",
                        ignore=shutil.ignore_patterns("__pycache__"))
        layer = staging / "layer.tar"
        with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(prefix, arcname=PREFIX.lstrip("/"), filter=_root_owned)
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        tag = f"{REPO}:{key}"
        say("image: writing the Docker image archive (the base's layers and scalelab's)")
        (staging / "out").mkdir()
        image_id = _write_on_base(base, entry, config, layer, staging / "out" / ARCHIVE, tag,
                                  {"org.scalelab.inputs": key, "org.scalelab.base": ref},
                                  created, path_env)
        contents = {k: found[k] for k in ("torch", "horovod", "horovod_gloo", "horovod_nccl")}
        meta = {"id": image_id, "tag": tag, "key": key, "created_at": created,
                "size": (staging / "out" / ARCHIVE).stat().st_size, "contents": contents,
                "base": {"ref": ref, "config": doc["base_config"], "python": found["python"]},
                "notes": notes, "build_s": round(time.monotonic() - started, 1),
                "workloads": doc["workloads"]}
        (staging / "out" / META).write_text(json.dumps(meta, indent=2) + "\n")
        os.chmod(staging / "out", 0o755)
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging / "out", final)
        prune(root_dir, keep=final)
        for n in notes:
            say(f"image: {n}")
        say(f"image: {tag} {image_id[:19]} on {ref}, built in {meta['build_s']:.0f} s")
        return {**meta, "archive": str(final / ARCHIVE), "cached": False}
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _horovod_into_base(rootfs: Path, found: dict[str, Any], wheel_dirs: Sequence[Path],
                       constraints: Path, staging: Path, path_env: str,
                       say: Callable[[str], None], ref: str
                       ) -> tuple[dict[str, Any], list[str]]:
    """Horovod into a base that lacks it, from a local wheel built for the base's torch; what
    the base then holds, and a note where Horovod could not go in (and why)."""
    notes: list[str] = []
    if found["horovod"]:
        return found, notes
    try:
        wheel = next((w for w in packages.pick_local_wheels(
            wheel_dirs, found["torch"].split("+")[0]) if w.name.startswith("horovod-")), None)
        why = _horovod_fits(found, wheel)
    except ScalelabError as exc:  # e.g. several Horovod wheels, none for this torch
        why = str(exc)
    if why:
        notes.append(f"no Horovod: {why}")
        return found, notes
    say(f"image: Horovod from {wheel.name} into the base's torch {found['torch']}")
    _install_horovod(rootfs, wheel, constraints, staging, found["python"], say, ref)
    found = _check(rootfs, path_env)
    if not found["horovod"]:
        notes.append(f"no Horovod: {wheel.name} went in but does not import with the base's "
                     f"torch {found['torch']}")
    return found, notes


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _install_horovod(rootfs: Path, wheel: Path, constraints: Path, staging: Path,
                     python: str, say: Callable[[str], None], ref: str) -> None:
    """Horovod and what it needs into the base's venv, from a wheelhouse (no index inside)."""
    wheels = staging / "hvd-wheels"
    wheels.mkdir()
    work = staging / "hvd-work"
    work.mkdir()
    # for the base's Python, whatever the controller's is
    tags = ["--python-version", python, "--implementation", "cp", "--only-binary=:all:"]
    bundles.build_wheels(wheels, ["horovod"], constraints, [wheel], None, say, work,
                         pip_args=tags)
    # made by the base's code: a link on the way would take pip's files out of the tree
    site = _real_dir(rootfs, f"{PREFIX}/venv/lib/python{python}/site-packages", ref)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                           "--no-compile", "--disable-pip-version-check", *tags, "--find-links",
                           str(wheels), "--target", str(site), "horovod"],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise ImageError(f"installing Horovod into the base failed: "
                         f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")


def _write_on_base(base: Path, entry: dict[str, Any], config: dict[str, Any], layer: Path,
                   out: Path, tag: str, labels: dict[str, str], created: str,
                   path_env: str) -> str:
    """A docker-save archive: the base's layers as they are, then one layer of scalelab's."""
    diff = bundles.sha256_of(layer)
    conf = json.loads(json.dumps(config))
    inner = conf.setdefault("config", {})
    env = [e for e in inner.get("Env") or [] if not e.startswith(("PATH=", "PYTHONUNBUFFERED="))]
    inner["Env"] = [f"PATH={path_env}", "PYTHONUNBUFFERED=1", *env]
    inner["Labels"] = {**(inner.get("Labels") or {}), **labels}
    conf["created"] = created
    conf.setdefault("rootfs", {"type": "layers", "diff_ids": []})["diff_ids"].append(
        f"sha256:{diff}")
    conf.setdefault("history", []).append({"created": created,
                                           "created_by": "scalelab invoke image --base"})
    blob = json.dumps(conf, sort_keys=True, separators=(",", ":")).encode()
    image_id = hashlib.sha256(blob).hexdigest()
    layers = [*entry["Layers"], f"{diff}/layer.tar"]
    repo, _, version = tag.rpartition(":")
    with tarfile.open(base) as src, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        add_bytes(tar, f"{image_id}.json", blob)
        for name in entry["Layers"]:
            member = src.getmember(name)
            if member.issym() or member.islnk():  # OCI layouts link to blobs
                member = src.getmember(os.path.normpath(os.path.join(
                    os.path.dirname(name), member.linkname)) if member.issym()
                    else member.linkname)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = member.size, 0o644, member.mtime
            tar.addfile(info, src.extractfile(member))
        info = tar.gettarinfo(str(layer), arcname=f"{diff}/layer.tar")
        info.mode, info.uid, info.gid, info.uname, info.gname = 0o644, 0, 0, "", ""
        with open(layer, "rb") as fh:
            tar.addfile(info, fh)
        add_bytes(tar, "manifest.json", json.dumps(
            [{"Config": f"{image_id}.json", "RepoTags": [tag], "Layers": layers}]).encode())
        add_bytes(tar, "repositories", json.dumps({repo: {version: diff}}).encode())
    return f"sha256:{image_id}"
