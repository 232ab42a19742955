"""One lock per cluster, between real processes: a second holder is refused naming the first,
a holder killed outright (SIGKILL) lets go with its death, and nothing is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

from scalelab.core import lock

HOLDER = textwrap.dedent("""
    import sys
    from scalelab.core import lock
    with lock.hold(sys.argv[1]):
        print("held", flush=True)
        sys.stdin.read()  # held until the test ends this process (or closes its input)
""")


def _holder(cluster: str, env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, cluster], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_and_a_killed_holder_lets_go(tmp_path, monkeypatch):
    home = tmp_path / "state"
    home.mkdir()
    monkeypatch.setenv("SCALELAB_HOME", str(home))
    before = sorted(os.listdir(home)), home.stat().st_mtime_ns
    proc = _holder("lab", {**os.environ})
    try:
        with pytest.raises(lock.ClusterBusy) as err:
            with lock.hold("lab"):
                pass
        line = str(err.value)
        assert line.startswith("cluster lab is in use by `"), line
        assert f"(pid {proc.pid}) since " in line and f"kill -INT {proc.pid}" in line
        with lock.hold("other"):  # another cluster of the same state directory is free
            pass
        os.kill(proc.pid, signal.SIGKILL)  # the controller killed outright: no clean-up runs
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    with lock.hold("lab"):  # taken over at once: no stale lock to clear
        with lock.hold("lab"):  # the same process again: nests
            assert lock.holder("lab")["pid"] == os.getpid()
    assert not lock.lock_path("lab").exists()  # let go: the file goes with it
    assert (sorted(os.listdir(home)), home.stat().st_mtime_ns) == before  # nothing written


def test_state_directories_of_their_own_never_share_a_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "a"))
    proc = _holder("lab", {**os.environ})
    try:
        monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "b"))
        with lock.hold("lab"):
            pass
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    # a killed holder's file stays until the next command on that cluster takes it over
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "a"))
    assert lock.lock_path("lab").exists()
    with lock.hold("lab"):
        pass
    assert not lock.lock_path("lab").exists()
