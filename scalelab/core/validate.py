"""The one place that checks every value that can become an SSH destination, an ssh option,
a word of a shell line or an Ansible variable, as it enters scalelab: from a var-file, from
Terraform's outputs, or read back from a record on disk.

A value that starts with '-' is an option to OpenSSH (``-oProxyCommand=...`` runs a command
on the controller); whitespace, quotes, ';', '$', '`', '%' and friends change what a shell or
ssh's own ``%`` expansion makes of it. Each check allows only what the thing can be (a login
name, a host name or address, ...) and refuses the rest in one line that names the field,
where it came from and the fix. Every function returns the value it checked, so a caller
writes ``user = validate.login_name(raw, ...)``.
"""

from __future__ import annotations

import re
from typing import Any

from scalelab.core.errors import InputError, ScalelabError

# POSIX login names as useradd takes them (and as cloud images name their users): letters,
# digits, '.', '_' and '-', never first '-'; 64 bytes at most
_LOGIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
# a DNS name, an IPv4 address or an IPv6 address without brackets (what follows '@' in ssh's
# destination and what Ansible's ansible_host takes); '_' for lab hosts named that way
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")
# a node's name: a host name, the inventory's key and what /etc/hosts and known_hosts list
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
# a node's name as one word of a shell line or a launch token: a host name's first label's
# length (63), as Slurm and the launch tokens take it
SHORT_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# a network interface: 15 bytes (IFNAMSIZ - 1), no '/' and no whitespace
_IFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,14}")
# a path on the controller handed to ssh -i and to Ansible: absolute, printable, no quotes
_PATH = re.compile(r"/[A-Za-z0-9._+,=@/~ -]{0,4095}")
# a path a checkpoint place may be, and its runs' directories under it: nothing a shell line
# on a node would read as more than one word or an option
PLACE_PATH = re.compile(r"/[A-Za-z0-9._/+=~-]*")


def _why(value: str, first: str = "", rest: str = "._-") -> str:
    r"""What makes a refused value dangerous or wrong, in a few words: the first character
    that is neither a letter nor a digit nor one of ``first`` (first character) or ``rest``.

    >>> _why("-oProxyCommand=x"), _why("a b"), _why("")
    ("it starts with '-', so ssh would read it as an option", "it holds ' '", 'it is empty')
    >>> _why("a\nb"), _why("é"), _why("a" * 300)
    ("it holds '\\n'", "it starts with 'é'", 'it is too long')
    """
    if not value:
        return "it is empty"
    if value.startswith("-"):
        return "it starts with '-', so ssh would read it as an option"
    for i, c in enumerate(value):
        if not (c.isascii() and (c.isalnum() or c in (rest if i else first))):
            return f"it holds {c!r}" if i else f"it starts with {c!r}"
    return "it is too long"


def _refuse(value: Any, field: str, what: str, why: str, where: str, fix: str,
            error: type[ScalelabError]) -> ScalelabError:
    shown = repr(value) if len(repr(value)) <= 160 else repr(value)[:157] + "..."
    return error(f"{where + ': ' if where else ''}{field} {shown} is not {what} ({why}); {fix}")


def _text(value: Any, field: str, what: str, where: str, fix: str,
          error: type[ScalelabError]) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _refuse(value, field, what, f"it is a {type(value).__name__}", where, fix, error)
    return str(value)


def login_name(value: Any, field: str, where: str, fix: str,
               error: type[ScalelabError] = InputError) -> str:
    """A login user (ssh_user): ``user@host`` and Ansible's ansible_user.

    >>> login_name("ubuntu", "ssh_user", "var-file v.json", "fix it")
    'ubuntu'
    >>> login_name("-oProxyCommand=touch /tmp/x", "ssh_user", "var-file v.json",
    ...            "give the login user of the hosts, e.g. ubuntu")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: var-file v.json: ssh_user '-oProxyCommand=touch /tmp/x' is not a user name (it starts with '-', so ssh would read it as an option); give the login user of the hosts, e.g. ubuntu
    >>> login_name("a@b", "ssh_user", "w", "f")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: w: ssh_user 'a@b' is not a user name (it holds '@'); f
    """
    text = _text(value, field, "a user name", where, fix, error)
    if not _LOGIN.fullmatch(text):
        raise _refuse(value, field, "a user name", _why(text, "_"), where, fix, error)
    return text


def var_file_user(values: Any, target: str, var_file: Any, of_what: str) -> None:
    """A cloud target's var-file ssh_user, where it gives one: the nodes' login user (every SSH
    destination and Ansible's ansible_user), checked before anything is created.

    >>> var_file_user({"ssh_user": "-x"}, "aws", "v.json", "AMI")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: aws: var-file v.json: ssh_user '-x' is not a user name (it starts with '-', so ssh would read it as an option); give the login user of the AMI, e.g. ubuntu
    """
    if "ssh_user" in values:
        login_name(values["ssh_user"], "ssh_user",
                   f"{target}: var-file {var_file}" if var_file else target,
                   f"give the login user of the {of_what}, e.g. ubuntu")


def host(value: Any, field: str, where: str, fix: str,
         error: type[ScalelabError] = InputError) -> str:
    """A host name, IPv4 or IPv6 address: where an SSH connection or a rank goes.

    >>> host("192.0.2.10", "address", "w", "f"), host("gpu01.lab.example.org", "address", "w", "f")
    ('192.0.2.10', 'gpu01.lab.example.org')
    >>> host("fd00::1", "private_address", "w", "f")
    'fd00::1'
    >>> host("10.0.0.1;touch x", "address", "var-file v.json: hosts entry 2", "fix it")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: var-file v.json: hosts entry 2: address '10.0.0.1;touch x' is not a host name or address (it holds ';'); fix it
    """
    text = _text(value, field, "a host name or address", where, fix, error)
    if not _HOST.fullmatch(text):
        raise _refuse(value, field, "a host name or address", _why(text, rest="._:-"), where,
                      fix, error)
    return text


