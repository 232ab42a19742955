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


def client(name, script, *args, cwd=None, env_var="x"):
    return subprocess.Popen([sys.executable, str(WARM), "run", name, "--", str(script), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env={**os.environ, "WARM_TEST_VAR": env_var})


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
