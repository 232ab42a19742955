"""Failures on purpose, the parts that need no cluster: the kill that fires only on the
launch's own processes, and a run whose failure did not happen as asked is failed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from scalelab.cluster.nodes import Node
from scalelab.run import driver, failures, launch
from scalelab.sweep.planner import plan
from scalelab.sweep.sweepfile import spec_from_options


def _sleeper(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, **env})


def test_the_kill_ends_only_the_pids_that_carry_the_launchs_token():
    """The line the node runs: of two processes given, it kills the one whose environment
    carries this launch's token mark and leaves the other (another launch's, or not
    scalelab's at all) running; a line of anything but pids kills nothing."""
    ours = _sleeper({"SCALELAB_LAUNCH": "ab12@lab-n1"})
    other = _sleeper({"SCALELAB_LAUNCH": "ff00@lab-n1"})
    bare = _sleeper({})
    try:
        # Popen returns once the child has exec'd: its environment is there to read
        line = failures.kill_line("ab12@lab-n1")
        out = subprocess.run(["bash", "-c", line], input=f"{ours.pid} {other.pid} {bare.pid}\n",
                             capture_output=True, text=True, timeout=20).stdout
        assert out.startswith(f"killed {ours.pid} at ") and out.count("killed") == 1
        assert ours.wait(timeout=10) == -9
        assert other.poll() is None and bare.poll() is None
        out = subprocess.run(["bash", "-c", line], input="$(id) ; 1\n", capture_output=True,
                             text=True, timeout=20).stdout
        assert out == ""
        # closed before any line (the run ended first): nothing killed, the session leaves
        done = subprocess.run(["bash", "-c", line], input="", capture_output=True, text=True,
                              timeout=20)
        assert done.returncode == 0 and done.stdout == "" and other.poll() is None
    finally:
        for p in (ours, other, bare):  # the processes this test started, by pid
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def _run():
    nodes = [Node(f"c-n{i}", f"10.0.0.1{i}", f"10.0.0.1{i}", "worker", "local", cpus=1.0)
             for i in range(2)]
    spec = spec_from_options(nodes="2", batch_size="8", steps="20", checkpoint_every="5",
                             inject_failure="12@1", bandwidth="native")
    return next(r for r in plan(spec, nodes, can_shape=True) if r.kind == "train")


def _result(recovery):
    rank = {"rank": 0, "host": "c-n0", "images_per_sec": 9.0, "step_times_s": [0.1] * 10,
            "checkpoint": {"saved": []}, "device": "cpu", "device_name": "cpu"}
    return {"world_size": 2, "ranks": [rank], "recovery": recovery,
            "checkpoint": {"saved": [{"step": 20}, {"step": 25}]}}


def test_a_run_whose_failure_did_not_happen_as_asked_is_failed():
    """The same run result, three ways: never killed (the run ended first), killed but not
    restarted, and killed and back from step 10 (ok)."""
    run = _run()
    assert run.params["inject_failure"] == "12@1" and run.run_id.endswith("f12n1-r0")
    base = {"asked": "12@1", "node": "c-n1", "after_step": 12, "killed_pids": [],
            "error": "", "killed_step": None, "killed_at": None, "recovery": None}
    back = {"restart": 1, "from_step": 15, "load_s": 0.1, "first_process_at": 5.0,
            "all_joined_at": 6.0, "all_ready_at": 7.0}
    cases = [
        (base, None, "a failure was to be injected after step 12 on c-n1, but the run never "
                     "reached it"),
        ({**base, "killed_pids": [9], "killed_step": 13, "killed_at": 1.0}, None,
         "c-n1's ranks were killed after step 13, but the run finished without restarting "
         "them"),
        ({**base, "killed_pids": [9], "killed_step": 13, "killed_at": 1.0,
          "recovery": {"from_step": 10}}, back, ""),
    ]
    for failure, recovery, error in cases:
        res = launch.LaunchResult("ok", _result(recovery), "", [], 1.0)
        rec = driver.run_record("s", run, "local", res, "2026-11-28T00:00:00Z", None, None,
                                checkpoint={"dir": "/w/c", "kept": False,
                                            "removal_error": ""}, failure=failure)
        assert rec["error"] == error
        assert rec["status"] == ("failed" if error else "ok")


