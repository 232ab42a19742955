"""GPU nodes measured for what they are: the device, fabric and processes per node a sweep's
runs use, decided from the nodes' facts before any run, and one-line refusals where a node
cannot do what the sweep asks.

configure records per node what nvidia-smi counts (``gpus``, ``gpu_list``), what the node's
torch and Horovod can do (``torch_can``, ``horovod_can``) and its RDMA ports (``rdma``);
scalelab.cluster.facts has the probe. A node configured before these facts existed has none of them:
then nothing is refused on their account (the workload still refuses a missing GPU itself).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from scalelab.cluster.nodes import Node
from scalelab.core.errors import InputError

log = logging.getLogger(__name__)

DEVICES = ("auto", "cuda", "cpu")
FABRICS = ("auto", "tcp", "rdma")
FIX_STACK = ("configure it with a CUDA build of torch (docs/gpu-clusters.md), or run on its "
             "CPUs with --device cpu")


@dataclass(frozen=True)
class Placement:
    """What every run of a sweep runs on: device (cuda|cpu), fabric (tcp|rdma), and the
    processes per node to sweep."""

    device: str
    fabric: str
    procs_per_node: list[int]


def torch_can(node: Node) -> dict[str, Any]:
    """The node's torch abilities from configure ({} when not recorded)."""
    return dict((node.facts or {}).get("torch_can") or {})


def visible_gpus(node: Node) -> int | None:
    """GPUs the node's torch sees (CUDA_VISIBLE_DEVICES and MIG applied); None: not recorded."""
    can = torch_can(node)
    if "cuda_available" not in can:
        return None
    return int(can.get("devices") or 0) if can["cuda_available"] else 0


def rdma_ports(node: Node) -> list[dict[str, Any]]:
    """The node's active RDMA ports (InfiniBand, RoCE, iWARP) from configure's facts."""
    return [p for p in (node.facts or {}).get("rdma") or [] if p.get("active")]


def _stack_refusal(node: Node) -> str | None:
    """Why a node with GPUs cannot train on them, or None when it can (or nobody knows)."""
    can = torch_can(node)
    if not can or can.get("cuda_available"):
        return None
    version = can.get("version") or "?"
    if not can.get("cuda"):
        return (f"node {node.name} has {node.gpus} GPU{'s' if node.gpus != 1 else ''} "
                f"(nvidia-smi) but its torch {version} is a CPU build; {FIX_STACK}")
    driver = (node.facts or {}).get("cuda_driver") or "?"
    return (f"node {node.name} has {node.gpus} GPU{'s' if node.gpus != 1 else ''} (nvidia-smi) "
            f"but its torch {version} (CUDA {can['cuda']}) cannot use them: the driver "
            f"supports CUDA {driver}, or CUDA_VISIBLE_DEVICES hides them; install a torch "
            f"built for CUDA {driver} or older, or update the driver")


def resolve(spec: Any, used: list[Node], shaped: bool) -> Placement:
    """Device, fabric and procs per node for a sweep on these nodes; InputError (one line,
    naming the node and the fix) where a node cannot do what the sweep asks.

    >>> gpu = {"torch_can": {"version": "2.13.0+cu128", "cuda": "12.8", "cuda_available": True,
    ...        "devices": 8}, "horovod_can": {"nccl": True}, "rdma": []}
    >>> nodes = [Node(f"g{i}", "a", "a", "head", "static", gpus=8, facts=gpu) for i in range(2)]
    >>> class S: device = "auto"; fabric = "auto"; procs_per_node = None; engine = "ddp"; accelerator = None
    >>> resolve(S, nodes, shaped=True)
    Placement(device='cuda', fabric='tcp', procs_per_node=[8])
    """
    ppn_given = list(spec.procs_per_node) if spec.procs_per_node else None
    if spec.accelerator:
        # emulated devices: the ranks wait on the host as the profile says; tcp over veth
        _refuse_fabric(spec.fabric, used, shaped, "cpu")
        return Placement("cpu", "tcp", ppn_given or [1])
    with_gpus = [n for n in used if n.gpus > 0]
    device = spec.device if spec.device != "auto" else ("cuda" if with_gpus else "cpu")
    if device == "cuda":
        for n in used:
            if n.gpus <= 0 and visible_gpus(n) in (None, 0):
                asked = "--device cuda" if spec.device == "cuda" else \
                    "the runs train on GPUs (other nodes have them)"
                raise InputError(f"{asked} but node {n.name} has no GPU (nvidia-smi finds "
                                 f"none); use --device cpu, or nodes that all have GPUs")
            why = _stack_refusal(n)
            if why:
                raise InputError(why)
        ppn = ppn_given or [min(_gpus_torch_sees(n) for n in used)]
        for n in used:
            seen = _gpus_torch_sees(n)
            if max(ppn) > seen and visible_gpus(n) is None:
                raise InputError(f"--procs-per-node {max(ppn)} but node {n.name} has {seen} GPU"
                                 f"{'s' if seen != 1 else ''}; use --procs-per-node "
                                 f"{'1-' if seen > 1 else ''}{seen}")
            if max(ppn) > seen:
                raise InputError(
                    f"--procs-per-node {max(ppn)} but torch sees {seen} GPU"
                    f"{'s' if seen != 1 else ''} on node {n.name} (nvidia-smi counts {n.gpus}; "
                    f"CUDA_VISIBLE_DEVICES or MIG hide the rest); use --procs-per-node at "
                    f"most {seen}")
        if spec.engine == "horovod":
            for n in used:
                hvd = (n.facts or {}).get("horovod_can")
                if isinstance(hvd, dict) and not hvd.get("nccl"):
                    raise InputError(
                        f"--engine horovod on GPUs but node {n.name}'s Horovod "
                        f"{hvd.get('version') or ''} was built without NCCL operations (it "
                        "would reduce CUDA tensors through host memory); rebuild it with "
                        "invoke configure --tags horovod (HOROVOD_GPU_OPERATIONS=NCCL)")
    else:  # only asked for outright: auto is cuda wherever a node has GPUs
        if with_gpus:
            log.warning("--device cpu on nodes with GPUs (%s): the runs measure their CPUs",
                        ", ".join(n.name for n in with_gpus))
        ppn = ppn_given or [1]
    return Placement(device, _refuse_fabric(spec.fabric, used, shaped, device), ppn)


