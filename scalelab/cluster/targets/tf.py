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
import difflib
import importlib
import ipaddress
import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import hcl2

from scalelab.cluster import inventory
from scalelab.cluster.nodes import Node, nodes_from_outputs, nodes_of
from scalelab.cluster.targets import TERRAFORM_TARGETS
from scalelab.cluster.targets.interface import SshReachable
from scalelab.cluster.terraform import (
    BASE_ENV,
    BINARY_ENV,
    Terraform,
    TerraformError,
    find_binary,
    meets,
    redact,
    required_version,
)
from scalelab.core.errors import ClusterError, InputError, ProvisionError
from scalelab.core.state import (
    PROJECT_ROOT,
    check_cluster_name,
    cluster_dir,
    load_cluster,
    private_dir,
    save_cluster,
    state_root,
    write_atomic,
)

log = logging.getLogger(__name__)

MODULES_DIR = PROJECT_ROOT / "terraform"
# Variables scalelab sets with -var on every run; a var-file must not set them.
SCALELAB_VARS = ("cluster_name", "nodes", "ssh_public_key")
CONTRACT_OUTPUTS = ("nodes", "ssh_user", "bastion_ip")
NODE_KEYS = ("public_ip", "private_ip", "role", "gpus", "ssh_user")
PLAN_FILE = "scalelab.tfplan"
STATE_FILE = "terraform.tfstate"
KEY_NAME = "id_ed25519"
# node-to-node SSH (mpirun, horovodrun) uses a key pair made for the cluster, never the user's
# login key: configure authorises it on the nodes, destroy removes it from hosts it did not make
TRUST_KEY_NAME = "id_trust"
# RFC 5737 documentation ranges: never routed, so never probed either.
_DOC_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24",
                                               "203.0.113.0/24")]


# ---------------------------------------------------------------- module introspection


@dataclass(frozen=True)
class Variable:
    """One `variable` block of a module's variables.tf."""

    name: str
    type: str
    description: str
    required: bool  # no default
    default: Any = None


def target_module(target: str) -> ModuleType:
    """scalelab.cluster.targets.<target> for a Terraform target; InputError for anything else."""
    if target not in TERRAFORM_TARGETS:
        hint = "; local clusters are not made by Terraform" if target == "local" else ""
        raise InputError(f"target: {target!r} is unknown to Terraform; choose one of "
                         f"{', '.join(TERRAFORM_TARGETS)}{hint}")
    return importlib.import_module(f"scalelab.cluster.targets.{target}")


def module_dir(target: str) -> Path:
    target_module(target)
    path = MODULES_DIR / target
    if not (path / "variables.tf").is_file():
        raise ClusterError(f"terraform/{target}/variables.tf is missing from {MODULES_DIR}; "
                           "restore the module from the repository")
    return path


def parse_hcl(path: Path) -> dict[str, Any]:
    """A .tf or .tfvars file as python-hcl2 reads it, with plain (unquoted) strings."""
    text = Path(path).read_text()
    try:
        from hcl2.utils import SerializationOptions  # python-hcl2 >= 7
    except ImportError:  # older python-hcl2 already returns plain strings
        return hcl2.loads(text)
    wanted = {"strip_string_quotes": True, "explicit_blocks": False, "with_comments": False}
    known = {f.name for f in dataclasses.fields(SerializationOptions)}
    opts = SerializationOptions(**{k: v for k, v in wanted.items() if k in known})
    return hcl2.loads(text, serialization_options=opts)


