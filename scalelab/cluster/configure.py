"""Configure a cluster with Ansible: the one wrapper around ansible-runner.

Every ansible-runner argument is built in one place (``runner_kwargs``). A run succeeds only
when runner reports status ``successful`` and rc 0; anything else raises ConfigureError, which
names the failed hosts and tasks and carries what Ansible printed. Progress goes to a callback
(the task layer prints it); this module only logs.

Runner's private data directory lives in the cluster's state directory
(``.scalelab/clusters/<name>/ansible``, 0700), so its artifacts (events, facts) stay private
to the operator. Tasks that handle keys or tokens have ``no_log`` in the playbooks, so their
results are censored in those artifacts too.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scalelab.cluster import bundle as bundles
from scalelab.cluster import facts, targets
from scalelab.cluster import image as images
from scalelab.cluster.nodes import Node, nodes_of
from scalelab.core.errors import InputError, ScalelabError
from scalelab.core.state import PROJECT_ROOT, cluster_dir, inventory_dir, load_cluster, private_dir, save_cluster

log = logging.getLogger(__name__)

PLAYBOOK_DIR = PROJECT_ROOT / "playbooks"
SITE = "site.yml"
VERIFY = "verify.yml"
DEFAULT_TIMEOUT_S = 3600
KEEP_ARTIFACTS = 10
_MESSAGE_CHARS = 300

# runner event -> what a host's result is called in Progress.kind
_RESULT_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_skipped": "skipped",
    "runner_on_unreachable": "unreachable",
}
_TEXT_EVENTS = ("verbose", "error", "warning", "deprecated")


class ConfigureError(ScalelabError):
    """Ansible did not configure the cluster; names failed hosts and tasks, carries stderr."""

    def __init__(self, message: str, stderr: str = "",
                 failures: Sequence[Failure] = ()) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.failures = list(failures)


@dataclass(frozen=True)
class Progress:
    """Something the task layer may show: a play or task starting, or one host's result."""

    kind: str  # play | task | ok | changed | skipped | failed | unreachable
    play: str = ""
    task: str = ""
    host: str = ""
    message: str = ""  # first line of the failure message (failed, unreachable)


@dataclass(frozen=True)
class Failure:
    """One task that failed on one host (or a host that could not be reached)."""

    host: str
    task: str
    message: str


@dataclass
class ConfigureResult:
    """What a successful run did, per host, from Ansible's own recap."""

    cluster: str
    playbook: str
    status: str
    rc: int
    duration_s: float
    stats: dict[str, dict[str, int]] = field(default_factory=dict)  # host -> counts
    artifact_dir: Path | None = None

    @property
    def changed(self) -> int:
        return sum(s.get("changed", 0) for s in self.stats.values())


# ------------------------------------------------------------------ pure helpers

def known_tags(playbook_dir: Path = PLAYBOOK_DIR) -> list[str]:
    """The tags site.yml puts on its roles, sorted; configure accepts only these."""
    plays = yaml.safe_load((playbook_dir / SITE).read_text()) or []
    tags: set[str] = set()
    for play in plays:
        for role in play.get("roles", []) or []:
            if isinstance(role, dict):
                tags.update(role.get("tags", []) or [])
    return sorted(tags - {"never"})  # Ansible's own: a role tagged so runs only when named


def parse_tags(tags: Sequence[str] | str | None, allowed: Sequence[str]) -> list[str]:
    """Normalise tags given as a comma list or a sequence; reject unknown ones.

    >>> parse_tags("common, nfs", ["common", "nfs", "pytorch"])
    ['common', 'nfs']
    >>> parse_tags(None, ["common"])
    []
    """
    if tags is None:
        return []
    items = tags.split(",") if isinstance(tags, str) else list(tags)
    out: list[str] = []
    for item in (str(t).strip() for t in items):
        if not item:
            continue
        if item not in allowed:
            raise InputError(f"tags: {item!r} is not a role tag of site.yml; "
                             f"choose from {', '.join(allowed)}")
        if item not in out:
            out.append(item)
    return out


