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
from scalelab.core.errors import ClusterError, ScalelabError
from scalelab.core.state import save_cluster
from scalelab.core.validate import PLACE_PATH

log = logging.getLogger(__name__)

KEY = "checkpoint_dirs"
SHARED = "scalelab-checkpoints"  # a shared place's root (run.checkpoints.SHARED_ROOT)
SEGMENT = re.compile(r"[A-Za-z0-9._-]+")  # a cluster, sweep or run id: one path segment


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


def problem(entry: Any, names: set[str], cluster: str, workdir: str | None) -> str:
    """Why a recorded entry is not one scalelab made ("" when it is): a run's directory under
    the workdir's checkpoints (<workdir>/checkpoints/<sweep>/<run>) or under a shared place's
    (<path>/scalelab-checkpoints/<cluster>/<sweep>/<run>), on nodes of the cluster.

    >>> ok = {"dir": "/opt/scalelab/checkpoints/s1/r1", "root": "/opt/scalelab/checkpoints",
    ...       "nodes": ["n0"]}
    >>> problem(ok, {"n0"}, "c1", "/opt/scalelab"), problem(ok, {"n0"}, "c1", "/w")
    ('', "'/opt/scalelab/checkpoints' is no checkpoint root of scalelab's")
    >>> problem({**ok, "dir": "/etc"}, {"n0"}, "c1", "/opt/scalelab")
    "'/etc' is not a run's directory under /opt/scalelab/checkpoints"
    >>> problem({**ok, "nodes": ["x"]}, {"n0"}, "c1", "/opt/scalelab")
    'node x is not in the cluster'
    >>> problem({**ok, "dir": "/opt/scalelab/checkpoints/s1/.."}, {"n0"}, "c1", "/opt/scalelab")
    "'/opt/scalelab/checkpoints/s1/..' is not a run's directory under /opt/scalelab/checkpoints"
    >>> shared = {"dir": "/mnt/s/scalelab-checkpoints/c1/s1/r1", "nodes": ["n0"],
    ...           "root": "/mnt/s/scalelab-checkpoints"}
    >>> problem(shared, {"n0"}, "c1", None), problem(shared, {"n0"}, "c2", None)
    ('', "'/mnt/s/scalelab-checkpoints/c1/s1/r1' is not a run's directory under /mnt/s/scalelab-checkpoints")
    >>> problem("x", {"n0"}, "c1", None)
    'not an entry of checkpoint_dirs'
    """
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str)
                                              for k in ("dir", "root")) \
            or not isinstance(entry.get("nodes"), list) \
            or not all(isinstance(n, str) for n in entry["nodes"]):
        return f"not an entry of {KEY}"
    where, root = entry["dir"], entry["root"]
    on_disks = workdir is not None and root == f"{workdir}/checkpoints"
    if not PLACE_PATH.fullmatch(root) or ".." in root.split("/") or not (
            on_disks or root.endswith(f"/{SHARED}")):
        return f"{root!r} is no checkpoint root of scalelab's"
    rest = where[len(root) + 1:].split("/") if where.startswith(root + "/") else []
    if not PLACE_PATH.fullmatch(where) or len(rest) != (2 if on_disks else 3) or \
            not all(SEGMENT.fullmatch(p) and p not in (".", "..") for p in rest) or \
            (not on_disks and rest[0] != cluster):
        return f"{where!r} is not a run's directory under {root}"
    bad = [n for n in entry["nodes"] if n not in names]
    if bad or not entry["nodes"]:
        return f"node {bad[0] if bad else '(none)'} is not in the cluster"
    return ""


def _entries(rec: dict[str, Any]) -> list[Any]:
    entries = rec.get(KEY)
    return list(entries) if isinstance(entries, list) else []


def _at(entry: Any, where: str) -> bool:
    return isinstance(entry, dict) and entry.get("dir") == where


def _store(cluster: str, rec: dict[str, Any], entries: list[Any]) -> None:
    """The record's entries set to these (none: the key gone), saved."""
    rec[KEY] = entries
    if not entries:
        rec.pop(KEY)
    save_cluster(cluster, rec)


def _removers(rec: dict[str, Any], entry: Any) -> dict[str, Node]:
    """Where a recorded directory may be removed from, by name: the cluster's nodes and, for a
    shared place's, the host Slurm commands run on (a login host of its own, on a cluster
    reached only through it)."""
    from scalelab.cluster import targets  # the target says which host that is

    found = {n.name: n for n in nodes_of(rec)}
    root = entry.get("root") if isinstance(entry, dict) else None
    if not (isinstance(root, str) and root.endswith(f"/{SHARED}")):
        return found
    try:
        login = targets.of(rec).login(rec)
    except (ScalelabError, KeyError, IndexError):  # no login host recorded
        return found
    return {**found, login.name: login}


def remember(cluster: str, rec: dict[str, Any], where: str, root: str, workdir: str,
             nodes: list[Node]) -> None:
    """Record a run's directory before the run may write it (saved)."""
    entry = {"dir": where, "root": root, "nodes": [n.name for n in nodes]}
    why = problem(entry, set(_removers(rec, entry)), cluster, workdir)
    if why:
        raise ClusterError(f"checkpoint directory {where}: {why}")
    _store(cluster, rec, [e for e in _entries(rec) if not _at(e, where)] + [entry])


def forget(cluster: str, rec: dict[str, Any], where: str) -> None:
    """Take a run's directory out of the record (saved): removed, or kept as asked."""
    left = [e for e in _entries(rec) if not _at(e, where)]
    if KEY in rec and left != rec[KEY]:
        _store(cluster, rec, left)


def remove_left(cluster: str, rec: dict[str, Any], workdir: str | None) -> list[str]:
    """Remove every recorded directory (a killed sweep's) from its nodes and the record
    (logged); what stays, one line each: an entry that is not scalelab's, dropped from the
    record unremoved, or one a node could not remove, kept in the record (for the next
    sweep; destroy says it and lets the record go). workdir: scalelab's on the nodes (None:
    not known, and no node-disk entry is removed)."""
    said, stays = [], []
    if KEY in rec and not isinstance(rec[KEY], list):
        stays.append(f"{KEY} in the record is not a list of directories; dropped unread")
        _store(cluster, rec, [])
    for entry in _entries(rec):
        nodes = _removers(rec, entry)
        why = problem(entry, set(nodes), cluster, workdir)
        if why:
            stays.append(f"a checkpoint directory recorded by a killed sweep, not removed: "
                         f"{why}")
            _store(cluster, rec, [e for e in _entries(rec) if e is not entry])
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
