"""Faults inside a run: a rank killed with SIGKILL, a node's link cut. The run is recorded as
failed with the reason, every other rank is ended within the run's timeout, the sweep goes on
and the next run succeeds; destroy then leaves nothing behind."""

from __future__ import annotations

import time

import pytest
from conftest import needs_root, needs_sshd

from . import faultlib as fl

pytestmark = [needs_root, needs_sshd, pytest.mark.root, pytest.mark.slow]

TIMEOUT_S = 150  # per run; the fault must be handled well inside it


def _two_runs(tmp_path, steps: int):
    # repeat 0 is hit by the fault, repeat 1 must then succeed on the same two nodes
    return fl.write_sweep(tmp_path / "two.yml", nodes=[2], repeats=2, steps=steps,
                          timeout_s=TIMEOUT_S)


def test_rank_killed_mid_run_fails_that_run_only(fcluster, reports, tmp_path, fault):
    lc = fcluster(2)
    sweep = _two_runs(tmp_path, steps=60)
    proc = fl.start_bench(lc.name, reports, "--sweep", str(sweep), "--no-report")
    try:
        pid = fl.wait_for(lambda: fl.training(lc, 1), 120, "rank 1 to start training")
        # the run's other processes (the warm-start servers serve the next run)
        survivors = {**fl.run_processes(lc, 0), **fl.run_processes(lc, 1)}
        del survivors[pid]
        t_kill = time.monotonic()
        fl.kill_pid(pid)  # the resnet.py rank on node 1, a process this sweep started
        fault()
        sweep_dir = fl.wait_for(lambda: fl.latest(reports), 10, "the sweep directory")
        fl.wait_for(lambda: fl.records(sweep_dir), TIMEOUT_S, "the failed run's record")
        handled_s = time.monotonic() - t_kill
        # every other process of that run was gone before its record was written
        left = [p for p in survivors if fl.localhost._state(p) not in ("X", "Z")]
        assert not left, {p: survivors[p] for p in left}
        out, err = fl.finish(proc, 300)
    finally:
        if proc.poll() is None:
            fl.kill_pid(proc.pid)
            proc.wait(timeout=30)
    # the sweep went on and kept both results; its exit says a run failed
    assert proc.returncode == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert "1 of 2 runs failed or timed out" in last, err[-500:]
    # and the command that runs them again, for this sweep
    assert last.endswith(f"invoke bench --resume {sweep_dir.name} --retry-failed runs them again")
    recs = fl.records(sweep_dir)
    assert [r["run_id"] for r in recs] == ["train-n02-p1-b016-native-r0",
                                           "train-n02-p1-b016-native-r1"]
    failed, ok = recs
    assert failed["status"] == "failed", failed
    # the reason names the node and the signal, then what the survivor saw
    assert f"{lc.name}-n1: rank 1 killed by signal 9 (SIGKILL)" in failed["error"], failed["error"]
    assert handled_s < 30, f"the failure took {handled_s:.0f} s to be recorded"
    assert ok["status"] == "ok" and len(ok["ranks"]) == 2, ok["error"]
    assert "1 ok, 1 failed" in out
    assert fl.lost_runs(sweep_dir) == 0
    assert fl.csv_rows(sweep_dir) == 2
    assert not (sweep_dir / ".inflight.json").exists()
    assert not fl.all_workload_pids(lc.name, 2)
    fault(lost=fl.lost_runs(sweep_dir))
    fl.destroy_and_check(lc)