def test_each_nodes_disk_keeps_the_last_two_checkpoints_while_training(tmp_path):
    """A node's writer keeps the checkpoint before its last until the run's end: a node
    killed while saving step 15 still holds step 10, which the others have too."""
    sys.path.insert(0, str(ROOT / "bench" / "workloads"))
    import ckpt

    ck = ckpt.Checkpointer(5, str(tmp_path), "sync", "all", state=None)
    dirs = [os.path.join(ckpt.step_dir(str(tmp_path), s), "h1") for s in (10, 15, 20)]
    for d in dirs:
        os.makedirs(d)
        ck._complete(d)
    assert sorted(os.listdir(tmp_path)) == ["step-000015", "step-000020"]
    ck.finish()
    assert os.listdir(tmp_path) == ["step-000020"]


def test_a_kill_every_period_waits_for_the_ranks_to_train_again():
    """--inject-failure Ns: the gap until each kill is drawn at random, N on average, in
    training time: from the first timed step, then from when the ranks of the next attempt
    trained again; one due while the ranks restart waits for their first step; none is due
    once the node's ranks have finished the run's last step; the record says how long the
    kills' clock ran."""
    from scalelab.run.failures import Injector

    nodes = [Node(f"c-n{i}", f"10.0.0.1{i}", f"10.0.0.1{i}", "worker", "local")
             for i in range(2)]
    inj = Injector("8s", nodes, "r", None, 8.0, 2, 102, 1, "")
    gaps = [inj.gap_s(k) for k in range(20)]
    assert len(set(gaps)) == 20 and min(gaps) < 8 < max(gaps)  # random, not a period
    assert gaps == [Injector("8s", nodes, "r", None, 8.0, 2, 102, 1, "").gap_s(k)
                    for k in range(20)]  # the same on --resume
    t = time.time()

    def line(pid: int, step: int, stamp: float) -> str:
        return f"SCALELAB_STEP 0 0 {step} {pid} {stamp:.6f}"

    # the warm-up's end: the node's stamp, and when its line was read (the kills' clock)
    inj._read(0, [line(100, 2, t - gaps[0] - 0.7)], t - gaps[0] + 0.5)
    assert inj.first_at == pytest.approx(t - gaps[0] - 0.7)
    assert inj.since() == t - gaps[0] + 0.5 and not inj._due(0, t)
    assert inj._due(0, t + 1.0)  # the first kill is due
    assert not inj._due(1, t + 1.0)  # node 1's ranks printed nothing
    t += 1.0
    assert inj._fire(0, t) == [100]
    inj.kills[0].killed_at = t
    inj._read(0, [line(100, 60, t)], t)  # the killed rank finished one more step first
    assert inj.kills[0].step == 60
    # the second kill's gap has passed since the first timed step, but its clock starts only
    # when the ranks train again: nothing is due while they restart
    assert inj.since() is None
    assert not inj._due(0, t + gaps[1] + 1) and not inj._due(1, t + gaps[1] + 1)
    inj._read(1, [line(200, 51, t + 5.0)], t + 5.0)  # the restarted attempt's first step
    assert inj.kills[0].resumed_at == t + 5.0 and inj.since() == t + 5.0
    assert not inj._due(1, t + 5.0 + gaps[1] - 0.5)  # not before its gap
    assert inj._due(1, t + 5.0 + gaps[1] + 0.5)
    inj._read(1, [line(200, 102, t + 30.0)], t + 30.0)  # the run's last step: nothing to kill
    assert not inj._due(1, t + 5.0 + gaps[1] + 0.5) and inj.end_at == pytest.approx(t + 30.0)
    # the clock ran from the first timed step to the kill, and from the ranks' return to the
    # end: the training less the 5 s the restart took
    inj.kills[0].killed_at = t
    rec = inj.record(None)
    assert rec["trained_s"] == pytest.approx(t + 30.0 - (t - 1.0 - gaps[0] - 0.7), abs=1e-3)
    assert rec["up_s"] == pytest.approx(rec["trained_s"] - 5.0, abs=1e-3)
    assert rec["kills"][0]["gap_s"] == pytest.approx(gaps[0], abs=1e-3)
    assert rec["kills"][0]["fired_s"] == pytest.approx(gaps[0] + 0.5, abs=1e-3)


