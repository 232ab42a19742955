"""One SSH path: every connection scalelab makes takes its options from scalelab.cluster.ssh.options,
and a node behind a bastion is reached through it, with the bastion's host key pinned."""

from __future__ import annotations

import ast
import dataclasses
import shlex

import pytest
from conftest import ROOT, needs_root, needs_sshd, running, wait_until

from scalelab.cluster import inventory, ssh
from scalelab.cluster.nodes import Node

SSH_OPTION_WORDS = ("StrictHostKeyChecking", "UserKnownHostsFile", "ProxyJump",
                    "ProxyCommand", "IdentitiesOnly", "BatchMode", "ServerAlive", "ControlPath",
                    "ControlMaster", "ConnectTimeout")


def _option_strings(path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and not isinstance(getattr(node, "parent", None), ast.Expr):
            if any(w in node.value for w in SSH_OPTION_WORDS) and "\n" not in node.value:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:60]}")
    return found


def test_no_controller_code_but_scalelab_ssh_builds_ssh_options():
    """(Strings with line breaks are docstrings and files for the nodes, such as the local
    target's node-to-node ssh_config, not options of the controller's connections.)"""
    files = [p for p in (ROOT / "scalelab").rglob("*.py") if p.name != "ssh.py"]
    found = [f for p in [*files, ROOT / "tasks.py"] for f in _option_strings(p)]
    assert found == [], "take the options from scalelab.cluster.ssh.options:\n" + "\n".join(found)


def test_ansible_gets_the_same_options_as_scalelabs_own_ssh(tmp_path):
    """The same options, the multiplexing socket included: Ansible finds ControlPath set and
    uses it instead of its own, so its connections and scalelab's are one per node."""
    n = Node("lab-n1", "10.0.0.11", "10.0.0.11", "worker", "static", ssh_key="/k/id",
             ssh_user="ubuntu", bastion="ubuntu@203.0.113.9:2222")
    kh = str(tmp_path / "known_hosts")  # in an existing cluster directory
    host = inventory.render("lab", [n], known_hosts=kh)["all"]["children"]["workers"][
        "hosts"]["lab-n1"]
    given = shlex.split(host["ansible_ssh_common_args"])
    ours = ssh.ssh_args(n, kh)
    # the same options, but the key, which Ansible passes itself
    assert [o for o in ours[1:-3] if o not in ("-i", "/k/id")] == given
    assert host["ansible_ssh_private_key_file"] == "/k/id"
    assert [o for o in given if o.startswith("ControlPath=")] == [
        f"ControlPath={ssh.mux_dir(kh)}/{o.rsplit('/', 1)[1]}" for o in given
        if o.startswith("ControlPath=")] != []
    # an idle connection, to the node and to its bastion, closes itself after 60 s
    assert given.count("ControlPersist=60") == 1
    hop = next(o for o in given if o.startswith("ProxyCommand="))
    assert "ControlPersist=60" in shlex.split(hop.split("=", 1)[1])


@pytest.mark.root
@needs_root
@needs_sshd
def test_a_node_behind_a_bastion_is_reached_through_it(local_cluster, tmp_path):
    """Three emulated machines: the first is the bastion. Every command to the others goes
    through it (their sshd sees the connection come from the bastion's address), and the
    hop checks the bastion's host key against the cluster's known_hosts. On the same
    cluster (one provision for three checks): the user's ~/.ssh/config forwards nothing of
    scalelab's (_no_agent_reaches_a_node), and horovodrun's node-to-node SSH checks the
    pinned host keys (_horovods_ssh_checks_the_pinned_keys)."""
    lc = local_cluster(3)
    _no_agent_reaches_a_node(lc, tmp_path)
    _horovods_ssh_checks_the_pinned_keys(lc)
    nodes = lc.nodes()
    kh = str(lc.known_hosts)
    jump = f"{nodes[0].ssh_user}@{nodes[0].address}"
    behind = [dataclasses.replace(n, bastion=jump) for n in nodes[1:]]
    for n in behind:
        seen_from = ssh.run(n, kh, "echo $SSH_CONNECTION", timeout=30).stdout.split()[0]
        assert seen_from == nodes[0].private_address
        direct = ssh.run(nodes[1], kh, "echo $SSH_CONNECTION", timeout=30).stdout.split()[0]
        assert direct != nodes[0].private_address
    # a bastion whose host key is not the pinned one is refused, not trusted on first use
    other = lc.dir / "other_known_hosts"
    kept = [line for line in lc.known_hosts.read_text().splitlines(True)
            if nodes[0].address not in line.split()[0].split(",")]
    assert len(kept) == len(nodes) - 1  # only the bastion's key is gone
    other.write_text("".join(kept))
    proc = ssh.run(behind[0], str(other), "true", timeout=30, check=False)
    assert proc.returncode != 0


