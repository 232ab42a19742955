"""The offline bundle: what the roles install, prepared on the controller for nodes that cannot
reach a package index.

A bundle is a directory::

    debs/           the apt packages the roles install AND their dependency closure, as a flat
                    repository (debs/Packages), so `deb [trusted=yes] file:<dir>/debs ./` works
    wheels/         the Python requirements and their dependencies as wheels, plus wheels
                    scalelab built itself (Horovod from scripts/build_horovod.sh)
    manifest.json   what is in it: debs and wheels (name, version, file, size, sha256), the
                    Python tag, distribution and architecture it was built for, created_at

build() fetches with the controller's own package clients (`apt-get download`, `pip
download`), as they are configured, and proves the wheels install offline before the bundle
is published (an offline pip resolution against wheels/ only). check() is the pure file check
the configure wrapper runs before Ansible, so a bad bundle touches no host.

What goes in by default is read from the roles' defaults (default_contents), so the bundle and
the roles cannot drift apart.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import yaml

from scalelab.cluster.packages import (
    BundleError,
    canonical_name,
    packages_stanza,
    parse_depends_closure,
    parse_requirement,
    parse_stanzas,
    pick_local_wheels,
    release_file,
    satisfies,
    torch_pin,
)
from scalelab.core import sh
from scalelab.core.errors import CommandError
from scalelab.core.state import PROJECT_ROOT

log = logging.getLogger(__name__)

ROLES_DIR = PROJECT_ROOT / "playbooks" / "roles"
MANIFEST = "manifest.json"
FORMAT = 1
# closure over what must be installed: no recommends/suggests, no negative relations
APT_DEPENDS_FLAGS = ("--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
                     "--no-breaks", "--no-replaces", "--no-enhances")
APT_TIMEOUT_S = 1800.0
PIP_TIMEOUT_S = 3600.0
REBUILD = "rebuild it with invoke bundle"
# how to get a wheel no index has: scalelab builds it
_WHEEL_HINTS = {"horovod": " (after scripts/build_horovod.sh has built its wheel)"}
_HASH_CHUNK = 1 << 20


# ------------------------------------------------------------------ what goes in

def _role_defaults(roles_dir: Path, role: str) -> dict[str, Any]:
    path = roles_dir / role / "defaults" / "main.yml"
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise BundleError(f"cannot read the defaults of role {role} ({path}): {exc}") from None
    return data


def _literal(value: Any, where: str) -> Any:
    """A default the bundle can use as is: not a Jinja expression only Ansible can evaluate."""
    text = json.dumps(value)
    if "{{" in text or "{%" in text:
        raise BundleError(f"{where} is a Jinja expression ({value!r}); the bundle needs a "
                          "literal value in the role's defaults")
    return value


def default_contents(roles_dir: Path = ROLES_DIR,
                     slurm: bool = True) -> tuple[list[str], list[str]]:
    """(apt package names, Python requirements) the roles install, from their defaults/main.yml.

    apt: common_packages, common_chrony_packages (real hosts run time sync), then
    pytorch_packages, then (slurm=True) slurm_controller_packages, slurm_compute_packages and
    slurm_oci_packages
    (for invoke configure --tags slurm on hosts without internet). Python: torch==pytorch_torch_version, pytorch_extra_packages,
    horovod==horovod_version. Not horovod_packages: that is the compile toolchain, and with a
    bundle the nodes install the prebuilt wheel (Gloo, no MPI).
    """
    common = _role_defaults(roles_dir, "common")
    pytorch = _role_defaults(roles_dir, "pytorch")
    horovod = _role_defaults(roles_dir, "horovod")
    slurm_defaults = _role_defaults(roles_dir, "slurm") \
        if slurm and (roles_dir / "slurm").is_dir() else {}
    apt: list[str] = []
    for role, key, data in (("common", "common_packages", common),
                            ("common", "common_chrony_packages", common),
                            ("pytorch", "pytorch_packages", pytorch),
                            ("slurm", "slurm_controller_packages", slurm_defaults),
                            ("slurm", "slurm_compute_packages", slurm_defaults),
                            ("slurm", "slurm_oci_packages", slurm_defaults)):
        for name in _literal(data.get(key) or [], f"{role} default {key}"):
            if str(name) not in apt:
                apt.append(str(name))
    torch = _literal(pytorch.get("pytorch_torch_version"), "pytorch default pytorch_torch_version")
    version = _literal(horovod.get("horovod_version"), "horovod default horovod_version")
    if not torch or not version:
        raise BundleError(f"the pytorch and horovod defaults under {roles_dir} must set "
                          "pytorch_torch_version and horovod_version")
    extras = _literal(pytorch.get("pytorch_extra_packages") or [],
                      "pytorch default pytorch_extra_packages")
    requirements = [f"torch=={torch}", *[str(p) for p in extras], f"horovod=={version}"]
    return apt, requirements


# ------------------------------------------------------------------ pure helpers


def manifest_problem(manifest: Any) -> str:
    """Why a parsed manifest is not one this module wrote ("" if it is).

    >>> manifest_problem({"format": 1, "debs": [], "wheels": []})
    ''
    >>> manifest_problem([])
    'not a JSON object'
    """
    if not isinstance(manifest, dict):
        return "not a JSON object"
    if manifest.get("format") != FORMAT:
        return f"format {manifest.get('format')!r}, expected {FORMAT}"
    for key, fields in (("debs", ("name", "version", "file")),
                        ("wheels", ("name", "version", "file"))):
        items = manifest.get(key)
        if not isinstance(items, list) or not all(
                isinstance(i, dict) and all(isinstance(i.get(f), str) for f in fields)
                for i in items):
            return f"'{key}' is not a list of entries with {', '.join(fields)}"
    return ""


# ------------------------------------------------------------------ small file helpers

def _hashes(path: Path) -> tuple[str, str]:
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_HASH_CHUNK), b""):
            md5.update(chunk)
            sha.update(chunk)
    return md5.hexdigest(), sha.hexdigest()


def sha256_of(path: Path) -> str:
    """A file's sha256 (hex), read in chunks: the bundle's manifest and the image's id."""
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_HASH_CHUNK), b""):
            sha.update(chunk)
    return sha.hexdigest()


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard link (same inode, nothing copied) where possible, else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def read_manifest(bundle_dir: Path) -> dict[str, Any]:
    """The bundle's manifest; BundleError (one line, with the fix) if missing or garbled."""
    path = Path(bundle_dir) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BundleError(f"bundle {bundle_dir} has no {MANIFEST}; build it with invoke "
                          "bundle") from None
    except (OSError, ValueError) as exc:
        raise BundleError(f"bundle {bundle_dir}: {MANIFEST} is unreadable "
                          f"({str(exc).splitlines()[0]}); {REBUILD}") from None
    problem = manifest_problem(data)
    if problem:
        raise BundleError(f"bundle {bundle_dir}: {MANIFEST} is not a bundle manifest "
                          f"({problem}); {REBUILD}")
    return data


