"""Failures on purpose (bench --inject-failure): one node's ranks killed while a run is under
way, and what their coming back cost.

The workload prints a line per step (SCALELAB_STEP <restart> <rank> <step> <pid>, its
--report-steps); the controller reads the chosen node's lines as they arrive, and once that
node's ranks have all finished the chosen timed step, it kills them over SSH with SIGKILL, by
the pids they printed, each only if its environment carries this launch's token. The workload
acts on nothing: it is killed as a crashed process or a lost GPU would end it. torchrun's
agent on that node sees its ranks fail and restarts them; the c10d rendezvous makes every
other node's agent restart its ranks too (scalelab.run.commands.elastic_commands), and the
restarted ranks load the last checkpoint every rank can read and train on to the run's last
step (bench/workloads/ckpt.py resume).
"""

from __future__ import annotations

import logging
import random
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from typing import Any

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node
from scalelab.core.errors import ScalelabError
from scalelab.run.reap import TOKEN_VAR, token_mark
from scalelab.sweep import values

log = logging.getLogger(__name__)

STEP_LINE = re.compile(r"SCALELAB_STEP (\d+) (\d+) (\d+) (\d+)\s*$")
KILLED = re.compile(r"^killed (\d+) at (\d+\.\d+)$", re.MULTILINE)


def chosen_node(asked: str, nodes: list[Node], run_id: str) -> int:
    """The index of the node whose ranks are killed: the one asked (STEP@K), or one drawn from
    the run's id (the same run draws the same node on --resume).

    >>> ns = [Node(f"c-n{i}", f"10.0.0.1{i}", f"10.0.0.1{i}", "worker", "local")
    ...       for i in range(4)]
    >>> chosen_node("12@1", ns, "r"), chosen_node("12", ns, "r") == chosen_node("12", ns, "r")
    (1, True)
    """
    step, k = values.failure(asked) or (0, None)
    if k is None:
        return random.Random(run_id).randrange(len(nodes))
    if k >= len(nodes):
        raise ScalelabError(f"--inject-failure {asked}: the run has {len(nodes)} node(s)")
    return k


def kill_line(mark: str) -> str:
    """The shell line that waits on its stdin for the pids to kill (one line of them), then
    kills each, only if its environment carries the launch's token mark, and prints when. It
    is started before the step it waits for (scalelab's side then only writes a line: the kill
    lands within milliseconds, not after an SSH connection), and leaves killing nothing when
    its stdin closes first; anything but digits in the line is skipped.

    >>> print(kill_line("ab12@c-n1"))  # doctest: +NORMALIZE_WHITESPACE
    read -r pids || exit 0; for p in $pids; do case $p in *[!0-9]*) continue;; esac;
     grep -qzxF SCALELAB_LAUNCH=ab12@c-n1 /proc/$p/environ 2>/dev/null && kill -KILL $p &&
     echo killed $p at $(date +%s.%N); done; true
    """
    return ("read -r pids || exit 0; for p in $pids; do case $p in *[!0-9]*) continue;; esac; "
            f"grep -qzxF {shlex.quote(f'{TOKEN_VAR}={mark}')} /proc/$p/environ 2>/dev/null && "
            "kill -KILL $p && echo killed $p at $(date +%s.%N); done; true")


