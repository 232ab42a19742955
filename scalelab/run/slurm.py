"""Runs as Slurm jobs: checks on the login host, srun command lines, job state from sacct.

With `--launcher slurm` every run (training, allreduce probe, link probe) is one Slurm job.
scalelab logs in to the login host over SSH, as for any other command, and starts `srun` there
in the foreground: srun asks slurmctld for an allocation of whole nodes (--exclusive) with a
time limit, starts the ranks on the allocated nodes, and relays their output, which scalelab
reads as it reads a rank's over SSH. The job's name carries the run's launch token, so the job
is found (sacct) and cancelled (scancel) by a name no other job has: on a timeout, a Ctrl-C,
a failure, and on --resume after a driver was killed outright.

sacct's state and exit code decide a run's status (outcome()); what srun and the workload
printed says why it failed.

DDP ranks are started by srun itself, one task per rank, with torchrun's environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...) taken from Slurm's (SLURM_PROCID, ...).
Horovod runs as `horovodrun` on the first node of an allocation made by `salloc`, with the
allocated hosts as its host list; a Horovod run that comes back from an injected failure runs
horovodrun's elastic driver there, which starts the killed node's ranks again on it. A DDP run
that comes back from an injected failure runs in an allocation made by `salloc` too: its ranks
are a job step, started again as a new step of the same job when one fails.
"""

from __future__ import annotations

import logging
import math
import re
import shlex
import threading
from dataclasses import dataclass
from typing import Any

from scalelab.cluster import image
from scalelab.cluster.nodes import Node
from scalelab.cluster.slurmctl import login_run
from scalelab.cluster.targets.interface import Runtime
from scalelab.core.errors import ClusterError, ScalelabError
from scalelab.run import checkpoints, commands, launch, linkprobe
from scalelab.run.reap import JOB_NAME, cancel_line

log = logging.getLogger(__name__)

# sacct states in which a job is over (sacct(1) JOB STATE CODES)
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED", "REVOKED")
SACCT_WAIT_S = 20.0  # slurmctld hands a finished job to slurmdbd within a few seconds


class SlurmError(ScalelabError):
    """Slurm on the login host could not be asked, or answered something unreadable."""


@dataclass
class Job:
    """One run's Slurm job: its name (known before it exists) and what sacct says of it."""

    name: str
    job_id: str = ""
    state: str = ""  # sacct State, e.g. COMPLETED, CANCELLED (by 0 stripped into `by`)
    exit_code: str = ""  # sacct ExitCode, "code:signal"
    nodelist: str = ""
    partition: str = ""
    elapsed_s: float | None = None
    by: str = ""  # who cancelled it (a uid), when sacct says

    def to_record(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "job_name": self.name, "state": self.state,
                "exit_code": self.exit_code, "nodelist": self.nodelist,
                "partition": self.partition, "elapsed_s": self.elapsed_s}


def job_name(token: str, run_id: str) -> str:
    """The job's name: the run and its launch token, unique among every job of the cluster.

    >>> job_name("ab12cd34ef56", "train-n02-p1-b032-bw1000-r0")
    'scalelab-ab12cd34-train-n02-p1-b032-bw1000-r0'
    """
    name = f"scalelab-{token[:8]}-{run_id}"
    if not JOB_NAME.fullmatch(name):
        raise SlurmError(f"cannot make a Slurm job name of run {run_id!r}")
    return name


def time_limit_min(timeout_s: float) -> int:
    """The job's --time in whole minutes: the run's own timeout, rounded up, plus one.

    scalelab ends a run at its timeout itself (and cancels the job); Slurm's limit, which it
    checks about every 30 s, is the backstop that holds when the driver is gone.

    >>> time_limit_min(180), time_limit_min(20), time_limit_min(61)
    (4, 2, 3)
    """
    return max(1, math.ceil(timeout_s / 60)) + 1


