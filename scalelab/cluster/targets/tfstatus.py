"""A Terraform cluster as it stands, read without changing anything: its record, what
Terraform's local state lists and whether its outputs still match the recorded nodes (status),
and whether each node's sshd answers (alive).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node, nodes_from_outputs, nodes_of
from scalelab.cluster.targets.interface import TERRAFORM_TARGETS
from scalelab.cluster.targets.tfmodule import bastion_of, contract_outputs
from scalelab.cluster.targets.tfstate import STATE_FILE
from scalelab.cluster.terraform import Terraform
from scalelab.core.errors import ClusterError, InputError
from scalelab.core.state import cluster_dir, load_cluster

# RFC 5737 documentation ranges: never routed, so never probed either.
_DOC_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24",
                                               "203.0.113.0/24")]


def terraform_record(cluster: str) -> tuple[dict[str, Any], Path]:
    """The record of a cluster Terraform manages, and its working directory."""
    rec = load_cluster(cluster)
    if rec.get("target") not in TERRAFORM_TARGETS:
        raise ClusterError(f"cluster {cluster} has target {rec.get('target')}, which Terraform "
                           "does not manage")
    return rec, cluster_dir(cluster) / "terraform"


@dataclass
class TfStatus:
    """What Terraform knows about a cluster (from local state: no cloud call)."""

    name: str
    target: str
    status: str  # provisioning | ready | failed
    nodes: list[Node]
    resources: list[str] = field(default_factory=list)
    outputs_match: bool = False  # terraform output agrees with cluster.json's nodes
    bastion: str | None = None
    workdir: Path | None = None
    error: str = ""


def status(cluster: str) -> TfStatus:
    """Resources in the state and whether the recorded nodes still match terraform output."""
    rec, workdir = terraform_record(cluster)
    nodes = nodes_of(rec)
    info = TfStatus(name=cluster, target=rec["target"], status=rec.get("status", "?"),
                    nodes=nodes, bastion=rec.get("bastion"), workdir=workdir,
                    error=rec.get("error", ""))
    if not (workdir / STATE_FILE).exists():
        return info
    tf = Terraform(workdir)
    info.resources = tf.state_list()
    outputs = tf.output()
    try:
        now = nodes_from_outputs(outputs, rec["target"], rec.get("ssh_key", ""))
    except (InputError, KeyError):
        return info
    # the contract's fields, by the names Terraform knows (a static host listed without a name
    # may have taken its hostname since: its label is kept in extra)
    known = [dataclasses.replace(n, name=n.extra.get("label", n.name)) for n in nodes]
    recorded = (rec.get("bastion") or "").rpartition("@")[2] or None  # user@address
    info.outputs_match = (contract_outputs(now) == contract_outputs(known)
                          and bastion_of(outputs) == recorded)
    return info


def alive(cluster: str, nodes: list[Node], timeout_s: float = 3.0) -> list[bool]:
    """Whether each node's sshd answers. Direct nodes: a TCP probe for the SSH banner; nodes
    behind a bastion: `ssh -J` with the cluster's key and pinned host keys (so False until the
    host keys are recorded). Documentation addresses (RFC 5737) are never probed."""
    rec = load_cluster(cluster)
    bastion = rec.get("bastion")
    known_hosts = rec.get("known_hosts", "")

    def probe(n: Node) -> bool:
        try:
            if any(ipaddress.ip_address(n.address) in net for net in _DOC_NETS):
                return False
        except ValueError:
            pass
        if bastion:
            return _ssh_probe(n, bastion, known_hosts, timeout_s)
        try:
            with socket.create_connection((n.address, n.ssh_port), timeout=timeout_s) as s:
                s.settimeout(timeout_s)
                return s.recv(4).startswith(b"SSH")
        except OSError:
            return False

    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
        return list(pool.map(probe, nodes))


def _ssh_probe(n: Node, bastion: str, known_hosts: str, timeout_s: float) -> bool:
    hop = n if n.bastion else dataclasses.replace(n, bastion=bastion)
    argv = [*ssh.ssh_args(hop, known_hosts, max(1, int(timeout_s))), "true"]
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout_s * 4,
                              stdin=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
