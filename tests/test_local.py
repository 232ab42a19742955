"""The local target, for real: namespaces, veth, tc, cgroups, overlay roots and sshd."""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    have,
    invoke,
    needs_root,
    needs_sshd,
    running,
    unique_name,
    wait_listening,
    wait_until,
)

from scalelab.cluster import ssh
from scalelab.cluster.targets import local, localhost
from scalelab.cluster.targets.local import LocalCluster
from scalelab.cluster.targets.localhost import leftovers
from scalelab.core import sh
from scalelab.core.errors import InputError, ProvisionError
from scalelab.core.state import cluster_dir, private_dir, save_cluster

pytestmark = [needs_root, needs_sshd, pytest.mark.root]


def on(lc: LocalCluster, i: int, cmd: str, timeout: float = 30) -> str:
    node = lc.nodes()[i]
    return ssh.run(node, str(lc.known_hosts), cmd, timeout=timeout).stdout.strip()


def default_gateway() -> str | None:
    for r in json.loads(sh.run(["ip", "-j", "-4", "route", "show", "default"]).stdout or "[]"):
        return r.get("gateway")
    return None


def route_get(addr: str) -> str:
    return sh.run(["ip", "route", "get", addr], check=False).stdout + \
        sh.run(["ip", "route", "get", addr], check=False).stderr


def iperf_mbit(lc: LocalCluster, server: int, client: int, seconds: float = 2.0) -> float:
    """TCP throughput from node `client` to node `server`, measured with iperf3 in their netns."""
    srv_addr = lc.nodes()[server].address
    pidfile = lc.dir / "iperf.pid"
    sh.run(["ip", "netns", "exec", localhost.netns_name(lc.name, server), "iperf3", "-s", "-1", "-D",
            "-B", srv_addr, "--pidfile", str(pidfile)])
    try:
        wait_listening(localhost.netns_name(lc.name, server), 5201)
        out = sh.run(["ip", "netns", "exec", localhost.netns_name(lc.name, client), "iperf3", "-c",
                      srv_addr, "-t", str(seconds), "-J"], timeout=seconds + 15).stdout
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        if pidfile.exists():
            pid = int(pidfile.read_text().strip() or 0)
            if pid:
                localhost.end_pids([pid])


def test_three_nodes_answer_ssh_with_the_cluster_key_and_pinned_host_keys(local_cluster):
    lc = local_cluster(3)
    nodes = lc.nodes()
    assert [n.role for n in nodes] == ["head", "worker", "worker"]
    for i, n in enumerate(nodes):
        assert on(lc, i, "hostname") == n.name
        # each node has its own network namespace: it sees only lo and eth0
        links = on(lc, i, "ls /sys/class/net").split()
        assert sorted(links) == ["eth0", "lo"]
    # key files are private; host keys are pinned, one line per node
    assert oct(lc.key.stat().st_mode & 0o777) == "0o600"
    assert oct(lc.dir.stat().st_mode & 0o777) == "0o700"
    assert len(lc.known_hosts.read_text().splitlines()) == 3
    # a node reaches another node by SSH with the cluster key (what horovodrun needs)
    assert on(lc, 0, f"ssh {nodes[2].address} hostname") == nodes[2].name


def test_unknown_host_key_is_refused(local_cluster, tmp_path):
    lc = local_cluster(1)
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    proc = ssh.run(lc.nodes()[0], str(empty), "true", check=False)
    assert proc.returncode != 0
    assert "verification failed" in proc.stderr.lower() or "no " in proc.stderr.lower()