def alloc_options(name: str, nodes: list[Node], procs_per_node: int, partition: str | None,
                  timeout_s: float, gpus_per_node: int = 0, tasks: bool = True,
                  whole: bool = True) -> list[str]:
    """srun/salloc options of a run: whole nodes (whole False: a CPU a task), these nodes, a
    time limit, a name.

    >>> ns = [Node("c-n0", "a", "a", "head", "local"), Node("c-n1", "b", "b", "worker", "local")]
    >>> " ".join(alloc_options("j", ns, 2, "gpu", 180, gpus_per_node=2))
    '--job-name j --partition gpu --nodes 2 --nodelist c-n0,c-n1 --exclusive --overcommit --time 4 --ntasks-per-node 2 --gpus-per-node 2'
    """
    opts = ["--job-name", name]
    if partition:
        opts += ["--partition", partition]
    # --overcommit: a task is not given a CPU of its own (a rank's threads are the sweep's
    # choice); Slurm 22.05 still starts no more tasks on a node than its CPUs, which
    # scalelab.run.admission checks before any job
    opts += ["--nodes", str(len(nodes)), "--nodelist", ",".join(n.name for n in nodes),
             *(["--exclusive", "--overcommit"] if whole else []),
             "--time", str(time_limit_min(timeout_s))]
    if tasks:
        opts += ["--ntasks-per-node", str(procs_per_node)]
    if gpus_per_node:
        opts += ["--gpus-per-node", str(gpus_per_node)]
    return opts


# torchrun's environment from Slurm's, for a rank that srun started; MASTER_ADDR is the first
# allocated node (Slurm puts task 0 there), resolved as the cluster resolves its node names
_RANK_ENV = ('export RANK="$SLURM_PROCID" WORLD_SIZE="$SLURM_NTASKS" LOCAL_RANK="$SLURM_LOCALID" '
             'LOCAL_WORLD_SIZE="$SLURM_NTASKS_PER_NODE" GROUP_RANK="$SLURM_NODEID"; '
             'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1); '
             'export MASTER_ADDR; exec "$@"')


# a rank in a container Slurm starts (srun --container): Slurm 22.05 hands the container the
# job's environment but not the task's (no SLURM_PROCID) and there is no scontrol inside, so
# each node finds its rank by its own short hostname in SCALELAB_RANKS (name:rank,...), one
# task a node
_CONTAINER_RANK_ENV = (
    'h=$(cat /proc/sys/kernel/hostname); h=${h%%.*}; '
    'R=$(printf ",%s," "$SCALELAB_RANKS" | sed -n "s/.*,$h:\\([0-9]*\\),.*/\\1/p"); '
    'if [ -z "$R" ]; then echo "scalelab: node $h has no rank in this run" >&2; exit 1; fi; '
    'export RANK="$R" GROUP_RANK="$R" WORLD_SIZE="$SLURM_STEP_NUM_TASKS" LOCAL_RANK=0 '
    'LOCAL_WORLD_SIZE=1; exec "$@"')


# a parameter-server run's process, which srun started: its rank from its node's place in
# SCALELAB_PS_NODES (name:servers-here, in the run's order: the workers' nodes first, so rank
# 0 is a worker whatever order Slurm gives the nodes) and its task on the node; the last
# servers-here tasks of a node serve (resnet.py --ps-servers-here)
_PS_RANK_ENV = (
    'n=0; h=; for e in $(printf %s "$SCALELAB_PS_NODES" | tr , " "); do '
    'if [ "${e%:*}" = "$SLURMD_NODENAME" ]; then h=${e##*:}; break; fi; n=$((n + 1)); done; '
    'if [ -z "$h" ]; then echo "scalelab: node $SLURMD_NODENAME has no place in this run" >&2; '
    'exit 1; fi; export RANK=$((n * SLURM_NTASKS_PER_NODE + SLURM_LOCALID)) '
    'WORLD_SIZE="$SLURM_NTASKS" LOCAL_RANK="$SLURM_LOCALID" '
    'LOCAL_WORLD_SIZE="$SLURM_NTASKS_PER_NODE" GROUP_RANK="$n"; '
    'exec "$@" --ps-servers-here "$h"')


