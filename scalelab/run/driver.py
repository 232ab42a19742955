"""Execute a sweep plan on a cluster: shape links, launch runs, commit each result at once.

Plan -> runs -> store. Every finished run is appended (and fsync'ed) to the sweep's
runs.jsonl before the next one starts, so a crash loses at most the run in flight; `resume`
runs only what the store lacks.

Ctrl-C (SIGINT) and SIGTERM during start() or resume() do not cut the driver short: they
stop the sweep at the next safe point. The run in flight is ended on every node and recorded
as interrupted, link rates are restored, and then KeyboardInterrupt is raised. A driver killed
outright (SIGKILL) leaves two notes in the sweep directory that --resume acts on: the
process groups in flight (.inflight.json in the sweep directory), and the rate to restore
(shaped.json in the cluster's state directory, so that any later sweep restores it).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import platform
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.cluster import facts, netshape, ssh
from scalelab.cluster.nodes import Node, nodes_of
from scalelab.cluster.targets import base as targets
from scalelab.core.errors import ClusterError, InputError, ScalelabError
from scalelab.core.state import PROJECT_ROOT, cluster_dir, load_cluster
from scalelab.core.units import format_rate
from scalelab.model import fabric
from scalelab.results import store
from scalelab.run import commands, launch, reap
from scalelab.run.emulation import Emulation
from scalelab.run.shaping import Shaper
from scalelab.run.warmstart import WARM, WarmPool
from scalelab.sweep import planner

log = logging.getLogger(__name__)

BASE_PORT = 29400
# the link probe at every rate: several streams for a few seconds, as NCCL's socket transport
# opens several (one TCP stream often falls short of 10-100 Gbit/s), then one stream beside it
LINK_PROBE_S = 3.0
LINK_PROBE_STREAMS = 4
SINGLE_STREAM_S = 1.0
INFLIGHT = ".inflight.json"
SHAPED = "shaped.json"  # in the cluster's state directory


def utcnow() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def scalelab_commit() -> str:
    root = PROJECT_ROOT
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


@dataclass
class Progress:
    index: int  # 0-based position among the runs to do now
    total: int
    run_id: str
    description: str
    record: dict[str, Any] | None  # None when the run starts


def measure_link(nodes: list[Node], rt: launch.Runtime, port: int, seconds: float = 1.0,
                 stop: threading.Event | None = None,
                 streams: int = 1) -> tuple[float | None, str]:
    """TCP rate head -> second node in Mbit/s (iperf3), and why not when it failed."""
    from scalelab.run import linkprobe

    if len(nodes) < 2:
        return None, ""
    m = linkprobe.measure(nodes[1], nodes[0], rt.known_hosts, port, seconds, stop=stop,
                          streams=streams)
    if m.mbit is None:
        log.warning("link measurement failed: %s", m.error)
    return m.mbit, m.error


# the marks rank 0 reports (bench/workloads/resnet.py TIMELINE), in order, between the
# launcher's start and the end of its wait; each store.TIMELINE_KEYS phase but reap lies between
# two consecutive ones
MARKS = ("process", "imported", "rendezvous", "ready", "timed_start", "timed_end")


def timeline(res: launch.LaunchResult) -> dict[str, float]:
    """Where a run's wall time went, from the launcher's clock and rank 0's marks.

    launch: ssh and the launcher (torchrun, horovodrun, or none: env.launcher "direct" or "warm") until
    rank 0's interpreter runs;
    import: importing torch and the workload; rendezvous: joining the process group; setup:
    data, model, optimiser, engine; warmup and timed: the steps; finish: gathering the
    figures, leaving the group, exiting; reap: ending what is left and closing ssh. {} when
    the workload gave no marks (allreduce probes, failed runs).

    >>> r = launch.LaunchResult("ok", {"timeline": {"process": 101.0, "imported": 103.0,
    ...     "rendezvous": 103.5, "ready": 104.0, "timed_start": 105.0, "timed_end": 109.0}},
    ...     "", [], 10.0, [], 100.0, 9.5)
    >>> timeline(r)
    {'launch_s': 1.0, 'import_s': 2.0, 'rendezvous_s': 0.5, 'setup_s': 0.5, 'warmup_s': 1.0, 'timed_s': 4.0, 'finish_s': 0.5, 'reap_s': 0.5}
    """
    marks = (res.result or {}).get("timeline")
    if not isinstance(marks, dict) or not res.started_unix or not res.waited_s:
        return {}
    points = [res.started_unix, *(marks.get(m) for m in MARKS), res.started_unix + res.waited_s]
    if not all(isinstance(t, int | float) and not isinstance(t, bool) for t in points):
        return {}
    spans = [b - a for a, b in zip(points, points[1:], strict=False)]
    spans.append(res.duration_s - res.waited_s)  # reap
    return {k: round(max(0.0, float(v)), 3) for k, v in zip(store.TIMELINE_KEYS, spans,
                                                             strict=True)}


def placement(result: dict[str, Any], res: launch.LaunchResult) -> dict[str, Any]:
    """What a run's ranks really ran on, from their own result and NCCL's log on stderr.

    >>> r = {"backend": "nccl", "device": "cuda", "ranks": [
    ...     {"device": "cuda:0", "device_name": "NVIDIA H100", "gpu_mem_peak_mb": 9000.5},
    ...     {"device": "cuda:1", "device_name": "NVIDIA H100", "gpu_mem_peak_mb": 9100.0}]}
    >>> out = launch.RankOutcome("n0", 0, "", "n0:1:1 [0] NCCL INFO Using network Socket")
    >>> placement(r, launch.LaunchResult("ok", r, "", [out], 1.0))
    {'device': 'cuda', 'backend': 'nccl', 'transport': 'nccl-socket', 'device_names': ['NVIDIA H100'], 'gpu_mem_peak_mb': 9100.0}
    >>> r.update(precision="tf32", channels_last=True, tf32=True)
    >>> {k: v for k, v in placement(r, launch.LaunchResult("ok", r, "", [out], 1.0)).items()
    ...  if k in ("precision", "memory_format", "tf32")}
    {'precision': 'tf32', 'memory_format': 'channels_last', 'tf32': True}
    """
    from scalelab.cluster import gpu

    ranks = [r for r in result.get("ranks") or [] if isinstance(r, dict)]
    backend = str(result.get("backend") or "")
    device = result.get("device")
    if not device and ranks and ranks[0].get("device"):
        device = str(ranks[0]["device"]).split(":")[0]
    peaks = [r["gpu_mem_peak_mb"] for r in ranks if isinstance(r.get("gpu_mem_peak_mb"),
                                                                int | float)]
    out = {"device": device, "backend": backend,
           "transport": gpu.transport("\n".join(o.stderr for o in res.outcomes), backend),
           "device_names": sorted({str(r["device_name"]) for r in ranks
                                   if r.get("device_name")}),
           "gpu_mem_peak_mb": max(peaks) if peaks else None}
    if "precision" in result:  # a training run: the numerics and layout its ranks used
        out["precision"] = result["precision"]
        out["memory_format"] = result.get("memory_format") or (
            "channels_last" if result.get("channels_last") else "contiguous")
        out["tf32"] = result.get("tf32")  # whether TF32 was on for matmuls (None on CPUs)
    return out


def run_record(sweep_id: str, run, target: str, res: launch.LaunchResult, started_at: str,
               link_mbit: float | None, rate: float | None,
               link_error: str = "", launcher: str = "",
               job: dict[str, Any] | None = None,
               single_mbit: float | None = None,
               image: dict[str, Any] | None = None,
               connections: dict[str, int] | None = None) -> dict[str, Any]:
    """The raw record of one run, as committed to the store (schema in CONTRACTS.md).

    rate is what tc was set to; with an emulated accelerator at dilation k that is the
    requested rate / k and link_mbit (measured on the dilated link) is given here times k, the
    rate the emulated network delivered in the emulated device's time."""
    result = res.result or {}
    env = dict(result.get("env") or {})
    env.update({"scalelab": scalelab_commit(), "controller_python": platform.python_version(),
                "target": target, "nodes": list(run.node_names), "tc": netshape.describe(rate)})
    if launcher:
        env["launcher"] = launcher
    if image:  # the ranks ran in containers of this image
        env["image"] = {"id": image.get("id"), "tag": image.get("tag")}
    measured: dict[str, Any] = {"ranks": result.get("ranks", []), "env": env,
                                "gradient_bytes": result.get("gradient_bytes"),
                                "link_mbit_measured": link_mbit,
                                "link_error": link_error, "timeline": timeline(res),
                                "link_mbit_single_stream": single_mbit}
    if result.get("accelerator"):
        measured["accelerator"] = result["accelerator"]
    if result:
        measured["placement"] = placement(result, res)
    if isinstance(result.get("comm"), dict):  # the communication settings the ranks used
        measured["comm"] = result["comm"]
    if job is not None:
        measured["slurm"] = job
    if connections is not None:
        measured["ssh"] = connections
    if run.kind == "allreduce":
        measured["allreduce"] = result.get("sizes", [])
    status = res.status
    error = res.error
    if status == "ok" and run.kind == "train" and not measured["ranks"]:
        status, error = "failed", "the workload printed no per-rank figures"
    asked = run.params.get("device")
    placed = measured.get("placement") or {}
    ran = placed.get("device")
    if status == "ok" and asked and ran and not run.params.get("accelerator") and ran != asked:
        status, error = "failed", f"the run asked for {asked} but its ranks ran on {ran}"
    fmt = "channels_last" if run.params.get("channels_last") else "contiguous"
    if status == "ok" and run.kind == "train" and placed.get("memory_format") not in (None, fmt):
        status, error = "failed", (f"the run asked for {fmt} but its ranks ran "
                                   f"{placed['memory_format']}")
    if status == "ok" and run.kind == "train" and placed.get("precision") not in (
            None, run.params.get("precision")):
        status, error = "failed", (f"the run asked for {run.params.get('precision')} but its "
                                   f"ranks ran {placed['precision']}")
    return store.new_record(sweep_id, run, target=target, status=status, started_at=started_at,
                            duration_s=round(res.duration_s, 3), error=error, **measured)


