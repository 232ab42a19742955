"""One entry point per lifecycle verb, dispatching to the target that owns the cluster."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.cluster import ckptdirs, configure, ssh, storage, targets
from scalelab.cluster.nodes import Node, nodes_of
from scalelab.core import lock
from scalelab.core.errors import ClusterError, InputError, ScalelabError
from scalelab.core.state import check_cluster_name, inventory_dir, list_clusters, load_cluster
from scalelab.core.units import parse_rate_mbit

log = logging.getLogger(__name__)


@dataclass
class ClusterInfo:
    name: str
    target: str
    nodes: list[Node]
    inventory: Path
    alive: list[bool] = field(default_factory=list)
    summary: dict[str, str] = field(default_factory=dict)


def provision(target: str, nodes: int | str, cluster: str, cpus_per_node: str | float = 1.0,
              bandwidth: str = "native", subnet: str | None = None, var_file: str | None = None,
              keep_on_failure: bool = False, dry_run: bool = False) -> ClusterInfo | None:
    """Create or resize a cluster; returns its records (None for a dry run)."""
    impl = targets.get(target)
    check_cluster_name(cluster)
    with lock.hold(cluster):
        recs = impl.provision(cluster, nodes, cpus_per_node=cpus_per_node, bandwidth=bandwidth,
                              subnet=subnet, var_file=var_file, keep_on_failure=keep_on_failure,
                              dry_run=dry_run)
    if recs is None:
        return None
    return _info(cluster, load_cluster(cluster), recs)


def dry_run(target: str, nodes: int | str, cluster: str, var_file: str | None = None) -> list[str]:
    """What provision would do, changing nothing (the target says whether it has anything)."""
    check_cluster_name(cluster)
    return targets.get(target).dry_run(cluster, nodes, var_file=var_file)


def _info(name: str, rec: dict, nodes: list[Node]) -> ClusterInfo:
    summary = targets.of(rec).summary(rec)
    return ClusterInfo(name, rec["target"], nodes, inventory_dir() / f"{name}.yml",
                       summary=summary)


def destroy(cluster: str, keep_data: bool = False) -> list[str]:
    """Remove a cluster; what stays on its hosts on purpose (hosts scalelab did not make).
    keep_data: the staged data sets stay on such hosts (their servers end all the same)."""
    check_cluster_name(cluster)
    with lock.hold(cluster):
        return _destroy(cluster, keep_data)


def check_keep_data(cluster: str) -> None:
    """--keep-data on a cluster whose hosts scalelab made is refused (InputError): their disks
    go with them."""
    rec = load_cluster(cluster)
    if targets.capabilities(rec).owns_hosts and rec.get("staged"):
        where = "; ".join(f"{e['dir']} on {', '.join(e['nodes'])}"
                          for e in rec["staged"].values())
        raise InputError(f"--keep-data: cluster {cluster}'s hosts were made by scalelab and "
                         f"their disks go with them; copy the data off first ({where}), then "
                         "destroy without --keep-data")


def _destroy(cluster: str, keep_data: bool = False) -> list[str]:
    try:
        rec = load_cluster(cluster)
    except ClusterError:
        # nothing recorded; a provision that crashed may still have left pieces behind
        if targets.destroy_unrecorded(cluster):
            return []
        raise
    caps = targets.capabilities(rec)
    kept: list[str] = []
    if not caps.owns_hosts and (rec.get("staged") or rec.get("servers")):
        # staged data and its servers (on hosts the cluster made, they go with the nodes); a
        # host that does not answer keeps them, said, and the rest of destroy goes on
        sets = dict(rec.get("staged") or {})
        try:
            for line in storage.remove(cluster, rec, keep_data=keep_data):
                log.info("%s: %s", cluster, line)
            if keep_data:
                kept += [f"data set {name} at {e['dir']} on {', '.join(e['nodes'])} (asked "
                         "with --keep-data)" for name, e in sets.items()]
        except ScalelabError as exc:
            log.warning("%s: staged data or a web server may be left on a host: %s", cluster,
                        exc)
            kept.append("staged data where a host did not answer: " + ", ".join(
                f"{e['dir']} on {', '.join(e['nodes'])}" for e in rec.get("staged", {}).values()))

    if not caps.owns_hosts and rec.get(ckptdirs.KEY):  # a killed sweep's checkpoints
        try:
            workdir: str | None = storage.workdir_of(nodes_of(rec)[0])
        except (ScalelabError, IndexError):  # never configured: no workdir of scalelab's
            workdir = None
        kept += ckptdirs.remove_left(cluster, rec, workdir)
    # any configure that started, finished or not (configure.mark_touched records it before
    # Ansible first changes a host)
    if not caps.owns_hosts and caps.configurable and configure.touched(rec):
        # before the cluster's state goes: the trust key's public half is matched by it
        configure.forget(cluster)
        kept += list(configure.KEPT_ON_HOSTS)
    if rec.get("known_hosts"):
        ssh.close_masters(rec["known_hosts"])  # the multiplexed connections to its nodes
    try:
        targets.of(rec).destroy(cluster)
    finally:
        if rec.get("known_hosts"):
            ssh.close_masters(rec["known_hosts"])  # and those the target's own teardown made
    return kept


def status(cluster: str | None = None) -> list[ClusterInfo]:
    names = [check_cluster_name(cluster)] if cluster else list_clusters()
    out = []
    for name in names:
        rec = load_cluster(name)
        nodes = nodes_of(rec)
        info = _info(name, rec, nodes)
        info.alive = targets.of(rec).alive(name, nodes)
        out.append(info)
    return out


def can_shape(cluster: str) -> bool:
    """Whether scalelab can set link rates on this cluster's nodes."""
    rec = load_cluster(cluster)
    return targets.capabilities(rec).shape_links


