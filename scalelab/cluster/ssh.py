"""Run commands on nodes with the system OpenSSH client (what Ansible uses too)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from scalelab.cluster.nodes import Node
from scalelab.core.errors import CommandError, ScalelabError

T = TypeVar("T")

log = logging.getLogger(__name__)

# at most this many SSH connections are opened at once (on_each): a bastion's sshd refuses
# new ones above MaxStartups' first figure (10 by default), and so would any node's
MAX_PARALLEL = 8
# an idle multiplexing master closes after this long; destroy closes them at once
PERSIST_S = 60
MUX_ENV = "SCALELAB_SSH_MUX"  # "0": one connection per command (to measure what it saves)
# scalelab's own options only: no configuration file is read (not the user's ~/.ssh/config,
# whose "ForwardAgent yes" would hand the user's agent to every node and the bastion, nor
# /etc/ssh/ssh_config), and nothing is forwarded whatever a file would say
OWN_ONLY = ["-F", "none", "-o", "ForwardAgent=no", "-o", "ForwardX11=no",
            "-o", "ClearAllForwardings=yes"]


_counted = {"opened": 0, "shared": 0}
_count_lock = threading.Lock()


def connections() -> dict[str, int]:
    """How many SSH connections this process has opened, and how many commands rode one that
    was open already (a multiplexing master's socket was there): the driver records the
    difference per run."""
    with _count_lock:
        return dict(_counted)


def count(node: Node, known_hosts: str | None, shared: bool = True) -> None:
    """Count one command about to go to node (run() does; so does launch for each rank): a
    connection opened, or a command riding one already open; through a bastion, the hop is
    a connection to the bastion too, unless it rides the bastion's."""
    mux = bool(known_hosts and mux_enabled())
    rides = bool(shared and mux and os.path.exists(_socket(node, known_hosts)))
    hop_opened = False
    if node.bastion and not rides:
        user, host, port = split_bastion(node.bastion, node.ssh_user)
        hop_opened = not (mux and os.path.exists(_socket_of(user, host, port, known_hosts)))
    with _count_lock:
        _counted["shared" if rides else "opened"] += 1
        _counted["opened"] += hop_opened


def mux_dir(known_hosts: str) -> str:
    """Where a cluster's multiplexing sockets live: beside its known_hosts, in the cluster's
    directory, or, where that path is too long for a Unix socket (107 bytes, with the
    temporary name a master binds first), in a directory under /tmp named by the cluster
    directory's hash.

    >>> mux_dir("/home/u/.local/state/scalelab/clusters/lab/known_hosts")
    '/home/u/.local/state/scalelab/clusters/lab/ssh-mux'
    >>> mux_dir("/x" * 40 + "/known_hosts").startswith(f"/tmp/scalelab-ssh-{os.getuid()}/")
    True
    >>> len(mux_dir("/" + "x" * 54 + "/known_hosts")), mux_dir("/" + "x" * 55 + "/known_hosts")[:5]
    (63, '/tmp/')
    """
    parent = os.path.dirname(os.path.abspath(known_hosts))
    near = os.path.join(parent, "ssh-mux")
    # a master binds "<ControlPath>.<16 random characters>" first, then renames it: that
    # name, with our 16-character socket name, must fit a Unix socket's 107 bytes
    if len(near) + 1 + 16 + 17 <= 107 - 10:  # and leave a margin
        return near
    digest = hashlib.sha1(parent.encode()).hexdigest()[:12]
    return f"/tmp/scalelab-ssh-{os.getuid()}/{digest}"


def mux_enabled() -> bool:
    return os.environ.get(MUX_ENV, "1") != "0"


def _ready(known_hosts: str) -> bool:
    """Make the cluster's socket directory (0700, ours); False where the cluster directory
    does not exist or the /tmp one is not ours (then connections are not multiplexed)."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(known_hosts))):
        return False
    where = mux_dir(known_hosts)
    fallback = where.startswith(f"/tmp/scalelab-ssh-{os.getuid()}/")
    for d in (os.path.dirname(where), where) if fallback else (where,):
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            st = os.lstat(d)
        except OSError as exc:
            _warn_once(d, f"cannot make {d} ({exc.strerror}): one SSH connection per command")
            return False
        if st.st_uid != os.getuid() or not os.path.isdir(d) or os.path.islink(d) \
                or st.st_mode & 0o077:
            _warn_once(d, f"{d} is not a private directory of this user: one SSH connection "
                          "per command")
            return False
    return True


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("%s", message)


def _socket_of(user: str, address: str, port: int, known_hosts: str, via: str = "") -> str:
    # the route and the pinned keys are part of the name: a node reached through a bastion
    # and the same node reached directly are two connections, and a connection checked
    # against one known_hosts file is not lent to a command that pins another
    dest = f"{user}@{address}:{port} via {via} pinned {os.path.abspath(known_hosts)}"
    return os.path.join(mux_dir(known_hosts), hashlib.sha1(dest.encode()).hexdigest()[:16])


def _socket(node: Node, known_hosts: str) -> str:
    return _socket_of(node.ssh_user, node.address, node.ssh_port, known_hosts,
                      node.bastion or "")


def close_masters(known_hosts: str) -> int:
    """End every multiplexing master of the cluster whose known_hosts this is and remove
    their directory (destroy does this). Returns how many were open."""
    import shutil

    where = mux_dir(known_hosts)
    if not os.path.isdir(where):
        return 0
    closed = 0
    for name in sorted(os.listdir(where)):
        sock = os.path.join(where, name)
        try:
            proc = subprocess.run(["ssh", "-F", "none", "-o", f"ControlPath={sock}", "-O",
                                   "exit", "scalelab"], capture_output=True, text=True, timeout=15,
                                  stdin=subprocess.DEVNULL, check=False)
            closed += proc.returncode == 0
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("could not close the SSH connection at %s: %s", sock, exc)
    # what is left (a stale socket, one a concurrent command just made) goes with it: an
    # idle master closes itself after PERSIST_S
    shutil.rmtree(where, ignore_errors=True)
    return closed


def split_bastion(bastion: str, default_user: str) -> tuple[str, str, int]:
    """user@host[:port] -> (user, host, port).

    >>> split_bastion("ubuntu@203.0.113.5", "root"), split_bastion("198.51.100.7:2222", "root")
    (('ubuntu', '203.0.113.5', 22), ('root', '198.51.100.7', 2222))
    """
    user, _, rest = bastion.rpartition("@")
    host, _, port = rest.partition(":")
    return user or default_user, host, int(port or 22)


def options(node: Node, known_hosts: str | None, connect_timeout: int = 5,
            with_key: bool = True, shared: bool = True) -> list[str]:
    """Every option of an SSH connection to a node, the one place they are made: no
    configuration file and no forwarding (OWN_ONLY), the key, pinned host keys, no prompts,
    timeouts, multiplexing, and the bastion hop when the node has one. ssh, Ansible's
    inventory (scalelab.cluster.inventory), launch, probes and reaping all take them here.

    Commands to a node share one connection (ControlMaster, its socket under mux_dir) that
    stays open PERSIST_S seconds after the last; Ansible finds the ControlPath set and uses
    the same socket. Unset with SCALELAB_SSH_MUX=0, and without a known_hosts file.
    shared=False: a connection of its own (a rank's: its keep-alives are how a lost node is
    noticed, and a node's sshd allows only MaxSessions, 10 by default, on one connection).

    The hop is a ProxyCommand with the same key and the same known_hosts file, so the
    bastion's own host key is pinned as the nodes' are (a ProxyJump hop would check
    ~/.ssh/known_hosts instead, or prompt).

    >>> n = Node("c-n1", "10.0.0.11", "10.0.0.11", "worker", "aws", ssh_key="/s/id",
    ...          ssh_user="ubuntu", bastion="ubuntu@203.0.113.5")
    >>> [o for o in options(n, "/s/kh") if o.startswith("ProxyCommand")]  # doctest: +NORMALIZE_WHITESPACE
    ['ProxyCommand=ssh -W %h:%p -F none -o ForwardAgent=no -o ForwardX11=no
      -o ClearAllForwardings=yes -i /s/id -o IdentitiesOnly=yes -o UserKnownHostsFile=/s/kh
      -o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=5 -o LogLevel=ERROR
      -p 22 ubuntu@203.0.113.5']
    """
    key = ["-i", node.ssh_key, "-o", "IdentitiesOnly=yes"] if node.ssh_key else []
    pinned = ["-o", f"UserKnownHostsFile={known_hosts}"] if known_hosts else []
    pinned += ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
               "-o", f"ConnectTimeout={connect_timeout}"]
    # with_key=False: Ansible passes the key itself (ansible_ssh_private_key_file); the hop
    # still needs it. A rank's own connection (shared=False) is how a dead node or a cut link
    # is noticed: 3 unanswered keep-alives at 3 s intervals
    alive = ["-o", "ServerAliveInterval=3"] if not shared else ["-o", "ServerAliveInterval=5"]
    opts = [*OWN_ONLY, *(key if with_key else ["-o", "IdentitiesOnly=yes"] if key else []),
            *pinned, *alive, "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR"]
    if not shared:
        opts += ["-o", "ControlPath=none"]
    elif known_hosts and mux_enabled() and _ready(known_hosts):
        opts += ["-o", "ControlMaster=auto", "-o", f"ControlPath={_socket(node, known_hosts)}",
                 "-o", f"ControlPersist={PERSIST_S}"]
    if node.bastion:
        user, host, port = split_bastion(node.bastion, node.ssh_user)
        hop = ["ssh", "-W", "%h:%p", *OWN_ONLY, *key, *pinned, "-o", "LogLevel=ERROR"]
        if known_hosts and mux_enabled() and _ready(known_hosts):
            # every hop rides one connection to the bastion, so its MaxStartups is never met
            # (forwarded connections are not sessions: its MaxSessions does not count them)
            hop += ["-o", "ControlMaster=auto", "-o",
                    f"ControlPath={_socket_of(user, host, port, known_hosts)}",
                    "-o", f"ControlPersist={PERSIST_S}"]
        hop += ["-p", str(port), f"{user}@{host}"]
        opts += ["-o", f"ProxyCommand={shlex.join(hop)}"]
    return opts


def ssh_args(node: Node, known_hosts: str, connect_timeout: int = 5,
             shared: bool = True) -> list[str]:
    """The ssh command line prefix for a node: options() and the destination.

    >>> n = Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local", ssh_key="/s/id")
    >>> " ".join(ssh_args(n, "/s/kh"))  # doctest: +NORMALIZE_WHITESPACE
    'ssh -F none -o ForwardAgent=no -o ForwardX11=no -o ClearAllForwardings=yes -i /s/id
     -o IdentitiesOnly=yes -o UserKnownHostsFile=/s/kh -o StrictHostKeyChecking=yes
     -o BatchMode=yes -o ConnectTimeout=5 -o ServerAliveInterval=5 -o ServerAliveCountMax=3
     -o LogLevel=ERROR -p 22 root@10.0.0.10'
    """
    return ["ssh", *options(node, known_hosts, connect_timeout, shared=shared),
            "-p", str(node.ssh_port),
            f"{node.ssh_user}@{node.address}"]


def on_node_line(user: str, address: str, command: str) -> str:
    """The shell line a node runs to reach another node over SSH with the nodes' own
    configuration (the cluster's trust key and pinned keys, which configure installed there).

    >>> on_node_line("alice", "10.0.0.12", "hostname")
    'ssh -o ConnectTimeout=5 -o BatchMode=yes alice@10.0.0.12 hostname'
    """
    return (f"ssh -o ConnectTimeout=5 -o BatchMode=yes {shlex.quote(user)}@"
            f"{shlex.quote(address)} {shlex.quote(command)}")


def on_each(nodes: list[Node], fn: Callable[[Node], T],
            timeout_s: float = 120.0) -> tuple[dict[str, T], dict[str, str]]:
    """fn(node) for every node, MAX_PARALLEL at a time (each is bounded by its own ssh
    timeouts).

    Returns (results, errors) by node name; a ScalelabError, KeyError or ValueError from fn
    is that node's error, and a node still busy after timeout_s is one too.
    """
    results: dict[str, T] = {}
    errors: dict[str, str] = {}

    slots = threading.BoundedSemaphore(MAX_PARALLEL)
    deadline = time.monotonic() + timeout_s

    def one(n: Node) -> None:
        with slots:
            if time.monotonic() >= deadline:  # queued too long: never started late
                errors[n.name] = f"not started within {timeout_s:g} s (others were slow)"
                return
            try:
                results[n.name] = fn(n)
            except (ScalelabError, KeyError, ValueError) as exc:
                errors[n.name] = str(exc)

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
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


def first_problem(nodes: list[Node], check: Callable[[Node], str]) -> tuple[str, str] | None:
    """check(node) on every node (on_each): (node, why) for the first node, in cluster order,
    whose check failed or said why ("" for all is well); None if none."""
    results, errors = on_each(nodes, check)
    for n in nodes:
        why = errors.get(n.name) or results.get(n.name)
        if why:
            return n.name, why
    return None


# what OpenSSH's client prints when it gets no TCP connection to the host at all: nothing of
# the command can have run (a jump host's own failures look different and are not counted)
_NO_CONNECTION = re.compile(r"^ssh: (connect to host \S+ port \d+|Could not resolve hostname "
                            r"\S+): .+$")


def never_reached(returncode: int | None, stdout: str, stderr: str) -> bool:
    r"""Whether an ssh client exited without ever reaching its host, so that nothing of its
    command ran there: exit 255, nothing printed, and only connection failures on stderr.

    >>> never_reached(255, "", "ssh: connect to host 10.0.0.2 port 22: Connection refused\n")
    True
    >>> never_reached(255, "", "ssh: Could not resolve hostname n9: Name or service not known")
    True
    >>> never_reached(255, "", "Connection to 10.0.0.2 closed by remote host.")  # it ran
    False
    >>> never_reached(1, "", "ssh: connect to host a port 22: Connection refused")  # the command's
    False
    >>> never_reached(255, "SCALELAB_PGID 7\n", "ssh: connect to host a port 22: Connection refused")
    False
    """
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    return (returncode == 255 and not stdout.strip() and bool(lines)
            and all(_NO_CONNECTION.match(ln.strip()) for ln in lines))


def run(node: Node, known_hosts: str, command: str, timeout: float = 30.0,
        check: bool = True) -> subprocess.CompletedProcess:
    """Run a shell command on a node and capture its output."""
    argv = ssh_args(node, known_hosts) + ["--", command]
    log.debug("ssh %s: %s", node.name, command)
    count(node, known_hosts)
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


# ------------------------------------------------------------------ node-to-node SSH of horovodrun

# the host keys scalelab pins on the nodes: the common role's block in the global file, and
# the file every emulated node of the local target reads (/etc/scalelab is its shared folder)
NODE_PINNED = ("/etc/ssh/ssh_known_hosts", "/etc/scalelab/known_hosts")

# horovodrun starts its remote ranks with `ssh -o PasswordAuthentication=no -o
# StrictHostKeyChecking=no HOST ...` (horovod/runner/util/remote.py, SSH_COMMAND_PREFIX), found
# on PATH: this `ssh`, first on PATH, drops the options that would weaken the host-key check or
# forward anything, and puts scalelab's first (OpenSSH takes an option's first value)
_PINNED_SSH = r"""#!/bin/sh
# scalelab: horovodrun's SSH to the other nodes, checked against the pinned host keys only
o=
for a do
    shift
    if [ -n "$o" ]; then
        o=
        v=$a
    else
        case $a in
            -o) o=1; continue ;;
            -o?*) v=${a#-o} ;;
            *) set -- "$@" "$a"; continue ;;
        esac
    fi
    case $(printf '%s' "$v" | tr '[:upper:]' '[:lower:]') in
        stricthostkeychecking*|userknownhostsfile*|globalknownhostsfile*|knownhostscommand*|\
forwardagent*|forwardx11*|proxycommand*|proxyjump*|localcommand*|permitlocalcommand*) ;;
        *) set -- "$@" -o "$v" ;;
    esac