def ps_command(workers: list[Node], servers: list[Node], login: Node, procs_per_node: int,
               script_path: str, args: list[str], python: str, port: int, name: str,
               partition: str | None, timeout_s: float) -> commands.RankCommand:
    """The parameter-server engine's run as one srun: every worker node runs its workers and,
    with no server nodes (colocated), one server after them; each server node runs one server
    (so a run with server nodes has one worker a node: a job step starts as many tasks on
    every node).

    >>> ns = [Node(f"c-n{i}", f"10.0.0.1{i}", f"10.0.0.1{i}", "worker", "local", cpus=1.0,
    ...            iface="eth0") for i in range(3)]
    >>> d = ps_command(ns[:2], ns[2:], ns[0], 1, "/w/r.py", [], "/v/python", 29500, "j", None, 60)
    >>> d.env["SCALELAB_PS_NODES"], d.env["MASTER_ADDR"], d.argv[d.argv.index("--nodes") + 1]
    ('c-n0:0,c-n1:0,c-n2:1', '10.0.0.10', '3')
    >>> c = ps_command(ns[:2], [], ns[0], 2, "/w/r.py", [], "/v/python", 29500, "j", None, 60)
    >>> c.env["SCALELAB_PS_NODES"], c.argv[c.argv.index("--ntasks-per-node") + 1]
    ('c-n0:1,c-n1:1', '3')
    """
    layout = commands.ps_layout(workers, servers, procs_per_node)
    if len({procs for _, procs, _ in layout}) > 1:
        raise SlurmError("a parameter-server run with server nodes has one worker a node "
                         "under Slurm")
    everyone, tasks = [n for n, _, _ in layout], layout[0][1]
    env = commands.rank_env(everyone[0], tasks, ifaces=[n.iface for n in everyone])
    env.update(MASTER_ADDR=workers[0].private_address, MASTER_PORT=str(port),
               SCALELAB_PS_NODES=",".join(f"{n.name}:{serves}" for n, _, serves in layout))
    argv = ["srun", *alloc_options(name, everyone, tasks, partition, timeout_s),
            "--kill-on-bad-exit=1", "--export=ALL", "sh", "-c", _PS_RANK_ENV, "sh", python,
            script_path, *args]
    return commands.RankCommand(login, argv, env, cancel=cancel_line(name))


def short_hostname(node: Node) -> str:
    """The node's own hostname up to its first dot, as configure read it (its name where the
    facts have none): what a rank in a container of that node reads from the kernel.

    >>> short_hostname(Node("c-n0", "a", "a", "head", "static", facts={"hostname": "gpu7.lab"}))
    'gpu7'
    """
    return ((node.facts or {}).get("hostname") or node.name).split(".", 1)[0]