def _blocks(parsed: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in parsed.get(kind, []):
        for name, body in item.items():
            out[name.strip('"')] = body
    return out


def _unwrap(expr: Any) -> str:
    s = str(expr)
    return s[2:-1] if s.startswith("${") and s.endswith("}") else s


def read_variables(module: Path) -> dict[str, Variable]:
    """The variables a module declares (from every .tf file in it), by name."""
    found: dict[str, Variable] = {}
    for tf in sorted(Path(module).glob("*.tf")):
        for name, body in _blocks(parse_hcl(tf), "variable").items():
            found[name] = Variable(name=name, type=_unwrap(body.get("type", "any")),
                                   description=str(body.get("description", "")),
                                   required="default" not in body,
                                   default=body.get("default"))
    return found


def read_outputs(module: Path) -> dict[str, dict[str, Any]]:
    """The outputs a module declares: name -> {"description", "value"} (value as text)."""
    found: dict[str, dict[str, Any]] = {}
    for tf in sorted(Path(module).glob("*.tf")):
        for name, body in _blocks(parse_hcl(tf), "output").items():
            found[name] = {"description": str(body.get("description", "")),
                           "value": _unwrap(body.get("value", ""))}
    return found


# ---------------------------------------------------------------- input checks (pure)


def parse_nodes(nodes: int | str) -> int:
    """--nodes as a whole number >= 1.

    >>> parse_nodes("3")
    3
    """
    try:
        if isinstance(nodes, bool):
            raise ValueError
        n = int(str(nodes).strip())
    except ValueError:
        raise InputError(f"nodes: {nodes!r} is not a whole number; give e.g. --nodes 2") from None
    if n < 1:
        raise InputError(f"nodes: {n} is too few; a cluster needs at least 1 node (the head)")
    return n


def load_var_file(path: Path | str) -> dict[str, Any]:
    """Read a .tfvars.json or .tfvars file into a dict (InputError, one line, when unreadable)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputError(f"var-file {path} does not exist; pass --var-file with a .tfvars.json "
                         "or .tfvars file (see terraform/<target>/examples/minimal/)")
    try:
        if path.name.endswith(".json"):
            data = json.loads(path.read_text())
        else:
            data = parse_hcl(path)
    except Exception as exc:  # json.JSONDecodeError, lark's parse errors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"var-file {path} cannot be parsed ({first}); fix its syntax") from None
    if not isinstance(data, dict):
        raise InputError(f"var-file {path} must hold variable = value pairs (a JSON object)")
    return data


def check_values(target: str, values: Mapping[str, Any], declared: Mapping[str, Variable],
                 var_file: Path | None) -> None:
    """Refuse unknown keys, keys scalelab sets itself and missing required variables.

    >>> v = {"region": Variable("region", "string", "AWS region.", True)}
    >>> check_values("aws", {"regoin": "x"}, v, Path("my.tfvars.json"))
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: var-file my.tfvars.json: unknown variable 'regoin' for target aws (did you mean 'region'?); remove it or fix its name (known: region)
    """
    where = f"var-file {var_file}" if var_file else "no var-file"
    for key in values:
        if key in SCALELAB_VARS:
            flag = {"cluster_name": "--cluster", "nodes": "--nodes"}.get(key)
            how = f"use {flag} instead" if flag else "scalelab sets it"
            raise InputError(f"{where}: {key!r} is set by scalelab, not the var-file; remove it "
                             f"({how})")
        if key not in declared:
            close = difflib.get_close_matches(key, list(declared), n=1)
            guess = f" (did you mean {close[0]!r}?)" if close else ""
            known = ", ".join(k for k in declared if k not in SCALELAB_VARS)
            raise InputError(f"{where}: unknown variable {key!r} for target {target}{guess}; "
                             f"remove it or fix its name (known: {known})")
    for var in declared.values():
        if var.required and var.name not in SCALELAB_VARS and var.name not in values:
            desc = _first_sentence(var.description)
            how = f"set it in {var_file}" if var_file else "pass --var-file with it"
            raise InputError(f"target {target} needs variable {var.name!r} ({desc}); {how} "
                             f"(example: terraform/{target}/examples/minimal/)")


def _first_sentence(text: str) -> str:
    """
    >>> _first_sentence("IPv4 range, e.g. 203.0.113.7/32: the source. More.")
    'IPv4 range, e.g. 203.0.113.7/32: the source'
    """
    return re.split(r"(?<!e\.g)(?<!i\.e)\.(?:\s|$)", text.strip(), maxsplit=1)[0]


def node_quota(values: Mapping[str, Any], declared: Mapping[str, Variable]) -> int | None:
    """max_nodes from the var-file, else the module's default; None when there is none."""
    if "max_nodes" in values:
        raw = values["max_nodes"]
    elif "max_nodes" in declared:
        raw = declared["max_nodes"].default
    else:
        return None
    if raw is None:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise InputError(f"max_nodes: {raw!r} is not a whole number; fix it in the var-file") \
            from None


def check_quota(nodes: int, quota: int | None, var_file: Path | None) -> None:
    """Refuse --nodes beyond the quota before Terraform runs.

    >>> check_quota(5, 4, Path("aws.tfvars.json"))
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: nodes: --nodes 5 is beyond the quota max_nodes = 4 (aws.tfvars.json); ask for fewer nodes or raise max_nodes in the var-file
    """
    if quota is not None and nodes > quota:
        src = str(var_file) if var_file else "the module's default"
        raise InputError(f"nodes: --nodes {nodes} is beyond the quota max_nodes = {quota} "
                         f"({src}); ask for fewer nodes or raise max_nodes in the var-file")


def contract_outputs(nodes: list[Node], bastion_ip: str | None = None) -> dict[str, Any]:
    """Node records as the outputs contract (what `terraform output -json` gives), so any target,
    local included, can be held to it. Inverse of scalelab.cluster.nodes.nodes_from_outputs.

    >>> n = Node("c-n0", "10.1.0.10", "10.1.0.10", "head", "local", ssh_user="root", gpus=0)
    >>> contract_outputs([n])["nodes"]["value"]["c-n0"]["role"]
    'head'
    """
    user = nodes[0].ssh_user if nodes else "root"
    return {
        "nodes": {"value": {n.name: {"public_ip": None if bastion_ip else n.address,
                                     "private_ip": n.private_address, "role": n.role,
                                     "gpus": n.gpus, "ssh_user": n.ssh_user} for n in nodes}},
        "ssh_user": {"value": user},
        "bastion_ip": {"value": bastion_ip},
    }


def bastion_of(outputs: Mapping[str, Any]) -> str | None:
    """bastion_ip from `terraform output -json`; Terraform omits outputs whose value is null."""
    item = outputs.get("bastion_ip")
    value = item.get("value") if isinstance(item, dict) else item
    return str(value) if value else None


# ---------------------------------------------------------------- the plan of a provision


@dataclass
class Plan:
    """What a provision will do, worked out without creating anything."""

    cluster: str
    target: str
    nodes: int
    module: Path
    workdir: Path
    var_file: Path | None  # the operator's file
    var_file_copy: str | None  # its copy in workdir, as passed to -var-file
    values: dict[str, Any]
    variables: dict[str, Any]  # passed with -var
    key_path: Path
    generates_key: bool
    binary: str
    plugin_cache: Path
    existing: dict[str, Any] | None = None  # cluster.json of the cluster being resized
    public_key_pending: bool = False  # the key is made at provision time (dry runs)

    def env(self) -> dict[str, str]:
        return {"TF_PLUGIN_CACHE_DIR": str(self.plugin_cache)}

    def commands(self) -> list[list[str]]:
        tf = Terraform(self.workdir, binary=self.binary)
        return [tf.command("init"),
                tf.command("plan", f"-out={PLAN_FILE}", var_file=self.var_file_copy,
                           variables=self.variables),
                tf.command("apply", "-auto-approve", PLAN_FILE),
                tf.command("output", "-json")]

    def lines(self) -> list[str]:
        """Human-readable dry-run report: where, what gets copied, env, commands, variables."""
        env = {**BASE_ENV, **self.env()}
        out = [f"# {self.target} cluster {self.cluster}: {self.nodes} node(s); nothing is "
               "created by a dry run",
               f"# working dir: {self.workdir}",
               f"# copy terraform/{self.target}/*.tf into it"
               + (f", and {self.var_file} as {self.var_file_copy}" if self.var_file else "")]
        if self.generates_key and self.public_key_pending:
            out.append(f"# generate the cluster's SSH key: {self.key_path} (+ .pub, mode 0600)")
        out.append("# env: " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
        out += [redact(shlex.join(c)) for c in self.commands()]
        shown = {**self.values, **self.variables}
        out.append("# variables: " + redact(json.dumps(shown, sort_keys=True, default=str)))
        return out


def prepare(cluster: str, target: str, nodes: int | str, var_file: str | Path | None,
            need_binary: bool = True) -> Plan:
    """Check every input and work out the plan; creates nothing."""
    check_cluster_name(cluster)
    mod = target_module(target)
    n = parse_nodes(nodes)
    module = module_dir(target)
    declared = read_variables(module)
    missing_contract = [v for v in ("cluster_name", "nodes") if v not in declared]
    if missing_contract:
        raise ClusterError(f"terraform/{target} does not declare {missing_contract}; every "
                           "target module must")
    src = Path(var_file).expanduser().resolve() if var_file else None
    values = load_var_file(src) if src else {}
    check_values(target, values, declared, src)
    check_quota(n, node_quota(values, declared), src)
    mod.preflight(values, n, src, cluster)

    existing = None
    cdir = cluster_dir(cluster)
    if (cdir / "cluster.json").exists():
        existing = load_cluster(cluster)
        if existing.get("target") != target:
            raise ClusterError(f"cluster {cluster} exists with target {existing.get('target')}; "
                               f"destroy it first (invoke destroy --cluster {cluster}) or pick "
                               "another --cluster")

    if mod.GENERATES_KEY:
        key_path = cdir / KEY_NAME
    else:
        key_path = mod.key_file(values, src)
    variables: dict[str, Any] = {"cluster_name": cluster, "nodes": n}
    pending = False
    if "ssh_public_key" in declared:
        pub = key_path.with_name(key_path.name + ".pub")
        if pub.is_file():
            variables["ssh_public_key"] = pub.read_text().strip()
        else:
            variables["ssh_public_key"] = f"<public half of {pub}, generated at provision>"
            pending = True
    try:
        binary = find_binary()
    except TerraformError:
        if need_binary:
            raise
        binary = "terraform"
    copy = None
    if src:
        copy = "operator.tfvars.json" if src.name.endswith(".json") else "operator.tfvars"
    return Plan(cluster=cluster, target=target, nodes=n, module=module,
                workdir=cdir / "terraform", var_file=src, var_file_copy=copy, values=values,
                variables=variables, key_path=key_path, generates_key=mod.GENERATES_KEY,
                binary=binary, plugin_cache=plugin_cache_dir(), existing=existing,
                public_key_pending=pending)


def plugin_cache_dir() -> Path:
    """Providers are downloaded once for all clusters (they are hundreds of MB each)."""
    return Path(os.environ.get("TF_PLUGIN_CACHE_DIR") or state_root() / "terraform-plugin-cache")


def dry_run(cluster: str, target: str, nodes: int | str,
            var_file: str | Path | None = None) -> Plan:
    """Everything a provision would check and run, as a Plan whose lines() the task prints."""
    return prepare(cluster, target, nodes, var_file, need_binary=False)


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
    cdir = cluster_dir(cluster)
    created_dir = not cdir.exists()
    created: list[Path] = []  # what to remove if a new cluster fails before apply
    tf = Terraform(plan.workdir, binary=plan.binary, env=plan.env())
    # before anything is written: a binary too old for the module would fail at init
    # (asked outside the working directory and the plugin cache, neither of which exists yet)
    version = Terraform(Path.cwd(), binary=plan.binary).version()
    need = required_version(plan.module)
    if need and not meets(version, need):
        raise TerraformError(
            f"{plan.binary} is version {version}, and the {target} module needs {need}; "
            f"install a Terraform or OpenTofu that meets it and point {BINARY_ENV} at it "
            "(README, 'static, openstack, aws')")
    before = _snapshot(plan.workdir) if plan.existing else {}
    step = "stage"

    # 1. Stage and plan: nothing exists in the cloud yet, so a failure only undoes local files.
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
            raise TerraformError(f"{target}: {str(exc).rstrip('.')}; {fix} and retry; nothing "
                                 "was created", stderr=exc.stderr) from None
        raise

    # 2. Apply: from here on, cloud resources may exist.
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

    bastion_ip = bastion_of(outputs)
    user = (outputs.get("ssh_user") or {}).get("value") or recs[0].ssh_user
    bastion = f"{user}@{bastion_ip}" if bastion_ip else None
    if bastion:
        # every SSH to the nodes goes through it: scalelab.cluster.ssh.options makes the hop
        recs = [dataclasses.replace(n, bastion=bastion) for n in recs]
    rec = _record(plan, "ready", recs, bastion, version)
    caps = TerraformTarget(target).capabilities(rec)
    rec["capabilities"] = caps.to_dict()
    trust = cdir / TRUST_KEY_NAME
    if not trust.is_file():
        generate_key(trust, f"scalelab-{cluster}-trust")
    rec["trust_key"] = str(trust)
    inventory.write(cluster, recs, known_hosts=str(cdir / "known_hosts"),
                    capabilities=caps.as_vars(), trust_key=str(trust))
    save_cluster(cluster, rec)
    log.info("%s cluster %s: %d node(s) ready; inventory written", target, cluster, len(recs))
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
    try:
        now = nodes_from_outputs(tf.output(), rec["target"], rec.get("ssh_key", ""))
    except (InputError, KeyError):
        return info
    info.outputs_match = [n.to_dict() for n in now] == [n.to_dict() for n in nodes]
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
