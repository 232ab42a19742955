"""Measure node-to-node TCP rates with iperf3 and find the slow links of a cluster.

One measurement is a one-off iperf3 server on one node and an iperf3 client on the other,
both started over SSH by scalelab.run.launch (so they run in their own process groups and are
reaped by pid, never by name). There is no fixed sleep between the two: the client retries
its connection every 0.1 s until the server listens, bounded in tries and in time, and the
server gives up by itself when no client comes (--idle-timeout) or a client goes silent
(--rcv-timeout), so neither can linger on a node.

iperf3 quirks handled here (iperf 3.12):
- with -J it exits 0 even when it could not connect (esnet/iperf#1405); the error is only
  in the document's "error" field, so the client line reads that field, not the exit code;
- it may print a plain "iperf3: error - ..." line after the JSON document (esnet/iperf#1143);
- -t takes whole seconds (a fraction is cut off, 0 would mean the default of 10 s).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import shlex
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scalelab.cluster.nodes import Node
from scalelab.core.errors import InputError, ScalelabError
from scalelab.core.state import cluster_dir, write_atomic
from scalelab.run import commands, launch

log = logging.getLogger(__name__)

RETRY_SLEEP_S = 0.1  # between connection attempts while the server is not up yet
CONNECT_TIMEOUT_MS = 1000  # one attempt; a refused connection fails at once anyway
READY_TIMEOUT_S = 10.0  # how long the client waits for the server (ssh setup included)
SERVER_SLACK_S = 5.0  # the server waits this much longer for its client than the client tries
LAUNCH_SLACK_S = 20.0  # ssh setup and reaping, on top of the waits and the test itself
# once one end has failed, the other's own failure adds nothing (the server's error is said
# first; a client that could not connect leaves the server waiting for nobody)
FAIL_GRACE_S = 1.0
_TRAILING_ERROR = re.compile(r"^iperf3: error - (?P<msg>.+?)\s*$", re.MULTILINE)


class LinkProbeError(ScalelabError):
    """An iperf3 link measurement could not be made or its output could not be read."""


@dataclass
class Measurement:
    """One pair's rate: what the server received from the client, or why there is none."""

    server: str  # node name
    client: str  # node name
    mbit: float | None  # Mbit/s received; None when the measurement failed
    error: str = ""  # one line; "" when ok

    @property
    def ok(self) -> bool:
        return self.mbit is not None


def _check_port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise LinkProbeError(f"iperf3 port {port!r} must be an integer from 1 to 65535")
    return port


def check_seconds(value: str | float) -> int:
    """Seconds per measured pair, as the user gave them: a whole number from 1 to 60
    (iperf3 -t counts whole seconds).

    >>> check_seconds("2")
    2
    >>> check_seconds("0")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: seconds: '0' must be a whole number of seconds from 1 to 60, e.g. --seconds 2
    """
    try:
        secs = float(value)
        if secs != int(secs) or not 1 <= secs <= 60:
            raise ValueError
    except (TypeError, ValueError):
        raise InputError(f"seconds: {value!r} must be a whole number of seconds from 1 to 60, "
                         "e.g. --seconds 2") from None
    return int(secs)


def iperf_seconds(seconds: float) -> int:
    """The whole seconds iperf3 -t gets for a requested duration (at least 1).

    >>> iperf_seconds(1.0), iperf_seconds(1.5), iperf_seconds(0.2)
    (1, 2, 1)
    """
    return max(1, math.ceil(seconds))


def server_argv(bind: str, port: int, timeout_s: float) -> list[str]:
    """A one-off iperf3 server on the node's cluster address that never lingers.

    It serves one client and exits; with no client for timeout_s (--idle-timeout, whole
    seconds) or no data from its client for as long in a test (--rcv-timeout, ms) it exits too.

    >>> server_argv("10.0.0.11", 5201, 15)
    ['iperf3', '-s', '-1', '-B', '10.0.0.11', '-p', '5201', '--idle-timeout', '15', '--rcv-timeout', '15000']
    """
    _check_port(port)
    wait_s = max(1, math.ceil(timeout_s))
    return ["iperf3", "-s", "-1", "-B", bind, "-p", str(port), "--idle-timeout", str(wait_s),
            "--rcv-timeout", str(wait_s * 1000)]


