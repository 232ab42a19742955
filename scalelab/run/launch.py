"""Start ranks on nodes over SSH (torchrun, horovodrun or directly), time them out, reap by pid.

Every remote command runs as the leader of a new session (`setsid -w`), and prints its
process-group id first; on timeout, failure or Ctrl-C the driver ends exactly that group
on each node (TERM, then KILL), and the local ssh clients by their pids. Nothing is ever
killed by name.

Every launch carries a random token its ranks are found and ended by (scalelab.run.reap);
what they run is built in scalelab.run.commands.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node
from scalelab.cluster.targets.interface import Runtime
from scalelab.run import containers
from scalelab.run.commands import RankCommand, remote_line
from scalelab.run.reap import (
    ERROR_FILE_VAR,
    TOKEN_VAR,
    LaunchError,
    end_groups,
    end_leftovers,
    error_file,
    error_message,
    run_cancels,
    save_inflight,
    token_mark,
)

log = logging.getLogger(__name__)

RESULT = re.compile(r"SCALELAB_RESULT (?P<json>\{.*\})\s*$", re.MULTILINE)  # horovodrun prefixes lines
PGID = re.compile(r"^SCALELAB_PGID (?P<pgid>\d+)\s*$", re.MULTILINE)
PGID_WAIT_S = 3.0  # at reaping, how long a launch that has not reported its group gets to


def ssh_argv(node: Node, known_hosts: str) -> list[str]:
    """ssh_args with faster keep-alives, on a connection of the rank's own: its ssh client is
    how a lost node is noticed.

    >>> n = Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local", ssh_key="/s/id")
    >>> [o for o in ssh_argv(n, "/s/kh") if o.startswith(("ServerAlive", "ControlPath"))]
    ['ServerAliveInterval=3', 'ServerAliveCountMax=3', 'ControlPath=none']
    """
    return ssh.ssh_args(node, known_hosts, shared=False)


@dataclass
class RankOutcome:
    node: str
    returncode: int | None
    stdout: str
    stderr: str
    ended_s: float | None = None  # seconds after launch when it exited by itself
    reaped: bool = False  # still running when scalelab ended it (after a failure, timeout, stop)
    error: str = ""  # the message of the rank's error file (reap.error_file), where it wrote one


@dataclass
class LaunchResult:
    status: str  # ok | failed | timeout | interrupted
    result: dict[str, Any] | None
    error: str
    outcomes: list[RankOutcome]
    duration_s: float
    unreaped: list[str] = field(default_factory=list)  # nodes whose process group is left over
    started_unix: float = 0.0  # wall clock when the launch began (for the run's timeline)
    waited_s: float = 0.0  # from the launch until the ranks were done or given up on; reaping
    # (ending what is left, closing the ssh clients) is duration_s - waited_s


class Launch:
    """One distributed run in flight: ssh clients on the controller, process groups on nodes."""

    def __init__(self, commands: list[RankCommand], rt: Runtime, token: str | None = None) -> None:
        self.commands = commands
        self.rt = rt
        self.token = secrets.token_hex(8) if token is None else token
        self.procs: list[subprocess.Popen] = []
        self.pgids: dict[str, int] = {}
        self.pending: list[dict[str, Any]] = []  # groups of earlier launches still to end
        self._ended: dict[int, float] = {}  # index -> when its ssh client exited by itself
        self._t0 = time.monotonic()
        self._buffers: list[tuple[list[str], list[str]]] = []
        self._threads: list[threading.Thread] = []
        self.errors: dict[str, str] = {}  # node -> the message of its rank's error file

    def start(self, inflight: Path | None = None) -> None:
        self._t0 = time.monotonic()
        if inflight is not None:
            # before any rank exists: a driver killed from here on leaves their token behind
            save_inflight(inflight, self.entries())
        for i, cmd in enumerate(self.commands):
            mark = token_mark(self.token, cmd.node.name) if self.token else ""
            env = {**cmd.env, TOKEN_VAR: mark} if self.token else cmd.env
            if self.token and cmd.error_file and cmd.container is None:
                env[ERROR_FILE_VAR] = error_file(mark)
            argv, workdir = cmd.argv, self.rt.workdir
            if cmd.container is not None:
                if not mark:
                    raise LaunchError("a container launch needs a token to be reaped by")
                # the client runs from / on the node: the workdir is the image's own
                argv = containers.docker_argv(cmd.container, cmd.argv, sorted(cmd.env), mark, i,
                                              cmd.container.workdir)
                workdir = "/"
            line = remote_line(RankCommand(cmd.node, argv, env), workdir)
            argv = ssh_argv(cmd.node, self.rt.known_hosts) + ["--", line]
            log.debug("launch on %s: %s", cmd.node.name, shlex.join(cmd.argv))
            ssh.count(cmd.node, self.rt.known_hosts, shared=False)
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            out: list[str] = []
            err: list[str] = []
            self.procs.append(proc)
            self._buffers.append((out, err))
            for stream, buf, is_err in ((proc.stdout, out, False), (proc.stderr, err, True)):
                t = threading.Thread(target=self._pump, args=(stream, buf, cmd.node.name, is_err),
                                     daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, stream, buf: list[str], node: str, is_err: bool) -> None:
        for line in stream:
            buf.append(line)
            if is_err:
                m = PGID.match(line)
                if m:
                    self.pgids[node] = int(m["pgid"])
        stream.close()

    def _note_exits(self) -> list[int | None]:
        now = time.monotonic()
        codes = [p.poll() for p in self.procs]
        for i, c in enumerate(codes):
            if c is not None and i not in self._ended:
                self._ended[i] = now
        return codes

    def entries(self) -> list[dict[str, Any]]:
        """What the inflight file lists: this launch on every node (its group id once read;
        the token finds it before that), and older launches still to end."""
        return self.pending + [{"node": c.node.to_dict(), "pgid": self.pgids.get(c.node.name),
                                "token": self.token, **({"cancel": c.cancel} if c.cancel else {})}
                               for c in self.commands]

    def wait(self, timeout_s: float, fail_grace_s: float = 5.0,
             stop: threading.Event | None = None, inflight: Path | None = None,
             watch: Callable[[Launch], None] | None = None) -> str:
        """Wait for every rank; returns ok, failed, timeout or interrupted.

        Once a rank has failed, the others get fail_grace_s to fail by themselves (and say
        why), then the run is failed: they are usually stuck in a collective with the dead
        rank. inflight: a file kept listing the process groups while the run is in flight,
        so that a driver killed with SIGKILL can reap them on --resume. watch: called on
        every poll while the ranks run (scalelab.run.failures.Injector.poll).
        """
        deadline = time.monotonic() + timeout_s
        first_fail: float | None = None
        written = -1
        while True:
            if inflight is not None and len(self.pgids) != written:
                written = len(self.pgids)
                save_inflight(inflight, self.entries())
            if watch is not None:
                watch(self)
            codes = self._note_exits()
            now = time.monotonic()
            if all(c is not None for c in codes):
                return "ok" if all(c == 0 for c in codes) else "failed"
            if first_fail is None and any(c not in (None, 0) for c in codes):
                first_fail = now
            if first_fail is not None and now - first_fail > fail_grace_s:
                return "failed"  # the others are stuck waiting for the dead rank
            if stop is not None and stop.is_set():
                return "interrupted"
            if now > deadline:
                return "timeout"
            time.sleep(0.05)

    def reap(self, grace_s: float = 3.0, retry_s: float = 20.0) -> list[str]:
        """End every process group we started on the nodes, then the local ssh clients.

        Returns the nodes whose group could not be ended (unreachable for retry_s); their
        groups are kept in self.pending.
        """
        # a launch whose remote shell has not yet reached setsid carries no token to be found
        # by: give it a moment to report its group (it does at once, unless the node is slow)
        settle = time.monotonic() + PGID_WAIT_S
        while time.monotonic() < settle and any(
                c.node.name not in self.pgids and p.poll() is None
                for c, p in zip(self.commands, self.procs, strict=False)):
            time.sleep(0.05)
        codes = self._note_exits()
        cancels = [(c.node, c.cancel) for c, code in zip(self.commands, codes, strict=False)
                   if c.cancel and code != 0]
        if cancels:
            run_cancels(cancels, self.rt.known_hosts)
        # every group, also of ranks whose ssh client has exited: after a lost connection
        # (exit 255) the group may well still run on the node
        # with a token, also the nodes whose group id was never read (the launch is found by
        # the token in its environment)
        # but not the nodes whose ssh never got a connection: nothing was started there
        groups = [(c.node, self.pgids.get(c.node.name))
                  for i, c in enumerate(self.commands)
                  if c.node.name in self.pgids or (self.token and not self._never_reached(i))]
        failed = end_groups(groups, self.rt.known_hosts, self.token, grace_s, retry_s)
        cancel_of = {c.node.name: c.cancel for c in self.commands if c.cancel}
        # a node not reached keeps its cancel line too: the next run or --resume runs it
        self.pending += [{"node": n.to_dict(), "pgid": g, "token": self.token,
                          **({"cancel": cancel_of[n.name]} if n.name in cancel_of else {})}
                         for n, g in failed]
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        for t in self._threads:
            t.join(timeout=2)
        return [n.name for n, _ in failed]

    def _never_reached(self, index: int) -> bool:
        proc = self.procs[index] if index < len(self.procs) else None
        if proc is None or proc.poll() is None:
            return False
        for t in self._threads[2 * index:2 * index + 2]:  # its output read to the end
            t.join(timeout=2)
        out, err = self._buffers[index]
        return ssh.never_reached(proc.returncode, "".join(out), "".join(err))

    def lines(self, index: int, since: int) -> list[str]:
        """The lines command index has printed on stdout after its first `since`."""
        return self._buffers[index][0][since:]

    def printed(self, index: int) -> str:
        """What command index has printed on stdout so far."""
        return "".join(self._buffers[index][0])

    def exited(self) -> list[int | None]:
        """Each command's exit code, None while it runs."""
        return self._note_exits()

    def read_errors(self) -> None:
        """Read back the error files of the commands that failed by themselves (one SSH each,
        in parallel): why a rank failed, in the rank's own words, even where its stderr was
        lost. Before reap, which removes them."""
        codes = self._note_exits()
        failed = [c for c, code in zip(self.commands, codes, strict=True)
                  if code not in (0, None) and c.error_file and c.container is None and self.token]
        if not failed:
            return
        nodes = [c.node for c in failed]

        def read(node: Node) -> str:
            path = shlex.quote(error_file(token_mark(self.token, node.name)))
            return ssh.run(node, self.rt.known_hosts, f"cat {path} 2>/dev/null; true",
                           timeout=8, check=False).stdout

        texts, _ = ssh.on_each(nodes, read, timeout_s=10)
        for node in nodes:
            message = error_message(texts.get(node.name) or "")
            if message:
                self.errors[node.name] = message

    def outcomes(self) -> list[RankOutcome]:
        out = []
        for i, (c, p, (o, e)) in enumerate(zip(self.commands, self.procs, self._buffers,
                                              strict=True)):
            natural = i in self._ended
            out.append(RankOutcome(c.node.name, p.returncode, "".join(o), "".join(e),
                                   round(self._ended[i] - self._t0, 3) if natural else None,
                                   reaped=not natural, error=self.errors.get(c.node.name, "")))
        return out


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The workload's one result line, if present.

    >>> parse_result('noise\\nSCALELAB_RESULT {"world_size": 2}\\n')
    {'world_size': 2}
    """
    matches = RESULT.findall(stdout)
    return json.loads(matches[-1]) if matches else None


# torchrun's ChildFailedError summary ("Root Cause (first observed failure)") fields
_TR_FIELD = re.compile(r"^\s*(?P<key>rank|exitcode|traceback)\s*:\s*(?P<value>.*?)\s*$")
_EXC = re.compile(r"^(?:\[rank\d+\]:\s*)?(?P<exc>(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*"
                  r"(?:Error|Exception|Exit|Interrupt|Warning)\b.*)$")
_SSH_ERR = re.compile(r"^ssh: |Permission denied|Host key verification failed|"
                      r"Connection (?:closed|reset|timed out|refused)|Timeout, server|"
                      r"kex_exchange_identification|No route to host|Broken pipe")
_NOISE = re.compile(r"^\s*(?:[=\-]{8,}|File \".*|\^+|Traceback \(most recent call last\):|"
                    r"\[W\d{4} .*|\[rank\d+\]:\s*(?:At:|\s.*)?)\s*$")


def _clean(text: str) -> str:
    """Strip what makes an exception line long without saying more (source paths, advice).

    >>> _clean("[rank0]: RuntimeError: Got the following error when running the callback: "
    ...        "RuntimeError: [/x/gloo/transport/tcp/pair.cc:537] Read error [10.0.0.11]:1: "
    ...        "Connection reset by peer. This is typically caused by a remote worker hanging")
    'RuntimeError: Read error [10.0.0.11]:1: Connection reset by peer.'
    """
    text = re.sub(r"^\[rank\d+\]:\s*", "", text.strip())
    text = re.sub(r"\[/[^\]\s]*\.(?:cc|cpp|h|hpp|py):\d+\]\s*", "", text)
    text = re.sub(r"Got the following error when running the callback: \w+(?:Error|Exception): ",
                  "", text)
    text = text.split(" This is typically caused")[0]
    return text[:300]


# `setsid -w` (remote_line) when the command it waits for was killed by a signal
_SETSID_SIGNALED = re.compile(r"^setsid: child \d+ did not exit normally")
_RANK_LINE = re.compile(r"\brank (?P<rank>\d+)/\d+\b")


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def rank_reason(stderr: str, returncode: int | None, error: str = "") -> str:
    """Why a rank's command failed, in one phrase, from its exit code, its error file's
    message (error: the exception the rank recorded, torch.distributed.elastic's structured
    error) and stderr.

    The error file's message first; else torchrun's failure summary when there is one, else
    the last exception line, else the last meaningful line; exit 255 with nothing from the
    workload is ssh's own.

    >>> rank_reason("exitcode  : -9 (pid: 7)  (SIGKILL)\\n  rank      : 1 (local_rank: 0)\\n", 1)
    'rank 1 killed by signal 9 (SIGKILL)'
    >>> rank_reason("[rank0]: RuntimeError: Connection closed by peer [10.0.0.11]:5\\n"
    ...             "  rank      : 0 (local_rank: 0)\\n  exitcode  : 1 (pid: 8)\\n", 1)
    'rank 0 exit 1: RuntimeError: Connection closed by peer [10.0.0.11]:5'
    >>> rank_reason("[resnet.py] rank 1/2 on n1\\n", 255)
    'lost the SSH connection (node down, sshd gone or link cut)'
    >>> rank_reason("ssh: connect to host 10.0.0.11 port 22: Connection refused\\n", 255)
    'ssh: connect to host 10.0.0.11 port 22: Connection refused'
    >>> rank_reason("[resnet.py] rank 1/2 on n1\\nsetsid: child 7 did not exit normally: x\\n", 9)
    'rank 1 killed by signal 9 (SIGKILL)'
    >>> rank_reason("netprobe.py: error: bind failed\\n", 2)
    'exit 2: netprobe.py: error: bind failed'
    >>> rank_reason("  rank      : 1 (local_rank: 0)\\n  exitcode  : 1 (pid: 8)\\n", 1,
    ...             "RuntimeError: disk on fire")
    'rank 1 exit 1: RuntimeError: disk on fire'
    """
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip() and not PGID.match(ln)]
    fields: dict[str, str] = {}
    for ln in lines:
        m = _TR_FIELD.match(ln)
        if m:
            fields[m["key"]] = m["value"]
    excs = [ln for ln in lines if _EXC.match(ln.strip()) and "ChildFailedError" not in ln
            and "SignalException" not in ln]
    meaningful = [ln for ln in lines if not _NOISE.match(ln)]
    code = returncode
    who = ""
    if "exitcode" in fields:
        m = re.match(r"-?\d+", fields["exitcode"])
        if m:
            code = int(m.group())
            rank = re.match(r"\d+", fields.get("rank", ""))
            who = f"rank {rank.group()} " if rank else "a rank "
    died = [ln for ln in lines if _SETSID_SIGNALED.search(ln)]
    if died and not who and returncode and 0 < returncode < 128:
        # the command was killed by a signal (a rank started directly has no launcher to
        # say so): `setsid -w` then exits with its child's raw wait status
        code = -(returncode & 0x7F)
        rank = [m for m in (_RANK_LINE.search(ln) for ln in lines) if m]
        who = f"rank {rank[-1]['rank']} " if rank else ""
    if code is not None and code < 0:
        return f"{who}killed by signal {-code} ({_signal_name(-code)})"
    if error:
        return f"{who}exit {code}: {_clean(error)}"[:400]
    if returncode == 255 and not who:
        sshline = [ln for ln in lines if _SSH_ERR.search(ln)]
        if sshline:
            return sshline[-1].strip()[:300]
        return "lost the SSH connection (node down, sshd gone or link cut)"
    if excs:
        return f"{who}exit {code}: {_clean(excs[-1])}"
    if who and fields.get("traceback") and not fields["traceback"].startswith("To enable"):
        return f"{who}exit {code}: {fields['traceback'][:300]}"
    if code in (137, 143):
        return f"exit {code}: killed by {_signal_name(code - 128)}"
    why = meaningful[-1].strip()[:300] if meaningful else "no error output"
    return f"{who}exit {code}: {why}"


def whole(result: dict[str, Any] | None) -> bool:
    """Whether a result holds every rank's figures (the head gathers them before printing).

    >>> whole({"world_size": 2, "ranks": [{"rank": 0}, {"rank": 1}]})
    True
    >>> whole({"world_size": 2, "ranks": [{"rank": 0}]}), whole(None), whole({"ranks": []})
    (False, False, False)
    """
    if not isinstance(result, dict) or not isinstance(result.get("ranks"), list):
        return False
    return bool(result["ranks"]) and len(result["ranks"]) == result.get("world_size")


def explain_failure(outcomes: list[RankOutcome], status: str, timeout_s: float) -> str:
    """One line saying what went wrong: the ranks that failed by themselves, first first.

    >>> outs = [RankOutcome("n0", -15, "", "", None, reaped=True),
    ...         RankOutcome("n1", 255, "", "", 12.5)]
    >>> explain_failure(outs, "failed", 60)
    'n1: lost the SSH connection (node down, sshd gone or link cut); still running and ended: n0'
    >>> explain_failure(outs[:1], "timeout", 60)
    'timed out after 60 s'
    """
    if status == "timeout":
        return f"timed out after {timeout_s:g} s"
    if status == "interrupted":
        return "interrupted by the user"
    failed = [o for o in outcomes if o.returncode not in (0, None) and not o.reaped]
    failed.sort(key=lambda o: o.ended_s if o.ended_s is not None else float("inf"))
    reasons = [f"{o.node}: {rank_reason(o.stderr, o.returncode, o.error)}"[:400]
               for o in failed]
    if not reasons:
        return "no result line from rank 0"
    ended = [o.node for o in outcomes if o.reaped]
    if ended:
        reasons.append(f"still running and ended: {', '.join(ended)}")
    return "; ".join(reasons)


def run(commands: list[RankCommand], rt: Runtime, timeout_s: float,
        stop: threading.Event | None = None, inflight: Path | None = None,
        fail_grace_s: float = 5.0,
        watch: Callable[[Launch], None] | None = None) -> LaunchResult:
    """Start, wait, reap; the result is read from the head node's stdout.

    fail_grace_s: once one command has failed, how long the others get to fail by themselves.

    Groups that an earlier launch could not end (listed in the inflight file) are ended
    first; those still unreachable stay listed.
    """
    t0, started_unix = time.monotonic(), time.time()
    waited_s = 0.0
    launch = Launch(commands, rt)
    if inflight is not None:
        launch.pending = end_leftovers(inflight, rt.known_hosts)
    status = "failed"
    unreaped: list[str] = []
    try:
        launch.start(inflight)
        status = launch.wait(timeout_s, fail_grace_s, stop=stop, inflight=inflight,
                             watch=watch)
        waited_s = time.monotonic() - t0
        if status == "failed":
            launch.read_errors()
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        unreaped = launch.reap()
        if inflight is not None:
            try:
                save_inflight(inflight, launch.pending)
            except LaunchError as exc:
                log.warning("%s", exc)
    outcomes = launch.outcomes()
    # the head's, or (ranks numbered as torchrun's agents joined) whichever node printed it
    result = next((r for o in outcomes if (r := parse_result(o.stdout)) is not None), None)
    if status == "ok" and result is None:
        status = "failed"
    if status == "failed" and whole(result):
        # every rank's figures were gathered and printed before a rank failed: it failed
        # leaving (gloo can abort while the group is torn down), which loses nothing measured;
        # the record keeps what happened (env.teardown_failure)
        why = explain_failure(outcomes, status, timeout_s)
        log.warning("a rank failed after the run's result was in, while leaving: %s", why)
        result = {**result, "env": {**(result.get("env") or {}), "teardown_failure": why}}
        status = "ok"
    error = "" if status == "ok" else explain_failure(outcomes, status, timeout_s)
    if unreaped:
        note = (f"could not end the ranks on {', '.join(unreaped)} (unreachable); they are "
                "ended before the next run, on --resume, or by invoke destroy")
        if status == "ok":
            log.warning("%s", note)  # the contract: an ok run's error is ""
        else:
            error += f"; {note}"
    return LaunchResult(status, result, error, outcomes, time.monotonic() - t0, unreaped,
                        started_unix, waited_s)