done
exec "${SCALELAB_SSH:?}" -o StrictHostKeyChecking=yes -o UserKnownHostsFile=/dev/null \
    -o "GlobalKnownHostsFile=@PINNED@" -o BatchMode=yes -o ForwardAgent=no \
    -o ForwardX11=no -o ClearAllForwardings=yes "$@"
"""

# writes that `ssh` into a private directory of its own, runs the command with it first on
# PATH, and removes it when the command ends (or the run is ended: TERM, INT, HUP)
_WITH_PINNED_SSH = """\
real=$(command -v ssh) || { echo "scalelab: no ssh client on $(hostname)" >&2; exit 127; }
d=$(mktemp -d "${TMPDIR:-/tmp}/scalelab-ssh.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
cat > "$d/ssh" <<'SCALELAB_EOF'
@SCRIPT@SCALELAB_EOF
chmod 700 "$d/ssh"
SCALELAB_SSH=$real PATH="$d:$PATH" "$@"
"""


def pinned_ssh_script(pinned: tuple[str, ...] = NODE_PINNED) -> str:
    """The `ssh` that horovodrun finds first on PATH on the head node (see _PINNED_SSH).

    >>> s = pinned_ssh_script()
    >>> "StrictHostKeyChecking=yes" in s and "GlobalKnownHostsFile=/etc/ssh/ssh_known_hosts " in s
    True
    """
    return _PINNED_SSH.replace("@PINNED@", " ".join(pinned))


def with_pinned_ssh(argv: list[str]) -> list[str]:
    """argv run on a node with pinned_ssh_script() as the `ssh` it finds on PATH: the
    node-to-node SSH of a launcher that would turn host-key checking off (horovodrun).

    >>> with_pinned_ssh(["/v/bin/horovodrun", "-np", "2"])[:2], with_pinned_ssh(["x"])[3:]
    (['sh', '-c'], ['scalelab-pinned-ssh', 'x'])
    """
    line = _WITH_PINNED_SSH.replace("@SCRIPT@", pinned_ssh_script())
    return ["sh", "-c", line, "scalelab-pinned-ssh", *argv]