def client_line(server: str, port: int, seconds: float, ready_timeout_s: float = 10.0,
                streams: int = 1) -> str:
    """One POSIX sh line: wait for the server to listen, then print one iperf3 -J document.

    While the server is not up, iperf3 fails at once with "unable to connect"; the line then
    sleeps 0.1 s and tries again, at most ready_timeout_s / 0.1 times and for at most
    ready_timeout_s (+ 1 s: `date +%s` counts whole seconds; dash has no $SECONDS). It prints
    the last document either way; when that document carries an error, the error also goes
    to stderr and the line exits 1 (iperf3 -J itself would exit 0, esnet/iperf#1405).

    >>> line = client_line("10.0.0.11", 5201, 1.0, ready_timeout_s=2.0)
    >>> "iperf3 -c 10.0.0.11 -p 5201 -t 1 -J --connect-timeout 1000" in line
    True
    >>> "[ $n -ge 20 ]" in line and "sleep 0.1" in line
    True
    >>> "-t 3 -J --connect-timeout 1000 -P 4" in client_line("10.0.0.11", 5201, 3, streams=4)
    True
    """
    _check_port(port)
    tries = max(1, math.ceil(ready_timeout_s / RETRY_SLEEP_S))
    wait_s = max(1, math.ceil(ready_timeout_s)) + 1
    connect_ms = max(100, min(CONNECT_TIMEOUT_MS, int(ready_timeout_s * 1000)))
    argv = ["iperf3", "-c", server, "-p", str(port), "-t", str(iperf_seconds(seconds)),
            "-J", "--connect-timeout", str(connect_ms)]
    if streams > 1:
        # parallel streams, as NCCL's socket transport opens several: on 10-100 Gbit/s one
        # TCP stream often falls well short of the line rate
        argv += ["-P", str(streams)]
    iperf = shlex.join(argv)
    parts = [
        f"n=0; end=$(($(date +%s)+{wait_s}))",
        f"while :; do out=$({iperf}); rc=$?",
        # only "server not up yet" is worth another try: a one-off server that accepted us
        # and then failed has exited, and a busy one is not ours
        "case $out in *'\"error\":'*'unable to connect'*) ;; *) break;; esac",
        f"n=$((n+1)); if [ $n -ge {tries} ] || [ \"$(date +%s)\" -ge $end ]; then break; fi",
        f"sleep {RETRY_SLEEP_S:g}; done",
        # no output at all: iperf3 missing or killed; sh has said why on stderr
        "[ -n \"$out\" ] || exit $((rc ? rc : 1))",
        "printf '%s\\n' \"$out\"",
        "case $out in *'\"error\":'*) printf '%s\\n' \"$out\" | sed -n "
        "'s/^[[:space:]]*\"error\":[[:space:]]*\"\\(.*\\)\",\\{0,1\\}$/iperf3: error - \\1/p' >&2; "
        "exit 1;; esac",
        "exit $rc",
    ]
    return "; ".join(parts)


