"""A local cluster's parts on this host, made one by one and removed only where proven its own.

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
namespaces or cgroups, never because a recorded pid says so.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from scalelab.cluster import inventory, ssh
from scalelab.cluster.nodes import Node
from scalelab.cluster.targets.localhost import (
    GUARD_METRIC,
    NODE_IFACE,
    TARGET,
    CpuCgroup,
    _sshd_config,
    _state,
    bridge_address,
    cgroup_mounts,
    child_of_this_process,
    end_pids,
    host_links,
    host_veth,
    link_alias,
    netns_name,
    netns_pids,
    node_address,
    node_name,
    own_links,
    record_link_id,
    require_root,
    shape_node,
)
from scalelab.core import sh
from scalelab.core.errors import ClusterError
from scalelab.core.state import (
    check_cluster_name,
    cluster_dir,
    load_cluster,
    private_dir,
    save_cluster,
    write_atomic,
)

log = logging.getLogger(__name__)

SSHD = "/usr/sbin/sshd"


class LocalNodes:
    """One local cluster's record, state directory, guard route, bridge and nodes: each made
    by a step of its own, and all of it removed again (LocalCluster runs the steps)."""

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

    def _loaded(self) -> dict[str, Any]:
        require_root()
        rec = self.load()
        if rec is None:
            raise ClusterError(f"cluster {self.name} not found")
        return rec

    @staticmethod
    def _index(name: str) -> int:
        return int(name.rsplit("-n", 1)[1])
    # -- the parts, one at a time

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

    def _shape_node(self, i: int, rate: float | None, delay_us: float = 0.0,
                    min_queue_bytes: int = 0) -> None:
        shape_node(self.name, i, self._veth(i), rate, delay_us, min_queue_bytes)

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
