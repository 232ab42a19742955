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

import hashlib
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.cluster import inventory, netshape, ssh
from scalelab.cluster.nodes import Node, nodes_of
from scalelab.cluster.targets.interface import SshReachable
from scalelab.core import sh
from scalelab.core.errors import ClusterError, CommandError, InputError, NotRootError, ProvisionError
from scalelab.core.state import (
    PROJECT_ROOT,
    check_cluster_name,
    cluster_dir,
    load_cluster,
    private_dir,
    save_cluster,
    state_root,
    write_atomic,
)
from scalelab.core.units import format_rate, parse_cpus, parse_rate_mbit

log = logging.getLogger(__name__)

TARGET = "local"
MAX_NODES = 64
GUARD_METRIC = 4294967295  # lowest priority: only used when no bridge route exists
NODE_IFACE = "eth0"
DEFAULT_POOL = ipaddress.ip_network("10.213.0.0/16")
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")
CFS_PERIOD_US = 100_000
SSHD = "/usr/sbin/sshd"


# ------------------------------------------------------------------ naming (pure)

def short_hash(cluster: str) -> str:
    """Five hex digits that keep interface names unique per cluster and under 15 chars.

    >>> short_hash("demo")
    '89e49'
    """
    return hashlib.sha1(cluster.encode()).hexdigest()[:5]


def bridge_name(cluster: str) -> str:
    return f"slb{short_hash(cluster)}"


def host_veth(cluster: str, index: int) -> str:
    return f"slv{short_hash(cluster)}n{index}"


def netns_name(cluster: str, index: int) -> str:
    return f"scalelab-{cluster}-n{index}"


def node_name(cluster: str, index: int) -> str:
    return f"{cluster}-n{index}"


def node_address(subnet: ipaddress.IPv4Network, index: int) -> str:
    """Node i gets the subnet's (10 + i)th address; .1 is the controller's bridge address.

    >>> node_address(ipaddress.ip_network("10.213.4.0/24"), 2)
    '10.213.4.12'
    """
    return str(subnet.network_address + 10 + index)


def bridge_address(subnet: ipaddress.IPv4Network) -> str:
    return str(subnet.network_address + 1)


def cgroup_mounts(mounts: str, root: str) -> list[str]:
    r"""Shell steps that give a node the host's /sys/fs/cgroup (`ip netns exec` mounts a fresh
    sysfs without it): what runs on a real host and looks there (slurmd does) finds it.

    The same hierarchies are mounted again, so a node sees the host's cgroups, as a
    container does; its own processes stay in the node's CPU cgroup.

    >>> text = ("tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n"
    ...         "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"
    ...         "cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0\n"
    ...         "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n")
    >>> cgroup_mounts(text, "/m")  # doctest: +NORMALIZE_WHITESPACE
    ['mount -t tmpfs -o mode=755 cgroup /m/sys/fs/cgroup',
     'mkdir -p /m/sys/fs/cgroup/cpu', 'mount -t cgroup -o cpu cgroup /m/sys/fs/cgroup/cpu',
     'mkdir -p /m/sys/fs/cgroup/systemd',
     'mount -t cgroup -o none,name=systemd cgroup /m/sys/fs/cgroup/systemd',
     'mkdir -p /m/sys/fs/cgroup/unified', 'mount -t cgroup2 cgroup2 /m/sys/fs/cgroup/unified']
    >>> cgroup_mounts("cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n", "/m")
    ['mount -t cgroup2 cgroup2 /m/sys/fs/cgroup']
    """
    base = "/sys/fs/cgroup"
    steps: list[str] = []
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4 or not (parts[1] == base or parts[1].startswith(base + "/")):
            continue
        point, fstype, opts = parts[1], parts[2], parts[3].split(",")
        if not re.fullmatch(r"[\w/.-]+", point):
            continue
        target = f"{root}{point}"
        if point != base:
            steps.append(f"mkdir -p {target}")
        if fstype == "tmpfs":
            steps.append(f"mount -t tmpfs -o mode=755 cgroup {target}")
        elif fstype == "cgroup2":
            steps.append(f"mount -t cgroup2 cgroup2 {target}")
        elif fstype == "cgroup":
            keep = [o for o in opts if re.fullmatch(r"[a-z_]+|name=[\w.-]+", o)
                    and o not in ("rw", "ro", "relatime", "noatime", "nosuid", "nodev",
                                  "noexec", "clone_children")]
            if any(o.startswith("name=") for o in keep):
                keep = ["none", *keep]
            if keep:
                steps.append(f"mount -t cgroup -o {','.join(keep)} cgroup {target}")
    return steps


