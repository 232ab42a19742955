"""The `slurm` target: a Slurm cluster someone else runs, reached through its login host only.

What a user of a university HPC centre or a job-based testbed has: SSH to a login host and a
partition, no root, no SSH to the compute nodes. scalelab then
- learns the partition's nodes from sinfo on the login host (names, CPUs, memory, GPUs: the
  facts that configure would find elsewhere);
- checks that the interpreter the var-file names (on a file system the compute nodes share,
  with torch, and Horovod for Horovod runs) imports torch on the login host;
- copies bench/workloads under the var-file's workdir (on that shared file system), and
  removes exactly that copy again at destroy;
- runs every run as a Slurm job (the only launcher it allows) and never shapes a link: a
  sweep over rates other than native is refused, and the rate measured inside an allocation
  is recorded with each run.

Nothing is installed or configured there (invoke configure says so); nothing but the login
host is ever contacted over SSH.

The var-file (.json or .tfvars, as for the other targets):
  login_host   address of the login host (required)
  ssh_user     login user (required); ssh_key: private key on the controller (required)
  known_hosts  a known_hosts file on the controller that pins the login host's key (required)
  ssh_port     default 22
  partition    default: the cluster's default partition
  python       interpreter on the compute nodes, absolute (required)
  workdir      directory on the shared file system for bench/workloads, absolute (required)
  iface        the compute nodes' cluster interface for gloo/NCCL (default: let them pick)
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
import time
from pathlib import Path, PurePosixPath
from typing import Any

from scalelab.cluster import inventory, netshape, slurmctl, ssh
from scalelab.cluster.nodes import Node
from scalelab.cluster.targets.interface import Capabilities, Runtime
from scalelab.cluster.targets.tfmodule import load_var_file
from scalelab.cluster.targets.tfmodule import parse_nodes as parse_count
from scalelab.core import validate
from scalelab.core.errors import ClusterError, InputError, suggest
from scalelab.core.state import PROJECT_ROOT, check_cluster_name, cluster_dir, inventory_dir, load_cluster, save_cluster

log = logging.getLogger(__name__)

TARGET = "slurm"
REQUIRED = ("login_host", "ssh_user", "ssh_key", "known_hosts", "python", "workdir")
OPTIONAL = ("ssh_port", "partition", "iface")
MARKER = ".scalelab-workloads"  # in the copy scalelab made; destroy removes only a marked copy

def _check_values(values: dict[str, Any], var_file: str) -> dict[str, Any]:
    for key in values:
        if key not in REQUIRED + OPTIONAL:
            hint = suggest(str(key), REQUIRED + OPTIONAL) or \
                f"known: {', '.join(REQUIRED + OPTIONAL)}"
            raise InputError(f"var-file {var_file}: unknown key {key!r}; {hint}")
    missing = [k for k in REQUIRED if not str(values.get(k) or "").strip()]
    if missing:
        raise InputError(f"var-file {var_file} lacks {', '.join(missing)}; a slurm cluster needs "
                         f"{', '.join(REQUIRED)} (see README, 'slurm: a cluster you reach through "
                         "its login host')")
    # values that become ssh arguments: a leading dash would make them options
    validate.login_name(values["ssh_user"], "ssh_user", f"var-file {var_file}",
                        "give your login user on the cluster's login host")
    validate.host(values["login_host"], "login_host", f"var-file {var_file}",
                  "give the login host's name or address")
    for key in ("python", "workdir"):
        if not str(values[key]).startswith("/"):
            raise InputError(f"var-file {var_file}: {key} {values[key]!r} must be an absolute "
                             "path on the cluster's shared file system")
    for key in ("ssh_key", "known_hosts"):
        if not Path(str(values[key])).expanduser().is_file():
            raise InputError(f"var-file {var_file}: {key} {values[key]} is not a file on this "
                             "machine")
    validate.port(values.get("ssh_port", 22), "ssh_port", f"var-file {var_file}",
                  "give the login host's SSH port, or leave ssh_port out for 22")
    validate.iface(values.get("iface"), "iface", f"var-file {var_file}",
                   "give the nodes' cluster-network interface, or leave iface out")
    return values


def login_node(cluster: str, values: dict[str, Any]) -> Node:
    host = str(values["login_host"])
    return Node(name=f"{cluster}-login", address=host, private_address=host, role="head",
                target=TARGET, ssh_user=str(values["ssh_user"]),
                ssh_port=int(values.get("ssh_port", 22)),
                ssh_key=str(Path(str(values["ssh_key"])).expanduser().resolve()))


def parse_nodes(text: str) -> list[dict[str, Any]]:
    """Compute nodes from `sinfo --noheader --Node --format '%N|%c|%m|%G'`.

    >>> parse_nodes("gpu01|64|515000|gpu:a100:4\\ngpu02|64|515000|gpu:a100:4(S:0-1)\\ncpu1|8|1000|(null)\\n")
    ... # doctest: +NORMALIZE_WHITESPACE
    [{'name': 'gpu01', 'cores': 64, 'memory_mb': 515000, 'gpus': 4, 'gpu_model': 'a100'},
     {'name': 'gpu02', 'cores': 64, 'memory_mb': 515000, 'gpus': 4, 'gpu_model': 'a100'},
     {'name': 'cpu1', 'cores': 8, 'memory_mb': 1000, 'gpus': 0, 'gpu_model': ''}]
    """
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        cols = line.strip().split("|")
        if len(cols) < 4 or not cols[0] or any(n["name"] == cols[0] for n in out):
            continue
        gpus, model = 0, ""
        for gres in cols[3].split(","):
            parts = gres.split("(")[0].split(":")
            if parts[0] == "gpu" and parts[-1].isdigit():
                gpus += int(parts[-1])
                model = parts[1] if len(parts) == 3 else model
        out.append({"name": cols[0], "cores": int(cols[1]) if cols[1].isdigit() else 0,
                    "memory_mb": int(cols[2]) if cols[2].isdigit() else 0, "gpus": gpus,
                    "gpu_model": model})
    return out


def _copy_workloads(login: Node, known_hosts: str, workdir: str) -> None:
    """bench/workloads under workdir on the login host (the shared file system), with the
    marker that lets destroy remove exactly this copy. A bench/workloads there that is not
    scalelab's copy (a checkout of the user's own, say) is refused, never overwritten."""
    dest = str(PurePosixPath(workdir) / "bench")
    copy = f"{dest}/workloads"
    try:
        tar = subprocess.run(["tar", "-C", str(PROJECT_ROOT), "--exclude=__pycache__", "-cf",
                              "-", "bench/workloads"], capture_output=True, timeout=60,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ClusterError(f"could not pack bench/workloads ({exc})") from None
    line = (f"if [ -e {shlex.quote(copy)} ] && [ ! -f {shlex.quote(copy + '/' + MARKER)} ]; "
            "then echo NOT_OURS; exit 3; fi; "
            f"mkdir -p {shlex.quote(dest)} && tar -C {shlex.quote(workdir)} -xf - && "
            f"touch {shlex.quote(copy + '/' + MARKER)}")
    argv = ssh.ssh_args(login, known_hosts) + ["--", line]
    try:
        proc = subprocess.run(argv, input=tar, capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"copying the workloads to {login.address}:{dest} took over 300 s; "
                           "is the shared file system answering?") from None
    if proc.returncode == 3 and b"NOT_OURS" in proc.stdout:
        raise InputError(f"{login.address}:{copy} exists and is not a copy scalelab made; "
                         "give workdir a directory of scalelab's own, e.g. "
                         f"{PurePosixPath(workdir) / 'scalelab'}")
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip().splitlines()
        raise ClusterError(f"could not copy the workloads to {login.address}:{dest} "
                           f"({why[-1] if why else 'exit ' + str(proc.returncode)}); is workdir "
                           "writable?")


def provision(cluster: str, nodes: int | str, var_file: str | None = None,
              **_: Any) -> list[Node]:

    check_cluster_name(cluster)
    if not var_file:
        raise InputError("a slurm cluster needs --var-file naming its login host, user, key, "
                         "known_hosts, python and workdir (see README)")
    want = parse_count(nodes)
    values = _check_values(load_var_file(var_file), var_file)
    login = login_node(cluster, values)
    known_hosts = str(Path(str(values["known_hosts"])).expanduser().resolve())
    partition = str(values.get("partition") or "") or None
    part = slurmctl.check(cluster, login, known_hosts, partition, [], fix=slurmctl.ADMIN_FIX)
    proc = slurmctl.login_run(login, known_hosts, "sinfo --noheader --Node --partition "
                f"{shlex.quote(part.name)} --format '%N|%c|%m|%G'")
    found = parse_nodes(proc.stdout)
    if want > len(found):
        raise InputError(f"--nodes {want}: partition {part.name} has {len(found)} nodes "
                         f"({', '.join(n['name'] for n in found)}); give at most {len(found)}")
    python = str(values["python"])
    proc = slurmctl.login_run(login, known_hosts, f"{shlex.quote(python)} -c 'import torch; "
                "print(torch.__version__)'", timeout=120)
    torch_version = proc.stdout.strip()
    if proc.returncode != 0 or not re.fullmatch(r"\d+\.\d+\S*", torch_version):
        why = (proc.stderr.strip().splitlines() or [f"printed {torch_version[:40]!r}"])[-1]
        raise ClusterError(f"{python} on {login.address} cannot import torch ({why[:200]}); "
                           "give python: an interpreter with torch on the shared file system")
    workdir = str(values["workdir"])
    _copy_workloads(login, known_hosts, workdir)
    recs = []
    for i, n in enumerate(found[:want]):
        facts = {"cores": n["cores"], "memory_mb": n["memory_mb"], "gpus": n["gpus"],
                 "gpu_model": n["gpu_model"], "gpu_memory_mb": 0,
                 "iface": str(values.get("iface") or ""), "python": python, "workdir": workdir,
                 "torch": torch_version, "source": f"sinfo on {login.address}"}
        recs.append(Node(name=n["name"], address=n["name"], private_address=n["name"],
                         role="head" if i == 0 else "worker", target=TARGET,
                         ssh_user=login.ssh_user, cpus=float(n["cores"]), gpus=n["gpus"],
                         iface=facts["iface"], facts=facts))
    caps = SlurmTarget().capabilities({})
    save_cluster(cluster, {
        "name": cluster, "target": TARGET, "login": login.to_dict(), "partition": part.name,
        "known_hosts": known_hosts, "nodes": [r.to_dict() for r in recs],
        "created_at": time.time(), "configured_at": "provision (sinfo on the login host)",
        "capabilities": caps.to_dict()})
    inventory.write(cluster, [login], known_hosts, capabilities=caps.as_vars())
    return recs


def destroy(cluster: str) -> None:
    """Remove the workloads copy scalelab made on the shared file system (only if marked as
    its own), then the cluster's records on the controller."""
    import shutil

    rec = load_cluster(cluster)
    login = Node.from_dict(rec["login"], str(cluster_dir(cluster) / "cluster.json"))
    workdir = (rec.get("nodes") or [{}])[0].get("facts", {}).get("workdir")
    if workdir:
        copy = str(PurePosixPath(workdir) / "bench" / "workloads")
        line = (f"if [ -f {shlex.quote(copy + '/' + MARKER)} ]; then rm -rf {shlex.quote(copy)}; "
                f"rmdir {shlex.quote(str(PurePosixPath(workdir) / 'bench'))} 2>/dev/null; fi; "
                "exit 0")
        try:
            slurmctl.login_run(login, rec["known_hosts"], line)
        except ClusterError as exc:
            log.warning("%s; the workloads under %s stay there", exc, copy)
    (inventory_dir() / f"{cluster}.yml").unlink(missing_ok=True)
    shutil.rmtree(cluster_dir(cluster), ignore_errors=True)


