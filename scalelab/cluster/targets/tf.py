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

Terraform's state is the one record of what exists in a cloud, so it is handled as such: a
failed provision removes only what that very call made, never a working directory that holds
a state; destroy refuses to run without the state (unless told it is lost), pushes back a state
Terraform could not save (errored.tfstate), and calls a cluster destroyed only when Terraform's
state lists nothing.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import os
import re
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
BACKUP_FILE = STATE_FILE + ".backup"  # the state before Terraform's last write
# Where Terraform (in its working directory) puts a state it could not save in STATE_FILE.
ERRORED_FILE = "errored.tfstate"
LOCK_INFO = ".terraform.tfstate.lock.info"  # present while a Terraform run holds the state
# Terraform's own words for an apply that changed nothing: its plan could not be read, the
# state changed since the plan, or another run holds the state's lock.
_APPLIED_NOTHING = re.compile(r'Saved plan is stale|Failed to load ".*" as a plan file|'
                              r"Error acquiring the state lock")
# node-to-node SSH (mpirun, horovodrun) uses a key pair made for the cluster, never the user's
# login key: configure authorises it on the nodes, destroy removes it from hosts it did not make
TRUST_KEY_NAME = "id_trust"
# RFC 5737 documentation ranges: never routed, so never probed either.
_DOC_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24",
                                               "203.0.113.0/24")]


# ---------------------------------------------------------------- keys, staging, the record


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


def state_serial(workdir: Path, name: str = STATE_FILE) -> tuple[str, int] | None:
    """(lineage, serial) of a state file in workdir; None where there is none (no file, an
    empty one, or one that is not a state). Terraform writes its local state after each
    resource, so an apply that leaves this unchanged made nothing."""
    try:
        doc = json.loads((workdir / name).read_text() or "null")
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not doc.get("lineage"):
        return None
    return str(doc["lineage"]), int(doc.get("serial") or 0)


def state_files(workdir: Path) -> list[str]:
    """The files in workdir that say a Terraform state lives there or a run holds it."""
    return [n for n in (STATE_FILE, BACKUP_FILE, ERRORED_FILE, LOCK_INFO)
            if (workdir / n).exists()]


def _has_state(workdir: Path) -> bool:
    """Whether there is a state for Terraform to work from (errored.tfstate counts: it is
    pushed back first)."""
    state = workdir / STATE_FILE
    return (workdir / ERRORED_FILE).is_file() or (state.is_file() and state.stat().st_size > 0)


def _push_errored(tf: Terraform, workdir: Path) -> None:
    """Put back the state Terraform could not save last time (it left it in errored.tfstate), so
    that what it does next starts from what it really made, not from the older state file.

    Terraform keeps the serial it had in errored.tfstate, so a plain push is refused as "the
    same serial"; it is forced once lineage and serial show it is this state, no older."""
    errored = workdir / ERRORED_FILE
    theirs, ours = state_serial(workdir, ERRORED_FILE), state_serial(workdir)
    if theirs is None or (ours is not None and (ours[0] != theirs[0] or ours[1] > theirs[1])):
        raise TerraformError(f"{errored} is not the latest version of {workdir / STATE_FILE} "
                             f"(lineage and serial {theirs} against {ours}); keep the one that "
                             "lists what exists as terraform.tfstate, and remove the other")
    log.warning("%s holds the state Terraform could not save last time; pushing it back",
                errored)
    tf.state_push(ERRORED_FILE, force=True)
    errored.unlink()


def _check_destroyed(tf: Terraform, workdir: Path) -> None:
    """Terraform's own word that nothing is left: its state lists no resource and was saved.
    Data sources (data.*) are only reads, and cost nothing."""
    if (workdir / ERRORED_FILE).exists():
        raise TerraformError("Terraform could not save its state after destroying")
    left = [a for a in tf.state_list() if not (a.startswith("data.") or ".data." in a)]
    if left:
        more = f" and {len(left) - 3} more" if len(left) > 3 else ""
        raise TerraformError(f"Terraform's state still lists {len(left)} resource(s): "
                             f"{', '.join(left[:3])}{more}")