class Launcher:
    """How a sweep starts its runs: over SSH on the nodes, or as Slurm jobs on a login host."""

    def __init__(self, kind: str, login: Node, rt: launch.Runtime, emulated: bool,
                 partition: str | None = None, container: Any = None) -> None:
        self.kind, self.rt, self.emulated, self.partition = kind, rt, emulated, partition
        self.login = login  # where srun and sacct run for Slurm jobs (the target says)
        self.warm: str | None = None  # the warm-start servers' name, while they serve
        # a scalelab.run.containers.Spec: every rank runs in a container of the training image
        self.container = container

    def measure_link(self, nodes: list[Node], port: int, stop: threading.Event | None,
                     seconds: float = 1.0, streams: int = 1) -> tuple[float | None, str]:
        if self.kind == "slurm":
            from scalelab.run import slurm

            return slurm.measure_link(nodes, self.login, self.rt.known_hosts, port,
                                      secrets.token_hex(8), self.partition, seconds, stop=stop,
                                      streams=streams)
        return measure_link(nodes, self.rt, port, seconds, stop=stop, streams=streams)

    def probe_link(self, nodes: list[Node], k: int,
                   stop: threading.Event | None) -> tuple[float | None, str, float | None]:
        """The rate at the link's current setting: (parallel streams, why not, one stream)."""
        mbit, why = self.measure_link(nodes, BASE_PORT + 500 + k % 400, stop, LINK_PROBE_S,
                                      LINK_PROBE_STREAMS)
        single = None
        if mbit is not None:
            single = self.measure_link(nodes, BASE_PORT + 1000 + k % 400, stop,
                                       SINGLE_STREAM_S)[0]
        return mbit, why, single

    def run(self, run, engine: str, nodes: list[Node], script: str, args: list[str], port: int,
            timeout_s: float, stop: threading.Event | None,
            inflight: Path) -> tuple[str, launch.LaunchResult, dict[str, Any] | None]:
        """Start, wait, reap one run; (launcher name, result, the Slurm job's record)."""
        ppn = run.params["procs_per_node"]
        fabric, device = run.params.get("fabric") or "tcp", run.params.get("device") or "cpu"
        if self.kind != "slurm" and self.container is not None:
            from scalelab.cluster import image

            spec = dataclasses.replace(self.container, gpus=device == "cuda",
                                       rdma=fabric == "rdma")
            inside = launch.Runtime(image.PYTHON, image.PREFIX, self.rt.known_hosts)
            name, cmds = commands.rank_commands(engine, nodes, ppn, script, args, inside, port,
                                              shared_host=self.emulated, fabric=fabric,
                                              device=device, in_container=True)
            cmds = [dataclasses.replace(c, container=spec) for c in cmds]
            return name, launch.run(cmds, self.rt, timeout_s=timeout_s, stop=stop,
                                    inflight=inflight), None
        if self.kind != "slurm":
            name, cmds = commands.rank_commands(engine, nodes, ppn, script, args, self.rt, port,
                                              shared_host=self.emulated, warm=self.warm,
                                              fabric=fabric, device=device)
            return name, launch.run(cmds, self.rt, timeout_s=timeout_s, stop=stop,
                                    inflight=inflight), None
        from scalelab.run import slurm

        job = slurm.job_name(secrets.token_hex(8), run.run_id)
        gpus = ppn if all(n.gpus for n in nodes) else 0
        cmds = slurm.rank_commands(engine, nodes, self.login, ppn, script, args, self.rt, port,
                                   job, self.partition, timeout_s, gpus_per_node=gpus)
        try:
            res = launch.run(cmds, self.rt, timeout_s=timeout_s, stop=stop, inflight=inflight)
        except KeyboardInterrupt:
            res = launch.LaunchResult("interrupted", None, "interrupted by the user", [], 0.0)
        t0 = time.monotonic()
        state = slurm.job_state(self.login, self.rt.known_hosts, job)
        record = {**state.to_record(), "sacct_wait_s": round(time.monotonic() - t0, 3)}
        # an interrupted run comes back as such: execute records it, then stops the sweep
        res.status, res.error = slurm.outcome(state, res.status, res.error, timeout_s)
        return "slurm", res, record


