"""No input becomes a command or an option: what scalelab.core.validate lets through needs no
quoting anywhere, and every ssh argv scalelab builds ignores the user's own ~/.ssh/config."""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import string
import subprocess
from pathlib import Path

import pytest
from conftest import needs_root
from hypothesis import given, settings
from hypothesis import strategies as st

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node
from scalelab.core import validate
from scalelab.core.errors import ClusterError, InputError

CHECKS = {"user": validate.login_name, "host": validate.host, "name": validate.node_name,
          "iface": validate.iface}


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(CHECKS)),
       st.one_of(st.text(max_size=40), st.text(alphabet=string.printable, max_size=40),
                 st.text(alphabet=string.ascii_letters + "-._:@ ;$", max_size=12)))
def test_whatever_a_check_lets_through_is_one_plain_word(kind, value):
    """Any text at all: refused with one line, or a word that is no option and that a shell
    takes as it is (shlex.quote leaves it alone)."""
    try:
        got = CHECKS[kind](value, "field", "where", "the fix")
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("where: field ")
        assert str(exc).endswith("; the fix")
        return
    assert got == "" or (not got.startswith("-") and shlex.quote(got) == got)
    assert not any(c in got for c in " \t\n'\"`$;&|<>()\\*?[]{}!#~%@/")


@pytest.mark.parametrize(("field", "value"), [
    ("ssh_user", "-oProxyCommand=touch /tmp/pwned"), ("ssh_user", "root@evil"),
    ("ssh_user", "a b"), ("ssh_user", "$(id)"), ("ssh_user", "`id`"), ("ssh_user", "x'y"),
    ("ssh_user", ""), ("ssh_user", None), ("address", "-oProxyCommand=x"),
    ("address", "10.0.0.1;id"), ("address", "h\nx"), ("address", "%h"),
    ("private_address", "10.0.0.1 10.0.0.2"), ("name", "n0;reboot"), ("name", "-n0"),
    ("ssh_port", "22 -oX"), ("ssh_port", 0), ("ssh_port", True), ("ssh_key", "rel/key"),
    ("ssh_key", "/k/id\n-oX"), ("iface", "eth0;id"), ("bastion", "u@-oProxyCommand=x"),
    ("bastion", "-oProxyCommand=x@h"), ("bastion", "u@h:22;id"),
])
def test_a_node_record_edited_to_hold_an_option_or_a_shell_word_is_refused(field, value):
    """Read back from disk (Node.from_dict), a value scalelab would not have written is a
    ClusterError naming the record, the node and the field; built in code, an InputError."""
    good = {"name": "lab-n0", "address": "192.0.2.10", "private_address": "10.0.0.10",
            "role": "head", "target": "static", "ssh_user": "ubuntu", "ssh_port": 22,
            "ssh_key": "/home/u/.ssh/id_ed25519", "iface": "ens5",
            "bastion": "ubuntu@203.0.113.5:2222"}
    assert Node.from_dict(good, "/s/cluster.json").bastion == "ubuntu@203.0.113.5:2222"
    with pytest.raises(ClusterError) as exc:
        Node.from_dict({**good, field: value}, "/s/cluster.json")
    line = str(exc.value)
    assert "\n" not in line and line.startswith("/s/cluster.json: ")
    assert f" {field} " in line or f"{field} " in line.split(": ", 1)[1]
    assert "put back what the var-file or the target gave" in line
    with pytest.raises(InputError):
        Node(**{k: v for k, v in {**good, field: value}.items()})


# ------------------------------------------------------------------ the user's ~/.ssh/config

HOSTILE_CONFIG = "Host *\n ForwardAgent yes\n ForwardX11 yes\n ProxyCommand false %h\n"


def in_fake_home(home: Path, argv: list[str], env: dict | None = None,
                 timeout: float = 60) -> subprocess.CompletedProcess:
    """argv run where the user's home (OpenSSH reads ~/.ssh/config from the password
    database's home, not $HOME) shows what `home` holds over what it held: an overlay in a
    mount namespace of its own, so nothing of the machine's own home changes and the rest
    of it (a pyenv's interpreter, say) is still there."""
    real = pwd.getpwuid(os.getuid()).pw_dir
    work = home.with_name(home.name + "-work")
    work.mkdir(exist_ok=True)
    opts = f"lowerdir={real},upperdir={home},workdir={work}"
    line = (f"mount -t overlay overlay -o {shlex.quote(opts)} {shlex.quote(real)} && "
            f"exec {shlex.join(argv)}")
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", line],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def fake_home(tmp_path: Path, config: str = HOSTILE_CONFIG) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    (home / ".ssh" / "config").write_text(config)
    os.chmod(home / ".ssh" / "config", 0o600)
    return home


