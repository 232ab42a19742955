"""Checkpoints written over NFS by the rank itself, through libnfs (ckpt.py's nfs:// places).

A node that mounts no NFS share (an emulated node: this kernel has no NFS client) still
writes to an NFS server: each rank speaks NFSv3 to it with libnfs, the userspace client the
data path reads shards with (nfs-cat), loaded with ctypes. The bytes cross the node's link as
a mounted share's would. (Debian 12's libnfs 4.0 calls its NFSv4 "not yet functional": its
writes fail above 2 KiB.)

A place is ``nfs://ADDRESS/EXPORT/scalelab-checkpoints/...``: the server's address, the
directory it exports, and a path under it; the export is what comes before
``/scalelab-checkpoints`` (the controller's layout, scalelab/run/checkpoints.py).

``Place`` gives ckpt.py what it does with a directory (list, size, remove) and PyTorch
Distributed Checkpoint's storage writer and reader on this file system. The writer's streams
buffer 8 MiB before each write, which libnfs sends in the server's largest WRITEs; a file is
committed (NFS COMMIT) when it is closed. The reader reads a file whole, in order, once. A call takes a mounted session no other thread holds (libnfs's contexts
are not shared between threads; async_save writes from a thread of its own) and gives it
back after, so a process mounts as many as it has calls at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import posixpath
import stat
import threading
from typing import Any

NFS_V3 = 3
SONAMES = ("libnfs.so.13", "libnfs.so.14")  # libnfs 4.0 and 5.0
BUFFER = 8 << 20
CHUNK = BUFFER  # one call into libnfs, which splits it into the server's largest RPCs
_lib: Any = None
_free: dict[tuple[str, str], list[Any]] = {}  # mounted sessions no call holds now
_lock = threading.Lock()


class NfsError(OSError):
    """A libnfs call failed: its errno and the library's own message."""


class _Stat(ctypes.Structure):
    _fields_ = [(f, ctypes.c_uint64) for f in (
        "dev", "ino", "mode", "nlink", "uid", "gid", "rdev", "size", "blksize", "blocks",
        "atime", "mtime", "ctime", "atime_nsec", "mtime_nsec", "ctime_nsec", "used")]


class _Dirent(ctypes.Structure):
    pass


_Dirent._fields_ = [("next", ctypes.POINTER(_Dirent)), ("name", ctypes.c_char_p)]


def lib() -> Any:
    """libnfs, loaded once; NfsError naming the package where it is missing. Only the sonames
    whose calls this module was written against (libnfs 4 and 5): later ones take pread's and
    pwrite's arguments in another order."""
    global _lib
    if _lib is None:
        so = None
        for name in SONAMES:
            try:
                so = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if so is None:
            raise NfsError(2, f"no {' or '.join(SONAMES)} on this node; install libnfs13 "
                              "(Debian 12's libnfs-utils brings it)")
        p, c, u64, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int
        for fn, res, args in (
                ("nfs_init_context", p, []), ("nfs_destroy_context", None, [p]),
                ("nfs_set_version", i, [p, i]), ("nfs_get_error", c, [p]),
                ("nfs_mount", i, [p, c, c]), ("nfs_set_timeout", None, [p, i]),
                ("nfs_open", i, [p, c, i, ctypes.POINTER(p)]),
                ("nfs_open2", i, [p, c, i, i, ctypes.POINTER(p)]),
                ("nfs_close", i, [p, p]), ("nfs_fsync", i, [p, p]),
                ("nfs_pread", i, [p, p, u64, u64, p]), ("nfs_pwrite", i, [p, p, u64, u64, p]),
                ("nfs_stat64", i, [p, c, ctypes.POINTER(_Stat)]),
                ("nfs_mkdir", i, [p, c]), ("nfs_rmdir", i, [p, c]), ("nfs_unlink", i, [p, c]),
                ("nfs_rename", i, [p, c, c]), ("nfs_opendir", i, [p, c, ctypes.POINTER(p)]),
                ("nfs_readdir", ctypes.POINTER(_Dirent), [p, p]), ("nfs_closedir", None, [p, p])):
            f = getattr(so, fn)
            f.restype, f.argtypes = res, args
        _lib = so
    return _lib


MARK = "/scalelab-checkpoints"  # the export ends before it


def split(url: str) -> tuple[str, str, str]:
    """(server, export, path on the server) of an nfs:// place.

    >>> split("nfs://10.0.0.5/srv/ck/scalelab-checkpoints/c1/s1/r1/step-000005")
    ('10.0.0.5', '/srv/ck', '/srv/ck/scalelab-checkpoints/c1/s1/r1/step-000005')
    >>> split("nfs://10.0.0.5/srv/ck/../x")
    Traceback (most recent call last):
    ...
    ValueError: not an nfs:// place under an export's scalelab-checkpoints: 'nfs://10.0.0.5/srv/ck/../x'
    """
    server, _, path = url.removeprefix("nfs://").partition("/")
    path = "/" + path.rstrip("/")
    export = path.split(MARK + "/")[0] if MARK + "/" in path or path.endswith(MARK) else ""
    if not url.startswith("nfs://") or not server or not export or ".." in path.split("/"):
        raise ValueError(f"not an nfs:// place under an export's scalelab-checkpoints: {url!r}")
    return server, export.removesuffix(MARK) or "/", path