# ------------------------------------------------------------------ checks

def require_root() -> None:
    if os.geteuid() != 0:
        raise NotRootError(
            "the local target needs root: it creates network namespaces, veth links, routes, "
            "cgroups and overlay mounts; run as root (e.g. sudo invoke provision ...)"
        )


def _routes() -> list[dict[str, Any]]:
    out = sh.run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout
    return json.loads(out or "[]")


def _route_net(route: dict[str, Any]) -> ipaddress.IPv4Network | None:
    dst = route.get("dst", "")
    if dst in ("", "default"):
        return None
    try:
        return ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False)
    except ValueError:
        return None


def overlapping_routes(subnet: ipaddress.IPv4Network, own_devs: set[str]) -> list[str]:
    """Routes on this host that overlap the subnet (ignoring our own bridge and guard)."""
    clashes = []
    for r in _routes():
        net = _route_net(r)
        if net is None or not net.overlaps(subnet):
            continue
        if r.get("dev") in own_devs:
            continue
        clashes.append(f"{r.get('dst')} dev {r.get('dev', r.get('type', '?'))}")
    return clashes


def _subnets_in_use() -> list[ipaddress.IPv4Network]:
    from scalelab.core.state import list_clusters

    used = []
    for name in list_clusters():
        rec = load_cluster(name)
        if rec.get("target") == TARGET:
            used.append(ipaddress.ip_network(rec["subnet"]))
    return used


def pick_subnet(requested: str | None, cluster: str) -> ipaddress.IPv4Network:
    """The requested subnet (checked), or the first free /24 of 10.213.0.0/16."""
    own = {bridge_name(cluster)}
    if requested:
        try:
            subnet = ipaddress.ip_network(requested, strict=True)
        except ValueError as exc:
            raise InputError(f"subnet: {requested!r} is not an IPv4 network ({exc}); "
                             "give e.g. 10.213.7.0/24") from None
        if subnet.version != 4 or not 16 <= subnet.prefixlen <= 26:
            raise InputError(f"subnet: {requested} must be IPv4 with a prefix of /16 to /26")
        if not subnet.is_private:
            raise InputError(f"subnet: {requested} is not a private range; use e.g. 10.213.7.0/24")
        clashes = overlapping_routes(subnet, own)
        for other in _subnets_in_use():
            if other.overlaps(subnet) and other != subnet:
                clashes.append(f"{other} (another scalelab cluster)")
        if clashes:
            raise InputError(f"subnet {subnet} overlaps existing route {clashes[0]}; "
                             "choose another with --subnet (e.g. 10.213.9.0/24)")
        return subnet
    used = _subnets_in_use()
    for candidate in DEFAULT_POOL.subnets(new_prefix=24):
        if any(candidate.overlaps(u) for u in used):
            continue
        if overlapping_routes(candidate, own):
            continue
        return candidate
    raise InputError("no free /24 left in 10.213.0.0/16; give one with --subnet")


# ------------------------------------------------------------------ cgroups