def _gpus_torch_sees(node: Node) -> int:
    seen = visible_gpus(node)
    return node.gpus if seen is None else seen


def _refuse_fabric(fabric: str, used: list[Node], shaped: bool, device: str) -> str:
    """The fabric the runs use: tcp whenever a rate is shaped (tc shapes the IP interface,
    which RDMA bypasses); rdma only where every node has an active RDMA port."""
    if fabric == "rdma":
        if shaped:
            raise InputError("--fabric rdma with a shaped --bandwidth: tc shapes the IP "
                             "interface and RDMA bypasses it, so the rate would not apply; "
                             "use --fabric tcp, or --bandwidth native")
        if device != "cuda":
            raise InputError("--fabric rdma needs --device cuda (NCCL); Gloo runs over TCP")
        lacking = [n.name for n in used if not rdma_ports(n)]
        if lacking:
            raise InputError(f"--fabric rdma but node {lacking[0]} has no active RDMA port "
                             "(/sys/class/infiniband); use --fabric tcp")
        return "rdma"
    if fabric == "auto" and not shaped and device == "cuda" and used \
            and all(rdma_ports(n) for n in used):
        return "rdma"
    return "tcp"


def fabric_env(fabric: str, device: str, ifaces: list[str]) -> dict[str, str]:
    """The transport settings every rank gets: the collective stays on the cluster interface
    (the shaped one) unless the fabric is rdma; NCCL logs its transport for the record.

    ifaces: the cluster interface of every node the env reaches (horovodrun gives one env to
    all its ranks; NCCL and Gloo take a comma-separated list).

    >>> fabric_env("tcp", "cuda", ["eth0", "ens5"])["NCCL_IB_DISABLE"]
    '1'
    >>> fabric_env("tcp", "cuda", ["eth0", "ens5", "eth0"])["NCCL_SOCKET_IFNAME"]
    'eth0,ens5'
    >>> sorted(fabric_env("tcp", "cpu", ["eth0"]))
    ['GLOO_SOCKET_IFNAME', 'NCCL_IB_DISABLE', 'NCCL_NET', 'NCCL_SOCKET_IFNAME']
    """
    names = ",".join(dict.fromkeys(i for i in ifaces if i))
    env: dict[str, str] = {}
    if names:
        env["GLOO_SOCKET_IFNAME"] = names
        env["NCCL_SOCKET_IFNAME"] = names  # NCCL's own bootstrap and its socket transport
    if fabric == "rdma":
        env["NCCL_IB_DISABLE"] = "0"
    else:
        env["NCCL_IB_DISABLE"] = "1"
        env["NCCL_NET"] = "Socket"
    if device == "cuda":
        # INIT and NET name the network NCCL chose; the record reads it from the ranks' stderr
        env["NCCL_DEBUG"] = "INFO"
        env["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    return env


_USING = re.compile(r"NCCL INFO Using network (?P<net>\w+)")
_IB_PORT = re.compile(r"NET/IB ?: Using \[\d+\][\w.-]+:\d+/(?P<layer>IB|RoCE)")
_VIA = re.compile(r"via (?P<via>P2P/\w+|SHM|NET/\w+)")


def transport(stderr: str, backend: str) -> str:
    """The transport a run's collectives used: from NCCL's own log (NCCL_DEBUG=INFO) for
    NCCL, tcp for Gloo (and MPI, which scalelab starts over TCP only).

    >>> log = ("h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:10.0.0.1<0>\\n"
    ...        "h:1:1 [0] NCCL INFO Using network IB\\n"
    ...        "h:1:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\\n")
    >>> transport(log, "nccl")
    'nccl-roce+p2p'
    >>> transport("h:1:1 [0] NCCL INFO Using network Socket\\n", "horovod-nccl")
    'nccl-socket'
    >>> transport("", "gloo"), transport("", "nccl")
    ('gloo-tcp', 'nccl-unknown')
    """
    if "nccl" not in backend:
        return "gloo-tcp" if "gloo" in backend else f"{backend}-tcp"
    net = None
    m = _USING.search(stderr)
    if m:
        net = m.group("net").lower()
        if net == "ib":
            layer = _IB_PORT.search(stderr)
            net = "roce" if layer and layer.group("layer") == "RoCE" else "ib"
    vias = {v.group("via").split("/")[0].lower() for v in _VIA.finditer(stderr)}
    local = "+" + "+".join(sorted(vias - {"net"})) if vias - {"net"} else ""
    return f"nccl-{net or ('intranode' if local else 'unknown')}{local}"
