"""Lifecycle of the Terraform-managed targets (static, openstack, aws): provision, destroy, status.

Nothing is copied into the repository. For cluster NAME, the module terraform/<target>/*.tf and
the operator's var-file are copied into the gitignored state dir
``.scalelab/clusters/NAME/terraform/``; Terraform runs there (``-chdir``), so ``.terraform/``,
the lock file, the plan and ``terraform.tfstate`` all live there too. Providers are cached once
for all clusters in ``.scalelab/terraform-plugin-cache/`` (unless TF_PLUGIN_CACHE_DIR is set).

Every bad input (unknown target, a var-file key variables.tf does not declare, a missing
required variable, --nodes above the var-file's max_nodes quota, a broken static host list) is
refused with one line before anything is created. A provision that fails part-way is destroyed
unless keep_on_failure. Terraform never writes files for us: the inventory is rendered from
``terraform output -json`` (the outputs contract, see scalelab.cluster.nodes.nodes_from_outputs).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.cluster import inventory
from scalelab.cluster.nodes import Node, nodes_from_outputs, nodes_of
from scalelab.cluster.targets import TERRAFORM_TARGETS
from scalelab.cluster.targets.interface import SshReachable
from scalelab.cluster.targets.tfmodule import (
    PLAN_FILE,
    Plan,
    bastion_of,
    contract_outputs,
    dry_run,
    plugin_cache_dir,
    prepare,
    target_module,
)
from scalelab.cluster.terraform import (
    BINARY_ENV,
    Terraform,
    TerraformError,
    meets,
    redact,
    required_version,
)
from scalelab.core.errors import ClusterError, InputError, ProvisionError
from scalelab.core.state import (
    check_cluster_name,
    cluster_dir,
    load_cluster,
    private_dir,
    save_cluster,
    write_atomic,
)

log = logging.getLogger(__name__)

STATE_FILE = "terraform.tfstate"
# node-to-node SSH (mpirun, horovodrun) uses a key pair made for the cluster, never the user's
# login key: configure authorises it on the nodes, destroy removes it from hosts it did not make
TRUST_KEY_NAME = "id_trust"
# RFC 5737 documentation ranges: never routed, so never probed either.
_DOC_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24",
                                               "203.0.113.0/24")]


# ---------------------------------------------------------------- the plan of a provision


# ---------------------------------------------------------------- provision


def generate_key(path: Path, comment: str) -> str:
    """Make an ed25519 key pair at path and path.pub (both 0600); return the public line."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH,
                                ser.NoEncryption()).decode()
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH,
                                           ser.PublicFormat.OpenSSH).decode()
    line = f"{public} {comment}"
    write_atomic(path, private, mode=0o600)
    write_atomic(path.with_name(path.name + ".pub"), line + "\n", mode=0o600)
    return line


def _snapshot(workdir: Path) -> dict[str, str]:
    """The staged module and var-file of an existing cluster, to put back if an update fails."""
    if not workdir.is_dir():
        return {}
    return {p.name: p.read_text() for p in sorted(workdir.iterdir())
            if p.is_file() and (p.suffix == ".tf" or p.name.startswith("operator.tfvars"))}


def _restore(workdir: Path, files: dict[str, str]) -> None:
    for p in list(workdir.glob("*.tf")) + list(workdir.glob("operator.tfvars*")):
        p.unlink()
    for name, text in files.items():
        write_atomic(workdir / name, text, mode=0o600)


def _stage(plan: Plan) -> None:
    """Copy the module's .tf files and the var-file into the working dir (0700/0600)."""
    private_dir(plan.workdir)
    for old in plan.workdir.glob("*.tf"):
        old.unlink()
    for tf in sorted(plan.module.glob("*.tf")):
        write_atomic(plan.workdir / tf.name, tf.read_text(), mode=0o600)
    for old in plan.workdir.glob("operator.tfvars*"):
        old.unlink()
    if plan.var_file and plan.var_file_copy:
        write_atomic(plan.workdir / plan.var_file_copy, plan.var_file.read_text(), mode=0o600)
    plan.plugin_cache.mkdir(parents=True, exist_ok=True)