def container_command(nodes: list[Node], login: Node, script: str, args: list[str],
                      bundle: str, port: int, name: str, partition: str | None,
                      timeout_s: float) -> commands.RankCommand:
    """srun --container BUNDLE: one DDP rank a node, each in a container of the training
    image that Slurm's OCI support starts with runc, on the node's network.

    >>> ns = [Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local", cpus=1.0, iface="eth0"),
    ...       Node("c-n1", "10.0.0.11", "10.0.0.11", "worker", "local", cpus=1.0, iface="eth0")]
    >>> cmd = container_command(ns, ns[0], "resnet.py", ["--steps", "5"], "/opt/b", 29500, "j",
    ...                         None, 180)
    >>> "--container=/opt/b" in cmd.argv, cmd.argv[-4:]
    (True, ['/opt/scalelab/venv/bin/python', '/opt/scalelab/bench/workloads/resnet.py', '--steps', '5'])
    >>> cmd.env["SCALELAB_RANKS"], cmd.env["MASTER_ADDR"], cmd.env["MASTER_PORT"]
    ('c-n0:0,c-n1:1', '10.0.0.10', '29500')
    >>> export = next(a for a in cmd.argv if a.startswith("--export="))[9:].split(",")
    >>> "SCALELAB_RANKS" in export, "SCALELAB_LAUNCH" in export, "PATH" in export
    (True, True, False)
    """
    env = commands.rank_env(nodes[0], 1, ifaces=[n.iface for n in nodes])
    env.update(MASTER_ADDR=nodes[0].private_address, MASTER_PORT=str(port),
               SCALELAB_RANKS=",".join(f"{short_hostname(n)}:{i}" for i, n in enumerate(nodes)))
    # Slurm appends the job's environment to the bundle's: only scalelab's variables (and
    # Slurm's own) go in, so the login host's PATH or PYTHONPATH never shadows the image's
    export = "--export=" + ",".join(sorted({*env, "SCALELAB_LAUNCH"}))
    argv = ["srun", *alloc_options(name, nodes, 1, partition, timeout_s), "--kill-on-bad-exit=1",
            export, f"--container={bundle}", "sh", "-c", _CONTAINER_RANK_ENV, "sh", image.PYTHON,
            f"{image.PREFIX}/{commands.WORKLOADS}/{script}", *args]
    return commands.RankCommand(login, argv, env, cancel=cancel_line(name))


# salloc's command on the login host for a DDP run that comes back from a failure: the ranks'
# job step ("$@", an srun) again in the same allocation while it fails, at most R more times,
# each attempt's number in SCALELAB_ATTEMPT (the ranks' resume reads it)
_RESTART_LOOP = (
    'trap "exit 143" TERM HUP INT; a=0; while :; do SCALELAB_ATTEMPT=$a; export SCALELAB_ATTEMPT; '
    '"$@"; rc=$?; [ "$rc" -eq 0 ] && exit 0; a=$((a + 1)); [ "$a" -gt __R__ ] && exit "$rc"; '
    # a job cancelled or past its time limit ends here, not in steps Slurm refuses
    '[ "$(squeue --noheader --jobs "$SLURM_JOB_ID" --format %T 2>/dev/null)" = RUNNING ] || '
    'exit "$rc"; '
    'echo "scalelab: the ranks\' job step ended with exit code $rc; step again ($a of __R__)" >&2; '
    'done')