def parse_iperf3(text: str) -> float:
    """Mbit/s the server actually received, from an iperf3 -J client document.

    >>> parse_iperf3('{"start": {}, "end": {"sum_received": {"bits_per_second": 95.5e6}}}')
    95.5
    >>> parse_iperf3('{"end": {}, "error": "unable to connect to server: Connection refused"}')
    Traceback (most recent call last):
    ...
    scalelab.run.linkprobe.LinkProbeError: iperf3: unable to connect to server: Connection refused
    """
    start = text.find("{")
    if start < 0:
        first = text.strip().splitlines()[0][:200] if text.strip() else ""
        raise LinkProbeError(f"iperf3 printed no JSON document: {first}" if first
                             else "iperf3 printed nothing")
    try:
        doc, end = json.JSONDecoder().raw_decode(text, start)
    except ValueError as exc:
        raise LinkProbeError(f"iperf3 output is not valid JSON ({exc.msg} at character "
                             f"{getattr(exc, 'pos', '?')}); was it cut short?") from None
    if doc.get("error"):
        raise LinkProbeError(f"iperf3: {doc['error']}")
    trailing = _TRAILING_ERROR.search(text, end)
    if trailing:
        raise LinkProbeError(f"iperf3: {trailing['msg']}")
    try:
        bps = doc["end"]["sum_received"]["bits_per_second"]
    except (KeyError, TypeError):
        raise LinkProbeError("iperf3 -J document lacks end.sum_received.bits_per_second "
                             "(the test did not finish)") from None
    if isinstance(bps, bool) or not isinstance(bps, int | float) or not math.isfinite(bps) \
            or bps < 0:
        raise LinkProbeError(f"iperf3 reported an impossible rate {bps!r} bit/s")
    return bps / 1e6


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


def _why(outcome: launch.RankOutcome, is_client: bool) -> str:
    """Why one side failed: iperf3's own error when it gave one, else launch's reading."""
    errors = _TRAILING_ERROR.findall(outcome.stderr)
    if errors:
        return _one_line(f"iperf3: {errors[-1]}")
    if is_client and outcome.stdout.strip():
        try:
            parse_iperf3(outcome.stdout)
        except LinkProbeError as exc:
            return _one_line(str(exc))
    return _one_line(launch.rank_reason(outcome.stderr, outcome.returncode))


SERVER, CLIENT = 0, 1  # positions in the command list; launch keeps outcomes in that order


def probe_commands(server: Node, client: Node, port: int, seconds: float,
                   ready_timeout_s: float = READY_TIMEOUT_S,
                   streams: int = 1) -> list[commands.RankCommand]:
    """The server and client commands of one measurement, server first.

    >>> a = Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local")
    >>> b = Node("c-n1", "192.0.2.11", "10.0.0.11", "worker", "local")
    >>> srv, cli = probe_commands(b, a, 5201, 1.0)
    >>> srv.node.name, srv.argv[:5], cli.node.name, cli.argv[:2]
    ('c-n1', ['iperf3', '-s', '-1', '-B', '10.0.0.11'], 'c-n0', ['sh', '-c'])
    >>> "iperf3 -c 10.0.0.11 -p 5201" in cli.argv[2]
    True
    """
    return [
        commands.RankCommand(server, server_argv(server.private_address, port,
                                               ready_timeout_s + SERVER_SLACK_S)),
        commands.RankCommand(client, ["sh", "-c", client_line(server.private_address, port,
                                                             seconds, ready_timeout_s,
                                                             streams)]),
    ]


