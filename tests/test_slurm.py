"""Sweeps as Slurm jobs, for real: the slurm role on a local cluster (munge, slurmctld,
slurmdbd with MariaDB, slurmd, without systemd), then `invoke bench --launcher slurm` as a user
types it, with its bad input, a job cancelled under it, a run past its time limit and a Ctrl-C.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, invoke, needs_root, needs_sshd, unique_name, wait_until

from scalelab.cluster import ssh
from scalelab.core.state import load_cluster, reports_dir

pytestmark = [needs_root, needs_sshd, pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(not Path("/usr/sbin/slurmctld").exists(),
                                 reason="Slurm not installed (./bootstrap.sh installs it)")]

DAEMONS = {"munged": "/run/munge/munged.pid", "slurmctld": "/run/slurm/slurmctld.pid",
           "slurmd": "/run/slurm/slurmd.pid", "slurmdbd": "/run/slurm/slurmdbd.pid",
           "mariadbd": "/run/mysqld/scalelab-mariadb.pid"}
QUICK = ("--sweep", "ci", "--no-report", "--bandwidth", "native")


class Cluster:
    def __init__(self, name: str) -> None:
        from scalelab.cluster.nodes import nodes_of

        self.name = name
        self.rec = load_cluster(name)
        self.nodes = nodes_of(self.rec)
        self.head = self.nodes[0]

    def on_head(self, command: str, timeout: float = 60) -> str:
        return ssh.run(self.head, self.rec["known_hosts"], command, timeout=timeout).stdout

    def jobs(self) -> dict[str, tuple[str, str]]:
        """sacct: job name -> (job id, state), for the jobs of sweeps (the role's own check
        job, which slurmdbd may list a moment late, left out)."""
        out = self.on_head("sacct --noheader --parsable2 --allocations --starttime now-1day "
                           "--format JobID,JobName,State")
        return {c[1]: (c[0], c[2]) for c in (ln.split("|") for ln in out.splitlines())
                if len(c) > 2 and c[1] != "scalelab-verify"}

    def queue(self) -> list[str]:
        return self.on_head("squeue --noheader --format '%i %j %T'").splitlines()

    def daemon_pids(self) -> list[int]:
        pids = []
        for n in self.nodes:
            for path in DAEMONS.values():
                text = ssh.run(n, self.rec["known_hosts"], f"cat {path} 2>/dev/null || true").stdout
                pids += [int(t) for t in text.split() if t.isdigit()]
        return pids


@pytest.fixture(scope="module")
def slurm_cluster():
    """3 local nodes; Slurm set up by the role. Destroyed (daemons and all) at the end."""
    from scalelab.cluster.targets.local import LocalCluster

    name = unique_name("sl")
    lc = LocalCluster(name)
    pids: list[int] = []
    try:
        lc.provision(3)
        cl = Cluster(name)
        bench = invoke("bench", "--cluster", name, "--nodes", "1", "--batch-size", "8",
                       "--launcher", "slurm", "--dry-run")
        # no Slurm there yet: one line, nothing planned, no job
        assert bench.returncode == 1, bench.stdout + bench.stderr
        err = bench.stderr.strip().splitlines()
        assert len(err) == 1 and "--tags slurm" in err[0], err
        proc = invoke("configure", "--cluster", name, "--tags", "slurm", timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        cl.configure_output = proc.stdout
        pids = cl.daemon_pids()
        yield cl
    finally:
        lc.destroy()
    from scalelab.cluster.targets.local import _alive  # a zombie waiting for init to reap it is gone

    left = [p for p in pids if _alive(p)]
    assert not left, f"Slurm daemons still running after destroy: {left}"


def _records(sweep_dir: Path) -> dict[str, dict]:
    out = {}
    for line in (sweep_dir / "runs.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[rec["run_id"]] = rec
    return out


def _sweep_dir(stdout: str) -> Path:
    for line in stdout.splitlines():
        if line.startswith("results: "):
            return Path(line.split(": ", 1)[1]).parent
    raise AssertionError(f"no results line in: {stdout[-2000:]}")


def test_the_role_sets_up_slurm_and_converges(slurm_cluster):
    cl = slurm_cluster
    out = cl.on_head("sinfo --noheader --Node --format '%N %P %t'")
    assert sorted(out.split()[0::3]) == sorted(n.name for n in cl.nodes)
    assert set(out.split()[2::3]) == {"idle"}
    again = invoke("configure", "--cluster", cl.name, "--tags", "slurm", timeout=300)
    assert again.returncode == 0, again.stdout[-2000:]
    assert ", 0 changes" in again.stdout, again.stdout[-1500:]
    # munge: one key on every node, readable by munge alone
    sums = {ssh.run(n, cl.rec["known_hosts"], "stat -c '%U %a' /etc/munge/munge.key && "
                    "sha256sum /etc/munge/munge.key | cut -c1-64").stdout for n in cl.nodes}
    assert len(sums) == 1 and sums.pop().startswith("munge 400"), sums
    # accounting: the Slurm user reaches MariaDB over its socket as itself (README: no
    # password anywhere): none in slurmdbd.conf, and its account has the socket plugin and no
    # password hash
    dbd = cl.on_head("cat /etc/slurm/slurmdbd.conf")
    assert "StorageUser=slurm" in dbd and "pass" not in dbd.lower(), dbd
    account = cl.on_head("mariadb --batch --skip-column-names -e \"SELECT plugin, "
                         "authentication_string FROM mysql.user WHERE User='slurm'\"")
    assert account.split("\n")[:-1] == ["unix_socket\t"], repr(account)


def test_bad_slurm_input_is_refused_before_any_job(slurm_cluster):
    cl = slurm_cluster
    before = cl.jobs()
    root = reports_dir()
    sweeps = set(root.iterdir()) if root.exists() else set()
    cl.on_head(f"scontrol create PartitionName=small Nodes={cl.nodes[0].name} State=UP")
    cases = [
        (["--launcher", "slurm", "--nodes", "1", "--partition", "nosuch"],
         "partition 'nosuch' is not on"),
        (["--launcher", "slurm", "--nodes", "1-2", "--partition", "small"],
         "partition small has 1"),
        (["--nodes", "1", "--partition", "small"], "only Slurm has partitions"),
        (["--nodes", "1", "--launcher", "pbs"], "unknown 'pbs'"),
        # a colocated parameter server is a second task on these nodes of one CPU each
        (["--launcher", "slurm", "--nodes", "1", "--engine", "ps", "--ps-placement",
          "colocated"], f"Slurm starts no more tasks on a node than its CPUs, and node "
                        f"{cl.nodes[0].name} has 1; run train-n01-p1-b008-"),
    ]
    for extra, expected in cases:
        proc = invoke("bench", "--cluster", cl.name, "--batch-size", "8", *extra)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 1, (extra, proc.stdout, proc.stderr)
        assert len(err) == 1 and expected in err[0], (extra, err)
    # a login host without Slurm's commands (moved aside in the node's own layer only)
    cl.on_head("mv /usr/bin/sinfo /usr/bin/sinfo.hidden")
    try:
        proc = invoke("bench", "--cluster", cl.name, "--batch-size", "8", "--nodes", "1",
                      "--launcher", "slurm")
    finally:
        cl.on_head("mv /usr/bin/sinfo.hidden /usr/bin/sinfo")
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(err) == 1, err
    assert "no Slurm on the login host" in err[0] and "(sinfo not found)" in err[0], err
    # Slurm not answering, then no accounting: the login host's real sinfo (then sacct) reads a
    # copy of slurm.conf whose slurmctld (then slurmdbd) port nothing listens on
    for tool, key, expected in [("sinfo", "SlurmctldPort", f"Slurm on {cl.head.name} does not "
                                                           "answer: sinfo: "),
                                ("sacct", "AccountingStoragePort", "sacct does not answer on ")]:
        cl.on_head(f"grep -v '^{key}=' /etc/slurm/slurm.conf > /tmp/deaf.conf && "
                   f"echo {key}=9 >> /tmp/deaf.conf && mv /usr/bin/{tool} /usr/bin/{tool}.real "
                   f"&& printf '#!/bin/sh\\nSLURM_CONF=/tmp/deaf.conf exec /usr/bin/{tool}.real "
                   f"\"$@\"\\n' > /usr/bin/{tool} && chmod 755 /usr/bin/{tool}")
        try:
            proc = invoke("bench", "--cluster", cl.name, "--batch-size", "8", "--nodes", "1",
                          "--launcher", "slurm")
        finally:
            cl.on_head(f"mv /usr/bin/{tool}.real /usr/bin/{tool}; rm -f /tmp/deaf.conf")
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(err) == 1, (tool, err)
        assert expected in err[0] and "--tags slurm" in err[0], (tool, err)
    assert cl.jobs() == before  # nothing submitted
    assert (set(root.iterdir()) if root.exists() else set()) == sweeps  # nothing written
    # what that refusal stands for: Slurm itself starts no more, --overcommit or not
    said = cl.on_head(f"srun --nodes 1 --nodelist {cl.nodes[0].name} --ntasks-per-node 2 "
                      "--overcommit --exclusive --time 1 true 2>&1; echo rc=$?")
    assert "rc=1" in said and "Requested node configuration is not available" in said, said


def test_a_slurm_sweep_gives_the_same_results_as_ssh_and_one_job_per_run(slurm_cluster):
    cl = slurm_cluster
    common = ["bench", "--cluster", cl.name, "--sweep", "ci", "--no-report",
              "--bandwidth", "1gbit"]
    viaslurm = invoke(*common, "--nodes", "1-3", "--launcher", "slurm", timeout=600)
    assert viaslurm.returncode == 0, viaslurm.stdout[-3000:] + viaslurm.stderr[-3000:]
    viassh = invoke(*common, "--nodes", "1-2", timeout=600)
    assert viassh.returncode == 0, viassh.stderr[-3000:]
    sl_dir, ssh_dir = _sweep_dir(viaslurm.stdout), _sweep_dir(viassh.stdout)
    with open(sl_dir / "results.csv") as f:
        sl_rows = list(csv.DictReader(f))
    with open(ssh_dir / "results.csv") as f:
        ssh_rows = list(csv.DictReader(f))
    assert list(sl_rows[0]) == list(ssh_rows[0])  # the same columns
    # and the same runs measured alike: every SSH run is in the Slurm sweep with the same
    # plan, at the same rate, and trained at a comparable speed (a wrong world size or device
    # would be off by 2x or more; 5 steps on shared cores are not closer than that)
    sl_by_id = {r["run_id"]: r for r in sl_rows}
    assert ssh_rows and {r["run_id"] for r in ssh_rows} <= set(sl_by_id)
    for r in ssh_rows:
        s = sl_by_id[r["run_id"]]
        for k in ("nodes", "world_size", "batch_size", "bandwidth_mbit", "model", "engine"):
            assert s[k] == r[k], (r["run_id"], k, s[k], r[k])
        assert 800 < float(r["link_mbit_measured"]) < 1100, r
        if r["run_id"].startswith("train-"):
            ratio = float(s["images_per_sec"]) / float(r["images_per_sec"])
            assert 0.5 < ratio < 2.0, (r["run_id"], s["images_per_sec"], r["images_per_sec"])
    assert [r["nodes"] for r in sl_rows] == ["1", "2", "3"]
    assert all(r["status"] == "ok" and float(r["images_per_sec"]) > 0 for r in sl_rows)
    assert {r["launcher"] for r in sl_rows} == {"slurm"}
    assert {r["launcher"] for r in ssh_rows} == {"warm"} and not any(
        r["slurm_job_id"] for r in ssh_rows)
    # the link was measured inside an allocation too
    assert 800 < float(sl_rows[0]["link_mbit_measured"]) < 1100
    jobs = cl.jobs()
    records = _records(sl_dir)
    for run_id, rec in records.items():  # training runs and allreduce probes alike
        mine = [(jid, st) for name, (jid, st) in jobs.items() if name.endswith(f"-{run_id}")
                and jid == rec["slurm"]["job_id"]]
        assert mine == [(rec["slurm"]["job_id"], "COMPLETED")], (run_id, rec["slurm"])
        assert rec["env"]["launcher"] == "slurm"
    assert len({r["slurm"]["job_id"] for r in records.values()}) == len(records) == 5
    assert not cl.queue()


def _train_records(cl: Cluster, *args: str, cluster: str = "") -> list[dict]:
    """`invoke bench --launcher slurm ARGS` on the cluster (or on cluster, a login host's of
    the same nodes), native links, no report: its training runs' records."""
    proc = invoke("bench", "--cluster", cluster or cl.name, "--launcher", "slurm", *args,
                  "--repeats", "1", "--no-report", "--bandwidth", "native", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [r for r in _records(_sweep_dir(proc.stdout)).values() if r["kind"] == "train"]


def _killed_and_back(cl: Cluster, node: int, restarted_by: str, *engine: str,
                     cluster: str = "") -> dict:
    """A 2-node run under --launcher slurm, a checkpoint every 5 of 20 steps, the ranks of
    the run's node `node` killed (SIGKILL, by pid) after step 12: it is ok, back once from the
    last checkpoint with the last attempt's steps, restarted_by says how, its job completed,
    and no checkpoint, rank or armed kill is left on the nodes. Its record. cluster: a login
    host's cluster of the same nodes (engine then names a shared checkpoint place)."""
    run = _train_records(cl, *engine, "--nodes", "2", "--batch-size", "32", "--model",
                         "resnet20", "--steps", "20", "--checkpoint-every", "5",
                         "--inject-failure", f"12@{node}", cluster=cluster)[0]
    assert run["status"] == "ok", run["error"]
    failure, back = run["failure"], run["failure"]["recovery"]
    assert failure["node"] == cl.nodes[node].name and failure["error"] == ""
    assert failure["restarted_by"] == restarted_by
    assert len(failure["killed_pids"]) == 1
    killed = failure["killed_step"]
    assert killed >= 12 and back["restart"] == 1
    assert back["from_step"] in {5 * (killed // 5), 5 * ((killed - 1) // 5)}
    assert back["recomputed_steps"] == killed - back["from_step"]
    assert {len(r["step_times_s"]) for r in run["ranks"]} == {20 - back["from_step"]}
    assert run["slurm"]["state"] == "COMPLETED" and run["env"]["launcher"] == "slurm"
    assert not cl.queue()
    left = (f"ls -A {ROOT}/checkpoints 2>/dev/null | wc -l; grep -lE "
            "'resnet[.]py|horovodru[n]|read -r pid[s]' /proc/[0-9]*/cmdline 2>/dev/null | wc -l")
    assert [ssh.run(n, cl.rec["known_hosts"], left, timeout=30).stdout.split()
            for n in cl.nodes[:2]] == [["0", "0"]] * 2
    return run


def _step_states(cl: Cluster, job: str) -> list[str]:
    """sacct's state of each numbered step of the job, in order (its batch and extern steps
    left out)."""
    steps = [ln.split("|") for ln in cl.on_head(
        f"sacct --noheader --parsable2 --jobs {job} --format JobID,State").splitlines()]
    return [st for jid, st in steps if re.fullmatch(rf"{job}\.\d+", jid)]


def test_a_node_killed_under_a_slurm_job_comes_back_as_a_new_step_of_that_job(slurm_cluster):
    """2 nodes under --launcher slurm, the second node's ranks killed after step 12. srun
    ends the job step; the job's allocation starts the ranks again as a new step on the same
    nodes, and they go on from the last checkpoint to the run's end: one job, its first step
    ended, its second completed; the record says what was killed and what brought it back;
    no checkpoint or rank is left."""
    cl = slurm_cluster
    run = _killed_and_back(cl, 1, "a new job step in the run's Slurm allocation")
    back = run["failure"]["recovery"]
    assert 0 < back["back_s"] <= back["joined_s"] <= back["ready_s"] < 120
    assert [s["step"] - run["params"]["warmup"] for s in run["checkpoint"]["saved"]] == \
        list(range(back["from_step"] + 5, 21, 5))
    # one job: its ranks' first step failed (the kill), the second completed
    assert _step_states(cl, run["slurm"]["job_id"]) == ["CANCELLED", "COMPLETED"]


def test_horovod_killed_under_a_slurm_job_comes_back_through_its_elastic_driver_in_the_job(
        slurm_cluster):
    """--engine horovod --launcher slurm at 2 nodes, the first node's rank (where horovodrun
    runs, in the job's one step) killed after step 12. horovodrun's elastic driver, inside
    the allocation, starts it again on the same node with the state the other rank
    committed; the job is one allocation with one completed step: no new job, no requeue.
    Nothing is left on the nodes."""
    cl = slurm_cluster
    run = _killed_and_back(cl, 0, "horovodrun's elastic driver, in the run's Slurm allocation",
                           "--engine", "horovod")
    back = run["failure"]["recovery"]
    # the rank that lived noticed within its next step; the other came back after it
    assert 0 <= back["back_s"] < back["joined_s"] <= back["ready_s"] < 120
    # the last attempt at the run's full size, on the run's two nodes
    assert sorted(r["host"] for r in run["ranks"]) == [n.name for n in cl.nodes[:2]]
    assert _step_states(cl, run["slurm"]["job_id"]) == ["COMPLETED"]


def test_parameter_servers_under_slurm_a_job_per_run_with_servers_where_asked(slurm_cluster):
    """--engine ps --launcher slurm at 1-2 nodes with one dedicated server, on the node after
    the run's: each run is one job on the run's nodes and its server's, and the server sums
    every worker's gradients. (A colocated server is a second task on a worker node, which
    Slurm does not start on these nodes of one CPU: the bad-input test above holds that
    refusal, and test_slurm_lines which task of a node serves.)"""
    cl = slurm_cluster
    records = {(r["params"]["nodes"], r["params"]["ps_placement"]): r
               for r in _train_records(cl, "--engine", "ps", "--nodes", "1-2", "--batch-size",
                                       "8", "--model", "resnet20", "--steps", "4",
                                       "--ps-placement", "dedicated")}
    assert len(records) == 2 and all(r["status"] == "ok" for r in records.values()), records
    names = [n.name for n in cl.nodes]
    jobs = cl.jobs()
    for (n, placement), rec in records.items():
        assert rec["env"]["launcher"] == "slurm" and rec["slurm"]["state"] == "COMPLETED"
        assert jobs[rec["slurm"]["job_name"]] == (rec["slurm"]["job_id"], "COMPLETED")
        servers, grads = rec["ps"]["servers"], rec["gradient_bytes"]
        hosts = {r["host"] for r in rec["ranks"]}
        assert placement == "dedicated" and hosts == set(names[:n])
        assert [s["host"] for s in servers] == [names[n]]
        assert servers[0]["bytes_in_per_step"] == n * grads and not rec["ps"]["colocated"]
    assert not cl.queue()


def _bench_in_background(cl: Cluster, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "invoke", "bench", "--cluster", cl.name,
                             *QUICK, "--launcher", "slurm", *extra], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ))


def _wait_for_running_job(cl: Cluster, proc: subprocess.Popen, run_part: str,
                          timeout_s: float = 90) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for line in cl.queue():
            jid, name, state = line.split()
            if run_part in name and state == "RUNNING":
                return jid
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"no running job for {run_part}: {proc.communicate()}")