def _unsaved(workdir: Path) -> str:
    """What to say when Terraform could not save its state (an empty string when it could)."""
    if not (workdir / ERRORED_FILE).exists():
        return ""
    return (f"; Terraform could not save its state, and what it knows is in "
            f"{workdir / ERRORED_FILE}: fix the cause (a full or read-only disk), and the next "
            "provision or destroy of this cluster pushes it back first")


@dataclass
class _Made:
    """What one provision call made itself: the only things its failure may remove."""

    cluster_dir: bool = False
    workdir: bool = False
    files: list[Path] = field(default_factory=list)


def _make_dir(path: Path) -> bool:
    """Create a 0700 directory; whether this call made it (mkdir is atomic: of two calls
    racing for one directory, only one is told it did)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
        made = True
    except FileExistsError:
        made = False
    os.chmod(path, 0o700)
    return made


def _remove_made(plan: Plan, made: _Made) -> None:
    """Remove what this call made. Its working directory goes only while no Terraform run
    holds it (the lock file); the cluster directory only when nothing else is left in it."""
    for path in made.files:
        path.unlink(missing_ok=True)
    if made.workdir and not (plan.workdir / LOCK_INFO).exists():
        shutil.rmtree(plan.workdir, ignore_errors=True)
    if made.cluster_dir:
        try:
            os.rmdir(cluster_dir(plan.cluster))
        except OSError:
            log.info("kept %s: it holds files this provision did not make",
                     cluster_dir(plan.cluster))


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
    made = _Made()
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


def _claim_workdir(plan: Plan, made: _Made) -> None:
    """A new cluster's working directory is made by this call, or the call stops here: one
    that is there without a record belongs to another provision of the same name still
    running, or to one whose record was lost, and its state may be all that says what exists."""
    made.workdir = _make_dir(plan.workdir)
    if made.workdir:
        return
    held = state_files(plan.workdir)
    what = f"holds a Terraform state ({', '.join(held)})" if held else "exists"
    raise ClusterError(
        f"cluster {plan.cluster} has no record, but its Terraform working directory "
        f"{plan.workdir} {what}: another provision of {plan.cluster} may be running; wait for "
        f"it, or if none is, check what the state lists (terraform -chdir={plan.workdir} state "
        "list), delete those resources, and remove that directory")


def _stage_and_plan(plan: Plan, tf: Terraform, version: str, made: _Made) -> None:
    """Stage the module and plan: nothing exists in the cloud yet, so a failure only undoes
    local files (what this call made, or an existing cluster's as they were), and never a
    working directory that holds a state."""
    cluster, cdir = plan.cluster, cluster_dir(plan.cluster)
    if plan.existing and not _has_state(plan.workdir) \
            and (plan.existing.get("terraform") or {}).get("applied", True):
        raise ClusterError(f"cannot provision {cluster}: its Terraform state "
                           f"{plan.workdir / STATE_FILE} is missing or empty, and Terraform "
                           "would make everything a second time; put the state file back, or "
                           "delete what the cluster made yourself, run invoke destroy --cluster "
                           f"{cluster} --state-lost, and provision it anew")
    before = _snapshot(plan.workdir) if plan.existing else {}
    step = "stage"
    try:
        made.cluster_dir = _make_dir(cdir)
        if not plan.existing:
            _claim_workdir(plan, made)
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
        _stage(plan)
        status = plan.existing.get("status", "ready") if plan.existing else "provisioning"
        applied = bool(((plan.existing or {}).get("terraform") or {}).get("applied", True)) \
            if plan.existing else False
        save_cluster(cluster, _record(plan, status, _existing_nodes(plan),
                                      (plan.existing or {}).get("bastion"), version, applied))
        step = "init"
        tf.init()
        if (plan.workdir / ERRORED_FILE).exists():
            step = "push"
            _push_errored(tf, plan.workdir)
        step = "plan"
        tf.plan(PLAN_FILE, var_file=plan.var_file_copy, variables=plan.variables)
    except BaseException as exc:
        kept = ""
        if plan.existing:
            _restore(plan.workdir, before)
            save_cluster(cluster, plan.existing)
        elif made.workdir and state_files(plan.workdir):
            # another provision of this cluster wrote a state here meanwhile (or holds it)
            kept = (f"; kept {plan.workdir} and the cluster's record: it holds a Terraform "
                    f"state another provision of {cluster} wrote "
                    f"({', '.join(state_files(plan.workdir))}); see invoke status --cluster "
                    f"{cluster}")
        else:
            _remove_made(plan, made)
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
                        made: _Made, before: tuple[str, int] | None) -> None:
    """Say what a failed apply left, and undo it where that is safe: Terraform is asked, and a
    working directory holding a state is never removed unless Terraform says it lists nothing."""
    cluster, workdir = plan.cluster, plan.workdir
    reason = str(exc) or type(exc).__name__
    cause = exc if isinstance(exc, Exception) else None
    unsaved = _unsaved(workdir)
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
        _remove_made(plan, made)
        if isinstance(exc, KeyboardInterrupt):
            raise exc
        raise ProvisionError(f"provisioning {cluster} failed: {reason}; Terraform applied none "
                             "of it, and nothing of it is left") from None
    log.warning("provisioning %s failed; destroying what was created", cluster)
    try:
        if unsaved:
            _push_errored(tf, workdir)
        tf.destroy(var_file=plan.var_file_copy, variables=plan.variables)
        _check_destroyed(tf, workdir)
    except TerraformError as derr:
        failed()
        raise ProvisionError(f"provisioning {cluster} failed: {reason}; destroying what it "
                             f"created failed too ({derr}); state kept in {workdir}: retry "
                             f"with invoke destroy --cluster {cluster}{_unsaved(workdir)}") \
            from None
    # Terraform's state lists nothing: the working directory this call made may go
    _remove_made(plan, made)
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


def accept_lost_state(cluster: str) -> None:
    """Record that the cluster's Terraform state is lost and what it made was deleted by hand,
    so that destroy removes the rest without Terraform (while the state file is missing)."""
    check_cluster_name(cluster)
    rec, _ = _terraform_record(cluster)
    rec["terraform"] = {**(rec.get("terraform") or {}), "state_lost_at": _now()}
    save_cluster(cluster, rec)


def _missing_state(cluster: str, workdir: Path) -> str:
    backup = workdir / BACKUP_FILE
    older = (f" ({backup} holds the state before Terraform's last change)"
             if backup.is_file() else "")
    return (f"cannot destroy {cluster}: its Terraform state {workdir / STATE_FILE} is missing "
            "or empty, so Terraform cannot tell what to delete; Terraform destroyed nothing and "
            f"the record is kept: put the state file back{older} and rerun, or delete what the "
            "cluster made yourself (in the cloud console; a static cluster makes nothing there) "
            f"and run invoke destroy --cluster {cluster} --state-lost")


def destroy(cluster: str) -> None:
    """terraform destroy, checked with Terraform's state, then remove the cluster's state dir
    and inventory. Refused, with the record kept, while Terraform cannot say the cluster's
    resources are gone."""
    check_cluster_name(cluster)
    rec, workdir = _terraform_record(cluster)
    meta = rec.get("terraform") or {}
    if _has_state(workdir):
        # the binary that applied the state, where it still is: another may read it otherwise
        used = meta.get("binary")
        binary = used if used and os.sep in used and os.access(used, os.X_OK) else None
        tf = Terraform(workdir, binary=binary,
                       env={"TF_PLUGIN_CACHE_DIR": str(plugin_cache_dir())})
        try:
            tf.init()
            if (workdir / ERRORED_FILE).exists():
                _push_errored(tf, workdir)
            tf.destroy(var_file=meta.get("var_file"), variables=meta.get("variables") or {})
            _check_destroyed(tf, workdir)
        except TerraformError as exc:
            raise TerraformError(f"destroying {cluster} failed: {str(exc).rstrip('.')}; the "
                                 f"record and the state are kept in {workdir}: fix the cause "
                                 f"and rerun invoke destroy --cluster {cluster}"
                                 f"{_unsaved(workdir)}",
                                 stderr=exc.stderr) from None
    elif meta.get("applied", True) and not meta.get("state_lost_at"):
        raise ClusterError(_missing_state(cluster, workdir))
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