def measure(server: Node, client: Node, known_hosts: str, port: int, seconds: float = 1.0,
            stop: threading.Event | None = None, streams: int = 1,
            timeout_s: float | None = None) -> Measurement:
    """TCP rate client -> server over the cluster network, in Mbit/s; never raises for a failure.
    timeout_s: the whole probe's time, launch to exit (default: the readiness wait, the test
    and LAUNCH_SLACK_S for SSH and reaping).

    Both ends start at once over SSH; the client's retry loop is the readiness wait. A failed
    measurement comes back as mbit=None with one line saying why (the server's own error
    first: when it could not listen, the client's "unable to connect" says nothing new).
    """
    if server.name == client.name:
        return Measurement(server.name, client.name, None,
                           f"{server.name}: a node cannot measure a link to itself")
    try:
        cmds = probe_commands(server, client, port, seconds, READY_TIMEOUT_S, streams=streams)
    except LinkProbeError as exc:
        return _failed(server, client, str(exc))
    # python and workdir only matter for workloads; iperf3 is on the PATH of every node
    rt = launch.Runtime("python3", "/", known_hosts)
    if timeout_s is None:
        timeout_s = READY_TIMEOUT_S + iperf_seconds(seconds) + LAUNCH_SLACK_S
    try:
        res = launch.run(cmds, rt, timeout_s=timeout_s, stop=stop, fail_grace_s=FAIL_GRACE_S)
    except (ScalelabError, OSError) as exc:
        return _failed(server, client, _one_line(f"could not start iperf3: {exc}"))
    if res.status in ("timeout", "interrupted"):
        return _failed(server, client, _one_line(res.error, limit=500))
    # launch reports "failed" even when both ends succeeded: it looks for a SCALELAB_RESULT
    # line, which iperf3 does not print; the client's own exit and document decide here
    srv, cli = res.outcomes[SERVER], res.outcomes[CLIENT]
    if cli.returncode == 0:
        try:
            mbit = parse_iperf3(cli.stdout)
        except LinkProbeError as exc:
            return _failed(server, client, _one_line(f"client {client.name}: {exc}"))
        if srv.returncode not in (0, None):
            log.warning("iperf3 server on %s exited %s after a good test: %s", server.name,
                        srv.returncode, _why(srv, is_client=False))
        log.info("link %s -> %s: %.1f Mbit/s", client.name, server.name, mbit)
        return Measurement(server.name, client.name, round(mbit, 3))
    if srv.returncode not in (0, None) and not srv.reaped:
        why = f"server {server.name}: {_why(srv, is_client=False)}"
    else:
        why = f"client {client.name}: {_why(cli, is_client=True)}"
    if res.unreaped:
        # bounded anyway (idle and rcv timeouts, a bounded retry loop), but say so
        why = f"{_one_line(why)}; could not end iperf3 on {', '.join(res.unreaped)} (unreachable)"
    return _failed(server, client, why)


def _failed(server: Node, client: Node, why: str) -> Measurement:
    log.warning("link %s -> %s not measured: %s", client.name, server.name, why)
    return Measurement(server.name, client.name, None, why or "unknown failure")


def all_pairs(nodes: list[Node]) -> list[tuple[Node, Node]]:
    """Every unordered pair of nodes once, in the order the nodes are given.

    >>> ns = [Node(f"n{i}", f"10.0.0.{i}", f"10.0.0.{i}", "worker", "local") for i in range(4)]
    >>> [(a.name, b.name) for a, b in all_pairs(ns)]
    [('n0', 'n1'), ('n0', 'n2'), ('n0', 'n3'), ('n1', 'n2'), ('n1', 'n3'), ('n2', 'n3')]
    """
    return list(itertools.combinations(nodes, 2))


def _rate(mbit: float) -> str:
    return f"{mbit:.0f}" if mbit >= 10 else f"{mbit:.2g}"


def typical_rate(results: list[Measurement]) -> float | None:
    """The median over nodes of each node's best measured rate (None when nothing was measured).

    A pair runs at its slower end's rate, so one slow node drags every pair it is in: in a
    3-node cluster that is 2 of the 3 pairs, and the median over pairs would be the slow rate
    itself. A node's best pair shows its own link as long as some other node is at least as
    fast, so the median over nodes stays the healthy rate while fewer than half are slow.
    With all links alike it equals the median over pairs.

    >>> ms = [Measurement("n0", "n1", 958.0), Measurement("n0", "n2", 410.0),
    ...       Measurement("n1", "n2", 415.0)]
    >>> typical_rate(ms), statistics.median(m.mbit for m in ms)
    (958.0, 415.0)
    """
    best: dict[str, float] = {}
    for m in results:
        if m.mbit is not None:
            for name in (m.server, m.client):
                best[name] = max(best.get(name, 0.0), m.mbit)
    return statistics.median(best.values()) if best else None


LINKS_FILE = "links.json"  # in the cluster's directory: the last `invoke check --links`


