"""What a run's ranks run: the workload's arguments, each rank's environment, the launcher
(torchrun, horovodrun, hvdrank in containers, or the ranks directly) and the shell line sent
over SSH, which starts a new session carrying the launch's token."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from scalelab.cluster import gpu, ssh
from scalelab.cluster.nodes import Node
from scalelab.cluster.targets.interface import Runtime
from scalelab.model.comm import COMM_DEFAULTS, COMM_KEYS
from scalelab.run import checkpoints
from scalelab.run.reap import TOKEN_VAR
from scalelab.sweep import values
from scalelab.sweep.starts import starts_directly

WORKLOADS = "bench/workloads"
MAX_RESTARTS = 3  # how often torchrun's agent restarts a run's ranks (--inject-failure)


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
    # the command is this node's rank (started directly) or its torchrun: it gets an error file
    # of the node's own (reap.error_file), which nothing passes on to another node's ranks
    # (horovodrun and srun would: their commands carry none)
    error_file: bool = False


def workload_args(params: dict[str, Any], profile: str | None = None,
                  decode_cost_s: float | None = None,
                  checkpoint_dir: str | None = None) -> list[str]:
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
    if params.get("engine") == "ps" and params.get("ps_overlap") == "off":
        args += ["--ps-overlap", "off"]
    if params.get("checkpoint_every") and checkpoint_dir:  # checkpoints.run_dir
        args += ["--checkpoint-every", str(int(params["checkpoint_every"])),
                 "--checkpoint-mode", str(params.get("checkpoint_mode") or "sync"),
                 "--checkpoint-place", "shared" if checkpoints.shared(params) else "nodes",
                 "--checkpoint-dir", checkpoint_dir]
    if values.failure(params.get("inject_failure")):  # what the injector waits for
        args += ["--report-steps", "--restartable"]
    if profile:
        args += ["--profile", profile, "--dilation", f"{float(params.get('dilation') or 1):g}"]
        if decode_cost_s:  # real data on an emulated device: the decode it charges an image
            args += ["--decode-cost-s", f"{decode_cost_s:.6g}"]
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
        out.append(RankCommand(n, argv, rank_env(n, procs_per_node, fabric, device),
                               error_file=True))
    return out


def elastic_commands(nodes: list[Node], procs_per_node: int, script: str, args: list[str],
                     rt: Runtime, port: int, run_id: str, fabric: str = "tcp",
                     device: str = "cpu", restarts: int = MAX_RESTARTS) -> list[RankCommand]:
    """One torchrun per node that restarts its ranks after a failure: the c10d rendezvous at
    the head's cluster address (the first node's agent serves it), so that when one node's
    ranks fail and its agent restarts them, every other agent restarts its own too, and all
    meet again; at most `restarts` times. Rank numbers follow the order the agents join in.
    The agents do not share one store across rounds (TORCH_DISABLE_SHARE_RDZV_TCP_STORE):
    shared, a restarted rank could read the address a killed rank had published in the round
    before, and fail to connect to it (seen here in about one restart in four).

    >>> rt = Runtime("/v/bin/python", "/w", "/kh")
    >>> ns = [Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local", cpus=1.0, iface="eth0")]
    >>> " ".join(elastic_commands(ns, 1, "resnet.py", [], rt, 29500, "r1")[0].argv[3:])
    ... # doctest: +NORMALIZE_WHITESPACE
    '--nnodes 1 --nproc-per-node 1 --max-restarts 3 --monitor-interval 0.1 --rdzv-backend c10d
     --rdzv-endpoint 10.0.0.10:29500 --rdzv-id r1 /w/bench/workloads/resnet.py'
    >>> elastic_commands(ns, 1, "resnet.py", [], rt, 29500, "r1")[0].env[
    ...     "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]
    '1'
    """
    head = nodes[0].private_address
    out = []
    for n in nodes:
        argv = [rt.python, "-m", "torch.distributed.run", "--nnodes", str(len(nodes)),
                "--nproc-per-node", str(procs_per_node), "--max-restarts", str(restarts),
                "--monitor-interval", "0.1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{head}:{port}", "--rdzv-id", run_id,
                f"{rt.workdir}/{WORKLOADS}/{script}", *args]
        env = {**rank_env(n, procs_per_node, fabric, device),
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        out.append(RankCommand(n, argv, env, error_file=True))
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
        out.append(RankCommand(n, [rt.python, *argv], env, error_file=True))
    return out


def rank_commands(engine: str, nodes: list[Node], procs_per_node: int, script: str,
                  args: list[str], rt: Runtime, port: int, shared_host: bool = False,
                  warm: str | None = None, fabric: str = "tcp",
                  device: str = "cpu", in_container: bool = False,
                  servers: list[Node] | None = None,
                  restart_id: str | None = None,
                  restarts: int = MAX_RESTARTS) -> tuple[str, list[RankCommand]]:
    """The launcher for a run and its commands: horovodrun for Horovod (hvdrank.py per node
    where the ranks run in containers); torchrun for the parameter-server engine (servers:
    its dedicated server nodes, none where they are colocated); for DDP and the allreduce
    probe torchrun, or, where the nodes share one host's cores and run one process each, the
    ranks directly (direct_commands says why), forked from the warm-start server when there
    is one. restart_id: the ranks restart after a failure, at most `restarts` times: DDP's
    under torchrun's agents (elastic_commands, this the rendezvous's id), Horovod's under its
    elastic driver (horovodrun_commands)."""
    if engine == "ddp" and restart_id:
        return "torchrun", elastic_commands(nodes, procs_per_node, script, args, rt, port,
                                            restart_id, fabric, device, restarts)
    if engine == "ps":
        return "torchrun", ps_commands(nodes, servers or [], procs_per_node, script, args, rt,
                                       port, fabric, device)
    if engine == "horovod" and in_container:
        return "hvdrank", horovod_node_commands(nodes, procs_per_node, script, args, rt, port,
                                                fabric, device)
    if engine == "horovod":
        return "horovodrun", horovodrun_commands(nodes, procs_per_node, script, args, rt, port,
                                                 fabric, device, restarts if restart_id else 0)
    if starts_directly(engine, procs_per_node, shared_host):
        return ("warm" if warm else "direct"), direct_commands(nodes, script, args, rt, port,
                                                               warm, fabric, device)
    return "torchrun", torchrun_commands(nodes, procs_per_node, script, args, rt, port, fabric,
                                         device)


def ps_layout(workers: list[Node], servers: list[Node],
              procs_per_node: int) -> list[tuple[Node, int, int]]:
    """Where a parameter-server run's processes go, the workers' nodes first: (node, its
    processes, how many of the last of them serve). A worker node runs its ranks and, with
    no server nodes (colocated), one server after them; a server node runs one server.

    >>> ns = [Node(f"c-n{i}", "a", "a", "worker", "local") for i in range(3)]
    >>> [(n.name, procs, serves) for n, procs, serves in ps_layout(ns[:2], ns[2:], 1)]
    [('c-n0', 1, 0), ('c-n1', 1, 0), ('c-n2', 1, 1)]
    >>> [(procs, serves) for _, procs, serves in ps_layout(ns[:2], [], 2)]
    [(3, 1), (3, 1)]
    """
    colocated = 0 if servers else 1
    return ([(n, procs_per_node + colocated, colocated) for n in workers]
            + [(n, 1, 1) for n in servers])


def ps_commands(workers: list[Node], servers: list[Node], procs_per_node: int, script: str,
                args: list[str], rt: Runtime, port: int, fabric: str = "tcp",
                device: str = "cpu") -> list[RankCommand]:
    """The parameter-server engine's torchrun on every node: a worker node runs its ranks and,
    with no server nodes (colocated), one server process after them; a server node runs one
    server. resnet.py takes the last --ps-servers-here processes of a node as servers, and
    torchrun numbers nodes in this order, so the workers hold the first ranks.

    >>> rt = Runtime("/v/bin/python", "/w", "/kh")
    >>> ns = [Node(f"c-n{i}", f"10.0.0.1{i}", f"10.0.0.1{i}", "worker", "local", cpus=1.0,
    ...            iface="eth0") for i in range(3)]
    >>> [" ".join(c.argv[3:9] + c.argv[-2:]) for c in ps_commands(ns[:2], ns[2:], 1, "r.py",
    ...                                                           [], rt, 29500)]
    ... # doctest: +NORMALIZE_WHITESPACE
    ['--nnodes 3 --nproc-per-node 1 --node-rank 0 --ps-servers-here 0',
     '--nnodes 3 --nproc-per-node 1 --node-rank 1 --ps-servers-here 0',
     '--nnodes 3 --nproc-per-node 1 --node-rank 2 --ps-servers-here 1']
    >>> [" ".join(c.argv[6:7] + c.argv[-1:]) for c in ps_commands(ns[:2], [], 2, "r.py", [], rt,
    ...                                                          29500)]
    ['3 1', '3 1']
    """
    layout = ps_layout(workers, servers, procs_per_node)
    head = workers[0].private_address
    out = []
    for i, (n, procs, serves) in enumerate(layout):
        argv = [rt.python, "-m", "torch.distributed.run", "--nnodes", str(len(layout)),
                "--nproc-per-node", str(procs), "--node-rank", str(i),
                "--master-addr", head, "--master-port", str(port),
                f"{rt.workdir}/{WORKLOADS}/{script}", *args, "--ps-servers-here", str(serves)]
        out.append(RankCommand(n, argv, rank_env(n, procs, fabric, device), error_file=True))
    return out


def horovod_elastic_options(nodes: int, procs_per_node: int, restarts: int) -> list[str]:
    """horovodrun's options for a run that comes back from at most `restarts` failures
    through its elastic driver (none where restarts is 0): it goes on without the failed node
    (--min-np, a node fewer) and takes it back once its blacklisting cools down, after 2 s.
    Each failure is two of the driver's resets, or more where the ranks must ask again for
    the node (hvdelastic.NOTICE_S): 4 a failure.

    >>> " ".join(horovod_elastic_options(2, 1, 3))
    '--min-np 1 --max-np 2 --blacklist-cooldown-range 1 2 --reset-limit 12 --elastic-timeout 120'
    >>> horovod_elastic_options(2, 1, 0)
    []
    """
    if not restarts:
        return []
    return ["--min-np", str((nodes - 1) * procs_per_node), "--max-np",
            str(nodes * procs_per_node), "--blacklist-cooldown-range", "1", "2",
            "--reset-limit", str(4 * restarts), "--elastic-timeout", "120"]


def horovodrun_commands(nodes: list[Node], procs_per_node: int, script: str, args: list[str],
                        rt: Runtime, port: int, fabric: str = "tcp",
                        device: str = "cpu", restarts: int = 0) -> list[RankCommand]:
    """horovodrun on the head node; it starts the other ranks itself over SSH (gloo), with
    the `ssh` of scalelab.cluster.ssh.with_pinned_ssh first on its PATH: horovodrun's own
    options turn host-key checking off, that `ssh` checks the keys the nodes have pinned.
    restarts: the run comes back from a failure through Horovod's elastic driver, at most
    that many times (horovod_elastic_options); the ranks train at the full size only
    (bench/workloads/hvdelastic.py).

    >>> rt = Runtime("/v/bin/python", "/w", "/kh")
    >>> ns = [Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local", cpus=1.0, iface="eth0"),
    ...       Node("c-n1", "10.0.0.11", "10.0.0.11", "worker", "local", cpus=1.0, iface="eth0")]
    >>> argv = horovodrun_commands(ns, 1, "resnet.py", [], rt, 29500)[0].argv
    >>> argv[:2], argv[3], " ".join(argv[4:])
    (['sh', '-c'], 'scalelab-pinned-ssh', '/v/bin/horovodrun --gloo -np 2 -H 10.0.0.10:1,10.0.0.11:1 --network-interfaces eth0 --disable-cache --gloo-timeout-seconds 60 /v/bin/python /w/bench/workloads/resnet.py')
    >>> " ".join(horovodrun_commands(ns, 1, "r.py", [], rt, 29500, restarts=3)[0].argv[10:21])
    '--min-np 1 --max-np 2 --blacklist-cooldown-range 1 2 --reset-limit 12 --elastic-timeout 120'
    """
    hosts = ",".join(f"{n.private_address}:{procs_per_node}" for n in nodes)
    bindir = rt.python.rsplit("/", 1)[0]
    argv = [f"{bindir}/horovodrun", "--gloo", "-np", str(len(nodes) * procs_per_node),
            "-H", hosts, *horovod_elastic_options(len(nodes), procs_per_node, restarts)]
    ifaces = list(dict.fromkeys(n.iface for n in nodes if n.iface))
    if ifaces and len(nodes) > 1:
        # one node: horovodrun runs everything over loopback and refuses a named interface;
        # several: every node's own name, since its ranks all get this one environment
        argv += ["--network-interfaces", ",".join(ifaces)]
    # --disable-cache: no ~/.horovod of its host checks left in the login user's home
    argv += ["--disable-cache", "--gloo-timeout-seconds", "60", rt.python,
             f"{rt.workdir}/{WORKLOADS}/{script}", *args]
    env = rank_env(nodes[0], procs_per_node, fabric, device, [n.iface for n in nodes])
    env["PATH"] = f"{bindir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return [RankCommand(nodes[0], ssh.with_pinned_ssh(argv), env)]


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


RUN_TMP = "tmp"  # under the workdir: the ranks' TMPDIR where it exists (workloads role)


def remote_line(cmd: RankCommand, workdir: str) -> str:
    """The shell line sent over SSH: a new session that reports its process-group id first.

    The launch token goes into the environment before the session starts, so every process
    of the launch carries it from its first instruction: a driver killed right after the
    launch can still find and end them by the token alone (reap_line).

    The ranks' temporary files (torchrun's logs, torch's compile cache) go to the workdir's
    tmp/ where configure made one (the workloads role, on hosts scalelab did not create), so
    that what runs leave stays inside what destroy keeps on purpose, not in the host's /tmp.

    >>> remote_line(RankCommand(Node("n", "a", "a", "head", "static"), ["python3", "x.py"],
    ...             {"SCALELAB_LAUNCH": "ab12", "OMP_NUM_THREADS": "4"}), "/w")
    "cd /w && { [ -d tmp ] && [ -w tmp ] && export TMPDIR=/w/tmp; true; } && exec env SCALELAB_LAUNCH=ab12 setsid -w sh -c 'echo SCALELAB_PGID $$ >&2; exec env OMP_NUM_THREADS=4 python3 x.py'"
    """
    token = cmd.env.get(TOKEN_VAR, "")
    rest = {k: v for k, v in cmd.env.items() if k != TOKEN_VAR}
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(rest.items()))
    inner = f"echo SCALELAB_PGID $$ >&2; exec env {env} {shlex.join(cmd.argv)}" if env else \
        f"echo SCALELAB_PGID $$ >&2; exec {shlex.join(cmd.argv)}"
    tag = f"env {TOKEN_VAR}={shlex.quote(token)} " if token else ""
    tmp = shlex.quote(f"{workdir.rstrip('/')}/{RUN_TMP}")
    keep_tmp = f"{{ [ -d {RUN_TMP} ] && [ -w {RUN_TMP} ] && export TMPDIR={tmp}; true; }}"
    return (f"cd {shlex.quote(workdir)} && {keep_tmp} && exec {tag}setsid -w sh -c "
            f"{shlex.quote(inner)}")