@pytest.mark.skipif(not have("iperf3"), reason="iperf3 not installed (./bootstrap.sh installs it)")
def test_link_rate_is_enforced_and_changes_without_reprovisioning(local_cluster):
    lc = local_cluster(3, bandwidth="100mbit")
    pids_before = dict(lc.load()["pids"])
    mbit = iperf_mbit(lc, 1, 2)
    assert 90 <= mbit <= 110, f"100mbit link measured {mbit:.1f} Mbit/s"
    lc.set_bandwidth("300mbit")
    assert lc.load()["pids"] == pids_before  # same nodes, same sshd processes
    mbit = iperf_mbit(lc, 1, 2)
    assert 270 <= mbit <= 330, f"300mbit link measured {mbit:.1f} Mbit/s"
    rates = lc.link_rates()
    assert set(rates.values()) == {(300.0, 300.0)}
    # the path between the ranks of one node is its own loopback, shaped apart from the link
    lc.set_intra(150.0)
    assert set(lc.link_rates("lo").values()) == {(None, 150.0)}
    mbit = iperf_mbit(lc, 1, 1)
    assert 135 <= mbit <= 165, f"150mbit loopback measured {mbit:.1f} Mbit/s"
    assert 270 <= iperf_mbit(lc, 1, 2) <= 330  # the link kept its own rate
    # invoke shape sets the link and leaves no path between ranks shaped (a sweep's setting)
    local.LocalTarget().set_rate(lc.name, 300.0)
    assert set(lc.link_rates("lo").values()) == {(None, None)}
    assert set(lc.link_rates().values()) == {(300.0, 300.0)}
    lc.set_bandwidth("native")
    assert set(lc.link_rates().values()) == {(None, None)}


def rtt_ms(lc: LocalCluster, src: int, dst: int) -> float:
    """The round trip from node src to node dst: the shortest of 5 TCP connects to its sshd
    (a connect returns on the SYN-ACK)."""
    addr = lc.nodes()[dst].private_address
    script = ("import socket, time\n"
              "def once():\n"
              "    s = socket.create_connection(('" + addr + "', 22), timeout=5)\n"
              "    s.close()\n"
              "best = 1e9\n"
              "for _ in range(5):\n"
              "    t = time.perf_counter(); once(); best = min(best, time.perf_counter() - t)\n"
              "print(best * 1e3)\n")
    return float(on(lc, src, f"python3 -c {shlex.quote(script)}").strip())


@pytest.mark.skipif(not localhost.netem_available(),
                    reason="this kernel has no tc netem (CONFIG_NET_SCH_NETEM): a fabric "
                           "profile's per-hop latency is then in the model only")
def test_a_hop_delay_sits_under_the_rate_and_goes_with_it(local_cluster):
    lc = local_cluster(2, bandwidth="100mbit")
    quick = rtt_ms(lc, 0, 1)
    lc.set_bandwidth(100.0, delay_us=5000.0)
    # each node delays what it sends: 5 ms there and 5 ms back
    assert 10.0 <= rtt_ms(lc, 0, 1) <= 10.0 + quick + 5.0
    assert set(lc.link_rates().values()) == {(100.0, 100.0)}  # the rate is still the root's
    assert 85 <= iperf_mbit(lc, 1, 0) <= 110
    lc.set_bandwidth(100.0)  # the same rate without the delay: none of it stays
    assert rtt_ms(lc, 0, 1) < 5.0


def test_cpu_quota_caps_a_busy_node(local_cluster):
    lc = local_cluster(1, cpus_per_node="0.5")
    cg = localhost.CpuCgroup.for_node(lc.name, lc.nodes()[0].name)
    assert cg.quota_cpus() == pytest.approx(0.5)
    # a busy loop inside the node gets about half a CPU: CPU time / wall time
    script = ("import time,os; w=time.time(); c=time.process_time()\n"
              "while time.time()-w<1.5: pass\n"
              "print((time.process_time()-c)/(time.time()-w))")
    ratio = float(on(lc, 0, f"python3 -c '{script}'"))
    assert 0.3 <= ratio <= 0.65, f"node with 0.5 CPU ran at {ratio:.2f} CPU"


def test_node_writes_stay_on_that_node(local_cluster):
    lc = local_cluster(2)
    marker = f"/etc/scalelab-test-{unique_name()}"
    on(lc, 0, f"echo hello > {marker} && mkdir -p /root/.ssh/extra && apt-config dump >/dev/null")
    assert on(lc, 0, f"cat {marker}") == "hello"
    assert not Path(marker).exists(), "a node's /etc write reached the host"
    assert on(lc, 1, f"test -e {marker} && echo yes || echo no") == "no"
    assert not Path("/root/.ssh/extra").exists()


