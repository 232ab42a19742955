"""Shared fixtures: an isolated state dir per test session, and local clusters that always die."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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
    from scalelab.targets.local import LocalCluster

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


def have(tool: str) -> bool:
    return shutil.which(tool) is not None