def _warm(caps: targets.Capabilities, spec) -> bool:
    """Whether runs that start without a launcher are forked from warm-start servers (on the
    host: a container starts its own interpreter)."""
    return caps.shares_host_cpus and spec.launcher != "slurm" \
        and getattr(spec, "runtime", "host") == "host" and getattr(spec, "warm_start", True)


def execute(cluster: str, sweep_dir: Path, runs: list, timeout_s: float,
            on_progress: Callable[[Progress], None] | None = None,
            stop: threading.Event | None = None, netprobe: bool = True,
            launcher: str = "ssh", partition: str | None = None,
            runtime: str = "host", warm_start: bool = True) -> dict[str, int]:
    """Run the given plan entries in order, committing each record as soon as it finishes.

    stop (an Event, set by the signal handler of start/resume): no new run starts, the run
    in flight is ended and recorded as interrupted, link rates are restored, then
    KeyboardInterrupt is raised. launcher: ssh, or slurm (every run a job on the head node's
    Slurm, in partition, or the default one). runtime: host, or container (every rank in a
    container of the cluster's training image, recorded by configure --image). warm_start:
    fork directly started ranks from warm-start servers where the nodes share one host.
    """
    rec = load_cluster(cluster)
    all_nodes = nodes_of(rec)
    target = targets.of(rec)
    caps = targets.capabilities(rec)
    rt = target.runtime(rec)
    shaper = Shaper(target.links(cluster, rec, all_nodes), marker=cluster_dir(cluster) / SHAPED)
    sweep_id = sweep_dir.name
    counts = {"ok": 0, "failed": 0, "timeout": 0, "interrupted": 0}
    links: dict[Any, tuple[float | None, str, float | None]] = {}
    container = None
    if runtime == "container":
        from scalelab.run import containers

        container = containers.Spec(rec["image"]["tag"], rec["image"]["id"])
    starter = Launcher(launcher, target.login(rec), rt, caps.shares_host_cpus,
                       partition or target.default_partition(rec), container)

    def calibrate() -> float | None:
        shaper.set(None)
        return starter.measure_link(all_nodes, BASE_PORT + 450, stop)[0]

    emu = Emulation(runs, all_nodes, rt.known_hosts, rt.workdir, caps.shares_host_cpus, calibrate)
    emu.keep(store.read_runs(sweep_dir).values())  # a resumed sweep keeps its k

    def stopped() -> bool:
        return stop is not None and stop.is_set()

    # ranks started directly on shared cores are forked from a warm-start server per node
    direct = [r for r in runs if launcher != "slurm" and container is None and warm_start
              and planner.run_starts_directly(r, caps.shares_host_cpus)]
    warm = (WarmPool(all_nodes[: max(r.params["nodes"] for r in direct)], rt, sweep_dir / WARM)
            if direct else None)
    try:
        if warm is not None and warm.start(stop=stop):
            starter.warm = warm.name
        for k, run in enumerate(runs):
            if stopped():
                raise KeyboardInterrupt
            desc = describe(run)
            if on_progress:
                on_progress(Progress(k, len(runs), run.run_id, desc, None))
            before = ssh.connections()
            dilation = emu.dilation(run)
            run = emu.with_dilation(run, dilation)
            p = run.params
            requested = p.get("bandwidth_mbit")
            # what tc is set to: the line rate, or the share of it a fabric profile's
            # collectives achieve, in the emulated device's time
            line = fabric.tc_line_mbit(requested, p.get("fabric_profile"), p["procs_per_node"])
            rate = line / dilation if line else line
            nodes = all_nodes[: p["nodes"]]
            shaper.set(rate)
            if rate not in links:
                links[rate] = (starter.probe_link(all_nodes, k, stop) if netprobe
                               else (None, "", None))
            profile = emu.stage(run)
            if stopped():
                raise KeyboardInterrupt
            # a fresh port per run: the last one may still be in TIME_WAIT
            port = BASE_PORT + (os.getpid() * 7 + k) % 400
            if run.kind == "allreduce":
                script, args, engine = ("allreduce.py",
                                        commands.allreduce_args(p, run.allreduce_sizes), "ddp")
            else:
                script, args, engine = ("resnet.py", commands.workload_args(p, profile),
                                        p["engine"])
            started = utcnow()
            interrupted = False
            job = None
            launcher_name = starter.kind
            try:
                launcher_name, res, job = starter.run(run, engine, nodes, script, args, port,
                                                      timeout_s, stop, sweep_dir / INFLIGHT)
            except KeyboardInterrupt:
                interrupted = True
                res = launch.LaunchResult("interrupted", None, "interrupted by the user", [], 0.0)
            parallel, why, single = links[rate]
            # in the emulated device's time
            measured_mbit = None if parallel is None else parallel * dilation
            single = None if single is None else single * dilation
            record = run_record(sweep_id, run, rec["target"], res, started, measured_mbit, rate,
                                why, launcher_name, job, single_mbit=single,
                                image={"id": container.image_id, "tag": container.image}
                                if container is not None else None,
                                connections={k: v - before[k]
                                             for k, v in ssh.connections().items()})
            store.append_run(sweep_dir, record)
            counts[res.status] = counts.get(res.status, 0) + 1
            if on_progress:
                on_progress(Progress(k, len(runs), run.run_id, desc, record))
            if interrupted or res.status == "interrupted":
                raise KeyboardInterrupt
    finally:
        if warm is not None:
            warm.stop()
        shaper.restore()
    return counts


