"""The working directory of a Terraform cluster, and the state Terraform keeps in it.

For cluster NAME that is ``.scalelab/clusters/NAME/terraform/``: the module's .tf files and the
operator's var-file are staged there, and Terraform keeps ``terraform.tfstate`` there.
Terraform's state is the one record of what exists in a cloud, so it is handled as such: a
provision call removes only what it made itself (``Made``), never a working directory that
holds a state; a state Terraform could not save (errored.tfstate) is pushed back before
Terraform runs there again; and a cluster counts as destroyed only when its state lists nothing.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.cluster.targets.tfmodule import Plan
from scalelab.cluster.terraform import Terraform, TerraformError
from scalelab.core.errors import ClusterError
from scalelab.core.state import cluster_dir, private_dir, write_atomic

log = logging.getLogger(__name__)

STATE_FILE = "terraform.tfstate"
BACKUP_FILE = STATE_FILE + ".backup"  # the state before Terraform's last write
# Where Terraform (in its working directory) puts a state it could not save in STATE_FILE.
ERRORED_FILE = "errored.tfstate"
LOCK_INFO = ".terraform.tfstate.lock.info"  # present while a Terraform run holds the state


# ---------------------------------------------------------------- what is staged there


def snapshot(workdir: Path) -> dict[str, str]:
    """The staged module and var-file of an existing cluster, to put back if an update fails."""
    if not workdir.is_dir():
        return {}
    return {p.name: p.read_text() for p in sorted(workdir.iterdir())
            if p.is_file() and (p.suffix == ".tf" or p.name.startswith("operator.tfvars"))}


def restore(workdir: Path, files: dict[str, str]) -> None:
    for p in list(workdir.glob("*.tf")) + list(workdir.glob("operator.tfvars*")):
        p.unlink()
    for name, text in files.items():
        write_atomic(workdir / name, text, mode=0o600)


def stage(plan: Plan) -> None:
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


def has_state(workdir: Path) -> bool:
    """Whether there is a state for Terraform to work from (errored.tfstate counts: it is
    pushed back first)."""
    state = workdir / STATE_FILE
    return (workdir / ERRORED_FILE).is_file() or (state.is_file() and state.stat().st_size > 0)


def missing_state(cluster: str, workdir: Path) -> str:
    """Why destroy is refused while the state is missing, and what to do instead."""
    backup = workdir / BACKUP_FILE
    older = (f" ({backup} holds the state before Terraform's last change)"
             if backup.is_file() else "")
    return (f"cannot destroy {cluster}: its Terraform state {workdir / STATE_FILE} is missing "
            "or empty, so Terraform cannot tell what to delete; Terraform destroyed nothing and "
            f"the record is kept: put the state file back{older} and rerun, or delete what the "
            "cluster made yourself (in the cloud console; a static cluster makes nothing there) "
            f"and run invoke destroy --cluster {cluster} --state-lost")


def push_errored(tf: Terraform, workdir: Path) -> None:
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


def check_destroyed(tf: Terraform, workdir: Path) -> None:
    """Terraform's own word that nothing is left: its state lists no resource and was saved.
    Data sources (data.*) are only reads, and cost nothing."""
    if (workdir / ERRORED_FILE).exists():
        raise TerraformError("Terraform could not save its state after destroying")
    left = [a for a in tf.state_list() if not (a.startswith("data.") or ".data." in a)]
    if left:
        more = f" and {len(left) - 3} more" if len(left) > 3 else ""
        raise TerraformError(f"Terraform's state still lists {len(left)} resource(s): "
                             f"{', '.join(left[:3])}{more}")


def unsaved_note(workdir: Path) -> str:
    """What to say when Terraform could not save its state (an empty string when it could)."""
    if not (workdir / ERRORED_FILE).exists():
        return ""
    return (f"; Terraform could not save its state, and what it knows is in "
            f"{workdir / ERRORED_FILE}: fix the cause (a full or read-only disk), and the next "
            "provision or destroy of this cluster pushes it back first")


# ---------------------------------------------------------------- what one provision call made


@dataclass
class Made:
    """What one provision call made itself: the only things its failure may remove."""

    cluster_dir: bool = False
    workdir: bool = False
    files: list[Path] = field(default_factory=list)


def make_dir(path: Path) -> bool:
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


def claim_workdir(plan: Plan, made: Made) -> None:
    """A new cluster's working directory is made by this call, or the call stops here: one
    that is there without a record belongs to another provision of the same name still
    running, or to one whose record was lost, and its state may be all that says what exists."""
    made.workdir = make_dir(plan.workdir)
    if made.workdir:
        return
    held = state_files(plan.workdir)
    what = f"holds a Terraform state ({', '.join(held)})" if held else "exists"
    raise ClusterError(
        f"cluster {plan.cluster} has no record, but its Terraform working directory "
        f"{plan.workdir} {what}: another provision of {plan.cluster} may be running; wait for "
        f"it, or if none is, check what the state lists (terraform -chdir={plan.workdir} state "
        "list), delete those resources, and remove that directory")


def remove_made(plan: Plan, made: Made) -> None:
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