def test_the_step_lines_give_the_step_the_save_and_the_restart_over_every_attempt():
    """A rank's consecutive step lines: 1 s a step, 1.5 s for the step after each checkpoint
    (every 5 timed steps after 2 warm-up ones); a kill that took 3 s until the next step was
    done costs 2 s; the warm-up's steps count for nothing."""
    from scalelab.run.failures import Injector

    nodes = [Node("c-n0", "10.0.0.10", "10.0.0.10", "worker", "local")]
    inj = Injector("8s", nodes, "r", None, 8.0, 2, 22, 1, "", every=5)
    t, lines = 1000.0, []
    for step in range(1, 23):
        t += 1.5 if step - 1 > 2 and (step - 1 - 2) % 5 == 0 else (9.0 if step <= 2 else 1.0)
        lines.append(f"SCALELAB_STEP 0 0 {step} 100 {t:.6f}")
    inj._read(0, lines, t)
    assert inj._costs([3.0]) == {"step_s": 1.0, "save_s": 0.5, "restart_s": 2.0}
    assert inj._costs([]) == {"step_s": 1.0, "save_s": 0.5, "restart_s": None}


def test_horovods_step_lines_come_from_one_command_and_a_rank_outlives_a_kill():
    """horovodrun prints every node's lines on the head's command: each is the node's whose
    address it names (an address not the run's counts for nothing). After a kill, a rank of
    the other node goes on in the same process: its lines count again from the attempt after
    (the restart its lines carry), not those it printed before it noticed."""
    from scalelab.run.failures import Injector

    nodes = [Node(f"c-n{i}", f"10.0.0.1{i}", f"10.0.0.1{i}", "worker", "local")
             for i in range(2)]
    inj = Injector("3@1", nodes, "r", 3, None, 0, 10, 1, "",
                   hosts={"10.0.0.10": 0, "10.0.0.11": 1})
    t = time.time()

    def line(attempt: int, rank: int, step: int, pid: int, host: str) -> str:
        return f"[{rank}]<stdout>:SCALELAB_STEP {attempt} {rank} {step} {pid} {t:.6f} {host}"

    inj._read(0, [line(0, r, s, 100 + r, f"10.0.0.1{r}") for s in (1, 2, 3) for r in (0, 1)]
              + [line(0, 1, 3, 999, "10.0.0.99")], t)
    assert inj.live == {0: {100: 3}, 1: {101: 3}}
    assert inj._due(1, t) and inj._fire(1, t) == [101]
    inj._read(0, [line(0, 0, 4, 100, "10.0.0.10")], t)  # before it noticed: no attempt's
    assert inj.live == {} and inj.kills[0].resumed_at is None
    # back: the same process on node 0 at the next attempt, a new one on node 1
    inj._read(0, [line(1, 0, 3, 100, "10.0.0.10"), line(1, 1, 3, 300, "10.0.0.11")], t + 6)
    assert inj.live == {0: {100: 3}, 1: {300: 3}} and inj.kills[0].resumed_at == t + 6
    # a rank rolled back after its step-4 commit prints step 5 again in the next attempt: the
    # restart between is no checkpoint's cost, nor a step's
    inj = Injector("3@1", nodes, "r", 3, None, 0, 10, 1, "", every=2,
                   hosts={"10.0.0.10": 0, "10.0.0.11": 1})
    inj._read(0, [f"SCALELAB_STEP 0 0 {s} 100 {t + s:.6f} 10.0.0.10" for s in (1, 2, 3, 4)]
              + [f"SCALELAB_STEP 1 0 5 100 {t + 30:.6f} 10.0.0.10"], t + 30)
    assert (inj.save_count, inj.step_count) == (1, 2)