def _acquire(server: str, export: str) -> Any:
    """A mounted session to server:export that no other thread holds (libnfs's contexts are
    not shared between threads): a free one, or a new one."""
    key = (server, export)
    with _lock:
        if _free.get(key):
            return _free[key].pop()
    so = lib()
    nfs = so.nfs_init_context()
    if not nfs:
        raise NfsError(12, "libnfs could not make a context")
    so.nfs_set_version(nfs, NFS_V3)
    so.nfs_set_timeout(nfs, 120_000)
    rc = so.nfs_mount(nfs, server.encode(), export.encode())
    if rc < 0:
        why = (so.nfs_get_error(nfs) or b"").decode(errors="replace")
        so.nfs_destroy_context(nfs)
        raise NfsError(-rc, f"nfs://{server}{export}: mount failed: {why}")
    return nfs


def _release(server: str, export: str, nfs: Any) -> None:
    with _lock:
        _free.setdefault((server, export), []).append(nfs)


@contextlib.contextmanager
def _session(server: str, export: str) -> Any:
    nfs = _acquire(server, export)
    try:
        yield nfs
    finally:
        _release(server, export, nfs)


def _check(nfs: Any, rc: int, what: str) -> int:
    if rc < 0:
        why = (lib().nfs_get_error(nfs) or b"").decode(errors="replace")
        raise NfsError(-rc, f"{what}: {why or os.strerror(-rc)}")
    return rc


class _Raw(io.RawIOBase):
    """One open NFS file: positioned reads and writes at our own offset."""

    def __init__(self, nfs: Any, fh: Any, name: str, writing: bool, done: Any) -> None:
        self._nfs, self._fh, self.name, self._writing, self._pos = nfs, fh, name, writing, 0
        self._done = done  # gives the session back

    def readable(self) -> bool:
        return not self._writing

    def writable(self) -> bool:
        return self._writing

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0:
            self._pos = offset
        elif whence == 1:
            self._pos += offset
        else:
            st = _Stat()
            _check(self._nfs, lib().nfs_stat64(self._nfs, self.name.encode(), ctypes.byref(st)),
                   self.name)
            self._pos = st.size + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")[:CHUNK]
        buf = (ctypes.c_char * len(view)).from_buffer(view)
        n = _check(self._nfs, lib().nfs_pread(self._nfs, self._fh, self._pos, len(view), buf),
                   self.name)
        self._pos += n
        return n

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        done = 0
        while done < len(view):
            part = view[done:done + CHUNK]
            buf = (ctypes.c_char * len(part)).from_buffer_copy(part) if part.readonly else \
                (ctypes.c_char * len(part)).from_buffer(part)
            n = _check(self._nfs, lib().nfs_pwrite(self._nfs, self._fh, self._pos, len(part),
                                                   buf), self.name)
            if n == 0:
                raise NfsError(5, f"{self.name}: the server took no bytes")
            self._pos += n
            done += n
        return done

    def close(self) -> None:
        if not self.closed and self._fh:
            fh, self._fh = self._fh, None
            try:
                if self._writing:
                    _check(self._nfs, lib().nfs_fsync(self._nfs, fh), self.name)
            finally:
                lib().nfs_close(self._nfs, fh)
                self._done(self._nfs)
        super().close()


