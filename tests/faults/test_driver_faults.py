"""Faults of the driver and the cluster around it: a node's sshd down at sweep start, the
driver killed with SIGKILL mid-sweep then resumed, Ctrl-C (SIGINT) mid-run and mid-shaping.
Nothing recorded is lost, nothing started is left running, every failure says why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, bench_exit, needs_root, needs_sshd

from scalelab.cluster.targets.local import LocalCluster
from scalelab.run import admission, lifecycle

from . import faultlib as fl

pytestmark = [needs_root, needs_sshd, pytest.mark.root, pytest.mark.slow]


def test_sshd_down_at_sweep_start_names_the_node_and_writes_nothing(fcluster, reports,
                                                                    tmp_path, fault):
    lc = fcluster(2)
    victim = f"{lc.name}-n1"
    pid = lc.load()["pids"][victim]  # the sshd this cluster started for node 1
    fl.kill_pid(pid, signal.SIGTERM)
    fl.wait_for(lambda: fl.localhost._state(pid) in ("X", "Z"), 10, "node 1's sshd to end")
    fault()
    sweep = fl.write_sweep(tmp_path / "s.yml", nodes=[1, 2])
    t0 = time.monotonic()
    proc = fl.run_bench(lc.name, reports, "--sweep", str(sweep), timeout=120)
    assert proc.returncode == 1
    line = fl.one_line(proc.stderr)
    assert line.startswith(f"error: node {victim} does not answer SSH"), line
    assert "invoke status" in line  # says what to do
    assert time.monotonic() - t0 < 60
    assert not reports.exists() or not any(reports.iterdir()), list(reports.iterdir())
    assert not fl.all_workload_pids(lc.name, 2)  # no run started on the healthy node
    fault(lost=0)
    fl.destroy_and_check(lc)


def _mini(tmp_path):
    # 2 train runs on 2 nodes: native, then 1gbit (shaped)
    return fl.write_sweep(tmp_path / "mini.yml", nodes=[2], bandwidth=["native", "1gbit"],
                          steps=3)


def test_driver_sigkill_then_resume_runs_only_the_missing(fcluster, reports, tmp_path, fault):
    lc = fcluster(2)
    sweep = _mini(tmp_path)
    # the same sweep, never interrupted: what the resumed one must match
    ref = fl.run_bench(lc.name, reports / "ref", "--sweep", str(sweep), "--no-report")
    assert ref.returncode == 0, ref.stderr[-2000:]
    ref_dir = fl.latest(reports / "ref")
    assert {r["status"] for r in fl.records(ref_dir)} == {"ok"}

    live = reports / "live"
    proc = fl.start_bench(lc.name, live, "--sweep", str(sweep), "--no-report")
    try:
        sweep_dir = fl.wait_for(lambda: fl.latest(live), 60, "the sweep directory")
        # while the sweep holds the cluster, a second command that would change its links or
        # run beside it is refused in one line naming the holder, and changes nothing
        other = reports / "other"
        for argv in (["shape", "--cluster", lc.name, "--bandwidth", "100mbit"],
                     ["bench", "--cluster", lc.name, "--sweep", str(sweep), "--no-report"]):
            second = subprocess.run([sys.executable, "-m", "invoke", *argv], cwd=ROOT,
                                    env=fl.fault_env(other), capture_output=True, text=True,
                                    timeout=120)
            line = fl.one_line(second.stderr)
            assert second.returncode == 1, line
            assert line.startswith(f"error: cluster {lc.name} is in use by `invoke bench "
                                   f"--cluster {lc.name}"), line
            assert f"(pid {proc.pid}) since " in line, line
        assert (100.0, 100.0) not in set(lc.link_rates().values())
        assert not other.exists()
        fl.wait_for(lambda: fl.records(sweep_dir), 300, "the first run recorded")
        # the 2nd run (at 1gbit) is in flight: links are shaped, ranks train
        fl.wait_for(lambda: fl.training(lc, 1), 120, "the 2nd run to train")
        os.kill(proc.pid, signal.SIGKILL)
        fault()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            fl.kill_pid(proc.pid)
            proc.wait(timeout=30)
    before = {r["run_id"] for r in fl.records(sweep_dir)}
    assert before == {"train-n02-p1-b016-native-r0"}
    assert (sweep_dir / ".inflight.json").exists()
    assert set(lc.link_rates().values()) == {(1000.0, 1000.0)}  # left shaped by the kill

    # the lock went with the killed driver: the resume takes the cluster over
    res = fl.run_bench(lc.name, live, "--resume", sweep_dir.name, "--no-report")
    assert "resuming" in res.stdout and "1 runs missing" in res.stdout, res.stdout
    recs = fl.records(sweep_dir)  # every line parses
    assert res.returncode == bench_exit(r["status"] for r in recs), res.stderr[-2000:]
    ids = [r["run_id"] for r in recs]
    assert len(ids) == len(set(ids)), "duplicate records after resume"
    assert sorted(ids) == sorted(fl.planned(sweep_dir)) == sorted(r["run_id"]
                                                                  for r in fl.records(ref_dir))
    # every run is a result: ok, or failed with its reason (a gloo abort under load is
    # recorded, not hidden); none is left interrupted or missing
    assert all(r["status"] == "ok" or (r["status"] == "failed" and r["error"]) for r in recs), \
        [(r["run_id"], r["status"], r["error"]) for r in recs]
    assert fl.csv_rows(sweep_dir) == fl.csv_rows(ref_dir) == 2
    assert json.loads((sweep_dir / "sweep.json").read_text())["finished_at"]
    # what the killed driver left is gone: its ranks, its inflight note, its link rate
    assert not (sweep_dir / ".inflight.json").exists()
    assert not (lc.dir / "shaped.json").exists()
    assert not fl.all_workload_pids(lc.name, 2)
    assert set(lc.link_rates().values()) == {(None, None)}
    assert lc.load()["bandwidth_mbit"] is None
    fault(lost=fl.lost_runs(sweep_dir))
    fl.destroy_and_check(lc)


def test_ctrl_c_mid_run_marks_it_interrupted_and_cleans_up(fcluster, reports, tmp_path, fault):
    lc = fcluster(2, bandwidth="1gbit")
    sweep = fl.write_sweep(tmp_path / "int.yml", nodes=[2], bandwidth=["500mbit"], repeats=2,
                           steps=25)
    proc = fl.start_bench(lc.name, reports, "--sweep", str(sweep), "--no-report")
    try:
        fl.wait_for(lambda: fl.training(lc, 1), 120, "the first run to train")
        assert set(lc.link_rates().values()) == {(500.0, 500.0)}
        t_int = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        fault()
        out, err = fl.finish(proc, 120)
    finally:
        if proc.poll() is None:
            fl.kill_pid(proc.pid)
            proc.wait(timeout=30)
    assert proc.returncode == 130
    assert fl.one_line(err) == "interrupted"
    assert time.monotonic() - t_int < 60
    sweep_dir = fl.latest(reports)
    recs = fl.records(sweep_dir)  # consistent: every line parses
    assert [(r["run_id"], r["status"]) for r in recs] == [
        ("train-n02-p1-b016-bw500-r0", "interrupted")]
    assert recs[0]["error"] == "interrupted by the user"
    assert not fl.all_workload_pids(lc.name, 2), "ranks left running after Ctrl-C"
    assert set(lc.link_rates().values()) == {(1000.0, 1000.0)}, "link rates not restored"
    assert lc.load()["bandwidth_mbit"] == 1000.0
    assert not (sweep_dir / ".inflight.json").exists()
    assert not (lc.dir / "shaped.json").exists()
    assert json.loads((sweep_dir / "sweep.json").read_text())["finished_at"] is None

    # the interrupted run and the one never started are what a resume does
    res = fl.run_bench(lc.name, reports, "--resume", "latest", "--no-report")
    assert "2 runs missing" in res.stdout
    # both runs are results now (ok, or failed with the reason: a gloo abort under load is
    # recorded, not hidden, and the exit says so); none is left interrupted or missing
    view = fl.store_view(sweep_dir)
    assert res.returncode == bench_exit(r["status"] for r in view), res.stderr[-2000:]
    assert len(view) == 2
    assert all(r["status"] == "ok" or (r["status"] == "failed" and r["error"]) for r in view), \
        [(r["run_id"], r["status"], r["error"]) for r in view]
    fault(lost=fl.lost_runs(sweep_dir))
    fl.destroy_and_check(lc)


def test_ctrl_c_while_links_are_being_shaped(fcluster, reports, tmp_path, monkeypatch, fault):
    """SIGINT lands between two nodes' tc changes: shaping finishes, no run starts, every
    link goes back to the cluster's rate, and KeyboardInterrupt comes out at the end."""
    from scalelab.sweep import sweepfile

    lc = fcluster(3, bandwidth="1gbit")
    real = LocalCluster._shape_node
    sent = {"n": 0}

    def shape_then_interrupt(self, i, rate, delay_us=0.0):
        real(self, i, rate, delay_us)
        if i == 0 and sent["n"] == 0:
            sent["n"] += 1
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: the next node is not shaped yet

    monkeypatch.setattr(LocalCluster, "_shape_node", shape_then_interrupt)
    spec = sweepfile.load_sweep_file(fl.write_sweep(tmp_path / "s.yml", nodes=[3],
                                                 bandwidth=["100mbit"]))
    prep = admission.prepare(lc.name, spec)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        lifecycle.start(prep, reports)
    fault()
    assert sent["n"] == 1
    sweep_dir = fl.latest(reports)
    assert fl.records(sweep_dir) == []  # no run was started, so none is recorded
    assert set(lc.link_rates().values()) == {(1000.0, 1000.0)}
    assert lc.load()["bandwidth_mbit"] == 1000.0
    assert not (lc.dir / "shaped.json").exists()
    assert not fl.all_workload_pids(lc.name, 3)
    assert signal.getsignal(signal.SIGINT) is before  # the driver's handler is gone again
    fault(lost=0)
    fl.destroy_and_check(lc)


