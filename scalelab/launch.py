"""Start ranks on nodes over SSH (torchrun or horovodrun), enforce a timeout, reap by pid.

Every remote command runs as the leader of a new session (`setsid -w`), and prints its
process-group id first; on timeout, failure or Ctrl-C the driver ends exactly that group
on each node (TERM, then KILL), and the local ssh clients by their pids. Nothing is ever
killed by name.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab import ssh
from scalelab.errors import CommandError, ScalelabError
from scalelab.nodes import Node

log = logging.getLogger(__name__)

RESULT = re.compile(r"SCALELAB_RESULT (?P<json>\{.*\})\s*$", re.MULTILINE)  # horovodrun prefixes lines
PGID = re.compile(r"^SCALELAB_PGID (?P<pgid>\d+)\s*$", re.MULTILINE)
WORKLOADS = "bench/workloads"


class LaunchError(ScalelabError):
    """A run could not be started, or its result could not be read."""


@dataclass(frozen=True)
class Runtime:
    """Where the training stack lives on the nodes."""

    python: str  # interpreter on the nodes, e.g. /work/main/.venv/bin/python
    workdir: str  # directory holding bench/workloads on the nodes
    known_hosts: str  # pinned host keys, on the controller


@dataclass
class RankCommand:
    node: Node
    argv: list[str]  # what runs on the node
    env: dict[str, str] = field(default_factory=dict)


def workload_args(params: dict[str, Any]) -> list[str]:
    """Command-line of bench/workloads/resnet.py for a run's params.

    >>> workload_args({"model": "resnet20", "batch_size": 32, "precision": "fp32",
    ...                "steps": 10, "warmup": 2, "engine": "ddp", "image_size": None,
    ...                "data": "synthetic"})
    ['--model', 'resnet20', '--batch-size', '32', '--precision', 'fp32', '--steps', '10', '--warmup', '2', '--engine', 'ddp', '--data', 'synthetic']
    """
    args = ["--model", str(params["model"]), "--batch-size", str(params["batch_size"]),
            "--precision", str(params["precision"]), "--steps", str(params["steps"]),
            "--warmup", str(params["warmup"]), "--engine", str(params["engine"])]
    if params.get("image_size"):
        args += ["--image-size", str(params["image_size"])]
    args += ["--data", str(params.get("data") or "synthetic")]
    return args


def allreduce_args(params: dict[str, Any], sizes: tuple[int, ...]) -> list[str]:
    """Command-line of bench/workloads/allreduce.py for a probe over the given sizes.

    >>> allreduce_args({"steps": 10, "warmup": 2}, (4096, 65536, 1048576))
    ['--min-bytes', '4096', '--max-bytes', '1048576', '--factor', '16', '--iters', '10', '--warmup', '2']
    """
    sizes = tuple(sorted(sizes)) or (1 << 20,)
    factor = sizes[1] // sizes[0] if len(sizes) > 1 else 2
    return ["--min-bytes", str(sizes[0]), "--max-bytes", str(sizes[-1]), "--factor",
            str(max(2, factor)), "--iters", str(params.get("steps") or 10), "--warmup",
            str(params.get("warmup") or 2)]


def threads_per_rank(node: Node, procs_per_node: int) -> int:
    """CPU threads each rank may use: the node's CPU share split between its ranks.

    >>> n = Node("a", "x", "x", "head", "local", cpus=1.0)
    >>> threads_per_rank(n, 1), threads_per_rank(n, 4)
    (1, 1)
    """
    cpus = node.cpus or 1.0
    return max(1, int(cpus // procs_per_node))


def rank_env(node: Node, procs_per_node: int) -> dict[str, str]:
    env = {"OMP_NUM_THREADS": str(threads_per_rank(node, procs_per_node)),
           "PYTHONUNBUFFERED": "1"}
    if node.iface:
        # gloo and NCCL pick the first interface otherwise; inside a netns that may be wrong
        env["GLOO_SOCKET_IFNAME"] = node.iface
        env["NCCL_SOCKET_IFNAME"] = node.iface
    return env


def torchrun_commands(nodes: list[Node], procs_per_node: int, script: str, args: list[str],
                      rt: Runtime, port: int) -> list[RankCommand]:
    """One torchrun per node with a static rendezvous at the head's cluster address.

    >>> rt = Runtime("/v/bin/python", "/w", "/kh")
    >>> ns = [Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local", cpus=1.0, iface="eth0"),
    ...       Node("c-n1", "10.0.0.11", "10.0.0.11", "worker", "local", cpus=1.0, iface="eth0")]
    >>> cmds = torchrun_commands(ns, 1, "resnet.py", ["--steps", "5"], rt, 29500)
    >>> " ".join(cmds[1].argv)
    '/v/bin/python -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank 1 --master-addr 10.0.0.10 --master-port 29500 /w/bench/workloads/resnet.py --steps 5'
    """
    head = nodes[0].private_address
    out = []
    for i, n in enumerate(nodes):
        argv = [rt.python, "-m", "torch.distributed.run", "--nnodes", str(len(nodes)),
                "--nproc-per-node", str(procs_per_node), "--node-rank", str(i),
                "--master-addr", head, "--master-port", str(port),
                f"{rt.workdir}/{WORKLOADS}/{script}", *args]
        out.append(RankCommand(n, argv, rank_env(n, procs_per_node)))
    return out


def horovodrun_commands(nodes: list[Node], procs_per_node: int, script: str, args: list[str],
                        rt: Runtime, port: int) -> list[RankCommand]:
    """horovodrun on the head node; it starts the other ranks itself over SSH (gloo).

    >>> rt = Runtime("/v/bin/python", "/w", "/kh")
    >>> ns = [Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local", cpus=1.0, iface="eth0"),
    ...       Node("c-n1", "10.0.0.11", "10.0.0.11", "worker", "local", cpus=1.0, iface="eth0")]
    >>> " ".join(horovodrun_commands(ns, 1, "resnet.py", [], rt, 29500)[0].argv)
    '/v/bin/horovodrun --gloo -np 2 -H 10.0.0.10:1,10.0.0.11:1 --network-interfaces eth0 --gloo-timeout-seconds 60 /v/bin/python /w/bench/workloads/resnet.py'
    """
    hosts = ",".join(f"{n.private_address}:{procs_per_node}" for n in nodes)
    bindir = rt.python.rsplit("/", 1)[0]
    argv = [f"{bindir}/horovodrun", "--gloo", "-np", str(len(nodes) * procs_per_node),
            "-H", hosts]
    if nodes[0].iface:
        argv += ["--network-interfaces", nodes[0].iface]
    argv += ["--gloo-timeout-seconds", "60", rt.python, f"{rt.workdir}/{WORKLOADS}/{script}",
             *args]
    env = rank_env(nodes[0], procs_per_node)
    env["PATH"] = f"{bindir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return [RankCommand(nodes[0], argv, env)]


def remote_line(cmd: RankCommand, workdir: str) -> str:
    """The shell line sent over SSH: a new session that reports its process-group id first."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(cmd.env.items()))
    inner = f"echo SCALELAB_PGID $$ >&2; exec env {env} {shlex.join(cmd.argv)}"
    return f"cd {shlex.quote(workdir)} && exec setsid -w sh -c {shlex.quote(inner)}"


