"""Warm start of ranks on nodes that share one host's cores (the local target).

Starting a rank costs its interpreter about 4 s of CPU before the first step: importing torch,
and DistributedDataParallel importing torch._dynamo. Eight emulated nodes on a 2-core host pay
that eight times per run, and on the demo it was half of every run's wall time. Here one
server per node pays it once per sweep; each run's rank is a fresh process forked from it.

    warm.py serve NAME [IDLE_S]
                               import what the ranks import, then listen on the abstract unix
                               socket NAME (one per network namespace, so one per node); exit
                               after IDLE_S seconds (default 900) with no rank and no request,
                               so that servers of a driver killed outright do not stay forever
    warm.py run NAME -- SCRIPT ARGS...
                               run SCRIPT as a rank: the server forks a child that takes this
                               process's stdin/stdout/stderr, environment, working directory
                               and arguments and runs SCRIPT as __main__. This process waits,
                               passes signals on, and exits as the child did. With no server
                               listening it becomes the rank itself (exec, a cold start).

Every run stays an independent measurement: a new process, a new model, optimiser and process
group; only imported modules are shared (copy-on-write). The server never computes, so the
fork copies no thread pool. If this process is killed (SIGKILL from the launcher's reaper), the
server notices the connection closing and kills the child (and the child itself does too, should
the server be gone).

This file imports no torch at module level: the client must start in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_MSG = 1 << 20
IDLE_EXIT_S = 900.0
REQUEST_TIMEOUT_S = 10.0  # a client that connected but sends nothing must not stall the server
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)


def _address(name: str) -> str:
    return "\0" + name  # abstract: no file to clean up, private to the network namespace


# ------------------------------------------------------------------ server

def serve(name: str, idle_exit_s: float = IDLE_EXIT_S) -> int:
    sys.path.insert(0, HERE)
    import allreduce  # noqa: F401
    import common  # noqa: F401
    import emulate  # noqa: F401
    import models  # noqa: F401
    import resnet  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (DistributedDataParallel.__init__ imports it)
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    lst = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        lst.bind(_address(name))
    except OSError as exc:
        print(f"warm.py: cannot listen on {name!r}: {exc}", file=sys.stderr)
        return 1
    lst.listen(64)
    print(f"SCALELAB_WARM ready {os.getpid()}", flush=True)
    children: dict[int, socket.socket] = {}
    # connections whose request has not come yet, with when they are given up: a client that
    # connects and sends nothing must not hold up the next one
    pending: dict[socket.socket, float] = {}
    killed: set[int] = set()
    last_busy = time.monotonic()
    while True:
        now = time.monotonic()
        if children or pending:
            last_busy = now
        elif now - last_busy > idle_exit_s:
            return 0
        for conn in [c for c, t in pending.items() if t < now]:
            print("warm.py: bad request: nothing sent", file=sys.stderr, flush=True)
            del pending[conn]
            conn.close()
        ready, _, _ = select.select([lst, *pending, *children.values()], [], [], 0.05)
        for sock in ready:
            if sock is lst:
                conn, _ = lst.accept()
                pending[conn] = time.monotonic() + REQUEST_TIMEOUT_S
                continue
            if sock in pending:
                del pending[sock]
                _accept(lst, sock, children, list(pending))
                last_busy = time.monotonic()
                continue
            # a client sends nothing after its request: readable means it is gone (killed with
            # its run's process group): end its rank, whatever the rank is doing
            pid = next(p for p, c in children.items() if c is sock)
            if pid not in killed:
                killed.add(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            killed.discard(pid)
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.send(json.dumps({"status": status}).encode())
                except OSError:
                    pass
                conn.close()


def _accept(lst: socket.socket, conn: socket.socket, children: dict[int, socket.socket],
            pending: list[socket.socket]) -> None:
    """Take the request that has come on conn and fork its rank."""
    try:
        msg, fds, _, _ = socket.recv_fds(conn, MAX_MSG, 3, socket.MSG_DONTWAIT)
        req = json.loads(msg)
    except (OSError, ValueError) as exc:
        print(f"warm.py: bad request: {exc}", file=sys.stderr, flush=True)
        for fd in locals().get("fds") or []:  # passed with a request that did not parse
            os.close(fd)
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        _child(lst, conn, req, fds, [*children.values(), *pending])  # never returns
    for fd in fds:
        os.close(fd)
    try:
        conn.send(json.dumps({"pid": pid}).encode())
    except OSError:
        pass  # the client is gone: the next select sees it and ends the child
    children[pid] = conn


def _watch(conn: socket.socket) -> None:
    """End this child at once when the client is gone (killed with the run's process group)."""
    try:
        while conn.recv(16):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def comm_of(mark: str) -> str:
    """The name (/proc/PID/comm, 15 bytes at most) a forked rank of launch mark takes: its
    /proc/PID/environ still shows the server's environment, so the launch's reaper finds it
    by this name too (scalelab.run.reap.reap_line computes the same).

    >>> comm_of("ab12@lab-n1")
    'sl2784d3eb1e09b'
    """
    return "sl" + hashlib.sha256(mark.encode()).hexdigest()[:13]


def _leave(code: int, conn: socket.socket | None = None) -> None:
    """Flush, tell the client how the rank ended, and leave at once: no destructor runs (a
    rank's DDP reducer freed on the way out can deadlock with a gloo worker over the GIL; see
    resnet.py). The rank says it itself, so a server that died meanwhile does not turn a good
    rank into a failed one (the server reports only the ranks killed by a signal first)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        if conn is not None:
            conn.send(json.dumps({"status": (code & 0xFF) << 8}).encode())
    except OSError:
        pass
    finally:
        os._exit(code)


def _child(lst: socket.socket, conn: socket.socket, req: dict, fds: list[int],
           others: list[socket.socket]) -> None:
    try:
        lst.close()
        for other in others:  # earlier clients' connections: not this rank's to hold
            other.close()
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            if fd > 2:
                os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        # a group of its own (the reaper ends groups, and the server's is not the launch's),
        # and a name its launch's reaper finds it by
        os.setpgid(0, 0)
        mark = req["env"].get("SCALELAB_LAUNCH")
        if mark:
            with open("/proc/self/comm", "w") as fh:
                fh.write(comm_of(mark))
        import torch

        # libgomp read OMP_NUM_THREADS when the server imported torch: apply the rank's own
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))
        threading.Thread(target=_watch, args=(conn,), daemon=True).start()
        import common

        common.exit_hook = lambda code: _leave(code, conn)
        import runpy

        sys.argv = list(req["argv"])
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:  # left from inside the handler: the rank's frames stay alive
        if exc.code is None or isinstance(exc.code, int):
            _leave(exc.code or 0, conn)
        print(exc.code, file=sys.stderr)
        _leave(1, conn)
    except BaseException:  # noqa: BLE001 - a rank's crash is reported like a fresh process's
        traceback.print_exc()
        _leave(1, conn)
    _leave(0, conn)


# ------------------------------------------------------------------ client

def run(name: str, argv: list[str]) -> int:
    # a signal that comes before the rank's pid is known waits, and is then passed on
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(_address(name))
    except OSError:
        s.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)  # exec keeps the mask
        os.execv(sys.executable, [sys.executable, *argv])  # no server: a cold start
    req = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(s, [json.dumps(req).encode()], [0, 1, 2])
    first = s.recv(MAX_MSG)
    if not first:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        print("warm.py: the warm-start server closed the connection", file=sys.stderr)
        return 1
    msg = json.loads(first)
    if "status" in msg:  # the rank ended before the server could say its pid (a bad cwd)
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        return os.waitstatus_to_exitcode(msg["status"])
    pid = msg["pid"]

    def forward(sig: int, frame: object) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)  # held signals are passed on now
    msg = s.recv(MAX_MSG)
    if not msg:
        print("warm.py: the warm-start server ended before the rank", file=sys.stderr)
        return 1
    status = json.loads(msg)["status"]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those cannot be caught anyway
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)  # end as the rank did, so that the launcher sees it
        return 128 + sig
    return os.waitstatus_to_exitcode(status)


def main(argv: list[str]) -> int:
    if len(argv) in (2, 3) and argv[0] == "serve":
        if len(argv) == 3:
            try:
                idle = float(argv[2])
            except ValueError:
                idle = -1.0
            if not idle > 0:
                print(f"warm.py: IDLE_S must be a number of seconds > 0, got {argv[2]!r}",
                      file=sys.stderr)
                return 2
            return serve(argv[1], idle)
        return serve(argv[1])
    if len(argv) >= 4 and argv[0] == "run" and argv[2] == "--":
        return run(argv[1], argv[3:])
    print("usage: warm.py serve NAME [IDLE_S] | warm.py run NAME -- SCRIPT ARGS...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