def _try_manifest(bundle_dir: Path) -> dict[str, Any] | None:
    try:
        return read_manifest(bundle_dir)
    except BundleError:
        return None


# ------------------------------------------------------------------ check

def check(bundle_dir: Path, apt_packages: Sequence[str], requirements: Sequence[str]) -> dict:
    """Whether a bundle has a deb for every apt package and a wheel for every requirement.

    Pure file checks: the manifest, and that each entry's file is there at its recorded size.
    Raises BundleError with one line naming the first thing missing and the fix; returns the
    manifest.
    """
    bundle_dir = Path(bundle_dir)
    if not bundle_dir.is_dir():
        raise BundleError(f"bundle {bundle_dir} is not a directory; build it with invoke bundle")
    manifest = read_manifest(bundle_dir)

    def present(sub: str, entry: Mapping[str, Any]) -> bool:
        path = bundle_dir / sub / entry["file"]
        return path.is_file() and ("size" not in entry or path.stat().st_size == entry["size"])

    if apt_packages and not (bundle_dir / "debs" / "Packages").is_file():
        raise BundleError(f"bundle {bundle_dir} lacks its apt index debs/Packages; {REBUILD}")
    debs = {d["name"].split(":")[0]: d for d in manifest["debs"]}
    for name in apt_packages:
        entry = debs.get(name.split(":")[0])
        if entry is None or not present("debs", entry):
            raise BundleError(f"bundle {bundle_dir} lacks a deb for {name}; {REBUILD}")
    wheels: dict[str, list[Mapping[str, Any]]] = {}
    for w in manifest["wheels"]:
        wheels.setdefault(canonical_name(w["name"]), []).append(w)
    for req in requirements:
        name, spec = parse_requirement(req)
        if not any(satisfies(w["version"], spec) and present("wheels", w)
                   for w in wheels.get(name, [])):
            raise BundleError(f"bundle {bundle_dir} lacks a wheel for {req.strip()}; {REBUILD}"
                              f"{_WHEEL_HINTS.get(name, '')}")
    log.debug("bundle %s has %d debs and %d wheels for %d apt packages and %d requirements",
              bundle_dir, len(manifest["debs"]), len(manifest["wheels"]), len(apt_packages),
              len(requirements))
    return manifest