@dataclass(frozen=True)
class CpuCgroup:
    """A node's CPU cgroup on whichever hierarchy has the cpu controller."""

    path: Path
    version: int

    @classmethod
    def for_node(cls, cluster: str, name: str) -> CpuCgroup:
        if (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
            return cls(CGROUP_V1_CPU / "scalelab" / cluster / name, 1)
        controllers = CGROUP_V2 / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return cls(CGROUP_V2 / "scalelab" / cluster / name, 2)
        raise ClusterError("no cgroup cpu controller found (neither v1 /sys/fs/cgroup/cpu nor "
                           "v2 with cpu enabled); CPU quotas cannot be applied on this host")

    def create(self, cpus: float) -> None:
        if self.version == 2:
            # v2 needs the controller enabled in every ancestor's subtree_control
            for parent in [CGROUP_V2, *reversed(list(self.path.parents)[: -len(CGROUP_V2.parts)])]:
                parent.mkdir(exist_ok=True)
                if parent != self.path:
                    ctl = parent / "cgroup.subtree_control"
                    if "cpu" not in ctl.read_text().split():
                        ctl.write_text("+cpu")
        self.path.mkdir(parents=True, exist_ok=True)
        self.set_quota(cpus)

    def set_quota(self, cpus: float) -> None:
        quota = max(int(cpus * CFS_PERIOD_US), 1000)
        if self.version == 1:
            (self.path / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.path / "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}")

    def quota_cpus(self) -> float:
        if self.version == 1:
            quota = int((self.path / "cpu.cfs_quota_us").read_text())
            period = int((self.path / "cpu.cfs_period_us").read_text())
        else:
            q, p = (self.path / "cpu.max").read_text().split()
            quota, period = (-1 if q == "max" else int(q)), int(p)
        return quota / period if quota > 0 else float("inf")

    def pids(self) -> list[int]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return [int(p) for p in text.split()]

    def subtree_pids(self) -> list[int]:
        """The pids in this node's cgroups and below, in every hierarchy: a node's containers
        run in child cgroups (the engine's cgroup-parent), in every controller it mounts."""
        found: set[int] = set()
        for d in node_cgroup_dirs(self.path):
            try:
                found.update(int(x) for x in (d / "cgroup.procs").read_text().split())
            except (FileNotFoundError, ValueError):
                pass
        return sorted(found)

    def remove(self) -> None:
        """Remove the cgroup, what is below it in every hierarchy, and its now-empty parents
        (scalelab/<cluster>)."""
        for d in node_cgroup_dirs(self.path):  # deepest first
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cgroup %s not removed: %s", d, exc)
        # and its parents once empty (scalelab/<cluster>, then scalelab), in every hierarchy
        # the node's engine made them in
        home = next((h for h in cgroup_hierarchies() if h in self.path.parents), None)
        groups = ([h / self.path.parent.relative_to(home) for h in cgroup_hierarchies()]
                  if home else [self.path.parent])
        for group in groups:
            for path in (group, group.parent):
                try:
                    path.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    break  # not empty: another node or cluster still lives there


def cgroup_hierarchies(mounts: str | None = None) -> list[Path]:
    """Every cgroup hierarchy mounted under /sys/fs/cgroup (each v1 controller, v2).

    >>> [str(p) for p in cgroup_hierarchies("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\\n"
    ...     "tmpfs /sys/fs/cgroup tmpfs rw 0 0\\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\\n")]
    ['/sys/fs/cgroup/cpu', '/sys/fs/cgroup/unified']
    """
    text = Path("/proc/self/mounts").read_text() if mounts is None else mounts
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] in ("cgroup", "cgroup2") \
                and (parts[1] + "/").startswith("/sys/fs/cgroup/") and Path(parts[1]) not in out:
            out.append(Path(parts[1]))
    return out


def node_cgroup_dirs(cpu_path: Path) -> list[Path]:
    """A node's cgroup directories (its path under scalelab/, in every hierarchy, and all
    below), deepest first, so they can be removed in this order."""
    rel = None
    for h in cgroup_hierarchies():
        if cpu_path == h or h in cpu_path.parents:
            rel = cpu_path.relative_to(h)
            break
    if rel is None:
        return [cpu_path] if cpu_path.exists() else []
    out: list[Path] = []
    for h in cgroup_hierarchies():
        top = h / rel
        if top.is_dir():
            out += [Path(d) for d, _, _ in os.walk(top, topdown=False)]
    return out


# ------------------------------------------------------------------ processes

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours still answers kill(0); reap it if it is ours
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return Path(f"/proc/{pid}").exists() and _state(pid) != "Z"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "X"


