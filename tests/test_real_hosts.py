"""A real-host path end to end: hosts scalelab did not make for itself, used as a static cluster.

Three machines are brought up with the local target and then handed over as someone else's
testbed would be: one is the bastion, the two others take SSH only from the bastion (a rule
in each machine's network namespace turns the controller away), and every machine has an
account of the user's own, `alice`, with passwordless sudo and the user's key. Host keys are
pinned the way the README tells a user. From then on only the static cluster is used, through
invoke as a user types it: provision --target static -> configure (from an offline bundle:
the hosts cannot reach a package index) -> bench over two shaped rates -> report -> destroy.
Nothing of the local target's shortcuts is used: the venv and the workloads are installed on
the hosts for real, through sudo, and tc is set through sudo.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import ROOT, bench_exit, invoke, needs_root, needs_sshd, unique_name, wait_until

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node
from scalelab.cluster.targets.localhost import netns_name

pytestmark = [needs_root, needs_sshd, pytest.mark.root, pytest.mark.slow]

TAGS = "common,pytorch,horovod,workloads"  # nfs, jupyterlab, docker need systemd/kernel NFS
BUNDLE = ROOT / "test-artifacts" / "bundle"  # gitignored; a second build downloads nothing


@pytest.fixture(scope="module")
def bundle_dir():
    """The offline bundle, built by `invoke bundle` as a user would on the controller."""
    proc = invoke("bundle", "--out", str(BUNDLE), timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bundle:" in proc.stdout
    return BUNDLE


def _on(node: Node, known_hosts: str, command: str) -> str:
    return ssh.run(node, known_hosts, command, timeout=60).stdout.strip()


def _fingerprint(text: str) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", "-"], input=text, capture_output=True,
                         text=True, timeout=10, check=True).stdout
    return out.split()[1]


def _qdiscs(nodes: list[Node], known_hosts: str) -> dict[str, list]:
    return {n.name: json.loads(_on(n, known_hosts, "tc -j qdisc show dev eth0") or "[]")
            for n in nodes}


USER = "alice"
HOME = f"/home/{USER}"
SHARED_FILES = (f"{HOME}/.ssh/authorized_keys", f"{HOME}/.ssh/config", "/etc/ssh/ssh_known_hosts",
                "/etc/hosts", f"{HOME}/.ssh/id_scalelab", f"{HOME}/.ssh/id_scalelab.pub",
                "/root/.ssh/authorized_keys")


def _host_files(hosts, machine: Node) -> dict[str, str | None]:
    """The files configure may add to, as the host has them (None: absent); machine is the
    test's own root login to the host (through the bastion)."""
    out = ssh.run(machine, str(hosts.known_hosts),
                  "; ".join(f"echo '=== {p}'; cat {p} 2>/dev/null || echo '<absent>'"
                            for p in SHARED_FILES), timeout=30).stdout
    files: dict[str, str | None] = {}
    for part in out.split("=== ")[1:]:
        path, _, body = part.partition("\n")
        files[path] = None if body.strip() == "<absent>" else body
    return files


def _holds(upper: Path, secret: str) -> list[str]:
    """Files under a host's own layer whose text holds the secret (base64 body, joined)."""
    hits = []
    for path in upper.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size < 1 << 20:
            try:
                text = "".join(path.read_text(errors="ignore").split())
            except OSError:
                continue
            if secret in text:
                hits.append(str(path))
    return hits


# The hosts' own bookkeeping of the test's logins and of their daemons, which changes whoever
# logs in: not something configure added. Paths relative to the host's root.
HOST_NOISE = ("var/log/",)
# What destroy keeps on the hosts on purpose (configure.KEPT_ON_HOSTS, the README): the
# training stack. Everything else configure added or changed must be gone after destroy.
KEPT_PATHS = ("opt/scalelab",)


