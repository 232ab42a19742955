"""Parsers of the values users type for a sweep: each takes the value (a CLI string or what a
YAML sweep file holds) and a label naming where it came from, and returns it in canonical units
or raises InputError with one line that says the fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from scalelab.core import shardurl
from scalelab.core.errors import InputError, suggest
from scalelab.core.units import parse_int_range, parse_rate_list, parse_size_bytes
from scalelab.core.validate import PLACE_PATH, SHORT_NODE
from scalelab.model import accel, fabric

SYNTHETIC = "synthetic"


def given(value: Any) -> bool:
    return value is not None and value != ""


def one_int(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool):
        raise InputError(f"{what}: {value!r} is not a whole number")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        n = value
    else:
        text = str(value).strip()
        if not re.fullmatch(r"-?\d+", text):
            raise InputError(f"{what}: {value!r} is not a whole number; give e.g. {max(minimum, 3)}")
        n = int(text)
    if n < minimum:
        raise InputError(f"{what}: {n} is below the minimum of {minimum}")
    return n


def seconds(value: Any, what: str) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        s = float(str(value).strip().removesuffix("s"))
    except ValueError:
        raise InputError(f"{what}: {value!r} is not a number of seconds; give e.g. 600") from None
    if not math.isfinite(s) or s <= 0:
        raise InputError(f"{what}: {value!r} must be a positive number of seconds, e.g. 600")
    return s


def price(value: Any, what: str) -> float:
    """A price per node-hour: a finite number above 0.

    >>> price("2.5", "--price-per-node-hour")
    2.5
    >>> price("-1", "--price-per-node-hour")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: --price-per-node-hour: -1 must be a number above 0, e.g. 2.5 for 2.50 per node and hour
    """
    try:
        price = float(value)
    except (TypeError, ValueError):
        price = float("nan")
    if isinstance(value, bool) or not (math.isfinite(price) and price > 0):
        raise InputError(f"{what}: {value} must be a number above 0, e.g. 2.5 for 2.50 per node "
                         "and hour")
    return price


def flag(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise InputError(f"{what}: {value!r} is not true or false")


def int_list(value: Any, what: str, minimum: int = 1) -> list[int]:
    """A range expression, a number, or a YAML list of either."""
    if isinstance(value, list | tuple):
        if not value:
            raise InputError(f"{what}: empty list; give e.g. 1-3 or [1, 2, 4]")
        out: set[int] = set()
        for item in value:
            out.update(parse_int_range(item, what, minimum))
        return sorted(out)
    return parse_int_range(value, what, minimum)


def rates(value: Any, what: str) -> list[float | None]:
    if isinstance(value, list | tuple):
        if not value:
            raise InputError(f"{what}: empty list; give e.g. [1gbit, 10gbit] or native")
        value = ",".join(str(v) for v in value)
    try:
        return parse_rate_list(str(value))
    except InputError as exc:
        raise InputError(f"{what}: {strip_what(exc, 'bandwidth')}") from None


def sizes(value: Any, what: str) -> list[int]:
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    if not items or not any(str(i).strip() for i in items):
        raise InputError(f"{what}: empty; give e.g. 4K,64K,1M,16M")
    try:
        return sorted({parse_size_bytes(i if isinstance(i, int) else str(i).strip())
                       for i in items})
    except InputError as exc:
        raise InputError(f"{what}: {strip_what(exc, 'size')}") from None


def choice(value: Any, what: str, allowed: Sequence[str]) -> str:
    text = str(value).strip().lower()
    if text not in allowed:
        hint = suggest(text, allowed)
        raise InputError(f"{what}: unknown {text!r}; {hint + ' ' if hint else ''}choose one of "
                         f"{', '.join(allowed)}")
    return text


def fabric_profile(value: Any, what: str) -> str:
    return choice(value, what, fabric.names())


def intra_link(value: Any, what: str) -> str | None:
    got = fabric.intra_link(value, what)
    return None if got is None else got[0]


# A dataset path or shard URL: the characters paths and URLs of data sets use, nothing a shell
# or ssh reads as syntax (a value reaches the ranks' command lines)
_DATA_CHARS = re.compile(r"[A-Za-z0-9._/{}:@%+=~-]+")
_SHARD_URL, _BRACES = shardurl.SHARD_URL, shardurl.BRACES


def data_source(value: Any, what: str) -> str:
    """One data source: synthetic, an absolute path on the nodes (class folders, tar shards, one
    .tar), or tar shards at an http(s):// or nfs:// URL, a {000000..000063} range naming a set.

    >>> data_source("http://10.0.0.1:8000/in/shard-{000000..000063}.tar", "--data")
    'http://10.0.0.1:8000/in/shard-{000000..000063}.tar'
    >>> data_source("data/in", "--data")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: --data: 'data/in' must be synthetic, an absolute path on the nodes (e.g. /data/imagenet) or a shard URL (e.g. http://10.0.0.1:8000/imagenet/shard-{000000..000127}.tar)
    """
    text = str(value).strip()
    if text == SYNTHETIC:
        return text
    fix = ("must be synthetic, an absolute path on the nodes (e.g. /data/imagenet) or a shard "
           "URL (e.g. http://10.0.0.1:8000/imagenet/shard-{000000..000127}.tar)")
    bare = _BRACES.sub("", text)  # its ranges aside: no other brace, no .. segment
    if not _DATA_CHARS.fullmatch(text) or ".." in bare.split("/") or "{" in bare or "}" in bare:
        raise InputError(f"{what}: {text!r} {fix}")
    if "://" in text:
        url = _SHARD_URL.fullmatch(text)
        if not url or (url["port"] and not 0 < int(url["port"]) < 65536):
            raise InputError(f"{what}: {text!r} {fix}")
        for low, high in _BRACES.findall(text):
            if int(low) > int(high) or len(low) != len(high):
                raise InputError(f"{what}: {text!r}: a shard range needs equal widths, low to "
                                 "high, e.g. {000000..000127}")
        return text
    if not text.startswith("/") or "{" in text or "}" in text or ":" in text:
        raise InputError(f"{what}: {text!r} {fix}")
    return text


def data(value: Any, what: str) -> list[str]:
    """Data sources to sweep, comma-separated or a YAML list, in the order given, no repeats."""
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    out: list[str] = []
    for item in items:
        got = data_source(item, what)
        if got not in out:
            out.append(got)
    return out


NODE_DISKS = "nodes"  # a checkpoint place: each node's own disk (under the workdir)
SERVED = re.compile(rf"nfs@({SHORT_NODE.pattern})")  # an NFS server on that node


def served_by(place: Any) -> str | None:
    """The node that serves a checkpoint place over NFS for the sweep (nfs@NODE), or None.

    >>> served_by("nfs@lab-n3"), served_by("/mnt/nfs"), served_by(None)
    ('lab-n3', None, None)
    """
    m = SERVED.fullmatch(place) if isinstance(place, str) else None
    return m.group(1) if m else None


def checkpoint_places(value: Any, what: str) -> list[str]:
    """Where checkpoints go, to sweep: nodes (each node's own disk), an absolute path every
    node sees (an NFS mount, a parallel file system) or nfs@NODE (an NFS server scalelab runs
    on that node for the sweep), comma-separated or a YAML list.

    >>> checkpoint_places("nodes,/mnt/nfs/ckpt/,nfs@lab-n3", "--checkpoint-to")
    ['nodes', '/mnt/nfs/ckpt', 'nfs@lab-n3']
    >>> checkpoint_places("/mnt/a b", "--checkpoint-to")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: --checkpoint-to: '/mnt/a b' must be nodes (each node's own disk), an absolute path every node sees, of letters, digits and ._/+=~- (e.g. /mnt/nfs/checkpoints), or nfs@NODE (an NFS server on that node of the cluster)
    """
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    out: list[str] = []
    for item in items:
        text = str(item).strip()
        if text != NODE_DISKS and not served_by(text):
            if (not PLACE_PATH.fullmatch(text) or ".." in text.split("/")
                    or text.rstrip("/") == ""):
                raise InputError(f"{what}: {text!r} must be {NODE_DISKS} (each node's own disk), "
                                 "an absolute path every node sees, of letters, digits and "
                                 "._/+=~- (e.g. /mnt/nfs/checkpoints), or nfs@NODE (an NFS "
                                 "server on that node of the cluster)")
            text = text.rstrip("/")
        if text not in out:
            out.append(text)
    return out


def accelerator(value: Any, what: str) -> str | None:
    text = str(value).strip()
    if text.lower() in ("none", "off"):
        return None
    if accel.is_path(text):
        # kept absolute in the sweep's plan, so a resume from elsewhere finds the same file
        text = str(Path(text).expanduser().resolve())
    try:
        accel.check_name(text)
    except InputError as exc:
        raise InputError(f"{what}: {exc}") from None
    return text


def dilation(value: Any, what: str) -> float | None:
    """A factor >= 1, or auto (None: the driver picks one per link rate)."""
    if str(value).strip().lower() == "auto":
        return None
    try:
        k = float(value)
    except (TypeError, ValueError):
        k = math.nan
    if not k >= 1 or math.isinf(k):
        raise InputError(f"{what}: {value!r} is not a dilation factor; give a number >= 1 "
                         "(waits k times longer, links k times slower) or auto")
    return k


def partition(value: Any, what: str) -> str:
    text = str(value).strip()
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,39}", text):
        raise InputError(f"{what}: {value!r} is not a Slurm partition name; give e.g. gpu")
    return text


def positive_list(value: Any, what: str, example: str) -> list[float]:
    """Numbers above 0, comma-separated or a YAML list, sorted and without repeats.

    >>> positive_list("50,10,25", "--bucket-cap-mb", "25,50")
    [10.0, 25.0, 50.0]
    >>> positive_list("0", "--bucket-cap-mb", "25,50")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: --bucket-cap-mb: '0' must be a number above 0; give e.g. 25,50
    """
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    out: set[float] = set()
    for item in items:
        try:
            x = float(item) if not isinstance(item, bool) else math.nan
        except (TypeError, ValueError):
            x = math.nan
        if not (math.isfinite(x) and x > 0):
            raise InputError(f"{what}: {str(item).strip()!r} must be a number above 0; give "
                             f"e.g. {example}")
        out.add(x)
    if not out:
        raise InputError(f"{what}: empty; give e.g. {example}")
    return sorted(out)


def choice_list(value: Any, what: str, allowed: Sequence[str]) -> list[str]:
    """Choices, comma-separated or a YAML list, in the order of allowed, without repeats."""
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    chosen = {choice(i, what, allowed) for i in items}
    return [c for c in allowed if c in chosen]


def strip_what(exc: InputError, what: str) -> str:
    return str(exc).removeprefix(f"{what}: ")




NO_FAILURE = "off"
MAX_KILLS = 20  # the most failures a run with a period (Ns) is given
_FAILURE = re.compile(r"(?:(?P<step>[1-9][0-9]{0,6})|(?P<every>[1-9][0-9]{0,5})s)"
                      r"(?:@(?P<node>[0-9]{1,4}))?")
_FAILURE_FORMS = ("must be off, a timed step (e.g. 12: one node's ranks killed after step 12, "
                  "the node at random), a period in seconds (e.g. 30s: a node's ranks killed "
                  "after 30 s of training on average, again and again, each time one at "
                  "random) or either with @K (K the run's node, 0 the first: e.g. 12@1)")


def failures(value: Any, what: str) -> list[str]:
    """Failures to inject, to sweep: off, STEP (one node's ranks killed after that timed step,
    the node drawn at random), Ns (a node's ranks killed after N seconds of training on
    average, at random, again and again, at most MAX_KILLS times) or either with @K (the
    run's K-th node, 0 the first), comma-separated or a YAML list.

    >>> failures("off,12, 12@1,30s", "--inject-failure"), failures([False, 12], "x")
    (['off', '12', '12@1', '30s'], ['off', '12'])
    >>> failures("12@n1", "--inject-failure")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: --inject-failure: '12@n1' must be off, a timed step (e.g. 12: one node's ranks killed after step 12, the node at random), a period in seconds (e.g. 30s: a node's ranks killed after 30 s of training on average, again and again, each time one at random) or either with @K (K the run's node, 0 the first: e.g. 12@1)
    """
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    out: list[str] = []
    for item in items:
        # YAML reads a bare off as false
        text = NO_FAILURE if item is False else str(item).strip()
        if text != NO_FAILURE and not _FAILURE.fullmatch(text):
            raise InputError(f"{what}: {text!r} {_FAILURE_FORMS}")
        if text not in out:
            out.append(text)
    return out


class Failure(NamedTuple):
    """A failures() value: after a timed step (step) or every_s seconds of training on average
    (at random, again and again), on the run's node-th node (None: at random)."""

    step: int | None
    every_s: float | None
    node: int | None


def failure(value: str | None) -> Failure | None:
    """A failures() value as a Failure; None for off.

    >>> failure("12@1"), failure("30s").every_s, failure("off"), failure(None)
    (Failure(step=12, every_s=None, node=1), 30.0, None, None)
    """
    if not value or value == NO_FAILURE:
        return None
    m = _FAILURE.fullmatch(value)
    if m is None:
        raise InputError(f"{value!r} is not a failure to inject")
    return Failure(int(m["step"]) if m["step"] else None,
                   float(m["every"]) if m["every"] else None,
                   None if m["node"] is None else int(m["node"]))
