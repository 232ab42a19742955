"""Node facts: what each node has (interface, cores, memory, GPUs, training stack), found over SSH.

configure probes every node before Ansible runs (so a host whose cluster interface cannot be
found is refused before anything is changed on it) and again afterwards, and records the
facts in cluster.json. bench and the report read them from there: threads per rank, GPU
estimates, which interface to shape, where the interpreter and the workloads are.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import time
from typing import Any

from scalelab.cluster import image, inventory, ssh, targets
from scalelab.cluster.nodes import Node, nodes_of
from scalelab.core.errors import ClusterError
from scalelab.core.state import load_cluster, save_cluster

log = logging.getLogger(__name__)

# Where configure puts the training stack on every node (playbooks/group_vars/all.yml).
DEFAULT_PYTHON = "/opt/scalelab/venv/bin/python"
DEFAULT_WORKDIR = "/opt/scalelab"


# What the node's torch and Horovod can do, as JSON on one line, from one interpreter (nothing
# runs on a GPU beyond CUDA's own initialisation). Horovod's flags are the ones horovodrun
# --check-build prints, read from the same functions.
_STACK_CAN = (
    "import json, torch\n"
    "c = torch.cuda.is_available()\n"
    "n = '.'.join(map(str, torch.cuda.nccl.version())) if c else None\n"
    "out = {'version': torch.__version__, 'cuda': torch.version.cuda, 'cuda_available': c, "
    "'devices': torch.cuda.device_count() if c else 0, 'nccl': n, 'horovod': None}\n"
    "try:\n"
    "    import horovod, horovod.torch as h\n"
    "    out['horovod'] = {'version': horovod.__version__, 'nccl': bool(h.nccl_built()), "
    "'gloo': bool(h.gloo_built()), 'mpi': bool(h.mpi_built())}\n"
    "except Exception:\n"
    "    pass\n"
    "print(json.dumps(out))")


def probe_script(address: str, python: str, workdir: str) -> str:
    """POSIX sh that prints one key=value per line; it only reads, never changes anything.

    >>> "ip -j -4 addr show to 10.0.0.5/32" in probe_script("10.0.0.5", "/v/bin/python", "/w")
    True
    """
    py, wd = shlex.quote(python), shlex.quote(workdir)
    return "; ".join([
        "echo cores=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)",
        # root, or whether the login user may sudo without a password (configure and tc need it)
        "if [ \"$(id -u)\" = 0 ]; then echo sudo=root; elif sudo -n true 2>/dev/null; "
        "then echo sudo=yes; else echo sudo=no; fi",
        "echo user=$(id -un)",
        "echo memory_kb=$(awk '/^MemTotal:/{print $2}' /proc/meminfo)",
        f"echo addr_json=$(ip -j -4 addr show to {address}/32 2>/dev/null)",
        f"IF=$(ip -o -4 addr show to {address}/32 2>/dev/null | awk '{{print $2; exit}}')",
        'if [ -n "$IF" ]; then echo nic_speed=$(cat /sys/class/net/$IF/speed 2>/dev/null); fi',
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        "nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap,"
        "mig.mode.current --format=csv,noheader,nounits 2>/dev/null | sed 's/^/gpux=/'; "
        "echo cuda_driver=$(nvidia-smi 2>/dev/null | sed -n "
        "'s/.*CUDA Version: *\\([0-9.]*\\).*/\\1/p' | head -n 1); "
        "nvidia-smi topo -m 2>/dev/null | sed 's/^/topo=/'; fi",
        "for p in /sys/class/infiniband/*/ports/*; do [ -d \"$p\" ] || continue; "
        "d=${p%/ports/*}; echo \"rdma=${d##*/}|${p##*/}|$(cat $p/rate 2>/dev/null)|"
        "$(cat $p/link_layer 2>/dev/null)|$(cat $p/state 2>/dev/null)\"; done",
        f"if [ -x {py} ]; then echo stack=$({py} -c {shlex.quote(_STACK_CAN)} 2>/dev/null "
        "| tail -n 1); fi",
        f"if [ -f {wd}/bench/workloads/resnet.py ]; then echo workloads=1; fi",
        # a Docker engine this user can reach: its version, runtimes and scalelab's images
        "if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then "
        "echo docker=$(docker version --format '{{.Server.Version}}' 2>/dev/null); "
        "echo docker_runtimes=$(docker info --format "
        "'{{range $k, $v := .Runtimes}}{{$k}} {{end}}' 2>/dev/null); "
        "docker image ls --no-trunc --format '{{.Repository}}:{{.Tag}} {{.ID}}' "
        f"{image.REPO} 2>/dev/null | sed 's/^/image=/'; fi",
        # Slurm's OCI container support and the training-image bundles for it
        "if [ -f /etc/slurm/oci.conf ]; then echo slurm_oci=1; fi",
        f"for b in {image.OCI_DIR}/*/config.json; do [ -f \"$b\" ] && "
        "echo oci_bundle=${b%/config.json}; done",
        "echo kernel=$(uname -r)",
        "echo hostname=$(hostname)",
        "true",
    ])


def _json(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def parse_gpus(lines: list[str]) -> list[dict[str, Any]]:
    """nvidia-smi's --query-gpu=index,name,memory.total,driver_version,compute_cap,mig.mode.current
    lines, one dict per GPU ([N/A] fields as None).

    >>> parse_gpus(["0, NVIDIA H100 80GB HBM3, 81559, 550.54.15, 9.0, Disabled"])
    [{'index': 0, 'name': 'NVIDIA H100 80GB HBM3', 'memory_mb': 81559, 'driver': '550.54.15', 'compute_cap': '9.0', 'mig': 'Disabled'}]
    """
    out = []
    for line in lines:
        f = [x.strip() for x in line.split(",")]
        if len(f) < 3 or not f[0].isdigit():
            continue
        f += [""] * (6 - len(f))

        def val(x: str) -> str | None:
            return None if not x or x.startswith("[") else x
        mem = val(f[2])
        out.append({"index": int(f[0]), "name": f[1],
                    "memory_mb": int(float(mem)) if mem else 0, "driver": val(f[3]),
                    "compute_cap": val(f[4]), "mig": val(f[5])})
    return out


def parse_rdma(lines: list[str]) -> list[dict[str, Any]]:
    """/sys/class/infiniband ports as the probe prints them: device|port|rate|link layer|state.

    >>> parse_rdma(["mlx5_0|1|200 Gb/sec (4X HDR)|InfiniBand|4: ACTIVE"])
    [{'device': 'mlx5_0', 'port': 1, 'rate_gbit': 200.0, 'link_layer': 'InfiniBand', 'active': True}]
    """
    out = []
    for line in lines:
        f = line.split("|")
        if len(f) < 5 or not f[0]:
            continue
        rate = f[2].split()[0] if f[2].split() else ""
        try:
            gbit = float(rate)
        except ValueError:
            gbit = None
        out.append({"device": f[0], "port": int(f[1]) if f[1].isdigit() else f[1],
                    "rate_gbit": gbit, "link_layer": f[3].strip(),
                    "active": "ACTIVE" in f[4].upper()})
    return out


def plain_topology(lines: list[str]) -> str:
    r"""`nvidia-smi topo -m` as text: it underlines its header with terminal escapes even into
    a pipe (seen on an H100 with driver 580), which a record and a report must not carry.

    >>> plain_topology(["\x1b[4m\tGPU0\tCPU Affinity\x1b[0m", "GPU0\t X \t0-15"])
    'GPU0\tCPU Affinity\nGPU0\t X \t0-15'
    """
    return "\n".join(_ESCAPE.sub("", line).strip() for line in lines)


_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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
    gpu_list = parse_gpus(kv.get("gpux", []))
    if gpu_list:
        gpus = [[g["name"], str(g["memory_mb"])] for g in gpu_list]
    stack = _json(first("stack")) or {}
    torch_version = first("torch") or str(stack.get("version") or "")
    speed = first("nic_speed")
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
        "hostname": first("hostname"),
        "sudo": first("sudo") or "unknown",  # root | yes | no
        "user": first("user"),
        "gpu_list": gpu_list,
        "cuda_driver": first("cuda_driver"),
        "gpu_topology": plain_topology(kv.get("topo", [])),
        "rdma": parse_rdma(kv.get("rdma", [])),
        # /sys/class/net/*/speed is -1 or absent for virtual links
        "nic_speed_mbit": int(speed) if speed.lstrip("-").isdigit() and int(speed) > 0 else None,
        # what the training stack can do: {version, cuda, cuda_available, devices, nccl,
        # horovod: {version, nccl, gloo, mpi} | None}; {} where no interpreter answered
        "torch_can": {k: v for k, v in stack.items() if k != "horovod"},
        "horovod_can": stack.get("horovod"),
        # the Docker engine ("" where none answers), its runtimes, and the training images
        # it holds ({tag: image id})
        "docker": first("docker"),
        "docker_runtimes": first("docker_runtimes").split(),
        "images": dict(i.split(" ", 1) for i in kv.get("image", []) if " " in i),
        # Slurm's oci.conf is there (srun --container), and the OCI bundles of training images
        "slurm_oci": first("slurm_oci") == "1",
        "oci_bundles": kv.get("oci_bundle", []),
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


def check_sudo(cluster: str, nodes: list[Node], facts: dict[str, dict[str, Any]]) -> None:
    """Refuse, before Ansible changes anything, a node whose login user is not root and may
    not sudo without a password: configure would stop halfway with "Missing sudo password".

    >>> n = Node("lab-n1", "a", "a", "worker", "static", ssh_user="alice")
    >>> check_sudo("lab", [n], {"lab-n1": {"sudo": "no", "user": "alice"}})
    Traceback (most recent call last):
    ...
    scalelab.core.errors.ClusterError: node lab-n1: user alice may not sudo without a password, which configure needs (packages, /opt/scalelab, /etc/hosts, tc); ask the host's admins for passwordless sudo, or log in as root (ssh_user in the var-file); already configured nodes can still be benchmarked without it, unshaped
    """
    for n in nodes:
        f = facts.get(n.name) or {}
        if f.get("sudo") == "no":
            raise ClusterError(
                f"node {n.name}: user {f.get('user') or n.ssh_user} may not sudo without a "
                "password, which configure needs (packages, /opt/scalelab, /etc/hosts, tc); "
                "ask the host's admins for passwordless sudo, or log in as root (ssh_user in "
                "the var-file); already configured nodes can still be benchmarked without "
                "it, unshaped")


def check_interfaces(cluster: str, nodes: list[Node], facts: dict[str, dict[str, Any]]) -> None:
    """Refuse a node none of whose interfaces holds its cluster (private) address."""
    for n in nodes:
        if not facts[n.name]["iface"]:
            raise ClusterError(
                f"node {n.name}: no interface holds its cluster address {n.private_address}; "
                f"set that host's private_address to an address it has (ip -4 addr on the "
                f"host lists them), then provision cluster {cluster} again")


HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
# names a node cannot take: the loopback's, and the inventory's groups
RESERVED = {"localhost", "all", "ungrouped", "head", "workers"}


def own_names(nodes: list[Node], facts: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The nodes listed without a name and not configured before (scalelab's label in extra, no
    facts) that can take their host's own name: {label: short hostname}. A hostname that is not
    a plain name, is reserved, or would clash (case aside) with another node's name, new or
    kept, leaves the label in place.

    >>> def n(name, label=True):
    ...     return Node(name, "a", "a", "worker", "static", extra={"label": name} if label else {})
    >>> own_names([n("lab-n0"), n("lab-n1"), n("gpu7", False)],
    ...           {"lab-n0": {"hostname": "gpu3.lab.example"}, "lab-n1": {"hostname": "gpu4"},
    ...            "gpu7": {"hostname": "gpu7"}})
    {'lab-n0': 'gpu3', 'lab-n1': 'gpu4'}
    >>> own_names([n("lab-n0"), n("lab-n1")],  # images that all call themselves ubuntu
    ...           {"lab-n0": {"hostname": "ubuntu"}, "lab-n1": {"hostname": "Ubuntu"}})
    {}
    >>> own_names([n("lab-n0"), n("lab-n1"), n("lab-n2")],  # lab-n1 keeps its label
    ...           {"lab-n0": {"hostname": "lab-n1"}, "lab-n1": {"hostname": "localhost"},
    ...            "lab-n2": {"hostname": "gpu9"}})
    {'lab-n2': 'gpu9'}
    """
    short = {n.name: (facts.get(n.name) or {}).get("hostname", "").split(".")[0] for n in nodes}
    pending = {n.name for n in nodes if n.extra.get("label") == n.name and not n.facts
               and HOSTNAME.fullmatch(short[n.name]) and short[n.name].lower() not in RESERVED}
    while True:  # a refused name keeps its label, which may clash with another's new name
        kept = [n.name.lower() for n in nodes if n.name not in pending]
        proposed = [short[x].lower() for x in pending]
        refused = {x for x in pending
                   if proposed.count(short[x].lower()) > 1 or short[x].lower() in kept}
        if not refused:
            return {x: short[x] for x in sorted(pending)}
        pending -= refused


