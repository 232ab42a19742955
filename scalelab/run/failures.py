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
step (bench/workloads/ckpt.py resume). Under Horovod the elastic driver brings the node back
(bench/workloads/hvdelastic.py), also in a Slurm allocation; under --launcher slurm a DDP job
step ends when a task dies, and the job's allocation starts the ranks again as a new step
(scalelab.run.slurm); either way the ranks' lines come through one command, each naming its
host. On a cluster reached only through its Slurm login host the kill is a job step of the
run's own job on the chosen node (srun --overlap from the login host, step_kill_line), started
once that node's ranks train.
"""

from __future__ import annotations

import logging
import random
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node
from scalelab.core.errors import ScalelabError
from scalelab.core.validate import SHORT_NODE
from scalelab.run.commands import MAX_RESTARTS
from scalelab.run.reap import JOB_NAME, TOKEN_VAR, token_mark
from scalelab.sweep import values

log = logging.getLogger(__name__)

STEP_LINE = re.compile(r"SCALELAB_STEP (\d+) (\d+) (\d+) (\d+)(?: (\d+\.\d+))?(?: (\S+))?\s*$")
KILLED = re.compile(r"^killed (\d+) at (\d+\.\d+)$", re.MULTILINE)


def chosen_node(asked: str, nodes: list[Node], run_id: str, kill: int = 0) -> int:
    """The index of the node whose ranks are killed the kill-th time: the one asked (@K), or
    one drawn from the run's id and the kill's number (the same run draws the same nodes on
    --resume).

    >>> ns = [Node(f"c-n{i}", f"10.0.0.1{i}", f"10.0.0.1{i}", "worker", "local")
    ...       for i in range(4)]
    >>> chosen_node("12@1", ns, "r"), chosen_node("12", ns, "r") == chosen_node("12", ns, "r")
    (1, True)
    >>> len({chosen_node("30s", ns, "r", k) for k in range(20)}) > 1
    True
    """
    k = (values.failure(asked) or values.Failure(0, None, None)).node
    if k is None:
        return random.Random(run_id if kill == 0 else f"{run_id}#{kill}").randrange(len(nodes))
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


def step_kill_line(job: str, node: str, mark: str, wait_s: float = 60.0) -> str:
    """kill_line as a step of the run's Slurm job on node, for the login host of a cluster
    whose nodes scalelab does not reach over SSH: it waits (at most wait_s) for the job to
    run, then starts the line on the node with srun --overlap, which (from Slurm 22.05)
    shares all the resources of the ranks' own step, so that it neither waits for them nor
    holds up their next step; srun hands its stdin (the pids) to the line. Nothing is killed
    when the job never runs.

    >>> line = step_kill_line("scalelab-ab12cd34-train-n02", "n1", "ab12@lab-login", 2)
    >>> "--name scalelab-ab12cd34-train-n02" in line, "srun --overlap --jobid" in line
    (True, True)
    >>> "--nodelist n1 --nodes 1 --ntasks 1" in line, "while [ $i -lt 10 ]" in line
    (True, True)
    >>> step_kill_line("x; rm -rf /", "n1", "ab12@l")
    Traceback (most recent call last):
    ...
    ValueError: job name 'x; rm -rf /' is not one scalelab makes
    """
    if not JOB_NAME.fullmatch(job):
        raise ValueError(f"job name {job!r} is not one scalelab makes")
    if not SHORT_NODE.fullmatch(node):
        raise ValueError(f"node name {node!r} is not one Slurm names")
    tries = max(1, int(wait_s / 0.2))
    return ("j=; i=0; while [ $i -lt " + str(tries) + " ]; do j=$(squeue --noheader --name "
            + shlex.quote(job) + " --states RUNNING --format %i | head -n 1); "
            "[ -n \"$j\" ] && break; "
            "sleep 0.2; i=$((i+1)); done; [ -n \"$j\" ] || exit 0; "
            f"exec srun --overlap --jobid \"$j\" --nodelist {node} --nodes 1 --ntasks 1 "
            f"--quiet sh -c {shlex.quote(kill_line(mark))}")


@dataclass
class Kill:
    """One kill of a node's ranks: the pids written to the armed kill line, when (the
    controller's clock), the last step each of them finished, what the node says it killed."""

    node: int
    pids: dict[int, int]  # pid -> the last step it finished
    fired_at: float
    since: float | None = None  # when the training it ended began (its gap's start)
    resumed_at: float | None = None  # the first step line of the attempt after it
    killed: list[int] = field(default_factory=list)
    killed_at: float | None = None  # the node's clock, as it printed

    @property
    def step(self) -> int:
        return min(self.pids.values())


