"""Link probing with iperf3: parsing real output, the readiness wait, and real emulated links."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import have, needs_root, needs_sshd, wait_listening

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node
from scalelab.core.errors import InputError
from scalelab.run import linkprobe
from scalelab.run.linkprobe import (
    LinkProbeError,
    Measurement,
    all_pairs,
    check_links,
    client_line,
    measure,
    parse_iperf3,
    server_argv,
    slow_pairs,
)

DATA = Path(__file__).parent / "data"
# captured with iperf 3.12 on 127.0.0.1: `iperf3 -c 127.0.0.1 -p 5299 -t 1 -J` against
# `iperf3 -s -1 -B 127.0.0.1 -p 5299`; and the same client against a port with no server
# (iperf3 -J exited 0 there: esnet/iperf#1405)
GOLDEN = (DATA / "iperf3_client.json").read_text()
ERROR_DOC = (DATA / "iperf3_client_error.json").read_text()
needs_iperf3 = pytest.mark.skipif(not have("iperf3"),
                                  reason="iperf3 not installed (./bootstrap.sh installs it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node(name: str, role: str = "worker") -> Node:
    return Node(name, f"10.0.0.{name[-1]}", f"10.0.0.{name[-1]}", role, "local")


# ------------------------------------------------------------------ parsing (golden)

def test_parse_real_client_document_gives_the_received_rate():
    text = GOLDEN
    doc = json.loads(text)
    want = doc["end"]["sum_received"]["bits_per_second"] / 1e6
    assert parse_iperf3(text) == pytest.approx(want)
    assert parse_iperf3(text) == pytest.approx(21186.097, abs=0.01)
    # received, not sent: what actually crossed the link
    assert doc["end"]["sum_sent"]["bits_per_second"] != doc["end"]["sum_received"]["bits_per_second"]


def test_parse_real_error_document_raises_iperf3s_own_error():
    text = ERROR_DOC
    with pytest.raises(LinkProbeError, match=r"^iperf3: unable to connect to server: "
                                             r"Connection refused$"):
        parse_iperf3(text)


def test_parse_tolerates_noise_around_the_document_but_not_a_trailing_error():
    text = GOLDEN
    assert parse_iperf3("warning: something\n" + text + "\n") == pytest.approx(21186.097, abs=0.01)
    with pytest.raises(LinkProbeError, match="unable to send control message: Broken pipe"):
        parse_iperf3(text + "iperf3: error - unable to send control message: Broken pipe\n")


@pytest.mark.parametrize("text, msg", [
    ("", "iperf3 printed nothing"),
    ("   \n", "iperf3 printed nothing"),
    ("sh: 1: iperf3: not found\n", "no JSON document: sh: 1: iperf3: not found"),
    ('{"start": {}, "end": {', "not valid JSON"),
    ("[1, 2]", "no JSON document: \\[1, 2\\]"),
    ('{"start": {}, "intervals": [], "end": {}}', "lacks end.sum_received"),
    ('{"end": {"sum_received": {"bits_per_second": "fast"}}}', "impossible rate"),
    ('{"end": {"sum_received": {"bits_per_second": -1}}}', "impossible rate"),
])
def test_parse_malformed_output_raises_one_clear_line(text, msg):
    with pytest.raises(LinkProbeError, match=msg) as exc:
        parse_iperf3(text)
    assert "\n" not in str(exc.value)


def test_parse_a_document_cut_short_says_so():
    truncated = GOLDEN[:200]
    with pytest.raises(LinkProbeError, match="not valid JSON .* cut short"):
        parse_iperf3(truncated)


# ------------------------------------------------------------------ command lines

def test_server_argv_is_one_off_bound_and_bounded():
    argv = server_argv("10.0.0.11", 5301, 14.2)
    assert argv[:7] == ["iperf3", "-s", "-1", "-B", "10.0.0.11", "-p", "5301"]
    assert argv[argv.index("--idle-timeout") + 1] == "15"
    assert argv[argv.index("--rcv-timeout") + 1] == "15000"


def test_client_line_bounds_its_retries_in_count_and_time():
    line = client_line("10.0.0.11", 5301, 2.5, ready_timeout_s=3.0)
    assert "iperf3 -c 10.0.0.11 -p 5301 -t 3 -J --connect-timeout 1000" in line
    assert "[ $n -ge 30 ]" in line  # 3 s / 0.1 s
    assert "end=$(($(date +%s)+4))" in line
    assert "\n" not in line
    # short ready timeouts shorten each connection attempt too
    assert "--connect-timeout 500" in client_line("h", 1, 1, ready_timeout_s=0.5)


@pytest.mark.parametrize("port", [0, 65536, -1, "5201", True])
def test_bad_ports_are_refused(port):
    with pytest.raises(LinkProbeError, match="port"):
        server_argv("10.0.0.1", port, 5)
    with pytest.raises(LinkProbeError, match="port"):
        client_line("10.0.0.1", port, 1)


@pytest.mark.skipif(not have("dash"), reason="dash not installed")
def test_client_line_is_valid_dash():
    subprocess.run(["dash", "-n", "-c", client_line("10.0.0.11", 5301, 1)], check=True,
                   timeout=5)


# ------------------------------------------------------------------ pairs and slow links

def test_all_pairs_each_pair_once_in_a_stable_order():
    ns = [node("n0", "head"), node("n1"), node("n2")]
    pairs = [(a.name, b.name) for a, b in all_pairs(ns)]
    assert pairs == [("n0", "n1"), ("n0", "n2"), ("n1", "n2")]
    assert [(a.name, b.name) for a, b in all_pairs(ns)] == pairs
    assert all_pairs(ns[:1]) == [] and all_pairs([]) == []
    assert len(all_pairs([node(f"n{i}") for i in range(8)])) == 28


def test_slow_pairs_flags_every_pair_of_one_slow_node_among_three():
    # two of three pairs are slow: the median over pairs (20) would hide the slow node
    ms = [Measurement("n0", "n1", 95.6), Measurement("n0", "n2", 19.1),
          Measurement("n1", "n2", 19.2)]
    flagged = slow_pairs(ms)
    assert [m for m, _ in flagged] == ms[1:]
    assert flagged[0][1] == "n0 <-> n2: 19 Mbit/s, 20 % of the median 96 Mbit/s"


def test_slow_pairs_with_healthy_links_flags_nothing():
    ms = [Measurement(f"n{a}", f"n{b}", 950.0 + a + b) for a in range(4) for b in range(a + 1, 4)]
    assert slow_pairs(ms) == []
    assert slow_pairs(ms[:1]) == []
    assert slow_pairs([]) == []


def test_slow_pairs_threshold_is_relative_to_the_median():
    ms = [Measurement("n0", "n1", 1000.0), Measurement("n2", "n3", 1000.0),
          Measurement("n0", "n2", 850.0), Measurement("n1", "n3", 700.0)]
    assert [m.mbit for m, _ in slow_pairs(ms)] == [700.0]
    assert [m.mbit for m, _ in slow_pairs(ms, threshold=0.9)] == [850.0, 700.0]
    assert slow_pairs(ms, threshold=0.5) == []


def test_slow_pairs_lists_failed_pairs_with_their_error():
    ms = [Measurement("n0", "n1", 940.0), Measurement("n0", "n2", None,
                                                      "server n2: iperf3: unable to start listener")]
    assert slow_pairs(ms) == [(ms[1], "n0 <-> n2: not measured: server n2: iperf3: unable to "
                                      "start listener")]
    # nothing measured at all: every pair is reported, none is compared
    failed = [Measurement("n0", "n1", None, "timed out after 31 s")]
    assert slow_pairs(failed) == [(failed[0], "n0 <-> n1: not measured: timed out after 31 s")]


def test_slow_pairs_formats_small_rates_readably():
    ms = [Measurement("n0", "n1", 9.5), Measurement("n0", "n2", 0.42), Measurement("n1", "n2", 0.4)]
    assert slow_pairs(ms)[0][1] == "n0 <-> n2: 0.42 Mbit/s, 4 % of the median 9.5 Mbit/s"


@pytest.mark.parametrize("threshold", [0, -0.5, 1.5, "0.8", None])
def test_slow_pairs_refuses_a_meaningless_threshold(threshold):
    with pytest.raises(InputError, match="threshold"):
        slow_pairs([Measurement("n0", "n1", 1.0)], threshold=threshold)


def test_check_links_with_stop_set_measures_nothing():
    stop = threading.Event()
    stop.set()
    calls = []
    got = check_links([node("n0", "head"), node("n1")], "/nonexistent", stop=stop,
                      progress=lambda *a: calls.append(a))
    assert got == [] and calls == []


def test_check_links_refuses_ports_past_65535():
    with pytest.raises(LinkProbeError, match="65536"):
        check_links([node("n0", "head"), node("n1"), node("n2")], "/nonexistent",
                     base_port=65534)


@pytest.mark.slow
def test_measure_does_not_raise_when_the_nodes_cannot_be_reached(tmp_path):
    # a closed port on 127.0.0.1: ssh is refused at once on both ends
    port = free_port()
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    a = Node("n0", "127.0.0.1", "127.0.0.1", "head", "local", ssh_port=port)
    b = Node("n1", "127.0.0.1", "127.0.0.1", "worker", "local", ssh_port=port)
    t0 = time.monotonic()
    m = measure(a, b, str(kh), 5301)
    # said at once: ssh never reached either node, so nothing was started there to be ended
    # (reaping retries a node it may have started something on for 20 s)
    assert time.monotonic() - t0 < 10
    assert m.mbit is None and not m.ok
    assert (m.server, m.client) == ("n0", "n1")
    assert "\n" not in m.error and "Connection refused" in m.error, m.error
    assert measure(a, a, str(kh), 5301).error == "n0: a node cannot measure a link to itself"


# ------------------------------------------------------------------ real iperf3 on 127.0.0.1

def _end(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=5)


@needs_iperf3
def test_client_started_first_waits_for_the_server_then_prints_one_document():
    port = free_port()
    shell = shutil.which("dash") or "sh"
    client = subprocess.Popen([shell, "-c", client_line("127.0.0.1", port, 1, 5.0)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs = [client]
    try:
        time.sleep(0.5)  # the client is already retrying: the server is not up yet
        server = subprocess.Popen(server_argv("127.0.0.1", port, 10), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        procs.append(server)
        out, err = client.communicate(timeout=20)
        server.communicate(timeout=10)
    finally:
        _end(procs)
    assert client.returncode == 0, err
    assert server.returncode == 0
    assert parse_iperf3(out) > 100  # loopback: gigabits, even on a busy machine
    # exactly one document and nothing after it
    doc, end = json.JSONDecoder().raw_decode(out.strip())
    assert end == len(out.strip()) and "error" not in doc


@needs_iperf3
def test_client_without_a_server_gives_up_in_bounded_time_with_iperf3s_error():
    port = free_port()
    t0 = time.monotonic()
    proc = subprocess.run(["sh", "-c", client_line("127.0.0.1", port, 1, 1.0)],
                          capture_output=True, text=True, timeout=15)
    took = time.monotonic() - t0
    assert 0.9 < took < 5, took
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("iperf3: error - unable to connect to server: "
                                   "Connection refused")
    with pytest.raises(LinkProbeError, match="unable to connect"):
        parse_iperf3(proc.stdout)


@needs_iperf3
def test_server_without_a_client_exits_by_itself():
    port = free_port()
    t0 = time.monotonic()
    proc = subprocess.run(server_argv("127.0.0.1", port, 1), capture_output=True, text=True,
                          timeout=15)
    assert proc.returncode == 0
    assert time.monotonic() - t0 < 5


# ------------------------------------------------------------------ real emulated cluster

@needs_root
@needs_sshd
@needs_iperf3
@pytest.mark.root
@pytest.mark.slow
def test_measure_between_two_nodes_reads_the_shaped_rate(local_cluster):
    lc = local_cluster(2, bandwidth="100mbit")
    a, b = lc.nodes()
    m = measure(a, b, str(lc.known_hosts), port=5301, seconds=2.0)
    assert m.ok, m.error
    assert (m.server, m.client) == (a.name, b.name)
    assert m.mbit == pytest.approx(100, rel=0.10)
    # and the other way round, on the next port
    back = measure(b, a, str(lc.known_hosts), port=5302, seconds=1.0)
    assert back.mbit == pytest.approx(100, rel=0.10), back.error


@needs_root
@needs_sshd
@needs_iperf3
@pytest.mark.root
@pytest.mark.slow
def test_measure_says_why_on_real_failures(local_cluster, monkeypatch):
    """Each failure provoked on real processes: a port the server cannot take, a server the
    client cannot reach, a run that outlives its time, a stop asked for. One line each, no
    exception, and nothing left listening."""
    import subprocess as sp

    from scalelab.cluster.targets.localhost import netns_name

    lc = local_cluster(2)
    a, b = lc.nodes()
    kh = str(lc.known_hosts)
    # the client's readiness wait, shorter: in 1 and 2 it is what the failure waits out
    monkeypatch.setattr(linkprobe, "READY_TIMEOUT_S", 3.0)
    # 1. the port is taken on the server: another program listens there (for at most 60 s)
    holder = ssh.run(a, kh, "nohup timeout 60 python3 -c \"import socket, time; "
                            "s = socket.socket(); s.bind(('" + a.private_address + "', 5321)); "
                            "s.listen(); time.sleep(60)\" >/dev/null 2>&1 & echo $!",
                     timeout=15).stdout.strip()
    wait_listening(netns_name(lc.name, 0), 5321)
    try:
        m = measure(a, b, kh, port=5321)
        assert m.mbit is None
        assert m.error == (f"server {a.name}: iperf3: unable to start listener for "
                           "connections: Address already in use"), m.error
    finally:
        ssh.run(a, kh, f"kill {holder}", timeout=15, check=False)
    # 2. the server listens but the client is turned away (a rule in the server's namespace)
    rule = ["INPUT", "-p", "tcp", "--dport", "5322", "-j", "REJECT", "--reject-with",
            "tcp-reset"]
    ns = ["ip", "netns", "exec", netns_name(lc.name, 0), "iptables"]
    sp.run([*ns, "-I", *rule], check=True, timeout=30)
    try:
        m = measure(a, b, kh, port=5322)
    finally:
        sp.run([*ns, "-D", *rule], check=True, timeout=30)
    assert m.mbit is None
    assert m.error == (f"client {b.name}: iperf3: unable to connect to server: Connection "
                       "refused"), m.error
    # 3. a run that outlives its time: 2 s for a 3 s test
    m = measure(a, b, kh, port=5323, seconds=3.0, timeout_s=2.0)
    assert m.mbit is None and m.error.startswith("timed out after 2 s"), m.error
    monkeypatch.undo()
    # 4. a stop asked for before the measurement: nothing is started
    stop = threading.Event()
    stop.set()
    m = measure(a, b, kh, port=5324, stop=stop)
    assert (m.mbit, m.error) == (None, "interrupted by the user")
    for n in (a, b):
        socks = ssh.run(n, kh, "ss -Hltn; ss -Htn state established", timeout=15).stdout
        assert not [ln for ln in socks.splitlines() if re.search(r":532\d\s", ln + " ")], \
            (n.name, socks)


@needs_root
@needs_sshd
@needs_iperf3
@pytest.mark.root
@pytest.mark.slow
def test_check_links_flags_exactly_the_pairs_of_the_slow_node(local_cluster):
    lc = local_cluster(3, bandwidth="100mbit")
    lc._shape_node(2, 20.0)  # one bad NIC: both directions of node 2's link
    nodes = lc.nodes()
    seen: list[tuple[int, int, Measurement]] = []
    t0 = time.monotonic()
    results = check_links(nodes, str(lc.known_hosts), seconds=1.0, base_port=5311,
                          progress=lambda k, n, m: seen.append((k, n, m)))
    took = time.monotonic() - t0
    assert [(k, n) for k, n, _ in seen] == [(1, 3), (2, 3), (3, 3)]
    assert [m for _, _, m in seen] == results
    assert all(m.ok for m in results), [m.error for m in results]
    rates = {frozenset((m.server, m.client)): m.mbit for m in results}
    slow_node = nodes[2].name
    for pair, mbit in rates.items():
        assert mbit == pytest.approx(20 if slow_node in pair else 100, rel=0.15), (pair, mbit)
    flagged = slow_pairs(results)
    assert {frozenset((m.server, m.client)) for m, _ in flagged} == \
        {frozenset((nodes[0].name, slow_node)), frozenset((nodes[1].name, slow_node))}
    for _, why in flagged:
        assert slow_node in why and "% of the median" in why
    assert took < 3 * 30, took
    # no iperf3 server is left listening, no test left connected, in any node's namespace
    # (nodes share the host's pid space, so a process list would show others' iperf3 too)
    for n in nodes:
        socks = ssh.run(n, str(lc.known_hosts), "ss -Hltn; ss -Htn state established",
                        timeout=15).stdout
        # the probe's ports are 5311-5319 (the shared SSH connection's may start with 531 too)
        assert not [ln for ln in socks.splitlines() if re.search(r":531\d\s", ln + " ")], \
            (n.name, socks)
