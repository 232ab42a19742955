"""Helpers of the fault-injection tests: find our ranks on a node, wait with bounds, inject,
check that nothing is lost and nothing is left behind, and keep the ledger of figures.

Every process touched here is one scalelab started on a node of a cluster the test made: it
is found through that node's cgroup and its command line, and ended by pid.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from scalelab.cluster.targets import local, localhost
from scalelab.cluster.targets.local import LocalCluster
from scalelab.cluster.targets.localhost import CpuCgroup, leftovers
from scalelab.core import sh

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD_MARKS = ("resnet.py", "allreduce.py", "iperf3", "torch.distributed.run",
                  "horovodrun", "warm.py")
LEDGER_VAR = "SCALELAB_FAULT_LEDGER"

# fake cloud credentials and tokens, in the environment of every command the fault tests run
FAKE_SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIAFAKE" + secrets.token_hex(6).upper(),
    "AWS_SECRET_ACCESS_KEY": "fakeAwsSecret/" + secrets.token_hex(16),
    "OS_PASSWORD": "fake-openstack-pw-" + secrets.token_hex(8),
    "OS_APPLICATION_CREDENTIAL_SECRET": "fake-os-appcred-" + secrets.token_hex(8),
    "GITHUB_TOKEN": "ghp_fake" + secrets.token_hex(12),
    "HF_TOKEN": "hf_fake" + secrets.token_hex(12),
}


# ------------------------------------------------------------------ bounded waiting

def wait_for(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """Poll cond until it returns something truthy; fail the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


# ------------------------------------------------------------------ processes on nodes

def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def node_pids(cluster: str, index: int) -> list[int]:
    """Every process in a node's cgroup (sshd, its sessions and whatever they started)."""
    return CpuCgroup.for_node(cluster, localhost.node_name(cluster, index)).pids()


def workload_pids(cluster: str, index: int) -> dict[int, str]:
    """Our benchmark processes on a node: pid -> command line."""
    out = {}
    for pid in node_pids(cluster, index):
        cl = cmdline(pid)
        if any(m in cl for m in WORKLOAD_MARKS):
            out[pid] = cl
    return out


def all_workload_pids(cluster: str, nodes: int) -> dict[int, str]:
    out: dict[int, str] = {}
    for i in range(nodes):
        out.update(workload_pids(cluster, i))
    return out


def rank_pid(cluster: str, index: int) -> int | None:
    """A run's rank program on a node: the interpreter running resnet.py (torchrun's worker
    or a direct start; not torchrun itself, setsid or the shell), or the warm-start client
    that stands for a rank forked from the node's server (training() finds that rank itself,
    by its sockets)."""
    for pid, cl in workload_pids(cluster, index).items():
        argv = cl.split()
        if len(argv) > 1 and "python" in argv[0] and (
                argv[1].endswith("resnet.py")
                or (argv[1].endswith("warm.py") and "run" in argv and "resnet.py" in cl)):
            return pid
    return None


def _master_port(cluster: str, index: int) -> int | None:
    """The rendezvous port of the run in flight: torchrun's --master-port, or MASTER_PORT in
    the environment of a rank started directly."""
    for pid, cl in workload_pids(cluster, index).items():
        parts = cl.split()
        if "--master-port" in parts:
            return int(parts[parts.index("--master-port") + 1])
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for e in env:
            if e.startswith(b"MASTER_PORT="):
                return int(e.split(b"=", 1)[1])
    return None


def training(lc: LocalCluster, index: int) -> int | None:
    """The rank's pid once it trains: the process holding a gloo connection (not the
    rendezvous store, not ssh) to another node, which exists only after the process group is
    up."""
    port = _master_port(lc.name, index)
    if port is None:
        return None
    ns = localhost.netns_name(lc.name, index)
    out = sh.run(["ip", "netns", "exec", ns, "ss", "-Htnp", "state", "established"],
                 check=False).stdout
    others = {n.address for j, n in enumerate(lc.nodes()) if j != index}
    mine = set(workload_pids(lc.name, index))
    for line in out.splitlines():
        m = re.search(r"pid=(\d+),", line)
        if not m or int(m.group(1)) not in mine:
            continue
        peer = line.split()[-2] if "users:" in line else line.split()[-1]
        host, _, pport = peer.rpartition(":")
        host = host.strip("[]").removeprefix("::ffff:")
        if host in others and pport.isdigit() and int(pport) not in (22, port):
            return int(m.group(1))
    return None


def run_processes(lc: LocalCluster, index: int) -> dict[int, str]:
    """The processes of the run in flight on a node: its workload processes, less the node's
    warm-start server, which outlives runs (a rank forked from it shows the server's command
    line too; it is told apart by its sockets, so call this once the rank trains)."""
    rank = training(lc, index)
    return {p: c for p, c in workload_pids(lc.name, index).items()
            if p == rank or "warm.py serve" not in c}