def adopt_hostnames(cluster: str, nodes: list[Node], facts: dict[str, dict[str, Any]],
                    limit: str | None = None) -> tuple[list[Node], str | None]:
    """Name the nodes listed without a name after their hosts (own_names), in the inventory and
    the record, before configure writes any name onto a host. Returns the nodes and the
    --limit pattern under the new names; nothing changes where no node takes a new name."""
    new = own_names(nodes, facts)
    if not new:
        return nodes, limit
    rec = load_cluster(cluster)
    for node in rec["nodes"]:
        if node["name"] in new:
            log.info("%s: node %s takes its host's name %s", cluster, node["name"],
                     new[node["name"]])
            node["name"] = new[node["name"]]
    _save(cluster, rec)
    if limit:
        limit = re.sub(r"[^,:&!]+", lambda m: new.get(m.group(0), m.group(0)), limit)
    return nodes_of(rec), limit


def _save(cluster: str, rec: dict[str, Any]) -> None:
    """The record, with the target's capabilities worked out again (shape_links may follow the
    interfaces found), and the inventory rendered from it."""
    caps = targets.capabilities(rec)
    rec["capabilities"] = caps.to_dict()
    # the inventory's names, scalelab_iface / scalelab_cpus / scalelab_gpus follow the record;
    # written first, as provision does: a record is never ahead of its inventory
    inventory.write(cluster, nodes_of(rec), known_hosts=rec.get("known_hosts"),
                    capabilities=caps.as_vars(), trust_key=rec.get("trust_key"))
    save_cluster(cluster, rec)


def record(cluster: str, facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Write the facts into cluster.json, corrected by the target; returns the new record."""
    rec = load_cluster(cluster)
    target = targets.of(rec)
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
    _save(cluster, rec)
    return rec


def require_configured(rec: dict[str, Any]) -> None:
    """Refuse a cluster whose nodes have no recorded facts, naming the command that records them.

    >>> require_configured({"name": "lab", "nodes": [{"name": "a", "facts": {"cores": 4}}]})
    >>> require_configured({"name": "lab", "nodes": [{"name": "a"}]})
    Traceback (most recent call last):
    ...
    scalelab.core.errors.ClusterError: cluster lab has not been configured (no facts recorded for node a); run invoke configure --cluster lab
    """
    for n in rec.get("nodes", []):
        if not n.get("facts"):
            raise ClusterError(f"cluster {rec.get('name')} has not been configured (no facts "
                               f"recorded for node {n['name']}); run invoke configure --cluster "
                               f"{rec.get('name')}")
