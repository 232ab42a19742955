"""scalelab.cluster.configure and playbooks/: the runner wrapper's pure parts, then site.yml for real
against a 2-node local cluster (converge, converge again with no change, observable state)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import wait_listening

from scalelab.cluster import configure as cfg
from scalelab.cluster import ssh
from scalelab.cluster.configure import ConfigureError, Failure, Progress
from scalelab.cluster.targets import Capabilities, localhost
from scalelab.core import sh

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ pure parts (fast)

def test_runner_gets_json_events_quiet_output_and_no_env_files():
    kw = cfg.runner_kwargs(private_data_dir=Path("/s/c/ansible"), playbook="site.yml",
                           inventory=Path("/inv/c.yml"), extravars={"netshape_rate": "1gbit"},
                           tags=["nfs", "pytorch"], skip_tags=["jupyterlab"], check=True,
                           limit="c-n1", timeout_s=120, ident="x", playbook_dir=Path("/p"),
                           path="/venv/bin:/usr/bin")
    assert kw == {
        "private_data_dir": "/s/c/ansible", "project_dir": "/p", "playbook": "site.yml",
        "inventory": "/inv/c.yml", "extravars": {"netshape_rate": "1gbit"}, "ident": "x",
        "json_mode": True, "quiet": True, "suppress_env_files": True, "rotate_artifacts": 10,
        "timeout": 120, "tags": "nfs,pytorch", "skip_tags": "jupyterlab", "limit": "c-n1",
        "cmdline": "--check --diff",
        "envvars": {"ANSIBLE_CONFIG": "/p/ansible.cfg", "ANSIBLE_HOST_KEY_CHECKING": "True",
                    "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "False",
                    "PATH": "/venv/bin:/usr/bin"},
    }
    plain = cfg.runner_kwargs(private_data_dir=Path("/s"), playbook="site.yml",
                              inventory=Path("/i"), extravars={})
    assert "cmdline" not in plain and "tags" not in plain and "limit" not in plain


def test_tags_are_checked_against_site_yml():
    allowed = cfg.known_tags()
    assert {"common", "nfs", "pytorch", "horovod", "jupyterlab", "netshape"} <= set(allowed)
    assert cfg.parse_tags(["netshape", "nfs", "netshape"], allowed) == ["netshape", "nfs"]
    with pytest.raises(cfg.InputError, match="'jupyter' is not a role tag"):
        cfg.parse_tags("jupyter", allowed)


def test_events_become_progress_per_host_and_task():
    ev = {"event": "runner_on_failed", "event_data": {
        "host": "c-n1", "task": "Mount the share", "play": "Mount", "ignore_errors": False,
        "res": {"msg": "non-zero return code", "rc": 32, "stderr": "mount.nfs: timed out\n"}}}
    assert cfg.progress_from_event(ev) == Progress(
        "failed", play="Mount", task="Mount the share", host="c-n1",
        message="non-zero return code (rc 32): mount.nfs: timed out")
    assert cfg.failure_from_event(ev) == Failure(
        "c-n1", "Mount the share", "non-zero return code (rc 32): mount.nfs: timed out")
    assert cfg.progress_from_event({"event": "playbook_on_stats", "event_data": {}}) is None
    skipped = {"event": "runner_on_skipped", "event_data": {"host": "c-n0", "task": "t"}}
    assert cfg.progress_from_event(skipped).kind == "skipped"
    assert cfg.failure_from_event(skipped) is None
    unreachable = {"event": "runner_on_unreachable", "event_data": {
        "host": "c-n0", "task": "Gathering Facts", "res": {"msg": "ssh: connect to host 10.0.0.1"}}}
    assert cfg.failure_from_event(unreachable).host == "c-n0"


def test_a_hidden_result_stays_hidden_in_the_error():
    ev = {"event": "runner_on_failed", "event_data": {
        "host": "c-n0", "task": "Install the cluster private key",
        "res": {"censored": "the output has been hidden due to the fact that 'no_log: true'",
                "msg": "-----BEGIN OPENSSH PRIVATE KEY-----"}}}
    msg = cfg.failures_message("c", "site.yml", "failed", 2, [cfg.failure_from_event(ev)], 60)
    assert "PRIVATE KEY" not in msg and "output hidden (no_log)" in msg


def test_error_names_failed_hosts_and_tasks_or_why_nothing_ran():
    msg = cfg.failures_message("c", "site.yml", "failed", 2, [
        Failure("c-n0", "A", "boom"), Failure("c-n1", "A", "boom"), Failure("c-n1", "B", "x")], 60)
    assert msg == 'configure c (site.yml) failed: c-n0, c-n1: task "A": boom; c-n1: task "B": x'
    early = cfg.failures_message("c", "site.yml", "failed", 4, [], 60,
                                 "noise\nERROR! the role 'nope' was not found\n")
    assert early.endswith("ERROR! the role 'nope' was not found")
    assert "did not finish within 60 s" in cfg.failures_message("c", "x", "timeout", 254, [], 60)


def test_recorded_command_keeps_no_environment(tmp_path):
    (tmp_path / "command").write_text(json.dumps({
        "command": ["ansible-playbook"], "cwd": "/p",
        "env": {"AWS_SECRET_ACCESS_KEY": "s3cr3t", "ANSIBLE_CONFIG": "/p/ansible.cfg"}}))
    cfg.scrub_command_artifact(tmp_path)
    data = json.loads((tmp_path / "command").read_text())
    assert data["env"] == {"ANSIBLE_CONFIG": "/p/ansible.cfg"}


def test_unknown_cluster_is_a_clear_error():
    from scalelab.core.errors import ClusterError

    with pytest.raises(ClusterError, match="not found"):
        cfg.run("ans-nosuch")


# ------------------------------------------------------------------ for real (root, slow)

IS_ROOT = os.geteuid() == 0
HOST_TOOLS = ("/usr/sbin/sshd", "/usr/bin/ganesha.nfsd", "/usr/bin/nfs-ls", "/usr/bin/iperf3")
live = [
    pytest.mark.root, pytest.mark.slow,
    pytest.mark.skipif(not IS_ROOT, reason="needs root: the local target uses namespaces"),
    pytest.mark.skipif(not all(Path(p).exists() for p in HOST_TOOLS),
                       reason="openssh-server, nfs-ganesha, libnfs-utils or iperf3 missing "
                              "(./bootstrap.sh installs them)"),
]
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def cluster():
    """A 2-node local cluster configured once with site.yml; always destroyed."""
    from scalelab.cluster.targets.local import LocalCluster

    lc = LocalCluster(f"ans{uuid.uuid4().hex[:4]}")
    try:
        lc.provision(2)
        lines: list[str] = []
        started = time.monotonic()
        first = cfg.run(lc.name, progress=lambda p: lines.append(cfg.format_progress(p) or ""))
        TIMINGS["site.yml, first run"] = time.monotonic() - started
        yield lc, first, lines
    finally:
        lc.destroy()
        # shown with pytest -s: how long the live Ansible runs took on this machine
        for what, secs in TIMINGS.items():
            print(f"timing: {what}: {secs:.1f} s")


def on(lc, i: int, cmd: str, timeout: float = 60, check: bool = True):
    return ssh.run(lc.nodes()[i], str(lc.known_hosts), cmd, timeout=timeout, check=check)


class TestSiteOnALocalCluster:
    pytestmark = live

    def test_site_converges_and_a_second_run_changes_nothing(self, cluster):
        lc, first, lines = cluster
        assert first.status == "successful" and first.rc == 0
        assert first.changed > 0
        assert set(first.stats) == {n.name for n in lc.nodes()}
        assert any(line.startswith("PLAY ") for line in lines)
        assert any(": changed  " in line for line in lines)
        started = time.monotonic()
        second = cfg.run(lc.name)
        TIMINGS["site.yml, second run"] = time.monotonic() - started
        assert second.changed == 0, {h: s for h, s in second.stats.items() if s["changed"]}

    def test_nodes_reach_each_other_with_the_cluster_key_and_pinned_host_keys(self, cluster):
        lc, _, _ = cluster
        n0, n1 = lc.nodes()
        strict = ("ssh -F /dev/null -i ~/.ssh/id_scalelab -o IdentitiesOnly=yes "
                  "-o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=5 "
                  "-o UserKnownHostsFile=/dev/null")
        pinned = f"{strict} -o GlobalKnownHostsFile=/etc/ssh/ssh_known_hosts"
        assert on(lc, 0, f"{pinned} root@{n1.name} hostname").stdout.strip() == n1.name
        assert on(lc, 1, f"{pinned} root@{n0.private_address} hostname").stdout.strip() == n0.name
        # what mpirun does: plain ssh by name, through the ~/.ssh/config block
        assert on(lc, 0, f"ssh {n1.name} hostname").stdout.strip() == n1.name
        # without the pinned keys the same login is refused: pinning is what lets it in
        refused = on(lc, 0, f"{strict} -o GlobalKnownHostsFile=/dev/null root@{n1.name} true",
                     check=False)
        assert refused.returncode != 0 and "verification failed" in refused.stderr.lower()
        mode = on(lc, 1, "stat -c %a ~/.ssh/id_scalelab").stdout.strip()
        assert mode == "600"

    def test_netshape_sets_the_rate_reads_it_back_and_the_link_carries_it(self, cluster):
        lc, _, _ = cluster
        started = time.monotonic()
        r = cfg.run(lc.name, tags="netshape", extravars={"netshape_rate": "100mbit"})
        TIMINGS["netshape 100mbit"] = time.monotonic() - started
        assert r.changed == 2
        again = cfg.run(lc.name, tags="netshape", extravars={"netshape_rate": "100mbit"})
        assert again.changed == 0
        for i in (0, 1):
            shown = json.loads(on(lc, i, "tc -j qdisc show dev eth0 root").stdout)
            assert shown[0]["kind"] == "tbf" and shown[0]["options"]["rate"] * 8 == 100_000_000
        mbit = _iperf_mbit(lc, server=0, client=1, seconds=3)
        assert 60 <= mbit <= 105, f"measured {mbit:.1f} Mbit/s through a 100mbit tbf"
        cleared = cfg.run(lc.name, tags="netshape", extravars={"netshape_rate": "native"})
        assert cleared.changed == 2
        for i in (0, 1):
            assert "tbf" not in on(lc, i, "tc -j qdisc show dev eth0 root").stdout

    def test_environment_imports_the_pinned_torch_on_every_node(self, cluster):
        lc, _, _ = cluster
        py = ROOT / ".venv" / "bin" / "python"
        for i in (0, 1):
            out = on(lc, i, f"{py} -c 'import torch; print(torch.__version__)'").stdout
            assert out.strip().split("+")[0] == "2.13.0"

    def test_horovodrun_runs_one_rank_on_each_node(self, cluster):
        lc, _, _ = cluster
        # bootstrap builds Horovod (scripts/build_horovod.sh): a missing one fails here
        assert importlib.util.find_spec("horovod") is not None, \
            "horovod is not installed in the project venv; run ./bootstrap.sh"
        r = cfg.run(lc.name, tags="horovod", extravars={"horovod_required": True})
        assert r.changed == 0
        n0, n1 = lc.nodes()
        bindir = ROOT / ".venv" / "bin"
        prog = ("import horovod.torch as hvd, socket; hvd.init(); "
                "print('rank', hvd.rank(), 'of', hvd.size(), 'on', socket.gethostname())")
        out = on(lc, 0, f"cd /tmp && PATH={bindir}:$PATH timeout 120 {bindir}/horovodrun --gloo "
                        f"--network-interfaces eth0 -np 2 -H {n0.name}:1,{n1.name}:1 "
                        f"{bindir}/python -c \"{prog}\"", timeout=150).stdout
        assert "of 2 on " + n0.name in out and "of 2 on " + n1.name in out, out

    def test_nfs_export_shows_a_file_written_on_the_head_to_workers_only(self, cluster):
        lc, _, _ = cluster
        head = lc.nodes()[0]
        name = f"probe-{uuid.uuid4().hex[:6]}.txt"
        on(lc, 0, f"echo written-on-the-head > /srv/scalelab/results/{name}")
        url = f"nfs://{head.private_address}/srv/scalelab/results"
        assert name in on(lc, 1, f"nfs-ls '{url}?version=4'").stdout
        on(lc, 1, f"nfs-cp '{url}/{name}?version=4' /tmp/{name}")
        assert on(lc, 1, f"cat /tmp/{name}").stdout.strip() == "written-on-the-head"
        # the controller is not a cluster node: the export refuses it
        refused = sh.run(["nfs-ls", f"{url}?version=4"], check=False, timeout=30)
        assert refused.returncode != 0

    def test_ganesha_listens_on_the_cluster_address_only(self, cluster):
        lc, _, _ = cluster
        local_ends = _listening(lc, 0, 2049)
        assert local_ends and all(a.endswith(f"{lc.nodes()[0].private_address}]:2049")
                                  or a == f"{lc.nodes()[0].private_address}:2049"
                                  for a in local_ends), local_ends

    def test_jupyterlab_answers_through_an_ssh_tunnel_only(self, cluster):
        """JupyterLab listens on the head's loopback only (plain HTTP never leaves the node):
        the cluster address refuses the connection, and the tunnel command configure gives
        (README) reaches it, answering with the token and refusing without."""
        lc, _, _ = cluster
        head = lc.nodes()[0]
        token_file = lc.dir / "jupyter_token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert _listening(lc, 0, 8888) == ["127.0.0.1:8888"]
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://{head.private_address}:8888/api/status", timeout=10)
        tunnel = cfg.jupyter_tunnel(lc.name)
        assert tunnel == f"ssh -N -L 8888:127.0.0.1:8888 root@{head.address}"
        # the user's ssh would find the key and the host key in ~/.ssh; the test names them
        local = _free_port()
        argv = tunnel.split()
        argv[argv.index("-L") + 1] = f"{local}:127.0.0.1:8888"
        argv[1:1] = ["-F", "none", "-i", str(lc.key), "-o", "IdentitiesOnly=yes",
                     "-o", f"UserKnownHostsFile={lc.load()['known_hosts']}",
                     "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                     "-o", "ExitOnForwardFailure=yes"]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            url = f"http://127.0.0.1:{local}/api/status"
            deadline = time.monotonic() + 20
            while True:
                try:
                    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
                    with urllib.request.urlopen(req, timeout=10) as resp:
                        assert resp.status == 200
                    break
                except urllib.error.URLError:
                    assert proc.poll() is None, proc.stderr.read()
                    assert time.monotonic() < deadline
                    time.sleep(0.3)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url, timeout=10)
            assert refused.value.code == 403
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        assert token not in on(lc, 0, "ps -eo args").stdout

    def test_real_host_paths_run_in_check_mode_and_change_nothing(self, cluster):
        """What cannot run here (kernel NFS, chrony, a new venv, the Horovod build, a systemd
        unit, Docker with the NVIDIA toolkit) still has to get through check mode on a node."""
        lc, _, _ = cluster
        keyring = "file:///usr/share/keyrings/debian-archive-keyring.gpg"
        started = time.monotonic()
        r = cfg.run(lc.name, check=True, extravars={
            **Capabilities().as_vars(), "scalelab_gpus": 1,
            "docker_nvidia_toolkit_key_url": keyring})
        TIMINGS["site.yml as on real hosts, check mode"] = time.monotonic() - started
        assert r.status == "successful" and r.changed > 0
        for i in (0, 1):
            left = on(lc, i, "for p in /usr/bin/dockerd /etc/docker/daemon.json /usr/sbin/chronyd "
                             "/opt/scalelab/venv /etc/exports.d/scalelab.exports "
                             "/etc/systemd/system/scalelab-jupyterlab.service; "
                             "do test -e $p && echo $p; done; true").stdout.split()
            assert left == []

    def test_verify_playbook_passes_without_changing_anything(self, cluster):
        lc, _, _ = cluster
        r = cfg.verify(lc.name)
        assert r.status == "successful" and r.changed == 0

    def test_a_node_that_does_not_answer_or_lacks_its_address_is_refused_first(self, cluster):
        """The README's "a node that does not answer, or none of whose interfaces holds its
        cluster address, is refused then, with nothing changed on any host": the read-only
        probe refuses both before Ansible starts (no run of it in the artifacts)."""
        import copy
        import ipaddress

        from scalelab.core.errors import ClusterError

        lc, _, _ = cluster
        rec = lc.load()
        artifacts = lc.dir / "ansible" / "artifacts"
        runs = sorted(p.name for p in artifacts.iterdir())
        n1 = rec["nodes"][1]["name"]
        spare = str(ipaddress.ip_network(rec["subnet"])[-2])
        assert spare not in {n["private_address"] for n in rec["nodes"]}
        deaf, moved = copy.deepcopy(rec), copy.deepcopy(rec)
        deaf["nodes"][1]["ssh_port"] = 9  # nothing listens there on the node
        moved["nodes"][1]["private_address"] = spare  # no interface of the node holds it
        try:
            lc.save(deaf)
            with pytest.raises(ClusterError) as err:
                cfg.run(lc.name, tags="netshape")
            assert str(err.value).startswith(f"cannot read the facts of node {n1}: "), err.value
            assert str(err.value).endswith("check it with invoke check")
            lc.save(moved)
            with pytest.raises(ClusterError) as err:
                cfg.run(lc.name, tags="netshape")
            assert str(err.value).startswith(
                f"node {n1}: no interface holds its cluster address {spare}; "), err.value
        finally:
            lc.save(rec)
        assert sorted(p.name for p in artifacts.iterdir()) == runs
        assert lc.load() == rec

    def test_a_failed_task_names_its_hosts_and_task(self, cluster):
        lc, _, _ = cluster
        with pytest.raises(ConfigureError) as err:
            cfg.run(lc.name, tags="netshape", extravars={"netshape_rate": "100Mbps"})
        msg = str(err.value)
        for n in lc.nodes():
            assert n.name in msg
        # the role reads rates with the bench driver's parser: megabytes refused with the fix
        assert 'task "Check the inputs of the netshape role"' in msg
        assert "netshape_rate '100Mbps' is ambiguous" in msg and "write 100mbit" in msg
        assert {f.host for f in err.value.failures} == {n.name for n in lc.nodes()}

    def test_a_package_missing_on_the_host_is_named_with_the_fix(self, cluster):
        lc, _, _ = cluster
        with pytest.raises(ConfigureError, match=r"no-such-pkg missing; .*install them on the host"):
            cfg.run(lc.name, tags="common", extravars={"common_packages": ["rsync", "no-such-pkg"]})

    def test_artifacts_are_private_and_hold_no_key_or_token(self, cluster):
        lc, _, _ = cluster
        private = lc.dir / "ansible"
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        runs = [p for p in (private / "artifacts").iterdir() if p.is_dir()]
        assert runs and all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in runs)
        key_body = "".join(Path(lc.key).read_text().splitlines()[1:-1])[:40]
        token = (lc.dir / "jupyter_token").read_text().strip()
        for path in private.rglob("*"):
            if path.is_file():
                text = path.read_text(errors="replace")
                assert key_body not in text, path
                assert token not in text, path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listening(lc, i: int, port: int) -> list[str]:
    """Local addresses of the TCP listeners on a port of node i (ss's fourth column)."""
    out = on(lc, i, f"ss -Hltn sport = :{port}").stdout
    return [line.split()[3] for line in out.splitlines() if line.strip()]


def _iperf_mbit(lc, server: int, client: int, seconds: int) -> float:
    """TCP throughput from node `client` to node `server`, iperf3 in their namespaces."""

    addr = lc.nodes()[server].private_address
    pidfile = lc.dir / "iperf-ans.pid"
    sh.run(["ip", "netns", "exec", localhost.netns_name(lc.name, server), "iperf3", "-s", "-1",
            "-D", "-B", addr, "--pidfile", str(pidfile)])
    try:
        wait_listening(localhost.netns_name(lc.name, server), 5201)
        out = sh.run(["ip", "netns", "exec", localhost.netns_name(lc.name, client), "iperf3", "-c",
                      addr, "-t", str(seconds), "-J"], timeout=seconds + 15).stdout
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        if pidfile.exists():
            pid = int(pidfile.read_text().strip() or 0)
            if pid:
                localhost.end_pids([pid])
