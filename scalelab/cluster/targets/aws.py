"""The aws target: GPU EC2 instances in a cluster placement group, optionally with EFA.

What gets created is described in terraform/aws/README.md. Credentials come only from AWS's
standard sources (environment, ~/.aws/config and credentials, instance or container roles);
scalelab never writes or logs them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scalelab.core import validate

TARGET = "aws"
GENERATES_KEY = True
CREDENTIALS_HINT = ("set AWS_PROFILE (with ~/.aws/config) or AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY, or run where an instance role applies")


def credentials_present(env: Mapping[str, str] | None = None) -> bool:
    """Whether AWS credentials are configured (looked for, never read).

    Instance and container roles cannot be seen without a network call, so a False here is a
    warning, not a refusal.
    """
    env = os.environ if env is None else env
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return True
    if env.get("AWS_PROFILE") or env.get("AWS_WEB_IDENTITY_TOKEN_FILE") \
            or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") \
            or env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        return True
    files = [env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials",
             env.get("AWS_CONFIG_FILE") or "~/.aws/config"]
    return any(Path(f).expanduser().is_file() for f in files)


def preflight(values: Mapping[str, Any], nodes: int, var_file: Path | None,
              cluster: str) -> None:
    """terraform/aws validates its own variables; ssh_user becomes the nodes' login user
    (every SSH destination and Ansible's ansible_user), so it is checked here, before anything
    is created."""
    validate.var_file_user(values, "aws", var_file, "AMI")