def test_provision_is_idempotent_and_resizes(local_cluster):
    lc = local_cluster(2)
    rec = lc.load()
    lc.provision(2)
    assert lc.load()["pids"] == rec["pids"], "the same command again restarted nodes"
    lc.provision(3)
    assert [n.name for n in lc.nodes()] == [f"{lc.name}-n{i}" for i in range(3)]
    assert on(lc, 2, "hostname") == f"{lc.name}-n2"
    lc.provision(1)
    assert [n.name for n in lc.nodes()] == [f"{lc.name}-n0"]
    gone = localhost.netns_name(lc.name, 1)
    assert gone not in sh.run(["ip", "netns", "list"]).stdout
    assert lc.load()["pids"][f"{lc.name}-n0"] == rec["pids"][f"{lc.name}-n0"]
    assert len(lc.known_hosts.read_text().splitlines()) == 1


def test_destroy_leaves_nothing_behind(local_cluster):
    lc = local_cluster(3)
    pids = list(lc.load()["pids"].values())
    subnet = lc.load()["subnet"]
    # a process started on a node (as a benchmark would) must be ended too
    on(lc, 1, "nohup sleep 300 >/dev/null 2>&1 &")
    cg = localhost.CpuCgroup.for_node(lc.name, lc.nodes()[1].name)
    assert len(cg.pids()) >= 2
    extra = [p for p in cg.pids() if p not in pids]
    # decoys outside the cluster, named as the node's processes are: a copy of sleep called
    # sshd with the node's sshd command line, and a sleep 300. Teardown ends processes by pid
    # (README), so a kill by process name or by command line would be caught here
    sshd_argv = Path(f"/proc/{pids[0]}/cmdline").read_text().rstrip("\0").split("\0")
    fake = Path(tempfile.mkdtemp()) / "sshd"
    shutil.copy2(shutil.which("sleep"), fake)
    decoys = [subprocess.Popen([" ".join(sshd_argv), "300"], executable=str(fake)),
              subprocess.Popen(["sleep", "300"])]
    try:
        assert Path(f"/proc/{decoys[0].pid}/comm").read_text().strip() == "sshd"
        lc.destroy()
        assert [d.poll() for d in decoys] == [None, None], "teardown ended a process by name"
    finally:
        for d in decoys:  # ours, by pid
            d.kill()
            d.wait(timeout=10)
        shutil.rmtree(fake.parent)
    left = leftovers(lc.name)
    assert left == {"netns": [], "links": [], "cgroups": [], "mounts": [], "state": []}
    # gone, or a zombie waiting for init to reap it: nothing of ours still runs
    assert not [p for p in pids + extra if localhost._state(p) not in ("X", "Z")]
    assert subnet not in localhost.guard_routes()
    assert not (Path(os.environ["SCALELAB_INVENTORIES"]) / f"{lc.name}.yml").exists()
    assert lc.name not in sh.run(["ip", "-j", "route", "show", "table", "all"]).stdout


