"""The pieces of fault handling that need no cluster: ending only our own process group,
explaining a failure from what torchrun and ssh print, the inflight note on a full disk,
the link-rate note a killed driver leaves, and Ctrl-C turned into a stop at a safe point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import fill, needs_root, needs_sshd, running, tiny_fs, wait_until

from scalelab.run import commands, launch, lifecycle, reap

DATA = Path(__file__).parent / "data"


# ------------------------------------------------------------------ reap only what is ours

def _group(token: str) -> subprocess.Popen:
    """A process group like a rank's: a shell leader and a child, with the launch token;
    returned once the child runs."""
    env = {**os.environ, reap.TOKEN_VAR: token} if token else dict(os.environ)
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], env=env, start_new_session=True)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    wait_until(lambda: children.read_text().strip(), 10, "the shell's child")
    return proc


def _alive(pgid: int) -> bool:
    """Whether any member of the group still runs (zombies waiting for init do not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


@pytest.mark.parametrize("given, ended", [("ab12", True), ("ffff", False)])
def test_reap_line_ends_a_group_only_if_it_carries_the_token(given, ended):
    proc = _group("ab12")
    try:
        out = subprocess.run(["sh", "-c", reap.reap_line(proc.pid, given, 1.0)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        if ended:
            proc.wait(timeout=5)
        assert _alive(proc.pid) is not ended
    finally:
        if _alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)  # the group this test started
        proc.wait(timeout=5)


def test_each_node_ends_only_its_own_ranks_where_nodes_share_a_pid_namespace():
    """The node's name is in the launch token (README), so where nodes share one PID
    namespace, as the local target's do, one launch's groups of two nodes run side by side
    and node n0's reap line ends n0's group only."""
    mine, theirs = (_group(reap.token_mark("ab12", n)) for n in ("lab-n0", "lab-n1"))
    try:
        out = subprocess.run(["sh", "-c", reap.reap_line(None, "ab12", 1.0, "lab-n0")],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        mine.wait(timeout=5)
        assert not _alive(mine.pid)
        assert _alive(theirs.pid), "a node ended another node's ranks"
    finally:
        for proc in (mine, theirs):
            if _alive(proc.pid):
                os.killpg(proc.pid, signal.SIGKILL)  # the groups this test started
            proc.wait(timeout=5)


def test_reap_line_of_a_group_that_is_gone_exits_zero():
    proc = _group("ab12")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)
    out = subprocess.run(["sh", "-c", reap.reap_line(proc.pid, "ab12", 0.5)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stderr == ""


@needs_root
def test_a_group_that_outlives_its_kill_is_reported_not_counted_as_ended():
    """A reap line that could not end a group (here: run as a user who may not signal it)
    exits 3 naming it, so that destroy keeps its records and says so, instead of reading
    the refused kill as done."""
    proc = _group("")
    try:
        out = subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c",
                              reap.reap_line(proc.pid, grace_s=0.3)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 3, (out.returncode, out.stderr)
        assert f"process groups {proc.pid} still running after KILL" in out.stderr
        assert _alive(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started
        proc.wait(timeout=5)


def test_a_group_left_as_a_zombie_counts_as_ended():
    """A rank whose parent does not reap it (a host whose init is sshd) stays a zombie: it is
    gone, and the reap line says so rather than failing for it."""
    proc = subprocess.Popen(["sh", "-c", "exit 0"], start_new_session=True)
    try:
        wait_until(lambda: Path(f"/proc/{proc.pid}/stat").read_text().split()[2] == "Z", 10,
                   "the zombie")
        out = subprocess.run(["sh", "-c", reap.reap_line(proc.pid, grace_s=0.3)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and out.stderr == "", out.stderr
    finally:
        proc.wait(timeout=5)


def test_a_bad_token_never_reaches_the_shell():
    with pytest.raises(reap.LaunchError):
        reap.reap_line(42, "ab'; rm -rf /; '")


# ------------------------------------------------------------------ failures explained

def test_explains_a_killed_rank_from_real_torchrun_output():
    """stderr of a real 2-node run in which rank 1's process was sent SIGKILL."""
    outs = [launch.RankOutcome("c-n0", 1, "", (DATA / "torchrun_rank0_peer_died.txt").read_text(),
                               9.1),
            launch.RankOutcome("c-n1", 1, "", (DATA / "torchrun_rank1_sigkill.txt").read_text(),
                               8.2)]
    text = launch.explain_failure(outs, "failed", 60)
    assert text.startswith("c-n1: rank 1 killed by signal 9 (SIGKILL); c-n0: rank 0 exit 1: "
                           "RuntimeError: "), text
    assert "Connection closed by peer [10.213.2.11]" in text and "=====" not in text
    assert len(text) < 400


def test_explains_a_lost_node_and_the_ranks_scalelab_ended():
    outs = [launch.RankOutcome("c-n0", 143, "", "SCALELAB_PGID 7\n[resnet.py] rank 0/2\n",
                               None, reaped=True),
            launch.RankOutcome("c-n1", 255, "", "SCALELAB_PGID 9\n[resnet.py] rank 1/2\n", 20.0)]
    assert launch.explain_failure(outs, "failed", 60) == (
        "c-n1: lost the SSH connection (node down, sshd gone or link cut); "
        "still running and ended: c-n0")


@pytest.mark.parametrize("stderr, code, expected", [
    ("ssh: connect to host 10.0.0.11 port 22: No route to host\n", 255,
     "ssh: connect to host 10.0.0.11 port 22: No route to host"),
    ("root@10.0.0.11: Permission denied (publickey).\n", 255,
     "root@10.0.0.11: Permission denied (publickey)."),
    ("resnet.py: error: dataset /data/x not found\n", 2,
     "exit 2: resnet.py: error: dataset /data/x not found"),
    ("", 137, "exit 137: killed by SIGKILL"),
    ("", -9, "killed by signal 9 (SIGKILL)"),
    ("Traceback (most recent call last):\n  File \"x\", line 1\nMemoryError\n", 1,
     "exit 1: MemoryError"),
])
def test_rank_reason(stderr, code, expected):
    assert launch.rank_reason(stderr, code) == expected


# ------------------------------------------------------------------ the inflight note

@pytest.mark.root
@needs_root
def test_a_full_disk_while_noting_process_groups_is_a_clear_error(tmp_path):
    """A real full file system (a small tmpfs, filled) under the sweep's directory."""
    with tiny_fs(tmp_path / "fs") as fs:
        sweep = fs / "20261121-000000-ab12"
        sweep.mkdir()
        fill(fs)
        path = sweep / ".inflight.json"
        with pytest.raises(reap.LaunchError, match=r"cannot write .*\.inflight\.json \(No "
                           r"space left on device\); the run in flight was stopped and not "
                           r"recorded; free space, then resume the sweep \(invoke bench "
                           r"--resume 20261121-000000-ab12\)"):
            reap.save_inflight(path, [{"node": {}, "pgid": 1}])
        assert [p.name for p in sweep.iterdir()] == []  # no partial file left


@pytest.mark.root
@needs_root
@needs_sshd
def test_unreachable_groups_stay_noted_and_reachable_ones_end(fcluster, tmp_path):
    """A real process group on a node, carrying a launch token, and one on a node that does
    not answer (a closed port): reaping ends the first and keeps the second noted."""
    import socket

    from scalelab.cluster import ssh

    lc = fcluster(1)
    (a,) = lc.nodes()
    kh = str(lc.known_hosts)
    token = "ab12"
    mark = reap.token_mark(token, a.name)
    # setsid without a fork (the shell's background child leads no group): $! is the pgid
    pgid = int(ssh.run(a, kh, f"env {reap.TOKEN_VAR}={mark} setsid sleep 120 "
                              ">/dev/null 2>&1 </dev/null & echo $!", timeout=30).stdout)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    gone = launch.Node("gone", "127.0.0.1", "127.0.0.1", "worker", "local", ssh_port=closed)
    path = tmp_path / ".inflight.json"
    path.write_text(json.dumps([{"node": a.to_dict(), "pgid": pgid, "token": token},
                                {"node": gone.to_dict(), "pgid": 4242, "token": token}]))
    try:
        assert reap.reap_inflight(path, kh, retry_s=1.0) == (2, 1)
        assert [e["node"]["name"] for e in json.loads(path.read_text())] == ["gone"]

        assert not running(pgid)  # the nodes share the host's pid space
    finally:
        ssh.run(a, kh, f"kill -9 -{pgid} 2>/dev/null; true", timeout=30, check=False)


def test_a_rank_whose_stderr_is_lost_still_says_why_it_failed(fcluster):
    """A real rank on a node ends with an exception after its stderr is gone: the run's error
    is the exception the rank recorded in its error file (torch.distributed.elastic's, as the
    workloads write it), read back over SSH; and the file is gone after the launch."""
    from scalelab.cluster import ssh, targets
    from scalelab.core.state import load_cluster

    lc = fcluster(1)
    (node,) = lc.nodes()
    rt = targets.of(load_cluster(lc.name)).runtime(load_cluster(lc.name))
    script = ("import os, sys\n"
              f"sys.path.insert(0, {rt.workdir + '/bench/workloads'!r})\n"
              "import common\n"
              "@common.recorded\n"
              "def main():\n"
              "    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)\n"
              "    raise RuntimeError('disk on fire at step 7')\n"
              "main()\n")
    rank = commands.RankCommand(node, [rt.python, "-c", script], error_file=True)  # its own
    res = launch.run([rank], rt, timeout_s=120)
    assert res.status == "failed"
    assert res.outcomes[0].stderr.count("disk on fire") == 0  # nothing to scrape
    assert res.error == f"{node.name}: exit 1: RuntimeError: disk on fire at step 7"
    left = ssh.run(node, rt.known_hosts, "ls /tmp | grep -c scalelab-error- || true",
                   timeout=30).stdout.strip()
    assert left == "0"


# ------------------------------------------------------------------ the link-rate note

class _FakeLinks:
    """Links whose standing rate lives in a dict, as the local target's record does."""

    def __init__(self, rate, intra=None):
        self.rate = rate
        self.intra = intra  # the rate between a node's ranks
        self.applied: list = []

    def snapshot(self):
        return self.rate

    def apply(self, mbit, delay_us=0.0):
        self.applied.append(mbit)
        self.rate = mbit

    def apply_intra(self, mbit):
        self.intra = mbit

    def restore(self, snapshot):  # as the local target's: the path between ranks unshaped
        self.apply(snapshot)
        self.intra = None

    def still_as_left(self, mbit):
        return self.rate == mbit


def test_the_path_between_ranks_is_set_once_per_value_and_unshaped_at_the_end(tmp_path):
    """A sweep's first call sets the path between a node's ranks whatever a killed driver left
    there, a repeat of the same value changes nothing, and the end of the sweep (also after
    Ctrl-C, which ends in restore) leaves it unshaped with the links as they were."""
    from scalelab.run.shaping import Shaper

    links = _FakeLinks(1000.0, intra=500.0)  # left by a driver killed mid-sweep
    shaper = Shaper(links, marker=tmp_path / "shaped.json")
    shaper.set(100.0)
    shaper.set_intra(None)  # the first sweep's runs state no path: what was left goes
    assert links.intra is None
    links.intra = "changed by hand"
    shaper.set_intra(None)  # the same value again: not applied again
    assert links.intra == "changed by hand"
    shaper.set_intra(2000.0)
    assert links.intra == 2000.0
    shaper.restore()
    assert (links.rate, links.intra) == (1000.0, None)
    assert not (tmp_path / "shaped.json").exists()


def test_shaper_notes_the_rate_to_restore_and_a_later_one_restores_it(tmp_path):
    from scalelab.run.shaping import Shaper

    marker = tmp_path / "shaped.json"
    links = _FakeLinks(None)
    s = Shaper(links, marker=marker)
    s.set(1000.0)
    assert json.loads(marker.read_text()) == {"original": None, "to": 1000.0}
    # the driver is killed here: nothing restores; the links are still at 1000
    later = Shaper(links, marker=marker)
    later.restore()
    assert links.applied == [1000.0, None]
    assert not marker.exists()


def test_a_rate_set_by_hand_since_wins_over_the_note(tmp_path):
    from scalelab.run.shaping import Shaper

    marker = tmp_path / "shaped.json"
    marker.write_text(json.dumps({"original": None, "to": 1000.0}))
    links = _FakeLinks(100.0)
    s = Shaper(links, marker=marker)
    s.restore()
    assert links.applied == [] and not marker.exists()


def test_a_failed_restore_keeps_the_note_for_the_next_sweep(tmp_path):
    from scalelab.core.errors import ClusterError
    from scalelab.run.shaping import Shaper

    class Broken(_FakeLinks):
        def restore(self, snapshot):
            raise ClusterError("node n1 unreachable")

    marker = tmp_path / "shaped.json"
    s = Shaper(Broken(None), marker=marker)
    s.set(100.0)
    s.restore()  # logged, not raised: it runs on the cleanup path
    assert json.loads(marker.read_text()) == {"original": None, "to": 100.0}


# ------------------------------------------------------------------ Ctrl-C at a safe point

def test_sigint_and_sigterm_set_the_stop_flag_and_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stop = threading.Event()
    with lifecycle.interrupts_stop(stop):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # no KeyboardInterrupt, no exit
        assert stop.is_set()
    assert {s: signal.getsignal(s) for s in before} == before


def test_outside_the_main_thread_signals_are_left_alone():
    stop = threading.Event()
    seen = {}

    def body():
        with lifecycle.interrupts_stop(stop):
            seen["handler"] = signal.getsignal(signal.SIGINT)

    t = threading.Thread(target=body)
    t.start()
    t.join(5)
    assert seen["handler"] is signal.getsignal(signal.SIGINT)