class Place:
    """A directory tree on an NFS server (nfs://ADDRESS/EXPORT/...), as ckpt.py uses one."""

    def __init__(self, url: str) -> None:
        self.server, self.export, root = split(url)
        self.root = self.path(root)

    def _nfs(self) -> Any:
        return _session(self.server, self.export)

    def path(self, where: str) -> str:
        """A path inside the export (libnfs's), from a url or a path on the server."""
        if where.startswith("nfs://"):
            where = split(where)[2]
        if where.startswith(self.export.rstrip("/") + "/"):
            return where[len(self.export.rstrip("/")):]
        return where

    def open(self, path: str, mode: str) -> io.IOBase:
        """The file to write as a buffered stream, holding a session until it is closed; to
        read, its bytes, read whole."""
        p, nfs = self.path(path), _acquire(self.server, self.export)
        fh = ctypes.c_void_p()
        try:
            if "w" in mode:
                _check(nfs, lib().nfs_open2(nfs, p.encode(), os.O_WRONLY | os.O_CREAT |
                                            os.O_TRUNC, 0o644, ctypes.byref(fh)), p)
            else:
                _check(nfs, lib().nfs_open(nfs, p.encode(), os.O_RDONLY, ctypes.byref(fh)), p)
        except BaseException:
            _release(self.server, self.export, nfs)
            raise
        raw = _Raw(nfs, fh, p, "w" in mode,
                   lambda n: _release(self.server, self.export, n))
        if "w" in mode:
            return io.BufferedWriter(raw, BUFFER)
        # read whole, in order: DCP's reader seeks from item to item out of the file's order,
        # and each seek outside a buffer would fetch a buffer again
        with raw:
            data = bytearray()
            while chunk := raw.read(BUFFER):
                data += chunk
        return io.BytesIO(data)

    def stat(self, path: str) -> _Stat | None:
        st = _Stat()
        with self._nfs() as nfs:
            rc = lib().nfs_stat64(nfs, self.path(path).encode(), ctypes.byref(st))
        return None if rc < 0 else st

    def exists(self, path: str) -> bool:
        return self.stat(path) is not None

    def size(self, path: str) -> int:
        st = self.stat(path)
        return int(st.size) if st is not None else 0

    def listdir(self, path: str) -> list[str]:
        d, names = ctypes.c_void_p(), []
        with self._nfs() as nfs:
            _check(nfs, lib().nfs_opendir(nfs, self.path(path).encode(), ctypes.byref(d)), path)
            try:
                while True:
                    ent = lib().nfs_readdir(nfs, d)
                    if not ent:
                        break
                    name = ent.contents.name.decode(errors="replace")
                    if name not in (".", ".."):
                        names.append(name)
            finally:
                lib().nfs_closedir(nfs, d)
        return names

    def makedirs(self, path: str) -> None:
        built = ""
        with self._nfs() as nfs:
            for part in self.path(path).strip("/").split("/"):
                built += "/" + part
                rc = lib().nfs_mkdir(nfs, built.encode())
                if rc < 0 and -rc != 17:  # EEXIST
                    _check(nfs, rc, f"mkdir {built}")

    def rmtree(self, path: str) -> None:
        """Remove a tree; what is already gone is no error."""
        p = self.path(path)
        st = self.stat(p)
        if st is None:
            return
        if stat.S_ISDIR(st.mode):
            for name in self.listdir(p):
                self.rmtree(posixpath.join(p, name))
        with self._nfs() as nfs:
            (lib().nfs_rmdir if stat.S_ISDIR(st.mode) else lib().nfs_unlink)(nfs, p.encode())

    def rmdir(self, path: str) -> bool:
        with self._nfs() as nfs:
            return lib().nfs_rmdir(nfs, self.path(path).encode()) >= 0

    def rename(self, old: str, new: str) -> None:
        with self._nfs() as nfs:
            _check(nfs, lib().nfs_rename(nfs, self.path(old).encode(),
                                         self.path(new).encode()), f"rename {old}")

    def storage(self, where: str, reading: bool) -> dict[str, Any]:
        """DCP's keyword for the checkpoint at where (a url of this place): its storage
        reader or writer."""
        return {"storage_reader" if reading else "storage_writer": storage(where, reading)}

    def unlink(self, path: str) -> None:
        with self._nfs() as nfs:
            _check(nfs, lib().nfs_unlink(nfs, self.path(path).encode()), f"unlink {path}")


def storage(url: str, reading: bool) -> Any:
    """DCP's storage writer (reading: reader) for the checkpoint at url, on this NFS place."""
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystemBase

    place = Place(url)

    class _Fs(FileSystemBase):
        def create_stream(self, path: Any, mode: str) -> Any:
            import contextlib

            @contextlib.contextmanager
            def opened() -> Any:
                stream = place.open(str(path), mode)
                try:
                    yield stream
                finally:
                    stream.close()
            return opened()

        def concat_path(self, path: Any, suffix: str) -> str:
            return posixpath.join(str(path), suffix)

        def rename(self, path: Any, new_path: Any) -> None:
            place.rename(str(path), str(new_path))

        def init_path(self, path: Any) -> str:
            return place.path(str(path))

        def mkdir(self, path: Any) -> None:
            place.makedirs(str(path))

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
            return str(checkpoint_id).startswith("nfs://")

        def exists(self, path: Any) -> bool:
            return place.exists(str(path))

        def rm_file(self, path: Any) -> None:
            place.unlink(str(path))

        def ls(self, path: Any) -> list[str]:
            return [posixpath.join(str(path), n) for n in place.listdir(str(path))]

    if reading:
        r = FileSystemReader(place.root)
        r.fs = _Fs()
        r.path = place.root
        return r
    # each file is committed as its stream closes, so DCP's own fsync (of a local file
    # descriptor) is not wanted
    w = FileSystemWriter(place.root, sync_files=False)
    w.fs = _Fs()
    w.path = place.root
    return w