def rank_commands(engine: str, nodes: list[Node], login: Node, procs_per_node: int,
                  script: str, args: list[str], rt: Runtime, port: int, name: str,
                  partition: str | None, timeout_s: float,
                  gpus_per_node: int = 0, restarts: int = 0,
                  servers: list[Node] | None = None) -> list[commands.RankCommand]:
    """The one command a run is on the login host: srun (DDP, the parameter servers, the
    allreduce probe) or salloc around horovodrun (Horovod). restarts: the run comes back from
    at most that many failures without leaving its allocation (a requeue would give the nodes
    back and wait in the queue again): under DDP salloc starts the ranks' job step again after
    it fails; under Horovod horovodrun's elastic driver starts the node's ranks again.

    >>> rt = Runtime("/v/bin/python", "/w", "/kh")
    >>> ns = [Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local", cpus=1.0, iface="eth0"),
    ...       Node("c-n1", "10.0.0.11", "10.0.0.11", "worker", "local", cpus=1.0, iface="eth0")]
    >>> cmd = rank_commands("ddp", ns, ns[0], 1, "resnet.py", ["--steps", "5"], rt, 29500,
    ...                     "j", "p", 180)[0]
    >>> cmd.node.name, cmd.argv[:2], cmd.argv[-4:]
    ('c-n0', ['srun', '--job-name'], ['/v/bin/python', '/w/bench/workloads/resnet.py', '--steps', '5'])
    >>> cmd.env["MASTER_PORT"], cmd.env["GLOO_SOCKET_IFNAME"], cmd.cancel
    ('29500', 'eth0', 'scancel --name j --full 2>/dev/null; exit 0')
    >>> hv = rank_commands("horovod", ns, ns[0], 1, "resnet.py", [], rt, 29500, "j", "p", 180)[0]
    >>> hv.argv[0], "--ntasks-per-node" in hv.argv, "horovodrun" in hv.argv[-1]
    ('salloc', False, True)
    >>> hv = rank_commands("horovod", ns, ns[0], 1, "resnet.py", [], rt, 29500, "j", "p", 180,
    ...                    restarts=2)[0]
    >>> "--min-np 1 --max-np 2" in hv.argv[-1], "--reset-limit 8" in hv.argv[-1]
    (True, True)
    >>> again = rank_commands("ddp", ns, ns[0], 1, "resnet.py", [], rt, 29500, "j", None, 180,
    ...                       restarts=3)[0].argv
    >>> loop = again[again.index("-c") + 1]
    >>> again[0], '[ "$a" -gt 3 ]' in loop, again[again.index("-c") + 3:][:3]
    ('salloc', True, ['srun', '--nodes', '2'])
    """
    script_path = f"{rt.workdir}/{commands.WORKLOADS}/{script}"
    if engine == "ps":
        return [ps_command(nodes, servers or [], login, procs_per_node, script_path, args,
                           rt.python, port, name, partition, timeout_s)]
    env = commands.rank_env(nodes[0], procs_per_node, ifaces=[n.iface for n in nodes])
    cancel = cancel_line(name)
    if engine == "horovod":
        bindir = rt.python.rsplit("/", 1)[0]
        # the allocation is these nodes (--nodelist): each by its address on the cluster's
        # network, as the ranks then name their host (HOROVOD_HOSTNAME, which a kill's
        # injector reads; a login-only cluster's nodes are their Slurm names)
        hosts = ",".join(f"{n.private_address}:{procs_per_node}" for n in nodes)
        # restarts: horovodrun's elastic driver, inside the allocation, brings a node's ranks
        # back on that node (the allocation keeps it) with the state the others committed
        hvd = [f"{bindir}/horovodrun", "--gloo", "-np", str(len(nodes) * procs_per_node),
               "-H", hosts,
               *commands.horovod_elastic_options(len(nodes), procs_per_node, restarts)]
        if nodes[0].iface and len(nodes) > 1:
            hvd += ["--network-interfaces", nodes[0].iface]
        hvd += ["--disable-cache", "--gloo-timeout-seconds", "60", rt.python, script_path, *args]
        # horovodrun finds the venv's python and itself first; the site's own PATH (Slurm in
        # /opt or from a module) stays behind them
        inner = f'PATH={shlex.quote(bindir)}:"$PATH"; export PATH; exec {shlex.join(hvd)}'
        argv = ["salloc", *alloc_options(name, nodes, procs_per_node, partition, timeout_s,
                                         gpus_per_node, tasks=False),
                "srun", "--nodes", "1", "--ntasks", "1", "sh", "-c", inner]
        return [commands.RankCommand(login, argv, env, cancel=cancel)]
    env["MASTER_PORT"] = str(port)
    ranks = ["--kill-on-bad-exit=1", "--export=ALL", "sh", "-c", _RANK_ENV, "sh", rt.python,
             script_path, *args]
    opts = alloc_options(name, nodes, procs_per_node, partition, timeout_s, gpus_per_node)
    if not restarts:
        return [commands.RankCommand(login, ["srun", *opts, *ranks], env, cancel=cancel)]
    # a step of the allocation: every node, its ranks, past the nodes' CPU count as the
    # allocation is; when one task dies, srun ends the others and exits non-zero
    step = ["srun", "--nodes", str(len(nodes)), "--ntasks-per-node", str(procs_per_node),
            "--overcommit", *ranks]
    argv = ["salloc", *opts, "sh", "-c", _RESTART_LOOP.replace("__R__", str(int(restarts))),
            "sh", *step]
    return [commands.RankCommand(login, argv, env, cancel=cancel)]