@dataclass
class RankOutcome:
    node: str
    returncode: int | None
    stdout: str
    stderr: str


@dataclass
class LaunchResult:
    status: str  # ok | failed | timeout | interrupted
    result: dict[str, Any] | None
    error: str
    outcomes: list[RankOutcome]
    duration_s: float


class Launch:
    """One distributed run in flight: ssh clients on the controller, process groups on nodes."""

    def __init__(self, commands: list[RankCommand], rt: Runtime) -> None:
        self.commands = commands
        self.rt = rt
        self.procs: list[subprocess.Popen] = []
        self.pgids: dict[str, int] = {}
        self._buffers: list[tuple[list[str], list[str]]] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for cmd in self.commands:
            argv = ssh.ssh_args(cmd.node, self.rt.known_hosts) + [
                "--", remote_line(cmd, self.rt.workdir)]
            log.debug("launch on %s: %s", cmd.node.name, shlex.join(cmd.argv))
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            out: list[str] = []
            err: list[str] = []
            self.procs.append(proc)
            self._buffers.append((out, err))
            for stream, buf, is_err in ((proc.stdout, out, False), (proc.stderr, err, True)):
                t = threading.Thread(target=self._pump, args=(stream, buf, cmd.node.name, is_err),
                                     daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, stream, buf: list[str], node: str, is_err: bool) -> None:
        for line in stream:
            buf.append(line)
            if is_err:
                m = PGID.match(line)
                if m:
                    self.pgids[node] = int(m["pgid"])
        stream.close()

    def wait(self, timeout_s: float, fail_grace_s: float = 10.0,
             stop: threading.Event | None = None, inflight: Path | None = None) -> str:
        """Wait for every rank; returns ok, failed, timeout or interrupted.

        inflight: a file kept listing {node address: process-group id} while the run is in
        flight, so that a driver killed with SIGKILL can reap them on --resume.
        """
        deadline = time.monotonic() + timeout_s
        first_fail: float | None = None
        written = 0
        while True:
            if inflight is not None and len(self.pgids) != written:
                written = len(self.pgids)
                write_inflight(inflight, self.commands, self.pgids)
            codes = [p.poll() for p in self.procs]
            if all(c is not None for c in codes):
                return "ok" if all(c == 0 for c in codes) else "failed"
            if any(c not in (None, 0) for c in codes) and first_fail is None:
                first_fail = time.monotonic()
            if first_fail is not None and time.monotonic() - first_fail > fail_grace_s:
                return "failed"  # the others are stuck waiting for the dead rank
            if stop is not None and stop.is_set():
                return "interrupted"
            if time.monotonic() > deadline:
                return "timeout"
            time.sleep(0.05)

    def reap(self, grace_s: float = 3.0) -> None:
        """End every process group we started on the nodes, then the local ssh clients."""
        for cmd in self.commands:
            pgid = self.pgids.get(cmd.node.name)
            if pgid is None:
                continue
            line = (f"kill -TERM -- -{pgid} 2>/dev/null; for i in $(seq 1 {int(grace_s * 10)}); "
                    f"do kill -0 -- -{pgid} 2>/dev/null || exit 0; sleep 0.1; done; "
                    f"kill -KILL -- -{pgid} 2>/dev/null; exit 0")
            try:
                ssh.run(cmd.node, self.rt.known_hosts, line, timeout=grace_s + 10, check=False)
            except CommandError as exc:
                log.warning("could not reap process group %s on %s: %s", pgid, cmd.node.name, exc)
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        for t in self._threads:
            t.join(timeout=2)

    def outcomes(self) -> list[RankOutcome]:
        return [RankOutcome(c.node.name, p.returncode, "".join(o), "".join(e))
                for c, p, (o, e) in zip(self.commands, self.procs, self._buffers, strict=True)]


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The workload's one result line, if present.

    >>> parse_result('noise\\nSCALELAB_RESULT {"world_size": 2}\\n')
    {'world_size': 2}
    """
    matches = RESULT.findall(stdout)
    return json.loads(matches[-1]) if matches else None


def explain_failure(outcomes: list[RankOutcome], status: str, timeout_s: float) -> str:
    """One line saying what went wrong, from the ranks' exit codes and last stderr lines."""
    if status == "timeout":
        return f"timed out after {timeout_s:g} s"
    if status == "interrupted":
        return "interrupted by the user"
    reasons = []
    for o in outcomes:
        if o.returncode in (0, None):
            continue
        tail = [ln for ln in o.stderr.splitlines() if ln.strip() and not PGID.match(ln)]
        why = tail[-1].strip() if tail else ""
        if o.returncode == 255 and not why:
            why = "ssh connection lost"
        if o.returncode < 0 or o.returncode in (137, 143):
            why = why or "killed by a signal"
        reasons.append(f"{o.node} exit {o.returncode}: {why}"[:400])
    return "; ".join(reasons) or "no result line from rank 0"


