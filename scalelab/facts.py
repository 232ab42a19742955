"""Node facts: what each node has (interface, cores, memory, GPUs, training stack), found over SSH.

configure probes every node before Ansible runs (so a host whose cluster interface cannot be
found is refused before anything is changed on it) and again afterwards, and records the
facts in cluster.json. bench and the report read them from there: threads per rank, GPU
estimates, which interface to shape, where the interpreter and the workloads are.
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from typing import Any

from scalelab import inventory, ssh
from scalelab.errors import ClusterError
from scalelab.nodes import Node, nodes_of
from scalelab.state import load_cluster, save_cluster

log = logging.getLogger(__name__)

# Where configure puts the training stack on every node (playbooks/group_vars/all.yml).
DEFAULT_PYTHON = "/opt/scalelab/venv/bin/python"
DEFAULT_WORKDIR = "/opt/scalelab"


def probe_script(address: str, python: str, workdir: str) -> str:
    """POSIX sh that prints one key=value per line; it only reads, never changes anything.

    >>> "ip -j -4 addr show to 10.0.0.5/32" in probe_script("10.0.0.5", "/v/bin/python", "/w")
    True
    """
    py, wd = shlex.quote(python), shlex.quote(workdir)
    return "; ".join([
        "echo cores=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)",
        "echo memory_kb=$(awk '/^MemTotal:/{print $2}' /proc/meminfo)",
        f"echo addr_json=$(ip -j -4 addr show to {address}/32 2>/dev/null)",
        "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --query-gpu=name,"
        "memory.total --format=csv,noheader,nounits 2>/dev/null | sed 's/^/gpu=/'; fi",
        f"if [ -x {py} ]; then echo torch=$({py} -c 'import torch; print(torch.__version__)' "
        "2>/dev/null); fi",
        f"if [ -f {wd}/bench/workloads/resnet.py ]; then echo workloads=1; fi",
        "echo kernel=$(uname -r)",
        "true",
    ])


def parse_probe(text: str, python: str, workdir: str) -> dict[str, Any]:
    """The facts from probe_script's output.

    >>> out = ('cores=16\\nmemory_kb=263842772\\naddr_json=[{"ifname":"ens5","addr_info":[]}]\\n'
    ...        'gpu=NVIDIA A100-SXM4-40GB, 40960\\ngpu=NVIDIA A100-SXM4-40GB, 40960\\n'
    ...        'torch=2.13.0\\nworkloads=1\\nkernel=6.1.0\\n')
    >>> f = parse_probe(out, "/opt/v/bin/python", "/opt/w")
    >>> f["cores"], f["memory_mb"], f["iface"], f["gpus"], f["gpu_model"], f["gpu_memory_mb"]
    (16, 257658, 'ens5', 2, 'NVIDIA A100-SXM4-40GB', 40960)
    >>> f["python"], f["workdir"], f["torch"]
    ('/opt/v/bin/python', '/opt/w', '2.13.0')
    >>> bare = parse_probe("cores=2\\naddr_json=[]\\n", "/p", "/w")
    >>> bare["iface"], bare["python"]
    ('', '')
    """
    kv: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            kv.setdefault(key.strip(), []).append(value.strip())

    def first(key: str) -> str:
        return (kv.get(key) or [""])[0]

    iface = ""
    try:
        addrs = json.loads(first("addr_json") or "[]")
        if addrs:
            iface = str(addrs[0].get("ifname", ""))
    except ValueError:
        pass
    gpus = [g.rsplit(",", 1) for g in kv.get("gpu", []) if g]
    torch_version = first("torch")
    return {
        "cores": int(first("cores") or 0),
        "memory_mb": int(first("memory_kb") or 0) // 1024,
        "iface": iface,
        "gpus": len(gpus),
        "gpu_model": gpus[0][0].strip() if gpus else "",
        "gpu_memory_mb": int(float(gpus[0][1])) if gpus and len(gpus[0]) > 1 else 0,
        "torch": torch_version,
        "python": python if torch_version else "",
        "workdir": workdir if first("workloads") == "1" else "",
        "kernel": first("kernel"),
    }


def probe(nodes: list[Node], known_hosts: str, python: str = DEFAULT_PYTHON,
          workdir: str = DEFAULT_WORKDIR, timeout_s: float = 60.0) -> dict[str, dict[str, Any]]:
    """Probe every node in parallel; ClusterError naming the first node that cannot be reached."""
    out, errors = ssh.on_each(nodes, lambda n: parse_probe(ssh.run(
        n, known_hosts, probe_script(n.private_address, python, workdir),
        timeout=timeout_s).stdout, python, workdir), timeout_s + 10)
    bad = ssh.first_error(nodes, errors)
    if bad:
        raise ClusterError(f"cannot read the facts of node {bad[0]}: {bad[1]}; check it with "
                           "invoke check")
    return out


def check_interfaces(cluster: str, nodes: list[Node], facts: dict[str, dict[str, Any]]) -> None:
    """Refuse a node none of whose interfaces holds its cluster (private) address."""
    for n in nodes:
        if not facts[n.name]["iface"]:
            raise ClusterError(
                f"node {n.name}: no interface holds its cluster address {n.private_address}; "
                f"set that host's private_address to an address it has (ip -4 addr on the "
                f"host lists them), then provision cluster {cluster} again")


def record(cluster: str, facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Write the facts into cluster.json, corrected by the target; returns the new record."""
    from scalelab.targets import base

    rec = load_cluster(cluster)
    target = base.of(rec)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for node in rec["nodes"]:
        found = facts.get(node["name"])
        if found is None:
            continue
        f = target.adjust_facts(rec, node, {**found, "gathered_at": now})
        node["facts"] = f
        node["iface"] = f["iface"]
        node["cpus"] = float(f["cores"])
        node["gpus"] = int(f["gpus"])
    rec["configured_at"] = now
    save_cluster(cluster, rec)
    # the inventory's scalelab_iface / scalelab_cpus / scalelab_gpus follow the facts
    inventory.write(cluster, nodes_of(rec),
                    known_hosts=rec.get("known_hosts"), bastion=rec.get("bastion"))
    return rec


def require_configured(rec: dict[str, Any]) -> None:
    """Refuse a cluster whose nodes have no recorded facts, naming the command that records them.

    >>> require_configured({"name": "lab", "nodes": [{"name": "a", "facts": {"cores": 4}}]})
    >>> require_configured({"name": "lab", "nodes": [{"name": "a"}]})
    Traceback (most recent call last):
    ...
    scalelab.errors.ClusterError: cluster lab has not been configured (no facts recorded for node a); run invoke configure --cluster lab
    """
    for n in rec.get("nodes", []):
        if not n.get("facts"):
            raise ClusterError(f"cluster {rec.get('name')} has not been configured (no facts "
                               f"recorded for node {n['name']}); run invoke configure --cluster "
                               f"{rec.get('name')}")