def end_pids(pids: list[int], grace_s: float = 2.0) -> None:
    """SIGTERM the given pids, then SIGKILL whatever remains after the grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [p for p in pids if _alive(p)]
        for p in live:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while live and time.monotonic() < deadline:
            live = [p for p in live if _alive(p)]
            time.sleep(0.02)
        if not live:
            return
    raise ClusterError(f"processes {live} did not exit after SIGKILL")


# ------------------------------------------------------------------ the target

class LocalCluster:
    """Create, resize, reshape and destroy one emulated cluster."""

    def __init__(self, name: str) -> None:
        self.name = check_cluster_name(name)
        self.dir = cluster_dir(name)
        self.key = self.dir / "id_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self.shared = self.dir / "node-shared"  # bind-mounted read-only at /etc/scalelab on nodes

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

        rec = self.load()
        fresh = rec is None
        if fresh:
            net = pick_subnet(subnet, self.name)
            if net.num_addresses < nodes + 12:
                raise InputError(f"subnet {net} is too small for {nodes} nodes")
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

        created: list[int] = []
        step = "prepare"
        try:
            if fresh:
                step = "state directory"
                self._init_state()
                self.save(rec)
                step = "guard route"
                self._add_guard(net)
                rec["guard"] = True
                self.save(rec)
                step = "bridge"
                self._add_bridge(net)
            have = {self._index(n["name"]) for n in rec["nodes"]}
            for i in range(nodes):
                if i in have:
                    continue
                step = f"node {node_name(self.name, i)}"
                node, pid = self._add_node(i, net, cpus, rate)
                created.append(i)
                rec["nodes"].append(node.to_dict())
                rec["pids"][node.name] = pid
                rec["nodes"].sort(key=lambda n: self._index(n["name"]))
            step = "known_hosts"
            self._write_known_hosts(rec)
            step = "wait for sshd"
            for i in created:
                self._wait_ssh(node_address(net, i))
            for n in [n for n in rec["nodes"] if self._index(n["name"]) >= nodes]:
                step = f"remove node {n['name']}"
                self._remove_node(self._index(n["name"]), rec["pids"].pop(n["name"], None))
                rec["nodes"].remove(n)
            if cpus != rec["cpus_per_node"]:
                step = "cpu quota"
                for n in rec["nodes"]:
                    CpuCgroup.for_node(self.name, n["name"]).set_quota(cpus)
                rec["cpus_per_node"] = cpus
                for n in rec["nodes"]:
                    n["cpus"] = cpus
            if rate != rec["bandwidth_mbit"]:
                step = "link rate"
                self._shape_all(rec, rate)
            self._write_known_hosts(rec)
            self._write_hosts(rec)
            for n in rec["nodes"]:
                n["facts"] = local_facts(n)
            rec["capabilities"] = LocalTarget().capabilities(rec).to_dict()
            rec["trust_key"] = str(self.key)  # made for this cluster, gone with it
            self.save(rec)
            inventory.write(self.name, self.nodes(rec), known_hosts=str(self.known_hosts),
                            capabilities=LocalTarget().capabilities(rec).as_vars(),
                            trust_key=str(self.key))
        except Exception as exc:
            log.warning("provision failed at step %s; removing what was created", step)
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
            raise ProvisionError(f"local provisioning failed at step '{step}': {detail}; "
                                 "everything it created was removed") from exc
        return self.nodes(rec)

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

    def _shape_node(self, i: int, rate: float | None) -> None:
        ns, veth = netns_name(self.name, i), host_veth(self.name, i)
        for args in netshape.tc_set_args(veth, rate):
            sh.run(["tc", *args], check=rate is not None)
        for args in netshape.tc_set_args(NODE_IFACE, rate):
            sh.run(["ip", "netns", "exec", ns, "tc", *args], check=rate is not None)

    def _shape_all(self, rec: dict[str, Any], rate: float | None) -> None:
        for n in rec["nodes"]:
            self._shape_node(self._index(n["name"]), rate)
        rec["bandwidth_mbit"] = rate

    def set_bandwidth(self, bandwidth: str | float | None) -> float | None:
        rate = bandwidth if bandwidth is None or isinstance(bandwidth, float) else \
            parse_rate_mbit(str(bandwidth))
        require_root()
        rec = self.load()
        if rec is None:
            raise ClusterError(f"cluster {self.name} not found")
        self._shape_all(rec, rate)
        self.save(rec)
        return rate

    def link_rates(self) -> dict[str, tuple[float | None, float | None]]:
        """Read back the rate on both ends of every node's link: name -> (to node, from node)."""
        rec = self.load() or {"nodes": []}
        out = {}
        for n in rec["nodes"]:
            i = self._index(n["name"])
            down = netshape.parse_qdisc_rate(
                sh.run(["tc", "-j", "qdisc", "show", "dev", host_veth(self.name, i)]).stdout)
            up = netshape.parse_qdisc_rate(sh.run(
                ["ip", "netns", "exec", netns_name(self.name, i), "tc", "-j", "qdisc", "show",
                 "dev", NODE_IFACE]).stdout)
            out[n["name"]] = (down, up)
        return out

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

    # -- status

    def alive(self) -> list[bool]:
        rec = self.load() or {"nodes": [], "pids": {}}
        return [bool(rec["pids"].get(n["name"])) and _alive(rec["pids"][n["name"]])
                for n in rec["nodes"]]


