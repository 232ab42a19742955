"""An image's layers applied onto a directory as an overlay would apply them, for
`invoke image --base` (imagebase): the explicit application of each tar entry, with every path
resolved inside the image's root, never by the controller's kernel, so that no entry, link, hard
link or whiteout of a base reaches outside the tree it is unpacked into.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tarfile
from collections.abc import Sequence
from pathlib import Path

from scalelab.cluster.image import ImageError

log = logging.getLogger(__name__)


def unpack_layers(archive: Path, layers: Sequence[str], dest: Path, *, base: str | None = None,
                  owner: int | None = None) -> int:
    """Apply an image's layers in order onto dest, as an overlay would: a later layer's entry
    replaces what lay at its path (never writing through a link), .wh.NAME removes NAME of the
    layers below, .wh..wh..opq all of its directory's. Paths are resolved as the image's own
    root would resolve them (see _inside): an entry under /var/run -> /run lands in dest/run,
    never in the controller's /run. owner (a uid, used as the gid too) owns every entry made.

    A layer that would reach outside dest is refused whole, as Docker refuses it: an entry
    named with '..' past the root, a hard link to a path outside or to nothing an earlier entry
    made, a whiteout of '..'. ImageError names the base (base, else the archive), the layer
    and the entry; what dest holds then is the caller's to remove. Device nodes and FIFOs are
    skipped (the checks need none; imagebase.in_root gives them their own /dev). Returns how
    many entries were skipped."""
    named = base or str(archive)
    root = os.path.realpath(dest)
    if owner is not None:
        os.chown(root, owner, owner)
    skipped = 0
    try:
        with tarfile.open(archive) as outer:
            for name in layers:
                inner = outer.extractfile(name)
                if inner is None:
                    raise ImageError(f"{archive}: layer {name} is missing")
                mine: set[str] = set()  # what this layer has put down so far
                with tarfile.open(fileobj=inner, mode="r|*") as tar:
                    for m in tar:
                        try:
                            skipped += not _apply(tar, m, root, mine, owner)
                        except (_Refused, OSError) as exc:
                            raise ImageError(
                                f"--base {named}: layer {name}: entry {m.name!r} {_why(exc)}; "
                                "the base is refused and nothing was built (Docker would not "
                                "apply this layer either: rebuild the base or use another)"
                            ) from None
    except (tarfile.TarError, EOFError) as exc:
        raise ImageError(f"{archive}: a layer could not be read ({exc}); docker save writes "
                         "plain or gzip layers, which is what --base takes") from None
    return skipped


class _Refused(Exception):
    """An entry that would reach outside the tree, or that no tree could take."""


def _why(exc: Exception) -> str:
    if isinstance(exc, _Refused):
        return str(exc)
    return f"could not be applied ({exc.strerror or exc})"


def _apply(tar: tarfile.TarFile, m: tarfile.TarInfo, root: str, mine: set[str],
           owner: int | None) -> bool:
    """One layer entry onto root (see unpack_layers); False when it was skipped."""
    rel = _relative(m.name, "is named")
    if rel == ".":
        if m.isdir():
            return True
        raise _Refused("names the image's root itself")
    parent, base = os.path.split(rel)
    where = _inside(root, parent, make=True, owner=owner)
    if base == ".wh..wh..opq":
        for old in os.listdir(where):
            if os.path.join(where, old) not in mine:
                remove(os.path.join(where, old))
        return True
    if base.startswith(".wh..wh."):
        return True  # aufs's own bookkeeping (.wh..wh.plnk), no entry of the image
    if base.startswith(".wh."):
        gone = base[4:]
        if gone in ("", ".", ".."):
            raise _Refused(f"whites out {gone!r}, which is no entry of its directory")
        remove(os.path.join(where, gone))
        return True
    if m.ischr() or m.isblk() or m.isfifo() or not (m.isdir() or m.isreg() or m.issym()
                                                    or m.islnk()):
        log.debug("skipping %s (a device node or FIFO: the checks need none)", m.name)
        return False
    target = os.path.join(where, base)
    kept = m.isdir() and is_dir(target)
    if not kept and os.path.lexists(target):
        remove(target)  # the entry replaces it, whatever it was (a link is not followed)
    # no set-user or set-group id in the tree: its code runs without new privileges anyway
    mode = m.mode & 0o1777
    if m.isdir():
        if not kept:
            os.mkdir(target, 0o700)
        if owner is not None:
            os.lchown(target, owner, owner)
        os.chmod(target, mode)  # a directory just made or found by lstat: not a link
    elif m.isreg():
        src = tar.extractfile(m)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(src, out)
            out.flush()
            if owner is not None:
                os.fchown(fd, owner, owner)
            os.fchmod(fd, mode)
            # the base's bytecode is valid against its sources' times: keep them
            os.utime(fd, (m.mtime, m.mtime))
    elif m.issym():
        os.symlink(m.linkname, target)  # kept as written: only ever read inside the root
        if owner is not None:
            os.lchown(target, owner, owner)
    else:
        os.link(_link_source(root, m), target, follow_symlinks=False)
    mine.add(target)
    return True


def _relative(name: str, what: str) -> str:
    """A member's name (or a hard link's target) as a path below the image's root; _Refused
    when it climbs out of it. A leading '/' means the image's root, as tar and Docker read it.

    >>> _relative("/usr/./lib/../bin/x", "is named"), _relative("./", "is named")
    ('usr/bin/x', '.')
    >>> _relative("usr/../../etc/passwd", "is named")
    Traceback (most recent call last):
    scalelab.cluster.layers._Refused: is named 'usr/../../etc/passwd', which climbs out of the image's root ('..')
    """
    rel = os.path.normpath(name.lstrip("/")) if name.strip("/") else "."
    if rel == ".." or rel.startswith("../"):
        raise _Refused(f"{what} {name!r}, which climbs out of the image's root ('..')")
    return rel


def _link_source(root: str, m: tarfile.TarInfo) -> str:
    """The path inside root a hard-link entry links to: its target as the image's root names
    it (the last component not followed); _Refused when that is outside root or not there."""
    rel = _relative(m.linkname, "is a hard link to")
    parent, base = os.path.split(rel)
    try:
        src = os.path.join(_inside(root, parent), base)
    except _Refused:
        src = ""
    if rel == "." or not src or not os.path.lexists(src) or is_dir(src):
        raise _Refused(f"is a hard link to {m.linkname!r}, which no earlier entry of the "
                       "image made")
    return src


_MAX_LINKS = 40  # the kernel's own limit on links followed in one lookup (ELOOP)


def _inside(root: str, rel: str, make: bool = False, owner: int | None = None) -> str:
    """The directory rel names inside root, resolved as the image's own root would resolve
    it: each link is read and followed from root (an absolute target starts at root, '..'
    stops there), never by the controller's kernel, so the result is inside root and each of
    its components is a directory, not a link. Missing directories are made when make (owned
    by owner); otherwise _Refused, as for a component that is a file or a loop of links.

    >>> import tempfile; d = os.path.realpath(tempfile.mkdtemp())
    >>> os.makedirs(f"{d}/usr/lib"); os.symlink("usr/lib", f"{d}/lib")
    >>> os.symlink("/run", f"{d}/var-run"); os.symlink("../../../..", f"{d}/up")
    >>> [_inside(d, p, make=True)[len(d):] for p in ("lib", "var-run/x", "up/usr", "up/up")]
    ['/usr/lib', '/run/x', '/usr', '']
    """
    todo = [p for p in rel.split("/") if p not in ("", ".")]
    done: list[str] = []
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        here = os.path.join(root, *done, part)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            if not make:
                raise _Refused(f"needs {'/' + '/'.join([*done, part])!r}, which does not exist"
                               ) from None
            os.mkdir(here, 0o755)
            if owner is not None:
                os.lchown(here, owner, owner)
            done.append(part)
            continue
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_LINKS:
                raise _Refused(f"lies under a loop of links ({'/' + '/'.join([*done, part])!r})")
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            todo[:0] = [p for p in target.split("/") if p not in ("", ".")]
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise _Refused(f"lies under {'/' + '/'.join([*done, part])!r}, a file, not a "
                           "directory")
        done.append(part)
    return os.path.join(root, *done)


def is_dir(path: str | Path) -> bool:
    """A directory itself, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def remove(path: str | Path) -> None:
    """Remove what is at path, never following a link (a link is removed, not its target)."""
    if is_dir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
