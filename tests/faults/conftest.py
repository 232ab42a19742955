"""Fixtures of the fault-injection tests (tests/conftest.py's fixtures apply here too).

tests/faults is a package so that this conftest does not shadow tests/conftest.py, which
the flat test modules import as `conftest`.
"""

from __future__ import annotations

import pytest
from conftest import needs_root, needs_sshd, unique_name

from .faultlib import ledger


@pytest.fixture
def fcluster():
    """Factory: a local cluster named f<random>; always destroyed at teardown."""
    from scalelab.cluster.targets.local import LocalCluster

    made: list[LocalCluster] = []

    def make(nodes: int = 2, **kw) -> LocalCluster:
        lc = LocalCluster(unique_name("f"))
        made.append(lc)
        lc.provision(nodes, **kw)
        return lc

    yield make
    for lc in made:
        lc.destroy()


@pytest.fixture
def reports(tmp_path):
    return tmp_path / "reports"


@pytest.fixture
def fault(request):
    """Record a fault for the figures: call fault(lost=n) once injected; survival is the
    test passing (its outcome is added at teardown)."""
    seen: dict = {}

    def injected(**fields) -> None:
        seen.update(fields)
        seen["injected"] = True

    yield injected
    if seen.get("injected"):
        rep = getattr(request.node, "rep_call", None)
        ledger("fault", request.node.nodeid, lost=seen.get("lost", 0),
               survived=bool(rep is not None and rep.passed))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.when == "call":
        item.rep_call = rep
    return rep


__all__ = ["fcluster", "reports", "fault", "needs_root", "needs_sshd"]