@contextmanager
def interrupts_stop(stop: threading.Event) -> Iterator[threading.Event]:
    """While the block runs, SIGINT and SIGTERM set stop instead of raising at once.

    Cleanup (ending process groups over SSH, restoring link rates, committing the record)
    then runs whole: a KeyboardInterrupt in the middle of it would leave ranks running and
    links shaped. Only the main thread can own signal handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    seen = {"n": 0}

    def handler(signum: int, frame: Any) -> None:
        seen["n"] += 1
        stop.set()

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
    if seen["n"] and stop.is_set():
        log.info("stopped by a signal (%d received)", seen["n"])


def describe(run) -> str:
    try:
        from scalelab.sweep.planner import describe as sweep_describe

        return sweep_describe(run)
    except (ImportError, AttributeError):
        return run.run_id


def preflight(cluster: str, nodes_needed: int) -> None:
    """Before any run: every node the sweep uses must answer SSH; name the first that doesn't."""
    rec = load_cluster(cluster)
    nodes = nodes_of(rec)[:nodes_needed]
    _, errors = ssh.on_each(nodes, lambda n: ssh.run(n, rec["known_hosts"], "true", timeout=15))
    bad = ssh.first_error(nodes, errors)
    if bad:
        raise ClusterError(f"node {bad[0]} does not answer SSH ({bad[1]}); check it with "
                           f"invoke status --cluster {cluster}, or reprovision")