def test_link_cut_mid_run_fails_that_run_only(fcluster, reports, tmp_path, fault):
    lc = fcluster(2)
    sweep = _two_runs(tmp_path, steps=60)  # cut as soon as it trains: still in flight
    proc = fl.start_bench(lc.name, reports, "--sweep", str(sweep), "--no-report")
    cut = False
    try:
        fl.wait_for(lambda: fl.training(lc, 1), 120, "rank 1 to start training")
        on_n0 = fl.run_processes(lc, 0)
        run_pids = {**on_n0, **fl.run_processes(lc, 1)}
        fl.set_link(lc, 1, up=False)
        cut = True
        t_cut = time.monotonic()
        fault()
        # the driver notices (ssh keep-alives), ends what it can reach (node 0) and keeps
        # trying node 1; the link comes back while it does
        fl.wait_for(lambda: fl.gone(on_n0), 90,
                    "the driver to end the ranks on the reachable node")
        detected_s = time.monotonic() - t_cut
        assert fl.workload_pids(lc.name, 1), "node 1's rank vanished while its link was down"
        time.sleep(2)
        fl.set_link(lc, 1, up=True)
        cut = False
        sweep_dir = fl.wait_for(lambda: fl.latest(reports), 10, "the sweep directory")
        first = fl.wait_for(lambda: fl.records(sweep_dir), 60, "the failed run's record")
        assert first[0]["status"] == "failed", first[0]
        # node 1's ranks were ended once it could be reached again, before the record
        left = [p for p in run_pids if fl.localhost._state(p) not in ("X", "Z")]
        assert not left, {p: run_pids[p] for p in left}
        out, err = fl.finish(proc, 400)
    finally:
        if cut:
            fl.set_link(lc, 1, up=True)
        if proc.poll() is None:
            fl.kill_pid(proc.pid)
            proc.wait(timeout=30)
    # the sweep went on and kept both results; its exit says a run failed
    assert proc.returncode == 1, err[-2000:]
    assert "1 of 2 runs failed or timed out" in err.strip().splitlines()[-1], err[-500:]
    recs = fl.records(sweep_dir)
    assert [r["status"] for r in recs] == ["failed", "ok"], [r["error"] for r in recs]
    error = recs[0]["error"]
    assert f"{lc.name}-n1: lost the SSH connection" in error, error
    assert f"still running and ended: {lc.name}-n0" in error, error
    assert "could not end" not in error  # node 1 was reached again and its rank ended
    assert detected_s < 45, f"a cut link took {detected_s:.0f} s to be noticed"
    assert fl.lost_runs(sweep_dir) == 0
    assert not (sweep_dir / ".inflight.json").exists()
    assert not fl.all_workload_pids(lc.name, 2)
    fault(lost=fl.lost_runs(sweep_dir))
    fl.destroy_and_check(lc)


def test_a_rank_that_fails_leaving_after_the_result_keeps_the_run(fcluster):
    """Real ranks on two nodes over SSH: the head prints every rank's figures, then the other
    rank aborts (SIGABRT, as gloo can while its group is torn down). The run is ok, with the
    abort in its env; had the result lacked a rank, the same abort fails the run, and it fails
    an allreduce probe's."""
    import json

    from scalelab.cluster import targets
    from scalelab.core.state import load_cluster
    from scalelab.run import commands, launch

    lc = fcluster(2)
    a, b = lc.nodes()
    rt = targets.of(load_cluster(lc.name)).runtime(load_cluster(lc.name))

    def ranks(result: dict) -> list:
        line = "SCALELAB_RESULT " + json.dumps(result)
        head = ["sh", "-c", f"echo '{line}'; sleep 3"]
        # the abort comes after the head has printed (a bounded wait for it)
        leaver = ["sh", "-c", "sleep 1; kill -ABRT $$; sleep 30"]
        return [commands.RankCommand(a, head), commands.RankCommand(b, leaver)]

    res = launch.run(ranks({"world_size": 2, "ranks": [{"rank": 0}, {"rank": 1}]}), rt,
                     timeout_s=60)
    assert (res.status, res.error) == ("ok", "")
    assert b.name in res.result["env"]["teardown_failure"], res.result["env"]
    assert "SIGABRT" in res.result["env"]["teardown_failure"]
    res = launch.run(ranks({"world_size": 2, "ranks": [{"rank": 0}]}), rt, timeout_s=60)
    assert res.status == "failed" and b.name in res.error and "SIGABRT" in res.error
    # an allreduce probe's result (sizes, no per-rank figures): the same abort fails it
    probe = {"world_size": 2, "sizes": [{"size_bytes": 1024, "time_s": 1e-4}], "hosts": [a.name, b.name]}
    res = launch.run(ranks(probe), rt, timeout_s=60)
    assert res.status == "failed" and b.name in res.error and "SIGABRT" in res.error