def runner_kwargs(*, private_data_dir: Path, playbook: str, inventory: Path,
                  extravars: Mapping[str, Any], tags: Sequence[str] = (),
                  skip_tags: Sequence[str] = (), check: bool = False, limit: str | None = None,
                  timeout_s: float = DEFAULT_TIMEOUT_S, ident: str = "run",
                  playbook_dir: Path = PLAYBOOK_DIR, path: str | None = None) -> dict[str, Any]:
    """Every argument scalelab passes to ansible_runner.run, in one place.

    >>> kw = runner_kwargs(private_data_dir=Path("/s/ansible"), playbook="site.yml",
    ...                    inventory=Path("/i/c.yml"), extravars={"a": 1}, tags=["nfs"],
    ...                    check=True, playbook_dir=Path("/p"))
    >>> kw["json_mode"], kw["quiet"], kw["tags"], kw["cmdline"], kw["project_dir"]
    (True, True, 'nfs', '--check --diff', '/p')
    """
    kwargs: dict[str, Any] = {
        "private_data_dir": str(private_data_dir),
        "project_dir": str(playbook_dir),
        "playbook": playbook,
        "inventory": str(inventory),
        "extravars": dict(extravars),
        "ident": ident,
        # events, not text: progress and failures come from structured data
        "json_mode": True,
        # the library never prints; the task layer shows progress from the callback
        "quiet": True,
        # nothing of the call (extravars, env) is written under env/
        "suppress_env_files": True,
        "rotate_artifacts": KEEP_ARTIFACTS,
        "timeout": int(timeout_s),
        "envvars": {
            "ANSIBLE_CONFIG": str(playbook_dir / "ansible.cfg"),
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
        },
    }
    if path:
        kwargs["envvars"]["PATH"] = path
    if tags:
        kwargs["tags"] = ",".join(tags)
    if skip_tags:
        kwargs["skip_tags"] = ",".join(skip_tags)
    if limit:
        kwargs["limit"] = limit
    if check:
        kwargs["cmdline"] = "--check --diff"
    return kwargs


