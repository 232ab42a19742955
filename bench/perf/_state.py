"""Shared by the benchmark scripts that bring up emulated machines: root, and state of their own.

Each run gets fresh, private SCALELAB_HOME / SCALELAB_INVENTORIES / SCALELAB_REPORTS under a
temporary directory, so a benchmark never touches the user's clusters or reports.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def private_state() -> Path:
    """Exit with one line unless root; point scalelab's state at a new temporary directory."""
    if os.geteuid() != 0:
        sys.exit("error: needs root (it brings up emulated machines); run it as root")
    tmp = Path(tempfile.mkdtemp(prefix="scalelab-perf-"))
    os.environ["SCALELAB_HOME"] = str(tmp / "home")
    os.environ["SCALELAB_INVENTORIES"] = str(tmp / "inventories")
    os.environ["SCALELAB_REPORTS"] = str(tmp / "reports")
    return tmp


def invoke(*args: str, timeout: float = 3600) -> str:
    """`invoke ARGS` as a user types it, from the repository root: its stdout, or exit with
    the tail of its stderr."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=root, text=True,
                          capture_output=True, timeout=timeout)
    if proc.returncode:
        sys.exit(f"error: invoke {args[0]}: {proc.stderr.strip()[-800:]}")
    return proc.stdout


def bench_on_local_cluster(name: str, nodes: int, *bench_args: str) -> tuple[float, Path]:
    """Provision a local cluster, run `invoke bench` on it as a user would (no report), destroy
    it; return the wall time of invoke bench and the sweep's directory. Exits with the tail of
    its stderr when it fails."""
    import subprocess
    import time

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    from scalelab.cluster.targets.local import LocalCluster

    lc = LocalCluster(name)
    lc.provision(nodes)
    try:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "invoke", "bench", "--cluster", lc.name,
                               "--no-report", *bench_args], cwd=root, capture_output=True,
                              text=True, timeout=3600)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"invoke bench failed:\n{proc.stderr[-3000:]}")
    finally:
        lc.destroy()
    reports = Path(os.environ["SCALELAB_REPORTS"])
    return wall, reports / os.readlink(reports / "latest")


def destroy(name: str) -> None:
    """Take a benchmark's cluster down by its record (its output is not needed)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "invoke", "destroy", "--cluster", name], cwd=root,
                   capture_output=True, timeout=900)
