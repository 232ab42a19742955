"""Ending what a launch started, on every path: by its token, never by name.

Every launch carries a random token in its ranks' environment (SCALELAB_LAUNCH); a process
group is only ended on a node if one of its members carries that token, so a group id that
the node has since given to another process (after a reboot, or pid reuse while the node was
unreachable) is never touched. A node that cannot be reached when its group is to be ended
(a cut link) is retried for a while; if it stays unreachable, its group stays listed in the
inflight file and is ended before the next run, on --resume, or by destroy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shlex
import threading
import time
from pathlib import Path
from typing import Any

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node
from scalelab.core.errors import CommandError, ScalelabError
from scalelab.core.state import write_atomic
from scalelab.core.validate import SHORT_NODE
from scalelab.run import containers

log = logging.getLogger(__name__)


TOKEN_VAR = "SCALELAB_LAUNCH"
# torch.distributed.elastic's error file: a workload's @record writes why it failed there, and
# torchrun copies its failed worker's into its own
ERROR_FILE_VAR = "TORCHELASTIC_ERROR_FILE"


class LaunchError(ScalelabError):
    """A run could not be started, or its result could not be read."""


# A launcher's own work elsewhere (a Slurm job) is ended by a cancel line run on its login
# host before the command's process group; only lines made here are ever run again from a file.
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def cancel_line(name: str) -> str:
    """Shell line on the login host that cancels the run's job, whatever state it is in.

    >>> cancel_line("scalelab-ab12-x")
    'scancel --name scalelab-ab12-x --full 2>/dev/null; exit 0'
    """
    if not JOB_NAME.fullmatch(name):
        raise LaunchError(f"job name {name!r} is not one scalelab makes")
    return f"scancel --name {shlex.quote(name)} --full 2>/dev/null; exit 0"


def is_cancel_line(line: str) -> bool:
    """Whether a line (read back from an inflight file) is one cancel_line() makes.

    >>> is_cancel_line(cancel_line("scalelab-ab12-x")), is_cancel_line("rm -rf /; exit 0")
    (True, False)
    """
    m = re.fullmatch(r"scancel --name (\S+) --full 2>/dev/null; exit 0", line)
    return bool(m and JOB_NAME.fullmatch(m[1]))


def token_mark(token: str, node: str = "") -> str:
    """The value of SCALELAB_LAUNCH for the processes a launch starts on one node.

    The node's name is in it because nodes may share one PID namespace (the local target's
    do, and so do containers on one host): a node's reaper must find its own ranks only.

    >>> token_mark("ab12", "lab-n1"), token_mark("ab12")
    ('ab12@lab-n1', 'ab12')
    """
    if not re.fullmatch(r"[0-9a-f]{1,64}", token):
        raise LaunchError(f"launch token {token!r} is not hex")
    if node and not SHORT_NODE.fullmatch(node):
        raise LaunchError(f"node name {node!r} cannot be part of a launch token")
    return f"{token}@{node}" if node else token


def error_file(mark: str) -> str:
    """Where the ranks of launch mark on a node write why they failed (read back by the
    launch, removed by reap_line).

    >>> error_file("ab12@lab-n1")
    '/tmp/scalelab-error-ab12@lab-n1.json'
    """
    return f"/tmp/scalelab-error-{mark}.json"


def error_message(text: str) -> str:
    """The message of an error file's JSON (a rank's, or the one torchrun copied up from its
    failed worker); "" for anything else.

    >>> error_message('{"message": {"message": "RuntimeError: disk on fire", "errorCode": 1}}')
    'RuntimeError: disk on fire'
    >>> error_message(""), error_message("[1]")
    ('', '')
    """
    try:
        data = json.loads(text)
    except ValueError:
        return ""
    msg = data.get("message") if isinstance(data, dict) else None
    if isinstance(msg, dict):
        msg = msg.get("message")
    return " ".join(str(msg).split()) if isinstance(msg, str) else ""


def warm_comm(mark: str) -> str:
    """The process name a warm-started rank of launch mark takes (warm.py's comm_of).

    >>> warm_comm("ab12@lab-n1")
    'sl2784d3eb1e09b'
    """
    return "sl" + hashlib.sha256(mark.encode()).hexdigest()[:13]


# after KILL: up to 2 s for the groups to be gone (a process in uninterruptible sleep dies
# only when its I/O returns; a zombie is gone, whether or not its parent reaps it), else say
# which and exit 3, so that the caller tries again
_GONE = ("i=0; while [ $i -lt 20 ]; do a=$(for f in /proc/[0-9]*/stat; do "
         "{ read -r l < $f; } 2>/dev/null || continue; set -- ${l##*) }; "
         "[ \"$1\" = Z ] && continue; for g in $gs; do [ \"$3\" = \"$g\" ] && echo $g; done; "
         "done | sort -u | tr '\\n' ' '); [ -n \"$a\" ] || exit 0; sleep 0.1; i=$((i+1)); done; "
         "echo process groups $a still running after KILL >&2; exit 3")


def reap_line(pgid: int | None, token: str = "", grace_s: float = 3.0, node: str = "") -> str:
    """Shell line that ends a launch on a node: TERM, up to grace_s, then KILL.

    With a token, the process groups ended are exactly those of the processes that carry
    SCALELAB_LAUNCH=token_mark(token, node) in their environment (found in /proc): a group id the node has
    since given to someone else is never touched, and a launch whose group id was never
    read (a driver killed right after it) is still found. Without a token, the group pgid.
    Exits 0 once every group is gone; 3 (saying which) when one outlived its KILL by 2 s, and
    ssh's own 255 when the node was not reached: the caller tries again on either.

    >>> line = reap_line(4242, "ab12", 1.0, "lab-n1")
    >>> "SCALELAB_LAUNCH=ab12@lab-n1" in line and "kill -TERM -$g" in line
    True
    >>> "kill -TERM -4242" in reap_line(4242) and "environ" not in reap_line(4242)
    True
    """
    ticks = max(1, int(grace_s * 10))
    if token:
        mark = token_mark(token, node)
        # the launch's containers first (by their label; nothing on a node without an
        # engine), then its processes
        # one grep over every environ (NUL-separated entries), not a process per process:
        # the scan must stay cheap on a node with hundreds of processes
        # and a rank forked by a warm-start server (whose environ is the server's) by the
        # name it took from the mark (bench/workloads/warm.py comm_of)
        find = ("gs=$(for e in $(grep -lzxF '" + f"{TOKEN_VAR}={mark}" + "' /proc/[0-9]*/environ "
                f"2>/dev/null; grep -lxF '{warm_comm(mark)}' /proc/[0-9]*/comm 2>/dev/null); "
                "do p=${e#/proc/}; p=${p%/*}; "
                "{ read -r l < /proc/$p/stat; } 2>/dev/null || continue; set -- ${l##*) }; "
                "echo $3; done | sort -u); ")
        # the error files go last, on every exit: a launcher ended by TERM (torchrun) writes its
        # own on the way out
        return (f"trap \"rm -f {shlex.quote(error_file(mark))}\" EXIT; "
                + containers.reap_clause(mark) + find
                + "[ -n \"$gs\" ] || exit 0; "
                "for g in $gs; do kill -TERM -$g 2>/dev/null; done; i=0; "
                f"while [ $i -lt {ticks} ]; do a=; for g in $gs; do kill -0 -$g 2>/dev/null "
                "&& a=1; done; [ -n \"$a\" ] || break; sleep 0.1; i=$((i+1)); done; "
                "[ -z \"$a\" ] || for g in $gs; do kill -KILL -$g 2>/dev/null; done; " + _GONE)
    if pgid is None:
        raise LaunchError("nothing to end: neither a process group nor a launch token")
    pgid = int(pgid)
    # `kill -SIG -PGID`, not `kill -SIG -- -PGID`: dash (a node's /bin/sh, or a login shell)
    # refuses the `--` and would end nothing
    return (f"kill -TERM -{pgid} 2>/dev/null; i=0; while [ $i -lt {ticks} ] && "
            f"kill -0 -{pgid} 2>/dev/null; do sleep 0.1; i=$((i+1)); done; "
            f"! kill -0 -{pgid} 2>/dev/null || kill -KILL -{pgid} 2>/dev/null; gs={pgid}; "
            + _GONE)


def run_cancels(lines: list[tuple[Node, str]], known_hosts: str, timeout_s: float = 20.0) -> None:
    """Run each command's cancel line on its node (a launcher's work elsewhere, ended before
    the command's own process group); bounded, and a failure is only logged."""
    for node, line in lines:
        try:
            proc = ssh.run(node, known_hosts, line, timeout=timeout_s, check=False)
            if proc.returncode != 0:
                log.warning("cancel on %s exited %s: %s", node.name, proc.returncode,
                            proc.stderr.strip()[-200:])
        except (CommandError, ScalelabError) as exc:
            log.warning("could not cancel on %s: %s", node.name, exc)


def end_groups(groups: list[tuple[Node, int | None]], known_hosts: str, token: str = "",
               grace_s: float = 3.0, retry_s: float = 20.0) -> list[tuple[Node, int]]:
    """End process groups on their nodes, in parallel; return those that could not be reached.

    A node that does not answer (a cut link, sshd busy) is retried for retry_s; each try is
    bounded by ssh's connect timeout and grace_s + 10 s.
    """
    failed: list[tuple[Node, int]] = []
    lock = threading.Lock()

    def one(node: Node, pgid: int | None) -> None:
        deadline = time.monotonic() + retry_s
        line = reap_line(pgid, token, grace_s, node.name)
        while True:
            try:
                proc = ssh.run(node, known_hosts, line, timeout=grace_s + 10, check=False)
                if proc.returncode == 0:
                    return
                err = proc.stderr.strip().splitlines()
                why = err[-1] if err else f"ssh exit {proc.returncode}"
            except CommandError as exc:
                why = str(exc)
            if time.monotonic() + 1 > deadline:
                log.warning("could not end process group %s on %s: %s", pgid, node.name, why)
                with lock:
                    failed.append((node, pgid))
                return
            time.sleep(1)

    threads = [threading.Thread(target=one, args=g, daemon=True) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=retry_s + grace_s + 20)
    return failed


def save_inflight(path: Path, entries: list[dict[str, Any]]) -> None:
    """Write the inflight file (or remove it when nothing is listed), whole or not at all."""
    try:
        if entries:
            write_atomic(path, json.dumps(entries) + "\n", mode=0o600)
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        raise LaunchError(f"cannot write {path} ({exc.strerror}); the run in flight was "
                          f"stopped and not recorded; free space, then resume the sweep "
                          f"(invoke bench --resume {path.parent.name})") from None


def _load_inflight(path: Path) -> list[dict[str, Any]]:
    try:
        entries = json.loads(path.read_text() or "[]")
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("%s unreadable (%s); no process groups to end from it", path, exc)
        return []
    return [e for e in entries if isinstance(e, dict) and "node" in e
            and (e.get("pgid") is not None or e.get("token"))] \
        if isinstance(entries, list) else []


def _pgid(entry: dict[str, Any]) -> int | None:
    return None if entry.get("pgid") is None else int(entry["pgid"])


def _end_entries(entries: list[dict[str, Any]], known_hosts: str,
                 retry_s: float) -> list[dict[str, Any]]:
    """End listed groups (each with its own token); return the entries still unreachable."""
    left = []
    by_token: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_token.setdefault(str(e.get("token") or ""), []).append(e)
    for token, group in by_token.items():
        # a line read back from a file is run only if it is one a launcher writes
        run_cancels([(Node.from_dict(e["node"]), str(e["cancel"])) for e in group
                     if is_cancel_line(str(e.get("cancel") or ""))], known_hosts)
        nodes = [(Node.from_dict(e["node"]), _pgid(e)) for e in group]
        failed = {(n.name, g) for n, g in end_groups(nodes, known_hosts, token, retry_s=retry_s)}
        left += [e for e in group if (e["node"]["name"], _pgid(e)) in failed]
    return left


def end_leftovers(path: Path, known_hosts: str, retry_s: float = 5.0) -> list[dict[str, Any]]:
    """End what an earlier launch listed in path and could not end; the entries still
    unreachable (to be listed again by the next launch that writes path)."""
    leftover = _load_inflight(path)
    return _end_entries(leftover, known_hosts, retry_s=retry_s) if leftover else []


def reap_inflight(path: Path, known_hosts: str, retry_s: float = 20.0) -> tuple[int, int]:
    """End the process groups a killed driver (or an unreachable node) left running.

    Returns how many were listed and how many could not be ended; those stay in the file.
    """
    entries = _load_inflight(path)
    if not entries:
        path.unlink(missing_ok=True)
        return 0, 0
    left = _end_entries(entries, known_hosts, retry_s)
    try:
        save_inflight(path, left)
    except LaunchError as exc:
        log.warning("%s", exc)
    return len(entries), len(left)
