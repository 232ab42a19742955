"""A Terraform target's module as scalelab reads it, and the plan of a provision, checked before
Terraform runs: the module's variables and outputs (from the HCL), the node count, the
var-file, the values against the declared variables and the quota, the outputs contract every
module keeps, and the commands a provision will run (what --dry-run prints)."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import hcl2

from scalelab.cluster.nodes import Node
from scalelab.cluster.targets.interface import TERRAFORM_TARGETS
from scalelab.cluster.terraform import (
    BASE_ENV,
    Terraform,
    TerraformError,
    find_binary,
    redact,
)
from scalelab.core.errors import ClusterError, InputError
from scalelab.core.state import (
    PROJECT_ROOT,
    check_cluster_name,
    cluster_dir,
    load_cluster,
    state_root,
)

MODULES_DIR = PROJECT_ROOT / "terraform"
# Variables scalelab sets with -var on every run; a var-file must not set them.
SCALELAB_VARS = ("cluster_name", "nodes", "ssh_public_key")
CONTRACT_OUTPUTS = ("nodes", "ssh_user", "bastion_ip")
NODE_KEYS = ("public_ip", "private_ip", "role", "gpus", "ssh_user")
PLAN_FILE = "scalelab.tfplan"
KEY_NAME = "id_ed25519"


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
