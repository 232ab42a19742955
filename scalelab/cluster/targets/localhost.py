"""The host's side of the local target: the names it gives, the subnets and routes it checks,
the cgroups that cap each node's CPUs, the processes it ends by pid, and what of a cluster is
left on the host."""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import json
import logging
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.cluster import netshape
from scalelab.core import sh
from scalelab.core.errors import ClusterError, InputError, NotRootError, ScalelabError
from scalelab.core.state import (
    cluster_dir,
    list_clusters,
    load_cluster,
)

log = logging.getLogger(__name__)


TARGET = "local"
GUARD_METRIC = 4294967295  # lowest priority: only used when no bridge route exists
DEFAULT_POOL = ipaddress.ip_network("10.213.0.0/16")
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")
CFS_PERIOD_US = 100_000


# A bridge is "slb" and a veth "slv" plus hex digits, within Linux's IFNAMSIZ (15 characters
# and the NUL): 12 digits (48 bits) for the bridge, 9 of the same (36 bits) and "n<index>" for
# each node's veth. The digits are picked at provision time so that no link on this machine
# has either name, and kept in the cluster record: destroy reads them, never re-derives them.
LINK_ID_DIGITS = 12
VETH_ID_DIGITS = 9


def link_id(cluster: str, salt: int = 0) -> str:
    """The hex digits a cluster's links are named by; another salt when these are in use.

    >>> link_id("demo"), link_id("demo", 1)
    ('2a97516c354b', 'af7ab74a545c')
    """
    seed = cluster if salt == 0 else f"{cluster}\0{salt}"
    return hashlib.sha256(seed.encode()).hexdigest()[:LINK_ID_DIGITS]


def bridge_of(lid: str) -> str:
    """A cluster's bridge, by its link id.

    >>> bridge_of('2a97516c354b')
    'slb2a97516c354b'
    """
    return f"slb{lid}"


def host_veth(lid: str, index: int) -> str:
    """The host's end of node index's veth (records made before link ids kept 5 digits).

    >>> host_veth('2a97516c354b', 63), host_veth('89e49', 0)
    ('slv2a97516c3n63', 'slv89e49n0')
    """
    return f"slv{lid[:VETH_ID_DIGITS]}n{index}"


def record_link_id(rec: dict[str, Any]) -> str:
    """The link id a cluster record names (older records: their bridge's 5 hex digits).

    >>> record_link_id({"bridge": "slb89e49"}), record_link_id({"link_id": "2a97516c354b"})
    ('89e49', '2a97516c354b')
    """
    return rec.get("link_id") or rec["bridge"].removeprefix("slb")


def link_alias(cluster: str) -> str:
    """The alias every link of this cluster carries (ip link shows it): scalelab's, this
    cluster's, and this state directory's, so that no other cluster, of this state directory
    or another one, can be taken for it."""
    home = hashlib.sha256(str(cluster_dir(cluster)).encode()).hexdigest()[:12]
    return f"scalelab:{cluster}:{home}"


def host_links() -> list[dict[str, Any]]:
    """Every link in the host's network namespace, as `ip -j link show` gives it."""
    return json.loads(sh.run(["ip", "-j", "link", "show"]).stdout or "[]")


def pick_link_id(cluster: str, links: list[dict[str, Any]], taken: set[str]) -> str:
    """Link digits for a new cluster: no link on this machine has its bridge's or its veths'
    names, and no other cluster of this state directory records them (taken).

    >>> pick_link_id("demo", [{"ifname": "slb2a97516c354b"}], set())
    'af7ab74a545c'
    """
    names = [ln["ifname"] for ln in links]
    for salt in range(64):
        lid = link_id(cluster, salt)
        veths = f"slv{lid[:VETH_ID_DIGITS]}n"
        if bridge_of(lid) in names or any(n.startswith(veths) for n in names) \
                or any(t[:VETH_ID_DIGITS] == lid[:VETH_ID_DIGITS] for t in taken):
            continue
        return lid
    raise ClusterError(f"no free link name for cluster {cluster}; remove stale slb*/slv* links")


def own_links(alias: str, recorded: str | None, links: list[dict[str, Any]]) -> list[str]:
    """The links that are a cluster's to remove: those carrying its alias, and the one its
    record names if that carries no alias at all (made by a scalelab before aliases, or by a
    provision killed between `ip link add` and the alias). A link the record names that
    carries another alias is another cluster's, and is left alone.

    >>> links = [{"ifname": "slbA", "ifalias": "scalelab:a:1"}, {"ifname": "slbB"},
    ...          {"ifname": "slbC", "ifalias": "scalelab:c:1"}]
    >>> own_links("scalelab:a:1", "slbB", links), own_links("scalelab:b:1", "slbC", links)
    (['slbA', 'slbB'], [])
    """
    out = [ln["ifname"] for ln in links if ln.get("ifalias") == alias]
    named = next((ln for ln in links if ln["ifname"] == recorded), None)
    if named is not None and recorded not in out:
        if named.get("ifalias"):
            log.warning("link %s is named in the record but carries alias %r, not %r; "
                        "left alone", recorded, named["ifalias"], alias)
        else:
            out.append(named["ifname"])
    return out


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
    used = []
    for name in list_clusters():
        rec = load_cluster(name)
        if rec.get("target") == TARGET:
            used.append(ipaddress.ip_network(rec["subnet"]))
    return used


