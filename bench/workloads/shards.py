"""Where a data set's shards are and how a node reads them (no torch: the storage probe reads
with this alone).

A source is a path on the node (one .tar, or a directory of .tar files) or shard URLs with a
{000000..000127} range: http(s):// read through curl, as WebDataset opens web servers, and
nfs:// read through libnfs's nfs-cat, in user space where no kernel client mounts the share.
"""

from __future__ import annotations

import io
import os
from typing import Any

from braceexpand import braceexpand
from webdataset.gopen import Pipe

BUFFER = 1 << 20
# a reader that stops before the end of a shard ends its curl or nfs-cat with SIGPIPE
CUT_OFF = [141, -13]


class Counted(io.RawIOBase):
    """A shard's stream that counts the bytes read through it (what crossed the storage path)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.count = stream, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        data = self.stream.read(len(buf))
        buf[: len(data)] = data
        self.count += len(data)
        return len(data)

    def close(self) -> None:
        try:
            self.stream.close()
        finally:
            super().close()


def open_shard(url: str) -> Any:
    """A shard as a byte stream: a file, an http(s) URL through curl (a short retry, so that a
    dead server fails the run in seconds), an nfs URL through nfs-cat."""
    if url.startswith(("http://", "https://")):
        return Pipe(["curl", "--connect-timeout", "10", "--retry", "2", "--retry-delay", "1",
                     "-f", "-s", "-S", "-L", url], mode="rb", bufsize=BUFFER,
                    ignore_status=CUT_OFF + [23])
    if url.startswith("nfs://"):
        return Pipe(["nfs-cat", nfs4(url)], mode="rb", bufsize=BUFFER, ignore_status=CUT_OFF)
    return open(url, "rb", buffering=BUFFER)


def shard_urls(source: str) -> list[str]:
    """The shards of a source: a {low..high} range of URLs, one .tar, or a directory's .tar files
    (none: not a shard set)."""
    if "://" in source:
        return list(braceexpand(source))
    if os.path.isfile(source) and source.endswith(".tar"):
        return [source]
    if os.path.isdir(source):
        return sorted(os.path.join(source, f) for f in os.listdir(source) if f.endswith(".tar"))
    return []


def nfs4(url: str) -> str:
    """An nfs:// URL as libnfs reads it over NFSv4 (scalelab's exports speak only version 4)."""
    return url if "?" in url else url + "?version=4"
