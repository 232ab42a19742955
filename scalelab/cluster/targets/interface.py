"""What every target implements and what it declares: the interface the targets import.

scalelab.cluster.targets routes a cluster to its target; the target modules import only this
module, so routing and the targets never import each other in a circle.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from scalelab.cluster.nodes import Node, nodes_of
from scalelab.core.errors import ClusterError

TARGETS = ("local", "static", "openstack", "aws", "slurm")
DEFAULT_TARGET = TARGETS[0]  # an emulated cluster on this machine: needs nothing but Linux
TERRAFORM_TARGETS = ("static", "openstack", "aws")


@dataclass(frozen=True)
class Runtime:
    """Where the training stack lives on a cluster's nodes."""

    python: str  # interpreter on the nodes, e.g. /opt/scalelab/venv/bin/python
    workdir: str  # directory holding bench/workloads on the nodes
    known_hosts: str  # pinned host keys, on the controller


@dataclass(frozen=True)
class Capabilities:
    """What a cluster's nodes can do: the one thing the rest of scalelab asks of a target.

    Written into the cluster record (``capabilities``) and the inventory (one
    ``scalelab_cap_<name>`` variable each), where the roles, the driver, launch and the
    analysis read them. A new kind of host (a container, a node with systemd but no internet)
    is a new set of flags, not a new branch in every role. Per-node facts (GPUs, RDMA
    devices, what torch and Horovod can do) are found by configure, not declared here.

    >>> Capabilities().as_vars()["scalelab_cap_systemd"]
    True
    """

    configurable: bool = True  # scalelab may run Ansible on the nodes (invoke configure)
    # the controller's venv and checkout are visible on the nodes at the same paths, so the
    # stack is verified, never installed
    stack_from_host: bool = False
    packages_from_host: bool = False  # Debian packages are the host's: checked, never apt-installed
    package_index: bool = True  # nodes can reach a package index (pip retries are worth it)
    systemd: bool = True  # services may be systemd units (else start-stop-daemon and a pid file)
    own_clock: bool = True  # nodes keep their own clock, so time sync applies
    kernel_nfs: bool = True  # a kernel NFS client and server can run (else NFS-Ganesha, nfs-ls)
    exportable_root: bool = True  # the root file system gives out NFS file handles
    ephemeral: bool = False  # nodes live only as long as their cluster (no NFS grace period)
    containers: bool = True  # a Docker engine can run on the nodes
    shares_host_cpus: bool = False  # nodes share this machine's cores (emulated nodes)
    shape_links: bool = False  # link rates can be set on the nodes' cluster interface
    # each node's loopback is its own (a network namespace), so the path between the ranks
    # of one node can be shaped there (--intra-link) without touching a real host's
    own_loopback: bool = False
    # links can carry an added per-hop delay (tc netem, where the host's kernel has it), so an
    # emulated fabric's latency is emulated as well as modelled
    hop_delay: bool = False
    ssh_nodes: bool = True  # the controller reaches every node over SSH (else only a login host)
    # scalelab made the hosts and destroy removes them whole; otherwise destroy takes back
    # what configure added to the hosts' shared files (keys, ssh config, /etc/hosts)
    owns_hosts: bool = True

    def as_vars(self) -> dict[str, bool]:
        """The inventory's ``scalelab_cap_*`` variables."""
        return {f"scalelab_cap_{k}": bool(v) for k, v in dataclasses.asdict(self).items()}

    def to_dict(self) -> dict[str, bool]:
        return dataclasses.asdict(self)