def search_path() -> str:
    """PATH with this interpreter's bin directory first, so its ansible-playbook runs even
    when the virtual environment is not activated."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def scrub_command_artifact(artifact_dir: Path) -> None:
    """Drop the environment runner records with the command: it may hold cloud credentials."""
    path = artifact_dir / "command"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(data, dict) and "env" in data:
        data["env"] = {k: v for k, v in data["env"].items() if k.startswith("ANSIBLE_")}
        path.write_text(json.dumps(data))


def _first_line(text: Any) -> str:
    lines = [ln.strip() for ln in str(text or "").splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= _MESSAGE_CHARS else line[: _MESSAGE_CHARS - 3] + "..."


def result_message(res: Mapping[str, Any]) -> str:
    """One line saying why a task failed, from its result; never the hidden output.

    >>> result_message({"msg": "non-zero return code", "rc": 2, "stderr": "x\\nno such file"})
    'non-zero return code (rc 2): no such file'
    >>> result_message({"censored": "the output has been hidden", "msg": "secret"})
    'output hidden (no_log)'
    """
    if res.get("censored"):
        return "output hidden (no_log)"
    msg = _first_line(res.get("msg")) or "failed"
    stderr_lines = [ln for ln in str(res.get("stderr") or "").splitlines() if ln.strip()]
    if "rc" in res and res.get("rc") not in (0, None):
        msg += f" (rc {res['rc']})"
    if stderr_lines:
        msg += f": {_first_line(stderr_lines[-1])}"
    return msg


def progress_from_event(event: Mapping[str, Any]) -> Progress | None:
    """Map one ansible-runner event to a Progress record (None for events not shown).

    >>> e = {"event": "runner_on_ok", "event_data": {"host": "c-n0", "task": "Set the hostname",
    ...      "play": "Prepare", "res": {"changed": True}}}
    >>> progress_from_event(e)
    Progress(kind='changed', play='Prepare', task='Set the hostname', host='c-n0', message='')
    """
    name = event.get("event", "")
    data = event.get("event_data") or {}
    play = str(data.get("play", ""))
    task = str(data.get("task", ""))
    if name == "playbook_on_play_start":
        return Progress("play", play=play)
    if name in ("playbook_on_task_start", "playbook_on_handler_task_start"):
        return Progress("task", play=play, task=task)
    kind = _RESULT_EVENTS.get(name)
    if kind is None:
        return None
    res = data.get("res") or {}
    if kind == "ok" and res.get("changed"):
        kind = "changed"
    message = result_message(res) if kind in ("failed", "unreachable") else ""
    return Progress(kind, play=play, task=task, host=str(data.get("host", "")), message=message)


def failure_from_event(event: Mapping[str, Any]) -> Failure | None:
    """The failure an event reports, if it is one that counts (not ignored, not rescued)."""
    name = event.get("event", "")
    data = event.get("event_data") or {}
    if name == "runner_on_unreachable" or (name == "runner_on_failed"
                                           and not data.get("ignore_errors")):
        return Failure(str(data.get("host", "?")), str(data.get("task", "?")),
                       result_message(data.get("res") or {}))
    return None


def failures_message(cluster: str, playbook: str, status: str, rc: int | None,
                     failures: Sequence[Failure], timeout_s: float, output: str = "") -> str:
    """The one line ConfigureError shows.

    >>> failures_message("demo", "site.yml", "failed", 2,
    ...                  [Failure("demo-n1", "Mount the share", "mount failed (rc 32)"),
    ...                   Failure("demo-n2", "Mount the share", "mount failed (rc 32)")], 60)
    'configure demo (site.yml) failed: demo-n1, demo-n2: task "Mount the share": mount failed (rc 32)'
    """
    if status == "timeout":
        return (f"configure {cluster} ({playbook}) did not finish within {timeout_s:g} s; "
                "the nodes may be half configured, run it again")
    if not failures:
        lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
        why = _first_line(next((ln for ln in lines if "ERROR" in ln), lines[-1] if lines else ""))
        return (f"configure {cluster} ({playbook}) failed before any task ran "
                f"(status {status}, rc {rc}){': ' + why if why else ''}")
    # the same task failing the same way on many hosts is one line naming them all
    groups: dict[tuple[str, str], list[str]] = {}
    for f in failures:
        hosts = groups.setdefault((f.task, f.message), [])
        if f.host not in hosts:
            hosts.append(f.host)
    parts = [f'{", ".join(hosts)}: task "{task}": {message}'
             for (task, message), hosts in groups.items()]
    more = f" (and {len(parts) - 3} more)" if len(parts) > 3 else ""
    return f"configure {cluster} ({playbook}) failed: {'; '.join(parts[:3])}{more}"


def format_progress(p: Progress) -> str | None:
    """A line the task layer can print for a Progress record (None: nothing to show).

    >>> format_progress(Progress("changed", task="Set the hostname", host="c-n0"))
    '  c-n0: changed  Set the hostname'
    >>> format_progress(Progress("play", play="Prepare every node"))
    'PLAY Prepare every node'
    """
    if p.kind == "play":
        return f"PLAY {p.play}"
    if p.kind in ("task", "skipped"):
        return None
    line = f"  {p.host}: {p.kind}  {p.task}"
    return f"{line}: {p.message}" if p.message else line


def _plain_output(artifact_dir: Path, last: int = 40) -> list[str]:
    """Lines of runner's output that are not events: what failed before Ansible started."""
    lines: list[str] = []
    for name in ("stdout", "stderr"):
        try:
            text = (artifact_dir / name).read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("{"):
                lines.append(line)
    return lines[-last:]


def _stats(raw: Mapping[str, Any] | None) -> dict[str, dict[str, int]]:
    """Turn runner's recap ({'ok': {host: n}, 'dark': ...}) into host -> counts."""
    names = {"ok": "ok", "changed": "changed", "failures": "failed", "skipped": "skipped",
             "dark": "unreachable", "rescued": "rescued", "ignored": "ignored"}
    out: dict[str, dict[str, int]] = {}
    for key, label in names.items():
        for host, n in ((raw or {}).get(key) or {}).items():
            out.setdefault(host, {v: 0 for v in names.values()})[label] = int(n)
    return out


