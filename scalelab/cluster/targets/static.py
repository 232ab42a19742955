"""The static target: machines that already exist (testbed bare metal, lab hosts).

The var-file lists them (see terraform/static/variables.tf). The Terraform module has no
provider: it validates and normalises the list, so static clusters go through the same
wrapper, state handling and outputs contract as the cloud targets.

SSH: scalelab makes no key for static clusters. The hosts already trust a key, and the
var-file names its private half in ``ssh_private_key_file``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scalelab.core import validate
from scalelab.core.errors import InputError

TARGET = "static"
GENERATES_KEY = False
CREDENTIALS_HINT = "the static target needs no cloud credentials"


def credentials_present(env: Mapping[str, str] | None = None) -> bool:
    return True


def normalise_hosts(hosts: list[Mapping[str, Any]], cluster: str,
                    ssh_user: str) -> list[dict[str, Any]]:
    """The host list with defaults filled in, as terraform/static/main.tf does it.

    >>> normalise_hosts([{"address": "192.0.2.1", "role": "head", "gpus": 2},
    ...                  {"address": "192.0.2.2", "name": "b"}], "lab", "ubuntu")[1]
    ... # doctest: +NORMALIZE_WHITESPACE
    {'name': 'b', 'named': True, 'address': '192.0.2.2', 'private_address': '192.0.2.2',
     'role': 'worker', 'gpus': 0, 'ssh_user': 'ubuntu'}
    """
    out = []
    for i, h in enumerate(hosts):
        address = str(h.get("address", "")).strip()
        out.append({
            "name": str(h.get("name") or f"{cluster}-n{i}"),
            # without a name, the label stands until configure reads the host's own hostname
            "named": bool(h.get("name")),
            "address": address,
            "private_address": str(h.get("private_address") or address).strip(),
            "role": str(h.get("role", "worker")),
            "gpus": h.get("gpus", 0),
            "ssh_user": str(h.get("ssh_user") or ssh_user),
        })
    return out


def _twice(hosts: list[dict[str, Any]], key: str) -> tuple[str, list[int]] | None:
    seen: dict[str, list[int]] = {}
    for i, h in enumerate(hosts):
        seen.setdefault(h[key], []).append(i)
    for value, where in seen.items():
        if value and len(where) > 1:
            return value, where
    return None


def check_ssh_values(values: Mapping[str, Any], where: str) -> None:
    """Every var-file value that becomes part of an SSH destination, an ssh option or an
    Ansible variable (scalelab.core.validate), refused with the entry and the field named.

    >>> check_ssh_values({"ssh_user": "ubuntu", "hosts": [{"address": "192.0.2.1",
    ...                   "ssh_user": "-oProxyCommand=touch /tmp/x"}]}, "var-file lab.json")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: static: var-file lab.json: hosts entry 1: ssh_user '-oProxyCommand=touch /tmp/x' is not a user name (it starts with '-', so ssh would read it as an option); give the login user the hosts already trust the key for, e.g. ubuntu
    """
    user_fix = "give the login user the hosts already trust the key for, e.g. ubuntu"
    at = f"static: {where}"
    if "ssh_user" in values:
        validate.login_name(values["ssh_user"], "ssh_user", at, user_fix)
    if values.get("bastion_ip") is not None:
        validate.host(values["bastion_ip"], "bastion_ip", at,
                      "give the jump host's address or name, or leave bastion_ip out")
    for i, h in enumerate(values.get("hosts") or []):
        entry = f"{at}: hosts entry {i + 1}"
        validate.host(str(h.get("address", "")).strip(), "address", entry,
                      "give the address the controller reaches the host at")
        if h.get("private_address"):
            validate.host(str(h["private_address"]).strip(), "private_address", entry,
                          "give the host's address on the cluster network, or leave it out")
        if h.get("name"):
            validate.node_name(h["name"], "name", entry,
                               "give the host's name (letters, digits, '.', '_', '-'), or leave "
                               "it out")
        if h.get("ssh_user"):
            validate.login_name(h["ssh_user"], "ssh_user", entry, user_fix)


def key_file(values: Mapping[str, Any], var_file: Path | None) -> Path:
    """ssh_private_key_file from the var-file: ~ expanded, relative to the var-file's folder."""
    raw = str(values.get("ssh_private_key_file") or "")
    path = Path(raw).expanduser()
    if not path.is_absolute() and var_file is not None:
        path = var_file.parent / path
    return path.resolve()


def preflight(values: Mapping[str, Any], nodes: int, var_file: Path | None,
              cluster: str) -> None:
    """Refuse a host list that cannot work, naming the offending entry, before Terraform runs."""
    where = f"var-file {var_file}" if var_file else "the var-file"
    hosts = values.get("hosts")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, dict) for h in hosts):
        raise InputError(f"static: {where} must list hosts, e.g. \"hosts\": [{{\"address\": "
                         "\"192.0.2.10\", \"role\": \"head\", \"gpus\": 1}, ...]")
    norm = normalise_hosts(hosts, cluster, str(values.get("ssh_user") or ""))
    missing = [i for i, h in enumerate(norm) if not h["address"]]
    if missing:
        raise InputError(f"static: hosts entry {missing[0] + 1} in {where} has no address; give "
                         "every host the address the controller reaches it at")
    check_ssh_values(values, where)
    for key, label in (("address", "address"), ("private_address", "private_address"),
                       ("name", "name")):
        dup = _twice(norm, key)
        if dup:
            value, idx = dup
            entries = " and ".join(str(i + 1) for i in idx)
            raise InputError(f"static: {label} {value} is listed twice in hosts (entries "
                             f"{entries}) in {where}; give every host its own {label}")
    bad = [h for h in norm if h["role"] not in ("head", "worker")]
    if bad:
        raise InputError(f"static: host {bad[0]['name']} has role {bad[0]['role']!r} in {where}; "
                         "a role is head or worker")
    heads = [h["name"] for h in norm if h["role"] == "head"]
    if len(heads) != 1:
        which = f" ({', '.join(heads)})" if heads else ""
        raise InputError(f"static: hosts has {len(heads)} heads{which} in {where}; mark exactly "
                         "one host with \"role\": \"head\"")
    if nodes > len(norm):
        raise InputError(f"static: --nodes {nodes} but {where} lists {len(norm)} hosts; list more "
                         "hosts or ask for fewer nodes")
    key = key_file(values, var_file)
    if not values.get("ssh_private_key_file") or not key.is_file():
        raise InputError(f"static: ssh_private_key_file {key} (from {where}) is not a file; point "
                         "it at the private key the hosts already trust")
    mode = stat.S_IMODE(os.stat(key).st_mode)
    if mode & 0o077:
        raise InputError(f"static: {key} is readable by others (mode {mode:o}) and ssh will refuse "
                         f"it; run chmod 600 {key}")
