"""The shell lines scalelab hands Slurm, run by sh as a login host or a task would run them:
a parameter-server process's rank from its node's place in the run, and the allocation that
starts a DDP run's ranks again after a failure. The jobs themselves are in test_slurm.py."""

from __future__ import annotations

import subprocess

from scalelab.run import slurm

SHOW = ["sh", "-c", 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $*"', "sh"]


def _task(node: str, localid: int, places: str, per_node: int = 1,
          ntasks: int = 3) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": node, "SLURM_LOCALID": str(localid),
           "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_NTASKS": str(ntasks),
           "SCALELAB_PS_NODES": places}
    return subprocess.run(["sh", "-c", slurm._PS_RANK_ENV, "sh", *SHOW], env=env,
                          capture_output=True, text=True, timeout=10)


def test_a_parameter_server_process_takes_its_rank_from_its_nodes_place_in_the_run():
    # the worker node is listed first and gets rank 0, though Slurm would sort it last
    places = "z-worker:0,a-server:1"
    assert _task("z-worker", 0, places, ntasks=2).stdout.split() == \
        ["0", "2", "0", "1", "0", "--ps-servers-here", "0"]
    assert _task("a-server", 0, places, ntasks=2).stdout.split() == \
        ["1", "2", "0", "1", "1", "--ps-servers-here", "1"]
    # colocated: two workers and a server a node, the server the node's last task
    places = "n0:1,n1:1"
    assert _task("n1", 2, places, per_node=3, ntasks=6).stdout.split() == \
        ["5", "6", "2", "3", "1", "--ps-servers-here", "1"]


def test_a_node_that_has_no_place_in_the_run_starts_nothing():
    proc = _task("stranger", 0, "n0:0,n1:1")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == "scalelab: node stranger has no place in this run"


def _loop(restarts: int, fails: int, tmp_path, job_state: str = "RUNNING"
          ) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The restart loop around a step that exits 3 on its first `fails` attempts, in a job
    that squeue (a stand-in printing job_state for job 7) says is in that state."""
    log, bin_dir = tmp_path / "attempts", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text('#!/bin/sh\n[ "$*" = "--noheader --jobs 7 --format %T" ] '
                                    f"&& echo {job_state}\n")
    (bin_dir / "squeue").chmod(0o755)
    step = ("echo $SCALELAB_ATTEMPT >> " + str(log) + "; "
            f'[ "$SCALELAB_ATTEMPT" -ge {fails} ] || exit 3')
    line = slurm._RESTART_LOOP.replace("__R__", str(restarts))
    proc = subprocess.run(["sh", "-c", line, "sh", "sh", "-c", step], capture_output=True,
                          text=True, timeout=10,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "7"})
    return proc, log.read_text().split()


def test_the_ranks_step_starts_again_after_each_failure_up_to_the_restarts(tmp_path):
    proc, attempts = _loop(3, 2, tmp_path)
    assert proc.returncode == 0 and attempts == ["0", "1", "2"]
    assert "step again (1 of 3)" in proc.stderr and "step again (2 of 3)" in proc.stderr


def test_a_step_that_keeps_failing_ends_the_job_with_its_exit_code(tmp_path):
    proc, attempts = _loop(1, 5, tmp_path)
    assert proc.returncode == 3 and attempts == ["0", "1"]


def test_a_job_no_longer_running_is_not_stepped_again(tmp_path):
    """Cancelled, or past its time limit: the loop ends with the step's exit code instead of
    starting steps Slurm would refuse."""
    proc, attempts = _loop(3, 5, tmp_path, job_state="COMPLETING")
    assert proc.returncode == 3 and attempts == ["0"] and "step again" not in proc.stderr