def host_cpus() -> int:
    return os.cpu_count() or 1


# ---------------------------------------------------------------- sweeps: start and resume

@dataclass
class Prepared:
    """A validated sweep, ready to run or to print for --dry-run. Nothing written yet."""

    cluster: str
    spec: Any
    runs: list
    estimate_s: float


def _device(runs: list) -> str:
    """Which default step times estimate the runs: gpu where they train on GPUs (the device
    the plan resolved from the nodes' facts, not nvidia-smi's count)."""
    return "gpu" if any(r.params.get("device") == "cuda" for r in runs) else "cpu"


def reference_fill(cluster: str, given: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """What a command line that names nodes but no batch takes from the reference experiment
    (bench/sweeps/slices.yml): every axis it does not give, as the cluster can run it: links
    at their own rate where the target cannot shape them, fp32 where no GPU computes (amp needs
    one). Returns the options to add (over the reference file) and the one line that says so.
    """
    from scalelab.sweep import spec as sweepfile

    rec = load_cluster(cluster)
    caps = targets.capabilities(rec)
    ref = sweepfile.spec_from_options(sweep_file=sweepfile.REFERENCE)
    fill: dict[str, Any] = {}
    notes = []
    if not given.get("bandwidth") and not caps.shape_links:
        fill["bandwidth"] = "native"
        notes.append("links at their own rate (this cluster cannot shape them)")
    on_gpus = given.get("device") != "cpu" and (
        given.get("accelerator") or any(n.gpus > 0 for n in nodes_of(rec)))
    if not given.get("precision") and not on_gpus and set(ref.precisions) & {"amp", "bf16"}:
        fill["precision"] = "fp32"
        notes.append("fp32 (its amp needs GPUs; these nodes have none)")
    taken = [f"{k.replace('_', '-')} {v}" for k, v in (
        ("batch_size", ",".join(map(str, ref.batch_sizes))), ("model", ref.model),
        ("engine", ref.engine), ("precision", ",".join(ref.precisions)),
        ("bandwidth", ",".join(format_rate(b) for b in ref.bandwidths)),
        ("repeats", ref.repeats), ("steps", ref.steps)) if not given.get(k) and k not in fill]
    line = (f"axes not given come from the reference experiment (bench/sweeps/"
            f"{sweepfile.REFERENCE}.yml): {', '.join(taken)}"
            + (f"; {'; '.join(notes)}" if notes else "") + "; give any of them to override")
    return fill, line


def prepare(cluster: str, spec) -> Prepared:
    """Validate the sweep against the cluster and expand it; writes nothing."""
    from scalelab.sweep import estimate
    from scalelab.sweep import planner as sweep

    rec = load_cluster(cluster)
    facts.require_configured(rec)
    nodes = nodes_of(rec)
    target = targets.of(rec)
    caps = targets.capabilities(rec)
    allowed = target.launchers(rec)
    if spec.launcher is None:
        spec.launcher = allowed[0]
    elif spec.launcher not in allowed:
        raise InputError(f"cluster {cluster} can only start runs with --launcher "
                         f"{' or '.join(allowed)}; it has no SSH to its compute nodes")
    if spec.partition and spec.launcher != "slurm":
        raise InputError("partition: only Slurm has partitions; add --launcher slurm (or "
                         "launcher: slurm in the sweep file)")
    runs = sweep.plan(spec, nodes, caps.shape_links, cluster=cluster)
    shaped = sorted({r.params["bandwidth_mbit"] for r in runs} - {None})
    profile = getattr(spec, "fabric_profile", "ideal")
    if profile != "ideal" and not caps.shares_host_cpus:
        raise InputError(f"--fabric-profile {profile}: a fabric profile stands for a network "
                         f"on emulated links; cluster {cluster}'s nodes are real hosts whose "
                         "NICs already are the fabric, so use --fabric-profile ideal")
    no_sudo = [n for n in nodes[:max((r.params["nodes"] for r in runs), default=0)]
               if (n.facts or {}).get("sudo") == "no"]
    if shaped and no_sudo:
        n = no_sudo[0]
        raise InputError(f"--bandwidth {format_rate(shaped[0])}: node {n.name}'s user "
                         f"{(n.facts or {}).get('user') or n.ssh_user} may not sudo without a "
                         "password, which tc needs to set the rate; use --bandwidth native, or "
                         "ask the host's admins for passwordless sudo")
    if getattr(spec, "runtime", "host") == "container" and runs:
        check_container_runtime(cluster, rec, spec, runs, nodes)
    if spec.launcher == "slurm" and runs:
        from scalelab.cluster import slurmctl

        # before anything is written or submitted: Slurm answers, the partition holds the nodes
        most = max(r.params["nodes"] for r in runs)
        fix = "" if caps.configurable else slurmctl.ADMIN_FIX
        slurmctl.check(cluster, target.login(rec), rec["known_hosts"],
                       spec.partition or target.default_partition(rec),
                       [n.name for n in nodes[:most]], fix=fix)
    return Prepared(cluster, spec, runs, estimate.estimate_duration_s(
        runs, device=_device(runs), shared_host=caps.shares_host_cpus, warm=_warm(caps, spec)))


def check_container_runtime(cluster: str, rec: dict[str, Any], spec, runs: list,
                            nodes: list[Node]) -> None:
    """--runtime container: the nodes run Docker and hold the cluster's training image, which
    has what the runs need; InputError naming the first gap and its fix, before any run."""
    from scalelab.cluster import image as images

    fix = (f"build one with invoke image and load it with invoke configure --cluster {cluster} "
           "--image ARCHIVE")
    if spec.launcher == "slurm":
        raise InputError("--runtime container with --launcher slurm needs Slurm's container "
                         "plugin (pyxis: srun --container-image), which scalelab does not drive; "
                         "use --launcher ssh or --runtime host")
    img = rec.get("image")
    if not isinstance(img, dict) or not img.get("id"):
        raise InputError(f"--runtime container: cluster {cluster} has no training image; {fix}")
    lacking = images.missing_for(img.get("contents") or {}, sorted({
        r.params["engine"] for r in runs if r.kind == "train"}))
    if lacking:
        raise InputError(f"--runtime container: image {img['tag']} lacks {', '.join(lacking)}, "
                         f"which these runs need; {fix} (an image invoke image built has both)")
    if img.get("workloads") is not None and img["workloads"] != images.workloads_now():
        raise InputError(f"--runtime container: image {img['tag']} holds other workloads than "
                         f"this checkout's bench/workloads; {fix}")
    used = nodes[:max(r.params["nodes"] for r in runs)]
    cuda = any(r.params.get("device") == "cuda" for r in runs)
    for n in used:
        f = n.facts or {}
        if not f.get("docker"):
            raise InputError(f"--runtime container: node {n.name} has no Docker engine that "
                             f"{f.get('user') or n.ssh_user} can use; {fix}")
        if (f.get("images") or {}).get(img["tag"]) != img["id"]:
            raise InputError(f"--runtime container: node {n.name} does not hold image "
                             f"{img['tag']} ({img['id'][:19]}); load it with invoke configure "
                             f"--cluster {cluster} --image {img.get('archive') or 'ARCHIVE'}")
        if cuda and "nvidia" not in (f.get("docker_runtimes") or []):
            raise InputError(f"--runtime container: node {n.name}'s Docker has no nvidia runtime, "
                             "so a container cannot see its GPUs; configure it again (the "
                             "docker_nvidia role installs the NVIDIA container toolkit on GPU "
                             "nodes), or run with --runtime host")


def sweep_meta(prep: Prepared, sweep_id: str) -> dict[str, Any]:
    from scalelab.sweep import spec as sweepfile

    rec = load_cluster(prep.cluster)
    return {
        "sweep_id": sweep_id, "cluster": prep.cluster, "target": rec["target"],
        "created_at": utcnow(), "finished_at": None, "plan": sweepfile.spec_to_dict(prep.spec),
        "nodes": rec["nodes"], "bandwidth_mbit_cluster": rec.get("bandwidth_mbit"),
        "emulated": targets.capabilities(rec).shares_host_cpus,
        "host_cpus": host_cpus() if targets.capabilities(rec).shares_host_cpus else None,
        "capabilities": targets.capabilities(rec).to_dict(),
        "software": {"scalelab": scalelab_commit(), "python": platform.python_version(),
                     **_terraform_used(rec)},
        "planned_runs": [r.run_id for r in prep.runs],
        # every pair's rate as the last `invoke check --links` measured it (optional)
        **_link_pairs(prep.cluster, rec),
    }


def _terraform_used(rec: dict[str, Any]) -> dict[str, Any]:
    """{"terraform": {"binary", "version"}} when the cluster was applied by Terraform (or
    OpenTofu) and its record says which; {} otherwise.

    >>> _terraform_used({"terraform": {"binary": "/usr/bin/tofu", "version": "1.8.0"}})
    {'terraform': {'binary': 'tofu', 'version': '1.8.0'}}
    >>> _terraform_used({"target": "local"}), _terraform_used({"terraform": {"version": ""}})
    ({}, {})
    """
    meta = rec.get("terraform")
    if not isinstance(meta, dict) or not meta.get("version"):
        return {}
    binary = Path(str(meta.get("binary") or "terraform")).name
    return {"terraform": {"binary": binary, "version": str(meta["version"])}}


def _link_pairs(cluster: str, rec: dict[str, Any]) -> dict[str, Any]:
    """{"link_pairs": doc} from the cluster's last check --links, if it measured these nodes."""
    import json

    from scalelab.run import linkprobe

    path = cluster_dir(cluster) / linkprobe.LINKS_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    names = {n["name"] for n in rec.get("nodes", [])}
    pairs = linkprobe.measurements(doc) if isinstance(doc, dict) else []
    if not pairs or any({m.server, m.client} - names for m in pairs):
        return {}  # measured on nodes this cluster no longer has
    return {"link_pairs": doc}


def start(prep: Prepared, reports_root: Path,
          on_progress: Callable[[Progress], None] | None = None,
          stop: threading.Event | None = None) -> tuple[Path, dict[str, int]]:
    """Create the sweep in the store, run every planned run, write results.csv."""
    from scalelab.sweep import planner as sweep

    stop = stop if stop is not None else threading.Event()
    with interrupts_stop(stop):
        ended = end_abandoned(reports_root, prep.cluster)
        if ended:
            log.warning("ended %d process groups that a killed driver left on cluster %s",
                        ended, prep.cluster)
        if prep.spec.launcher != "slurm":  # a Slurm sweep's nodes were asked of sinfo
            preflight(prep.cluster, max(r.params["nodes"] for r in prep.runs))
        if stop.is_set():
            raise KeyboardInterrupt  # before anything is written
        sweep_id = sweep.new_sweep_id(dt.datetime.now(dt.UTC))
        sweep_dir = store.create_sweep(reports_root, sweep_id, sweep_meta(prep, sweep_id))
        store.update_latest(reports_root, sweep_id)
        return sweep_dir, _run_and_finish(prep.cluster, sweep_dir, prep.runs, prep.spec,
                                          on_progress, stop)


def end_abandoned(reports_root: Path, cluster: str) -> int:
    """End what killed drivers left running on this cluster's nodes (ranks, their containers,
    warm-start servers), in every sweep of it that no driver holds now, as --resume would:
    a new sweep never starts beside a dead one's ranks. Returns how many groups were listed."""
    rec = load_cluster(cluster)
    ended = 0
    for marker in sorted([*Path(reports_root).glob(f"*/{INFLIGHT}"),
                          *Path(reports_root).glob(f"*/{WARM}")]):
        sweep_dir = marker.parent
        try:
            meta = store.read_meta(sweep_dir)
        except (ScalelabError, OSError):
            continue
        if meta.get("cluster") != cluster:
            continue
        try:
            with store.hold_sweep(sweep_dir):  # a live driver holds its own: left alone
                ended += reap.reap_inflight(marker, rec["known_hosts"], retry_s=5.0)
        except store.StoreError:
            continue
    return ended


def prepare_resume(reports_root: Path, sweep_id: str,
                   retry_failed: bool = False) -> tuple[Path, Prepared]:
    """The runs of an earlier sweep that its store lacks (or that were interrupted; with
    retry_failed, also those that failed or timed out)."""
    from scalelab.sweep import estimate
    from scalelab.sweep import spec as sweepfile

    stored = store.load_sweep(reports_root, sweep_id)
    sweep_dir, meta = stored.path, stored.meta
    spec = sweepfile.spec_from_mapping(meta["plan"], f"{sweep_dir}/sweep.json")
    prep = prepare(meta["cluster"], spec)
    todo = store.missing_runs(sweep_dir, prep.runs, retry_failed=retry_failed)
    rec = load_cluster(meta["cluster"])
    caps = targets.capabilities(rec)
    return sweep_dir, Prepared(meta["cluster"], spec, todo, estimate.estimate_duration_s(
        todo, device=_device(todo), shared_host=caps.shares_host_cpus, warm=_warm(caps, spec)))


def resume(sweep_dir: Path, prep: Prepared,
           on_progress: Callable[[Progress], None] | None = None,
           stop: threading.Event | None = None) -> dict[str, int]:
    stop = stop if stop is not None else threading.Event()
    with interrupts_stop(stop):
        with store.hold_sweep(sweep_dir):  # a second resume of the same sweep fails here
            store.compact(sweep_dir)
            rec = load_cluster(prep.cluster)
            reaped = (reap.reap_inflight(sweep_dir / INFLIGHT, rec["known_hosts"])
                      + reap.reap_inflight(sweep_dir / WARM, rec["known_hosts"]))
        if reaped:
            log.warning("ended %d process groups left by the interrupted driver", reaped)
        if prep.runs and prep.spec.launcher != "slurm":
            preflight(prep.cluster, max(r.params["nodes"] for r in prep.runs))
        if stop.is_set():
            raise KeyboardInterrupt
        return _run_and_finish(prep.cluster, sweep_dir, prep.runs, prep.spec, on_progress,
                               stop)


def _run_and_finish(cluster: str, sweep_dir: Path, runs: list, spec: Any,
                    on_progress, stop) -> dict[str, int]:
    from scalelab.results import frames as results

    ended = False
    try:
        with store.hold_sweep(sweep_dir):
            counts = execute(cluster, sweep_dir, runs, spec.timeout_s, on_progress, stop,
                             netprobe=getattr(spec, "netprobe", True),
                             launcher=getattr(spec, "launcher", None) or "ssh",
                             partition=getattr(spec, "partition", None),
                             runtime=getattr(spec, "runtime", "host"),
                             warm_start=getattr(spec, "warm_start", True))
            store.finish_sweep(sweep_dir, utcnow())
        ended = True
        return counts
    except OSError as exc:
        # a full disk (ENOSPC) or the like, where the store itself has no word for it
        where = f" ({exc.filename})" if exc.filename else ""
        raise store.StoreError(f"sweep {sweep_dir.name} stopped: {exc.strerror}{where}; every "
                               f"run recorded so far is kept; fix it (free space?), then "
                               f"resume with invoke bench --resume {sweep_dir.name}") from None
    finally:
        try:
            results.write_csv(sweep_dir)
        except (ScalelabError, OSError) as exc:
            # e.g. a full disk: when the sweep itself failed, its error is the one to show
            log.log(logging.WARNING if ended else logging.INFO, "results.csv not written: %s",
                    exc)