def _record(plan: Plan, status: str, nodes: list[Node], bastion: str | None,
            binary_version: str = "") -> dict[str, Any]:
    cdir = cluster_dir(plan.cluster)
    previous = plan.existing or {}
    return {
        "name": plan.cluster,
        "target": plan.target,
        "status": status,
        "nodes": [n.to_dict() for n in nodes],
        "known_hosts": str(cdir / "known_hosts"),
        "ssh_key": str(plan.key_path),
        "bastion": bastion,
        "created_at": previous.get("created_at") or _now(),
        "updated_at": _now(),
        "terraform": {
            "workdir": str(plan.workdir),
            "var_file": plan.var_file_copy,
            "var_file_source": str(plan.var_file) if plan.var_file else None,
            "variables": plan.variables,
            "binary": plan.binary,
            "version": binary_version,
        },
    }


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def provision(cluster: str, target: str, nodes: int | str, var_file: str | Path | None = None,
              keep_on_failure: bool = False, dry_run: bool = False) -> list[Node] | None:
    """Create or resize a Terraform-managed cluster; write cluster.json and the inventory.

    Returns the Node records, head first; None for a dry run (whose report is logged at INFO;
    call dry_run() for it as lines to print).
    """
    if dry_run:
        for line in prepare(cluster, target, nodes, var_file, need_binary=False).lines():
            log.info("%s", line)
        return None
    plan = prepare(cluster, target, nodes, var_file)
    mod = target_module(target)
    if not mod.credentials_present():
        log.warning("%s: no credentials found in the environment; %s", target,
                    mod.CREDENTIALS_HINT)
    version = _binary_version(plan, target)
    created_dir = not cluster_dir(cluster).exists()
    created: list[Path] = []  # what to remove if a new cluster fails before apply
    tf = Terraform(plan.workdir, binary=plan.binary, env=plan.env())
    _stage_and_plan(plan, tf, version, created_dir, created)

    # Apply: from here on, cloud resources may exist.
    try:
        tf.apply_plan(PLAN_FILE)
        outputs = tf.output()
        recs = nodes_from_outputs(outputs, target, str(plan.key_path))
        _check_nodes(recs, plan.nodes, target)
    except BaseException as exc:
        _after_failed_apply(plan, tf, exc, keep_on_failure, created_dir, created)
        raise  # _after_failed_apply raises; this keeps type checkers content
    finally:
        (plan.workdir / PLAN_FILE).unlink(missing_ok=True)
    recs = _ready(plan, outputs, recs, version)
    log.info("%s cluster %s: %d node(s) ready; inventory written", target, cluster, len(recs))
    return recs


def _binary_version(plan: Plan, target: str) -> str:
    """The binary's version, refused before anything is written when the module needs a newer
    one (asked outside the working directory and the plugin cache, neither of which exists
    yet): it would fail at init."""
    version = Terraform(Path.cwd(), binary=plan.binary).version()
    need = required_version(plan.module)
    if need and not meets(version, need):
        raise TerraformError(
            f"{plan.binary} is version {version}, and the {target} module needs {need}; "
            f"install a Terraform or OpenTofu that meets it and point {BINARY_ENV} at it "
            "(README, 'static, openstack, aws')")
    return version


