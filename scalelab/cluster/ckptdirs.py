"""A run's checkpoint directory, kept in the cluster record while the run may write it, so
that what a killed sweep left on the nodes is removed after all.

The driver records the directory (and the nodes it is on) before the run starts and forgets
it once the run's checkpoints are removed (or kept, when asked). An entry still recorded
belongs to a sweep that was killed: the next sweep on the cluster removes it before its
first run, and invoke destroy removes it on hosts scalelab did not create (those it made go
with their disks). What is read back from the record is checked before it reaches a shell
line: a plain absolute path under a checkpoint root of scalelab's own name, on nodes of the
cluster.
"""

from __future__ import annotations

import logging
import re
import shlex
from typing import Any

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node, nodes_of
from scalelab.core.errors import ClusterError
from scalelab.core.state import save_cluster

log = logging.getLogger(__name__)

KEY = "checkpoint_dirs"
ROOTS = ("checkpoints", "scalelab-checkpoints")  # <workdir>/checkpoints, <path>/scalelab-...
_PATH = re.compile(r"/[A-Za-z0-9._/+=~-]*")
_NAME = re.compile(r"[A-Za-z0-9._-]+")


def removal_line(where: str, root: str) -> str:
    """The shell line that removes a run's directory, then its parents while empty, up to and
    with the checkpoints' root (never what is above it).

    >>> removal_line("/w/checkpoints/s1/r1", "/w/checkpoints")
    'rm -rf -- /w/checkpoints/s1/r1; rmdir -- /w/checkpoints/s1 /w/checkpoints 2>/dev/null; true'
    """
    parents, up = [], where.rsplit("/", 1)[0]
    while up.startswith(root):
        parents.append(up)
        up = up.rsplit("/", 1)[0]
    return (f"rm -rf -- {shlex.quote(where)}; rmdir -- "
            f"{' '.join(shlex.quote(p) for p in parents)} 2>/dev/null; true")


def problem(entry: dict[str, Any], names: set[str]) -> str:
    """Why a recorded entry is not one scalelab made ("" when it is).

    >>> ok = {"dir": "/opt/scalelab/checkpoints/s1/r1", "root": "/opt/scalelab/checkpoints",
    ...       "nodes": ["n0"]}
    >>> problem(ok, {"n0"}), problem({**ok, "dir": "/etc"}, {"n0"})
    ('', "'/etc' is not a run's directory under /opt/scalelab/checkpoints")
    >>> problem({**ok, "root": "/etc"}, {"n0"}), problem({**ok, "nodes": ["x"]}, {"n0"})
    ("'/etc' is no checkpoint root of scalelab's", 'node x is not in the cluster')
    >>> problem({**ok, "dir": "/opt/scalelab/checkpoints/s1/.."}, {"n0"})
    "'/opt/scalelab/checkpoints/s1/..' is not a run's directory under /opt/scalelab/checkpoints"
    """
    where, root = str(entry.get("dir") or ""), str(entry.get("root") or "")
    if not _PATH.fullmatch(root) or root.rsplit("/", 1)[-1] not in ROOTS or \
            ".." in root.split("/"):
        return f"{root!r} is no checkpoint root of scalelab's"
    rest = where[len(root) + 1:].split("/") if where.startswith(root + "/") else []
    if not _PATH.fullmatch(where) or not 2 <= len(rest) <= 3 or \
            not all(_NAME.fullmatch(p) and p not in (".", "..") for p in rest):
        return f"{where!r} is not a run's directory under {root}"
    bad = [n for n in entry.get("nodes") or [] if n not in names]
    if bad or not entry.get("nodes"):
        return f"node {bad[0] if bad else '(none)'} is not in the cluster"
    return ""


def remember(cluster: str, rec: dict[str, Any], where: str, root: str,
             nodes: list[Node]) -> None:
    """Record a run's directory before the run may write it (saved)."""
    entry = {"dir": where, "root": root, "nodes": [n.name for n in nodes]}
    why = problem(entry, {n.name for n in nodes_of(rec)})
    if why:
        raise ClusterError(f"checkpoint directory {where}: {why}")
    rec[KEY] = [e for e in rec.get(KEY) or [] if e.get("dir") != where] + [entry]
    save_cluster(cluster, rec)


def forget(cluster: str, rec: dict[str, Any], where: str) -> None:
    """Take a run's directory out of the record (saved): removed, or kept as asked."""
    left = [e for e in rec.get(KEY) or [] if e.get("dir") != where]
    if left != (rec.get(KEY) or []):
        rec[KEY] = left
        if not left:
            rec.pop(KEY)
        save_cluster(cluster, rec)


def remove_left(cluster: str, rec: dict[str, Any]) -> list[str]:
    """Remove every recorded directory (a killed sweep's) from its nodes and the record
    (logged); what stays, one line each: an entry that is not scalelab's, dropped from the
    record unremoved, or one a node could not remove, kept in the record (a later sweep or
    destroy tries again)."""
    nodes = {n.name: n for n in nodes_of(rec)}
    said, stays = [], []
    for entry in list(rec.get(KEY) or []):
        why = problem(entry, set(nodes))
        if why:
            stays.append(f"a checkpoint directory recorded by a killed sweep, not removed: "
                         f"{why}")
            forget(cluster, rec, entry.get("dir"))
            continue
        on = [nodes[n] for n in entry["nodes"]]
        line = removal_line(entry["dir"], entry["root"])
        _, errors = ssh.on_each(on, lambda n, line=line: ssh.run(
            n, rec["known_hosts"], line, timeout=120).returncode)
        if errors:
            node, err = next(iter(errors.items()))
            stays.append(f"checkpoints left by a killed sweep at {entry['dir']} on {node}: "
                         f"{err}")
            continue
        forget(cluster, rec, entry["dir"])
        said.append(f"checkpoints left by a killed sweep removed: {entry['dir']} on "
                    f"{', '.join(entry['nodes'])}")
    for line in said:
        log.info("%s: %s", cluster, line)
    for line in stays:
        log.warning("%s: %s", cluster, line)
    return stays
