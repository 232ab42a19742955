"""Start ranks on nodes over SSH (torchrun, horovodrun or directly), time them out, reap by pid.

Every remote command runs as the leader of a new session (`setsid -w`), and prints its
process-group id first; on timeout, failure or Ctrl-C the driver ends exactly that group
on each node (TERM, then KILL), and the local ssh clients by their pids. Nothing is ever
killed by name.

Every launch carries a random token in its ranks' environment (SCALELAB_LAUNCH); a process
group is only ended on a node if one of its members carries that token, so a group id that
the node has since given to another process (after a reboot, or pid reuse while the node was
unreachable) is never touched. A node that cannot be reached when its group is to be ended
(a cut link) is retried for a while; if it stays unreachable, its group stays listed in the
inflight file and is ended before the next run, on --resume, or by destroy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node
from scalelab.cluster.targets.interface import Runtime
from scalelab.core.errors import CommandError, ScalelabError
from scalelab.run import containers
from scalelab.sweep.planner import starts_directly

log = logging.getLogger(__name__)

RESULT = re.compile(r"SCALELAB_RESULT (?P<json>\{.*\})\s*$", re.MULTILINE)  # horovodrun prefixes lines
PGID = re.compile(r"^SCALELAB_PGID (?P<pgid>\d+)\s*$", re.MULTILINE)
WORKLOADS = "bench/workloads"
TOKEN_VAR = "SCALELAB_LAUNCH"
PGID_WAIT_S = 3.0  # at reaping, how long a launch that has not reported its group gets to


class LaunchError(ScalelabError):
    """A run could not be started, or its result could not be read."""


# A launcher's own work elsewhere (a Slurm job) is ended by a cancel line run on its login
# host before the command's process group; only lines made here are ever run again from a file.
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def cancel_line(name: str) -> str:
    """Shell line on the login host that cancels the run's job, whatever state it is in.

    >>> cancel_line("scalelab-ab12-x")
    'scancel --name scalelab-ab12-x --full 2>/dev/null; exit 0'
    """
    if not JOB_NAME.match(name):
        raise LaunchError(f"job name {name!r} is not one scalelab makes")
    return f"scancel --name {shlex.quote(name)} --full 2>/dev/null; exit 0"


def is_cancel_line(line: str) -> bool:
    """Whether a line (read back from an inflight file) is one cancel_line() makes.

    >>> is_cancel_line(cancel_line("scalelab-ab12-x")), is_cancel_line("rm -rf /; exit 0")
    (True, False)
    """
    m = re.fullmatch(r"scancel --name (\S+) --full 2>/dev/null; exit 0", line)
    return bool(m and JOB_NAME.match(m[1]))


@dataclass
class RankCommand:
    node: Node
    argv: list[str]  # what runs on the node
    env: dict[str, str] = field(default_factory=dict)
    # a shell line that ends, on the same node, what the command started elsewhere (a
    # launcher's own work: a Slurm job); run before the command's process group is ended
    cancel: str = ""
    # a scalelab.run.containers.Spec: the command runs in a container of the training image
    container: Any = None


def workload_args(params: dict[str, Any], profile: str | None = None) -> list[str]:
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
    if params.get("device") and not params.get("accelerator"):
        args += ["--device", str(params["device"])]  # never auto: resolved from the facts
    if params.get("channels_last"):
        args += ["--channels-last"]
    if params.get("data") not in (None, "synthetic") and params.get("loader_workers") is not None:
        args += ["--workers", str(params["loader_workers"]),
                 "--pin-memory", str(params.get("pin_memory") or "auto")]
    if profile:
        args += ["--profile", profile, "--dilation", f"{float(params.get('dilation') or 1):g}"]
    return args + comm_args(params)


def comm_args(params: dict[str, Any]) -> list[str]:
    """The communication settings of a run's params as resnet.py's flags; none at the
    engines' defaults (resnet.py's own), so the command of a default run is as before.
    Horovod's two settings reach Horovod as HOROVOD_FUSION_THRESHOLD (bytes) and
    HOROVOD_CYCLE_TIME, which resnet.py sets in its own environment before hvd.init(): that
    way they reach every rank under every launcher (horovodrun, hvdrank, Slurm, containers),
    whose ways of forwarding an environment differ.

    >>> comm_args({"engine": "ddp", "bucket_cap_mb": 50.0, "compression": "fp16"})
    ['--bucket-cap-mb', '50', '--compression', 'fp16']
    >>> comm_args({"engine": "horovod", "fusion_threshold_mb": 64.0, "cycle_time_ms": 1.0})
    ['--fusion-threshold-mb', '64']
    >>> comm_args({"engine": "ddp", "bucket_cap_mb": 25.0, "compression": "none"})
    []
    """
    from scalelab.model.comm import COMM_DEFAULTS, COMM_KEYS

    args: list[str] = []
    for key in COMM_KEYS:
        value = params.get(key)
        if value is None or value == COMM_DEFAULTS[key]:
            continue
        text = value if isinstance(value, str) else f"{float(value):g}"
        args += [f"--{key.replace('_', '-')}", text]
    return args


def allreduce_args(params: dict[str, Any], sizes: tuple[int, ...]) -> list[str]:
    """Command-line of bench/workloads/allreduce.py for a probe over the given sizes.

    >>> allreduce_args({"steps": 10, "warmup": 2}, (4096, 65536, 1048576))
    ['--min-bytes', '4096', '--max-bytes', '1048576', '--factor', '16', '--iters', '10', '--warmup', '2']
    """
    sizes = tuple(sorted(sizes)) or (1 << 20,)
    factor = sizes[1] // sizes[0] if len(sizes) > 1 else 2
    args = ["--min-bytes", str(sizes[0]), "--max-bytes", str(sizes[-1]), "--factor",
            str(max(2, factor)), "--iters", str(params.get("steps") or 10), "--warmup",
            str(params.get("warmup") or 2)]
    if params.get("accelerator") and params.get("dilation"):
        args += ["--dilation", f"{float(params['dilation']):g}"]  # in the emulated device's time
    elif params.get("device"):
        args += ["--device", str(params["device"])]  # the train runs' device: NCCL on GPUs
    return args


def threads_per_rank(node: Node, procs_per_node: int) -> int:
    """CPU threads each rank may use: the node's cores (configure's facts; the CPU share on
    the local target) split between its ranks.

    >>> n = Node("a", "x", "x", "head", "local", cpus=1.0)
    >>> threads_per_rank(n, 1), threads_per_rank(n, 4)
    (1, 1)
    >>> threads_per_rank(Node("b", "x", "x", "head", "static", cpus=32.0), 4)
    8
    """
    cpus = node.cpus or 1.0
    return max(1, int(cpus // procs_per_node))


def rank_env(node: Node, procs_per_node: int, fabric: str = "tcp", device: str = "cpu",
             ifaces: list[str] | None = None) -> dict[str, str]:
    """The environment of the ranks a command starts on node: threads, and the transport
    settings of scalelab.cluster.gpu.fabric_env. ifaces: the cluster interfaces of every node the
    environment reaches (horovodrun and Slurm hand one environment to all ranks); default the
    node's own.

    >>> n = Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "static", cpus=8.0, iface="ens5")
    >>> e = rank_env(n, 2, "tcp", "cuda")
    >>> e["OMP_NUM_THREADS"], e["NCCL_SOCKET_IFNAME"], e["NCCL_IB_DISABLE"], e["NCCL_DEBUG"]
    ('4', 'ens5', '1', 'INFO')
    """
    from scalelab.cluster import gpu

    env = {"OMP_NUM_THREADS": str(threads_per_rank(node, procs_per_node)),
           "PYTHONUNBUFFERED": "1"}
    # gloo and NCCL pick the first interface otherwise; inside a netns that may be wrong, and
    # on a host with RDMA, NCCL would leave the shaped interface for it
    env.update(gpu.fabric_env(fabric, device, ifaces if ifaces is not None else [node.iface]))
    return env


def torchrun_commands(nodes: list[Node], procs_per_node: int, script: str, args: list[str],
                      rt: Runtime, port: int, fabric: str = "tcp",
                      device: str = "cpu") -> list[RankCommand]:
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
        out.append(RankCommand(n, argv, rank_env(n, procs_per_node, fabric, device)))
    return out


def direct_commands(nodes: list[Node], script: str, args: list[str], rt: Runtime,
                    port: int, warm: str | None = None, fabric: str = "tcp",
                    device: str = "cpu") -> list[RankCommand]:
    """One rank per node started directly, with torchrun's static rendezvous in its environment.

    For nodes that share one host's cores (the local target): torchrun's agent imports torch
    as the rank does, which on a 2-core host running 8 nodes doubles the start-up of every run,
    and an agent buys nothing for a static group of one process per node. The rank's
    rendezvous is the same c10d store at the head (rank 0 serves it instead of the agent).
    warm: the name of the node's warm-start server (scalelab.run.warmstart): the rank is then
    forked from it, with torch already imported.

    >>> rt = Runtime("/v/bin/python", "/w", "/kh")
    >>> ns = [Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local", cpus=1.0, iface="eth0"),
    ...       Node("c-n1", "10.0.0.11", "10.0.0.11", "worker", "local", cpus=1.0, iface="eth0")]
    >>> cmd = direct_commands(ns, "resnet.py", ["--steps", "5"], rt, 29500)[1]
    >>> " ".join(cmd.argv)
    '/v/bin/python /w/bench/workloads/resnet.py --steps 5'
    >>> {k: cmd.env[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    {'RANK': '1', 'WORLD_SIZE': '2', 'MASTER_ADDR': '10.0.0.10', 'MASTER_PORT': '29500'}
    >>> " ".join(direct_commands(ns, "resnet.py", [], rt, 29500, warm="w1")[0].argv)
    '/v/bin/python /w/bench/workloads/warm.py run w1 -- /w/bench/workloads/resnet.py'
    """
    head = nodes[0].private_address
    out = []
    for i, n in enumerate(nodes):
        env = rank_env(n, 1, fabric, device)
        env.update({"RANK": str(i), "WORLD_SIZE": str(len(nodes)), "LOCAL_RANK": "0",
                    "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(i), "MASTER_ADDR": head,
                    "MASTER_PORT": str(port)})
        argv = [f"{rt.workdir}/{WORKLOADS}/{script}", *args]
        if warm:
            argv = [f"{rt.workdir}/{WORKLOADS}/warm.py", "run", warm, "--", *argv]
        out.append(RankCommand(n, [rt.python, *argv], env))
    return out


def rank_commands(engine: str, nodes: list[Node], procs_per_node: int, script: str,
                  args: list[str], rt: Runtime, port: int, shared_host: bool = False,
                  warm: str | None = None, fabric: str = "tcp",
                  device: str = "cpu", in_container: bool = False) -> tuple[str, list[RankCommand]]:
    """The launcher for a run and its commands: horovodrun for Horovod (hvdrank.py per node
    where the ranks run in containers); for DDP and the allreduce probe torchrun, or, where
    the nodes share one host's cores and run one process each, the ranks directly
    (direct_commands says why), forked from the warm-start server when there is one."""
    if engine == "horovod" and in_container:
        return "hvdrank", horovod_node_commands(nodes, procs_per_node, script, args, rt, port,
                                                fabric, device)
    if engine == "horovod":
        return "horovodrun", horovodrun_commands(nodes, procs_per_node, script, args, rt, port,
                                                 fabric, device)
    if starts_directly(engine, procs_per_node, shared_host):
        return ("warm" if warm else "direct"), direct_commands(nodes, script, args, rt, port,
                                                               warm, fabric, device)
    return "torchrun", torchrun_commands(nodes, procs_per_node, script, args, rt, port, fabric,
                                         device)


def horovodrun_commands(nodes: list[Node], procs_per_node: int, script: str, args: list[str],
                        rt: Runtime, port: int, fabric: str = "tcp",
                        device: str = "cpu") -> list[RankCommand]:
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
    ifaces = list(dict.fromkeys(n.iface for n in nodes if n.iface))
    if ifaces and len(nodes) > 1:
        # one node: horovodrun runs everything over loopback and refuses a named interface;
        # several: every node's own name, since its ranks all get this one environment
        argv += ["--network-interfaces", ",".join(ifaces)]
    argv += ["--gloo-timeout-seconds", "60", rt.python, f"{rt.workdir}/{WORKLOADS}/{script}",
             *args]
    env = rank_env(nodes[0], procs_per_node, fabric, device, [n.iface for n in nodes])
    env["PATH"] = f"{bindir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return [RankCommand(nodes[0], argv, env)]


def horovod_node_commands(nodes: list[Node], procs_per_node: int, script: str, args: list[str],
                          rt: Runtime, port: int, fabric: str = "tcp",
                          device: str = "cpu") -> list[RankCommand]:
    """bench/workloads/hvdrank.py on every node: Horovod's ranks without horovodrun, which
    could reach ranks in containers only over SSH. Node 0 serves the gloo rendezvous.

    >>> rt = Runtime("/v/bin/python", "/w", "/kh")
    >>> ns = [Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local", cpus=1.0, iface="eth0"),
    ...       Node("c-n1", "10.0.0.11", "10.0.0.11", "worker", "local", cpus=1.0, iface="eth0")]
    >>> cmd = horovod_node_commands(ns, 1, "resnet.py", ["--steps", "5"], rt, 29500)[1]
    >>> " ".join(cmd.argv)
    '/v/bin/python /w/bench/workloads/hvdrank.py /w/bench/workloads/resnet.py --steps 5'
    >>> [cmd.env[k] for k in ("HOROVOD_SLOTS", "HOROVOD_NODE_INDEX",
    ...                       "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_IFACE")]
    ['c-n0:1,c-n1:1', '1', '10.0.0.10', 'eth0']
    """
    slots = ",".join(f"{n.name}:{procs_per_node}" for n in nodes)
    out = []
    for i, n in enumerate(nodes):
        env = rank_env(n, procs_per_node, fabric, device)
        env.update({"HOROVOD_SLOTS": slots, "HOROVOD_NODE_INDEX": str(i),
                    "HOROVOD_GLOO_RENDEZVOUS_ADDR": nodes[0].private_address,
                    "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                    "HOROVOD_GLOO_TIMEOUT_SECONDS": "60"})
        if n.iface:
            env["HOROVOD_GLOO_IFACE"] = n.iface
        argv = [rt.python, f"{rt.workdir}/{WORKLOADS}/hvdrank.py",
                f"{rt.workdir}/{WORKLOADS}/{script}", *args]
        out.append(RankCommand(n, argv, env))
    return out


def remote_line(cmd: RankCommand, workdir: str) -> str:
    """The shell line sent over SSH: a new session that reports its process-group id first.

    The launch token goes into the environment before the session starts, so every process
    of the launch carries it from its first instruction: a driver killed right after the
    launch can still find and end them by the token alone (reap_line).

    >>> remote_line(RankCommand(Node("n", "a", "a", "head", "static"), ["python3", "x.py"],
    ...             {"SCALELAB_LAUNCH": "ab12", "OMP_NUM_THREADS": "4"}), "/w")
    "cd /w && exec env SCALELAB_LAUNCH=ab12 setsid -w sh -c 'echo SCALELAB_PGID $$ >&2; exec env OMP_NUM_THREADS=4 python3 x.py'"
    """
    token = cmd.env.get(TOKEN_VAR, "")
    rest = {k: v for k, v in cmd.env.items() if k != TOKEN_VAR}
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(rest.items()))
    inner = f"echo SCALELAB_PGID $$ >&2; exec env {env} {shlex.join(cmd.argv)}" if env else \
        f"echo SCALELAB_PGID $$ >&2; exec {shlex.join(cmd.argv)}"
    tag = f"env {TOKEN_VAR}={shlex.quote(token)} " if token else ""
    return f"cd {shlex.quote(workdir)} && exec {tag}setsid -w sh -c {shlex.quote(inner)}"


def ssh_argv(node: Node, known_hosts: str) -> list[str]:
    """ssh_args with faster keep-alives, on a connection of the rank's own: its ssh client is
    how a lost node is noticed.

    >>> n = Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local", ssh_key="/s/id")
    >>> [o for o in ssh_argv(n, "/s/kh") if o.startswith(("ServerAlive", "ControlPath"))]
    ['ServerAliveInterval=3', 'ServerAliveCountMax=3', 'ControlPath=none']
    """
    return ssh.ssh_args(node, known_hosts, shared=False)


def token_mark(token: str, node: str = "") -> str:
    """The value of SCALELAB_LAUNCH for the processes a launch starts on one node.

    The node's name is in it because nodes may share one PID namespace (the local target's
    do, and so do containers on one host): a node's reaper must find its own ranks only.

    >>> token_mark("ab12", "lab-n1"), token_mark("ab12")
    ('ab12@lab-n1', 'ab12')
    """
    if not re.fullmatch(r"[0-9a-f]{1,64}", token):
        raise LaunchError(f"launch token {token!r} is not hex")
    if node and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", node):
        raise LaunchError(f"node name {node!r} cannot be part of a launch token")
    return f"{token}@{node}" if node else token


def warm_comm(mark: str) -> str:
    """The process name a warm-started rank of launch mark takes (warm.py's comm_of).

    >>> warm_comm("ab12@lab-n1")
    'sl2784d3eb1e09b'
    """
    return "sl" + hashlib.sha256(mark.encode()).hexdigest()[:13]


def reap_line(pgid: int | None, token: str = "", grace_s: float = 3.0, node: str = "") -> str:
    """Shell line that ends a launch on a node: TERM, up to grace_s, then KILL.

    With a token, the process groups ended are exactly those of the processes that carry
    SCALELAB_LAUNCH=token_mark(token, node) in their environment (found in /proc): a group id the node has
    since given to someone else is never touched, and a launch whose group id was never
    read (a driver killed right after it) is still found. Without a token, the group pgid.
    Exits 0 whenever it ran, so a non-zero exit means ssh itself failed.

    >>> line = reap_line(4242, "ab12", 1.0, "lab-n1")
    >>> "SCALELAB_LAUNCH=ab12@lab-n1" in line and "kill -TERM -$g" in line
    True
    >>> "kill -TERM -4242" in reap_line(4242) and "environ" not in reap_line(4242)
    True
    """
    ticks = max(1, int(grace_s * 10))
    if token:
        mark = token_mark(token, node)
        # the launch's containers first (by their label; nothing on a node without an
        # engine), then its processes
        # one grep over every environ (NUL-separated entries), not a process per process:
        # the scan must stay cheap on a node with hundreds of processes
        # and a rank forked by a warm-start server (whose environ is the server's) by the
        # name it took from the mark (bench/workloads/warm.py comm_of)
        find = ("gs=$(for e in $(grep -lzxF '" + f"{TOKEN_VAR}={mark}" + "' /proc/[0-9]*/environ "
                f"2>/dev/null; grep -lxF '{warm_comm(mark)}' /proc/[0-9]*/comm 2>/dev/null); "
                "do p=${e#/proc/}; p=${p%/*}; "
                "{ read -r l < /proc/$p/stat; } 2>/dev/null || continue; set -- ${l##*) }; "
                "echo $3; done | sort -u); ")
        return (containers.reap_clause(mark) + find + "[ -n \"$gs\" ] || exit 0; "
                "for g in $gs; do kill -TERM -$g 2>/dev/null; done; i=0; "
                f"while [ $i -lt {ticks} ]; do a=; for g in $gs; do kill -0 -$g 2>/dev/null "
                "&& a=1; done; [ -n \"$a\" ] || exit 0; sleep 0.1; i=$((i+1)); done; "
                "for g in $gs; do kill -KILL -$g 2>/dev/null; done; exit 0")
    if pgid is None:
        raise LaunchError("nothing to end: neither a process group nor a launch token")
    pgid = int(pgid)
    # `kill -SIG -PGID`, not `kill -SIG -- -PGID`: dash (a node's /bin/sh, or a login shell)
    # refuses the `--` and would end nothing
    return (f"kill -TERM -{pgid} 2>/dev/null; i=0; while [ $i -lt {ticks} ]; do "
            f"kill -0 -{pgid} 2>/dev/null || exit 0; sleep 0.1; i=$((i+1)); done; "
            f"kill -KILL -{pgid} 2>/dev/null; exit 0")


@dataclass
class RankOutcome:
    node: str
    returncode: int | None
    stdout: str
    stderr: str
    ended_s: float | None = None  # seconds after launch when it exited by itself
    reaped: bool = False  # still running when scalelab ended it (after a failure, timeout, stop)


@dataclass
class LaunchResult:
    status: str  # ok | failed | timeout | interrupted
    result: dict[str, Any] | None
    error: str
    outcomes: list[RankOutcome]
    duration_s: float
    unreaped: list[str] = field(default_factory=list)  # nodes whose process group is left over
    started_unix: float = 0.0  # wall clock when the launch began (for the run's timeline)
    waited_s: float = 0.0  # from the launch until the ranks were done or given up on; reaping
    # (ending what is left, closing the ssh clients) is duration_s - waited_s


def run_cancels(lines: list[tuple[Node, str]], known_hosts: str, timeout_s: float = 20.0) -> None:
    """Run each command's cancel line on its node (a launcher's work elsewhere, ended before
    the command's own process group); bounded, and a failure is only logged."""
    for node, line in lines:
        try:
            proc = ssh.run(node, known_hosts, line, timeout=timeout_s, check=False)
            if proc.returncode != 0:
                log.warning("cancel on %s exited %s: %s", node.name, proc.returncode,
                            proc.stderr.strip()[-200:])
        except (CommandError, ScalelabError) as exc:
            log.warning("could not cancel on %s: %s", node.name, exc)


def end_groups(groups: list[tuple[Node, int | None]], known_hosts: str, token: str = "",
               grace_s: float = 3.0, retry_s: float = 20.0) -> list[tuple[Node, int]]:
    """End process groups on their nodes, in parallel; return those that could not be reached.

    A node that does not answer (a cut link, sshd busy) is retried for retry_s; each try is
    bounded by ssh's connect timeout and grace_s + 10 s.
    """
    failed: list[tuple[Node, int]] = []
    lock = threading.Lock()

    def one(node: Node, pgid: int | None) -> None:
        deadline = time.monotonic() + retry_s
        line = reap_line(pgid, token, grace_s, node.name)
        while True:
            try:
                proc = ssh.run(node, known_hosts, line, timeout=grace_s + 10, check=False)
                if proc.returncode == 0:
                    return
                err = proc.stderr.strip().splitlines()
                why = err[-1] if err else f"ssh exit {proc.returncode}"
            except CommandError as exc:
                why = str(exc)
            if time.monotonic() + 1 > deadline:
                log.warning("could not end process group %s on %s: %s", pgid, node.name, why)
                with lock:
                    failed.append((node, pgid))
                return
            time.sleep(1)

    threads = [threading.Thread(target=one, args=g, daemon=True) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=retry_s + grace_s + 20)
    return failed


class Launch:
    """One distributed run in flight: ssh clients on the controller, process groups on nodes."""

    def __init__(self, commands: list[RankCommand], rt: Runtime, token: str | None = None) -> None:
        self.commands = commands
        self.rt = rt
        self.token = secrets.token_hex(8) if token is None else token
        self.procs: list[subprocess.Popen] = []
        self.pgids: dict[str, int] = {}
        self.pending: list[dict[str, Any]] = []  # groups of earlier launches still to end
        self._ended: dict[int, float] = {}  # index -> when its ssh client exited by itself
        self._t0 = time.monotonic()
        self._buffers: list[tuple[list[str], list[str]]] = []
        self._threads: list[threading.Thread] = []

    def start(self, inflight: Path | None = None) -> None:
        self._t0 = time.monotonic()
        if inflight is not None:
            # before any rank exists: a driver killed from here on leaves their token behind
            save_inflight(inflight, self.entries())
        for i, cmd in enumerate(self.commands):
            mark = token_mark(self.token, cmd.node.name) if self.token else ""
            env = {**cmd.env, TOKEN_VAR: mark} if self.token else cmd.env
            argv, workdir = cmd.argv, self.rt.workdir
            if cmd.container is not None:
                if not mark:
                    raise LaunchError("a container launch needs a token to be reaped by")
                # the client runs from / on the node: the workdir is the image's own
                argv = containers.docker_argv(cmd.container, cmd.argv, sorted(cmd.env), mark, i,
                                              cmd.container.workdir)
                workdir = "/"
            line = remote_line(RankCommand(cmd.node, argv, env), workdir)
            argv = ssh_argv(cmd.node, self.rt.known_hosts) + ["--", line]
            log.debug("launch on %s: %s", cmd.node.name, shlex.join(cmd.argv))
            ssh.count(cmd.node, self.rt.known_hosts, shared=False)
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

    def _note_exits(self) -> list[int | None]:
        now = time.monotonic()
        codes = [p.poll() for p in self.procs]
        for i, c in enumerate(codes):
            if c is not None and i not in self._ended:
                self._ended[i] = now
        return codes

    def entries(self) -> list[dict[str, Any]]:
        """What the inflight file lists: this launch on every node (its group id once read;
        the token finds it before that), and older launches still to end."""
        return self.pending + [{"node": c.node.to_dict(), "pgid": self.pgids.get(c.node.name),
                                "token": self.token, **({"cancel": c.cancel} if c.cancel else {})}
                               for c in self.commands]

    def wait(self, timeout_s: float, fail_grace_s: float = 5.0,
             stop: threading.Event | None = None, inflight: Path | None = None) -> str:
        """Wait for every rank; returns ok, failed, timeout or interrupted.

        Once a rank has failed, the others get fail_grace_s to fail by themselves (and say
        why), then the run is failed: they are usually stuck in a collective with the dead
        rank. inflight: a file kept listing the process groups while the run is in flight,
        so that a driver killed with SIGKILL can reap them on --resume.
        """
        deadline = time.monotonic() + timeout_s
        first_fail: float | None = None
        written = -1
        while True:
            if inflight is not None and len(self.pgids) != written:
                written = len(self.pgids)
                save_inflight(inflight, self.entries())
            codes = self._note_exits()
            now = time.monotonic()
            if all(c is not None for c in codes):
                return "ok" if all(c == 0 for c in codes) else "failed"
            if first_fail is None and any(c not in (None, 0) for c in codes):
                first_fail = now
            if first_fail is not None and now - first_fail > fail_grace_s:
                return "failed"  # the others are stuck waiting for the dead rank
            if stop is not None and stop.is_set():
                return "interrupted"
            if now > deadline:
                return "timeout"
            time.sleep(0.05)

    def reap(self, grace_s: float = 3.0, retry_s: float = 20.0) -> list[str]:
        """End every process group we started on the nodes, then the local ssh clients.

        Returns the nodes whose group could not be ended (unreachable for retry_s); their
        groups are kept in self.pending.
        """
        # a launch whose remote shell has not yet reached setsid carries no token to be found
        # by: give it a moment to report its group (it does at once, unless the node is slow)
        settle = time.monotonic() + PGID_WAIT_S
        while time.monotonic() < settle and any(
                c.node.name not in self.pgids and p.poll() is None
                for c, p in zip(self.commands, self.procs, strict=False)):
            time.sleep(0.05)
        codes = self._note_exits()
        cancels = [(c.node, c.cancel) for c, code in zip(self.commands, codes, strict=False)
                   if c.cancel and code != 0]
        if cancels:
            run_cancels(cancels, self.rt.known_hosts)
        # every group, also of ranks whose ssh client has exited: after a lost connection
        # (exit 255) the group may well still run on the node
        # with a token, also the nodes whose group id was never read (the launch is found by
        # the token in its environment)
        groups = [(c.node, self.pgids.get(c.node.name)) for c in self.commands
                  if c.node.name in self.pgids or self.token]
        failed = end_groups(groups, self.rt.known_hosts, self.token, grace_s, retry_s)
        cancel_of = {c.node.name: c.cancel for c in self.commands if c.cancel}
        # a node not reached keeps its cancel line too: the next run or --resume runs it
        self.pending += [{"node": n.to_dict(), "pgid": g, "token": self.token,
                          **({"cancel": cancel_of[n.name]} if n.name in cancel_of else {})}
                         for n, g in failed]
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
        return [n.name for n, _ in failed]

    def printed(self, index: int) -> str:
        """What command index has printed on stdout so far."""
        return "".join(self._buffers[index][0])

    def exited(self) -> list[int | None]:
        """Each command's exit code, None while it runs."""
        return self._note_exits()

    def outcomes(self) -> list[RankOutcome]:
        out = []
        for i, (c, p, (o, e)) in enumerate(zip(self.commands, self.procs, self._buffers,
                                              strict=True)):
            natural = i in self._ended
            out.append(RankOutcome(c.node.name, p.returncode, "".join(o), "".join(e),
                                   round(self._ended[i] - self._t0, 3) if natural else None,
                                   reaped=not natural))
        return out


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The workload's one result line, if present.

    >>> parse_result('noise\\nSCALELAB_RESULT {"world_size": 2}\\n')
    {'world_size': 2}
    """
    matches = RESULT.findall(stdout)
    return json.loads(matches[-1]) if matches else None


# torchrun's ChildFailedError summary ("Root Cause (first observed failure)") fields
_TR_FIELD = re.compile(r"^\s*(?P<key>rank|exitcode|traceback)\s*:\s*(?P<value>.*?)\s*$")
_EXC = re.compile(r"^(?:\[rank\d+\]:\s*)?(?P<exc>(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*"
                  r"(?:Error|Exception|Exit|Interrupt|Warning)\b.*)$")
_SSH_ERR = re.compile(r"^ssh: |Permission denied|Host key verification failed|"
                      r"Connection (?:closed|reset|timed out|refused)|Timeout, server|"
                      r"kex_exchange_identification|No route to host|Broken pipe")
_NOISE = re.compile(r"^\s*(?:[=\-]{8,}|File \".*|\^+|Traceback \(most recent call last\):|"
                    r"\[W\d{4} .*|\[rank\d+\]:\s*(?:At:|\s.*)?)\s*$")


def _clean(text: str) -> str:
    """Strip what makes an exception line long without saying more (source paths, advice).

    >>> _clean("[rank0]: RuntimeError: Got the following error when running the callback: "
    ...        "RuntimeError: [/x/gloo/transport/tcp/pair.cc:537] Read error [10.0.0.11]:1: "
    ...        "Connection reset by peer. This is typically caused by a remote worker hanging")
    'RuntimeError: Read error [10.0.0.11]:1: Connection reset by peer.'
    """
    text = re.sub(r"^\[rank\d+\]:\s*", "", text.strip())
    text = re.sub(r"\[/[^\]\s]*\.(?:cc|cpp|h|hpp|py):\d+\]\s*", "", text)
    text = re.sub(r"Got the following error when running the callback: \w+(?:Error|Exception): ",
                  "", text)
    text = text.split(" This is typically caused")[0]
    return text[:300]


# `setsid -w` (remote_line) when the command it waits for was killed by a signal
_SETSID_SIGNALED = re.compile(r"^setsid: child \d+ did not exit normally")
_RANK_LINE = re.compile(r"\brank (?P<rank>\d+)/\d+\b")


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def rank_reason(stderr: str, returncode: int | None) -> str:
    """Why a rank's command failed, in one phrase, from its exit code and stderr.

    Reads torchrun's failure summary when there is one, else the last exception line,
    else the last meaningful line; exit 255 with nothing from the workload is ssh's own.

    >>> rank_reason("exitcode  : -9 (pid: 7)  (SIGKILL)\\n  rank      : 1 (local_rank: 0)\\n", 1)
    'rank 1 killed by signal 9 (SIGKILL)'
    >>> rank_reason("[rank0]: RuntimeError: Connection closed by peer [10.0.0.11]:5\\n"
    ...             "  rank      : 0 (local_rank: 0)\\n  exitcode  : 1 (pid: 8)\\n", 1)
    'rank 0 exit 1: RuntimeError: Connection closed by peer [10.0.0.11]:5'
    >>> rank_reason("[resnet.py] rank 1/2 on n1\\n", 255)
    'lost the SSH connection (node down, sshd gone or link cut)'
    >>> rank_reason("ssh: connect to host 10.0.0.11 port 22: Connection refused\\n", 255)
    'ssh: connect to host 10.0.0.11 port 22: Connection refused'
    >>> rank_reason("[resnet.py] rank 1/2 on n1\\nsetsid: child 7 did not exit normally: x\\n", 9)
    'rank 1 killed by signal 9 (SIGKILL)'
    >>> rank_reason("netprobe.py: error: bind failed\\n", 2)
    'exit 2: netprobe.py: error: bind failed'
    """
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip() and not PGID.match(ln)]
    fields: dict[str, str] = {}
    for ln in lines:
        m = _TR_FIELD.match(ln)
        if m:
            fields[m["key"]] = m["value"]
    excs = [ln for ln in lines if _EXC.match(ln.strip()) and "ChildFailedError" not in ln
            and "SignalException" not in ln]
    meaningful = [ln for ln in lines if not _NOISE.match(ln)]
    code = returncode
    who = ""
    if "exitcode" in fields:
        m = re.match(r"-?\d+", fields["exitcode"])
        if m:
            code = int(m.group())
            rank = re.match(r"\d+", fields.get("rank", ""))
            who = f"rank {rank.group()} " if rank else "a rank "
    died = [ln for ln in lines if _SETSID_SIGNALED.search(ln)]
    if died and not who and returncode and 0 < returncode < 128:
        # the command was killed by a signal (a rank started directly has no launcher to
        # say so): `setsid -w` then exits with its child's raw wait status
        code = -(returncode & 0x7F)
        rank = [m for m in (_RANK_LINE.search(ln) for ln in lines) if m]
        who = f"rank {rank[-1]['rank']} " if rank else ""
    if code is not None and code < 0:
        return f"{who}killed by signal {-code} ({_signal_name(-code)})"
    if returncode == 255 and not who:
        sshline = [ln for ln in lines if _SSH_ERR.search(ln)]
        if sshline:
            return sshline[-1].strip()[:300]
        return "lost the SSH connection (node down, sshd gone or link cut)"
    if excs:
        return f"{who}exit {code}: {_clean(excs[-1])}"
    if who and fields.get("traceback") and not fields["traceback"].startswith("To enable"):
        return f"{who}exit {code}: {fields['traceback'][:300]}"
    if code in (137, 143):
        return f"exit {code}: killed by {_signal_name(code - 128)}"
    why = meaningful[-1].strip()[:300] if meaningful else "no error output"
    return f"{who}exit {code}: {why}"


def explain_failure(outcomes: list[RankOutcome], status: str, timeout_s: float) -> str:
    """One line saying what went wrong: the ranks that failed by themselves, first first.

    >>> outs = [RankOutcome("n0", -15, "", "", None, reaped=True),
    ...         RankOutcome("n1", 255, "", "", 12.5)]
    >>> explain_failure(outs, "failed", 60)
    'n1: lost the SSH connection (node down, sshd gone or link cut); still running and ended: n0'
    >>> explain_failure(outs[:1], "timeout", 60)
    'timed out after 60 s'
    """
    if status == "timeout":
        return f"timed out after {timeout_s:g} s"
    if status == "interrupted":
        return "interrupted by the user"
    failed = [o for o in outcomes if o.returncode not in (0, None) and not o.reaped]
    failed.sort(key=lambda o: o.ended_s if o.ended_s is not None else float("inf"))
    reasons = [f"{o.node}: {rank_reason(o.stderr, o.returncode)}"[:400] for o in failed]
    if not reasons:
        return "no result line from rank 0"
    ended = [o.node for o in outcomes if o.reaped]
    if ended:
        reasons.append(f"still running and ended: {', '.join(ended)}")
    return "; ".join(reasons)


def save_inflight(path: Path, entries: list[dict[str, Any]]) -> None:
    """Write the inflight file (or remove it when nothing is listed), whole or not at all."""
    from scalelab.core.state import write_atomic

    try:
        if entries:
            write_atomic(path, json.dumps(entries) + "\n", mode=0o600)
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        raise LaunchError(f"cannot write {path} ({exc.strerror}); the run in flight was "
                          f"stopped and not recorded; free space, then resume the sweep "
                          f"(invoke bench --resume {path.parent.name})") from None


def _load_inflight(path: Path) -> list[dict[str, Any]]:
    try:
        entries = json.loads(path.read_text() or "[]")
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("%s unreadable (%s); no process groups to end from it", path, exc)
        return []
    return [e for e in entries if isinstance(e, dict) and "node" in e
            and (e.get("pgid") is not None or e.get("token"))] \
        if isinstance(entries, list) else []


def _pgid(entry: dict[str, Any]) -> int | None:
    return None if entry.get("pgid") is None else int(entry["pgid"])


def _end_entries(entries: list[dict[str, Any]], known_hosts: str,
                 retry_s: float) -> list[dict[str, Any]]:
    """End listed groups (each with its own token); return the entries still unreachable."""
    left = []
    by_token: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_token.setdefault(str(e.get("token") or ""), []).append(e)
    for token, group in by_token.items():
        # a line read back from a file is run only if it is one a launcher writes
        run_cancels([(Node.from_dict(e["node"]), str(e["cancel"])) for e in group
                     if is_cancel_line(str(e.get("cancel") or ""))], known_hosts)
        nodes = [(Node.from_dict(e["node"]), _pgid(e)) for e in group]
        failed = {(n.name, g) for n, g in end_groups(nodes, known_hosts, token, retry_s=retry_s)}
        left += [e for e in group if (e["node"]["name"], _pgid(e)) in failed]
    return left


def end_leftovers(path: Path, known_hosts: str, retry_s: float = 5.0) -> list[dict[str, Any]]:
    """End what an earlier launch listed in path and could not end; the entries still
    unreachable (to be listed again by the next launch that writes path)."""
    leftover = _load_inflight(path)
    return _end_entries(leftover, known_hosts, retry_s=retry_s) if leftover else []


def reap_inflight(path: Path, known_hosts: str, retry_s: float = 20.0) -> int:
    """End the process groups a killed driver (or an unreachable node) left running.

    Returns how many were listed; those still unreachable stay in the file.
    """
    entries = _load_inflight(path)
    if not entries:
        path.unlink(missing_ok=True)
        return 0
    left = _end_entries(entries, known_hosts, retry_s)
    try:
        save_inflight(path, left)
    except LaunchError as exc:
        log.warning("%s", exc)
    return len(entries)


def run(commands: list[RankCommand], rt: Runtime, timeout_s: float,
        stop: threading.Event | None = None, inflight: Path | None = None) -> LaunchResult:
    """Start, wait, reap; the result is read from the head node's stdout.

    Groups that an earlier launch could not end (listed in the inflight file) are ended
    first; those still unreachable stay listed.
    """
    t0, started_unix = time.monotonic(), time.time()
    waited_s = 0.0
    launch = Launch(commands, rt)
    if inflight is not None:
        launch.pending = end_leftovers(inflight, rt.known_hosts)
    status = "failed"
    unreaped: list[str] = []
    try:
        launch.start(inflight)
        status = launch.wait(timeout_s, stop=stop, inflight=inflight)
        waited_s = time.monotonic() - t0
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        unreaped = launch.reap()
        if inflight is not None:
            try:
                save_inflight(inflight, launch.pending)
            except LaunchError as exc:
                log.warning("%s", exc)
    outcomes = launch.outcomes()
    result = parse_result(outcomes[0].stdout) if outcomes else None
    if status == "ok" and result is None:
        status = "failed"
    error = "" if status == "ok" else explain_failure(outcomes, status, timeout_s)
    if unreaped:
        note = (f"could not end the ranks on {', '.join(unreaped)} (unreachable); they are "
                "ended before the next run, on --resume, or by invoke destroy")
        if status == "ok":
            log.warning("%s", note)  # the contract: an ok run's error is ""
        else:
            error += f"; {note}"
    return LaunchResult(status, result, error, outcomes, time.monotonic() - t0, unreaped,
                        started_unix, waited_s)