def _no_agent_reaches_a_node(lc, tmp_path) -> None:
    """The user's ~/.ssh/config says ForwardAgent yes and ForwardX11 yes, and an agent runs
    (SSH_AUTH_SOCK set): a command scalelab sends to a node, directly and through the
    bastion, finds no agent socket there."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    from test_validate import fake_home, in_fake_home

    home = fake_home(tmp_path, "Host *\n ForwardAgent yes\n ForwardX11 yes\n")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    # connections of their own (their known_hosts names other sockets): none rides a
    # connection opened before the config said anything
    kh = tmp_path / "kh" / "known_hosts"
    kh.parent.mkdir(mode=0o700)
    shutil.copy(lc.known_hosts, kh)
    try:
        wait_until(sock.exists, 10, "ssh-agent's socket")
        nodes = lc.nodes()
        jump = f"{nodes[0].ssh_user}@{nodes[0].address}"
        targets = [nodes[1], dataclasses.replace(nodes[1], bastion=jump),
                   dataclasses.replace(nodes[2], bastion=jump)]
        code = ("import json, sys\n"
                "from scalelab.cluster import ssh\n"
                "from scalelab.cluster.nodes import Node\n"
                "print(json.dumps([ssh.run(Node.from_dict(n), sys.argv[2], "
                "'echo ${SSH_AUTH_SOCK:-none}', timeout=30).stdout.strip() "
                "for n in json.loads(sys.argv[1])]))")
        proc = in_fake_home(home, [sys.executable, "-c", code,
                                   json.dumps([n.to_dict() for n in targets]), str(kh)],
                            env={"SSH_AUTH_SOCK": str(sock)}, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout.splitlines()[-1]) == ["none"] * 3
    finally:
        ssh.close_masters(str(kh))
        agent.terminate()
        agent.wait(timeout=10)
        wait_until(lambda: not os.path.exists(sock), 5, "the agent's socket to go")


def _horovods_ssh_checks_the_pinned_keys(lc) -> None:
    """horovodrun's own ssh line (StrictHostKeyChecking=no), run the way scalelab launches
    horovodrun on the head node: a node whose host key is pinned answers; one whose key is
    not pinned, or is pinned to another key, is refused. Then the real horovodrun, launched
    as a sweep launches it, is refused at its SSH check on the unpinned node."""
    import importlib.util
    import random

    if importlib.util.find_spec("horovod") is None:
        pytest.skip("horovod is not installed in the project venv; run ./bootstrap.sh")
    from horovod.runner.util.remote import get_remote_command

    from scalelab.cluster.targets import local
    from scalelab.run import commands

    nodes = lc.nodes()
    kh = str(lc.known_hosts)
    rt = local.LocalTarget().runtime(lc.load())
    cmd = commands.horovodrun_commands([nodes[0], nodes[2]], 1, "resnet.py",
                                       ["--model", "resnet20", "--steps", "1"], rt,
                                       random.randint(29600, 29900))[0]
    horovodrun = f"{rt.python.rsplit('/', 1)[0]}/horovodrun"
    prefix = cmd.argv[:cmd.argv.index(horovodrun)]  # what scalelab runs horovodrun under

    def horovods_ssh(command: str) -> object:
        line = get_remote_command(command, host=nodes[2].private_address, timeout_s=10)
        probe = commands.RankCommand(nodes[0], [*prefix, "sh", "-c", line], cmd.env)
        return ssh.run(nodes[0], kh, commands.remote_line(probe, "/tmp"), timeout=60,
                       check=False)

    pinned = lc.dir / "node-shared" / "known_hosts"  # the nodes' /etc/scalelab/known_hosts
    kept = pinned.read_text()
    lines = kept.splitlines(True)
    other = [ln for ln in lines if not ln.startswith(f"{nodes[2].name},")]
    wrong_key = lines[0].split()[1:]  # the head's key, said to be node 2's
    assert len(other) == len(lines) - 1
    try:
        ok = horovods_ssh("hostname")
        assert ok.returncode == 0 and ok.stdout.strip() == nodes[2].name, ok.stderr
        for text in ("".join(other),
                     "".join(other) + f"{nodes[2].name},{nodes[2].address} "
                     f"{' '.join(wrong_key)}\n"):
            tmp = pinned.with_name("known_hosts.new")
            tmp.write_text(text)
            tmp.chmod(0o644)
            tmp.replace(pinned)
            refused = horovods_ssh("touch /tmp/scalelab-horovod-ssh-reached-it")
            assert refused.returncode != 0
            assert "Host key verification failed" in refused.stderr, refused.stderr
            # nothing ran on node 2
            assert ssh.run(nodes[2], kh, "ls /tmp/scalelab-horovod-ssh-reached-it",
                           check=False).returncode != 0
        # the real horovodrun, as a sweep starts it, with node 2 unpinned
        tmp = pinned.with_name("known_hosts.new")
        tmp.write_text("".join(other))
        tmp.replace(pinned)
        real = ssh.run(nodes[0], kh, commands.remote_line(cmd, rt.workdir), timeout=180,
                       check=False)
        assert real.returncode != 0
        assert "Host key verification failed" in real.stdout + real.stderr, real.stdout[-2000:]
    finally:
        tmp = pinned.with_name("known_hosts.new")
        tmp.write_text(kept)
        tmp.chmod(0o644)
        tmp.replace(pinned)


@pytest.mark.root
@needs_root
@needs_sshd
def test_a_login_user_without_sudo_is_refused_before_configure_changes_anything(
        local_cluster, tmp_path):
    """Hosts handed over with an account of the user's own and no passwordless sudo: configure
    says in one line what needs sudo, with nothing changed on any host."""
    import json
    import os
    from pathlib import Path

    from conftest import invoke, unique_name

    lc = local_cluster(2)
    machines = lc.nodes()
    kh = str(lc.known_hosts)
    for m in machines:
        # -p '*': no password, yet not a locked account (sshd refuses those without PAM)
        ssh.run(m, kh, "useradd -m -d /home/alice -s /bin/sh -p '*' alice && "
                       "mkdir -p /home/alice/.ssh && "
                       "cp /root/.ssh/authorized_keys /home/alice/.ssh/ && "
                       "chown -R alice: /home/alice/.ssh && chmod 700 /home/alice/.ssh",
                timeout=30)
    before = [ssh.run(m, kh, "cat /etc/hosts", timeout=30).stdout for m in machines]
    var_file = tmp_path / "lab.tfvars.json"
    var_file.write_text(json.dumps({
        "hosts": [{"name": machines[0].name, "address": machines[0].address, "role": "head"},
                  {"name": machines[1].name, "address": machines[1].address}],
        "ssh_user": "alice", "ssh_private_key_file": str(lc.key)}))
    lab = unique_name("lab")
    state = Path(os.environ["SCALELAB_HOME"]) / "clusters" / lab
    try:
        proc = invoke("provision", "--target", "static", "--cluster", lab, "--nodes", "2",
                      "--var-file", str(var_file), timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        (state / "known_hosts").write_text(lc.known_hosts.read_text())
        proc = invoke("configure", "--cluster", lab, "--tags", "common", timeout=300)
        assert proc.returncode != 0
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0] == (
            f"error: node {machines[0].name}: user alice may not sudo without a password, "
            "which configure needs (packages, /opt/scalelab, /etc/hosts, tc); ask the host's "
            "admins for passwordless sudo, or log in as root (ssh_user in the var-file); "
            "already configured nodes can still be benchmarked without it, unshaped")
        after = [ssh.run(m, kh, "cat /etc/hosts", timeout=30).stdout for m in machines]
        assert after == before
    finally:
        if (state / "cluster.json").exists():
            invoke("destroy", "--cluster", lab, timeout=300)


def test_a_shaped_rate_on_nodes_without_sudo_is_refused_and_native_runs(tmp_path):
    """Configured nodes whose login user has no passwordless sudo: tc cannot set a rate."""
    import json

    from conftest import invoke, unique_name
    from test_targets import configured_record

    name = unique_name("ns")
    state = tmp_path / "state"
    (state / "clusters" / name).mkdir(parents=True, mode=0o700)
    rec = configured_record(name, "static", n=2)
    for n in rec["nodes"]:
        n["ssh_user"] = "alice"
        n["facts"].update({"sudo": "no", "user": "alice"})
    (state / "clusters" / name / "cluster.json").write_text(json.dumps(rec))
    env = {"SCALELAB_HOME": str(state), "SCALELAB_REPORTS": str(tmp_path / "reports"),
           "SCALELAB_INVENTORIES": str(tmp_path / "inv")}
    args = ["bench", "--cluster", name, "--nodes", "1-2", "--batch-size", "32", "--model",
            "resnet20", "--dry-run"]
    proc = invoke(*args, "--bandwidth", "1gbit", env=env)
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"error: --bandwidth 1gbit: node {name}-n0's user alice may not sudo without a "
        "password, which tc needs to set the rate; use --bandwidth native, or ask the host's "
        "admins for passwordless sudo")
    assert invoke(*args, env=env).returncode == 0


def test_parallel_commands_are_bounded_so_a_bastion_never_refuses_them():
    """sshd drops new connections above MaxStartups (10 by default): on_each opens at most
    ssh.MAX_PARALLEL at once, however many nodes there are."""
    import threading

    busy = peak = 0
    full = threading.Condition()

    def fn(n: Node) -> str:
        nonlocal busy, peak
        with full:
            busy += 1
            peak = max(peak, busy)
            full.notify_all()
            # hold the slot until every slot is taken: a 9th running at once would show
            full.wait_for(lambda: peak >= ssh.MAX_PARALLEL, timeout=5)
            busy -= 1
        return n.name

    nodes = [Node(f"c-n{i}", f"10.0.0.{i + 10}", f"10.0.0.{i + 10}", "worker", "static")
             for i in range(24)]
    results, errors = ssh.on_each(nodes, fn, timeout_s=30)
    assert errors == {} and len(results) == 24
    assert peak == ssh.MAX_PARALLEL < 10


def _client(node: Node, kh: str, **kw) -> tuple[str, str]:
    """The (address, port) the node's sshd sees this command's connection come from."""
    import subprocess

    argv = ssh.ssh_args(node, kh, **kw) + ["--", "echo $SSH_CONNECTION"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True,
                         stdin=subprocess.DEVNULL).stdout.split()
    return out[0], out[1]


@pytest.mark.root
@needs_root
@needs_sshd
def test_commands_to_a_node_share_one_connection_until_destroy(local_cluster, monkeypatch):
    """Commands to a node ride one multiplexed connection (the node's sshd sees the same
    client port each time); a rank gets a connection of its own; the bastion carries every
    hop on one connection; SCALELAB_SSH_MUX=0 turns it off; destroy closes them all."""
    import os
    import re
    import subprocess

    from scalelab.run import launch

    lc = local_cluster(3)
    nodes = lc.nodes()
    kh = str(lc.known_hosts)
    first = _client(nodes[1], kh)
    assert _client(nodes[1], kh) == first == _client(nodes[1], kh)
    rank = subprocess.run(launch.ssh_argv(nodes[1], kh) + ["--", "echo $SSH_CONNECTION"],
                          capture_output=True, text=True, timeout=30, check=True,
                          stdin=subprocess.DEVNULL).stdout.split()[1]
    assert rank != first[1]
    # two nodes behind the bastion: the bastion's sshd holds one connection from us, which
    # also carries this command to the bastion itself
    jump = f"{nodes[0].ssh_user}@{nodes[0].address}"
    for n in nodes[1:]:
        ssh.run(dataclasses.replace(n, bastion=jump), kh, "true", timeout=30)
    established = ssh.run(nodes[0], kh, "ss -Htn state established '( sport = :22 )'",
                          timeout=30).stdout.splitlines()
    from_us = [line for line in established if line.split()[-1].startswith(f"{first[0]}:")]
    assert len(from_us) == 1, established
    monkeypatch.setenv(ssh.MUX_ENV, "0")
    assert _client(nodes[1], kh) != _client(nodes[1], kh)
    monkeypatch.delenv(ssh.MUX_ENV)
    # at the longest socket directory kept beside known_hosts, and one byte past it (then
    # under /tmp): a master binds a temporary name 17 bytes longer, so both must still share
    import shutil
    import tempfile
    from pathlib import Path
    for extra in (0, 1):
        base = Path(tempfile.mkdtemp(prefix="slmx", dir="/tmp"))
        try:
            deep = base / ("x" * (63 + extra - len(str(base)) - 9))
            deep.mkdir()
            kh2 = str(deep / "known_hosts")
            shutil.copy(kh, kh2)
            got = ssh.mux_dir(kh2)
            assert (len(got) == 63) if not extra else got.startswith("/tmp/scalelab-ssh-")
            assert _client(nodes[1], kh2) == _client(nodes[1], kh2)
            ssh.close_masters(kh2)
            assert not os.path.exists(got)
        finally:
            shutil.rmtree(base)
    # node 1 directly, the bastion, nodes 1 and 2 through it
    where = ssh.mux_dir(kh)
    sockets = [os.path.join(where, s) for s in os.listdir(where)]
    assert len(sockets) == 4
    masters = []
    for sock in sockets:
        check = subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "check", "x"],
                               capture_output=True, text=True, timeout=15)
        masters.append(int(re.search(r"pid=(\d+)", check.stderr).group(1)))
    lc.destroy()
    assert not os.path.exists(where)

    # -O exit is answered before the master has exited
    wait_until(lambda: not any(running(p) for p in masters), 5, "the masters to exit")
