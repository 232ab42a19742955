"""Where a run's checkpoints go on the nodes, whether the nodes can write there, and their removal.

A run with --checkpoint-every writes its checkpoints (bench/workloads/ckpt.py) into a directory
of its own, named by the cluster, the sweep and the run:

* nodes: ``<workdir>/checkpoints/<sweep>/<run>`` on every node's own disk (the workdir is
  scalelab's, and destroy removes it with the rest);
* a path every node sees: ``<path>/scalelab-checkpoints/<cluster>/<sweep>/<run>``;
* nfs@NODE: ``nfs://<its address><export>/scalelab-checkpoints/<cluster>/<sweep>/<run>`` on
  the NFS server scalelab runs on that node for the sweep (scalelab.cluster.ckptstore).

After the run the directory is removed on every node (nodes), from the first node (a shared
path) or on the serving node (nfs@NODE), with the directories above it up to
``scalelab-checkpoints`` where they are left empty,
unless the sweep keeps its checkpoints. While the run may write it, a nodes or shared
directory is in the cluster record (scalelab.cluster.ckptdirs), so that a killed sweep's is
removed by the next sweep or by destroy. Before any run, the first node makes a directory in a
shared place and every other node writes in it (place_problem), so that a place the nodes
cannot write, or do not share, is refused in one line, not found out run by run.
"""

from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass
from typing import Any

from scalelab.cluster import ckptdirs, ssh
from scalelab.cluster.nodes import Node
from scalelab.core.validate import PLACE_PATH
from scalelab.sweep.values import NODE_DISKS, served_by

SHARED_ROOT = ckptdirs.SHARED


def shared(params: dict[str, Any]) -> bool:
    """Whether the run's checkpoints go to a path every node sees (else each node's disk)."""
    return params.get("checkpoint_to") not in (None, NODE_DISKS)


def root_of(params: dict[str, Any], workdir: str, store: Any = None) -> str:
    """Where the checkpoints' own directories start, on the node that removes them."""
    if served_by(params.get("checkpoint_to")):
        if store is None:
            raise ValueError(f"{params['checkpoint_to']}: its server was not started")
        return f"{store.export}/{SHARED_ROOT}"
    return (f"{params['checkpoint_to']}/{SHARED_ROOT}" if shared(params)
            else f"{workdir}/checkpoints")


def run_dir(params: dict[str, Any], workdir: str, cluster: str, sweep: str, run_id: str,
            store: Any = None) -> str:
    """The run's checkpoint directory, as the ranks name it (store: the sweep's
    ckptstore.Store for an nfs@NODE place).

    >>> run_dir({"checkpoint_to": "nodes"}, "/w", "c1", "s1", "r1")
    '/w/checkpoints/s1/r1'
    >>> run_dir({"checkpoint_to": "/mnt/nfs"}, "/w", "c1", "s1", "r1")
    '/mnt/nfs/scalelab-checkpoints/c1/s1/r1'
    >>> from scalelab.cluster.ckptstore import Store
    >>> run_dir({"checkpoint_to": "nfs@n3"}, "/w", "c1", "s1", "r1", Store("n3", "10.0.0.3", "/w/ckpt-nfs"))
    'nfs://10.0.0.3/w/ckpt-nfs/scalelab-checkpoints/c1/s1/r1'
    >>> run_dir({"checkpoint_to": "/mnt/nfs"}, "/w", "c1", "s1", "r 1")
    Traceback (most recent call last):
    ...
    ValueError: a checkpoint directory of unexpected characters: 'r 1'
    """
    for part in (cluster, sweep, run_id):
        if not ckptdirs.SEGMENT.fullmatch(part) or part in (".", ".."):
            raise ValueError(f"a checkpoint directory of unexpected characters: {part!r}")
    root = root_of(params, workdir, store)
    where = f"{root}/{cluster}/{sweep}/{run_id}" if shared(params) else f"{root}/{sweep}/{run_id}"
    if not PLACE_PATH.fullmatch(where) or ".." in where.split("/"):
        raise ValueError(f"a checkpoint directory of unexpected characters: {where!r}")
    return f"nfs://{store.address}{where}" if served_by(params.get("checkpoint_to")) else where


