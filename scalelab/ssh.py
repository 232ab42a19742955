"""Run commands on nodes with the system OpenSSH client (what Ansible uses too)."""

from __future__ import annotations

import logging
import shlex
import subprocess

from scalelab.errors import CommandError
from scalelab.nodes import Node

log = logging.getLogger(__name__)


def ssh_args(node: Node, known_hosts: str, connect_timeout: int = 5) -> list[str]:
    """The ssh command line prefix for a node: cluster key, pinned host keys, no prompts.

    >>> n = Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local", ssh_key="/s/id")
    >>> " ".join(ssh_args(n, "/s/kh"))  # doctest: +NORMALIZE_WHITESPACE
    'ssh -i /s/id -o IdentitiesOnly=yes -o UserKnownHostsFile=/s/kh -o StrictHostKeyChecking=yes
     -o BatchMode=yes -o ConnectTimeout=5 -o ServerAliveInterval=5 -o ServerAliveCountMax=3
     -o LogLevel=ERROR -p 22 root@10.0.0.10'
    """
    args = ["ssh"]
    if node.ssh_key:
        args += ["-i", node.ssh_key, "-o", "IdentitiesOnly=yes"]
    args += ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes",
             "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_timeout}",
             "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
             "-o", "LogLevel=ERROR",
             "-p", str(node.ssh_port), f"{node.ssh_user}@{node.address}"]
    return args


def run(node: Node, known_hosts: str, command: str, timeout: float = 30.0,
        check: bool = True) -> subprocess.CompletedProcess:
    """Run a shell command on a node and capture its output."""
    argv = ssh_args(node, known_hosts) + ["--", command]
    log.debug("ssh %s: %s", node.name, command)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CommandError(f"{node.name}: {shlex.quote(command)} did not finish in "
                           f"{timeout:g} s") from None
    if check and proc.returncode != 0:
        err = proc.stderr.strip().splitlines()
        raise CommandError(f"{node.name} ({node.address}): command failed with exit "
                           f"{proc.returncode}: {err[-1] if err else ''}", stderr=proc.stderr)
    return proc