def node_name(value: Any, field: str, where: str, fix: str,
              error: type[ScalelabError] = InputError) -> str:
    """A node's name: the inventory's host, /etc/hosts' and known_hosts' name of the node.

    >>> node_name("lab-n0", "name", "w", "f")
    'lab-n0'
    >>> node_name("n0 n1", "name", "w", "f")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: w: name 'n0 n1' is not a host name (it holds ' '); f
    """
    text = _text(value, field, "a host name", where, fix, error)
    if not _NODE.fullmatch(text):
        raise _refuse(value, field, "a host name", _why(text), where, fix, error)
    return text


def port(value: Any, field: str, where: str, fix: str,
         error: type[ScalelabError] = InputError) -> int:
    """A TCP port, 1-65535 (a whole number or its digits).

    >>> port(2222, "ssh_port", "w", "f"), port("22", "ssh_port", "w", "f")
    (2222, 22)
    >>> port("22 -oX", "ssh_port", "w", "f")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: w: ssh_port '22 -oX' is not a port (give 1-65535); f
    """
    if isinstance(value, bool) or not str(value).isdigit() or not 1 <= int(value) <= 65535:
        raise _refuse(value, field, "a port", "give 1-65535", where, fix, error)
    return int(value)


def bastion(value: Any, field: str, where: str, fix: str,
            error: type[ScalelabError] = InputError) -> str:
    """A jump host as user@host[:port], each part checked as above ("" is none).

    >>> bastion("ubuntu@203.0.113.5:2222", "bastion", "w", "f"), bastion("", "bastion", "w", "f")
    ('ubuntu@203.0.113.5:2222', '')
    >>> bastion("ubuntu@-oProxyCommand=x", "bastion", "w", "f")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: w: bastion '-oProxyCommand=x' is not a host name or address (it starts with '-', so ssh would read it as an option); f
    """
    text = _text(value, field, "a jump host", where, fix, error)
    if not text:
        return ""
    user, at, rest = text.rpartition("@")
    if at:
        login_name(user, field, where, fix, error)
    # an IPv4 address or a name may carry :port; an IPv6 address (two ':' or more) may not
    address, colon, number = rest.rpartition(":") if rest.count(":") == 1 else ("", "", rest)
    host(address if colon else number, field, where, fix, error)
    if colon:
        port(number, field, where, fix, error)
    return text


def key_path(value: Any, field: str, where: str, fix: str,
             error: type[ScalelabError] = InputError) -> str:
    """A private key's path on the controller (ssh -i, ansible_ssh_private_key_file): absolute
    and printable; "" is none.

    >>> key_path("/home/u/.ssh/id_ed25519", "ssh_key", "w", "f")
    '/home/u/.ssh/id_ed25519'
    >>> key_path("id;rm", "ssh_key", "w", "f")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: w: ssh_key 'id;rm' is not an absolute path of printable characters (it is relative or holds a quote, '$', ';' or a control character); f
    """
    text = _text(value, field, "a path", where, fix, error)
    if text and not _PATH.fullmatch(text):
        raise _refuse(value, field, "an absolute path of printable characters",
                      "it is relative or holds a quote, '$', ';' or a control character",
                      where, fix, error)
    return text


def iface(value: Any, field: str, where: str, fix: str,
          error: type[ScalelabError] = InputError) -> str:
    """A network interface's name ("" or None: let the stack pick).

    >>> iface("ens5", "iface", "w", "f"), iface(None, "iface", "w", "f")
    ('ens5', '')
    >>> iface("eth0 up", "iface", "w", "f")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: w: iface 'eth0 up' is not an interface name (it holds ' '); f
    """
    if value is None or value == "":
        return ""
    text = _text(value, field, "an interface name", where, fix, error)
    if not _IFACE.fullmatch(text):
        raise _refuse(value, field, "an interface name", _why(text, rest="._:-"), where, fix,
                      error)
    return text


def node_fields(data: Any, where: str, fix: str,
                error: type[ScalelabError] = InputError) -> None:
    """Every field of a node (a scalelab.cluster.nodes.Node, or its record as a dict) that
    reaches SSH, a shell line or Ansible: name, address, private_address, ssh_user, ssh_port,
    ssh_key, iface and bastion. ``where`` names the node's source (a record's path; "" where
    the message names the node alone).

    >>> node_fields({"name": "n0", "address": "10.0.0.1", "private_address": "10.0.0.1",
    ...              "ssh_user": "root", "ssh_port": 22}, "cluster.json", "fix it")
    >>> node_fields({"name": "n0", "address": "10.0.0.1", "ssh_user": "-oProxyCommand=x"},
    ...             "cluster.json", "restore it")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: cluster.json: node 'n0': ssh_user '-oProxyCommand=x' is not a user name (it starts with '-', so ssh would read it as an option); restore it
    """
    get = data.get if isinstance(data, dict) else lambda k, d=None: getattr(data, k, d)
    name = node_name(get("name"), "node name", where, fix, error)
    at = f"{where + ': ' if where else ''}node {name!r}"
    host(get("address"), "address", at, fix, error)
    host(get("private_address", get("address")), "private_address", at, fix, error)
    login_name(get("ssh_user", "root"), "ssh_user", at, fix, error)
    port(get("ssh_port", 22), "ssh_port", at, fix, error)
    key_path(get("ssh_key", "") or "", "ssh_key", at, fix, error)
    iface(get("iface", ""), "iface", at, fix, error)
    bastion(get("bastion", "") or "", "bastion", at, fix, error)
