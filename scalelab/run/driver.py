"""Execute a sweep plan on a cluster: shape links, launch runs, commit each result at once.

Plan -> runs -> store. Every finished run is appended (and fsync'ed) to the sweep's
runs.jsonl before the next one starts, so a crash loses at most the run in flight; `resume`
runs only what the store lacks.

Ctrl-C (SIGINT) and SIGTERM during lifecycle.start() or resume() do not cut the driver short:
they stop the sweep at the next safe point. The run in flight is ended on every node and recorded
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
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.cluster import ckptdirs, ckptstore, gpu, image, netshape, ssh, storage, targets
from scalelab.cluster.nodes import Node, nodes_of
from scalelab.core.state import PROJECT_ROOT, cluster_dir, load_cluster
from scalelab.model import datapath, fabric
from scalelab.model.networks import MODELS
from scalelab.results import store
from scalelab.run import (
    checkpoints,
    commands,
    containers,
    failures,
    launch,
    linkprobe,
    slurm,
    storageprobe,
)
from scalelab.run.emulation import Emulation
from scalelab.run.shaping import Shaper
from scalelab.run.warmstart import WARM, WarmPool
from scalelab.sweep import planner, starts, values
from scalelab.sweep.values import SYNTHETIC

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
               connections: dict[str, int] | None = None,
               intra: float | None = None, delay_us: float = 0.0,
               storage: dict[str, Any] | None = None,
               checkpoint: dict[str, Any] | None = None,
               failure: dict[str, Any] | None = None) -> dict[str, Any]:
    """The raw record of one run, as committed to the store (schema in CONTRACTS.md).

    rate is what tc was set to; with an emulated accelerator at dilation k that is the
    requested rate / k and link_mbit (measured on the dilated link) is given here times k, the
    rate the emulated network delivered in the emulated device's time. intra: what each
    node's loopback was set to (the path between its ranks), None where it was not shaped;
    delay_us: the per-hop delay its links added (a fabric profile's latency times k)."""
    result = res.result or {}
    env = dict(result.get("env") or {})
    env.update({"scalelab": scalelab_commit(), "controller_python": platform.python_version(),
                "target": target, "nodes": list(run.node_names), "tc": netshape.describe(rate)})
    if intra is not None:
        env["tc_loopback"] = netshape.describe(intra)
    if delay_us:
        env["hop_delay_us"] = round(delay_us, 3)
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
    if storage:
        measured["storage"] = storage
    if isinstance(result.get("ps"), dict):  # the parameter servers' own figures
        measured["ps"] = result["ps"]
    if checkpoint is not None:  # the ranks' checkpoints (if they got that far) and their dir
        measured["checkpoint"] = {**(result.get("checkpoint") or {}), **checkpoint}
    if failure is not None:  # the failure injected, and how the run came back from it
        measured["failure"] = failure
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
    want = planner.ps_servers(run.params)
    got = len((measured.get("ps") or {}).get("servers") or [])
    if status == "ok" and run.kind == "train" and want and got != want:
        status, error = "failed", (f"the run asked for {want} parameter server(s) but "
                                   f"{got} answered")
    unmet = failures.unmet(run.params, measured.get("checkpoint"), result.get("recovery"),
                           failure) if run.kind == "train" else ""
    if status == "ok" and unmet:
        status, error = "failed", unmet
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

    def _watched(self, cmds: list, timeout_s: float, stop: threading.Event | None,
                 inflight: Path, inject: failures.Injector | None) -> launch.LaunchResult:
        """launch.run, with the failure injector (if any) watching the output, disarmed after."""
        try:
            return launch.run(cmds, self.rt, timeout_s=timeout_s, stop=stop, inflight=inflight,
                              watch=inject.poll if inject else None)
        finally:
            if inject is not None:
                inject.finish()

    def run(self, run, engine: str, nodes: list[Node], script: str, args: list[str], port: int,
            timeout_s: float, stop: threading.Event | None, inflight: Path,
            servers: list[Node] | None = None, inject: failures.Injector | None = None
            ) -> tuple[str, launch.LaunchResult, dict[str, Any] | None]:
        """Start, wait, reap one run; (launcher name, result, the Slurm job's record);
        servers: the parameter-server engine's dedicated server nodes; inject: the failure
        to inject (its ranks then restart through torchrun's agents, Horovod's elastic driver,
        or a new step of the Slurm job)."""
        ppn = run.params["procs_per_node"]
        fabric, device = run.params.get("fabric") or "tcp", run.params.get("device") or "cpu"
        if self.kind != "slurm" and self.container is not None:
            spec = dataclasses.replace(self.container, gpus=device == "cuda",
                                       rdma=fabric == "rdma")
            inside = launch.Runtime(image.PYTHON, image.PREFIX, self.rt.known_hosts)
            name, cmds = commands.rank_commands(engine, nodes, ppn, script, args, inside, port,
                                              shared_host=self.emulated, fabric=fabric,
                                              device=device, in_container=True,
                                              servers=servers)
            cmds = [dataclasses.replace(c, container=spec) for c in cmds]
            return name, launch.run(cmds, self.rt, timeout_s=timeout_s, stop=stop,
                                    inflight=inflight), None
        if self.kind != "slurm":
            name, cmds = commands.rank_commands(engine, nodes, ppn, script, args, self.rt, port,
                                              shared_host=self.emulated, warm=self.warm,
                                              fabric=fabric, device=device, servers=servers,
                                              restart_id=run.run_id if inject else None,
                                              restarts=inject.restarts if inject else 0)
            return name, self._watched(cmds, timeout_s, stop, inflight, inject), None

        job = slurm.job_name(secrets.token_hex(8), run.run_id)
        if inject is not None:
            inject.job = job  # a kill from the login host is a step of this job
        gpus = ppn if all(n.gpus for n in nodes) else 0
        if self.container is not None:  # DDP, one rank a node (lifecycle refuses the rest)

            cmds = [slurm.container_command(nodes, self.login, script, args,
                                            image.bundle_path(self.container.image_id), port,
                                            job, self.partition, timeout_s)]
        else:
            cmds = slurm.rank_commands(engine, nodes, self.login, ppn, script, args, self.rt,
                                       port, job, self.partition, timeout_s, gpus_per_node=gpus,
                                       restarts=inject.restarts if inject else 0,
                                       servers=servers)
        try:
            res = self._watched(cmds, timeout_s, stop, inflight, inject)
        except KeyboardInterrupt:
            res = launch.LaunchResult("interrupted", None, "interrupted by the user", [], 0.0)
        t0 = time.monotonic()
        state = slurm.job_state(self.login, self.rt.known_hosts, job)
        record = {**state.to_record(), "sacct_wait_s": round(time.monotonic() - t0, 3)}
        # an interrupted run comes back as such: execute records it, then stops the sweep
        teardown = bool(((res.result or {}).get("env") or {}).get("teardown_failure"))
        res.status, res.error = slurm.outcome(state, res.status, res.error, timeout_s, teardown)
        return "slurm", res, record


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
    ex = _Execution(cluster, sweep_dir, runs, launcher, partition, runtime, stop)
    counts = {"ok": 0, "failed": 0, "timeout": 0, "interrupted": 0}
    # ranks started directly on shared cores are forked from a warm-start server per node
    shared = ex.caps.shares_host_cpus
    forks = starts.forks_warm(shared, launcher, "host" if ex.container is None else "container",
                               warm_start)
    direct = [r for r in runs if forks and starts.run_starts_directly(r, shared)]
    warm = (WarmPool(ex.all_nodes[: max(r.params["nodes"] for r in direct)], ex.rt,
                     sweep_dir / WARM) if direct else None)
    try:
        ex.serve_checkpoints(runs)
        if warm is not None and warm.start(stop=stop):
            ex.starter.warm = warm.name
        for k, run in enumerate(runs):
            if ex.stopped():
                raise KeyboardInterrupt
            desc = planner.describe(run)
            if on_progress:
                on_progress(Progress(k, len(runs), run.run_id, desc, None))
            record, interrupted = ex.one(k, run, timeout_s, netprobe)
            counts[record["status"]] = counts.get(record["status"], 0) + 1
            if on_progress:
                on_progress(Progress(k, len(runs), run.run_id, desc, record))
            if interrupted:
                raise KeyboardInterrupt
    finally:
        if warm is not None:
            warm.stop()
        ckptstore.end(ex.cluster, ex.rec, ex.stores)
        ex.shaper.restore()
    return counts


class _Execution:
    """What execute() holds for a sweep's runs: the cluster, its links and their probes, the
    launcher, the emulation's dilation."""

    def __init__(self, cluster: str, sweep_dir: Path, runs: list, launcher: str,
                 partition: str | None, runtime: str, stop: threading.Event | None) -> None:
        self.rec = rec = load_cluster(cluster)
        self.cluster = cluster
        self.all_nodes = nodes_of(rec)
        target = targets.of(rec)
        self.caps = targets.capabilities(rec)
        self.rt = target.runtime(rec)
        self.sweep_dir, self.stop = sweep_dir, stop
        self.shaper = Shaper(target.links(cluster, rec, self.all_nodes),
                             marker=cluster_dir(cluster) / SHAPED)
        # per tc rate: the parallel probe's rate, why it is missing, the single-stream rate
        self.links: dict[Any, tuple[float | None, str, float | None]] = {}
        # per (source, nodes, tc rate, streams): the storage probe; per source: the decode probe
        self.reads: dict[tuple, storageprobe.StorageProbe] = {}
        self.decodes: dict[str, storageprobe.DecodeProbe] = {}
        self.storage_shaped: set[str] = set()  # nodes whose link is at a storage rate now
        self.stores: dict[str, ckptstore.Store] = {}  # per nfs@NODE checkpoint place
        self.container = None
        if runtime == "container":
            self.container = containers.Spec(rec["image"]["tag"], rec["image"]["id"])
        self.starter = Launcher(launcher, target.login(rec), self.rt, self.caps.shares_host_cpus,
                                partition or target.default_partition(rec), self.container)
        # who removes a run's checkpoints in a shared place: the first node, or the login host
        # of a cluster whose nodes scalelab does not reach over SSH
        self.remover = None if self.caps.ssh_nodes else target.login(rec)
        self.slurm_login = self.starter.login if launcher == "slurm" else None  # kills go there
        self.emu = Emulation(runs, self.all_nodes, self.rt.known_hosts, self.rt.workdir,
                             self.caps.shares_host_cpus, self._calibrate)
        self.emu.keep(store.read_runs(sweep_dir).values())  # a resumed sweep keeps its k

    def _calibrate(self) -> float | None:
        self.shaper.set(None)
        return self.starter.measure_link(self.all_nodes, BASE_PORT + 450, self.stop)[0]

    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def shape_storage(self, p: dict[str, Any], rate: float | None, dilation: float) -> None:
        """The storage node's link at the run's storage rate (in the emulated device's time:
        divided by the dilation, as the other links), or back at the cluster's."""
        device = p.get("storage_bandwidth_mbit")
        node = storage.serving_node(self.all_nodes, p.get("data")) if device else None
        for name in [n for n in self.storage_shaped if node is None or n != node.name]:
            self.shaper.set_node(name, rate)
            self.storage_shaped.discard(name)
        if node is not None:
            self.shaper.set_server(node.name, device, dilation)
            self.storage_shaped.add(node.name)

    def probe_storage(self, run, rate: float | None, netprobe: bool,
                      dilation: float = 1.0) -> dict[str, Any] | None:
        """A real-data run's source probed once per node count and link rate (read) and once
        per sweep (decode), over the links as this run has them; None for synthetic data. An
        emulated device's read rate is in its time (the dilated links' rate times k); its
        decode is always probed, since the run charges what one image costs."""
        p = run.params
        source = p.get("data")
        if run.kind != "train" or source in (None, SYNTHETIC) or not (
                netprobe or p.get("accelerator")):
            return None
        used = self.all_nodes[: p["nodes"]]
        streams = int(datapath.loader_slots(p.get("loader_workers") or 1, p["procs_per_node"]))
        key = (source, len(used), rate, p.get("storage_bandwidth_mbit"), streams)
        # kept once measured; a failed probe is tried again by the next run
        if key not in self.reads or self.reads[key].mb_s is None:
            self.reads[key] = storageprobe.measure_read(used, self.rt, source, streams,
                                                        stop=self.stop)
        if source not in self.decodes or self.decodes[source].img_s_per_core is None:
            size = p.get("image_size") or MODELS[p["model"]].image_size
            self.decodes[source] = storageprobe.measure_decode(used[0], self.rt, source, size,
                                                               stop=self.stop)
        read = self.reads[key].as_record()
        if dilation != 1.0:
            read["read_mb_s"] = read["read_mb_s"] and round(read["read_mb_s"] * dilation, 2)
            read["read_per_node_mb_s"] = [round(x * dilation, 2)
                                          for x in read["read_per_node_mb_s"]]
        return {**read, **self.decodes[source].as_record()}

    def serve_checkpoints(self, runs: list) -> None:
        """Start the NFS server of every nfs@NODE checkpoint place the runs write to, once
        what a killed sweep's runs left is removed."""
        ckptdirs.remove_left(self.cluster, self.rec, self.rt.workdir)
        places = [r.params.get("checkpoint_to") for r in runs
                  if r.kind == "train" and r.params.get("checkpoint_every")]
        self.stores = ckptstore.serve(self.cluster, self.rec, {
            p: values.served_by(p) for p in places if values.served_by(p)}, self.rt.workdir)

    def checkpoints_after(self, p: dict[str, Any], where: str | None) -> dict[str, Any] | None:
        """A run's checkpoints removed from the nodes (unless the sweep keeps them): where
        they were, whether kept, and a node that could not remove them."""
        if not where:
            return None
        kept = bool(p.get("keep_checkpoints"))
        store = self.stores.get(p.get("checkpoint_to"))
        server = next((n for n in self.all_nodes if store and n.name == store.node), None)
        errors = {} if kept else checkpoints.remove(self.all_nodes[: p["nodes"]],
                                                    self.rt.known_hosts, where, p,
                                                    self.rt.workdir, store,
                                                    server or self.remover)
        bad = next(iter(errors.items()), None)
        if bad:
            log.warning("checkpoints of a run left at %s on %s: %s", where, *bad)
        else:
            ckptdirs.forget(self.cluster, self.rec, where)
        return {"dir": where, "kept": kept,
                "removal_error": f"{bad[0]}: {bad[1]}" if bad else ""}

    def one(self, k: int, run, timeout_s: float, netprobe: bool) -> tuple[dict[str, Any], bool]:
        """Shape, probe, stage and launch one run; its record, committed, and whether the
        user interrupted it."""
        before = ssh.connections()
        dilation = self.emu.dilation(run)
        run = self.emu.with_dilation(run, dilation)
        p = run.params
        # what tc is set to: the line rate, or the share of it a fabric profile's
        # collectives achieve, in the emulated device's time
        line = fabric.tc_line_mbit(p.get("bandwidth_mbit"), p.get("fabric_profile"),
                                   p["procs_per_node"])
        rate = line / dilation if line else line
        # and on links that can, the profile's per-hop latency, also in the device's time
        fab = fabric.maybe(p.get("fabric_profile"))
        delay_us = (fab.per_hop_latency_s * 1e6 * dilation
                    if fab and rate and self.caps.hop_delay else 0.0)
        self.shaper.set(rate, delay_us)
        # the path between each node's ranks, also in the emulated device's time, on nodes
        # whose loopback is their own (the record says what it was set to only there)
        lo = fabric.loopback_mbit(p.get("intra_mbit"), p["nodes"], p["procs_per_node"])
        lo = lo / dilation if lo and self.caps.own_loopback else None
        if self.caps.own_loopback:
            self.shaper.set_intra(lo)
        if rate not in self.links:
            self.links[rate] = (self.starter.probe_link(self.all_nodes, k, self.stop)
                                if netprobe else (None, "", None))
        # after the link probe, which measures the cluster's rate: the storage node's own
        self.shape_storage(p, rate, dilation)
        source_probe = self.probe_storage(run, rate, netprobe, dilation)
        profile = self.emu.stage(run)
        if self.stopped():
            raise KeyboardInterrupt
        # a fresh port per run: the last one may still be in TIME_WAIT
        port = BASE_PORT + (os.getpid() * 7 + k) % 400
        decode, ckpt_dir = None, None
        if run.kind == "allreduce":
            script, args, engine = ("allreduce.py",
                                    commands.allreduce_args(p, run.allreduce_sizes), "ddp")
        else:
            # an emulated device reading real data charges the decode the probe measured
            decode = (source_probe or {}).get("decode_img_s_per_core") if profile else None
            if p.get("checkpoint_every"):
                ckpt_dir = checkpoints.run_dir(p, self.rt.workdir, self.cluster,
                                               self.sweep_dir.name, run.run_id,
                                               self.stores.get(p.get("checkpoint_to")))
                checkpoints.remember(self.cluster, self.rec, ckpt_dir, p, self.rt.workdir,
                                     self.all_nodes[: p["nodes"]], self.remover)
            script, args, engine = ("resnet.py", commands.workload_args(
                p, profile, 1.0 / decode if decode else None, ckpt_dir), p["engine"])
        inject = failures.injector(run, self.all_nodes[: p["nodes"]], self.rt.known_hosts,
                                   self.slurm_login, self.caps.ssh_nodes)
        started = utcnow()
        interrupted, job, launcher_name = False, None, self.starter.kind
        try:
            if profile and source_probe and not decode:  # nothing to charge: no run
                res = launch.LaunchResult("failed", None, "the decode probe, whose cost an "
                                          "emulated device charges, failed: "
                                          f"{source_probe.get('decode_error')}", [], 0.0)
            else:
                servers = self.all_nodes[p["nodes"]: p["nodes"] + planner.server_nodes(p)]
                launcher_name, res, job = self.starter.run(
                    run, engine, self.all_nodes[: p["nodes"]], script, args, port, timeout_s,
                    self.stop, self.sweep_dir / INFLIGHT, servers, inject)
        except KeyboardInterrupt:
            interrupted = True
            res = launch.LaunchResult("interrupted", None, "interrupted by the user", [], 0.0)
        saved = self.checkpoints_after(p, ckpt_dir)
        parallel, why, single = self.links[rate]
        # in the emulated device's time
        measured_mbit = None if parallel is None else parallel * dilation
        single = None if single is None else single * dilation
        c = self.container
        record = run_record(self.sweep_dir.name, run, self.rec["target"], res, started,
                            measured_mbit, rate, why, launcher_name, job, single_mbit=single,
                            intra=lo, delay_us=delay_us, storage=source_probe,
                            image={"id": c.image_id, "tag": c.image} if c is not None else None,
                            checkpoint=saved,
                            failure=inject.outcome(res) if inject else None,
                            connections={key: v - before[key]
                                         for key, v in ssh.connections().items()})
        store.append_run(self.sweep_dir, record)
        return record, interrupted or res.status == "interrupted"


# ---------------------------------------------------------------- sweeps: start and resume