def write_inflight(path: Path, commands: list[RankCommand], pgids: dict[str, int]) -> None:
    from scalelab.state import write_atomic

    entries = [{"node": c.node.to_dict(), "pgid": pgids[c.node.name]}
               for c in commands if c.node.name in pgids]
    write_atomic(path, json.dumps(entries) + "\n", mode=0o600)


def reap_inflight(path: Path, known_hosts: str) -> int:
    """End the process groups a killed driver left running (listed in its inflight file)."""
    if not path.exists():
        return 0
    entries = json.loads(path.read_text() or "[]")
    commands = [RankCommand(Node.from_dict(e["node"]), []) for e in entries]
    launch = Launch(commands, Runtime("", "", known_hosts))
    launch.pgids = {e["node"]["name"]: int(e["pgid"]) for e in entries}
    launch.reap()
    path.unlink()
    return len(entries)


def run(commands: list[RankCommand], rt: Runtime, timeout_s: float,
        stop: threading.Event | None = None, inflight: Path | None = None) -> LaunchResult:
    """Start, wait, reap; the result is read from the head node's stdout."""
    t0 = time.monotonic()
    launch = Launch(commands, rt)
    status = "failed"
    try:
        launch.start()
        status = launch.wait(timeout_s, stop=stop, inflight=inflight)
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        launch.reap()
        if inflight is not None:
            inflight.unlink(missing_ok=True)
    outcomes = launch.outcomes()
    result = parse_result(outcomes[0].stdout) if outcomes else None
    if status == "ok" and result is None:
        status = "failed"
    error = "" if status == "ok" else explain_failure(outcomes, status, timeout_s)
    return LaunchResult(status, result, error, outcomes, time.monotonic() - t0)


def default_runtime(cluster_rec: dict[str, Any]) -> Runtime:
    """Local clusters see the controller's venv and checkout; others use configure's paths."""
    project = Path(__file__).resolve().parent.parent
    if cluster_rec["target"] == "local":
        import sys

        return Runtime(str(Path(sys.executable).parent / "python"), str(project),
                       cluster_rec["known_hosts"])
    return Runtime(cluster_rec.get("python", "/opt/scalelab/venv/bin/python"),
                   cluster_rec.get("workdir", "/opt/scalelab"), cluster_rec["known_hosts"])
