"""Run commands on nodes with the system OpenSSH client (what Ansible uses too)."""

from __future__ import annotations

import logging
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from scalelab.errors import CommandError, ScalelabError
from scalelab.nodes import Node

T = TypeVar("T")

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


def on_each(nodes: list[Node], fn: Callable[[Node], T],
            timeout_s: float = 120.0) -> tuple[dict[str, T], dict[str, str]]:
    """fn(node) for every node at once (each is bounded by its own ssh timeouts).

    Returns (results, errors) by node name; a ScalelabError, KeyError or ValueError from fn
    is that node's error, and a node still busy after timeout_s is one too.
    """
    results: dict[str, T] = {}
    errors: dict[str, str] = {}

    def one(n: Node) -> None:
        try:
            results[n.name] = fn(n)
        except (ScalelabError, KeyError, ValueError) as exc:
            errors[n.name] = str(exc)

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    for n in nodes:
        if n.name not in results and n.name not in errors:
            errors[n.name] = f"no answer within {timeout_s:g} s"
    return results, errors


def first_error(nodes: list[Node], errors: dict[str, str]) -> tuple[str, str] | None:
    """The error of the first node, in cluster order, that has one."""
    for n in nodes:
        if n.name in errors:
            return n.name, errors[n.name]
    return None


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
