"""Node records: the one shape every target produces and every later stage reads.

The Terraform outputs contract (``nodes``: name -> {public_ip, private_ip, role, gpus,
ssh_user}, plus ``ssh_user`` and ``bastion_ip``) maps onto these records one to one.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from scalelab.core import validate
from scalelab.core.errors import ClusterError, InputError, ScalelabError
from scalelab.core.state import cluster_dir

ROLES = ("head", "worker")
# what a Node built from unchecked values is told (the var-file and record boundaries say
# more: which file, which entry)
NODE_FIX = "fix it where it came from (the var-file, or what the target reported)"


@dataclass(frozen=True)
class Node:
    """One machine of a cluster, as the controller reaches it."""

    name: str
    address: str  # where the controller's SSH goes (public or bastion-reachable)
    private_address: str  # cluster network address, used by the ranks
    role: str  # head | worker
    target: str
    ssh_user: str = "root"
    ssh_port: int = 22
    ssh_key: str = ""  # path of the private key on the controller
    cpus: float = 0.0  # CPU share (local) or cores (real hosts); 0 = unknown
    gpus: int = 0
    iface: str = ""  # cluster-network interface on the node, e.g. eth0; "" = let the stack pick
    bastion: str = ""  # user@host[:port] every SSH to the node goes through; "" = direct
    extra: dict[str, Any] = field(default_factory=dict)
    # what configure found on the node (scalelab.cluster.facts): cores, memory_mb, gpus, gpu_model,
    # iface, python, workdir; empty until the cluster is configured
    facts: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InputError(f"node {self.name}: role {self.role!r} must be head or worker")
        # no Node exists whose user, address, name, port, key, interface or bastion could be
        # read as an ssh option or change a shell line (scalelab.core.validate)
        validate.node_fields(self, "", NODE_FIX)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "") -> Node:
        """A Node read back from a record on disk (where: the record's path). A value that
        scalelab would not have written there is refused with the record named.

        >>> Node.from_dict({"name": "n0", "address": "10.0.0.1", "private_address": "10.0.0.1",
        ...                 "role": "head", "target": "static", "ssh_user": "-oProxyCommand=x"},
        ...                "/s/clusters/lab/cluster.json")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        scalelab.core.errors.ClusterError: /s/clusters/lab/cluster.json: node 'n0': ssh_user '-oProxyCommand=x' is not a user name (it starts with '-', ...); ...
        """
        if not isinstance(data, dict):
            raise ClusterError(f"{where or 'a record'}: a node is not a JSON object; put back the "
                               "record scalelab wrote")
        validate.node_fields(data, where or "a node record",
                             "scalelab did not write that value: put back what the var-file or "
                             "the target gave",
                             ClusterError)
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except (TypeError, ScalelabError) as exc:
            raise ClusterError(f"{where or 'a node record'}: {exc}") from None


def nodes_of(record: dict[str, Any]) -> list[Node]:
    """The Node records of a cluster record (cluster.json), in its order; each checked as
    Node.from_dict does, the record's path named where it is refused."""
    try:
        where = str(cluster_dir(record.get("name")) / "cluster.json")
    except InputError:
        where = "a cluster record"
    return [Node.from_dict(n, where) for n in record.get("nodes") or []]


def nodes_from_outputs(outputs: dict[str, Any], target: str, ssh_key: str) -> list[Node]:
    """Turn `terraform output -json` (the outputs contract) into Node records, head first.

    >>> out = {"nodes": {"value": {"w1": {"public_ip": None, "private_ip": "10.0.0.3",
    ...        "role": "worker", "gpus": 1, "ssh_user": "ubuntu"},
    ...        "h": {"public_ip": "203.0.113.5", "private_ip": "10.0.0.2", "role": "head",
    ...        "gpus": 1, "ssh_user": "ubuntu"}}}, "ssh_user": {"value": "ubuntu"},
    ...        "bastion_ip": {"value": None}}
    >>> [(n.name, n.address) for n in nodes_from_outputs(out, "aws", "/k")]
    [('h', '203.0.113.5'), ('w1', '10.0.0.3')]
    """

    def value(key: str) -> Any:
        item = outputs.get(key)
        if item is None:
            raise InputError(f"terraform outputs lack {key!r}; every target must export it")
        return item["value"] if isinstance(item, dict) and "value" in item else item

    raw_nodes = value("nodes")
    default_user = value("ssh_user")
    nodes = []
    for name, rec in raw_nodes.items():
        nodes.append(
            Node(
                name=name,
                address=rec.get("public_ip") or rec["private_ip"],
                private_address=rec["private_ip"],
                role=rec["role"],
                target=target,
                ssh_user=rec.get("ssh_user") or default_user,
                ssh_key=ssh_key,
                gpus=int(rec.get("gpus") or 0),
                # a static host listed without a name: scalelab's label, until configure
                # reads the host's own hostname (facts.adopt_hostnames)
                extra={} if rec.get("named", True) else {"label": name},
            )
        )
    return sort_nodes(nodes)


def sort_nodes(nodes: list[Node]) -> list[Node]:
    """Head first, then workers in natural name order (n2 before n10)."""

    def key(n: Node) -> tuple:
        parts = re.split(r"(\d+)", n.name)
        return (n.role != "head", [int(p) if p.isdigit() else p for p in parts])

    return sorted(nodes, key=key)
