"""The `local` target: a cluster emulated on one Linux machine.

Each node is
- a network namespace with a veth (``eth0`` inside) into a per-cluster bridge, an address in
  the cluster subnet and no default route;
- a tbf rate on both ends of that veth (changeable at any time, see set_bandwidth);
- a cgroup with a CPU quota (v1 cpu controller, or v2 cpu.max on unified hosts);
- a mount + UTS namespace whose root is an overlayfs over the host root (copy-on-write: what a
  node writes lands in its upper dir, never on the host or another node);
- its own sshd on its address, host key generated at provision time and pinned.

Safety: before anything else a guard route (`unreachable <subnet>` at the lowest priority) is
installed in the root namespace, so cluster-subnet traffic can never leave through the default
route, even between teardown steps; it is removed once the cluster's links are gone.

What is the cluster's is proven before it is removed: its bridge and veths carry an alias
naming the cluster and its state directory (their names, picked free at provision time, are
in the record), and a process is ended only while it runs in one of the node's network
namespaces or cgroups, never because a recorded pid says so. Ctrl-C (or SIGTERM, SIGHUP)
during provision lets the step under way finish, then removes what that call made.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scalelab.cluster import inventory, ssh
from scalelab.cluster.nodes import Node, nodes_of
from scalelab.cluster.targets.interface import SshReachable
from scalelab.cluster.targets.localhost import (
    GUARD_METRIC,
    NODE_IFACE,
    TARGET,
    CpuCgroup,
    _alive,  # noqa: F401 (tests import it from here)
    _host_memory_mb,
    _sshd_config,
    _state,
    bridge_address,
    bridge_of,
    cgroup_mounts,
    child_of_this_process,
    end_pids,
    guard_routes,
    host_links,
    host_veth,
    in_netns,
    link_alias,
    netem_available,
    netns_name,
    netns_pids,
    node_address,
    node_name,
    node_rates,
    own_links,
    pick_link_id,
    pick_subnet,
    record_link_id,
    require_root,
    shape_loopback,
    shape_node,
)
from scalelab.core import sh
from scalelab.core.errors import ClusterError, InputError, ProvisionError
from scalelab.core.state import (
    PROJECT_ROOT,
    check_cluster_name,
    cluster_dir,
    list_clusters,
    load_cluster,
    private_dir,
    save_cluster,
    write_atomic,
)
from scalelab.core.units import format_rate, parse_cpus, parse_rate_mbit

log = logging.getLogger(__name__)

MAX_NODES = 64
SSHD = "/usr/sbin/sshd"


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

class LocalCluster:
    """Create, resize, reshape and destroy one emulated cluster."""

    def __init__(self, name: str) -> None:
        self.name = check_cluster_name(name)
        self.dir = cluster_dir(name)
        self.key = self.dir / "id_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self.shared = self.dir / "node-shared"  # bind-mounted read-only at /etc/scalelab on nodes
        self._step = ""  # the provisioning step under way, named if it fails
        self._stop = threading.Event()  # set by a signal during provision

    # -- records

    def load(self) -> dict[str, Any] | None:
        try:
            rec = load_cluster(self.name)
        except ClusterError:
            return None
        if rec.get("target") != TARGET:
            raise ClusterError(f"cluster {self.name} exists with target {rec.get('target')}; "
                               f"destroy it first (invoke destroy --cluster {self.name})")
        return rec

    def save(self, rec: dict[str, Any]) -> None:
        save_cluster(self.name, rec)

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

    @staticmethod
    def _index(name: str) -> int:
        return int(name.rsplit("-n", 1)[1])

    def _add_guard(self, net: ipaddress.IPv4Network) -> None:
        # `add`, not `replace`: if another cluster raced us to this subnet, fail here
        sh.run(["ip", "route", "add", "unreachable", str(net), "metric", str(GUARD_METRIC)])

    def _del_guard(self, net: ipaddress.IPv4Network) -> None:
        sh.run(["ip", "route", "del", "unreachable", str(net), "metric", str(GUARD_METRIC)],
               check=False)

    def _init_state(self) -> None:
        private_dir(self.dir)
        private_dir(self.dir / "nodes")
        private_dir(self.shared)
        if not self.key.exists():
            sh.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                    f"scalelab-{self.name}", "-f", str(self.key)])
        os.chmod(self.key, 0o600)
        shutil.copy2(self.key, self.shared / "id_ed25519")
        shutil.copy2(f"{self.key}.pub", self.shared / "id_ed25519.pub")
        os.chmod(self.shared / "id_ed25519", 0o600)
        # nodes trust each other with the cluster key and pinned host keys
        write_atomic(self.shared / "ssh_config",
                     "Host *\n  IdentityFile /etc/scalelab/id_ed25519\n"
                     "  UserKnownHostsFile /etc/scalelab/known_hosts\n"
                     "  StrictHostKeyChecking yes\n  BatchMode yes\n", mode=0o644)

    def _add_bridge(self, net: ipaddress.IPv4Network, br: str) -> None:
        sh.run(["ip", "link", "add", br, "type", "bridge"])
        # `ip link add` takes no alias; until this is set, the record's name is the proof
        sh.run(["ip", "link", "set", br, "alias", link_alias(self.name)])
        sh.run(["ip", "addr", "add", f"{bridge_address(net)}/{net.prefixlen}", "dev", br])
        sh.run(["ip", "link", "set", br, "up"])

    def _node_paths(self, name: str) -> dict[str, Path]:
        base = self.dir / "nodes" / name
        # docker: the node's /var/lib/docker, on the host's own file system (overlay2, the
        # engine's storage, cannot sit on the node's overlay root)
        return {k: base / k for k in ("upper", "work", "merged", "docker")} | {"base": base}

    def _add_node(self, i: int, net: ipaddress.IPv4Network, cpus: float,
                  rate: float | None, rec: dict[str, Any]) -> tuple[Node, int]:
        name = node_name(self.name, i)
        ns, addr = netns_name(self.name, i), node_address(net, i)
        veth = host_veth(record_link_id(rec), i)
        paths = self._node_paths(name)
        for p in paths.values():
            private_dir(p)
        upper = paths["upper"]
        # the upper dir's own mode is the node's "/": 0700 would lock every daemon that drops
        # root (munged, slurmd, mariadbd) out of the whole file system; its parent stays private
        os.chmod(upper, 0o755)

        # host key, sshd config and authorized key go into the node's upper layer
        sshdir = upper / "etc" / "ssh"
        sshdir.mkdir(parents=True, exist_ok=True)
        hostkey = paths["base"] / "ssh_host_ed25519_key"
        if not hostkey.exists():
            sh.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(hostkey)])
        shutil.copy2(hostkey, sshdir / "ssh_host_ed25519_key")
        shutil.copy2(f"{hostkey}.pub", sshdir / "ssh_host_ed25519_key.pub")
        os.chmod(sshdir / "ssh_host_ed25519_key", 0o600)
        write_atomic(sshdir / "sshd_config", _sshd_config(addr), mode=0o644)
        confd = sshdir / "ssh_config.d"
        confd.mkdir(exist_ok=True)
        write_atomic(confd / "scalelab.conf", "Include /etc/scalelab/ssh_config\n", mode=0o644)
        rootssh = upper / "root" / ".ssh"
        rootssh.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(upper / "root", 0o700)
        os.chmod(rootssh, 0o700)
        write_atomic(rootssh / "authorized_keys", Path(f"{self.key}.pub").read_text(), mode=0o600)
        (upper / "etc" / "scalelab").mkdir(exist_ok=True)
        write_atomic(upper / "etc" / "hostname", f"{name}\n", mode=0o644)

        # network: namespace, veth into the bridge, address, rate
        sh.run(["ip", "netns", "add", ns])
        sh.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", NODE_IFACE,
                "netns", ns])
        sh.run(["ip", "link", "set", veth, "alias", f"{link_alias(self.name)}:n{i}",
                "master", rec["bridge"], "up"])
        batch = "\n".join([
            "link set lo up",
            f"addr add {addr}/{net.prefixlen} dev {NODE_IFACE}",
            f"link set {NODE_IFACE} up",
        ])
        sh.run(["ip", "-n", ns, "-batch", "-"], input=batch + "\n")
        self._shape_node(i, rate)

        cg = CpuCgroup.for_node(self.name, name)
        cg.create(cpus)
        pid = self._start_sshd(name, ns, paths, cg)
        node = Node(name=name, address=addr, private_address=addr,
                    role="head" if i == 0 else "worker", target=TARGET, ssh_user="root",
                    ssh_port=22, ssh_key=str(self.key), cpus=cpus, gpus=0, iface=NODE_IFACE,
                    extra={"netns": ns, "host_veth": veth, "cgroup": str(cg.path),
                           "root": str(paths["merged"])})
        return node, pid

    def _start_sshd(self, name: str, ns: str, paths: dict[str, Path], cg: CpuCgroup) -> int:
        m = paths["merged"]
        inner = " && ".join([
            f"mount -t overlay overlay -o lowerdir=/,upperdir={paths['upper']},"
            f"workdir={paths['work']} {m}",
            f"mount --rbind /dev {m}/dev",
            f"mount -t tmpfs -o mode=1777,size=2g tmpfs {m}/dev/shm",
            f"mount -t proc proc {m}/proc",
            f"mount --rbind /sys {m}/sys",
            *cgroup_mounts(Path("/proc/self/mounts").read_text(), str(m)),
            f"mount -t tmpfs -o mode=755 tmpfs {m}/run",
            f"mkdir -p {m}/var/lib/docker",
            f"mount --bind {paths['docker']} {m}/var/lib/docker",
            f"mkdir -p {m}/run/sshd",
            f"mount --bind -o ro {self.shared} {m}/etc/scalelab",
            f"hostname {name}",
            f"exec chroot {m} {SSHD} -D -e -f /etc/ssh/sshd_config",
        ])
        # join the cgroup first, so sshd and every session it forks are counted and capped
        outer = (f"echo $$ > {cg.path}/cgroup.procs && exec ip netns exec {ns} "
                 f"unshare --mount --uts --propagation private sh -c '{inner}'")
        log_path = paths["base"] / "sshd.log"
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(["sh", "-c", outer], stdin=subprocess.DEVNULL, stdout=logf,
                                    stderr=logf, start_new_session=True, close_fds=True)
        # every step above execs, so this pid ends up being sshd itself
        write_atomic(paths["base"] / "sshd.pid", f"{proc.pid}\n")
        time.sleep(0.01)
        if proc.poll() is not None:
            raise ClusterError(f"sshd of {name} exited: {log_path.read_text()[-300:]}")
        return proc.pid

    def _wait_ssh(self, addr: str, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection((addr, 22), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH"):
                        return
            except OSError:
                pass
            if self._stop.is_set():  # nothing half-made here: waiting may stop at once
                raise KeyboardInterrupt
            if time.monotonic() > deadline:
                raise ClusterError(f"sshd on {addr} did not answer within {timeout_s:g} s")
            time.sleep(0.02)

    def _write_hosts(self, rec: dict[str, Any]) -> None:
        """Every node resolves every node's name (gloo and horovodrun look hostnames up).

        Written in place into each node's upper layer, so a running node sees the change."""
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [f"{n['address']} {n['name']}" for n in rec["nodes"]]
        text = "\n".join(lines) + "\n"
        for n in rec["nodes"]:
            path = self._node_paths(n["name"])["upper"] / "etc" / "hosts"
            with open(path, "w") as fh:  # same inode: visible through the mounted overlay
                fh.write(text)

    def _write_known_hosts(self, rec: dict[str, Any]) -> None:
        lines = []
        for n in rec["nodes"]:
            pub = (self._node_paths(n["name"])["base"] / "ssh_host_ed25519_key.pub").read_text()
            keytype, key = pub.split()[:2]
            lines.append(f"{n['name']},{n['address']} {keytype} {key}")
        text = "\n".join(lines) + ("\n" if lines else "")
        write_atomic(self.known_hosts, text, mode=0o600)
        if self.shared.exists():
            write_atomic(self.shared / "known_hosts", text, mode=0o644)

    # -- shaping

    def _veth(self, i: int) -> str:
        return host_veth(record_link_id(self._loaded()), i)

    def _shape_node(self, i: int, rate: float | None, delay_us: float = 0.0) -> None:
        shape_node(self.name, i, self._veth(i), rate, delay_us)

    def _shape_all(self, rec: dict[str, Any], rate: float | None, delay_us: float = 0.0) -> None:
        for n in rec["nodes"]:
            self._shape_node(self._index(n["name"]), rate, delay_us)
        rec["bandwidth_mbit"] = rate

    def _loaded(self) -> dict[str, Any]:
        require_root()
        rec = self.load()
        if rec is None:
            raise ClusterError(f"cluster {self.name} not found")
        return rec

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

    # -- teardown

    def _remove_node(self, i: int, pid: int | None, rec: dict[str, Any] | None,
                     best_effort: bool = False) -> None:
        name = node_name(self.name, i)
        ns = netns_name(self.name, i)
        paths = self._node_paths(name)
        try:
            cg = CpuCgroup.for_node(self.name, name)
        except ClusterError:
            cg = None
        # only the node's processes, by pid: everything in its cgroups (its engine's
        # containers included) and in its network namespace (sshd, sessions, ranks). A recorded
        # pid proves nothing by itself: after sshd ended or the machine rebooted it may be
        # anyone's, so it is ended only while it runs in the node, or is this process's own
        # child (an sshd this provision started, still on its way into the namespace).
        def members() -> set[int]:
            found = set(cg.subtree_pids() if cg else []) | set(netns_pids(ns))
            if pid and child_of_this_process(pid):
                found.add(pid)
            return {p for p in found if _state(p) not in ("X", "Z")}

        if pid and pid not in members() and _state(pid) not in ("X", "Z"):
            log.info("pid %d recorded for %s is not in its namespace or cgroup; left alone",
                     pid, name)
        # again until none is left: a shell still setting the node up forks as it goes
        deadline = time.monotonic() + 10.0
        while (live := members()) and time.monotonic() < deadline:
            end_pids(sorted(live))
        if cg:
            for _ in range(50):  # an ended process may be listed a moment longer
                if not cg.subtree_pids():
                    break
                time.sleep(0.02)
            cg.remove()
        recorded = host_veth(record_link_id(rec), i) if rec and rec.get("bridge") else None
        for veth in own_links(f"{link_alias(self.name)}:n{i}", recorded, host_links()):
            sh.run(["ip", "link", "del", veth], check=False)
        sh.run(["ip", "netns", "del", ns], check=False)
        if paths["base"].exists():
            shutil.rmtree(paths["base"], ignore_errors=best_effort)

    def destroy(self, best_effort: bool = True) -> None:
        """Remove everything: processes, cgroups, links, namespaces, bridge, guard, state."""
        require_root()
        try:
            rec = load_cluster(self.name)
        except ClusterError:
            rec = None
        if rec is not None and rec.get("target") != TARGET:
            raise ClusterError(f"cluster {self.name} is a {rec.get('target')} cluster")
        indices = {self._index(n["name"]) for n in (rec or {}).get("nodes", [])}
        # also whatever a killed provision left: namespaces and node dirs by naming convention
        prefix = f"scalelab-{self.name}-n"
        for line in sh.run(["ip", "netns", "list"], check=False).stdout.splitlines():
            ns = line.split()[0] if line.strip() else ""
            if ns.startswith(prefix) and ns[len(prefix):].isdigit():
                indices.add(int(ns[len(prefix):]))
        nodes_dir = self.dir / "nodes"
        if nodes_dir.is_dir():
            for d in nodes_dir.iterdir():
                if d.name.startswith(f"{self.name}-n") and d.name.rsplit("-n", 1)[1].isdigit():
                    indices.add(self._index(d.name))
        self._teardown(rec, indices)

    def _teardown(self, rec: dict[str, Any] | None, indices: set[int]) -> None:
        """Remove these nodes, then the cluster's bridge, inventory, guard route and state."""
        ssh.close_masters(str(self.known_hosts))  # before the nodes' sshd go
        pids = (rec or {}).get("pids", {})
        for i in sorted(indices, reverse=True):
            name = node_name(self.name, i)
            pid = pids.get(name)
            pidfile = self._node_paths(name)["base"] / "sshd.pid"
            if pid is None and pidfile.exists():
                pid = int(pidfile.read_text().strip() or 0) or None
            self._remove_node(i, pid, rec)
        # the bridge only if it is this cluster's: its alias says so (or, without any alias,
        # the record names it); never by a name derived again from the cluster's
        for br in own_links(link_alias(self.name), (rec or {}).get("bridge"), host_links()):
            sh.run(["ip", "link", "del", br], check=False)
        inventory.remove(self.name)
        if rec is not None and rec.get("guard"):
            # once the links are gone, and before the record that says to remove it
            self._del_guard(ipaddress.ip_network(rec["subnet"]))
        if self.dir.exists():
            shutil.rmtree(self.dir)

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

    def restore(self, snapshot: float | None) -> None:
        self.cluster.set_bandwidth(snapshot)
        self.cluster.set_intra(None)

    def still_as_left(self, mbit: float | None) -> bool:
        # a rate set by hand since (invoke shape) is the one to keep
        return self._rate() == mbit


class LocalTarget(SshReachable):
    """The Target interface (scalelab.cluster.targets.base) of emulated clusters."""

    name = TARGET

    def capabilities(self, rec: dict[str, Any]) -> Any:
        from scalelab.cluster.targets.interface import Capabilities

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
        from scalelab.cluster.targets.interface import Runtime

        python, workdir = runtime_paths()
        return Runtime(python, workdir, rec["known_hosts"])

    def links(self, cluster: str, rec: dict[str, Any], nodes: list[Node]) -> LocalLinks:
        return LocalLinks(cluster)

    def set_rate(self, cluster: str, mbit: float | None) -> None:
        LocalLinks(cluster).restore(mbit)  # at this rate, and unshaped between a node's ranks


def target(name: str = TARGET) -> LocalTarget:
    return LocalTarget()
