"""Lifecycle of the Terraform-managed targets (static, openstack, aws): provision and destroy.

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

Terraform's state is the one record of what exists in a cloud, so it is handled as such: a
failed provision removes only what that very call made, never a working directory that holds
a state; destroy refuses to run without the state (unless told it is lost), pushes back a state
Terraform could not save (errored.tfstate), and calls a cluster destroyed only when Terraform's
state lists nothing. The working directory and that state: scalelab.cluster.targets.tfstate;
a cluster as it stands (status, whether its nodes answer): scalelab.cluster.targets.tfstatus.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from scalelab.cluster import inventory
from scalelab.cluster.netshape import SshLinks
from scalelab.cluster.nodes import Node, nodes_from_outputs
from scalelab.cluster.targets.interface import Capabilities, SshReachable, runtime_from_facts
from scalelab.cluster.targets.tfmodule import (
    PLAN_FILE,
    Plan,
    bastion_of,
    dry_run,
    plugin_cache_dir,
    prepare,
    target_module,
)
from scalelab.cluster.targets.tfstate import (
    ERRORED_FILE,
    STATE_FILE,
    Made,
    check_destroyed,
    claim_workdir,
    has_state,
    make_dir,
    missing_state,
    push_errored,
    remove_made,
    restore,
    snapshot,
    stage,
    state_files,
    state_serial,
    unsaved_note,
)
from scalelab.cluster.targets.tfstatus import alive, terraform_record
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
    save_cluster,
    write_atomic,
)

log = logging.getLogger(__name__)

# Terraform's own words for an apply that changed nothing: its plan could not be read, the
# state changed since the plan, or another run holds the state's lock.
_APPLIED_NOTHING = re.compile(r'Saved plan is stale|Failed to load ".*" as a plan file|'
                              r"Error acquiring the state lock")
# node-to-node SSH (mpirun, horovodrun) uses a key pair made for the cluster, never the user's
# login key: configure authorises it on the nodes, destroy removes it from hosts it did not make
TRUST_KEY_NAME = "id_trust"


# ---------------------------------------------------------------- keys and the record


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


def _record(plan: Plan, status: str, nodes: list[Node], bastion: str | None,
            binary_version: str = "", applied: bool = True) -> dict[str, Any]:
    """cluster.json of a Terraform cluster. applied: whether Terraform may have made anything
    for it (False only until its first apply starts, or when that apply changed nothing);
    destroy refuses to go on without the state while it is True."""
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
        # a configure touched the hosts (finished or not): destroy must still forget them
        **({"hosts_touched": previous["hosts_touched"]} if previous.get("hosts_touched") else {}),
        "terraform": {
            "workdir": str(plan.workdir),
            "var_file": plan.var_file_copy,
            "var_file_source": str(plan.var_file) if plan.var_file else None,
            "variables": plan.variables,
            "binary": plan.binary,
            "version": binary_version,
            "applied": applied,
        },
    }


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- Terraform's state on disk


# ---------------------------------------------------------------- provision


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
    made = Made()
    tf = Terraform(plan.workdir, binary=plan.binary, env=plan.env())
    _stage_and_plan(plan, tf, version, made)

    # Apply: from here on, cloud resources may exist, and the record says so before Terraform
    # starts (were this process killed, destroy must not go on without the state).
    before = state_serial(plan.workdir)
    try:
        _save_applying(plan, version)
        tf.apply_plan(PLAN_FILE)
        outputs = tf.output()
        recs = nodes_from_outputs(outputs, target, str(plan.key_path))
        _check_nodes(recs, plan.nodes, target)
    except BaseException as exc:
        _after_failed_apply(plan, tf, exc, keep_on_failure, made, before)
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


def _existing_nodes(plan: Plan) -> list[Node]:
    return [Node.from_dict(n) for n in (plan.existing or {}).get("nodes", [])]


def _save_applying(plan: Plan, version: str) -> None:
    status = plan.existing.get("status", "ready") if plan.existing else "provisioning"
    save_cluster(plan.cluster, _record(plan, status, _existing_nodes(plan),
                                       (plan.existing or {}).get("bastion"), version))


def _stage_and_plan(plan: Plan, tf: Terraform, version: str, made: Made) -> None:
    """Stage the module and plan: nothing exists in the cloud yet, so a failure only undoes
    local files (what this call made, or an existing cluster's as they were), and never a
    working directory that holds a state."""
    cluster, cdir = plan.cluster, cluster_dir(plan.cluster)
    if plan.existing and not has_state(plan.workdir) \
            and (plan.existing.get("terraform") or {}).get("applied", True):
        raise ClusterError(f"cannot provision {cluster}: its Terraform state "
                           f"{plan.workdir / STATE_FILE} is missing or empty, and Terraform "
                           "would make everything a second time; put the state file back, or "
                           "delete what the cluster made yourself, run invoke destroy --cluster "
                           f"{cluster} --state-lost, and provision it anew")
    before = snapshot(plan.workdir) if plan.existing else {}
    step = "stage"
    try:
        made.cluster_dir = make_dir(cdir)
        if not plan.existing:
            claim_workdir(plan, made)
            if not (cdir / "cluster.json").exists():
                made.files.append(cdir / "cluster.json")
        if plan.generates_key and not plan.key_path.is_file():
            made.files += [plan.key_path, plan.key_path.with_name(plan.key_path.name + ".pub")]
            plan.variables["ssh_public_key"] = generate_key(plan.key_path,
                                                            f"scalelab-{cluster}")
        known_hosts = cdir / "known_hosts"
        if not known_hosts.exists():
            made.files.append(known_hosts)
            write_atomic(known_hosts, "", mode=0o600)
        stage(plan)
        status = plan.existing.get("status", "ready") if plan.existing else "provisioning"
        applied = bool(((plan.existing or {}).get("terraform") or {}).get("applied", True)) \
            if plan.existing else False
        save_cluster(cluster, _record(plan, status, _existing_nodes(plan),
                                      (plan.existing or {}).get("bastion"), version, applied))
        step = "init"
        tf.init()
        if (plan.workdir / ERRORED_FILE).exists():
            step = "push"
            push_errored(tf, plan.workdir)
        step = "plan"
        tf.plan(PLAN_FILE, var_file=plan.var_file_copy, variables=plan.variables)
    except BaseException as exc:
        kept = ""
        if plan.existing:
            restore(plan.workdir, before)
            save_cluster(cluster, plan.existing)
        elif made.workdir and state_files(plan.workdir):
            # another provision of this cluster wrote a state here meanwhile (or holds it)
            kept = (f"; kept {plan.workdir} and the cluster's record: it holds a Terraform "
                    f"state another provision of {cluster} wrote "
                    f"({', '.join(state_files(plan.workdir))}); see invoke status --cluster "
                    f"{cluster}")
        else:
            remove_made(plan, made)
        if isinstance(exc, TerraformError):
            if "Error acquiring the state lock" in (exc.stderr or ""):
                fix = f"wait for the other Terraform run on {cluster} to end"
            elif step == "plan":
                fix = "fix the var-file" + (f" ({plan.var_file})" if plan.var_file else "")
            else:
                fix = "fix the cause"
            raise TerraformError(f"{plan.target}: {str(exc).rstrip('.')}; {fix} and retry; "
                                 f"nothing was created{kept}", stderr=exc.stderr) from None
        if kept and isinstance(exc, Exception):
            raise ClusterError(f"{plan.target}: {str(exc).rstrip('.')}{kept}") from None
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


def _after_failed_apply(plan: Plan, tf: Terraform, exc: BaseException, keep_on_failure: bool,
                        made: Made, before: tuple[str, int] | None) -> None:
    """Say what a failed apply left, and undo it where that is safe: Terraform is asked, and a
    working directory holding a state is never removed unless Terraform says it lists nothing."""
    cluster, workdir = plan.cluster, plan.workdir
    reason = str(exc) or type(exc).__name__
    cause = exc if isinstance(exc, Exception) else None
    unsaved = unsaved_note(workdir)
    stderr = getattr(exc, "stderr", "") or ""
    # Terraform saves its local state after each resource it makes: an unchanged state (and no
    # errored.tfstate) means it made nothing, as do its own words for a plan it did not apply
    nothing = not unsaved and (state_serial(workdir) == before
                               or bool(_APPLIED_NOTHING.search(stderr)))

    def failed(applied: bool = True) -> None:
        save_cluster(cluster, {**_record(plan, "failed", _existing_nodes(plan),
                                         (plan.existing or {}).get("bastion"),
                                         applied=applied),
                               "error": redact(reason)})

    if plan.existing:
        failed()
        raise ProvisionError(f"updating {cluster} failed: {reason}; the cluster is as Terraform "
                             "left it: fix the cause and run provision again, or invoke destroy "
                             f"--cluster {cluster}{unsaved}") from cause
    if nothing and state_files(workdir):
        # the state is another provision's (it applied between this one's plan and apply, or
        # holds the lock): Terraform applied none of this one, and that state stays
        raise ProvisionError(f"provisioning {cluster} failed: {reason}; Terraform applied none "
                             f"of it, and {workdir} holds a state another provision of "
                             f"{cluster} wrote ({', '.join(state_files(workdir))}): kept, with "
                             f"the cluster's record (invoke status --cluster {cluster})") \
            from None
    if keep_on_failure:
        failed(applied=not nothing)
        raise ClusterError(f"provisioning {cluster} failed: {reason}; kept what was created "
                           f"(--keep-on-failure), state in {workdir}; remove it with: "
                           f"invoke destroy --cluster {cluster}{unsaved}") from None
    if nothing:
        remove_made(plan, made)
        if isinstance(exc, KeyboardInterrupt):
            raise exc
        raise ProvisionError(f"provisioning {cluster} failed: {reason}; Terraform applied none "
                             "of it, and nothing of it is left") from None
    log.warning("provisioning %s failed; destroying what was created", cluster)
    try:
        if unsaved:
            push_errored(tf, workdir)
        tf.destroy(var_file=plan.var_file_copy, variables=plan.variables)
        check_destroyed(tf, workdir)
    except TerraformError as derr:
        failed()
        raise ProvisionError(f"provisioning {cluster} failed: {reason}; destroying what it "
                             f"created failed too ({derr}); state kept in {workdir}: retry "
                             f"with invoke destroy --cluster {cluster}{unsaved_note(workdir)}") \
            from None
    # Terraform's state lists nothing: the working directory this call made may go
    remove_made(plan, made)
    inventory.remove(cluster)
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    raise ProvisionError(f"provisioning {cluster} failed: {reason}; everything it created was "
                         "destroyed") from None


# ---------------------------------------------------------------- destroy


def accept_lost_state(cluster: str) -> None:
    """Record that the cluster's Terraform state is lost and what it made was deleted by hand,
    so that destroy removes the rest without Terraform (while the state file is missing)."""
    check_cluster_name(cluster)
    rec, _ = terraform_record(cluster)
    rec["terraform"] = {**(rec.get("terraform") or {}), "state_lost_at": _now()}
    save_cluster(cluster, rec)


def destroy(cluster: str) -> None:
    """terraform destroy, checked with Terraform's state, then remove the cluster's state dir
    and inventory. Refused, with the record kept, while Terraform cannot say the cluster's
    resources are gone."""
    check_cluster_name(cluster)
    rec, workdir = terraform_record(cluster)
    meta = rec.get("terraform") or {}
    if has_state(workdir):
        # the binary that applied the state, where it still is: another may read it otherwise
        used = meta.get("binary")
        binary = used if used and os.sep in used and os.access(used, os.X_OK) else None
        tf = Terraform(workdir, binary=binary,
                       env={"TF_PLUGIN_CACHE_DIR": str(plugin_cache_dir())})
        try:
            tf.init()
            if (workdir / ERRORED_FILE).exists():
                push_errored(tf, workdir)
            tf.destroy(var_file=meta.get("var_file"), variables=meta.get("variables") or {})
            check_destroyed(tf, workdir)
        except TerraformError as exc:
            raise TerraformError(f"destroying {cluster} failed: {str(exc).rstrip('.')}; the "
                                 f"record and the state are kept in {workdir}: fix the cause "
                                 f"and rerun invoke destroy --cluster {cluster}"
                                 f"{unsaved_note(workdir)}",
                                 stderr=exc.stderr) from None
    elif meta.get("applied", True) and not meta.get("state_lost_at"):
        raise ClusterError(missing_state(cluster, workdir))
    else:
        log.warning("%s: no Terraform state (%s), so Terraform is not run; removing the record",
                    cluster, "lost, as told" if meta.get("state_lost_at")
                    else "Terraform never applied anything for it")
    inventory.remove(cluster)
    try:
        shutil.rmtree(cluster_dir(cluster))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ClusterError(f"destroyed {cluster} (Terraform's state lists nothing), but could "
                           f"not remove {cluster_dir(cluster)}: {exc}; remove it by hand") \
            from None
    log.info("destroyed %s cluster %s", rec.get("target"), cluster)


# ---------------------------------------------------------------- the Target interface


class TerraformTarget(SshReachable):
    """The Target interface (scalelab.cluster.targets) of static, openstack and aws clusters.

    Their nodes are real hosts: the training stack is what configure installed there, the
    cluster interface is what configure found (scalelab.cluster.facts), and link rates are set by
    the sweep driver with tc over SSH and put back afterwards (scalelab.cluster.netshape.SshLinks).
    """

    def __init__(self, name: str) -> None:
        target_module(name)
        self.name = name

    def capabilities(self, rec: dict[str, Any]) -> Any:
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
        return runtime_from_facts(rec)

    def links(self, cluster: str, rec: dict[str, Any], nodes: list[Node]) -> Any:
        return SshLinks(nodes, rec["known_hosts"])

    def set_rate(self, cluster: str, mbit: float | None) -> None:
        raise InputError(f"cluster {cluster} is a {self.name} cluster: its links are shaped per "
                         "run by invoke bench --bandwidth (and restored after), not here")


def target(name: str) -> TerraformTarget:
    return TerraformTarget(name)
