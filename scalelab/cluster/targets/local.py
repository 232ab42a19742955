"""The `local` target: a cluster emulated on one Linux machine.

LocalCluster provisions it step by step from the parts that scalelab.cluster.targets.localnodes
makes and removes (what a node is, and how the cluster's own is proven, is told there). A step
that fails removes what that provision made; Ctrl-C (or SIGTERM, SIGHUP) during provision lets
the step under way finish, then removes what that call made.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scalelab.cluster import inventory
from scalelab.cluster.nodes import Node, nodes_of
from scalelab.cluster.targets.interface import Capabilities, Runtime, SshReachable
from scalelab.cluster.targets.localhost import (
    NODE_IFACE,
    TARGET,
    CpuCgroup,
    _alive,  # noqa: F401 (tests import it from here)
    _host_memory_mb,
    bridge_of,
    guard_routes,
    host_links,
    host_veth,
    in_netns,
    netem_available,
    netns_name,
    node_address,
    node_name,
    node_rates,
    pick_link_id,
    pick_subnet,
    record_link_id,
    require_root,
    shape_loopback,
)
from scalelab.cluster.targets.localnodes import SSHD, LocalNodes
from scalelab.core.errors import ClusterError, InputError, ProvisionError
from scalelab.core.state import (
    PROJECT_ROOT,
    list_clusters,
    load_cluster,
)
from scalelab.core.units import format_rate, parse_cpus, parse_rate_mbit

log = logging.getLogger(__name__)

MAX_NODES = 64


def _checked_request(nodes: int | str, cpus_per_node: str | float,
                     bandwidth: str) -> tuple[int, float, float | None]:
    """What provision was asked, checked before anything is touched."""
    if isinstance(nodes, bool) or not isinstance(nodes, int):
        try:
            nodes = int(str(nodes).strip())
        except ValueError:
            raise InputError(f"nodes: {nodes!r} is not a whole number; give e.g. 4") from None
    if nodes < 1:
        raise InputError(f"nodes: {nodes} must be 1 or more")
    if nodes > MAX_NODES:
        raise InputError(f"nodes: {nodes} is above the local target's limit of {MAX_NODES}")
    cpus = parse_cpus(cpus_per_node)
    rate = parse_rate_mbit(bandwidth)
    require_root()
    if not Path(SSHD).exists():
        raise ClusterError(f"{SSHD} not found; install openssh-server (./bootstrap.sh does)")
    return nodes, cpus, rate


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def _signals_noted() -> Iterator[threading.Event]:
    """While provisioning, Ctrl-C, SIGTERM and SIGHUP set the event instead of raising: the
    step under way finishes (a route added but not recorded, or an sshd started but not
    recorded, could not be undone), the next step raises KeyboardInterrupt, and the undo runs
    whole, however often the key is pressed. Only the main thread owns signal handlers;
    elsewhere the event is never set."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def note(signum: int, frame: Any) -> None:
        if not stop.is_set():
            log.warning("%s: stopping after the step under way, then removing what this "
                        "provision made", signal.Signals(signum).name)
        stop.set()

    old = {sig: signal.signal(sig, note) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


# ------------------------------------------------------------------ the target

class LocalCluster(LocalNodes):
    """Create, resize, reshape and destroy one emulated cluster."""

    # -- provision

    def provision(self, nodes: int, cpus_per_node: str | float = 1.0,
                  bandwidth: str = "native", subnet: str | None = None) -> list[Node]:
        nodes, cpus, rate = _checked_request(nodes, cpus_per_node, bandwidth)
        with _signals_noted() as stop:
            self._stop = stop
            try:
                return self._provision(nodes, cpus, rate, subnet)
            finally:
                self._stop = threading.Event()

    def _provision(self, nodes: int, cpus: float, rate: float | None,
                   subnet: str | None) -> list[Node]:
        rec, fresh = self._record(nodes, cpus, rate, subnet)
        created: list[int] = []
        self._step = "prepare"
        try:
            self._converge(rec, fresh, nodes, cpus, rate, created)
            self._at("done")  # a signal during the last step still undoes this call
        except BaseException as exc:  # KeyboardInterrupt too: Ctrl-C must not leave a half
            log.warning("provision %s at step %s; removing what it created",
                        "interrupted" if self._stop.is_set() else "failed", self._step)
            self._undo(rec, fresh, created)
            if self._stop.is_set() or isinstance(exc, KeyboardInterrupt):
                raise KeyboardInterrupt from exc
            detail = exc.args[0] if exc.args else type(exc).__name__
            raise ProvisionError(f"local provisioning failed at step '{self._step}': {detail}; "
                                 "everything it created was removed") from exc
        return self.nodes(rec)

    def _at(self, step: str) -> None:
        """Start the next step, or stop here if a signal came during the one before."""
        if self._stop.is_set():
            raise KeyboardInterrupt
        self._step = step

    def _undo(self, rec: dict[str, Any], fresh: bool, created: list[int]) -> None:
        """Remove what this provision made: the whole cluster if it made the cluster, else the
        nodes it added (the record and inventory then list the nodes that stay)."""
        if fresh:
            # only what this call made: namespaces of the same name that were there before
            # are not this call's (another state directory's cluster, say)
            self._teardown(rec, set(created))
            return
        for i in reversed(created):
            name = node_name(self.name, i)
            self._remove_node(i, rec["pids"].pop(name, None), rec, best_effort=True)
            rec["nodes"] = [n for n in rec["nodes"] if self._index(n["name"]) != i]
        try:
            self._commit(rec)
        except Exception as exc:  # the record of the nodes kept is saved regardless
            log.warning("cluster %s: inventory not rewritten after the undo: %s", self.name, exc)
            self.save(rec)

    def _record(self, nodes: int, cpus: float, rate: float | None,
                subnet: str | None) -> tuple[dict[str, Any], bool]:
        """The cluster's record (a new one on a free subnet, or the one kept), and whether it
        is new; nothing is created yet."""
        rec = self.load()
        fresh = rec is None
        if fresh:
            net = pick_subnet(subnet, self.name)
            lid = pick_link_id(self.name, host_links(), self._link_ids_taken())
            rec = {"name": self.name, "target": TARGET, "subnet": str(net), "link_id": lid,
                   "bridge": bridge_of(lid), "cpus_per_node": cpus,
                   "bandwidth_mbit": rate, "nodes": [], "pids": {},
                   "known_hosts": str(self.known_hosts), "ssh_key": str(self.key),
                   "created_at": time.time()}
        elif subnet and ipaddress.ip_network(subnet, strict=False) != ipaddress.ip_network(
                rec["subnet"]):
            raise InputError(f"cluster {self.name} already uses subnet {rec['subnet']}; omit "
                             f"--subnet or destroy it first (invoke destroy --cluster {self.name})")
        net = ipaddress.ip_network(rec["subnet"])
        if net.num_addresses < nodes + 12:
            raise InputError(f"subnet {net} is too small for {nodes} nodes")
        return rec, fresh

    def _link_ids_taken(self) -> set[str]:
        taken = set()
        for other in list_clusters():
            try:
                orec = load_cluster(other)
                if other != self.name and orec.get("target") == TARGET:
                    taken.add(record_link_id(orec))
            except (ClusterError, KeyError):
                continue
        return taken

    def _converge(self, rec: dict[str, Any], fresh: bool, nodes: int, cpus: float,
                  rate: float | None, created: list[int]) -> None:
        """Bring the host to the record's cluster of that many nodes, step by step (self._step
        names the one under way); created lists the nodes made, for the undo."""
        net = ipaddress.ip_network(rec["subnet"])
        if fresh:
            self._at("state directory")
            self._init_state()
            self.save(rec)
            self._at("guard route")
            if str(net) in guard_routes():
                raise ClusterError(f"subnet {net} already has scalelab's guard route (another "
                                   "state directory's cluster?); choose another with --subnet")
            # recorded before it is added: a provision killed in between is undone by destroy
            rec["guard"] = True
            self.save(rec)
            self._add_guard(net)
            self._at("bridge")
            self._add_bridge(net, rec["bridge"])
        have = {self._index(n["name"]) for n in rec["nodes"]}
        for i in (i for i in range(nodes) if i not in have):
            self._at(f"node {node_name(self.name, i)}")
            ns = netns_name(self.name, i)
            if (Path("/run/netns") / ns).exists() and \
                    self._node_paths(node_name(self.name, i))["base"].exists():
                # this cluster's own, left by a provision killed before it recorded the node
                self._remove_node(i, None, rec)
            if (Path("/run/netns") / ns).exists():
                raise ClusterError(f"network namespace {ns} exists but cluster {self.name} has "
                                   "no such node here (another state directory's cluster?); "
                                   "give this cluster another name")
            created.append(i)  # before any of it exists: the undo finds what there is
            node, pid = self._add_node(i, net, cpus, rate, rec)
            rec["nodes"].append(node.to_dict())
            rec["pids"][node.name] = pid
            rec["nodes"].sort(key=lambda n: self._index(n["name"]))
        self._at("known_hosts")
        self._write_known_hosts(rec)
        self._at("wait for sshd")
        for i in created:
            self._wait_ssh(node_address(net, i))
        for n in [n for n in rec["nodes"] if self._index(n["name"]) >= nodes]:
            self._at(f"remove node {n['name']}")
            self._remove_node(self._index(n["name"]), rec["pids"].pop(n["name"], None), rec)
            rec["nodes"].remove(n)
        if cpus != rec["cpus_per_node"]:
            self._at("cpu quota")
            for n in rec["nodes"]:
                CpuCgroup.for_node(self.name, n["name"]).set_quota(cpus)
            rec["cpus_per_node"] = cpus
            for n in rec["nodes"]:
                n["cpus"] = cpus
        if rate != rec["bandwidth_mbit"]:
            self._at("link rate")
            self._shape_all(rec, rate)
        self._at("inventory")
        self._commit(rec)

    def _commit(self, rec: dict[str, Any]) -> None:
        """Write what the record's nodes need known: host keys, /etc/hosts, facts, inventory."""
        self._write_known_hosts(rec)
        self._write_hosts(rec)
        for n in rec["nodes"]:
            n["facts"] = local_facts(n)
        caps = LocalTarget().capabilities(rec)
        rec["capabilities"] = caps.to_dict()
        rec["trust_key"] = str(self.key)  # made for this cluster, gone with it
        self.save(rec)
        inventory.write(self.name, self.nodes(rec), known_hosts=str(self.known_hosts),
                        capabilities=caps.as_vars(), trust_key=str(self.key))

    def nodes(self, rec: dict[str, Any] | None = None) -> list[Node]:
        rec = rec or self.load() or {"nodes": []}
        return nodes_of(rec)

    # -- shaping

    def _shape_all(self, rec: dict[str, Any], rate: float | None, delay_us: float = 0.0) -> None:
        for n in rec["nodes"]:
            self._shape_node(self._index(n["name"]), rate, delay_us)
        rec["bandwidth_mbit"] = rate

    def shape_one(self, name: str, rate: float | None, delay_us: float = 0.0,
                  min_queue_bytes: int = 0) -> None:
        self._loaded()
        self._shape_node(self._index(name), rate, delay_us, min_queue_bytes)

    def set_intra(self, mbit: float | None) -> None:
        """One rate (None: unshaped) on every node's loopback, the path between its ranks."""
        for n in self._loaded()["nodes"]:
            shape_loopback(self.name, self._index(n["name"]), mbit)

    def set_bandwidth(self, bandwidth: str | float | None, delay_us: float = 0.0) -> float | None:
        rate = bandwidth if bandwidth is None or isinstance(bandwidth, float) else \
            parse_rate_mbit(str(bandwidth))
        rec = self._loaded()
        self._shape_all(rec, rate, delay_us)
        self.save(rec)
        return rate

    def link_rates(self, dev: str = NODE_IFACE) -> dict[str, tuple[float | None, float | None]]:
        """Rates read back per node: (to it, from it); dev="lo": (None, between its ranks)."""
        rec = self.load() or {"nodes": []}
        return {n["name"]: node_rates(self.name, self._index(n["name"]),
                                      host_veth(record_link_id(rec), self._index(n["name"])), dev)
                for n in rec["nodes"]}

    def alive(self) -> list[bool]:
        rec = self.load() or {"nodes": [], "pids": {}}
        return [bool(rec["pids"].get(n["name"]))
                and in_netns(rec["pids"][n["name"]], netns_name(self.name, self._index(n["name"])))
                for n in rec["nodes"]]


def runtime_paths() -> tuple[str, str]:
    """The local target's shortcut: nodes see the controller's venv and checkout at the same
    paths through their overlay's lower layer, so they need no install. Only this target may
    take it; every other target runs what configure installed (scalelab.cluster.facts)."""
    import sys

    project = PROJECT_ROOT
    return str(Path(sys.executable).parent / "python"), str(project)


def local_facts(node: dict[str, Any]) -> dict[str, Any]:
    """What the local target knows of a node it made, without probing it: its CPU share is
    the cgroup quota, not the host's core count that nproc would show inside the node."""
    python, workdir = runtime_paths()
    # every node's memory is the host's, shared: memory_pool says so to the memory check
    return {"cores": node.get("cpus", 1.0), "memory_mb": _host_memory_mb(),
            "memory_pool": f"host {socket.gethostname()}",
            "iface": NODE_IFACE, "gpus": 0, "gpu_model": "", "gpu_memory_mb": 0,
            "python": python, "workdir": workdir, "source": "local target"}


class LocalLinks:
    """Both ends of every node's veth, set from the host (the record keeps the standing rate)."""

    def __init__(self, cluster: str) -> None:
        self.cluster = LocalCluster(cluster)

    def _rate(self) -> float | None:
        return (self.cluster.load() or {}).get("bandwidth_mbit")

    def snapshot(self) -> float | None:
        return self._rate()

    def apply(self, mbit: float | None, delay_us: float = 0.0) -> None:
        self.cluster.set_bandwidth(mbit, delay_us)

    def apply_intra(self, mbit: float | None) -> None:
        self.cluster.set_intra(mbit)

    def apply_node(self, name: str, mbit: float | None, delay_us: float = 0.0,
                   min_queue_bytes: int = 0) -> None:
        """One node's veth at its own rate (a storage node's), with the links' per-hop delay
        and a queue of at least min_queue_bytes; the record's standing rate, which restore()
        sets on every node, stays the cluster's."""
        self.cluster.shape_one(name, mbit, delay_us, min_queue_bytes)

    def restore(self, snapshot: float | None) -> None:
        self.cluster.set_bandwidth(snapshot)
        self.cluster.set_intra(None)

    def still_as_left(self, mbit: float | None) -> bool:
        # a rate set by hand since (invoke shape) is the one to keep
        return self._rate() == mbit


class LocalTarget(SshReachable):
    """The Target interface (scalelab.cluster.targets) of emulated clusters."""

    name = TARGET

    def capabilities(self, rec: dict[str, Any]) -> Any:
        # a node is a network, mount and UTS namespace over the host's root: the host's
        # packages and venv, no systemd, no kernel NFS, the host's clock, no route off the
        # cluster, and no Docker engine of its own
        return Capabilities(stack_from_host=True, packages_from_host=True, package_index=False,
                            systemd=False, own_clock=False, kernel_nfs=False, exportable_root=False,
                            ephemeral=True, containers=True, shares_host_cpus=True,
                            shape_links=True, own_loopback=True, hop_delay=netem_available())

    def dry_run(self, cluster: str, nodes: int | str, **options: Any) -> list[str]:
        raise InputError("--dry-run is for the terraform targets; the local target is quick "
                         "and fully undone by invoke destroy")

    def provision(self, cluster: str, nodes: int | str, **options: Any) -> list[Node]:
        allowed = {"cpus_per_node", "bandwidth", "subnet"}
        return LocalCluster(cluster).provision(
            nodes, **{k: v for k, v in options.items() if k in allowed and v is not None})

    def destroy(self, cluster: str) -> None:
        LocalCluster(cluster).destroy()

    def alive(self, cluster: str, nodes: list[Node]) -> list[bool]:
        return LocalCluster(cluster).alive()

    def summary(self, rec: dict[str, Any]) -> dict[str, str]:
        return {"bandwidth": format_rate(rec.get("bandwidth_mbit")),
                "cpus/node": f"{rec.get('cpus_per_node', '-')}"}

    def adjust_facts(self, rec: dict[str, Any], node: dict[str, Any],
                     facts: dict[str, Any]) -> dict[str, Any]:
        own = local_facts(node)
        return {**facts, "cores": own["cores"], "python": own["python"],
                "workdir": own["workdir"], "iface": facts.get("iface") or NODE_IFACE}

    def runtime(self, rec: dict[str, Any]) -> Any:
        python, workdir = runtime_paths()
        return Runtime(python, workdir, rec["known_hosts"])

    def links(self, cluster: str, rec: dict[str, Any], nodes: list[Node]) -> LocalLinks:
        return LocalLinks(cluster)

    def set_rate(self, cluster: str, mbit: float | None) -> None:
        LocalLinks(cluster).restore(mbit)  # at this rate, and unshaped between a node's ranks


def target(name: str = TARGET) -> LocalTarget:
    return LocalTarget()