@runtime_checkable
class Links(Protocol):
    """Link-rate control of one cluster, as the sweep driver uses it.

    snapshot() is taken before the first change and is JSON-able, so a driver killed outright
    can leave it in a file and a later one restore() from it.
    """

    def snapshot(self) -> Any:
        """What the links are now, enough to put them back exactly."""

    def apply(self, mbit: float | None, delay_us: float = 0.0) -> None:
        """Put one rate (Mbit/s; None: unshaped) on every node's cluster link; delay_us: a
        per-hop delay under it (Capabilities.hop_delay)."""

    def apply_intra(self, mbit: float | None) -> None:
        """Put one rate (Mbit/s; None: unshaped) on the path between the ranks of each node,
        on clusters whose nodes have a loopback of their own (Capabilities.own_loopback)."""

    def restore(self, snapshot: Any) -> None:
        """Put the links back as snapshot() found them (the intra-node path unshaped)."""

    def still_as_left(self, mbit: float | None) -> bool:
        """Whether the links may still be at the rate a killed driver left (not reset by hand)."""


@runtime_checkable
class Target(Protocol):
    """What a target does for the rest of scalelab."""

    name: str

    def capabilities(self, rec: dict[str, Any]) -> Capabilities:
        """What this cluster's nodes can do (shape_links may depend on configure's facts)."""

    def dry_run(self, cluster: str, nodes: int | str, **options: Any) -> list[str]:
        """`invoke provision --dry-run`: what provision would do, changing nothing; InputError
        where a target has nothing worth previewing."""

    def provision(self, cluster: str, nodes: int | str, **options: Any) -> list[Node] | None:
        """Create or resize a cluster; write cluster.json and the inventory."""

    def destroy(self, cluster: str) -> None:
        """Remove the cluster and everything scalelab made for it."""

    def alive(self, cluster: str, nodes: list[Node]) -> list[bool]:
        """Whether each node answers, without running anything on it."""

    def summary(self, rec: dict[str, Any]) -> dict[str, str]:
        """What `invoke status` shows beside the nodes (link rate, CPU share)."""

    def adjust_facts(self, rec: dict[str, Any], node: dict[str, Any],
                     facts: dict[str, Any]) -> dict[str, Any]:
        """Facts configure found on a node, corrected by what the target knows better."""

    def runtime(self, rec: dict[str, Any]) -> Runtime:
        """Interpreter and workload directory on the nodes."""

    def links(self, cluster: str, rec: dict[str, Any], nodes: list[Node]) -> Links:
        """Link-rate control for the sweep driver."""

    def set_rate(self, cluster: str, mbit: float | None) -> None:
        """`invoke shape`: change the cluster's standing link rate."""

    def login(self, rec: dict[str, Any]) -> Node:
        """Where Slurm commands run for --launcher slurm (the head node, or a login host)."""

    def launchers(self, rec: dict[str, Any]) -> tuple[str, ...]:
        """How runs may start on this cluster, the default first: ssh and/or slurm."""

    def default_partition(self, rec: dict[str, Any]) -> str | None:
        """The Slurm partition runs go to when the sweep names none (None: Slurm's default)."""


class SshReachable:
    """What every target whose nodes scalelab reaches over SSH shares: the head node is where
    Slurm commands run, and runs start over SSH unless --launcher slurm is asked for."""

    def login(self, rec: dict[str, Any]) -> Node:
        return nodes_of(rec)[0]

    def launchers(self, rec: dict[str, Any]) -> tuple[str, ...]:
        return ("ssh", "slurm")

    def default_partition(self, rec: dict[str, Any]) -> str | None:
        return None


def runtime_from_facts(rec: dict[str, Any]) -> Runtime:
    """The runtime configure recorded on the head node (the same paths on every node).

    >>> runtime_from_facts({"known_hosts": "/kh", "name": "lab", "nodes": [{"name": "h",
    ...     "facts": {"python": "/opt/scalelab/venv/bin/python", "workdir": "/opt/scalelab"}}]})
    Runtime(python='/opt/scalelab/venv/bin/python', workdir='/opt/scalelab', known_hosts='/kh')
    """
    nodes = rec.get("nodes") or []
    facts = (nodes[0].get("facts") or {}) if nodes else {}
    if not facts.get("python") or not facts.get("workdir"):
        name = rec.get("name", "NAME")
        raise ClusterError(f"cluster {name} has not been configured (no training stack "
                           f"recorded on its nodes); run invoke configure --cluster {name}")
    return Runtime(facts["python"], facts["workdir"], rec["known_hosts"])
