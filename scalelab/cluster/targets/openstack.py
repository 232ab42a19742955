"""The openstack target: GPU VM or bare-metal (Ironic) instances on an OpenStack cloud.

What gets created is described in terraform/openstack/README.md. Credentials come only from
OpenStack's standard sources (OS_CLOUD with clouds.yaml, or an openrc's OS_* variables);
scalelab never writes or logs them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scalelab.core import validate

TARGET = "openstack"
GENERATES_KEY = True
CREDENTIALS_HINT = ("set OS_CLOUD to an entry of your clouds.yaml, or source your project's "
                    "openrc file (OS_AUTH_URL, OS_USERNAME, OS_PASSWORD, ...)")
_CLOUDS_YAML = ("clouds.yaml", "~/.config/openstack/clouds.yaml", "/etc/openstack/clouds.yaml")


def credentials_present(env: Mapping[str, str] | None = None) -> bool:
    """Whether OpenStack credentials are configured (looked for, never read)."""
    env = os.environ if env is None else env
    if env.get("OS_AUTH_URL"):
        return True
    if env.get("OS_CLOUD"):
        files = [env.get("OS_CLIENT_CONFIG_FILE", "")] + list(_CLOUDS_YAML)
        return any(f and Path(f).expanduser().is_file() for f in files)
    return False


def preflight(values: Mapping[str, Any], nodes: int, var_file: Path | None,
              cluster: str) -> None:
    """terraform/openstack validates its own variables; ssh_user becomes the nodes' login user
    (every SSH destination and Ansible's ansible_user), so it is checked here, before anything
    is created."""
    validate.var_file_user(values, "openstack", var_file, "image")