def _layer(upper: Path) -> dict[str, tuple]:
    """What a host's own layer holds, path -> (kind, mode, owner, content hash or link):
    directories count by their existence, mode and owner only (their times change with any
    entry)."""
    out: dict[str, tuple] = {}
    for path in sorted(upper.rglob("*")):
        rel = str(path.relative_to(upper))
        st = path.lstat()
        if path.is_symlink():
            what: tuple = ("link", os.readlink(path))
        elif path.is_dir():
            try:  # the lower layer is the machine's own root
                lower = Path("/", rel).lstat()
            except OSError:
                lower = None
            if lower is not None and (lower.st_mode, lower.st_uid, lower.st_gid) == (
                    st.st_mode, st.st_uid, st.st_gid):
                continue  # copied up unchanged, so that an entry below it could change
            what = ("dir",)
        elif path.is_file():
            what = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
        else:  # overlayfs whiteouts (a file of the lower layer removed) and the like
            what = ("other", st.st_rdev)
        out[rel] = (*what, oct(st.st_mode & 0o7777), st.st_uid, st.st_gid)
    return out


def _left_behind(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """Paths added, changed or removed since `before`, leaving out what destroy keeps on
    purpose and the host's own bookkeeping."""
    changed = [p for p in sorted(set(before) | set(after)) if before.get(p) != after.get(p)]
    return [p for p in changed
            if not any(p == k or p.startswith(k + "/") for k in KEPT_PATHS)
            and not any(p.startswith(n) or p + "/" == n for n in HOST_NOISE)]


def _as_testbed(hosts, machines: list[Node], user_pub: str) -> list[Node]:
    """Hand the machines over as a testbed does: an account for the user with passwordless
    sudo and the user's key, and SSH to every machine but the first (the bastion) only from
    the bastion. Returns the test's own root logins, through the bastion."""
    kh = str(hosts.known_hosts)
    for m in machines:
        # -p '*': no password, yet not a locked account (sshd refuses those without PAM)
        ssh.run(m, kh, f"useradd -m -d {HOME} -s /bin/sh -p '*' {USER} && "
                       f"mkdir -p {HOME}/.ssh && echo '{user_pub}' > {HOME}/.ssh/authorized_keys"
                       f" && chown -R {USER}: {HOME}/.ssh && chmod 700 {HOME}/.ssh && "
                       f"echo '{USER} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/{USER} && "
                       f"chmod 440 /etc/sudoers.d/{USER}", timeout=30)
    controller = ssh.run(machines[0], kh, "echo $SSH_CONNECTION", timeout=30).stdout.split()[0]
    # the connections made so far (multiplexed, kept open) would meet the rule too
    ssh.close_masters(kh)
    for i, _ in enumerate(machines[1:], start=1):
        subprocess.run(["ip", "netns", "exec", netns_name(hosts.name, i), "iptables", "-I",
                        "INPUT", "-p", "tcp", "--dport", "22", "-s", controller, "-j", "REJECT",
                        "--reject-with", "tcp-reset"], check=True, timeout=30)
    jump = f"root@{machines[0].address}"
    return [machines[0]] + [dataclasses.replace(m, bastion=jump) for m in machines[1:]]


def _went_around(hosts, machines: list[Node]) -> list[int]:
    """Packets each machine behind the bastion turned away from the controller."""
    counts = []
    for i, _ in enumerate(machines[1:], start=1):
        out = subprocess.run(["ip", "netns", "exec", netns_name(hosts.name, i), "iptables",
                              "-L", "INPUT", "-v", "-n", "-x"], capture_output=True, text=True,
                             check=True, timeout=30).stdout
        counts.append(sum(int(line.split()[0]) for line in out.splitlines()
                          if "REJECT" in line and "dpt:22" in line))
    return counts


def test_static_cluster_of_a_login_user_with_sudo_behind_a_bastion(local_cluster, bundle_dir,
                                                                   tmp_path):
    hosts = local_cluster(3)  # the testbed someone else runs: a bastion and two hosts
    # the user's own testbed key: authorised on the hosts by the testbed, never to be copied
    # anywhere by scalelab (node-to-node trust gets a key pair of the cluster's own)
    key = tmp_path / "testbed_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "alice@testbed",
                    "-f", str(key)], check=True, timeout=30)
    user_pub = Path(f"{key}.pub").read_text().strip()
    secret = "".join(key.read_text().splitlines()[1:-1])  # the private key's base64 body
    everything = _as_testbed(hosts, hosts.nodes(), user_pub)
    bastion, machines = everything[0], everything[1:]
    found_files = {m.name: _host_files(hosts, m) for m in machines}
    # every file of the hosts' own layers as the testbed handed them over
    layers = {m.name: hosts.dir / "nodes" / m.name / "upper" for m in machines}
    found_layers = {name: _layer(upper) for name, upper in layers.items()}
    # listed without names: scalelab labels them until configure reads the names the machines
    # call themselves (their hostnames), which it takes; it renames no host
    names = [m.name for m in machines]
    var_file = tmp_path / "lab.tfvars.json"
    var_file.write_text(json.dumps({
        "hosts": [{"address": machines[0].address, "role": "head"},
                  {"address": machines[1].address}],
        "ssh_user": USER, "ssh_private_key_file": str(key),
        "bastion_ip": bastion.address}))
    lab = unique_name("lab")
    state = Path(os.environ["SCALELAB_HOME"]) / "clusters" / lab
    reports = Path(os.environ["SCALELAB_REPORTS"])
    assert not Path("/opt/scalelab").exists()
    kh0 = str(hosts.known_hosts)
    known_hosts = state / "known_hosts"

    def provision() -> None:
        proc = invoke("provision", "--target", "static", "--cluster", lab, "--nodes", "2",
                      "--var-file", str(var_file), timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]

        # Pin the host keys as the README says: scan, compare with the fingerprint known out
        # of band (here: the key files of the machines' own sshd), append. The hosts behind
        # the bastion are scanned from it.
        for m in [bastion, *machines]:
            scan = ssh.run(bastion, kh0, f"ssh-keyscan -t ed25519 {m.address}",
                           timeout=30).stdout
            own = (hosts.dir / "nodes" / m.name / "ssh_host_ed25519_key.pub").read_text()
            assert _fingerprint(scan) == _fingerprint(own)
            with open(known_hosts, "a") as fh:
                fh.write(scan)
        rec = json.loads((state / "cluster.json").read_text())
        lab_nodes = [Node.from_dict(n) for n in rec["nodes"]]
        assert {n.bastion for n in lab_nodes} == {f"{USER}@{bastion.address}"}
        assert {n.ssh_user for n in lab_nodes} == {USER}

    try:
        provision()
        # A first configure that fails half-way: the second host's /opt/scalelab is taken by a
        # file of someone else's, so the pytorch role fails there after common trusted the
        # cluster's key on both hosts. destroy must still take the key back everywhere.
        _on(machines[1], kh0, "echo someone-elses > /opt/scalelab")
        # (common and pytorch only: the first host then installs torch, which destroy takes
        # back, and not Horovod and the workloads as well, which the full flow below covers)
        proc = invoke("configure", "--cluster", lab, "--tags", "common,pytorch", "--bundle",
                      str(bundle_dir), timeout=1800)
        assert proc.returncode != 0
        assert proc.stderr.splitlines()[-1].startswith(
            f"error: configure {lab} (site.yml) failed: "), proc.stderr[-2000:]
        assert machines[1].name in proc.stderr and machines[0].name not in proc.stderr
        rec = json.loads((state / "cluster.json").read_text())
        assert "configured_at" not in rec and rec["hosts_touched"]["since"]
        trust = (state / "id_trust.pub").read_text().strip()
        for m in machines:  # the key was authorised on both before the failure
            assert trust in _on(m, kh0, f"cat {HOME}/.ssh/authorized_keys")
        proc = invoke("destroy", "--cluster", lab, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert not state.exists()
        for m in machines:  # no trust key authorised, no private half in ~/.ssh
            assert _host_files(hosts, m) == found_files[m.name]
        left = {name: _left_behind(found_layers[name], _layer(upper))
                for name, upper in layers.items()}
        assert left == {name: [] for name in layers}
        # the hosts' admin clears what destroy kept (and the file in the way), and the user
        # starts over
        for m in machines:
            _on(m, kh0, "rm -rf /opt/scalelab")
        provision()

        # Before configure: no training stack on the hosts, and bench refuses the cluster.
        for m in machines:
            assert _on(m, kh0, "test -e /opt/scalelab && echo present || echo absent") == "absent"
        proc = invoke("bench", "--cluster", lab, "--sweep", "ci", "--dry-run")
        assert proc.returncode != 0
        assert proc.stderr.strip() == (
            f"error: cluster {lab} has not been configured (no facts recorded for node "
            f"{lab}-n0); run invoke configure --cluster {lab}")
        before = _qdiscs(machines, kh0)

        proc = invoke("configure", "--cluster", lab, "--tags", TAGS, "--bundle",
                      str(bundle_dir), timeout=1800)
        assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-2000:])

        # After: a venv of the hosts' own, with torch and Horovod installed from the bundle.
        rec = json.loads((state / "cluster.json").read_text())
        assert [n["name"] for n in rec["nodes"]] == names  # the hosts' own names
        for m in machines:
            assert _on(m, kh0, "hostname") == m.name
        for m, recorded in zip(machines, rec["nodes"], strict=True):
            f = recorded["facts"]
            assert f["iface"] == "eth0" and f["cores"] == os.cpu_count()
            assert f["python"] == "/opt/scalelab/venv/bin/python"
            assert f["workdir"] == "/opt/scalelab"
            assert (f["user"], f["sudo"]) == (USER, "yes")
            where = _on(m, kh0, "/opt/scalelab/venv/bin/python -c 'import torch, horovod.torch; "
                                "print(torch.__file__)'")
            assert where.startswith("/opt/scalelab/venv/lib/"), where
            assert _on(m, kh0, "test -f /opt/scalelab/bench/workloads/resnet.py && echo ok") == "ok"
            # installed for real in the host's own layer, not seen through from the controller
            upper = hosts.dir / "nodes" / m.name / "upper"
            assert (upper / "opt/scalelab/venv/bin/python").exists()
            # the user's key stayed on the controller: no file the host holds contains it;
            # node-to-node SSH got the cluster's own trust key
            assert _holds(upper, secret) == []
            trust = (state / "id_trust.pub").read_text().strip()
            assert _on(m, kh0, f"cat {HOME}/.ssh/id_scalelab.pub") == trust
            assert trust in _on(m, kh0, f"cat {HOME}/.ssh/authorized_keys")
        assert not Path("/opt/scalelab").exists()
        assert _holds(hosts.dir / "nodes" / bastion.name / "upper", secret) == []
        # the roles converge: a second configure changes nothing
        proc = invoke("configure", "--cluster", lab, "--tags", TAGS, "--bundle",
                      str(bundle_dir), timeout=1200)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"{lab}: configured in" in proc.stdout and ", 0 changes" in proc.stdout, \
            proc.stdout[-3000:]
        proc = invoke("check", "--cluster", lab, "--links", timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]

        # the two hosts' link at two rates, set through sudo (the ci sweep's 1-node runs would
        # add nothing a link or a second host shows)
        proc = invoke("bench", "--cluster", lab, "--sweep", "ci", "--nodes", "2", "--bandwidth",
                      "100mbit,1gbit", "--no-report", timeout=1200)
        sweep_dir = reports / os.readlink(reports / "latest")
        with open(sweep_dir / "results.csv") as fh:
            rows = list(csv.DictReader(fh))
        assert proc.returncode == bench_exit(r["status"] for r in rows), proc.stderr[-3000:]
        # Both runs ok. A rank that gloo aborts while its group is torn down, after every
        # rank's figures were in, no longer fails its run (launch.whole; the record keeps it);
        # a failure now is one to look at, and its reason is the assert's message
        assert len(rows) == 2, rows
        assert [r["status"] for r in rows] == ["ok", "ok"], [(r["run_id"], r["error"])
                                                              for r in rows]
        for r in rows:  # set through sudo on the hosts
            rate, measured = float(r["bandwidth_mbit"]), float(r["link_mbit_measured"])
            assert 0.85 * rate < measured <= 1.02 * rate, r
        runs = [json.loads(x) for x in (sweep_dir / "runs.jsonl").read_text().splitlines()]
        for r in runs:  # kept runs whose rank failed leaving: said in the warnings summary
            if r["env"].get("teardown_failure"):
                warnings.warn(f"real hosts: {r['run_id']}: a rank failed leaving: "
                              f"{r['env']['teardown_failure'][:2000]}", stacklevel=1)
        assert {r["env"]["target"] for r in runs} == {"static"}
        assert {r["env"]["launcher"] for r in runs} == {"torchrun"}  # real hosts: the agent
        # scalelab's own commands rode one connection per node: each run opened only its
        # ranks' and probes' own
        for r in runs:
            assert r["ssh"]["shared"] >= 1, (r["run_id"], r["ssh"])
        # every host's qdiscs are back as they were before the sweep, and no process of the
        # user's is left on any host but the sshd sessions of the multiplexed connections
        # (ps exits 1 when the user has no process at all, as after destroy)
        assert _qdiscs(machines, kh0) == before
        for m in machines:
            left = _on(m, kh0, f"ps -u {USER} -o pid=,comm=,args= || true").splitlines()
            assert [p for p in left if p.split()[1] != "sshd"] == [], left

        proc = invoke("bench", "--cluster", lab, "--nodes", "2", "--batch-size", "8",
                      "--model", "resnet20", "--engine", "horovod", "--steps", "3",
                      "--repeats", "1", "--no-report", timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # the parameter-server engine on the same hosts: a server beside each worker, over
        # torchrun in the hosts' own venv; each sums its shard of both workers' gradients
        proc = invoke("bench", "--cluster", lab, "--nodes", "2", "--batch-size", "8",
                      "--model", "resnet20", "--engine", "ps", "--ps-placement", "colocated",
                      "--steps", "3", "--repeats", "1", "--no-report", timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        ps_dir = reports / os.readlink(reports / "latest")
        ps_run = [r for r in map(json.loads, (ps_dir / "runs.jsonl").read_text().splitlines())
                  if r["kind"] == "train"][0]
        assert ps_run["status"] == "ok" and ps_run["env"]["target"] == "static", ps_run["error"]
        assert ps_run["env"]["launcher"] == "torchrun"
        servers = ps_run["ps"]["servers"]
        assert sorted(s["host"] for s in servers) == sorted(names) and ps_run["ps"]["colocated"]
        assert sum(s["bytes_in_per_step"] for s in servers) == 2 * ps_run["gradient_bytes"]

        proc = invoke("report", "--sweep", sweep_dir.name)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (sweep_dir / "index.html").exists()
        assert "static" in (sweep_dir / "index.html").read_text()

        # a data set staged on the second host behind a web server, run as the login user:
        # destroy --keep-data (below) ends the server and leaves the set where it is
        proc = invoke("stage", "--cluster", lab, "--images", "20", "--classes", "2",
                      "--shard-size", "10", "--like", "small", timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"http://{machines[1].address}:8610/imagenet-like/shards/" in proc.stdout
        assert _on(machines[1], kh0, "ls /opt/scalelab/data/imagenet-like/shards | wc -l") == "2"
        # a second set on every host's own disk, through sudo, and taken back by its removal
        proc = invoke("stage", "--cluster", lab, "--to", "nodes", "--name", "ondisk",
                      "--images", "20", "--classes", "2", "--shard-size", "10", "--like",
                      "small", timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "--data /opt/scalelab/data/ondisk/shards" in proc.stdout, proc.stdout
        assert [_on(m, kh0, "ls /opt/scalelab/data/ondisk/shards | wc -l")
                for m in machines] == ["2", "2"]
        proc = invoke("stage", "--cluster", lab, "--name", "ondisk", "--remove", timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert [_on(m, kh0, "test -e /opt/scalelab/data/ondisk && echo present || echo gone")
                for m in machines] == ["gone", "gone"]

        # The sweep's controller killed outright (SIGKILL) mid-run: the hosts stay shaped and
        # the ranks train on. destroy puts the links back and ends the ranks from the notes the
        # sweep wrote before it changed anything, before those notes go with the records.
        killed = subprocess.Popen(
            [sys.executable, "-m", "invoke", "bench", "--cluster", lab, "--nodes", "2",
             "--batch-size", "8", "--model", "resnet20", "--steps", "2000", "--repeats", "1",
             "--bandwidth", "100mbit", "--no-report"], cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_until(lambda: all("resnet.py" in _on(m, kh0, f"ps -u {USER} -o args= || true")
                                   for m in machines), 300, "both hosts' ranks to train")
            shaped = _qdiscs(machines, kh0)
            os.kill(killed.pid, signal.SIGKILL)
            killed.wait(timeout=30)
        finally:
            if killed.poll() is None:
                os.kill(killed.pid, signal.SIGKILL)
                killed.wait(timeout=30)
        assert shaped != before and _qdiscs(machines, kh0) == shaped  # left shaped
        assert all("resnet.py" in _on(m, kh0, f"ps -u {USER} -o args= || true")
                   for m in machines)
        proc = invoke("destroy", "--cluster", lab, "--keep-data", timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"{lab}: ended " in proc.stdout and "links restored from 100" in proc.stdout, \
            proc.stdout
        assert _qdiscs(machines, kh0) == before
        for m in machines:
            left = _on(m, kh0, f"ps -u {USER} -o pid=,comm=,args= || true").splitlines()
            assert [p for p in left if p.split()[1] != "sshd"] == [], \
                (left, proc.stdout[-1500:], proc.stderr[-1500:])
        assert "kept on its hosts, on purpose: /opt/scalelab" in proc.stdout
        assert not os.path.exists(ssh.mux_dir(str(known_hosts)))
        # the staged set is kept, said; its server's files are gone (its process: no process
        # of the user's is left, above)
        assert ("kept on its hosts, on purpose: data set imagenet-like at "
                "/opt/scalelab/data/imagenet-like on ") in proc.stdout
        assert _on(machines[1], kh0, "ls /opt/scalelab/data/imagenet-like/shards | wc -l") == "2"
        assert _on(machines[1], kh0, "ls -A /opt/scalelab/tmp 2>/dev/null | "
                                     "grep -c -e http- || true") == "0"
        # the user removes the kept set later, as destroy without --keep-data would have
        _on(machines[1], kh0, "sudo -n rm -rf /opt/scalelab/data/imagenet-like && "
                              "sudo -n rmdir --ignore-fail-on-non-empty /opt/scalelab/data")
    finally:
        if (state / "cluster.json").exists():
            invoke("destroy", "--cluster", lab, timeout=300)
    assert not state.exists()
    # no SSH of scalelab's went around the bastion: the hosts turned none away
    assert _went_around(hosts, hosts.nodes()) == [0, 0]
    assert all(hosts.alive())  # destroying the static cluster leaves the machines alone
    # and takes back what configure added to the hosts' shared files: they are as found
    for m in machines:
        assert _host_files(hosts, m) == found_files[m.name]
    # Hosts as found, the audit: every path configure and the benches added to or changed in
    # a host's own layer is gone after destroy, but for what destroy keeps on purpose.
    left = {name: _left_behind(found_layers[name], _layer(upper))
            for name, upper in layers.items()}
    assert left == {name: [] for name in layers}