def test_a_sweep_never_starts_beside_ranks_a_killed_one_left_that_cannot_be_ended(
        fcluster, reports, tmp_path):
    """A killed sweep's notes name ranks on a node that does not answer (a port of loopback
    nobody listens on): the next sweep on the cluster is refused in one line before it writes
    anything, and the notes stay for the next try."""
    import socket

    from scalelab.core.errors import ClusterError
    from scalelab.run.launch import Node
    from scalelab.sweep import sweepfile

    lc = fcluster(1)
    spec = sweepfile.load_sweep_file(fl.write_sweep(tmp_path / "s.yml", nodes=[1]))
    prep = admission.prepare(lc.name, spec)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    gone = Node(lc.nodes()[0].name, "127.0.0.1", "127.0.0.1", "head", "local", ssh_port=closed)
    dead = reports / "20261129-000000-dead"
    dead.mkdir(parents=True)
    (dead / "sweep.json").write_text(json.dumps({"cluster": lc.name}))
    notes = [{"node": gone.to_dict(), "pgid": 4242, "token": "ab12"}]
    (dead / ".inflight.json").write_text(json.dumps(notes))
    with pytest.raises(ClusterError) as ei:
        lifecycle.start(prep, reports)
    assert str(ei.value) == (
        f"cluster {lc.name}: 1 of the 1 process groups a killed sweep left on the nodes could "
        "not be ended (a node does not answer?); nothing was started: run the sweep again once "
        "every node answers, or invoke destroy")
    assert sorted(p.name for p in reports.iterdir()) == [dead.name]  # nothing written
    assert json.loads((dead / ".inflight.json").read_text()) == notes