# ------------------------------------------------------------------ build: apt side

def _apt_candidates(names: Sequence[str]) -> dict[str, dict[str, str]]:
    """name -> the candidate's apt-cache show paragraph (Version, Architecture, SHA256...)."""
    if not names:
        return {}
    proc = sh.run(["apt-cache", "show", "--no-all-versions", *names], check=False,
                  timeout=300)
    if proc.returncode not in (0, 100):  # 100: none of the names has a candidate
        raise BundleError(f"apt-cache show failed (rc {proc.returncode}): "
                          f"{_last_line(proc.stderr)}", stderr=proc.stderr)
    out: dict[str, dict[str, str]] = {}
    for stanza in parse_stanzas(proc.stdout):
        name = stanza.get("Package", "")
        if name and name not in out:
            out[name] = stanza
    return out


def _last_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _deb_fields(path: Path) -> str:
    try:
        return sh.run(["dpkg-deb", "--field", str(path)], timeout=60).stdout
    except CommandError as exc:
        raise BundleError(f"{path.name} is not a readable deb: {exc}", stderr=exc.stderr) from None


def _build_debs(debs: Path, apt_packages: Sequence[str], old_dir: Path | None,
                old: Mapping[str, Any] | None, say: Callable[[str], None]) -> list[dict]:
    """Fill debs/ with the packages' closure and write its Packages index."""
    if not apt_packages:
        _write_index(debs, "")
        return []
    say(f"debs: resolving the dependency closure of {len(apt_packages)} apt packages")
    proc = sh.run(["apt-cache", "depends", *APT_DEPENDS_FLAGS, *apt_packages], check=False,
                  timeout=300)
    closure = parse_depends_closure(proc.stdout)
    candidates = _apt_candidates(closure)
    missing = [p for p in apt_packages if p.split(":")[0] not in candidates]
    if missing:
        raise BundleError(f"apt has no installable package {missing[0]} on this controller; "
                          "check the name, or run apt-get update", stderr=proc.stderr)
    unfetchable = [n for n, s in candidates.items() if not s.get("Filename")]
    if unfetchable:
        raise BundleError(f"apt knows no archive that serves {unfetchable[0]} "
                          f"{candidates[unfetchable[0]].get('Version')}; run apt-get update")

    reusable: dict[tuple[str, str, str], dict[str, Any]] = {}
    if old and old_dir is not None:
        for d in old.get("debs", []):
            reusable[(d["name"], d["version"], d.get("architecture", ""))] = d
    fetch: list[str] = []
    reused = 0
    for name, s in sorted(candidates.items()):
        prev = reusable.get((name, s.get("Version", ""), s.get("Architecture", "")))
        src = old_dir / prev["file"] if prev and old_dir is not None else None
        if prev and src is not None and src.is_file() and prev.get("sha256") == s.get("SHA256"):
            _link_or_copy(src, debs / prev["file"])
            reused += 1
        else:
            fetch.append(f"{name}={s['Version']}")
    say(f"debs: {len(candidates)} in the closure, {reused} kept from the previous bundle, "
        f"{len(fetch)} to download")
    if fetch:
        log.info("apt-get download %d packages into %s", len(fetch), debs)
        proc = subprocess.run(["apt-get", "download", "-q", *fetch], cwd=debs,
                              capture_output=True, text=True, timeout=APT_TIMEOUT_S)
        if proc.returncode != 0:
            raise BundleError(f"apt-get download failed (rc {proc.returncode}): "
                              f"{_last_line(proc.stderr)}", stderr=proc.stderr)

    entries: list[dict] = []
    paragraphs: list[str] = []
    for path in sorted(debs.glob("*.deb")):
        control = _deb_fields(path)
        fields = parse_stanzas(control)[0]
        name, version = fields.get("Package", ""), fields.get("Version", "")
        md5, sha = _hashes(path)
        want = candidates.get(name)
        if want is None or want.get("Version") != version:
            raise BundleError(f"{path.name} is not a candidate apt chose ({name} {version})")
        if want.get("SHA256") and want["SHA256"] != sha:
            raise BundleError(f"{path.name}: SHA256 differs from apt's index; download it again")
        size = path.stat().st_size
        entries.append({"name": name, "version": version,
                        "architecture": fields.get("Architecture", ""), "file": path.name,
                        "size": size, "sha256": sha})
        paragraphs.append(packages_stanza(control, path.name, size, md5, sha))
    got = {e["name"] for e in entries}
    lost = sorted(set(candidates) - got)
    if lost:
        raise BundleError(f"apt-get download did not fetch {lost[0]}; run apt-get update")
    _write_index(debs, "\n".join(paragraphs))
    return entries