def pick_subnet(requested: str | None, cluster: str) -> ipaddress.IPv4Network:
    """The requested subnet (checked), or the first free /24 of 10.213.0.0/16."""
    own = set(own_links(link_alias(cluster), None, host_links()))
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


def _ns_key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def netns_pids(ns: str) -> list[int]:
    """Every process whose network namespace is node ns's: its sshd, the sessions and ranks
    it started, and anything run in it with `ip netns exec`. None once the namespace is gone
    (after a reboot, say), so a recorded pid is never taken on trust."""
    want = _ns_key(f"/run/netns/{ns}")
    if want is None:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _ns_key(f"/proc/{entry}/ns/net") == want:
            out.append(int(entry))
    return sorted(out)


def in_netns(pid: int, ns: str) -> bool:
    """Whether pid (a recorded sshd, say) still runs in node ns's network namespace: the pid
    may since belong to anyone, once its sshd ended or the machine rebooted."""
    want = _ns_key(f"/run/netns/{ns}")
    return want is not None and _ns_key(f"/proc/{pid}/ns/net") == want and _alive(pid)


def child_of_this_process(pid: int) -> bool:
    """Whether pid is this process's own child (an sshd this provision started a moment ago,
    not yet in its node's namespace)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid()


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


def _host_memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 0


def leftovers(cluster: str) -> dict[str, list[str]]:
    """What of a cluster exists on the host: used by tests and `destroy` verification."""
    out: dict[str, list[str]] = {}
    prefix = f"scalelab-{cluster}-n"
    out["netns"] = [ln.split()[0] for ln in sh.run(["ip", "netns", "list"]).stdout.splitlines()
                    if ln.strip() and ln.split()[0].startswith(prefix)]
    # links by this cluster's alias, and those its record names (by their link id)
    alias = link_alias(cluster)
    try:
        rec = load_cluster(cluster)
        lid = record_link_id(rec) if rec.get("target") == TARGET else None
    except (ClusterError, KeyError):
        lid = None
    out["links"] = [ln["ifname"] for ln in host_links()
                    if ln.get("ifalias") == alias or ln.get("ifalias", "").startswith(alias + ":n")
                    or (lid and (ln["ifname"] == bridge_of(lid) or
                                 ln["ifname"].startswith(host_veth(lid, 0)[:-1])))]
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


# ------------------------------------------------------------------ shaping a node's paths

NODE_IFACE = "eth0"  # a node's end of its veth


def _tc(ns: str | None, args: list[str], check: bool) -> str:
    return sh.run([*(["ip", "netns", "exec", ns] if ns else []), "tc", *args],
                  check=check).stdout


def shape_node(cluster: str, i: int, veth: str, rate: float | None,
               delay_us: float = 0.0, min_queue_bytes: int = 0) -> None:
    """One rate on both ends of node i's veth (None: unshaped); delay_us: what the node's
    packets wait on their way out, one hop's latency each way (tc netem, under the rate);
    min_queue_bytes: the least its queues hold (netshape.server_queue_bytes)."""
    for ns, dev, delay in ((None, veth, 0.0),
                           (netns_name(cluster, i), NODE_IFACE, delay_us)):
        steps = netshape.tc_set_args(dev, rate, delay, min_queue_bytes)
        if rate is not None and steps[0][1] != "del":  # nothing of an earlier delay stays
            steps = [["qdisc", "del", "dev", dev, "root"], *steps]
        for k, args in enumerate(steps):
            _tc(ns, args, rate is not None and k > 0)


@functools.lru_cache(maxsize=1)
def netem_available() -> bool:
    """Whether this kernel has tc's netem (CONFIG_NET_SCH_NETEM), which a hop's latency is
    emulated with; tried in a network namespace of its own, so no device of the host's and
    none of a cluster's is touched."""
    try:
        return sh.run(["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                       "delay", "1us"], check=False, timeout=10).returncode == 0
    except (OSError, ScalelabError):
        return False


def shape_loopback(cluster: str, i: int, rate: float | None) -> None:
    """One rate on node i's loopback, the path between its ranks (None: unshaped)."""
    for args in netshape.tc_set_args("lo", rate):
        _tc(netns_name(cluster, i), args, rate is not None)


def node_rates(cluster: str, i: int, veth: str,
               dev: str = NODE_IFACE) -> tuple[float | None, float | None]:
    """The rates read back on node i: (into the node, out of it on dev)."""
    down = None if dev == "lo" else netshape.parse_qdisc_rate(
        _tc(None, ["-j", "qdisc", "show", "dev", veth], True))
    up = netshape.parse_qdisc_rate(_tc(netns_name(cluster, i),
                                       ["-j", "qdisc", "show", "dev", dev], True))
    return down, up