def settings_of(text: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


@pytest.mark.root
@needs_root
def test_every_ssh_scalelab_builds_ignores_the_users_ssh_config(tmp_path):
    """~/.ssh/config says ForwardAgent yes, ForwardX11 yes and a ProxyCommand for every host:
    `ssh -G` on the argv scalelab builds (to a node, to a rank's node, the bastion hop, and
    Ansible's) reports no forwarding and no proxy but the hop scalelab made."""
    home = fake_home(tmp_path)
    plain = settings_of(in_fake_home(home, ["ssh", "-G", "192.0.2.10"]).stdout)
    # the file is read where scalelab does not say otherwise: the test is not vacuous
    assert plain["forwardagent"] == "yes" and plain["forwardx11"] == "yes", plain
    assert plain["proxycommand"] == "false %h"

    kh = str(tmp_path / "known_hosts")
    direct = Node("lab-n0", "192.0.2.10", "10.0.0.10", "head", "static", ssh_key="/k/id",
                  ssh_user="ubuntu")
    behind = Node("lab-n1", "10.0.0.11", "10.0.0.11", "worker", "static", ssh_key="/k/id",
                  ssh_user="ubuntu", bastion="ubuntu@203.0.113.5:2222")
    from scalelab.cluster import inventory
    from scalelab.run import launch

    argvs = {"node": ssh.ssh_args(direct, kh), "rank": launch.ssh_argv(direct, kh),
             "behind": ssh.ssh_args(behind, kh)}
    hop = next(o for o in argvs["behind"] if o.startswith("ProxyCommand="))
    argvs["hop"] = [a.replace("%h:%p", "10.0.0.11:22") for a in
                    shlex.split(hop.split("=", 1)[1])]
    host = inventory.render("lab", [behind], known_hosts=kh)["all"]["children"]["workers"][
        "hosts"]["lab-n1"]
    argvs["ansible"] = ["ssh", *shlex.split(host["ansible_ssh_common_args"]), "-p", "22",
                        "ubuntu@10.0.0.11"]
    for what, argv in argvs.items():
        assert argv[0] == "ssh", what
        shown = in_fake_home(home, [argv[0], "-G", *argv[1:]])
        assert shown.returncode == 0, (what, shown.stderr)
        got = settings_of(shown.stdout)
        assert (got["forwardagent"], got["forwardx11"], got["clearallforwardings"]) == (
            "no", "no", "yes"), what
        assert got.get("proxycommand", "none") != "false %h", what
        assert got["stricthostkeychecking"] == "true", what


def test_the_pinned_ssh_wrapper_drops_horovods_options(tmp_path):
    """horovodrun's own ssh line (horovod/runner/util/remote.py), through the `ssh` scalelab
    puts first on its PATH: strict host-key checking against the pinned files, no
    forwarding, whatever horovodrun passes (ssh -G shows the settings it would connect with)."""
    remote = pytest.importorskip("horovod.runner.util.remote")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    line = remote.get_ssh_command("true", "10.0.0.11", port=2222, timeout_s=10)
    assert "StrictHostKeyChecking=no" in line  # what horovodrun asks for itself
    # ssh -G in place of ssh: the wrapper execs "$SCALELAB_SSH" with the options it built
    (bindir / "ssh-G").write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -G "$@"\n')
    os.chmod(bindir / "ssh-G", 0o755)
    argv = ssh.with_pinned_ssh(["sh", "-c", line])
    script = argv[2].replace("real=$(command -v ssh)", f"real={bindir}/ssh-G")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.run([*argv[:2], script, *argv[3:]], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL,
                          env={**os.environ, "TMPDIR": str(scratch)})
    assert proc.returncode == 0, proc.stderr
    got = settings_of(proc.stdout)
    assert got["stricthostkeychecking"] == "true"
    assert got["userknownhostsfile"] == "/dev/null"
    assert got["globalknownhostsfile"].split() == list(ssh.NODE_PINNED)
    assert (got["forwardagent"], got["forwardx11"], got["port"]) == ("no", "no", "2222")
    assert got["passwordauthentication"] == "no" and got["connecttimeout"] == "10"
    # the wrapper's private directory went with the command
    assert list(scratch.iterdir()) == []