# ------------------------------------------------------------------ the wrapper

def _before_site(cluster: str, rec: dict[str, Any], nodes: list[Node], check: bool,
                 limit: str | None) -> tuple[list[Node], str | None]:
    """Every node probed and checked before site.yml changes anything (facts); hosts listed
    without a name take their own first (in check mode: said, not done). Returns the nodes and
    the --limit pattern under their names."""
    found = facts.probe(nodes, rec["known_hosts"])
    facts.check_interfaces(cluster, nodes, found)
    if check:
        for label, own in facts.own_names(nodes, found).items():
            log.info("check: node %s would take its host's name %s", label, own)
        return nodes, limit
    facts.check_sudo(cluster, nodes, found)
    return facts.adopt_hostnames(cluster, nodes, found, limit)


def run(cluster: str, tags: Sequence[str] | str | None = None, check: bool = False,
        extravars: Mapping[str, Any] | None = None,
        progress: Callable[[Progress], None] | None = None, *,
        playbook: str = SITE, skip_tags: Sequence[str] | str | None = None,
        limit: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
        bundle: str | Path | None = None, image: str | Path | None = None) -> ConfigureResult:
    """Apply playbooks/site.yml (or another playbook there) to a cluster.

    tags/skip_tags pick roles by their site.yml tags; check runs Ansible in check mode with
    diffs; extravars override role defaults (e.g. {"netshape_rate": "1gbit"}); progress gets a
    Progress record per play, task and host result; bundle: an offline bundle made by
    `invoke bundle` that the roles install from (hosts without internet); image: a training
    image archive made by `invoke image`, which the docker_nvidia role loads on every node
    (recorded as the cluster's "image" once configure succeeded). Raises ConfigureError unless
    every host succeeded.

    Before Ansible changes anything, every node is probed (scalelab.cluster.facts): an unreachable
    node, a node without an interface holding its cluster address, or a bundle that lacks a
    package is refused then, with nothing changed on any host. After a successful site.yml
    run the facts (interface, cores, memory, GPUs, interpreter, workdir) are recorded in the
    cluster record, where bench and the report read them.
    """
    import ansible_runner  # heavy import, only when configuring

    rec = load_cluster(cluster)  # raises ClusterError with a hint when unknown
    variables_extra, image_meta = _offline_inputs(cluster, rec, tags, bundle, image)
    if not targets.capabilities(rec).configurable:
        raise InputError(f"cluster {cluster} is reached through its "
                         "login host only: scalelab installs nothing there; its facts came from "
                         "sinfo at provision, its training stack is the var-file's python")
    inventory = inventory_dir() / f"{cluster}.yml"
    if not inventory.exists():
        raise ConfigureError(f"configure {cluster}: inventory {inventory} is missing; "
                             f"provision the cluster again (invoke provision --cluster {cluster})")
    if not (PLAYBOOK_DIR / playbook).exists():
        raise InputError(f"playbook: {playbook!r} is not in {PLAYBOOK_DIR}")
    allowed = known_tags()
    tag_list = parse_tags(tags, allowed)
    skip_list = parse_tags(skip_tags, allowed)

    nodes = nodes_of(rec)
    if playbook == SITE:
        nodes, limit = _before_site(cluster, rec, nodes, check, limit)
        if not check:
            mark_touched(cluster, image_meta)

    state = cluster_dir(cluster)
    private = private_dir(state / "ansible")
    private_dir(private / "artifacts")
    ident = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    variables = {"scalelab_state_dir": str(state), **variables_extra, **dict(extravars or {})}
    kwargs = runner_kwargs(private_data_dir=private, playbook=playbook, inventory=inventory,
                           extravars=variables, tags=tag_list, skip_tags=skip_list, check=check,
                           limit=limit, timeout_s=timeout_s, ident=ident,
                           path=search_path())

    failures: list[Failure] = []
    text: list[str] = []
    on_event = _event_handler(progress, failures, text)
    log.info("configure %s (%s target): %s tags=%s check=%s", cluster, rec.get("target"),
             playbook, ",".join(tag_list) or "all", check)
    started = time.monotonic()
    try:
        runner = ansible_runner.run(event_handler=on_event, **kwargs)
    except Exception as exc:  # runner's own errors: bad arguments, missing executables
        raise ConfigureError(f"configure {cluster}: ansible-runner could not start: {exc}",
                             stderr=str(exc)) from exc
    duration = time.monotonic() - started
    artifact_dir = private / "artifacts" / ident
    if artifact_dir.exists():
        os.chmod(artifact_dir, 0o700)
        scrub_command_artifact(artifact_dir)

    status, rc = runner.status, runner.rc
    if status != "successful" or rc != 0:
        stderr = "\n".join(text[-40:] + _plain_output(artifact_dir))
        raise ConfigureError(
            failures_message(cluster, playbook, status, rc, failures, timeout_s, stderr),
            stderr=stderr, failures=failures)
    result = ConfigureResult(cluster=cluster, playbook=playbook, status=status, rc=rc,
                             duration_s=duration, stats=_stats(runner.stats),
                             artifact_dir=artifact_dir)
    log.info("configure %s: %s in %.1f s, %d changes", cluster, playbook, duration,
             result.changed)
    if playbook == SITE and not check:
        done = facts.record(cluster, facts.probe(nodes, rec["known_hosts"]))
        if image_meta is not None and "docker_nvidia" in (tag_list or ["docker_nvidia"]):
            done["image"] = {k: image_meta.get(k) for k in ("id", "tag", "contents", "workloads")}
            done["image"]["archive"] = str(Path(image).expanduser().resolve())
            save_cluster(cluster, done)
    return result