def configurable(cluster: str) -> bool:
    """Whether scalelab reaches this cluster's nodes over SSH (and so may configure them)."""
    rec = load_cluster(cluster)
    return targets.capabilities(rec).ssh_nodes


def set_bandwidth(cluster: str, bandwidth: str) -> None:
    mbit = parse_rate_mbit(bandwidth)
    with lock.hold(cluster):
        rec = load_cluster(cluster)
        targets.of(rec).set_rate(cluster, mbit)


def connectivity_check(cluster: str) -> list[str]:
    """SSH to every node from the controller, then from the head to every other node."""
    rec = load_cluster(cluster)
    nodes = nodes_of(rec)
    kh = rec["known_hosts"]
    lines = []
    target = targets.of(rec)
    if not targets.capabilities(rec).ssh_nodes:
        # only its login host is reachable: the nodes are as Slurm sees them
        login = target.login(rec)
        out = ssh.run(login, kh, "hostname", timeout=15).stdout.strip()
        lines.append(f"controller -> login host {login.address}: ssh ok, hostname {out}")
        alive = target.alive(cluster, nodes)
        for n, up in zip(nodes, alive, strict=True):
            lines.append(f"{n.name}: {'up' if up else 'DOWN'} in sinfo")
        if not all(alive):
            raise ClusterError(f"cluster {cluster}: some nodes are down in sinfo")
        return lines
    for n in nodes:
        out = ssh.run(n, kh, "hostname", timeout=15).stdout.strip()
        lines.append(f"controller -> {n.name} ({n.address}): ssh ok, hostname {out}")
    head = nodes[0]
    for n in nodes[1:]:
        # node to node as the cluster's login user, with the nodes' own ssh configuration
        cmd = ssh.on_node_line(n.ssh_user, n.private_address, "hostname")
        out = ssh.run(head, kh, cmd, timeout=20).stdout.strip()
        lines.append(f"{head.name} -> {n.name} ({n.private_address}): ssh ok, hostname {out}")
    return lines
