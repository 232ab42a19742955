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


def split_bastion(bastion: str, default_user: str) -> tuple[str, str, int]:
    """user@host[:port] -> (user, host, port).

    >>> split_bastion("ubuntu@203.0.113.5", "root"), split_bastion("198.51.100.7:2222", "root")
    (('ubuntu', '203.0.113.5', 22), ('root', '198.51.100.7', 2222))
    """
    user, _, rest = bastion.rpartition("@")
    host, _, port = rest.partition(":")
    return user or default_user, host, int(port or 22)


def options(node: Node, known_hosts: str | None, connect_timeout: int = 5,
            with_key: bool = True) -> list[str]:
    """Every option of an SSH connection to a node, the one place they are made: the key,
    pinned host keys, no prompts, timeouts, and the bastion hop when the node has one. ssh,
    Ansible's inventory (scalelab.inventory), launch, probes and reaping all take them here.

    The hop is a ProxyCommand with the same key and the same known_hosts file, so the
    bastion's own host key is pinned as the nodes' are (a ProxyJump hop would check
    ~/.ssh/known_hosts instead, or prompt).

    >>> n = Node("c-n1", "10.0.0.11", "10.0.0.11", "worker", "aws", ssh_key="/s/id",
    ...          ssh_user="ubuntu", bastion="ubuntu@203.0.113.5")
    >>> [o for o in options(n, "/s/kh") if o.startswith("ProxyCommand")]  # doctest: +NORMALIZE_WHITESPACE
    ['ProxyCommand=ssh -W %h:%p -i /s/id -o IdentitiesOnly=yes -o UserKnownHostsFile=/s/kh
      -o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=5 -o LogLevel=ERROR
      -p 22 ubuntu@203.0.113.5']
    """
    key = ["-i", node.ssh_key, "-o", "IdentitiesOnly=yes"] if node.ssh_key else []
    pinned = ["-o", f"UserKnownHostsFile={known_hosts}"] if known_hosts else []
    pinned += ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
               "-o", f"ConnectTimeout={connect_timeout}"]
    # with_key=False: Ansible passes the key itself (ansible_ssh_private_key_file); the hop
    # still needs it
    opts = [*(key if with_key else ["-o", "IdentitiesOnly=yes"] if key else []), *pinned, "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
            "-o", "LogLevel=ERROR"]
    if node.bastion:
        user, host, port = split_bastion(node.bastion, node.ssh_user)
        hop = ["ssh", "-W", "%h:%p", *key, *pinned, "-o", "LogLevel=ERROR", "-p", str(port),
               f"{user}@{host}"]
        opts += ["-o", f"ProxyCommand={shlex.join(hop)}"]
    return opts


def ssh_args(node: Node, known_hosts: str, connect_timeout: int = 5) -> list[str]:
    """The ssh command line prefix for a node: options() and the destination.

    >>> n = Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local", ssh_key="/s/id")
    >>> " ".join(ssh_args(n, "/s/kh"))  # doctest: +NORMALIZE_WHITESPACE
    'ssh -i /s/id -o IdentitiesOnly=yes -o UserKnownHostsFile=/s/kh -o StrictHostKeyChecking=yes
     -o BatchMode=yes -o ConnectTimeout=5 -o ServerAliveInterval=5 -o ServerAliveCountMax=3
     -o LogLevel=ERROR -p 22 root@10.0.0.10'
    """
    return ["ssh", *options(node, known_hosts, connect_timeout), "-p", str(node.ssh_port),
            f"{node.ssh_user}@{node.address}"]


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