@dataclass
class Injector:
    """Watches one launch's output and kills the chosen node's ranks: once after a step, or
    again and again after every_s seconds of training on average (gap_s); Launch.wait calls
    poll() while the run is in flight."""

    asked: str
    nodes: list[Node]
    run_id: str
    after_step: int | None  # the workload's step count (warm-up included) to kill after
    every_s: float | None  # or: a kill after every_s s of training on average, again and again
    warmup: int  # the run's warm-up steps (the record counts timed steps)
    last_step: int  # warm-up + timed steps: the step the run ends after
    ranks_here: int  # a node's ranks (procs per node)
    known_hosts: str
    # horovodrun's and Slurm's runs: one command prints every node's lines, each with the
    # rank's host (horovodrun's: the node's private address; Slurm's: the node's name -> its
    # index), and the ranks carry the token mark of the node that command runs on (marked)
    hosts: dict[str, int] | None = None
    marked: str = ""
    how: str = "torchrun"  # what brings the ranks back (the record's restarted_by)
    # a cluster reached only through its login host: the kill is a step of the run's job
    # (step_kill_line), run from there; the job's name is set once the launch has one
    login: Node | None = None
    job: str = ""
    seen: dict[int, int] = field(default_factory=dict)  # node index -> lines read
    live: dict[int, dict[int, int]] = field(default_factory=dict)  # node -> pid -> last step
    # the (node, attempt, pid) of ranks a kill ended or sent back to a checkpoint: a rank
    # Horovod's elastic driver rolls back keeps its pid and counts one attempt more (a pid is
    # only one rank's on its own node)
    old: set[tuple[int, int, int]] = field(default_factory=set)
    attempt_of: dict[tuple[int, int], int] = field(default_factory=dict)  # its last line's
    kills: list[Kill] = field(default_factory=list)
    every: int = 0  # the run's timed steps between checkpoints (0: none)
    last: dict[tuple[int, int], tuple[int, float, int]] = field(default_factory=dict)  # its last
    # line: step, stamp, attempt
    step_sum: float = 0.0  # the timed steps' durations, from consecutive lines of one rank
    step_count: int = 0
    save_sum: float = 0.0  # the same of steps after a checkpoint save (the save in them)
    save_count: int = 0
    first_at: float | None = None  # the node clock when the first timed step began
    first_seen: float | None = None  # and the controller's when its line was read
    end_at: float | None = None  # and when the last step ended
    error: str = ""
    _proc: subprocess.Popen | None = None  # the armed kill_line on the next kill's node
    _target: int | None = None  # that node's index

    @property
    def limit(self) -> int:
        return 1 if self.after_step is not None else values.MAX_KILLS

    @property
    def restarts(self) -> int:
        """torchrun's --max-restarts for the run: one per kill, and the spare ones."""
        return self.limit + MAX_RESTARTS - 1

    def _read(self, idx: int, lines: list[str], now: float) -> None:
        start = max(self.warmup, 1)
        for line in lines:
            m = STEP_LINE.search(line)
            if not m:
                continue
            attempt, step, pid = int(m[1]), int(m[3]), int(m[4])
            stamp = float(m[5]) if m[5] else now
            if self.hosts is not None:
                idx = self.hosts.get(m[6] or "", -1)
                if idx < 0:
                    continue
            self.attempt_of[(idx, pid)] = attempt
            prev = self.last.get((idx, pid))
            self.last[(idx, pid)] = (step, stamp, attempt)
            # consecutive steps of one attempt (a rank Horovod rolls back keeps its pid)
            if prev and prev[0] == step - 1 and prev[2] == attempt and step > self.warmup + 1:
                if self.every and (prev[0] - self.warmup) % self.every == 0:
                    self.save_sum += stamp - prev[1]  # a save, then a step
                    self.save_count += 1
                else:
                    self.step_sum += stamp - prev[1]
                    self.step_count += 1
            if step == start and not self.kills and (self.first_at is None
                                                     or stamp < self.first_at):
                self.first_at = stamp  # the warm-up's end (or, without one, step 1's)
                if self.first_seen is None:
                    self.first_seen = now
            if step == self.last_step:
                self.end_at = max(self.end_at or stamp, stamp)
            if self.kills and self.kills[-1].node == idx and pid in self.kills[-1].pids:
                # a step finished before it landed
                self.kills[-1].pids[pid] = max(self.kills[-1].pids[pid], step)
            if (idx, attempt, pid) in self.old:
                continue
            if self.kills and self.kills[-1].resumed_at is None:
                self.kills[-1].resumed_at = now
            self.live.setdefault(idx, {})[pid] = step

    def since(self) -> float | None:
        """When the training the next kill ends began, on the controller's clock (as the
        kills are): the first timed step's line read, or the first step line of the attempt
        after the last kill (None: not yet)."""
        return self.kills[-1].resumed_at if self.kills else self.first_seen

    def _due(self, node: int, now: float) -> bool:
        """Whether the next kill is due on node: its ranks (of the attempt running) have all
        printed a step, and the step (or the gap since the training began) is reached."""
        steps = self.live.get(node) or {}
        if len(steps) < self.ranks_here or min(steps.values()) >= self.last_step:
            return False  # not all of them yet, or the run is over
        if self.after_step is not None:
            return min(steps.values()) >= self.after_step
        since = self.since()
        return since is not None and now >= since + self.gap_s(len(self.kills))

    def gap_s(self, kill: int) -> float:
        """Seconds of training until the kill-th kill (0 the first) of a run with a period is
        due, from the first timed step or from when the ranks trained again after the kill
        before: an exponential draw of mean every_s from the run's id (the same on
        --resume). So the kills are a Poisson process in the time the run trains, at the rate
        asked, as the goodput model takes failures to come (scalelab.model.goodput); the
        clock stops while the ranks restart, as a failure needs ranks to strike. (Kills a
        period apart, even with a jitter, cost more than the model says: the restart takes
        about as long each time, and the training left between two kills held one interval
        and a part of the next, which was lost, every time.)

        >>> inj = Injector("8s", [], "r", None, 8.0, 0, 10, 1, "")
        >>> gaps = [inj.gap_s(k) for k in range(2000)]
        >>> 7.5 < sum(gaps) / len(gaps) < 8.5, min(gaps) < 0.1, max(gaps) > 40
        (True, True, True)
        """
        assert self.every_s is not None
        return random.Random(f"{self.run_id}~{kill}").expovariate(1.0 / self.every_s)

    def _fire(self, node: int, now: float) -> list[int]:
        """Note a kill of node's running ranks (the pids to write); every rank seen so far
        belongs to an attempt that ends with it."""
        pids = dict(self.live[node])
        self.kills.append(Kill(node, pids, now, since=self.since()))
        self.old |= {(n, self.attempt_of[(n, p)], p) for n, steps in self.live.items()
                     for p in steps}
        self.live = {}
        return sorted(pids)

    def _may_arm(self) -> bool:
        """Whether the next kill's line may be started: at once over SSH to its node; as a
        job step only once that node's ranks train (a step started earlier could come up
        before the ranks' own step, or after the job ends)."""
        if len(self.kills) >= self.limit:
            return False
        return self.login is None or bool(
            self.job and self.live.get(chosen_node(self.asked, self.nodes, self.run_id,
                                                   len(self.kills))))

    def _arm(self, launch: Any) -> None:
        self._target = chosen_node(self.asked, self.nodes, self.run_id, len(self.kills))
        node = self.nodes[self._target]
        mark = token_mark(launch.token, self.marked or node.name)
        where, line = node, kill_line(mark)
        if self.login is not None:
            where, line = self.login, step_kill_line(self.job, node.name, mark)
        argv = ssh.ssh_args(where, self.known_hosts) + ["--", line]
        ssh.count(where, self.known_hosts)
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True)
        except OSError as exc:  # the run goes on, and is failed for it
            self.error = f"the kill on {node.name} could not be armed from {where.name}: {exc}"

    def poll(self, launch: Any) -> None:
        now = time.time()
        for idx in range(1 if self.hosts is not None else len(self.nodes)):
            lines = launch.lines(idx, self.seen.get(idx, 0))
            self.seen[idx] = self.seen.get(idx, 0) + len(lines)
            self._read(idx, lines, now)
        if self.error:
            return
        if self._proc is not None and self.kills and self.kills[-1].fired_at and \
                self._proc.poll() is not None and self._target is None:
            self._collect()
        if self._proc is None and self._may_arm():
            self._arm(launch)  # before the step it waits for: the kill lands in milliseconds
        if self._proc is None or self._target is None or not self._due(self._target, now):
            return
        node, self._target = self._target, None
        pids = self._fire(node, now)
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(" ".join(map(str, pids)) + "\n")
            self._proc.stdin.flush()  # read at once; the line kills, prints and exits
        except OSError as exc:  # what ended the armed line first, if it said
            said = ""
            if self._proc.poll() is not None and self._proc.stderr is not None:
                said = " ".join(self._proc.stderr.read().split())[-200:]
            self.error = (f"the kill on {self.nodes[node].name} was not armed: {exc}"
                          + (f" ({said})" if said else ""))

    def _collect(self) -> None:
        """Wait for the armed kill line (EOF: an unfired one exits killing nothing); what its
        kill ended, and when."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            out, err = proc.communicate(timeout=15)
        except (subprocess.TimeoutExpired, ValueError):
            proc.kill()
            out, err = proc.communicate()
        if self._target is not None:  # armed, never fired
            self._target = None
            return
        kill = self.kills[-1]
        found = KILLED.findall(out or "")
        kill.killed = [int(p) for p, _ in found]
        kill.killed_at = max((float(t) for _, t in found), default=None)
        if not found and not self.error:
            self.error = (f"none of {self.nodes[kill.node].name}'s ranks "
                          f"({', '.join(map(str, sorted(kill.pids)))}) was still running to be "
                          "killed" + (f" ({err.strip()[-200:]})" if err.strip() else ""))

    def finish(self) -> None:
        """Disarm (or wait for) the last kill line."""
        self._collect()

    def outcome(self, res: Any) -> dict[str, Any]:
        """record() of a finished launch (scalelab.run.launch.LaunchResult)."""
        for idx, out in enumerate(res.outcomes or []):  # what came after the last poll
            self._read(idx, out.stdout.splitlines()[self.seen.get(idx, 0):], time.time())
        return self.record((res.result or {}).get("recovery"))

    def _costs(self, resumed: list[float]) -> dict[str, float | None]:
        """From the step lines of every attempt: step_s, the mean timed step; save_s, the mean
        time a checkpoint blocked training (a step after a save, less a step); restart_s, the
        mean time a kill cost before training went on (from the kill until the next attempt's
        first step was done, less a step). None where there were none."""
        step = self.step_sum / self.step_count if self.step_count else None
        out: dict[str, float | None] = {"step_s": step, "save_s": None, "restart_s": None}
        if step is not None and self.save_count:
            out["save_s"] = self.save_sum / self.save_count - step
        if step is not None and resumed:
            out["restart_s"] = sum(resumed) / len(resumed) - step
        return {k: None if v is None else round(v, 6) for k, v in out.items()}

    def _up_s(self, kills: list[Kill], trained: float | None) -> float | None:
        """The seconds the kills' clock ran (None where it is not known): the training less
        each kill's time until the ranks trained again. A run that took the most kills
        trained on without more: its clock counts to the end all the same, as its measured
        goodput does."""
        if not self.every_s or trained is None or any(k.resumed_at is None for k in kills):
            return None
        return round(trained - sum(k.resumed_at - k.fired_at for k in kills), 3)

    def record(self, recovery: dict[str, Any] | None) -> dict[str, Any]:
        """The run record's "failure": what was asked and each kill (the node, the last step
        its ranks finished before they died, when); the headline fields are the last kill's,
        the one the run's last attempt came back from (seconds from the kill: back_s, the
        first restarted rank's process started; joined_s, every rank had joined the group
        again; ready_s, every rank had loaded the checkpoint and was about to train), and the
        steps done again. trained_s: from the first timed step to the last step's end, all
        kills and restarts in it (the node's clock), over trained_steps steps; and what _costs
        makes of the step lines."""
        warmup = self.warmup
        kills = [k for k in self.kills if k.killed_at is not None]
        last = kills[-1] if kills else None
        after = self.after_step - warmup if self.after_step is not None else None
        shown = last or (self.kills[-1] if self.kills else None)
        trained = None if self.first_at is None or self.end_at is None \
            else round(self.end_at - self.first_at, 3)
        node = shown.node if shown else chosen_node(self.asked, self.nodes, self.run_id)
        rec: dict[str, Any] = {
            "asked": self.asked, "after_step": after, "every_s": self.every_s,
            "restarted_by": self.how,
            "node": self.nodes[node].name,
            "killed_step": None if last is None else last.step - warmup,
            "killed_pids": [] if last is None else last.killed,
            "killed_at": None if last is None else last.killed_at,
            "kills": [{"node": self.nodes[k.node].name, "killed_step": k.step - warmup,
                       "killed_at": k.killed_at, "killed_pids": k.killed,
                       "resumed_s": None if k.resumed_at is None
                       else round(k.resumed_at - k.fired_at, 3),
                       **({"gap_s": round(self.gap_s(i), 3),
                           "fired_s": round(k.fired_at - k.since, 3)}
                          if self.every_s and k.since is not None else {})}
                      for i, k in enumerate(kills)],
            "trained_s": trained,
            "up_s": self._up_s(kills, trained),
            "trained_steps": self.last_step - max(warmup, 1),
            **self._costs([k.resumed_at - k.fired_at for k in kills
                           if k.resumed_at is not None]),
            "error": self.error, "recovery": None}
        if recovery and last is not None and last.killed_at is not None:
            t = last.killed_at
            rec["recovery"] = {
                "restart": recovery["restart"],
                "from_step": recovery["from_step"] - warmup if recovery["from_step"] else None,
                "back_s": round(recovery["first_process_at"] - t, 3),
                "joined_s": round(recovery["all_joined_at"] - t, 3),
                "ready_s": round(recovery["all_ready_at"] - t, 3),
                "load_s": recovery["load_s"],
                "recomputed_steps": last.step - recovery["from_step"]}
        return rec


# what brings a run's ranks back after a failure, by how it was started (the record's
# failure.restarted_by)
RESTARTED_BY = {"torchrun": "torchrun's agents (--max-restarts, c10d rendezvous)",
                "horovodrun": "horovodrun's elastic driver",
                "slurm": "a new job step in the run's Slurm allocation",
                "slurm-horovod": "horovodrun's elastic driver, in the run's Slurm allocation"}


def injector(run: Any, nodes: list[Node], known_hosts: str,
             login: Node | None = None, ssh_nodes: bool = True) -> Injector | None:
    """A planned run's injector on its nodes, or None where it injects nothing; login: the
    Slurm login host a run under --launcher slurm is started from; ssh_nodes: whether the
    nodes are reached over SSH (else the kill is a step of the run's job, from login)."""
    asked = run.params.get("inject_failure") if run.kind == "train" else None
    fail = values.failure(asked)
    if fail is None:
        return None
    chosen_node(asked or "", nodes, run.run_id)  # a node past the run's is refused here
    warmup = run.params.get("warmup") or 0
    hosts, marked, how = None, "", "torchrun"
    horovod = run.params.get("engine") == "horovod"
    if login is not None:  # started on the login host: the ranks carry its token mark
        # srun's tasks: SLURMD_NODENAME names the node; horovodrun's ranks: the host it was
        # given, the node's private address (scalelab.run.slurm.rank_commands)
        hosts = {(n.private_address if horovod else n.name): i for i, n in enumerate(nodes)}
        marked, how = login.name, "slurm-horovod" if horovod else "slurm"
    elif horovod:
        hosts, marked = {n.private_address: i for i, n in enumerate(nodes)}, nodes[0].name
        how = "horovodrun"
    return Injector(asked or "", nodes, run.run_id,
                    None if fail.step is None else warmup + fail.step, fail.every_s, warmup,
                    warmup + run.params["steps"], run.params["procs_per_node"], known_hosts,
                    hosts, marked, RESTARTED_BY[how],
                    login=None if ssh_nodes else login,
                    every=int(run.params.get("checkpoint_every") or 0))


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
        if failure["killed_at"] is None and failure.get("every_s"):
            return (f"a failure was to be injected after {failure['every_s']:g} s of training "
                    "on average, "
                    "but " + (failure["error"] or "the run ended before the first was due; "
                              "raise --steps or shorten the period"))
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
