"""The layers of a vendor's image applied as an overlay would apply them (layers.
unpack_layers), on archives made here: whiteouts, an opaque directory, an entry replacing a link
(never written through it), a hard link over an existing path, an entry under an absolute link
(resolved inside the image's root, never the controller's). Layers that reach outside the tree
(a hard link to a file of the controller's, through a link or '..', an entry named with '..', a
whiteout of '..') are refused in one line and change nothing outside it. And the base's own code
(its python3, the torch it imports) runs on the controller without power over it: a base that
tries to chroot out, write a sysctl, make a device node or plant a link for the controller to
follow changes nothing of the controller's."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
import uuid
from pathlib import Path

import pytest
from conftest import needs_root

from scalelab.cluster import imagebase
from scalelab.cluster.image import ImageError
from scalelab.cluster.layers import unpack_layers


def _entry(tar: tarfile.TarFile, name: str, data: bytes | None = None, *, kind: bytes = b"0",
           link: str = "", mode: int | None = None, uid: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = mode if mode is not None else 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.uid = info.gid = uid
    if data is not None:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _layer(path: Path, entries: list[tuple]) -> Path:
    with tarfile.open(path, "w") as tar:
        for e in entries:
            _entry(tar, *e[:2], **(e[2] if len(e) > 2 else {}))
    return path


def _archive(tmp: Path, layers: list[Path]) -> Path:
    out = tmp / "base.tar"
    names = [f"l{i}/layer.tar" for i in range(len(layers))]
    with tarfile.open(out, "w") as tar:
        for name, layer in zip(names, layers, strict=True):
            tar.add(layer, arcname=name)
        cfg = json.dumps({"rootfs": {"type": "layers", "diff_ids": []}}).encode()
        _entry(tar, "c.json", cfg)
        _entry(tar, "manifest.json", json.dumps(
            [{"Config": "c.json", "RepoTags": ["vendor/x:1"], "Layers": names}]).encode())
    return out


D, L, H, B = tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.BLKTYPE


def test_layers_apply_as_an_overlay_and_nothing_leaves_the_tree(tmp_path):
    outside = f"scalelab-test-{uuid.uuid4().hex[:8]}"  # would appear under /run if followed
    l1 = _layer(tmp_path / "1.tar", [
        ("etc", None, {"kind": D}), ("etc/gone", b"1"), ("etc/kept", b"k"),
        ("usr", None, {"kind": D}), ("usr/lib", None, {"kind": D}), ("usr/lib/x", b"x"),
        ("lib", None, {"kind": L, "link": "usr/lib"}),
        ("etc/alt", None, {"kind": L, "link": "/usr/lib/x"}),
        ("var", None, {"kind": D}), ("var/run", None, {"kind": L, "link": "/run"}),
        ("opq", None, {"kind": D}), ("opq/old", b"o"), ("h", b"h1")])
    l2 = _layer(tmp_path / "2.tar", [
        ("etc/.wh.gone", b""),                       # removes etc/gone
        ("etc/alt", b"a file now"),                  # replaces the link, not its target
        ("opq/.wh..wh..opq", b""), ("opq/new", b"n"),  # opq keeps only what this layer has
        ("lib/y", b"y"),                             # through a relative link: inside
        (f"var/run/{outside}", b"s"),                # through an absolute link: in root/run
        ("dev", None, {"kind": D}), ("dev/sda", None, {"kind": B}),  # a device: skipped
        ("h2", b"h2"), ("h", None, {"kind": H, "link": "h2"})])  # a hard link over h
    base = _archive(tmp_path, [l1, l2])
    entry, _ = imagebase.archive_parts(base)
    root = tmp_path / "root"
    root.mkdir()
    try:
        skipped = unpack_layers(base, entry["Layers"], root)
        assert not (Path("/run") / outside).exists()
    finally:
        if (Path("/run") / outside).exists():
            os.unlink(Path("/run") / outside)  # what a broken unpack would have written
    assert skipped == 1 and not os.path.lexists(root / "dev/sda")
    assert (root / "run" / outside).read_bytes() == b"s"  # /var/run -> /run read in the image
    assert not (root / "etc/gone").exists() and (root / "etc/kept").read_bytes() == b"k"
    assert not (root / "etc/alt").is_symlink() and (root / "etc/alt").read_bytes() == b"a file now"
    assert (root / "usr/lib/x").read_bytes() == b"x"  # the old link's target is untouched
    assert sorted(p.name for p in (root / "opq").iterdir()) == ["new"]
    assert (root / "usr/lib/y").read_bytes() == b"y"
    assert (root / "h").read_bytes() == b"h2" and (root / "h").stat().st_nlink == 2


def test_an_unreadable_layer_is_one_line_naming_the_archive(tmp_path):
    bad = tmp_path / "l.tar"
    bad.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 600)  # zstd's magic: tarfile cannot read it
    base = _archive(tmp_path, [bad])
    entry, _ = imagebase.archive_parts(base)
    with pytest.raises(ImageError, match=r"a layer could not be read .*plain or gzip layers"):
        unpack_layers(base, entry["Layers"], tmp_path)


def _sentinel(tmp_path: Path) -> tuple[Path, tuple]:
    """A file of the controller's beside the build, and what a layer must not change of it."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    secret = outside / "secret"
    secret.write_bytes(b"the controller's")
    os.chmod(secret, 0o600)
    return secret, _state(secret)