def _write_index(debs: Path, packages: str) -> None:
    data = packages.encode()
    (debs / "Packages").write_bytes(data)
    (debs / "Release").write_text(release_file(data, email.utils.formatdate(usegmt=True)))


# ------------------------------------------------------------------ build: pip side

def _pip_env(isolated: bool) -> dict[str, str]:
    """pip as configured (download), or pip that sees nothing but the arguments (offline
    proof): no config files, no PIP_* overrides, as on the nodes."""
    env = dict(os.environ)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    if isolated:
        env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _pip(args: Sequence[str], *, isolated: bool, timeout: float) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", *args]
    log.debug("run: %s", " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=_pip_env(isolated))
    except subprocess.TimeoutExpired:
        raise BundleError(f"pip {args[0]} did not finish in {timeout:g} s") from None
    if proc.returncode != 0:
        raise BundleError(f"pip {args[0]} failed (rc {proc.returncode}): "
                          f"{_last_line(proc.stderr or proc.stdout)}",
                          stderr=proc.stderr)
    return proc


def build_wheels(wheels: Path, requirements: Sequence[str], constraints: Path | None,
                  local: Sequence[Path], old_dir: Path | None,
                  say: Callable[[str], None], work: Path,
                  pip_args: Sequence[str] = ()) -> list[dict]:
    """Fill wheels/ with the requirements' wheels and their dependencies, nothing else."""
    if not requirements:
        return []
    if old_dir is not None and old_dir.is_dir():
        for whl in old_dir.glob("*.whl"):
            _link_or_copy(whl, wheels / whl.name)
    for whl in local:
        if not (wheels / whl.name).exists():
            _link_or_copy(whl, wheels / whl.name)
    before = {p.name: p.stat().st_ino for p in wheels.glob("*.whl")}
    cons = ["-c", str(constraints)] if constraints is not None else []
    say(f"wheels: pip download of {len(requirements)} requirements and their dependencies")
    # --find-links wheels/: what the previous bundle and scalelab's own builds hold counts as
    # already downloaded; pip fetches only what is not there yet
    _pip(["download", "--only-binary=:all:", "--dest", str(wheels), "--find-links", str(wheels),
          "--progress-bar", "off", *pip_args, *cons, *requirements], isolated=False,
         timeout=PIP_TIMEOUT_S)
    fetched = [n for n in (p.name for p in wheels.glob("*.whl")) if n not in before]
    say(f"wheels: {len(fetched)} downloaded")

    # the proof: resolve again from wheels/ alone, no index, no pip config (as the nodes
    # will); whatever that resolution does not use is dropped
    report = work / "pip-report.json"
    _pip(["install", "--dry-run", "--ignore-installed", "--no-index", "--find-links",
          str(wheels), "--only-binary=:all:", "--report", str(report), "-q", *cons,
          *requirements], isolated=True, timeout=600)
    items = json.loads(report.read_text()).get("install", [])
    keep: dict[str, dict[str, str]] = {}
    for item in items:
        url = (item.get("download_info") or {}).get("url", "")
        parsed = urlparse(url)
        path = Path(unquote(parsed.path))
        if parsed.scheme != "file" or path.parent != wheels:
            raise BundleError(f"offline resolution used {url}, not a wheel of the bundle")
        meta = item.get("metadata") or {}
        keep[path.name] = {"name": canonical_name(meta.get("name", "")),
                           "version": str(meta.get("version", ""))}
    for path in wheels.glob("*.whl"):
        if path.name not in keep:
            path.unlink()
    entries = []
    for filename, meta in sorted(keep.items()):
        path = wheels / filename
        entries.append({**meta, "file": filename, "size": path.stat().st_size,
                        "sha256": sha256_of(path)})
    return entries


# ------------------------------------------------------------------ build

def _os_release() -> dict[str, str]:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip('"')
    return out


def _dpkg_architecture() -> str:
    try:
        return sh.run(["dpkg", "--print-architecture"], timeout=30).stdout.strip()
    except CommandError as exc:
        raise BundleError(f"dpkg --print-architecture failed: {exc}; bundles are built on a "
                          "Debian or Ubuntu controller", stderr=exc.stderr) from None


def _comparable(manifest: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if manifest is None else {k: v for k, v in manifest.items() if k != "created_at"}


def build(out_dir: Path, *, apt_packages: Sequence[str], requirements: Sequence[str],
          constraints: Path | None, wheel_dirs: Sequence[Path] = (),
          progress: Callable[[str], None] | None = None,
          pip_args: Sequence[str] = ()) -> dict:
    """Build (or bring up to date) the bundle in out_dir; return its manifest.

    debs/: apt_packages and their dependency closure (`apt-cache depends --recurse`, no
    recommends), fetched with `apt-get download`, and a flat-repository Packages index.
    wheels/: `pip download --only-binary=:all:` of the requirements under the constraints
    file, with the wheels found in wheel_dirs (e.g. scalelab's Horovod build) on offer; then an
    offline resolution from wheels/ alone proves they install without an index. pip_args go
    to pip download only, e.g. ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    where no CPU build of torch is on offer otherwise.

    Idempotent: files of the previous bundle are reused (hard links), so a second build with
    the same inputs downloads nothing, and when nothing changed out_dir is left untouched. The
    new bundle is built in a directory beside out_dir and renamed into place, so a failure
    leaves the previous bundle (or none) as it was. Raises BundleError.
    """
    out_dir = Path(out_dir).absolute()
    say = progress or (lambda _msg: None)

    def note(msg: str) -> None:
        log.info("bundle %s: %s", out_dir, msg)
        say(msg)

    if out_dir.exists() and not out_dir.is_dir():
        raise BundleError(f"bundle {out_dir} exists and is not a directory")
    old = _try_manifest(out_dir) if out_dir.is_dir() else None
    if out_dir.is_dir() and old is None and any(out_dir.iterdir()):
        # never replace (and delete) a directory this module did not write
        raise BundleError(f"{out_dir} is not empty and holds no bundle ({MANIFEST}); give a new "
                          "or empty directory, or the directory of an earlier bundle")
    if constraints is not None and not Path(constraints).is_file():
        raise BundleError(f"constraints file {constraints} does not exist")
    local = pick_local_wheels(wheel_dirs, torch_pin(requirements, constraints))

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.build-", dir=out_dir.parent))
    try:
        (staging / "debs").mkdir()
        (staging / "wheels").mkdir()
        work = staging / ".work"
        work.mkdir()
        debs = _build_debs(staging / "debs", list(apt_packages),
                           out_dir / "debs" if old else None, old, note)
        wheels = build_wheels(staging / "wheels", list(requirements),
                               Path(constraints) if constraints else None, local,
                               out_dir / "wheels" if old else None, note, work, pip_args)
        shutil.rmtree(work)
        release = _os_release()
        manifest = {
            "format": FORMAT,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python_tag": f"cp{sys.version_info[0]}{sys.version_info[1]}",
            "python_version": f"{sys.version_info[0]}.{sys.version_info[1]}",
            "platform": sysconfig.get_platform(),
            "distribution": {"id": release.get("ID", ""),
                             "codename": release.get("VERSION_CODENAME", "")},
            "architecture": _dpkg_architecture(),
            "machine": platform.machine(),
            "apt_packages": list(apt_packages),
            "requirements": list(requirements),
            "constraints": Path(constraints).read_text() if constraints else None,
            "pip_args": list(pip_args),
            "debs": debs,
            "wheels": wheels,
        }
        if old is not None and _comparable(old) == _comparable(manifest):
            note(f"unchanged: {len(debs)} debs, {len(wheels)} wheels")
            return old
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        os.chmod(staging, 0o755)
        _publish(staging, out_dir)
        note(f"written: {len(debs)} debs, {len(wheels)} wheels")
        return manifest
    except subprocess.TimeoutExpired as exc:
        raise BundleError(f"{exc.cmd[0]} did not finish in {exc.timeout:g} s") from None
    except CommandError as exc:
        raise BundleError(str(exc), stderr=exc.stderr) from None
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def _publish(staging: Path, out_dir: Path) -> None:
    """Put the new bundle in place of the old one (which held a manifest) and drop the old."""
    if not out_dir.exists():
        os.rename(staging, out_dir)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    os.rename(out_dir, retired / "bundle")
    try:
        os.rename(staging, out_dir)
    except OSError:
        os.rename(retired / "bundle", out_dir)  # the old one goes back
        retired.rmdir()
        raise
    shutil.rmtree(retired)