def _stage_and_plan(plan: Plan, tf: Terraform, version: str, created_dir: bool,
                    created: list[Path]) -> None:
    """Stage the module and plan: nothing exists in the cloud yet, so a failure only undoes
    local files (a new cluster's, or an existing one's as they were)."""
    cluster, cdir = plan.cluster, cluster_dir(plan.cluster)
    before = _snapshot(plan.workdir) if plan.existing else {}
    step = "stage"
    try:
        private_dir(cdir)
        if plan.generates_key and not plan.key_path.is_file():
            created += [plan.key_path, plan.key_path.with_name(plan.key_path.name + ".pub")]
            plan.variables["ssh_public_key"] = generate_key(plan.key_path,
                                                            f"scalelab-{cluster}")
        known_hosts = cdir / "known_hosts"
        if not known_hosts.exists():
            created.append(known_hosts)
            write_atomic(known_hosts, "", mode=0o600)
        if not plan.existing:
            created += [cdir / "cluster.json", plan.workdir]
        _stage(plan)
        status = plan.existing.get("status", "ready") if plan.existing else "provisioning"
        save_cluster(cluster, _record(plan, status,
                                      [Node.from_dict(n) for n in (plan.existing or {})
                                       .get("nodes", [])],
                                      (plan.existing or {}).get("bastion"), version))
        step = "init"
        tf.init()
        step = "plan"
        tf.plan(PLAN_FILE, var_file=plan.var_file_copy, variables=plan.variables)
    except BaseException as exc:
        if created_dir:
            shutil.rmtree(cdir, ignore_errors=True)
        elif not plan.existing:
            _remove(created)
        else:
            _restore(plan.workdir, before)
            save_cluster(cluster, plan.existing)
        if isinstance(exc, TerraformError):
            fix = "fix the var-file" + (f" ({plan.var_file})" if plan.var_file else "") \
                if step == "plan" else "fix the cause"
            raise TerraformError(f"{plan.target}: {str(exc).rstrip('.')}; {fix} and retry; "
                                 "nothing was created", stderr=exc.stderr) from None
        raise


def _ready(plan: Plan, outputs: dict[str, Any], recs: list[Node], version: str) -> list[Node]:
    """The applied cluster recorded: its nodes (through the bastion where there is one), its
    capabilities, the cluster's own trust key, the inventory."""
    cluster, cdir = plan.cluster, cluster_dir(plan.cluster)
    bastion_ip = bastion_of(outputs)
    user = (outputs.get("ssh_user") or {}).get("value") or recs[0].ssh_user
    bastion = f"{user}@{bastion_ip}" if bastion_ip else None
    if bastion:
        # every SSH to the nodes goes through it: scalelab.cluster.ssh.options makes the hop
        recs = [dataclasses.replace(n, bastion=bastion) for n in recs]
    rec = _record(plan, "ready", recs, bastion, version)
    caps = TerraformTarget(plan.target).capabilities(rec)
    rec["capabilities"] = caps.to_dict()
    trust = cdir / TRUST_KEY_NAME
    if not trust.is_file():
        generate_key(trust, f"scalelab-{cluster}-trust")
    rec["trust_key"] = str(trust)
    inventory.write(cluster, recs, known_hosts=str(cdir / "known_hosts"),
                    capabilities=caps.as_vars(), trust_key=str(trust))
    save_cluster(cluster, rec)
    return recs


def _check_nodes(recs: list[Node], want: int, target: str) -> None:
    heads = [n for n in recs if n.role == "head"]
    if len(recs) != want or len(heads) != 1:
        raise ProvisionError(f"terraform/{target} returned {len(recs)} node(s) with {len(heads)} "
                             f"head(s), expected {want} with 1; the module breaks the outputs "
                             "contract")