def links_doc(results: list[Measurement], seconds: float, measured_at: str) -> dict[str, Any]:
    """What `invoke check --links` keeps of its pairs (and a sweep started later carries in
    sweep.json as "link_pairs").

    >>> links_doc([Measurement("n0", "n1", 958.0)], 3.0, "2026-11-25T16:00:00Z")["pairs"]
    [{'server': 'n0', 'client': 'n1', 'mbit': 958.0, 'error': ''}]
    """
    return {"measured_at": measured_at, "seconds": seconds,
            "pairs": [{"server": m.server, "client": m.client, "mbit": m.mbit,
                       "error": m.error} for m in results]}


def keep(cluster: str, results: list[Measurement], seconds: float) -> Any:
    """Keep the pairs of `invoke check --links` in the cluster's directory (a sweep started
    later carries them, and its report shows them per pair); the file's path."""
    import datetime as dt

    kept = cluster_dir(cluster) / LINKS_FILE
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    write_atomic(kept, json.dumps(links_doc(results, seconds, stamp), indent=1) + "\n")
    return kept


def measurements(doc: dict[str, Any]) -> list[Measurement]:
    """links_doc's pairs back as Measurements (a malformed entry is left out)."""
    out = []
    for p in doc.get("pairs") or []:
        try:
            mbit = None if p.get("mbit") is None else float(p["mbit"])
            out.append(Measurement(str(p["server"]), str(p["client"]), mbit,
                                   str(p.get("error") or "")))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return out


def slow_pairs(results: list[Measurement],
               threshold: float = 0.8) -> list[tuple[Measurement, str]]:
    """The pairs below threshold x the typical rate (see typical_rate), and the failed ones.

    Each comes with one line naming both nodes and the figures, in the order of results.

    >>> ms = [Measurement("n0", "n1", 958.0), Measurement("n0", "n2", 410.0),
    ...       Measurement("n1", "n2", 415.0), Measurement("n0", "n3", None, "timed out after 31 s")]
    >>> for _, why in slow_pairs(ms):
    ...     print(why)
    n0 <-> n2: 410 Mbit/s, 43 % of the median 958 Mbit/s
    n1 <-> n2: 415 Mbit/s, 43 % of the median 958 Mbit/s
    n0 <-> n3: not measured: timed out after 31 s
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) \
            or not 0 < threshold <= 1:
        raise InputError(f"threshold: {threshold!r} must be a fraction above 0 and at most 1 "
                         "(e.g. 0.8 flags links below 80 % of the median)")
    ref = typical_rate(results)
    out: list[tuple[Measurement, str]] = []
    for m in results:
        pair = f"{m.server} <-> {m.client}"
        if m.mbit is None:
            out.append((m, f"{pair}: not measured: {m.error or 'no rate'}"))
        elif ref is not None and m.mbit < threshold * ref:
            out.append((m, f"{pair}: {_rate(m.mbit)} Mbit/s, {100 * m.mbit / ref:.0f} % of the "
                           f"median {_rate(ref)} Mbit/s"))
    return out


def check_links(nodes: list[Node], known_hosts: str, seconds: float = 1.0,
                base_port: int = 5201,
                progress: Callable[[int, int, Measurement], None] | None = None,
                stop: threading.Event | None = None) -> list[Measurement]:
    """Measure every pair of nodes, one pair at a time, each on its own port.

    One at a time because pairs measured together would share links and halve each other.
    progress(done, total, measurement) is called after each pair. When stop is set, no new
    pair starts and the measurements made so far are returned (the pair in flight comes back
    as not measured, "interrupted by the user"); the caller checks stop to tell.
    """
    pairs = all_pairs(nodes)
    if pairs:
        _check_port(base_port)
        _check_port(base_port + len(pairs) - 1)
    results: list[Measurement] = []
    for k, (server, client) in enumerate(pairs):
        if stop is not None and stop.is_set():
            log.info("link check stopped after %d of %d pairs", k, len(pairs))
            break
        m = measure(server, client, known_hosts, base_port + k, seconds, stop)
        results.append(m)
        if progress is not None:
            progress(k + 1, len(pairs), m)
    return results
