"""The warm-start server (bench/workloads/warm.py): a rank forked from it behaves as a rank
started fresh would, towards the launcher that started it.

The server runs here on the host (its socket is an abstract unix socket with a random name);
the "ranks" are small scripts, so each test costs the server's one import of torch.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalelab.run import reap

ROOT = Path(__file__).resolve().parents[1]
WARM = ROOT / "bench" / "workloads" / "warm.py"

RANK = """\
import os, signal, sys, time
print("pid", os.getpid(), "cwd", os.getcwd(), "var", os.environ.get("WARM_TEST_VAR"),
      "argv", sys.argv[1:], "torch" in sys.modules, flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "sleep":
    def on_term(*_):
        open(sys.argv[2] + ".term", "w").write("TERM")
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    open(sys.argv[2], "w").write(str(os.getpid()))
    time.sleep(60)
if sys.argv[1] == "nap":  # a rank that ends the way resnet.py's ranks do
    import common
    open(sys.argv[2], "w").write(str(os.getpid()))
    time.sleep(float(sys.argv[3]))
    common.exit_now(4)
if sys.argv[1] == "spin":
    import re
    open(sys.argv[2], "w").write(str(os.getpid()))
    re.match(r"(a+)+$", "a" * 64 + "b")  # holds the GIL for ages: no Python thread runs
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    name = f"scalelab-warm-test-{secrets.token_hex(4)}"
    proc = subprocess.Popen([sys.executable, str(WARM), "serve", name], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()  # blocks until torch is imported and the socket listens
        assert line.startswith("SCALELAB_WARM ready"), proc.stderr.read()
        yield name, int(line.split()[2])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this fixture started
        proc.wait(timeout=10)


@pytest.fixture()
def rank_script(tmp_path):
    p = tmp_path / "rank.py"
    p.write_text(RANK)
    return p


def client(name, script, *args, cwd=None, env_var="x", env=None):
    return subprocess.Popen([sys.executable, str(WARM), "run", name, "--", str(script), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env={**os.environ, "WARM_TEST_VAR": env_var, **(env or {})})


def test_forked_rank_gets_the_clients_io_env_cwd_args_and_exit_code(server, rank_script,
                                                                    tmp_path):
    name, server_pid = server
    seen = []
    for code, var in ((0, "first"), (3, "second")):
        c = client(name, rank_script, str(code), cwd=tmp_path, env_var=var)
        out, err = c.communicate(timeout=60)
        assert c.returncode == code, err
        words = out.split()
        assert words[2:6] == ["cwd", str(tmp_path), "var", var]
        assert f"'{code}'" in out
        assert words[-1] == "True"  # torch came imported: the point of the warm start
        assert "to stderr" in err
        seen.append(int(words[1]))
    # every run is a process of its own, neither the server nor the previous run
    assert len(set(seen)) == 2 and server_pid not in seen


def test_signal_to_the_client_ends_the_rank_and_the_client_reports_it(server, rank_script,
                                                                      tmp_path):
    name, _ = server
    pidfile = tmp_path / "pid"
    c = client(name, rank_script, "sleep", str(pidfile))
    rank = _started(pidfile)
    c.send_signal(signal.SIGTERM)
    c.wait(timeout=30)
    # the rank got the signal itself (its handler ran: a rank may clean up on TERM) and the
    # client exits as the rank did
    assert (tmp_path / "pid.term").read_text() == "TERM"
    assert c.returncode == 143
    assert _gone(rank, 10)


@pytest.mark.parametrize("mode", ["sleep", "spin"])
def test_client_killed_outright_takes_its_rank_with_it(server, rank_script, tmp_path, mode):
    # spin: the rank holds the GIL (its own watchdog thread cannot run); the server ends it
    name, _ = server
    pidfile = tmp_path / "pid"
    c = client(name, rank_script, mode, str(pidfile))
    rank = _started(pidfile)
    time.sleep(0.3)  # into the sleep or the regex
    c.kill()  # what the launcher's reaper does to the run's process group
    c.wait(timeout=10)
    assert _gone(rank, 10), f"the forked rank ({mode}) outlived its client"


def test_an_idle_server_exits_by_itself():
    # the servers of a driver killed outright and never resumed do not stay forever
    name = f"scalelab-warm-test-{secrets.token_hex(4)}"
    proc = subprocess.Popen([sys.executable, str(WARM), "serve", name, "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().startswith("SCALELAB_WARM ready")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    bad = subprocess.run([sys.executable, str(WARM), "serve", name, "soon"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "IDLE_S must be a number of seconds" in bad.stderr


def test_without_a_server_the_client_starts_the_rank_cold(rank_script, tmp_path):
    c = client(f"scalelab-warm-none-{secrets.token_hex(4)}", rank_script, "5", cwd=tmp_path)
    out, _ = c.communicate(timeout=60)
    assert c.returncode == 5
    assert out.split()[1] == str(c.pid)  # exec: the client became the rank
    assert out.split()[-1] == "False"


def _started(pidfile: Path) -> int:
    """The pid the rank wrote once it runs."""
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return int(pidfile.read_text())


def _gone(pid: int, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_bad_request_leaves_no_descriptor_in_the_server(server):
    import importlib.util
    import socket

    spec = importlib.util.spec_from_file_location("warm_under_test", WARM)
    warm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(warm)
    name, server_pid = server
    before = _fds(server_pid)
    for _ in range(3):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(warm._address(name))
        socket.send_fds(s, [b"this is not a request"], [0, 1, 2])
        assert s.recv(16) == b""  # the server refused it and closed the connection
        s.close()
    # the three descriptors that came with each request went with it
    assert _fds(server_pid) == before


def test_a_server_that_dies_does_not_fail_a_good_rank(rank_script, tmp_path):
    name = f"scalelab-warm-test-{secrets.token_hex(4)}"
    proc = subprocess.Popen([sys.executable, str(WARM), "serve", name], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().startswith("SCALELAB_WARM ready")
        pidfile = tmp_path / "pid"
        c = client(name, rank_script, "nap", str(pidfile), "2")
        rank = _started(pidfile)
        os.kill(proc.pid, signal.SIGKILL)  # the server alone, while its rank trains on
        proc.wait(timeout=10)
        c.wait(timeout=30)
        # the rank's own exit code, as a rank started fresh would give it
        assert c.returncode == 4, c.stderr.read()
        assert _gone(rank, 10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_a_forked_rank_left_alone_is_reaped_by_its_launch_token(rank_script, tmp_path):
    """Server dead, client killed, the rank holding the GIL (its own watch cannot run): the
    launch's reaper still finds it by its token, although its environ is the server's. (A
    stopped rank would not do: when the server dies its orphaned group gets SIGHUP.)"""

    name = f"scalelab-warm-test-{secrets.token_hex(4)}"
    token, node = secrets.token_hex(8), "warmtest"
    proc = subprocess.Popen([sys.executable, str(WARM), "serve", name], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    rank = None
    try:
        assert proc.stdout.readline().startswith("SCALELAB_WARM ready")
        pidfile = tmp_path / "pid"
        c = client(name, rank_script, "spin", str(pidfile),
                   env={reap.TOKEN_VAR: reap.token_mark(token, node)})
        rank = _started(pidfile)
        assert reap.token_mark(token, node) not in Path(f"/proc/{rank}/environ").read_text()
        # a group of its own: ending the rank's group must not end the server and its others
        assert os.getpgid(rank) == rank != os.getpgid(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        c.kill()
        c.wait(timeout=10)
        assert not _gone(rank, 1.0), "nothing was left to reap"
        done = subprocess.run(["sh", "-c", reap.reap_line(None, token, 1.0, node)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert _gone(rank, 10), "the reaper did not find the forked rank by its token"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        if rank is not None and not _gone(rank, 0.1):
            os.kill(rank, signal.SIGKILL)  # the rank this test started, should the reaper fail


def test_a_silent_client_does_not_hold_up_the_next(server, rank_script, tmp_path):
    import importlib.util
    import socket

    spec = importlib.util.spec_from_file_location("warm_under_test", WARM)
    warm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(warm)
    name, _ = server
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    silent.connect(warm._address(name))  # connects, sends nothing
    try:
        c = client(name, rank_script, "0", cwd=tmp_path)
        out, err = c.communicate(timeout=60)
        assert c.returncode == 0, err
        assert out.split()[-1] == "True"  # forked from the server, not started cold
        # served while the silent request was still waiting for its words
        with pytest.raises(BlockingIOError):
            silent.recv(16, socket.MSG_DONTWAIT)
    finally:
        silent.close()