def _remove(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _after_failed_apply(plan: Plan, tf: Terraform, exc: BaseException, keep_on_failure: bool,
                        created_dir: bool, created: list[Path]) -> None:
    cluster, cdir = plan.cluster, cluster_dir(plan.cluster)
    reason = str(exc) or type(exc).__name__
    if plan.existing:
        save_cluster(cluster, {**_record(plan, "failed", [Node.from_dict(n) for n in
                                                          plan.existing.get("nodes", [])],
                                         plan.existing.get("bastion")),
                               "error": redact(reason)})
        raise ProvisionError(f"updating {cluster} failed: {reason}; the cluster is as Terraform "
                             "left it: fix the cause and run provision again, or invoke destroy "
                             f"--cluster {cluster}") from (exc if isinstance(exc, Exception)
                                                            else None)
    if keep_on_failure:
        save_cluster(cluster, {**_record(plan, "failed", [], None), "error": redact(reason)})
        raise ClusterError(f"provisioning {cluster} failed: {reason}; kept what was created "
                           f"(--keep-on-failure), state in {plan.workdir}; remove it with: "
                           f"invoke destroy --cluster {cluster}") from None
    log.warning("provisioning %s failed; destroying what was created", cluster)
    try:
        tf.destroy(var_file=plan.var_file_copy, variables=plan.variables)
    except TerraformError as derr:
        save_cluster(cluster, {**_record(plan, "failed", [], None), "error": redact(reason)})
        raise ProvisionError(f"provisioning {cluster} failed: {reason}; destroying what it "
                             f"created failed too ({derr}); state kept in {plan.workdir}: retry "
                             f"with invoke destroy --cluster {cluster}") from None
    if created_dir:
        shutil.rmtree(cdir, ignore_errors=True)
    else:
        _remove(created)
    inventory.remove(cluster)
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    raise ProvisionError(f"provisioning {cluster} failed: {reason}; everything it created was "
                         "destroyed") from None


# ---------------------------------------------------------------- destroy and status


def _terraform_record(cluster: str) -> tuple[dict[str, Any], Path]:
    rec = load_cluster(cluster)
    if rec.get("target") not in TERRAFORM_TARGETS:
        raise ClusterError(f"cluster {cluster} has target {rec.get('target')}, which Terraform "
                           "does not manage")
    return rec, cluster_dir(cluster) / "terraform"


def destroy(cluster: str) -> None:
    """terraform destroy, then remove the cluster's state dir and inventory."""
    check_cluster_name(cluster)
    rec, workdir = _terraform_record(cluster)
    meta = rec.get("terraform") or {}
    if (workdir / STATE_FILE).exists():
        # the binary that applied the state, where it still is: another may read it otherwise
        used = meta.get("binary")
        binary = used if used and os.sep in used and os.access(used, os.X_OK) else None
        tf = Terraform(workdir, binary=binary,
                       env={"TF_PLUGIN_CACHE_DIR": str(plugin_cache_dir())})
        try:
            tf.init()
            tf.destroy(var_file=meta.get("var_file"), variables=meta.get("variables") or {})
        except TerraformError as exc:
            raise TerraformError(f"destroying {cluster} failed: {exc}; state kept in {workdir}: "
                                 f"fix the cause and rerun invoke destroy --cluster {cluster}",
                                 stderr=exc.stderr) from None
    shutil.rmtree(cluster_dir(cluster), ignore_errors=True)
    inventory.remove(cluster)
    log.info("destroyed %s cluster %s", rec.get("target"), cluster)


@dataclass
class TfStatus:
    """What Terraform knows about a cluster (from local state: no cloud call)."""

    name: str
    target: str
    status: str  # provisioning | ready | failed
    nodes: list[Node]
    resources: list[str] = field(default_factory=list)
    outputs_match: bool = False  # terraform output agrees with cluster.json's nodes
    bastion: str | None = None
    workdir: Path | None = None
    error: str = ""


def status(cluster: str) -> TfStatus:
    """Resources in the state and whether the recorded nodes still match terraform output."""
    rec, workdir = _terraform_record(cluster)
    nodes = nodes_of(rec)
    info = TfStatus(name=cluster, target=rec["target"], status=rec.get("status", "?"),
                    nodes=nodes, bastion=rec.get("bastion"), workdir=workdir,
                    error=rec.get("error", ""))
    if not (workdir / STATE_FILE).exists():
        return info
    tf = Terraform(workdir)
    info.resources = tf.state_list()
    outputs = tf.output()
    try:
        now = nodes_from_outputs(outputs, rec["target"], rec.get("ssh_key", ""))
    except (InputError, KeyError):
        return info
    # the contract's fields, by the names Terraform knows (a static host listed without a name
    # may have taken its hostname since: its label is kept in extra)
    known = [dataclasses.replace(n, name=n.extra.get("label", n.name)) for n in nodes]
    recorded = (rec.get("bastion") or "").rpartition("@")[2] or None  # user@address
    info.outputs_match = (contract_outputs(now) == contract_outputs(known)
                          and bastion_of(outputs) == recorded)
    return info


def alive(cluster: str, nodes: list[Node], timeout_s: float = 3.0) -> list[bool]:
    """Whether each node's sshd answers. Direct nodes: a TCP probe for the SSH banner; nodes
    behind a bastion: `ssh -J` with the cluster's key and pinned host keys (so False until the
    host keys are recorded). Documentation addresses (RFC 5737) are never probed."""
    rec = load_cluster(cluster)
    bastion = rec.get("bastion")
    known_hosts = rec.get("known_hosts", "")

    def probe(n: Node) -> bool:
        try:
            if any(ipaddress.ip_address(n.address) in net for net in _DOC_NETS):
                return False
        except ValueError:
            pass
        if bastion:
            return _ssh_probe(n, bastion, known_hosts, timeout_s)
        try:
            with socket.create_connection((n.address, n.ssh_port), timeout=timeout_s) as s:
                s.settimeout(timeout_s)
                return s.recv(4).startswith(b"SSH")
        except OSError:
            return False

    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
        return list(pool.map(probe, nodes))


def _ssh_probe(n: Node, bastion: str, known_hosts: str, timeout_s: float) -> bool:
    from scalelab.cluster import ssh

    hop = n if n.bastion else dataclasses.replace(n, bastion=bastion)
    argv = [*ssh.ssh_args(hop, known_hosts, max(1, int(timeout_s))), "true"]
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout_s * 4,
                              stdin=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# ---------------------------------------------------------------- the Target interface


class TerraformTarget(SshReachable):
    """The Target interface (scalelab.cluster.targets.base) of static, openstack and aws clusters.

    Their nodes are real hosts: the training stack is what configure installed there, the
    cluster interface is what configure found (scalelab.cluster.facts), and link rates are set by
    the sweep driver with tc over SSH and put back afterwards (scalelab.cluster.netshape.SshLinks).
    """

    def __init__(self, name: str) -> None:
        target_module(name)
        self.name = name

    def capabilities(self, rec: dict[str, Any]) -> Any:
        from scalelab.cluster.targets.interface import Capabilities

        # real hosts: everything is installed and checked; links can be shaped once configure
        # has found every node's cluster interface
        nodes = rec.get("nodes") or []
        shape = bool(nodes) and all((n.get("facts") or {}).get("iface") for n in nodes)
        # a static cluster's hosts are someone else's: destroy undoes what configure added
        return Capabilities(shape_links=shape, owns_hosts=self.name != "static")

    def dry_run(self, cluster: str, nodes: int | str, **options: Any) -> list[str]:
        return dry_run(cluster, self.name, nodes, options.get("var_file")).lines()

    def provision(self, cluster: str, nodes: int | str, **options: Any) -> list[Node] | None:
        allowed = {"var_file", "keep_on_failure", "dry_run"}
        return provision(cluster=cluster, target=self.name, nodes=nodes,
                         **{k: v for k, v in options.items() if k in allowed})

    def destroy(self, cluster: str) -> None:
        destroy(cluster)

    def alive(self, cluster: str, nodes: list[Node]) -> list[bool]:
        return alive(cluster, nodes)

    def summary(self, rec: dict[str, Any]) -> dict[str, str]:
        configured = rec.get("configured_at")
        return {"bandwidth": "set per sweep", "configured": configured or
                f"no (run invoke configure --cluster {rec.get('name')})"}

    def adjust_facts(self, rec: dict[str, Any], node: dict[str, Any],
                     facts: dict[str, Any]) -> dict[str, Any]:
        if not facts.get("gpus") and node.get("gpus"):
            # the host list says GPUs but nvidia-smi found none: keep the count, flag it
            facts = {**facts, "gpus": node["gpus"], "gpu_note": "declared, not detected"}
        return facts

    def runtime(self, rec: dict[str, Any]) -> Any:
        from scalelab.cluster.targets.interface import runtime_from_facts

        return runtime_from_facts(rec)

    def links(self, cluster: str, rec: dict[str, Any], nodes: list[Node]) -> Any:
        from scalelab.cluster.netshape import SshLinks

        return SshLinks(nodes, rec["known_hosts"])

    def set_rate(self, cluster: str, mbit: float | None) -> None:
        raise InputError(f"cluster {cluster} is a {self.name} cluster: its links are shaped per "
                         "run by invoke bench --bandwidth (and restored after), not here")


def target(name: str) -> TerraformTarget:
    return TerraformTarget(name)
