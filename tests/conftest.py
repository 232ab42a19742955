"""Shared fixtures: an isolated state dir per test session, and local clusters that always die."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# scripts the tests run in their own processes (under horovodrun, say), never imported here
collect_ignore_glob = ["data/*"]
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root: namespaces, cgroups, mounts")
needs_sshd = pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(),
                                reason="openssh-server not installed (./bootstrap.sh installs it)")


@pytest.fixture(scope="session", autouse=True)
def isolated_state(tmp_path_factory):
    """Keep tests' clusters, inventories and reports out of the developer's own."""
    base = tmp_path_factory.mktemp("scalelab")
    env = {"SCALELAB_HOME": base / "state", "SCALELAB_INVENTORIES": base / "inventories",
           "SCALELAB_REPORTS": base / "reports"}
    old = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        v.mkdir()
        os.environ[k] = str(v)
    yield base
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:6]}"


@pytest.fixture
def local_cluster():
    """Factory: provision a local cluster; every cluster made is destroyed at teardown."""
    from scalelab.cluster.targets.local import LocalCluster

    made: list[LocalCluster] = []

    def make(nodes: int = 2, **kw) -> LocalCluster:
        lc = LocalCluster(kw.pop("name", None) or unique_name())
        made.append(lc)
        lc.provision(nodes, **kw)
        return lc

    yield make
    for lc in made:
        lc.destroy()


def invoke(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `invoke ARGS` as a user would, from the project root."""
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def bench_exit(statuses) -> int:
    """The exit code invoke bench owes for a sweep whose runs' last records have these
    statuses: 1 when one failed or timed out (every result is kept, and a script must see
    it, a resumed sweep's earlier runs too), else 0."""
    return 1 if any(s in ("failed", "timeout") for s in statuses) else 0


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


@contextlib.contextmanager
def tiny_fs(path: Path, size: str = "64k"):
    """A small tmpfs mounted at path (root only), so that a disk really fills; always
    unmounted."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                   check=True, timeout=30)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], timeout=30)


def fill(fs: Path) -> Path:
    """Take every free block of the file system (bounded: it is small); the filler file."""
    filler = fs / "filler"
    chunk = b"\0" * 4096
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(1 << 16):  # 256 MiB at most; a 256k tmpfs is full long before
            try:
                os.write(fd, chunk)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    break
                raise
        else:
            raise AssertionError(f"{fs} never filled up")
    finally:
        os.close(fd)
    return filler


def wait_until(condition, timeout_s: float, what: str) -> None:
    """Poll condition() until it holds, bounded by timeout_s; AssertionError naming what
    was awaited otherwise. The one wait on a condition the flat tests share."""
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.02)


def running(pid: int) -> bool:
    """Whether a process still runs: a zombie has ended (this machine's init reaps late)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def wait_listening(netns: str, port: int, timeout_s: float = 10.0) -> None:
    """Wait (bounded) until something listens on TCP port in the network namespace: the
    condition a client needs, instead of a fixed sleep."""
    wait_until(lambda: subprocess.run(
        ["ip", "netns", "exec", netns, "ss", "-Hltn", f"sport = :{port}"], capture_output=True,
        text=True, timeout=10).stdout.strip(), timeout_s, f"a listener on {port} in {netns}")
