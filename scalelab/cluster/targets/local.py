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
route, even between teardown steps; it is removed last.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import socket
import subprocess
import time
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
    _alive,
    _host_memory_mb,
    _sshd_config,
    bridge_address,
    bridge_name,
    cgroup_mounts,
    end_pids,
    host_veth,
    netem_available,
    netns_name,
    node_address,
    node_name,
    node_rates,
    pick_subnet,
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
        rec, fresh = self._record(nodes, cpus, rate, subnet)
        created: list[int] = []
        self._step = "prepare"
        try:
            self._converge(rec, fresh, nodes, cpus, rate, created)
        except Exception as exc:
            log.warning("provision failed at step %s; removing what was created", self._step)
            for i in reversed(created):
                self._remove_node(i, rec["pids"].pop(node_name(self.name, i), None),
                                  best_effort=True)
                rec["nodes"] = [n for n in rec["nodes"] if self._index(n["name"]) != i]
            if fresh:
                self.destroy(best_effort=True)
            else:
                self._write_known_hosts(rec)
                self.save(rec)
            detail = exc.args[0] if exc.args else type(exc).__name__
            raise ProvisionError(f"local provisioning failed at step '{self._step}': {detail}; "
                                 "everything it created was removed") from exc
        return self.nodes(rec)

    def _record(self, nodes: int, cpus: float, rate: float | None,
                subnet: str | None) -> tuple[dict[str, Any], bool]:
        """The cluster's record (a new one on a free subnet, or the one kept), and whether it
        is new; nothing is created yet."""
        rec = self.load()
        fresh = rec is None
        if fresh:
            net = pick_subnet(subnet, self.name)
            rec = {"name": self.name, "target": TARGET, "subnet": str(net),
                   "bridge": bridge_name(self.name), "cpus_per_node": cpus,
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

    def _converge(self, rec: dict[str, Any], fresh: bool, nodes: int, cpus: float,
                  rate: float | None, created: list[int]) -> None:
        """Bring the host to the record's cluster of that many nodes, step by step (self._step
        names the one under way); created lists the nodes made, for the undo."""
        net = ipaddress.ip_network(rec["subnet"])
        if fresh:
            self._step = "state directory"
            self._init_state()
            self.save(rec)
            self._step = "guard route"
            self._add_guard(net)
            rec["guard"] = True
            self.save(rec)
            self._step = "bridge"
            self._add_bridge(net)
        have = {self._index(n["name"]) for n in rec["nodes"]}
        for i in (i for i in range(nodes) if i not in have):
            self._step = f"node {node_name(self.name, i)}"
            node, pid = self._add_node(i, net, cpus, rate)
            created.append(i)
            rec["nodes"].append(node.to_dict())
            rec["pids"][node.name] = pid
            rec["nodes"].sort(key=lambda n: self._index(n["name"]))
        self._step = "known_hosts"
        self._write_known_hosts(rec)
        self._step = "wait for sshd"
        for i in created:
            self._wait_ssh(node_address(net, i))
        for n in [n for n in rec["nodes"] if self._index(n["name"]) >= nodes]:
            self._step = f"remove node {n['name']}"
            self._remove_node(self._index(n["name"]), rec["pids"].pop(n["name"], None))
            rec["nodes"].remove(n)
        if cpus != rec["cpus_per_node"]:
            self._step = "cpu quota"
            for n in rec["nodes"]:
                CpuCgroup.for_node(self.name, n["name"]).set_quota(cpus)
            rec["cpus_per_node"] = cpus
            for n in rec["nodes"]:
                n["cpus"] = cpus
        if rate != rec["bandwidth_mbit"]:
            self._step = "link rate"
            self._shape_all(rec, rate)
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

    def _add_bridge(self, net: ipaddress.IPv4Network) -> None:
        br = bridge_name(self.name)
        sh.run(["ip", "link", "add", br, "type", "bridge"])
        sh.run(["ip", "addr", "add", f"{bridge_address(net)}/{net.prefixlen}", "dev", br])
        sh.run(["ip", "link", "set", br, "up"])

    def _node_paths(self, name: str) -> dict[str, Path]:
        base = self.dir / "nodes" / name
        # docker: the node's /var/lib/docker, on the host's own file system (overlay2, the
        # engine's storage, cannot sit on the node's overlay root)
        return {k: base / k for k in ("upper", "work", "merged", "docker")} | {"base": base}

    def _add_node(self, i: int, net: ipaddress.IPv4Network, cpus: float,
                  rate: float | None) -> tuple[Node, int]:
        name = node_name(self.name, i)
        ns, veth, addr = netns_name(self.name, i), host_veth(self.name, i), node_address(net, i)
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
        sh.run(["ip", "link", "set", veth, "master", bridge_name(self.name), "up"])
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

    def _shape_node(self, i: int, rate: float | None, delay_us: float = 0.0) -> None:
        shape_node(self.name, i, rate, delay_us)

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
        return {n["name"]: node_rates(self.name, self._index(n["name"]), dev)
                for n in (self.load() or {"nodes": []})["nodes"]}

    # -- teardown

    def _remove_node(self, i: int, pid: int | None, best_effort: bool = False) -> None:
        name = node_name(self.name, i)
        paths = self._node_paths(name)
        try:
            cg = CpuCgroup.for_node(self.name, name)
        except ClusterError:
            cg = None
        pids = set(cg.subtree_pids() if cg else [])
        if pid:
            pids.add(pid)
        # only processes we started: sshd (by recorded pid) and everything in the node's
        # cgroups (its engine's containers included)
        end_pids(sorted(pids))
        if cg:
            for _ in range(50):
                if not cg.subtree_pids():
                    break
                time.sleep(0.02)
            cg.remove()
        sh.run(["ip", "link", "del", host_veth(self.name, i)], check=False)
        sh.run(["ip", "netns", "del", netns_name(self.name, i)], check=False)
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
        pids = (rec or {}).get("pids", {})
        ssh.close_masters(str(self.known_hosts))  # before the nodes' sshd go
        indices = {self._index(n["name"]) for n in (rec or {}).get("nodes", [])}
        # also whatever a crashed provision left: namespaces and node dirs by naming convention
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
        for i in sorted(indices, reverse=True):
            name = node_name(self.name, i)
            pid = pids.get(name)
            pidfile = self._node_paths(name)["base"] / "sshd.pid"
            if pid is None and pidfile.exists():
                pid = int(pidfile.read_text().strip() or 0) or None
            self._remove_node(i, pid)
        sh.run(["ip", "link", "del", bridge_name(self.name)], check=False)
        inventory.remove(self.name)
        if self.dir.exists():
            shutil.rmtree(self.dir)
        if rec is not None and rec.get("guard"):
            # last: until now the guard kept the subnet off the default route
            self._del_guard(ipaddress.ip_network(rec["subnet"]))

    def alive(self) -> list[bool]:
        rec = self.load() or {"nodes": [], "pids": {}}
        return [bool(rec["pids"].get(n["name"])) and _alive(rec["pids"][n["name"]])
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