class NoLinks:
    """Links of a cluster whose links scalelab may not touch: unshaped is all there is."""

    def snapshot(self) -> Any:
        return None

    def apply(self, mbit: float | None, delay_us: float = 0.0) -> None:
        netshape.only_links_scalelab_made(delay_us)
        if mbit is not None:
            raise ClusterError("this cluster's links cannot be shaped by scalelab")

    def apply_intra(self, mbit: float | None) -> None:
        netshape.only_own_loopbacks(mbit)

    def restore(self, snapshot: Any) -> None:
        return None

    def still_as_left(self, mbit: float | None) -> bool:
        return mbit is None


class SlurmTarget:
    """The Target interface (scalelab.cluster.targets) of a Slurm cluster behind a login host."""

    name = TARGET

    def capabilities(self, rec: dict[str, Any]) -> Any:
        # only the login host answers SSH; the site's admins own the nodes' software
        return Capabilities(configurable=False, ssh_nodes=False, shape_links=False,
                            owns_hosts=False)

    def dry_run(self, cluster: str, nodes: int | str, **options: Any) -> list[str]:
        raise InputError("--dry-run: a slurm cluster is only looked at (sinfo), never "
                         "created; provision it directly")

    def provision(self, cluster: str, nodes: int | str, **options: Any) -> list[Node] | None:
        if options.get("dry_run"):
            raise InputError("--dry-run: a slurm cluster is only looked at (sinfo), never "
                             "created; provision it directly")
        return provision(cluster, nodes, var_file=options.get("var_file"))

    def destroy(self, cluster: str) -> None:
        destroy(cluster)

    def alive(self, cluster: str, nodes: list[Node]) -> list[bool]:
        rec = load_cluster(cluster)
        try:
            out = slurmctl.login_run(self.login(rec), rec["known_hosts"],
                       "sinfo --noheader --Node --format '%N|%t'", timeout=20).stdout
        except ClusterError:
            return [False] * len(nodes)
        state = dict(ln.split("|", 1) for ln in out.split() if "|" in ln)
        return [state.get(n.name, "").rstrip("*~#") in ("idle", "mix", "alloc", "comp")
                for n in nodes]

    def summary(self, rec: dict[str, Any]) -> dict[str, str]:
        return {"login": str((rec.get("login") or {}).get("address", "?")),
                "partition": str(rec.get("partition", "?")), "bandwidth": "not shaped"}

    def adjust_facts(self, rec: dict[str, Any], node: dict[str, Any],
                     facts: dict[str, Any]) -> dict[str, Any]:
        return facts

    def runtime(self, rec: dict[str, Any]) -> Runtime:
        f = (rec.get("nodes") or [{}])[0].get("facts") or {}
        return Runtime(str(f.get("python", "")), str(f.get("workdir", "")), rec["known_hosts"])

    def links(self, cluster: str, rec: dict[str, Any], nodes: list[Node]) -> NoLinks:
        return NoLinks()

    def set_rate(self, cluster: str, mbit: float | None) -> None:
        raise InputError(f"cluster {cluster} is a Slurm cluster reached through its login host: "
                         "scalelab cannot shape its links (its sweeps record the rate measured)")

    def login(self, rec: dict[str, Any]) -> Node:
        return Node.from_dict(rec["login"], str(cluster_dir(rec["name"]) / "cluster.json"))

    def launchers(self, rec: dict[str, Any]) -> tuple[str, ...]:
        return ("slurm",)

    def default_partition(self, rec: dict[str, Any]) -> str | None:
        return rec.get("partition")


def target(name: str = TARGET) -> SlurmTarget:
    return SlurmTarget()