def test_a_job_cancelled_under_a_sweep_is_a_failed_run_and_the_sweep_goes_on(slurm_cluster):
    cl = slurm_cluster
    proc = _bench_in_background(cl, "--nodes", "1", "--repeats", "2", "--steps", "150")
    try:
        jid = _wait_for_running_job(cl, proc, "-r0")
        time.sleep(3)  # well into the training steps
        cl.on_head(f"scancel {jid}")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and "1 of 2 runs failed" in err, out + err  # and went on
    records = _records(_sweep_dir(out))
    first, second = records["train-n01-p1-b016-native-r0"], records["train-n01-p1-b016-native-r1"]
    assert first["status"] == "failed" and first["slurm"]["state"] == "CANCELLED"
    assert f"Slurm job {jid} was cancelled (scancel by uid 0)" in first["error"], first["error"]
    assert second["status"] == "ok" and second["slurm"]["state"] == "COMPLETED"
    assert not cl.queue()


def test_a_run_past_its_time_limit_is_ended_and_its_job_cancelled(slurm_cluster):
    cl = slurm_cluster
    proc = invoke("bench", "--cluster", cl.name, *QUICK, "--launcher", "slurm", "--nodes", "2",
                  "--steps", "5000", "--timeout", "15", timeout=300)
    assert proc.returncode == 1 and "1 of 2 runs failed or timed out" in proc.stderr, \
        proc.stdout[-2000:] + proc.stderr[-2000:]
    rec = _records(_sweep_dir(proc.stdout))["train-n02-p1-b016-native-r0"]
    assert rec["status"] == "timeout", rec["error"]
    assert rec["error"].startswith("timed out after 15 s; Slurm job ") and \
        rec["error"].endswith(" cancelled"), rec["error"]
    assert rec["slurm"]["state"] == "CANCELLED"
    assert not cl.queue()