def link_probe_command(server: Node, client: Node, login: Node, port: int, seconds: float,
                       name: str, partition: str | None,
                       streams: int = 1) -> commands.RankCommand:
    """iperf3 between two nodes inside one allocation: the server on `server`, the client on
    `client`; stdout carries only the client's JSON document.

    >>> a = Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local")
    >>> b = Node("c-n1", "10.0.0.11", "10.0.0.11", "worker", "local")
    >>> cmd = link_probe_command(b, a, a, 5201, 1.0, "j", None)
    >>> cmd.argv[:2], "iperf3 -s -1 -B 10.0.0.11" in cmd.argv[-1]
    (['srun', '--job-name'], True)
    """
    wait_s = linkprobe.READY_TIMEOUT_S + linkprobe.SERVER_SLACK_S
    srv = shlex.join(linkprobe.server_argv(server.private_address, port, wait_s))
    cli = linkprobe.client_line(server.private_address, port, seconds, streams=streams)
    # Slurm's own name of the node the task runs on (hostname may be an FQDN or another name)
    inner = (f'if [ "$SLURMD_NODENAME" = {shlex.quote(server.name)} ]; then exec {srv} >/dev/null; '
             f"else {cli}; fi")
    nodes = sorted([server, client], key=lambda n: n.name)
    timeout_s = linkprobe.READY_TIMEOUT_S + linkprobe.iperf_seconds(seconds) + \
        linkprobe.LAUNCH_SLACK_S
    argv = ["srun", *alloc_options(name, nodes, 1, partition, timeout_s), "sh", "-c", inner]
    return commands.RankCommand(login, argv, {}, cancel=cancel_line(name))


def measure_link(nodes: list[Node], login: Node, known_hosts: str, port: int, token: str,
                 partition: str | None, seconds: float = 1.0,
                 stop: threading.Event | None = None,
                 streams: int = 1) -> tuple[float | None, str]:
    """TCP rate head -> second node in Mbit/s, measured inside an allocation; why not if not."""
    if len(nodes) < 2:
        return None, ""
    name = job_name(token, "linkprobe")
    cmd = link_probe_command(nodes[1], nodes[0], login, port, seconds, name, partition, streams)
    timeout_s = linkprobe.READY_TIMEOUT_S + linkprobe.iperf_seconds(seconds) + \
        linkprobe.LAUNCH_SLACK_S
    res = launch.run([cmd], Runtime("python3", "/", known_hosts), timeout_s=timeout_s, stop=stop)
    out = res.outcomes[0] if res.outcomes else None
    if out is None or res.status in ("timeout", "interrupted"):
        return None, res.error or "link probe did not run"
    try:
        return round(linkprobe.parse_iperf3(out.stdout), 3), ""
    except linkprobe.LinkProbeError as exc:
        why = launch.rank_reason(out.stderr, out.returncode) if out.returncode else str(exc)
        log.warning("link measurement in job %s failed: %s", name, why)
        return None, f"job {name}: {why}"[:300]


def parse_sacct(text: str, name: str) -> Job | None:
    """The job of that name from `sacct --noheader --parsable2 --allocations --format
    JobID,JobName,State,ExitCode,NodeList,Partition,ElapsedRaw` (the last one listed wins).

    >>> j = parse_sacct("7|x|CANCELLED by 0|0:15|lab-n[0-1]|scalelab|12\\n", "x")
    >>> j.job_id, j.state, j.by, j.exit_code, j.elapsed_s
    ('7', 'CANCELLED', '0', '0:15', 12.0)
    >>> parse_sacct("", "x") is None
    True
    """
    job = None
    for line in text.splitlines():
        cols = line.strip().split("|")
        if len(cols) < 7 or cols[1] != name:
            continue
        state, _, by = cols[2].partition(" by ")
        elapsed = float(cols[6]) if re.fullmatch(r"\d+", cols[6]) else None
        job = Job(name, cols[0], state.strip(), cols[3], cols[4], cols[5], elapsed, by.strip())
    return job