def test_subnet_never_routes_through_the_default_gateway(monkeypatch):
    """After every command of a provision, a reshape, a shrink and a destroy: whenever any
    link of the cluster exists, the guard route exists too, and `ip route get` of a node
    address never resolves through the default gateway."""
    gw = default_gateway()
    if gw is None:
        pytest.skip("no default route on this host")
    lc = LocalCluster(unique_name())
    real_run = sh.run
    checks = {"n": 0, "with_links": 0}
    state = {"subnet": None, "lid": None}

    def raw(*cmd: str) -> str:
        return subprocess.run(cmd, capture_output=True, text=True).stdout

    def observed(cmd, **kw):
        result = real_run(cmd, **kw)
        rec_path = lc.dir / "cluster.json"
        if state["subnet"] is None and rec_path.exists():
            rec = json.loads(rec_path.read_text())
            state["subnet"], state["lid"] = rec["subnet"], rec["link_id"]
        if state["subnet"]:
            net = ipaddress.ip_network(state["subnet"])
            routes = json.loads(raw("ip", "-j", "-4", "route", "show", "table", "all") or "[]")
            guarded = any(r.get("type") == "unreachable" and r.get("dst") == str(net)
                          for r in routes)
            links = [ln["ifname"] for ln in json.loads(raw("ip", "-j", "link", "show"))]
            lid = state["lid"]
            ours = [x for x in links if x == localhost.bridge_of(lid)
                    or x.startswith(localhost.host_veth(lid, 0)[:-1])]
            if ours:
                checks["with_links"] += 1
                assert guarded, f"after {cmd}: links {ours} exist without the guard route"
            if ours or guarded:
                for addr in (str(net.network_address + 10), str(net.network_address + 12)):
                    out = raw("ip", "route", "get", addr)
                    checks["n"] += 1
                    assert f"via {gw}" not in out, f"after {cmd}: {out}"
        return result

    monkeypatch.setattr(sh, "run", observed)
    try:
        lc.provision(3, bandwidth="1gbit")
        lc.set_bandwidth("native")
        lc.provision(2)
    finally:
        lc.destroy()
    assert checks["with_links"] > 10 and checks["n"] > 20


def test_failed_step_removes_everything_and_names_the_step(monkeypatch):
    lc = LocalCluster(unique_name())

    def broken(self, addr, timeout_s=15.0):
        raise local.ClusterError(f"sshd on {addr} did not answer")

    monkeypatch.setattr(LocalCluster, "_wait_ssh", broken)
    with pytest.raises(ProvisionError, match="step 'wait for sshd'"):
        lc.provision(2)
    assert leftovers(lc.name) == {"netns": [], "links": [], "cgroups": [], "mounts": [],
                                  "state": []}


def test_overlapping_subnet_is_refused_before_anything_is_made():
    routes = json.loads(sh.run(["ip", "-j", "-4", "route", "show"]).stdout)
    connected = [r["dst"] for r in routes if "/" in r.get("dst", "") and r.get("dev") != "lo"]
    if not connected:
        pytest.skip("no connected IPv4 route to overlap with")
    name = unique_name()
    with pytest.raises(InputError, match="overlaps existing route"):
        LocalCluster(name).provision(2, subnet=connected[0])
    assert leftovers(name)["state"] == []


@pytest.mark.parametrize("args, message", [
    (["--nodes", "0"], "nodes: 0 must be 1 or more"),
    (["--nodes", "-1"], "nodes: -1 must be 1 or more"),
    (["--nodes", "abc"], "nodes"),
    (["--bandwidth", "fast"], "bandwidth: 'fast' is not a rate"),
    (["--bandwidth", "0mbit"], "bandwidth: '0mbit' is zero"),
    (["--cpus-per-node", "0"], "cpus-per-node: '0' must be above 0"),
    (["--target", "moon"], "target: 'moon' is unknown"),
    (["--subnet", "10.0.0.0/33"], "subnet"),
    (["--cluster", "Bad_Name"], "cluster: 'Bad_Name' is not a valid name"),
])
def test_bad_provision_input_is_one_line_and_creates_nothing(args, message, tmp_path):
    name = unique_name()
    env = {"SCALELAB_HOME": str(tmp_path / "s"), "SCALELAB_INVENTORIES": str(tmp_path / "i")}
    opts = {"--target": "local", "--cluster": name, "--nodes": "2"}
    opts.update(dict(zip(args[::2], args[1::2], strict=True)))
    cmd = ["provision", *[x for kv in opts.items() for x in kv]]
    proc = invoke(*cmd, env=env)
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert message in err
    assert not (tmp_path / "s" / "clusters").exists() or not any((tmp_path / "s" / "clusters").iterdir())
    assert not (tmp_path / "i").exists() or not any((tmp_path / "i").iterdir())
    assert leftovers(name)["netns"] == [] and leftovers(name)["links"] == []