def _state(path: Path) -> tuple:
    st = os.stat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_nlink, path.read_bytes()


def _refused(tmp_path: Path, layers: list[Path]) -> str:
    """build_on_base of an archive of these layers: refused (the one line, returned), with
    nothing left in the image cache."""
    base = _archive(tmp_path, layers)
    cache = tmp_path / "cache"
    with pytest.raises(ImageError) as err:
        imagebase.build_on_base(f"docker-archive:{base}", wheel_dirs=[],
                                constraints=tmp_path / "none.txt", cache=cache)
    line = str(err.value)
    assert "\n" not in line and f"--base docker-archive:{base}" in line, line
    assert list(cache.iterdir()) == []  # no staging directory, no image: nothing half-built
    return line


# the cache's staging directory lies three levels below tmp_path: cache/.base.build-X/root
UP = "../../.."


@needs_root
@pytest.mark.parametrize("link", ["abs", "dotdot"])
def test_a_hard_link_to_a_file_outside_is_refused_and_the_file_is_unchanged(tmp_path, link):
    """A hard link whose target names a file of the controller's (by its absolute path, or by
    '..' out of the tree): tar's filter "tar" linked it and, as root, gave it the entry's owner
    and mode. Now the layer is refused in one line naming the entry, and the file keeps its
    owner, mode, link count and bytes."""
    secret, before = _sentinel(tmp_path)
    target = str(secret) if link == "abs" else f"{UP}/outside/secret"
    line = _refused(tmp_path, [_layer(tmp_path / "1.tar", [
        ("etc", None, {"kind": D}),
        ("etc/shadow", None, {"kind": H, "link": target, "mode": 0o4777, "uid": 4321})])])
    assert "'etc/shadow'" in line and "hard link" in line, line
    assert _state(secret) == before


@needs_root
def test_nothing_is_written_through_a_link_to_outside(tmp_path):
    """A symlink to a directory of the controller's, then entries through it: a hard link (tar
    followed the symlink and chowned the controller's file), files under it and under a link
    that climbs with '..' (read inside the image's root: they land in the tree, never out)."""
    secret, before = _sentinel(tmp_path)
    outside = secret.parent
    line = _refused(tmp_path, [
        _layer(tmp_path / "1.tar", [
            ("esc", None, {"kind": L, "link": str(outside)}),
            ("up", None, {"kind": L, "link": "../../../../../../../.."}),
            ("esc/new", b"planted"), (f"up{outside}/new2", b"planted")]),
        _layer(tmp_path / "2.tar", [
            ("h", None, {"kind": H, "link": "esc/secret", "mode": 0o777, "uid": 4321})])])
    assert "'h'" in line and "hard link to 'esc/secret'" in line, line
    assert _state(secret) == before
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