def sacct_line(name: str, wait_s: float = SACCT_WAIT_S, every_s: float = 0.2) -> str:
    """Shell line for the login host: ask sacct every every_s until it lists the job as over
    (slurmctld tells slurmdbd a moment after srun returns), at most wait_s; print the last
    answer. One SSH session for the whole wait.

    >>> line = sacct_line("scalelab-ab12-x", wait_s=2, every_s=0.5)
    >>> "while [ $i -lt 4 ]" in line and "--name scalelab-ab12-x" in line
    True
    """
    if not JOB_NAME.fullmatch(name):
        raise SlurmError(f"job name {name!r} is not one scalelab makes")
    sacct = ("sacct --noheader --parsable2 --allocations --starttime now-7days "
             f"--name {name} --format JobID,JobName,State,ExitCode,NodeList,Partition,ElapsedRaw")
    over = "|".join(f"*'|{s}'*" for s in FINAL)
    tries = max(1, math.ceil(wait_s / every_s))
    return (f"i=0; while [ $i -lt {tries} ]; do out=$({sacct}) || exit $?; "
            f"case \"$out\" in {over}) break;; esac; sleep {every_s:g}; i=$((i+1)); done; "
            "printf '%s\\n' \"$out\"")


def job_state(login: Node, known_hosts: str, name: str, wait_s: float = SACCT_WAIT_S) -> Job:
    """What sacct says of the run's job once it is over; state "" when sacct never listed it
    (or could not be asked: the reason is logged)."""
    try:
        proc = login_run(login, known_hosts, sacct_line(name, wait_s), timeout=wait_s + 30)
    except ClusterError as exc:  # the run is recorded all the same, with what launch saw
        log.warning("sacct could not be asked about job %s: %s", name, exc)
        return Job(name)
    if proc.returncode != 0:
        log.warning("sacct on %s failed for job %s: %s", login.name, name,
                    proc.stderr.strip()[-200:])
    return parse_sacct(proc.stdout, name) or Job(name)