def test_not_root_is_one_line_saying_why():
    if not have("setpriv"):
        pytest.skip("setpriv not available")
    home = Path(tempfile.mkdtemp(prefix="scalelab-nobody-"))
    home.chmod(0o777)
    env = {**os.environ, "SCALELAB_HOME": str(home / "s"), "HOME": str(home)}
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           str(Path(os.sys.executable)), "-m", "invoke", "provision",
                           "--cluster", unique_name()],
                          cwd=Path(__file__).resolve().parent.parent, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "needs root" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (home / "s").exists()
    shutil.rmtree(home)


# ------------------------------------------------------------ what is the cluster's, proven

NOTHING = {"netns": [], "links": [], "cgroups": [], "mounts": [], "state": []}


def processes_of(lc: LocalCluster) -> list[int]:
    """Running processes that are the cluster's: chrooted into one of its nodes' roots, or in
    one of its cgroups."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            root = os.readlink(f"/proc/{entry}/root")
            groups = Path(f"/proc/{entry}/cgroup").read_text()
        except OSError:
            continue
        if (root.startswith(str(lc.dir)) or f"/scalelab/{lc.name}/" in groups) \
                and running(int(entry)):
            found.append(int(entry))
    return found


def namespaces() -> set[str]:
    run_netns = Path("/run/netns")
    return set(os.listdir(run_netns)) if run_netns.is_dir() else set()


def test_ctrl_c_during_provision_removes_what_it_made_and_destroy_spares_a_strangers_pid():
    """SIGINT to `invoke provision` once its first namespace exists: every namespace, link,
    the guard route, mount and sshd it made is gone, and provisioning that name again works.
    Then that cluster's sshd is ended and its recorded pid handed to a process of ours in the
    host's namespace (as after a reboot): destroy leaves that process running."""
    lc = LocalCluster(unique_name())
    links_before = {ln["ifname"] for ln in localhost.host_links()}
    guards_before = set(localhost.guard_routes())
    env = {**os.environ, "SCALELAB_LOG": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "provision", "--cluster", lc.name,
                             "--nodes", "3"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stranger = None
    try:
        wait_until(lambda: proc.poll() is not None or any(
            n.startswith(f"scalelab-{lc.name}-n") for n in namespaces()), 60,
            "a namespace of the cluster")
        assert proc.poll() is None, "provision ended before it could be interrupted"
        rec = json.loads((lc.dir / "cluster.json").read_text())  # written before any node
        proc.send_signal(signal.SIGINT)  # by pid: the invoke process this test started
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert leftovers(lc.name) == NOTHING, err
        assert err.strip().splitlines()[-1] == "interrupted", err
        assert "removing what it created" in err, err
        links = {ln["ifname"] for ln in localhost.host_links()}
        assert rec["bridge"] not in links
        assert not [x for x in links - links_before if x.startswith(("slb", "slv"))]
        assert set(localhost.guard_routes()) == guards_before
        assert rec["subnet"] not in sh.run(["ip", "-j", "route", "show", "table", "all"]).stdout
        assert not processes_of(lc)

        again = invoke("provision", "--cluster", lc.name, "--nodes", "1")
        assert again.returncode == 0, again.stderr
        assert on(lc, 0, "hostname") == f"{lc.name}-n0"

        # its sshd ends; the pid recorded for it is now a process of ours outside the node
        rec = lc.load()
        node = f"{lc.name}-n0"
        localhost.end_pids([rec["pids"][node]])
        stranger = subprocess.Popen(["sleep", "300"])
        rec["pids"][node] = stranger.pid
        lc.save(rec)
        (lc.dir / "nodes" / node / "sshd.pid").write_text(f"{stranger.pid}\n")
        gone = invoke("destroy", "--cluster", lc.name)
        assert gone.returncode == 0, gone.stderr
        assert stranger.poll() is None and running(stranger.pid), "destroy ended a stranger"
        assert leftovers(lc.name) == NOTHING
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if stranger is not None:
            stranger.kill()  # ours, by pid
            stranger.wait(timeout=10)
        if lc.dir.exists() or any(leftovers(lc.name).values()):
            lc.destroy()


@pytest.fixture(scope="module")
def standing():
    """One node of a cluster the tests below look at and must leave as they found it."""
    lc = LocalCluster(unique_name())
    try:
        lc.provision(1)
        yield lc
    finally:
        lc.destroy()


def test_demo_refuses_a_cluster_it_did_not_create(standing):
    """`invoke demo` on a name that exists: one line, before any provisioning or sweep."""
    before = (standing.dir / "cluster.json").read_bytes()
    reports = Path(os.environ["SCALELAB_REPORTS"])
    reports_before = sorted(reports.rglob("*"))
    proc = invoke("demo", "--cluster", standing.name, "--nodes", "2", "--sweep", "ci",
                  timeout=60)
    assert proc.returncode == 1, proc.stdout[-2000:]
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert f"cluster {standing.name} already exists" in err, err
    assert f"invoke destroy --cluster {standing.name}" in err and "--cluster NAME" in err, err
    assert (standing.dir / "cluster.json").read_bytes() == before
    assert standing.alive() == [True]
    assert localhost.netns_name(standing.name, 1) not in namespaces()
    assert sorted(reports.rglob("*")) == reports_before


def five_digits(name: str) -> str:
    """The hex digits bridge names were made of before link ids (sha1, five of them)."""
    return hashlib.sha1(name.encode()).hexdigest()[:5]


def colliding_name(name: str) -> str:
    """Another valid cluster name whose five digits are name's (about 2**20 tries)."""
    want = five_digits(name)
    return next(c for c in (f"b{k}" for k in itertools.count())
                if c != name and five_digits(c) == want)


def test_destroying_another_name_leaves_a_clusters_bridge_alone(standing):
    """Destroy of a name whose old five-digit bridge name is this cluster's, never created,
    then with a record naming this cluster's bridge: the bridge, its veth and node stay."""
    rec = standing.load()
    node = standing.nodes()[0]
    other = colliding_name(standing.name)

    def intact() -> None:
        links = {ln["ifname"]: ln for ln in localhost.host_links()}
        assert links[rec["bridge"]].get("ifalias") == localhost.link_alias(standing.name)
        assert localhost.host_veth(rec["link_id"], 0) in links
        assert on(standing, 0, "hostname") == node.name

    proc = invoke("destroy", "--cluster", other)
    assert proc.returncode == 1 and f"cluster {other!r} not found" in proc.stderr, proc.stderr
    intact()
    # a record of another cluster that names this one's bridge, veth and sshd pid (hand-edited,
    # or left by names that collided): its destroy removes only what carries its own alias,
    # and ends only what runs in its own nodes
    sshd = rec["pids"][node.name]
    private_dir(cluster_dir(other))
    save_cluster(other, {"name": other, "target": "local", "subnet": "10.213.254.0/24",
                         "link_id": rec["link_id"], "bridge": rec["bridge"],
                         "nodes": [{"name": f"{other}-n0"}], "pids": {f"{other}-n0": sshd},
                         "cpus_per_node": 1.0, "bandwidth_mbit": None,
                         "known_hosts": str(cluster_dir(other) / "known_hosts")})
    proc = invoke("destroy", "--cluster", other)
    assert proc.returncode == 0, proc.stderr
    assert not cluster_dir(other).exists()
    intact()
    assert standing.load()["pids"][node.name] == sshd and running(sshd)
    # names within Linux's 15 characters, with 48 bits of the name's hash in the bridge's
    assert len(rec["bridge"]) <= 15 and len(localhost.host_veth(rec["link_id"], 63)) <= 15
    assert len(rec["link_id"]) == 12


def test_destroy_of_a_name_not_recorded_here_leaves_its_namespace_alone():
    """A namespace named as a node of a cluster this state directory never made (another
    SCALELAB_HOME's, or someone's): destroy of that name refuses in one line, and keeps it."""
    name = unique_name()
    ns = localhost.netns_name(name, 0)
    sh.run(["ip", "netns", "add", ns])
    try:
        proc = invoke("destroy", "--cluster", name)
        err = proc.stderr.strip()
        assert proc.returncode == 1 and len(err.splitlines()) == 1, err
        assert f"cluster {name} is not recorded in this state directory" in err, err
        assert ns in namespaces()
    finally:
        sh.run(["ip", "netns", "del", ns], check=False)
