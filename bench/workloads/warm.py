"""Warm start of ranks on nodes that share one host's cores (the local target).

Starting a rank costs its interpreter about 4 s of CPU before the first step: importing torch,
and DistributedDataParallel importing torch._dynamo. Eight emulated nodes on a 2-core host pay
that eight times per run, and on the demo it was half of every run's wall time. Here one
server per node pays it once per sweep; each run's rank is a fresh process forked from it.

    warm.py serve NAME         import what the ranks import, then listen on the abstract unix
                               socket NAME (one per network namespace, so one per node)
    warm.py run NAME -- SCRIPT ARGS...
                               run SCRIPT as a rank: the server forks a child that takes this
                               process's stdin/stdout/stderr, environment, working directory
                               and arguments and runs SCRIPT as __main__. This process waits,
                               passes signals on, and exits as the child did. With no server
                               listening it becomes the rank itself (exec, a cold start).

Every run stays an independent measurement: a new process, a new model, optimiser and process
group; only imported modules are shared (copy-on-write). The server never computes, so the
fork copies no thread pool. If this process is killed (SIGKILL from the launcher's reaper), the
child notices its end of the connection closing and ends at once.

This file imports no torch at module level: the client must start in milliseconds.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_MSG = 1 << 20
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)


def _address(name: str) -> str:
    return "\0" + name  # abstract: no file to clean up, private to the network namespace


# ------------------------------------------------------------------ server

def serve(name: str) -> int:
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
    while True:
        ready, _, _ = select.select([lst], [], [], 0.05)
        if ready:
            conn, _ = lst.accept()
            try:
                msg, fds, _, _ = socket.recv_fds(conn, MAX_MSG, 3)
                req = json.loads(msg)
            except (OSError, ValueError) as exc:
                print(f"warm.py: bad request: {exc}", file=sys.stderr, flush=True)
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                _child(lst, conn, req, fds)  # never returns
            for fd in fds:
                os.close(fd)
            try:
                conn.send(json.dumps({"pid": pid}).encode())
            except OSError:
                pass  # the client is gone: the child notices the same and ends
            children[pid] = conn
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.send(json.dumps({"status": status}).encode())
                except OSError:
                    pass
                conn.close()


def _watch(conn: socket.socket) -> None:
    """End this child at once when the client is gone (killed with the run's process group)."""
    try:
        while conn.recv(16):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _child(lst: socket.socket, conn: socket.socket, req: dict, fds: list[int]) -> None:
    code = 1
    try:
        lst.close()
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
        import torch

        # libgomp read OMP_NUM_THREADS when the server imported torch: apply the rank's own
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))
        threading.Thread(target=_watch, args=(conn,), daemon=True).start()
        import runpy

        sys.argv = list(req["argv"])
        runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - a rank's crash is reported like a fresh process's
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# ------------------------------------------------------------------ client

def run(name: str, argv: list[str]) -> int:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(_address(name))
    except OSError:
        s.close()
        os.execv(sys.executable, [sys.executable, *argv])  # no server: a cold start
    req = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(s, [json.dumps(req).encode()], [0, 1, 2])
    first = s.recv(MAX_MSG)
    if not first:
        print("warm.py: the warm-start server closed the connection", file=sys.stderr)
        return 1
    pid = json.loads(first)["pid"]

    def forward(sig: int, frame: object) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
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
    if len(argv) == 2 and argv[0] == "serve":
        return serve(argv[1])
    if len(argv) >= 4 and argv[0] == "run" and argv[2] == "--":
        return run(argv[1], argv[3:])
    print("usage: warm.py serve NAME | warm.py run NAME -- SCRIPT ARGS...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