def outcome(job: Job, status: str, error: str, timeout_s: float,
            teardown: bool = False) -> tuple[str, str]:
    """A run's status and error from its job's sacct state and what the launch saw.

    sacct decides: a job COMPLETED is ok only with the workload's result; TIMEOUT is Slurm's
    time limit; CANCELLED by someone else is a failed run that says so. The driver's own
    timeout and a Ctrl-C cancel the job too: those keep their status and name the job.
    teardown: the launch kept the run although a rank failed leaving, after every rank's
    figures were in (launch.whole); the job is FAILED for that rank's exit, and the run ok.

    >>> outcome(Job("j", "5", "COMPLETED", "0:0"), "ok", "", 60)
    ('ok', '')
    >>> outcome(Job("j", "5", "CANCELLED", "0:15", by="0"), "failed", "n0: exit 1: x", 60)
    ('failed', 'Slurm job 5 was cancelled (scancel by uid 0); n0: exit 1: x')
    >>> outcome(Job("j", "5", "CANCELLED", "0:15", by="0"), "timeout", "timed out after 60 s", 60)
    ('timeout', 'timed out after 60 s; Slurm job 5 cancelled')
    >>> outcome(Job("j", "5", "TIMEOUT", "0:0"), "failed", "n0: exit 1", 60)
    ('timeout', 'Slurm job 5 passed its time limit (2 min); n0: exit 1')
    >>> outcome(Job("j", "5", "FAILED", "1:0"), "failed", "n0: exit 1: RuntimeError: boom", 60)
    ('failed', 'Slurm job 5 FAILED (exit 1:0); n0: exit 1: RuntimeError: boom')
    >>> outcome(Job("j"), "failed", "ssh: connect refused", 60)
    ('failed', 'ssh: connect refused; sacct has no record of job j')
    >>> outcome(Job("j", "5", "RUNNING", "0:0"), "ok", "", 60)  # slurmdbd behind: launch stands
    ('ok', '')
    >>> outcome(Job("j", "5", "FAILED", "0:6"), "ok", "", 60, teardown=True)
    ('ok', '')
    """
    ident = f"Slurm job {job.job_id}" if job.job_id else f"Slurm job {job.name}"
    if status in ("timeout", "interrupted"):
        return status, f"{error}; {ident} cancelled" if job.job_id else error
    if job.state not in FINAL:  # never listed, or slurmdbd still behind after the wait
        note = (f"sacct has no record of job {job.name}" if not job.state else
                f"sacct still listed {ident} as {job.state} after {SACCT_WAIT_S:g} s")
        return ("failed", f"{error}; {note}" if error else note) if status != "ok" else \
            ("ok", "")
    if job.state == "COMPLETED" or (job.state == "FAILED" and status == "ok" and teardown):
        return status, error
    if job.state == "TIMEOUT":
        why = f"{ident} passed its time limit ({time_limit_min(timeout_s)} min)"
        return "timeout", f"{why}; {error}" if error else why
    if job.state == "CANCELLED":
        who = f" by uid {job.by}" if job.by else ""
        why = f"{ident} was cancelled (scancel{who})"
    else:
        why = f"{ident} {job.state} (exit {job.exit_code})"
    return "failed", f"{why}; {error}" if error and status != "ok" else why


PLACE_SAYS = "scalelab-place "  # how a node of place_problem_by_job's job starts its answer


def place_problem_by_job(login: Node, nodes: list[Node], known_hosts: str, place: str,
                         partition: str | None, token: str, by_job: bool = True,
                         wait_s: float = 300.0) -> tuple[str, str] | None:
    """checkpoints.place_problem for a cluster reached only through its Slurm login host:
    (who, why) or None. The login host (which removes a run's checkpoints there) makes a
    directory in place, and one short job of the nodes, a task and a CPU on each, writes in it
    (by_job False, for a dry run: no job, the login host's side only); the login host removes
    the directory again, and cancels the job should it still be queued, also on a failure.
    A job not done within wait_s is cancelled, and the place said unchecked."""
    probe = checkpoints.Probe.of(place)
    if probe is None or not nodes:
        return f"login host {login.name}", f"{place!r} is not a plain absolute path"
    made = login_run(login, known_hosts, probe.make(), timeout=60)
    if made.returncode != 0:
        return f"login host {login.name}", checkpoints.said(made)
    name = job_name(token, "checkpoint-place")
    try:
        if not by_job:
            return None
        task = "n=$SLURMD_NODENAME; " + probe.write('"$n"', "the login host", PLACE_SAYS + "$n: ")
        job = shlex.join(["srun", *alloc_options(name, nodes, 1, partition, wait_s, whole=False),
                          "--quiet", "sh", "-c", task])
        proc = login_run(login, known_hosts, f"timeout {int(wait_s)} {job}",
                         timeout=wait_s + 30)
        if proc.returncode == 0:
            return None
        told = [x[len(PLACE_SAYS):] for x in proc.stdout.splitlines() if x.startswith(PLACE_SAYS)]
        if told:
            node, _, why = told[0].partition(": ")
            return f"node {node}", why
        return f"login host {login.name}", (
            f"it could not be checked: the job that checks the nodes was not done within "
            f"{wait_s:g} s (a busy partition?)" if proc.returncode == 124 else
            f"the job that checks the nodes failed: {checkpoints.said(proc)}")
    finally:
        login_run(login, known_hosts, f"{probe.remove()}; scancel --name {name} 2>/dev/null; "
                  "true", timeout=60)