def remember(cluster: str, rec: dict[str, Any], where: str, params: dict[str, Any],
             workdir: str, nodes: list[Node], remover: Node | None = None) -> None:
    """Record a run's directory while the run may write it (ckptdirs), unless the sweep keeps
    its checkpoints or an nfs@NODE server holds them (the server's end removes those);
    remover: who removes a shared one (the login host of a cluster whose nodes scalelab does
    not reach over SSH; by default the first node)."""
    if params.get("keep_checkpoints") or served_by(params.get("checkpoint_to")):
        return
    ckptdirs.remember(cluster, rec, where, root_of(params, workdir), workdir,
                      [remover or nodes[0]] if shared(params) else nodes)


def removal_line(where: str, params: dict[str, Any], workdir: str, store: Any = None) -> str:
    """The shell line that removes a run's directory, then its parents while empty, up to the
    checkpoints' own root (never the user's path itself); an nfs:// directory on its server.

    >>> removal_line("/mnt/n/scalelab-checkpoints/c1/s1/r1", {"checkpoint_to": "/mnt/n"}, "/w")
    'rm -rf -- /mnt/n/scalelab-checkpoints/c1/s1/r1; rmdir -- /mnt/n/scalelab-checkpoints/c1/s1 /mnt/n/scalelab-checkpoints/c1 /mnt/n/scalelab-checkpoints 2>/dev/null; true'
    """
    if where.startswith("nfs://"):
        where = "/" + where.removeprefix("nfs://").split("/", 1)[1]
    return ckptdirs.removal_line(where, root_of(params, workdir, store))


def remove(nodes: list[Node], known_hosts: str, where: str, params: dict[str, Any],
           workdir: str, store: Any = None, remover: Node | None = None) -> dict[str, str]:
    """Remove a run's checkpoints: every node's own copy, or the one of a shared place or of
    an nfs@NODE server, once, from remover (the server, or a login host; by default the first
    node); the nodes that could not, and why."""
    line = removal_line(where, params, workdir, store)
    on = nodes if not (shared(params) or remover) else [remover or nodes[0]]
    _, errors = ssh.on_each(on, lambda n: ssh.run(n, known_hosts, line, timeout=120).returncode)
    return errors


def said(proc: Any) -> str:
    """What a check's command said last (its exit code when nothing)."""
    lines = [x for x in (proc.stdout + proc.stderr).strip().splitlines() if x.strip()]
    return lines[-1][:200] if lines else f"exit {proc.returncode}"


@dataclass(frozen=True)
class Probe:
    """The directory a place's check makes in it (place checked first: plain, absolute), and
    the shell lines of the check: make it, write in it as node, remove it."""

    place: str
    path: str  # shell-quoted

    @classmethod
    def of(cls, place: str) -> Probe | None:
        if not PLACE_PATH.fullmatch(place) or ".." in place.split("/"):
            return None
        return cls(place, shlex.quote(f"{place}/.scalelab-write-{secrets.token_hex(6)}"))

    def make(self) -> str:
        return (f"test -d {shlex.quote(self.place)} || {{ echo 'no such directory'; exit 3; }}; "
                f"mkdir -- {self.path}")

    def write(self, node: str, maker: str, say: str = "") -> str:
        """Write in the probe as node (a shell word: a quoted name, or "$n"); what it says on
        a failure starts with say."""
        mine = f"{self.path}/{node}"
        return (f"test -d {self.path} || {{ echo \"{say}it does not see what {maker} wrote "
                f"there: not a directory the nodes share\"; exit 3; }}; "
                f"mkdir -- {mine} && rmdir -- {mine} || "
                f"{{ echo \"{say}it cannot write there\"; exit 3; }}")

    def remove(self) -> str:
        return f"rm -rf -- {self.path}"


def place_problem(nodes: list[Node], known_hosts: str, place: str) -> tuple[str, str] | None:
    """(node, why) for the first node that cannot write in place, or that does not see there
    what the first node wrote (place is then no directory the nodes share); None if all can.
    The first node makes a directory of its own name there, every other node writes in it, and
    the first removes it again, also on a failure."""
    probe = Probe.of(place)
    if probe is None or not nodes:
        return (nodes[0].name if nodes else ""), f"{place!r} is not a plain absolute path"
    first, rest = nodes[0], nodes[1:]
    made = ssh.run(first, known_hosts, probe.make(), timeout=60, check=False)
    if made.returncode != 0:
        return first.name, said(made)
    try:
        def one(node: Node) -> str:
            proc = ssh.run(node, known_hosts, probe.write(shlex.quote(node.name), first.name),
                           timeout=60, check=False)
            return "" if proc.returncode == 0 else said(proc)

        return ssh.first_problem(rest, one)
    finally:
        ssh.run(first, known_hosts, probe.remove(), timeout=60, check=False)
