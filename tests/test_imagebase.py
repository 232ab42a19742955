"""The layers of a vendor's image applied as an overlay would apply them (imagebase.
unpack_layers), on archives made here: whiteouts, an opaque directory, an entry replacing a link
(never written through it), a hard link over an existing path, and an entry under an absolute
link, which is skipped rather than followed out of the tree."""

from __future__ import annotations

import io
import json
import os
import tarfile
import uuid
from pathlib import Path

import pytest

from scalelab.cluster import imagebase
from scalelab.cluster.image import ImageError


def _entry(tar: tarfile.TarFile, name: str, data: bytes | None = None, *, kind: bytes = b"0",
           link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
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


D, L, H = tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE


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
        (f"var/run/{outside}", b"s"),                # through an absolute link: skipped
        ("h2", b"h2"), ("h", None, {"kind": H, "link": "h2"})])  # a hard link over h
    base = _archive(tmp_path, [l1, l2])
    entry, _ = imagebase.archive_parts(base)
    root = tmp_path / "root"
    root.mkdir()
    try:
        skipped = imagebase.unpack_layers(base, entry["Layers"], root)
        assert not (Path("/run") / outside).exists()
    finally:
        if (Path("/run") / outside).exists():
            os.unlink(Path("/run") / outside)  # what a broken unpack would have written
    assert skipped == 1
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
        imagebase.unpack_layers(base, entry["Layers"], tmp_path)