@needs_root
@pytest.mark.parametrize("name", [f"{UP}/outside/planted", "usr/../../planted",
                                  f"/{UP}/outside/planted"])
def test_an_entry_named_past_the_root_is_refused(tmp_path, name):
    """'..' past the image's root: skipped silently before; now the layer (and the base) is
    refused in one line naming the entry, and nothing lands outside."""
    secret, before = _sentinel(tmp_path)
    line = _refused(tmp_path, [_layer(tmp_path / "1.tar", [("usr", None, {"kind": D}),
                                                           (name, b"planted")])])
    assert repr(name) in line and "climbs out of the image's root" in line, line
    assert sorted(p.name for p in secret.parent.iterdir()) == ["secret"]
    assert not (tmp_path / "planted").exists() and _state(secret) == before


def test_a_whiteout_of_dotdot_removes_nothing_outside(tmp_path):
    """.wh... whites out '..': it removed the build directory's parent, and what lay beside it."""
    build = tmp_path / "build"
    (build / "root").mkdir(parents=True)
    (build / "keep").write_text("the controller's")
    base = _archive(tmp_path, [_layer(tmp_path / "1.tar", [("etc", None, {"kind": D}),
                                                           (".wh...", b"")])])
    entry, _ = imagebase.archive_parts(base)
    with pytest.raises(ImageError, match=r"entry '\.wh\.\.\.' whites out '\.\.'"):
        unpack_layers(base, entry["Layers"], build / "root")
    assert (build / "keep").read_text() == "the controller's"


@needs_root
def test_a_base_whose_opt_is_a_link_is_refused_before_its_code_runs(tmp_path):
    """/opt a link to a directory of the controller's: the controller would have copied the
    workloads (and pip Horovod) through it. Refused in one line; the directory is untouched."""
    secret, before = _sentinel(tmp_path)
    line = _refused(tmp_path, [_layer(tmp_path / "1.tar", [
        ("opt", None, {"kind": L, "link": str(secret.parent)})])])
    assert "/opt in the base is a link, not a directory" in line, line
    assert sorted(p.name for p in secret.parent.iterdir()) == ["secret"]


# ------------------------------------------------------------ a base with a real Python


