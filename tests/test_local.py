"""The local target, for real: namespaces, veth, tc, cgroups, overlay roots and sshd."""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import have, invoke, needs_root, needs_sshd, unique_name, wait_listening

from scalelab.cluster import ssh
from scalelab.cluster.targets import local, localhost
from scalelab.cluster.targets.local import LocalCluster
from scalelab.cluster.targets.localhost import leftovers
from scalelab.core import sh
from scalelab.core.errors import InputError, ProvisionError

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
    h = localhost.short_hash(lc.name)
    real_run = sh.run
    checks = {"n": 0, "with_links": 0}
    state = {"subnet": None}

    def raw(*cmd: str) -> str:
        return subprocess.run(cmd, capture_output=True, text=True).stdout

    def observed(cmd, **kw):
        result = real_run(cmd, **kw)
        rec_path = lc.dir / "cluster.json"
        if state["subnet"] is None and rec_path.exists():
            state["subnet"] = json.loads(rec_path.read_text())["subnet"]
        if state["subnet"]:
            net = ipaddress.ip_network(state["subnet"])
            routes = json.loads(raw("ip", "-j", "-4", "route", "show", "table", "all") or "[]")
            guarded = any(r.get("type") == "unreachable" and r.get("dst") == str(net)
                          for r in routes)
            links = [ln["ifname"] for ln in json.loads(raw("ip", "-j", "link", "show"))]
            ours = [x for x in links if x == f"slb{h}" or x.startswith(f"slv{h}n")]
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