def gone(pids) -> bool:
    return all(localhost._state(p) in ("X", "Z") for p in pids)


def kill_pid(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------ sweeps and the store

def write_sweep(path: Path, **values: Any) -> Path:
    base = {"model": "resnet20", "engine": "ddp", "precision": "fp32", "nodes": [2],
            "batch_size": 16, "bandwidth": "native", "procs_per_node": 1, "repeats": 1,
            "steps": 3, "warmup": 1, "data": "synthetic", "timeout_s": 120,
            "allreduce_probe": False, "netprobe": False}
    base.update(values)
    path.write_text(yaml.safe_dump(base))
    return path


def fault_env(reports: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, **FAKE_SECRETS, "SCALELAB_REPORTS": str(reports), **extra}


def bench_argv(cluster: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "invoke", "bench", "--cluster", cluster, *args]


def start_bench(cluster: str, reports: Path, *args: str, **extra: str) -> subprocess.Popen:
    """invoke bench in the background, in its own session (as from a terminal)."""
    return subprocess.Popen(bench_argv(cluster, *args), cwd=ROOT, env=fault_env(reports, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def run_bench(cluster: str, reports: Path, *args: str, timeout: float = 400,
              **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(bench_argv(cluster, *args), cwd=ROOT, env=fault_env(reports, **extra),
                          capture_output=True, text=True, timeout=timeout)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """Wait for a background bench; kill it (by its pid) if it overran."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_pid(proc.pid)
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"bench did not end within {timeout:g} s; stderr: {err[-1500:]}") from None


def latest(reports: Path) -> Path | None:
    link = reports / "latest"
    return reports / os.readlink(link) if link.is_symlink() else None


def records(sweep_dir: Path) -> list[dict[str, Any]]:
    """Every line of runs.jsonl, each of which must parse (no torn or partial line)."""
    path = sweep_dir / "runs.jsonl"
    if not path.exists():
        return []
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), "runs.jsonl ends in a partial line"
    out = []
    for n, line in enumerate(data.decode().splitlines(), 1):
        assert line.strip(), f"runs.jsonl:{n} is blank"
        rec = json.loads(line)  # raises on a corrupt line
        assert isinstance(rec, dict) and rec.get("run_id"), f"runs.jsonl:{n}: {line[:80]}"
        out.append(rec)
    return out


def store_view(sweep_dir: Path) -> list[dict[str, Any]]:
    """The last record of each run (what results and the report read), in store order."""
    from scalelab.results import store

    return list(store.read_runs(sweep_dir).values())


def planned(sweep_dir: Path) -> list[str]:
    return json.loads((sweep_dir / "sweep.json").read_text())["planned_runs"]


def lost_runs(sweep_dir: Path) -> int:
    """Planned runs without a record (after the sweep, or its resume, has ended)."""
    have = {r["run_id"] for r in records(sweep_dir)}
    return sum(1 for r in planned(sweep_dir) if r not in have)


def csv_rows(sweep_dir: Path) -> int:
    import csv

    with open(sweep_dir / "results.csv") as fh:
        return sum(1 for _ in csv.DictReader(fh))


def one_line(stderr: str) -> str:
    """The last line of stderr, after checking that no traceback came with it."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [ln for ln in stderr.replace("\r", "\n").splitlines() if ln.strip()]
    assert lines, "nothing on stderr"
    return lines[-1].strip()


# ------------------------------------------------------------------ teardown

def destroy_and_check(lc: LocalCluster) -> None:
    """invoke destroy leaves nothing: no namespaces, links, cgroups, mounts, state, processes."""
    pids = list((lc.load() or {}).get("pids", {}).values())
    nodes = len(lc.nodes())
    ours = list(all_workload_pids(lc.name, nodes)) if nodes else []
    proc = subprocess.run([sys.executable, "-m", "invoke", "destroy", "--cluster", lc.name],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **FAKE_SECRETS})
    assert proc.returncode == 0, proc.stderr
    assert leftovers(lc.name) == {"netns": [], "links": [], "cgroups": [], "mounts": [],
                                  "state": []}
    still = [p for p in pids + ours if localhost._state(p) not in ("X", "Z")]
    assert not still, f"still running after destroy: {still}"


def set_link(lc: LocalCluster, index: int, up: bool) -> None:
    sh.run(["ip", "netns", "exec", localhost.netns_name(lc.name, index), "ip", "link", "set",
            local.NODE_IFACE, "up" if up else "down"])


# ------------------------------------------------------------------ figures

def ledger(kind: str, name: str, **fields: Any) -> None:
    """Append one line to $SCALELAB_FAULT_LEDGER (bench/perf/faults_summary.py reads it)."""
    path = os.environ.get(LEDGER_VAR)
    if not path:
        return
    with open(path, "a") as fh:
        fh.write(json.dumps({"kind": kind, "name": name, **fields}) + "\n")