@dataclass
class Injector:
    """Watches one launch's output for the chosen node's step and kills its ranks once
    (see the module doc); Launch.wait calls poll() while the run is in flight."""

    asked: str
    node: Node
    index: int  # the node's command in the launch
    after_step: int  # the workload's step count (warm-up included) to kill after
    warmup: int  # the run's warm-up steps (the record counts timed steps)
    ranks_here: int  # the node's ranks (procs per node)
    known_hosts: str
    seen: int = 0
    pids: dict[int, int] = field(default_factory=dict)  # rank -> pid, of the first attempt
    steps: dict[int, int] = field(default_factory=dict)  # rank -> its last step
    killed: list[int] = field(default_factory=list)
    killed_at: float | None = None
    killed_step: int | None = None
    error: str = ""
    _proc: subprocess.Popen | None = None  # the armed kill_line on the node
    _fired: bool = False

    def _read(self, lines: list[str]) -> None:
        for line in lines:
            m = STEP_LINE.search(line)
            if m and int(m[1]) == 0:
                rank, step, pid = int(m[2]), int(m[3]), int(m[4])
                self.pids[rank], self.steps[rank] = pid, step

    def poll(self, launch: Any) -> None:
        if self._proc is None and not self.error:  # armed at the first poll, before any step
            argv = ssh.ssh_args(self.node, self.known_hosts) + [
                "--", kill_line(token_mark(launch.token, self.node.name))]
            ssh.count(self.node, self.known_hosts)
            try:
                self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True)
            except OSError as exc:  # the run goes on, and is failed for it
                self.error = f"the kill on {self.node.name} could not be armed: {exc}"
        if self._proc is None:
            return
        lines = launch.lines(self.index, self.seen)
        self.seen += len(lines)
        self._read(lines)
        if not self._fired and len(self.steps) >= self.ranks_here \
                and min(self.steps.values()) >= self.after_step:
            self._fired = True
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write(" ".join(str(p) for p in sorted(self.pids.values()))
                                       + "\n")
                self._proc.stdin.flush()  # the line is read at once; finish() closes stdin
            except OSError as exc:
                self.error = f"the kill on {self.node.name} was not armed: {exc}"

    def finish(self) -> None:
        """Disarm (or wait for) the kill; what it killed, and when."""
        if self._proc is None:
            return
        try:
            out, err = self._proc.communicate(timeout=15)  # EOF: an unfired kill leaves
        except (subprocess.TimeoutExpired, ValueError):
            self._proc.kill()
            out, err = self._proc.communicate()
        found = KILLED.findall(out or "")
        self.killed = [int(p) for p, _ in found]
        self.killed_at = max((float(t) for _, t in found), default=None)
        if self._fired and not found and not self.error:
            self.error = (f"none of {self.node.name}'s ranks "
                          f"({', '.join(map(str, sorted(self.pids.values())))}) was still "
                          "running to be killed" + (f" ({err.strip()[-200:]})" if err.strip()
                                                    else ""))

    def outcome(self, res: Any) -> dict[str, Any]:
        """record() of a finished launch (scalelab.run.launch.LaunchResult)."""
        return self.record((res.result or {}).get("recovery"),
                           res.outcomes[self.index].stdout if res.outcomes else "")

    def record(self, recovery: dict[str, Any] | None, printed: str = "") -> dict[str, Any]:
        """The run record's "failure": what was killed, after which step (the last the node's
        ranks finished before they died: printed, the node's whole output, says), when, and
        how the run came back (seconds from the kill: back_s, the first restarted rank's
        process started; joined_s, every rank had joined the group again; ready_s, every rank
        had loaded the checkpoint and was about to train), and the steps done again."""
        warmup = self.warmup
        self._read(printed.splitlines()[self.seen:])
        if self.killed_at is not None and self.steps:
            self.killed_step = min(self.steps.values())
        rec: dict[str, Any] = {"asked": self.asked, "node": self.node.name,
                               "after_step": self.after_step - warmup,
                               "killed_step": None if self.killed_step is None
                               else self.killed_step - warmup,
                               "killed_pids": self.killed, "killed_at": self.killed_at,
                               "error": self.error, "recovery": None}
        if recovery and self.killed_at is not None and self.killed_step is not None:
            t = self.killed_at
            rec["recovery"] = {
                "restart": recovery["restart"],
                "from_step": recovery["from_step"] - warmup if recovery["from_step"] else None,
                "back_s": round(recovery["first_process_at"] - t, 3),
                "joined_s": round(recovery["all_joined_at"] - t, 3),
                "ready_s": round(recovery["all_ready_at"] - t, 3),
                "load_s": recovery["load_s"],
                "recomputed_steps": self.killed_step - recovery["from_step"]}
        return rec


def injector(run: Any, nodes: list[Node], known_hosts: str) -> Injector | None:
    """A planned run's injector on its nodes, or None where it injects nothing."""
    asked = run.params.get("inject_failure") if run.kind == "train" else None
    failure = values.failure(asked)
    if failure is None:
        return None
    k = chosen_node(asked or "", nodes, run.run_id)
    warmup = run.params.get("warmup") or 0
    return Injector(asked or "", nodes[k], k, warmup + failure[0], warmup,
                    run.params["procs_per_node"], known_hosts)


def expected_saves(steps: int, every: int, warmup: int, recovery: dict[str, Any] | None) -> int:
    """The checkpoints the run's last attempt saves: every `every` timed steps from the one it
    went on from.

    >>> expected_saves(20, 5, 2, None), expected_saves(20, 5, 2, {"from_step": 12})
    (4, 2)
    >>> expected_saves(20, 5, 2, {"from_step": 0})
    4
    """
    done = max(0, ((recovery or {}).get("from_step") or 0) - warmup)
    return steps // every - done // every


def unmet(params: dict[str, Any], checkpoint: dict[str, Any] | None,
          recovery: dict[str, Any] | None, failure: dict[str, Any] | None) -> str:
    """What a train run was asked to do of checkpoints and failures and did not ("" if it
    did all): a failure that was never injected or never restarted from, or another count of
    checkpoints than its (last attempt's) steps call for."""
    if failure is not None and failure["recovery"] is None:
        if failure["killed_at"] is None:
            return (f"a failure was to be injected after step {failure['after_step']} on "
                    f"{failure['node']}, but " + (failure["error"] or "the run never reached it"))
        return (f"{failure['node']}'s ranks were killed after step {failure['killed_step']}, "
                "but the run finished without restarting them")
    every = params.get("checkpoint_every") or 0
    saves = len((checkpoint or {}).get("saved") or [])
    if every and saves != expected_saves(params["steps"], every, params.get("warmup") or 0,
                                         recovery):
        return (f"the run was to checkpoint every {every} steps of {params['steps']} but saved "
                f"{saves} time(s)")
    return ""
