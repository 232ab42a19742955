"""The grammar of a shard URL, one place: http(s):// or nfs://, a host, an optional port, a path
ending in .tar, with {low..high} ranges of equal widths (the sweep's --data parser checks
against it, the storage code reads the host and the range from it)."""

from __future__ import annotations

import re

SHARD_URL = re.compile(r"(?P<scheme>https?|nfs)://(?P<host>[A-Za-z0-9.-]+)"
                       r"(?::(?P<port>[0-9]{1,5}))?(?P<path>/[^?#]*\.tar)")
BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


def host(source: str | None) -> str | None:
    """The host a shard URL names (None: not a URL).

    >>> host("nfs://10.0.0.1/srv/s-{0..9}.tar"), host("/data/in")
    ('10.0.0.1', None)
    """
    m = SHARD_URL.match(source or "")
    return m["host"] if m else None


def shard_range(source: str) -> tuple[str, str, int]:
    """A source's first and last shard and how many its {low..high} ranges name, counted, not
    listed (a range may name millions).

    >>> shard_range("http://h:1/s-{08..10}.tar")
    ('http://h:1/s-08.tar', 'http://h:1/s-10.tar', 3)
    """
    first, last, count = source, source, 1
    for m in reversed(list(BRACES.finditer(source))):
        first = first[:m.start()] + m[1] + first[m.end():]
        last = last[:m.start()] + m[2] + last[m.end():]
        count *= int(m[2]) - int(m[1]) + 1
    return first, last, count