def _sshd_config(addr: str) -> str:
    return "\n".join([
        "# Written by scalelab for an emulated node; listens on the cluster address only.",
        f"ListenAddress {addr}",
        "Port 22",
        "HostKey /etc/ssh/ssh_host_ed25519_key",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "PidFile none",
        "AuthorizedKeysFile .ssh/authorized_keys",
        "AcceptEnv LANG LC_*",
        "PermitUserEnvironment no",
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        "Subsystem sftp internal-sftp",
        "",
    ])


def runtime_paths() -> tuple[str, str]:
    """The local target's shortcut: nodes see the controller's venv and checkout at the same
    paths through their overlay's lower layer, so they need no install. Only this target may
    take it; every other target runs what configure installed (scalelab.cluster.facts)."""
    import sys

    project = PROJECT_ROOT
    return str(Path(sys.executable).parent / "python"), str(project)


def _host_memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 0


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

    def apply(self, mbit: float | None) -> None:
        self.cluster.set_bandwidth(mbit)

    def restore(self, snapshot: float | None) -> None:
        self.cluster.set_bandwidth(snapshot)

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
                            systemd=False, own_clock=False, kernel_nfs=False,
                            exportable_root=False, ephemeral=True, containers=True,
                            shares_host_cpus=True, shape_links=True)

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
        LocalCluster(cluster).set_bandwidth(mbit)


def target(name: str = TARGET) -> LocalTarget:
    return LocalTarget()


def describe_rate(rec: dict[str, Any]) -> str:
    return format_rate(rec.get("bandwidth_mbit"))


def leftovers(cluster: str) -> dict[str, list[str]]:
    """What of a cluster exists on the host: used by tests and `destroy` verification."""
    out: dict[str, list[str]] = {}
    prefix = f"scalelab-{cluster}-n"
    out["netns"] = [ln.split()[0] for ln in sh.run(["ip", "netns", "list"]).stdout.splitlines()
                    if ln.strip() and ln.split()[0].startswith(prefix)]
    links = json.loads(sh.run(["ip", "-j", "link", "show"]).stdout or "[]")
    h = short_hash(cluster)
    out["links"] = [ln["ifname"] for ln in links
                    if ln["ifname"] in (f"slb{h}",) or ln["ifname"].startswith(f"slv{h}n")]
    cg = [p / "scalelab" / cluster for p in cgroup_hierarchies()]
    out["cgroups"] = [str(p) for p in cg if p.exists()]
    mounts = Path("/proc/mounts").read_text().splitlines()
    cdir = str(cluster_dir(cluster))
    out["mounts"] = [m for m in mounts if cdir in m or f"/run/netns/{prefix}" in m]
    out["state"] = [cdir] if Path(cdir).exists() else []
    return out


def guard_routes() -> list[str]:
    return [r["dst"] for r in _routes()
            if r.get("type") == "unreachable" and r.get("metric") == GUARD_METRIC]


__all__ = ["LocalCluster", "leftovers", "guard_routes", "require_root", "state_root",
           "CommandError"]