def mark_touched(cluster: str, image_meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Record, before Ansible first changes a host, that configure touched the cluster's hosts
    (``hosts_touched``: since when, and the training image tags it may load): destroy runs
    forget for such a cluster on hosts scalelab did not make, whether that configure finished,
    failed or was killed. Returns the record."""
    rec = load_cluster(cluster)
    touched = dict(rec.get("hosts_touched") or {})
    touched.setdefault("since", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    tag = (image_meta or {}).get("tag")
    if tag and tag not in touched.setdefault("image_tags", []):
        touched["image_tags"].append(tag)
    if touched != rec.get("hosts_touched"):
        rec["hosts_touched"] = touched
        save_cluster(cluster, rec)
    return rec


def touched(rec: Mapping[str, Any]) -> bool:
    """Whether a configure may have changed the cluster's hosts (forget then has work to do):
    one started since scalelab records it, or one finished before that."""
    return bool(rec.get("hosts_touched") or rec.get("configured_at"))


def _offline_inputs(cluster: str, rec: dict[str, Any], tags: Sequence[str] | str | None,
                    bundle: str | Path | None,
                    image: str | Path | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The variables an offline bundle and a training image add, each checked before any host
    is touched (a bundle that lacks a package, an image archive unreadable, nodes that cannot
    run an engine); and the image's metadata."""
    variables: dict[str, Any] = {}
    if bundle:
        bundle_dir = Path(bundle).expanduser().resolve()
        # without --tags slurm, a bundle made before the slurm role (or without its debs) serves
        apt, reqs = bundles.default_contents(slurm="slurm" in parse_tags(tags, known_tags()))
        bundles.check(bundle_dir, apt, reqs)
        variables["scalelab_bundle_dir"] = str(bundle_dir)
    image_meta = None
    if image:
        image_meta = images.read_meta(Path(image))  # ImageError with the fix, before any host
        if not targets.capabilities(rec).containers:
            raise InputError(f"--image: the nodes of cluster {cluster} cannot run a Docker "
                             "engine; train on the host (invoke bench --runtime host)")
        variables.update({
            "docker_nvidia_image_archive": str(Path(image).expanduser().resolve()),
            "docker_nvidia_image_tag": image_meta["tag"],
            "docker_nvidia_image_id": image_meta["id"]})
    return variables, image_meta


def _event_handler(progress: Callable[[Progress], None] | None, failures: list[Failure],
                   text: list[str]) -> Callable[[dict[str, Any]], bool]:
    """ansible-runner's event handler: progress to the caller, failures and text collected."""

    def on_event(event: dict[str, Any]) -> bool:
        p = progress_from_event(event)
        if p is not None:
            if p.kind in ("failed", "unreachable"):
                log.warning("%s %s on %s: %s", p.task, p.kind, p.host, p.message)
            else:
                log.debug("%s %s %s %s", p.kind, p.host, p.play, p.task)
            if progress is not None:
                progress(p)
        f = failure_from_event(event)
        if f is not None:
            failures.append(f)
        if event.get("event") in _TEXT_EVENTS and event.get("stdout"):
            text.append(str(event["stdout"]))
        return True  # keep the event in the artifacts

    return on_event


def verify(cluster: str, tags: Sequence[str] | str | None = None,
           progress: Callable[[Progress], None] | None = None,
           timeout_s: float = 900) -> ConfigureResult:
    """Check a configured cluster against its observable state (playbooks/verify.yml)."""
    return run(cluster, tags=tags, progress=progress, playbook=VERIFY, timeout_s=timeout_s)


FORGET = "forget.yml"
# What configure leaves on hosts scalelab did not make, on purpose, and why (destroy prints
# each; the README lists them). Everything else playbooks/forget.yml takes back.
KEPT_ON_HOSTS = (
    "/opt/scalelab (the training stack: venv, workloads, Horovod's build; others may run "
    "from it; remove it with sudo rm -rf /opt/scalelab when no one does)",
    "Debian packages configure installed where they were missing (base tools such as "
    "iperf3, rsync, python3-venv; nfs-common or nfs-kernel-server with nfs; docker.io with "
    "Docker; chrony where common_time_sync was set; Slurm, munge and MariaDB with --tags "
    "slurm): others may use them by now and apt would take their dependants too; "
    "/var/log/apt/history.log lists them",
    "the services of those packages, running and enabled (the NFS server, with no export of "
    "scalelab's; Docker, with its iptables chains and FORWARD policy; chrony): stopping them "
    "would stop others' work; Docker's daemon.json is as the host had it, which the engine "
    "reads at its next restart",
    "the shared directory /srv/scalelab on the head node where it holds data (datasets, "
    "results, the Horovod wheel cache): scalelab never deletes data; its export and mounts "
    "are gone",
    "with --tags slurm only: Slurm's and munge's configuration and key, and the accounting "
    "database: a Slurm cluster was asked for; take it down with the host's admins",
)


def forget(cluster: str, timeout_s: float = 600.0) -> ConfigureResult:
    """Take back what configure added to the hosts of a cluster scalelab did not make
    (playbooks/forget.yml: JupyterLab, the share and its export, Docker's settings and the
    training image, the trust key and its authorisation, SSH client config, pinned host keys,
    /etc/hosts); what stays is KEPT_ON_HOSTS. ConfigureError names the hosts it could not
    reach."""
    rec = load_cluster(cluster)
    images = list((rec.get("hosts_touched") or {}).get("image_tags") or [])
    recorded = (rec.get("image") or {}).get("tag")
    if recorded and recorded not in images:
        images.append(recorded)
    return run(cluster, playbook=FORGET, timeout_s=timeout_s,
               extravars={"docker_nvidia_forget_images": images})


def jupyter_tunnel(cluster: str, port: int = 8888) -> str:
    """The command that opens a cluster's JupyterLab on the controller: an SSH tunnel to the
    loopback address the head node serves it on (it never listens on a network), through
    the bastion where there is one; then http://127.0.0.1:PORT/lab with the token of
    .scalelab/clusters/NAME/jupyter_token."""
    rec = load_cluster(cluster)
    head = next((n for n in nodes_of(rec) if n.role == "head"), None)
    if head is None:
        raise InputError(f"cluster {cluster} has no head node to serve JupyterLab")
    hop = f"-J {head.bastion} " if head.bastion else ""
    port_opt = f"-p {head.ssh_port} " if head.ssh_port not in (22, None) else ""
    return (f"ssh -N {hop}{port_opt}-L {int(port)}:127.0.0.1:{int(port)} "
            f"{head.ssh_user}@{head.address}")
