"""A Slurm controller reached through its login host: the tools it must answer with, its
partitions (sinfo), and the check made before any job. The Slurm target provisions with it,
and the Slurm launcher (run/slurm.py) checks and asks with it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node
from scalelab.core.errors import ClusterError, InputError, ScalelabError

TOOLS = ("srun", "salloc", "sinfo", "sacct", "scancel", "scontrol")
# what to do when Slurm on a login host scalelab does not configure is missing or silent
ADMIN_FIX = ("scalelab needs srun, salloc, sinfo, sacct, scancel and scontrol answering on the "
             "login host, with accounting (sacct); ask the cluster's admins")


@dataclass(frozen=True)
class Partition:
    """A partition as sinfo lists it on the login host."""

    name: str
    nodes: tuple[str, ...]
    default: bool = False
    available: str = "up"
    cpus: tuple[int | None, ...] = ()  # each node's CPUs as Slurm counts them (None: unread)


def login_run(login: Node, known_hosts: str, line: str, timeout: float = 30):
    """A shell line on the login host, its exit code left to the caller; ClusterError (one
    line) when SSH itself cannot get there."""
    try:
        return ssh.run(login, known_hosts, line, timeout=timeout, check=False)
    except ScalelabError as exc:
        raise ClusterError(f"login host {login.address} does not answer SSH ({exc}); check "
                           "its address, user, key and pinned host key") from None


SINFO = "sinfo --noheader --Node --format '%P|%N|%a|%c'"


def parse_sinfo(text: str) -> list[Partition]:
    """Partitions from SINFO (one line per node and partition; the default partition's name
    ends in '*'; the last column the node's CPUs).

    >>> ps = parse_sinfo("scalelab*|lab-n0|up|1\\nscalelab*|lab-n1|up|4\\nsmall|lab-n0|up|1\\n")
    >>> [(p.name, p.nodes, p.default, p.cpus) for p in ps]
    [('scalelab', ('lab-n0', 'lab-n1'), True, (1, 4)), ('small', ('lab-n0',), False, (1,))]
    """
    parts: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        cols = line.strip().split("|")
        if len(cols) < 3 or not cols[0]:
            continue
        name, default = cols[0].rstrip("*"), cols[0].endswith("*")
        p = parts.setdefault(name, {"nodes": [], "default": default, "available": cols[2],
                                    "cpus": []})
        if cols[1] not in p["nodes"]:
            p["nodes"].append(cols[1])
            cpus = cols[3].strip() if len(cols) > 3 else ""
            p["cpus"].append(int(cpus) if cpus.isdigit() else None)
    return [Partition(k, tuple(v["nodes"]), v["default"], v["available"], tuple(v["cpus"]))
            for k, v in parts.items()]


def over_cpus(part: Partition, tasks: dict[str, int]) -> tuple[str, int, int] | None:
    """The first node asked to start more tasks than Slurm counts CPUs on it: (node, tasks,
    CPUs); None where all fit. Slurm 22.05 starts no more, --overcommit or not.

    >>> over_cpus(Partition("p", ("a", "b"), cpus=(2, 1)), {"a": 2, "b": 2})
    ('b', 2, 1)
    >>> over_cpus(Partition("p", ("a",), cpus=(None,)), {"a": 8}) is None
    True
    """
    cpus = dict(zip(part.nodes, part.cpus, strict=False))
    for name, want in tasks.items():
        have = cpus.get(name)
        if have is not None and want > have:
            return name, want, have
    return None


def check(cluster: str, login: Node, known_hosts: str, partition: str | None,
          node_names: list[str], fix: str = "",
          tasks: dict[str, tuple[int, str]] | None = None) -> Partition:
    """Before any job: Slurm answers on the login host, with accounting; the partition exists
    and holds every node the sweep needs, each with a CPU for every task a run starts there
    (tasks: node name -> the most tasks, and why). One line naming the fix otherwise (fix:
    what to do when Slurm is missing or silent; by default, set it up with the slurm role)."""
    fix = fix or (f"set it up with invoke configure --cluster {cluster} --tags slurm, or use "
                  "--launcher ssh")
    tools = " ".join(TOOLS)
    proc = login_run(login, known_hosts,
                      f"for t in {tools}; do command -v $t >/dev/null || echo missing $t; done; "
                      + SINFO)
    missing = re.findall(r"^missing (\S+)$", proc.stdout, re.MULTILINE)
    if missing:
        raise ClusterError(f"no Slurm on the login host {login.name} of cluster {cluster} "
                           f"({', '.join(missing)} not found); {fix}")
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise ClusterError(f"Slurm on {login.name} does not answer: sinfo: {why[:200]}; is "
                           f"slurmctld running? ({fix})")
    parts = parse_sinfo(proc.stdout)
    if not parts:
        raise ClusterError(f"Slurm on {login.name} lists no partition ({fix})")
    if partition:
        found = [p for p in parts if p.name == partition]
        if not found:
            raise InputError(f"partition {partition!r} is not on cluster {cluster}'s Slurm; "
                             f"it has {', '.join(p.name for p in parts)}")
        part = found[0]
    else:
        part = next((p for p in parts if p.default), parts[0])
    if part.available != "up":
        raise ClusterError(f"partition {part.name} is {part.available}; bring it up with "
                           f"scontrol update PartitionName={part.name} State=UP")
    outside = [n for n in node_names if n not in part.nodes]
    if len(node_names) > len(part.nodes) or outside:
        raise InputError(f"the sweep needs {len(node_names)} nodes ({', '.join(node_names)}) "
                         f"but partition {part.name} has {len(part.nodes)} "
                         f"({', '.join(part.nodes) or 'none'}); lower --nodes or pick another "
                         f"--partition")
    over = over_cpus(part, {n: t for n, (t, _why) in (tasks or {}).items()})
    if over:
        name, want, have = over
        raise InputError(f"--launcher slurm: Slurm starts no more tasks on a node than its "
                         f"CPUs, and node {name} has {have}; {(tasks or {})[name][1]} starts "
                         f"{want} there; lower --procs-per-node (a colocated parameter server takes "
                         "a CPU too), or use --launcher ssh")
    proc = login_run(login, known_hosts, "sacct --noheader --allocations --starttime now "
                                          "--format JobID")
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise ClusterError(f"sacct does not answer on {login.name} ({why[:200]}); scalelab "
                           f"reads each run's state from Slurm's accounting ({fix})")
    return part