def _ldd(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    return {w for line in out.splitlines() for w in line.split() if w.startswith("/")}


@pytest.fixture(scope="module")
def python_layer(tmp_path_factory) -> Path:
    """A layer holding the controller's own Python (its interpreter, libraries and standard
    library, at the paths they have here), /bin/sh and /usr/bin/env: a base's Python, small."""
    if shutil.which("ldd") is None:
        pytest.skip("ldd is not installed (libc-bin)")
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    stdlib = sysconfig.get_path("stdlib")
    skip = {"site-packages", "dist-packages", "test", "idlelib", "tkinter", "ensurepip",
            "__pycache__", "turtledemo"}
    files = {"/bin/sh", "/usr/bin/env", exe}
    for b in list(files):
        files |= _ldd(b)
    out = tmp_path_factory.mktemp("python") / "python.tar"
    with tarfile.open(out, "w") as tar:
        for f in sorted(files):  # each as a file where the binaries look for it
            with open(f, "rb") as fh:
                tar.addfile(tar.gettarinfo(os.path.realpath(f), arcname=f.lstrip("/")), fh)
        tar.add(stdlib, arcname=stdlib.lstrip("/"),
                filter=lambda i: None if os.path.basename(i.name) in skip
                or i.name.count("/config-") else i)
        if exe != "/usr/bin/python3":
            _entry(tar, "usr/bin/python3", kind=L, link=exe)  # absolute, as bases have them
        _entry(tar, "etc", kind=D)
        _entry(tar, "root", kind=D, mode=0o700)
    return out


def _torch_layer(tmp_path: Path, code: str) -> Path:
    """A layer adding a stand-in torch (code) where the base's Python imports it from."""
    path = sysconfig.get_path("stdlib").lstrip("/") + "/torch/__init__.py"
    return _layer(tmp_path / "torch.tar", [(path, code.encode())])


def _image_files(archive: str) -> list[str]:
    with tarfile.open(archive) as outer:
        entry = json.load(outer.extractfile("manifest.json"))[0]
        with tarfile.open(fileobj=outer.extractfile(entry["Layers"][-1])) as layer:
            return layer.getnames()


@needs_root
def test_the_bases_code_runs_unprivileged_and_the_image_builds(tmp_path, python_layer):
    """The base's python3 makes the venv and its torch is imported, as a uid of no user of the
    controller with no capability (its torch reports both); the image holds scalelab's layer."""
    torch = ("import os\n"
             "cap = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]\n"
             "__version__ = f'2.13.0+uid{os.getuid()}.cap{cap[0]}'\n"
             "class version:\n    cuda = None\n")
    base = _archive(tmp_path, [python_layer, _torch_layer(tmp_path, torch)])
    meta = imagebase.build_on_base(f"docker-archive:{base}", wheel_dirs=[],
                                   constraints=tmp_path / "none.txt", cache=tmp_path / "cache")
    assert meta["contents"]["torch"] == f"2.13.0+uid{imagebase.BUILD_UID}.cap0000000000000000"
    assert meta["base"]["python"] == "{}.{}".format(*sys.version_info[:2])
    names = _image_files(meta["archive"])
    assert "opt/scalelab/venv/pyvenv.cfg" in names, names[:20]
    assert any(n.startswith("opt/scalelab/bench/workloads/") for n in names)


@needs_root
def test_the_bases_code_has_no_power_over_the_controller(tmp_path, python_layer):
    """A base whose torch, imported by the checks, tries to chroot out of its root and write a
    file of the controller's, to set a sysctl (the controller's NIS domain name), to make a
    block device, and to turn /opt/scalelab/bench into a link to a directory of the
    controller's that the build then copies the workloads into. Each is refused by the kernel
    (the torch reports the errno of each), and nothing of the controller's changes."""
    outside = tmp_path / "outside"
    outside.mkdir()
    torch = f'''import os, stat
OUT = {str(outside)!r}
done = []
def attempt(name, fn):
    try:
        fn()
        done.append(name + "-done")
    except OSError as e:
        done.append(f"{{name}}-{{e.errno}}")
def chroot_out():  # in a child: were it to get out, the attempts below stay inside
    pid = os.fork()
    if pid == 0:
        try:
            os.makedirs("/tmp/jail", exist_ok=True)
            os.chroot("/tmp/jail")
            for _ in range(64):
                os.chdir("..")
            os.chroot(".")
            open(OUT + "/by-chroot", "w").write("escaped")
            os._exit(0)
        except OSError as e:
            os._exit(e.errno)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code:
        raise OSError(code, os.strerror(code))
attempt("chroot", chroot_out)
attempt("sysctl", lambda: open("/proc/sys/kernel/domainname", "w").write("scalelab-escaped"))
attempt("mknod", lambda: os.mknod("/tmp/disk", stat.S_IFBLK | 0o600, os.makedev(7, 0)))
attempt("link", lambda: os.symlink(OUT, "/opt/scalelab/bench"))
__version__ = "2.13.0+" + ".".join(done)
class version:
    cuda = None
'''
    domain = Path("/proc/sys/kernel/domainname").read_text()
    base = _archive(tmp_path, [python_layer, _torch_layer(tmp_path, torch)])
    try:
        meta = imagebase.build_on_base(f"docker-archive:{base}", wheel_dirs=[],
                                       constraints=tmp_path / "none.txt",
                                       cache=tmp_path / "cache")
        assert Path("/proc/sys/kernel/domainname").read_text() == domain
    finally:
        if Path("/proc/sys/kernel/domainname").read_text() != domain:  # what an escape set
            Path("/proc/sys/kernel/domainname").write_text(domain)
    # it ran, and the kernel said no to each (EPERM, EACCES); the link it could make is
    # removed, not followed
    assert meta["contents"]["torch"] == "2.13.0+chroot-1.sysctl-13.mknod-1.link-done"
    assert list(outside.iterdir()) == []
    assert any(n.startswith("opt/scalelab/bench/workloads/") for n in _image_files(
        meta["archive"]))