def test_ctrl_c_cancels_the_job_records_the_run_and_submits_nothing_more(slurm_cluster):
    cl = slurm_cluster
    before = set(cl.jobs())
    proc = _bench_in_background(cl, "--nodes", "1", "--repeats", "2", "--steps", "5000")
    try:
        jid = _wait_for_running_job(cl, proc, "-r0")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert err.strip().splitlines()[-1] == "interrupted"
    sweeps = sorted(p for p in reports_dir().iterdir() if p.is_dir() and not p.is_symlink())
    records = _records(max(sweeps, key=lambda p: p.stat().st_mtime))
    assert list(records) == ["train-n01-p1-b016-native-r0"]
    rec = records["train-n01-p1-b016-native-r0"]
    assert rec["status"] == "interrupted" and rec["slurm"]["job_id"] == jid
    assert rec["slurm"]["state"] == "CANCELLED"
    assert not cl.queue()
    new = {n: v for n, v in cl.jobs().items() if n not in before and "-train-" in n}
    assert [v[0] for v in new.values()] == [jid], new  # the second repeat never started


def test_a_cluster_reached_only_through_its_login_host(slurm_cluster, tmp_path):
    """The `slurm` target: SSH to the login host and a partition are all it needs. The shared
    file system of a real Slurm cluster is played by a host directory, which every local node
    sees through its copy-on-write root."""
    import shutil

    cl = slurm_cluster
    shared = tmp_path / "shared"
    shutil.copytree(ROOT / "bench" / "workloads", shared / "bench" / "workloads",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # as an earlier provision would have left it (a copy without the marker is refused)
    (shared / "bench" / "workloads" / ".scalelab-workloads").touch()
    values = {"login_host": cl.head.address, "ssh_user": "root", "ssh_key": cl.head.ssh_key,
              "known_hosts": cl.rec["known_hosts"], "python": str(Path(sys.executable)),
              "workdir": str(shared), "iface": "eth0"}
    var_file = tmp_path / "hpc.json"
    name = unique_name("hpc")

    def provision(vals: dict) -> subprocess.CompletedProcess:
        var_file.write_text(json.dumps(vals))
        return invoke("provision", "--target", "slurm", "--cluster", name, "--nodes", "2",
                      "--var-file", str(var_file), timeout=180)

    try:
        _login_host_cluster(name, provision, values, cl, shared)
        _checkpoints_and_a_kill_from_the_login_host(name, cl, tmp_path)
    finally:
        gone = invoke("destroy", "--cluster", name)
    assert gone.returncode == 0, gone.stderr
    # the copy scalelab made on the login host is gone again (the host's own one is not its)
    left = cl.on_head(f"ls {shared}/bench 2>/dev/null || echo gone").strip()
    assert left == "gone" and (shared / "bench" / "workloads").is_dir()


def _login_host_cluster(name, provision, values, cl, shared) -> None:
    for bad, expected in (({k: v for k, v in values.items() if k != "python"}, "lacks python"),
                          ({**values, "python": "/usr/bin/true"}, "cannot import torch"),
                          ({**values, "partiton": "x"}, "did you mean 'partition'?"),
                          ({**values, "ssh_user": "-oProxyCommand=x"}, "is not a user name"),
                          ({**values, "workdir": str(ROOT)}, "is not a copy scalelab made")):
        proc = provision(bad)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(err) == 1 and expected in err[0], (bad, err)
        assert not (Path(os.environ["SCALELAB_HOME"]) / "clusters" / name).exists()
    proc = provision(values)
    assert proc.returncode == 0, proc.stderr
    status = invoke("status", "--cluster", name)
    assert "target=slurm" in status.stdout and "partition=scalelab" in status.stdout
    assert status.stdout.count(" up") == 2, status.stdout
    for args, expected in ((["--bandwidth", "1gbit"], "cannot shape links"),
                           (["--launcher", "ssh"], "can only start runs with --launcher slurm")):
        bad = invoke("bench", "--cluster", name, "--nodes", "1-2", "--batch-size", "8", *args)
        assert bad.returncode == 1 and expected in bad.stderr, bad.stderr
    cfg = invoke("configure", "--cluster", name)
    assert cfg.returncode == 1 and "installs nothing there" in cfg.stderr
    proc = invoke("bench", "--cluster", name, *QUICK, "--nodes", "1-2", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with open(_sweep_dir(proc.stdout) / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert {r["launcher"] for r in rows} == {"slurm"} and all(r["slurm_job_id"] for r in rows)
    assert float(rows[0]["link_mbit_measured"]) > 100  # measured, not shaped


def _shared_by_the_nodes(cl: Cluster, path: Path) -> None:
    """Make a host directory one the nodes share, writes and all, as a site's shared file
    system is: bound over its copy-on-write view in every node's own mount namespace (gone
    with the node)."""
    for n in cl.nodes:
        root = Path(n.extra["root"])
        pid = (root.parent / "sshd.pid").read_text().strip()
        subprocess.run(["nsenter", "-t", pid, "-m", "mount", "--bind", str(path),
                        f"{root}{path}"], check=True, timeout=30)


def _checkpoints_and_a_kill_from_the_login_host(name: str, cl: Cluster, tmp: Path) -> None:
    """On a cluster reached only through its login host: checkpoints go to a directory of the
    shared file system (the login host removes them), a place the nodes do not share is
    refused by one job of theirs before any run, each node's own disk is refused, and a
    node's ranks are killed by a step of the run's own job on that node and come back from
    the last checkpoint."""
    scratch, apart = tmp / "scratch", tmp / "apart"
    scratch.mkdir()
    apart.mkdir()
    _shared_by_the_nodes(cl, scratch)
    common = ("bench", "--cluster", name, *QUICK, "--nodes", "2", "--batch-size", "32",
              "--checkpoint-every", "5")
    for place, expected in (
            (None, f"--checkpoint-to nodes: cluster {name} is reached only through its Slurm "
                   "login host, which removes a run's checkpoints and reaches no node's own "
                   "disk or server; give --checkpoint-to a directory of the shared file "
                   "system"),
            (str(apart), f"--checkpoint-to {apart}: node {cl.nodes[1].name} cannot use it (it "
                         "does not see what the login host wrote there: not a directory the "
                         "nodes share)")):
        jobs = set(cl.jobs())
        bad = invoke(*common, *(("--checkpoint-to", place) if place else ()), timeout=600)
        err = bad.stderr.strip().splitlines()
        assert bad.returncode == 1 and len(err) == 1 and expected in err[0], err
        def new(before: set = jobs) -> dict[str, str]:
            return {j: st for j, (_, st) in cl.jobs().items() if j not in before}

        if place is not None:  # the place's one check: a job of the two nodes, which one
            # failed (slurmdbd may list it a moment late)
            wait_until(lambda: list(new().values()) == ["FAILED"], 30, "the place's job")
        assert all("-checkpoint-place" in j for j in new()) and not cl.queue(), new()
        assert len(new()) == (place is not None)
    assert cl.on_head(f"ls -A {apart} | wc -l").strip() == "0"
    # the dry run checks the place on the login host only: no job
    jobs = set(cl.jobs())
    dry = invoke(*common, "--checkpoint-to", str(apart), "--dry-run", timeout=300)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert set(cl.jobs()) == jobs
    run = _killed_and_back(cl, 1, "a new job step in the run's Slurm allocation",
                           "--checkpoint-to", str(scratch), cluster=name)
    assert run["checkpoint"]["dir"].startswith(f"{scratch}/scalelab-checkpoints/{name}/")
    assert run["checkpoint"]["removal_error"] == ""
    assert sorted(p.name for p in scratch.iterdir()) == []  # removed by the login host
    assert "checkpoint_dirs" not in load_cluster(name)
    # the kill: a step of the run's job on the killed node, between the ranks' two steps
    job = run["slurm"]["job_id"]
    steps = [ln.split("|") for ln in cl.on_head(
        f"sacct --noheader --parsable2 --jobs {job} --format JobID,JobName,State,NodeList"
    ).splitlines() if re.fullmatch(rf"{job}\.\d+", ln.split("|")[0])]
    assert [(st, nodes) for _, _, st, nodes in steps][1] == ("COMPLETED", cl.nodes[1].name), steps
    assert [st for _, _, st, _ in steps] == ["CANCELLED", "COMPLETED", "COMPLETED"], steps
