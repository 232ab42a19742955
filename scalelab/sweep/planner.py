"""Sweep planning: options or a sweep file -> a validated, ordered list of runs.

Pure apart from reading the sweep file: no SSH, no clock, no randomness unless passed in.
Execution and resume live with the caller; the store of record is scalelab.results.store.

Vocabulary:
  batch size   per process (per GPU), as in Horovod's and tf_cnn_benchmarks' figures, so a
               run's global batch is batch_size * world_size (weak scaling);
  steps        timed training steps per run, after `warmup` untimed ones;
  repeat       the same configuration run again, 0-based in run ids and records.

Order of runs (plan()):
  bandwidth -> repeat -> nodes -> procs_per_node -> batch size -> communication settings
  (bucket_cap_mb, fusion_threshold_mb, cycle_time_ms, compression: comm_axes).
  Bandwidth is outermost because changing it reshapes every link (tc on every node, and a
  netprobe to confirm it), so each rate is set once. Repeats are interleaved inside a
  bandwidth group rather than run back to back: back-to-back repeats share whatever
  disturbed the machine at that moment (a noisy neighbour, a warming page cache, thermal
  throttling) and give a confidence interval that is too tight for that configuration;
  spread over the group they sample the drift, and an interrupted sweep still holds a
  complete first pass over every configuration of the rates it reached. The allreduce probe
  of a (bandwidth, nodes, procs_per_node) comes right before that triple's first train run.
  Single-process runs are kept in every bandwidth group although the link is idle there:
  they are each group's baseline and a control for drift between groups.

>>> from scalelab.sweep.spec import spec_from_options
>>> cluster = [Node(f"demo-n{i}", f"10.0.0.{i}", f"10.0.0.{i}", "head" if i == 0 else "worker",
...                 "local", cpus=1.0) for i in range(3)]
>>> spec = spec_from_options(nodes="1-2", batch_size="32", bandwidth="1gbit", repeats=2,
...                          model="resnet20")
>>> [r.run_id for r in plan(spec, cluster, can_shape=True)]  # doctest: +NORMALIZE_WHITESPACE
['train-n01-p1-b032-bw1000-r0', 'allreduce-n02-p1-bw1000', 'train-n02-p1-b032-bw1000-r0',
 'train-n01-p1-b032-bw1000-r1', 'train-n02-p1-b032-bw1000-r1']
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from scalelab.cluster.nodes import Node, sort_nodes
from scalelab.core.errors import InputError
from scalelab.core.units import format_rate
from scalelab.model import fabric
from scalelab.model.comm import (
    COMM_DEFAULTS,
    COMM_ENGINE,
    COMM_KEYS,
    COMM_TAGS,
    comm_label,
)
from scalelab.model.models import MODELS
from scalelab.sweep import memory, starts

log = logging.getLogger(__name__)



ENGINES = ("ddp", "horovod")
LAUNCHERS = ("ssh", "slurm")
RUNTIMES = ("host", "container")  # where ranks run: on the node, or in the training image
# fp32: true FP32 (TF32 off, which Ampere and Hopper convolutions use by default); tf32: TF32
# on; amp: fp16 autocast with loss scaling on GPUs (bfloat16 on CPUs); bf16: bfloat16 autocast
PRECISIONS = ("fp32", "tf32", "amp", "bf16")
# the convolutions' memory layout: torch's default (NCHW), or NHWC (faster on tensor cores)
MEMORY_FORMATS = ("contiguous", "channels_last")
DEVICES = ("auto", "cuda", "cpu")  # auto: cuda on nodes with GPUs, never CPU there
FABRICS = ("auto", "tcp", "rdma")  # auto: rdma where every node has an active port, unshaped
KINDS = ("train", "allreduce")
SYNTHETIC = "synthetic"

# the keys of runs.jsonl "params" (docs/dev/CONTRACTS.md), in contract order
PARAM_KEYS = ("nodes", "procs_per_node", "world_size", "model", "engine", "precision",
              "batch_size", "bandwidth_mbit", "repeat", "steps", "warmup", "image_size", "data")
# appended to every run's params since emulated accelerators (null when computing for real);
# a store written before them lacks these keys and is still read
EMULATION_KEYS = ("accelerator", "dilation")
# appended since GPU placement was recorded: the device and fabric the runs used (resolved
# from the nodes' facts, never auto), the memory format and the runtime (host, or a container of
# the training image); a store without them is still read
PLACEMENT_KEYS = ("device", "fabric", "channels_last", "loader_workers", "pin_memory",
                  "runtime")
# appended since strong scaling: the global batch a train run splits over its ranks (its
# batch_size is then that batch / world size); None for a run with a fixed batch per worker
# (weak scaling) and for allreduce probes. A store without the key scaled weakly
SCALING_KEYS = ("global_batch_size",)
# appended since fabric profiles: the profile (bench/fabrics/) whose collective share the run's
# emulated links carried and its model uses; "ideal" is the line rate as tc gives it. A store
# without the key ran on the ideal fabric
FABRIC_KEYS = ("fabric_profile",)
# appended since intra-node paths: the path between the ranks of one node as stated (a name of
# fabric.INTRA_LINKS or a rate) and its Mbit/s; None: the node's loopback, unshaped, which the
# model takes as free. A store without the keys left it unshaped
INTRA_KEYS = ("intra_link", "intra_mbit")


@dataclass
class SweepSpec:
    """The axes and fixed settings of a sweep, validated and in canonical units."""

    nodes: list[int]
    batch_sizes: list[int]  # per worker: weak scaling (may be empty when global ones are given)
    bandwidths: list[float | None] = field(default_factory=lambda: [None])  # Mbit/s, None=native
    # None: the GPUs torch sees per node on GPU nodes, 1 elsewhere (scalelab.cluster.gpu.resolve)
    procs_per_node: list[int] | None = None
    model: str = "resnet50"
    engine: str = "ddp"
    # axes like batch_size: every precision x memory format is run (the first is the one a
    # single-valued sweep has always had)
    precisions: list[str] = field(default_factory=lambda: ["fp32"])
    memory_formats: list[str] = field(default_factory=lambda: ["contiguous"])
    repeats: int = 3  # enough for a confidence interval; sweep files for quick looks say 1
    steps: int = 30
    warmup: int = 5
    image_size: int | None = None  # None = the model's default (MODELS)
    data: str = SYNTHETIC  # or an absolute dataset path on the nodes
    timeout_s: float = 900.0  # per run, launch to exit
    allreduce_probe: bool = True  # one allreduce probe per (bandwidth, nodes, procs_per_node)
    netprobe: bool = True  # measure each link rate once it is set (link_mbit_measured)
    # on nodes that share one host's cores: ranks started directly are forked from a warm-start
    # server with torch imported (scalelab.run.warmstart); off: every rank starts its interpreter
    warm_start: bool = True
    allreduce_sizes: list[int] = field(
        # up to 256 MB: NCCL reaches its bus bandwidth only with messages this large
        default_factory=lambda: [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20])
    allreduce_iters: int = 10  # timed allreduces per size (params "steps" of a probe)
    description: str = ""
    accelerator: str | None = None  # emulate this device (a name in bench/profiles or a file)
    dilation: float | None = None  # time dilation k with an accelerator; None = pick per rate
    launcher: str | None = None  # ssh: ranks over SSH; slurm: each run a Slurm job; None:
    # the cluster's default (ssh where scalelab reaches the nodes, slurm behind a login host)
    partition: str | None = None  # slurm: the partition (None: the cluster's default one)
    device: str = "auto"  # cuda | cpu | auto (cuda on nodes with GPUs)
    fabric: str = "auto"  # tcp | rdma | auto (tcp whenever a rate is shaped)
    loader_workers: int = 2  # real data: DataLoader worker processes per rank
    pin_memory: str = "auto"  # real data: on | off | auto (on when the ranks train on GPUs)
    runtime: str = "host"  # host: ranks on the nodes; container: in the training image
    # what an allreduce achieves on the fabric (bench/fabrics/): shaped links carry its share
    # of the line rate and the model uses it; ideal: the line rate as tc gives it
    fabric_profile: str = "ideal"
    # the path between the ranks of one node: a name of fabric.INTRA_LINKS or a rate (emulated
    # GPUs, nodes whose loopback is their own); None: unshaped, taken as free by the model
    intra_link: str | None = None
    # what a node-hour costs (any currency): the report then tables the cost per million
    # images across node count x link rate
    price_per_node_hour: float | None = None
    # communication settings, axes like batch_size (None: the engine's default, COMM_DEFAULTS)
    bucket_cap_mb: list[float] | None = None  # DDP
    fusion_threshold_mb: list[float] | None = None  # Horovod (HOROVOD_FUSION_THRESHOLD, MB)
    cycle_time_ms: list[float] | None = None  # Horovod (HOROVOD_CYCLE_TIME)
    compression: list[str] | None = None  # none | fp16 gradient compression
    # strong scaling: global batches, each split evenly over the ranks of every run (beside or
    # instead of batch_sizes; each run is one or the other and is reported as what it is)
    global_batch_sizes: list[int] | None = None


@dataclass(frozen=True)
class RunPlan:
    """One run to execute: a train run or an allreduce probe.

    params holds exactly the runs.jsonl "params" keys; keys that mean nothing for an
    allreduce probe (batch_size, image_size, data) are None there, never absent. A probe's
    steps are the timed allreduces per size (allreduce_iters), after 1 untimed warm-up.
    """

    kind: str  # train | allreduce
    run_id: str
    params: dict[str, Any]
    node_names: tuple[str, ...]  # the first `nodes` of the cluster, head first
    timeout_s: float
    allreduce_sizes: tuple[int, ...] = ()  # allreduce probes only, bytes

    def __hash__(self) -> int:  # params is a dict; run ids are unique within a sweep
        return hash((self.kind, self.run_id))


# ------------------------------------------------------------------------------ planning

def format_int_list(values: Sequence[int]) -> str:
    """The shortest range expression parse_int_range reads back.

    >>> format_int_list([1, 2, 3, 5, 8, 9, 10])
    '1-3,5,8-10'
    """
    vals = sorted(set(values))
    parts: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{vals[i]}-{vals[j]}")
        else:
            parts.extend(str(v) for v in vals[i:j + 1])
        i = j + 1
    return ",".join(parts)


def _rate_tag(mbit: float | None) -> str:
    """Run-id segment: bw1000, bw2p5, native.

    >>> _rate_tag(1000.0), _rate_tag(2.5), _rate_tag(None)
    ('bw1000', 'bw2p5', 'native')
    """
    if mbit is None:
        return "native"
    return "bw" + (f"{int(mbit)}" if float(mbit).is_integer() else f"{mbit:g}".replace(".", "p"))


def train_run_id(nodes: int, ppn: int, batch: int, mbit: float | None, repeat: int,
                 comm: str = "", global_batch: int | None = None) -> str:
    """Id of a train run: stable, sortable within a group, readable. comm: the segment of its
    communication settings (comm_tag), "" at the defaults; global_batch: a strong-scaling
    run's global batch, which names it instead of its share per worker.

    >>> train_run_id(4, 1, 64, 1000.0, 0)
    'train-n04-p1-b064-bw1000-r0'
    >>> train_run_id(4, 1, 64, 1000.0, 0, "bk50-fp16")
    'train-n04-p1-b064-bw1000-bk50-fp16-r0'
    >>> train_run_id(4, 1, 128, 1000.0, 0, global_batch=512)
    'train-n04-p1-g0512-bw1000-r0'
    """
    seg = f"-{comm}" if comm else ""
    size = f"g{global_batch:04d}" if global_batch else f"b{batch:03d}"
    return f"train-n{nodes:02d}-p{ppn}-{size}-{_rate_tag(mbit)}{seg}-r{repeat}"


def batches(spec: SweepSpec, world: int) -> list[tuple[int, int | None]]:
    """(batch per worker, global batch or None) of every train run at one world size: the
    per-worker batches (weak scaling), then each global batch split over the world (strong;
    check_global_batches has made sure it splits evenly).

    >>> batches(SweepSpec(nodes=[1, 2], batch_sizes=[32], global_batch_sizes=[256]), 4)
    [(32, None), (64, 256)]
    """
    return ([(b, None) for b in spec.batch_sizes]
            + [(g // world, g) for g in spec.global_batch_sizes or []])


def check_global_batches(spec: SweepSpec, worlds: Sequence[int]) -> None:
    """Every global batch must split evenly over every planned world size: InputError naming
    the first that does not and a global batch that does.

    >>> check_global_batches(SweepSpec(nodes=[1, 2, 3], batch_sizes=[],
    ...                                global_batch_sizes=[256]), [1, 2, 3])
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: --global-batch-size 256 does not split evenly over 3 ranks; give a global batch that every planned world size (1, 2, 3) divides, e.g. 258, or drop the node counts that do not divide it
    """
    step = math.lcm(*worlds) if worlds else 1
    for g in spec.global_batch_sizes or []:
        for world in worlds:
            if g % world:
                fit = -(-g // step) * step
                raise InputError(
                    f"--global-batch-size {g} does not split evenly over {world} ranks; give a "
                    f"global batch that every planned world size ({', '.join(map(str, worlds))})"
                    f" divides, e.g. {fit}, or drop the node counts that do not divide it")


def _num_tag(value: float) -> str:
    return f"{value:g}".replace(".", "p")


def comm_axes(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every combination of the communication settings a run of spec's engine takes, in axis
    order; settings of the other engine are None. One combination (the defaults) where no
    axis is given.

    >>> from scalelab.sweep.spec import spec_from_options
    >>> [c["bucket_cap_mb"] for c in comm_axes(spec_from_options(nodes=1, batch_size=32,
    ...                                                            bucket_cap_mb="10,50"))]
    [10.0, 50.0]
    >>> comm_axes(spec_from_options(nodes=1, batch_size=32, engine="horovod"))
    [{'bucket_cap_mb': None, 'fusion_threshold_mb': 128.0, 'cycle_time_ms': 1.0, 'compression': 'none'}]
    """
    check_comm(spec)
    combos: list[dict[str, Any]] = [{}]
    for key in COMM_KEYS:
        if spec.engine not in COMM_ENGINE[key]:
            values: list[Any] = [None]
        else:
            values = list(getattr(spec, key) or [COMM_DEFAULTS[key]])
        combos = [{**c, key: v} for c in combos for v in values]
    return combos


def variants(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every precision x memory format x communication settings a train run of spec takes:
    params "precision", "channels_last" and the COMM_KEYS, in axis order.

    >>> from scalelab.sweep.spec import spec_from_options
    >>> [(v["precision"], v["channels_last"]) for v in variants(spec_from_options(
    ...     nodes=1, batch_size=32, precision="fp32,bf16", memory_format="contiguous,channels_last"))]
    [('fp32', False), ('fp32', True), ('bf16', False), ('bf16', True)]
    """
    return [{"precision": prec, "channels_last": fmt == "channels_last", **comm}
            for prec in spec.precisions for fmt in spec.memory_formats
            for comm in comm_axes(spec)]


def variant_tag(spec: SweepSpec, v: dict[str, Any]) -> str:
    """The run-id segment of a run's precision, memory format and communication settings:
    precision and memory format only where their axis has several values (a sweep of one
    precision keeps the run ids it always had), then comm_tag.

    >>> from scalelab.sweep.spec import spec_from_options
    >>> s = spec_from_options(nodes=1, batch_size=32, precision="fp32,amp",
    ...                       memory_format="channels_last", bucket_cap_mb="50")
    >>> [variant_tag(s, v) for v in variants(s)]
    ['fp32-bk50', 'amp-bk50']
    """
    parts = [v["precision"]] if len(spec.precisions) > 1 else []
    if len(spec.memory_formats) > 1:
        parts.append("nhwc" if v["channels_last"] else "nchw")
    comm = comm_tag(spec, {k: v.get(k) for k in COMM_KEYS})
    return "-".join(parts + ([comm] if comm else []))


def comm_tag(spec: SweepSpec, comm: dict[str, Any]) -> str:
    """The run-id segment of a run's communication settings: one part per setting whose axis
    has several values or whose value is not the default; "" at the defaults, so run ids stay
    those of sweeps from before these axes.

    >>> from scalelab.sweep.spec import spec_from_options
    >>> s = spec_from_options(nodes=1, batch_size=32, bucket_cap_mb="25,50", compression="fp16")
    >>> [comm_tag(s, c) for c in comm_axes(s)]
    ['bk25-fp16', 'bk50-fp16']
    >>> comm_tag(spec_from_options(nodes=1, batch_size=32), comm_axes(
    ...     spec_from_options(nodes=1, batch_size=32))[0])
    ''
    """
    parts = []
    for key in COMM_KEYS:
        value = comm.get(key)
        if value is None:
            continue
        axis = getattr(spec, key) or []
        if len(axis) <= 1 and value == COMM_DEFAULTS[key]:
            continue
        parts.append(str(value) if key == "compression" else COMM_TAGS[key] + _num_tag(value))
    return "-".join(parts)


def check_comm(spec: SweepSpec) -> None:
    """A communication setting the sweep's engine does not have is refused (InputError)."""
    for key in COMM_KEYS:
        if getattr(spec, key) and spec.engine not in COMM_ENGINE[key]:
            other = "horovod" if spec.engine == "ddp" else "ddp"
            raise InputError(f"--{key.replace('_', '-')} is a setting of --engine {other}; "
                             f"this sweep's engine is {spec.engine}: drop it or use --engine "
                             f"{other}")


def allreduce_run_id(nodes: int, ppn: int, mbit: float | None) -> str:
    """Id of an allreduce probe; one per (nodes, procs_per_node, bandwidth).

    >>> allreduce_run_id(4, 1, None)
    'allreduce-n04-p1-native'
    """
    return f"allreduce-n{nodes:02d}-p{ppn}-{_rate_tag(mbit)}"


def _check_cluster(spec: SweepSpec, cluster_nodes: list[Node], can_shape: bool,
                   cluster: str) -> list[Node]:
    name = f"cluster {cluster}" if cluster else "the cluster"
    if not cluster_nodes:
        raise InputError(f"{name} has no nodes; provision it with invoke provision "
                         f"--cluster {cluster or 'NAME'} --nodes {max(spec.nodes)}")
    nodes = sort_nodes(list(cluster_nodes))
    target = nodes[0].target
    want = max(spec.nodes)
    if want > len(nodes):
        have = len(nodes)
        fits = [n for n in spec.nodes if n <= have]
        fix_nodes = f"--nodes {format_int_list(fits)}" if fits else f"--nodes 1-{have}"
        target_opt = f" --target {target}"
        raise InputError(
            f"--nodes {format_int_list(spec.nodes)} but {name} has {have} node"
            f"{'s' if have != 1 else ''}; provision more with invoke provision{target_opt} "
            f"--cluster {cluster or 'NAME'} --nodes {want} or use {fix_nodes}")
    shaped = [b for b in spec.bandwidths if b is not None]
    if shaped and not can_shape:
        raise InputError(f"--bandwidth {format_rate(shaped[0])}: target {target} cannot shape "
                         "links; use --bandwidth native (or a target that can, e.g. local)")
    return nodes[:want]


def _check_precision(spec: SweepSpec, used: list[Node], device: str, cluster: str) -> None:
    name = f"cluster {cluster}" if cluster else "the cluster"
    if device == "cuda" or spec.accelerator:
        return
    gpu_only = [p for p in spec.precisions if p in ("amp", "tf32")]
    if gpu_only:
        raise InputError(f"--precision {gpu_only[0]} needs GPUs and {name} runs on CPUs; "
                         "use --precision fp32 or bf16")
    ppn = max(spec.procs_per_node or [1])
    for node in used:
        if node.cpus and ppn > math.ceil(node.cpus):
            # oversubscribed ranks time-share the cores: it runs, but measures contention
            log.warning("--procs-per-node %d exceeds the %g CPUs of node %s", ppn,
                        node.cpus, node.name)
            break


def plan(spec: SweepSpec, cluster_nodes: list[Node], can_shape: bool,
         cluster: str = "") -> list[RunPlan]:
    """Validate spec against the cluster and expand it into ordered runs (see module doc).

    cluster names the cluster in error messages; can_shape says whether the target can put
    a rate on links (tc). Raises InputError with one line that says the fix.
    """
    from scalelab.cluster import gpu

    used = _check_cluster(spec, cluster_nodes, can_shape, cluster)
    placed = gpu.resolve(spec, used, shaped=any(b is not None for b in spec.bandwidths))
    spec = dataclasses.replace(spec, procs_per_node=placed.procs_per_node)
    _check_precision(spec, used, placed.device, cluster)
    info = MODELS[spec.model]
    image = spec.image_size or info.image_size
    worlds = sorted({n * ppn for n in spec.nodes for ppn in spec.procs_per_node})
    check_global_batches(spec, worlds)
    per_worker = sorted({b for w in worlds for b, _ in batches(spec, w)})
    if spec.accelerator and spec.global_batch_sizes:
        check_emulation(spec, image, per_worker)
    if not spec.accelerator:  # an emulated rank holds no activations; its profile was
        # checked when the spec was built (sweepfile, check_emulation)
        fit = {"model": spec.model, "params": info.params,
               "activation_bytes": info.activation_bytes,
               "image_scale": (image / info.image_size) ** 2,
               "amp": all(p in ("amp", "bf16") for p in spec.precisions),
               # where nodes share a host, a warm-start server per node forks the ranks that
               # start directly
               "warm_servers": starts.warm_servers(spec)}
        if spec.batch_sizes:
            memory.check(used, spec.nodes, spec.procs_per_node, spec.batch_sizes, **fit)
        # a global batch: its share at each layout, against that layout's memory (the most
        # ranks per host hold the smallest shares)
        for n in spec.nodes:
            for ppn in spec.procs_per_node:
                for g in spec.global_batch_sizes or []:
                    try:
                        memory.check(used, [n], [ppn], [g // (n * ppn)], **fit)
                    except InputError as exc:
                        raise InputError(f"--global-batch-size {g} gives each of {n * ppn} "
                                         f"ranks {g // (n * ppn)} ({n} nodes x {ppn}); "
                                         f"{exc}") from None
    combos = variants(spec)  # refuses another engine's settings
    intra = fabric.intra_link(spec.intra_link)
    runs: list[RunPlan] = []
    for mbit in spec.bandwidths:
        for repeat in range(spec.repeats):
            for n in spec.nodes:
                names = tuple(node.name for node in used[:n])
                for ppn in spec.procs_per_node:
                    common = {"nodes": n, "procs_per_node": ppn, "world_size": n * ppn,
                              "model": spec.model, "engine": spec.engine,
                              "accelerator": spec.accelerator,
                              "dilation": spec.dilation, "device": placed.device,
                              "fabric": placed.fabric,
                              "loader_workers": spec.loader_workers,
                              "pin_memory": spec.pin_memory, "runtime": spec.runtime,
                              "fabric_profile": spec.fabric_profile,
                              "intra_link": spec.intra_link,
                              "intra_mbit": intra[1] if intra else None}
                    if spec.allreduce_probe and repeat == 0 and n * ppn > 1:
                        # a probe reduces fp32 tensors; it carries the sweep's first
                        # precision because the emulation picks a rate's dilation from the
                        # first run at it (amp's casts cost passes), and the probe is first
                        params = {**common, **dict.fromkeys(COMM_KEYS),
                                  "precision": spec.precisions[0],
                                  "channels_last": False, "batch_size": None, "bandwidth_mbit": mbit,
                                  "repeat": 0, "steps": spec.allreduce_iters, "warmup": 1,
                                  "image_size": None, "data": None,
                                  "global_batch_size": None}
                        runs.append(RunPlan("allreduce", allreduce_run_id(n, ppn, mbit),
                                            _ordered(params), names, spec.timeout_s,
                                            tuple(spec.allreduce_sizes)))
                    for batch, global_batch in batches(spec, n * ppn):
                        for var in combos:
                            params = {**common, **var, "batch_size": batch,
                                      "bandwidth_mbit": mbit, "repeat": repeat,
                                      "steps": spec.steps, "warmup": spec.warmup,
                                      "image_size": image, "data": spec.data,
                                      "global_batch_size": global_batch}
                            rid = train_run_id(n, ppn, batch, mbit, repeat,
                                               variant_tag(spec, var), global_batch)
                            runs.append(RunPlan("train", rid, _ordered(params), names,
                                                spec.timeout_s))
    return runs


def _ordered(params: dict[str, Any]) -> dict[str, Any]:
    return {k: params[k]
            for k in PARAM_KEYS + EMULATION_KEYS + PLACEMENT_KEYS + COMM_KEYS + SCALING_KEYS
            + FABRIC_KEYS + INTRA_KEYS}


def check_emulation(spec: SweepSpec, image_size: int,
                    per_worker: Sequence[int] | None = None) -> None:
    """An emulated accelerator must have a usable profile for every batch size per worker (the
    spec's, or per_worker: those the plan's global batches split into), with real (synthetic)
    input only: InputError otherwise, before anything runs."""
    from scalelab.model import accel

    if spec.data != SYNTHETIC:
        raise InputError(f"--accelerator {spec.accelerator} emulates compute and reads no data: "
                         "leave data synthetic")
    for precision in spec.precisions:
        for batch in spec.batch_sizes if per_worker is None else per_worker:
            for fmt in spec.memory_formats:
                accel.resolve(spec.accelerator, spec.model, precision, batch, image_size,
                              channels_last=fmt == "channels_last")


# ------------------------------------------------------------------------------ text

def _size_text(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def describe(run: RunPlan) -> str:
    """One line for the progress bar and the --dry-run listing.

    >>> r = RunPlan("train", "x", {"nodes": 4, "procs_per_node": 1, "world_size": 4,
    ...             "batch_size": 64, "bandwidth_mbit": 1000.0, "repeat": 0}, (), 1.0)
    >>> describe(r)
    'train      4 nodes x 1  batch 64   1gbit    repeat 0'
    >>> describe(RunPlan("train", "x", {**r.params, "procs_per_node": 8, "device": "cuda",
    ...                  "fabric": "rdma"}, (), 1.0))
    'train      4 nodes x 8  batch 64   1gbit    repeat 0  cuda rdma'
    >>> describe(RunPlan("train", "x", {**r.params, "engine": "ddp", "bucket_cap_mb": 50.0,
    ...                  "compression": "fp16", "runtime": "container"}, (), 1.0))
    'train      4 nodes x 1  batch 64   1gbit    repeat 0  bucket 50 MB fp16  in a container'
    >>> describe(RunPlan("train", "x", {**r.params, "precision": "bf16", "channels_last": True},
    ...                  (), 1.0))
    'train      4 nodes x 1  batch 64   1gbit    repeat 0  bf16 channels_last'
    >>> describe(RunPlan("train", "x", {**r.params, "global_batch_size": 256}, (), 1.0))
    'train      4 nodes x 1  global batch 256 (64/worker)  1gbit    repeat 0'
    >>> describe(RunPlan("train", "x", {**r.params, "procs_per_node": 4, "intra_link": "pcie3"},
    ...                  (), 1.0))
    'train      4 nodes x 4  batch 64   1gbit    repeat 0  pcie3 inside a node'
    """
    p = run.params
    plural = "s" if p["nodes"] != 1 else " "
    head = f"{run.kind:<9} {p['nodes']:>2} node{plural} x {p['procs_per_node']}"
    rate = format_rate(p["bandwidth_mbit"])
    # what the run trains on, where it is not the CPUs over TCP
    where = (f"  {p['device']} {p.get('fabric') or 'tcp'}"
             if p.get("device") == "cuda" and not p.get("accelerator") else "")
    # what a variant axis may change, where not the default: precision, memory format and
    # communication settings
    comm = ([str(p["precision"])] if p.get("precision") not in (None, "fp32") else []) + \
        (["channels_last"] if p.get("channels_last") else []) + \
        ([comm_label(p, " ")] if comm_label(p) else [])
    where += f"  {' '.join(comm)}" if comm else ""
    where += "  in a container" if p.get("runtime") == "container" else ""
    where += f"  {p['intra_link']} inside a node" if p.get("intra_link") else ""
    if run.kind == "allreduce":
        sizes = run.allreduce_sizes
        span = f"{_size_text(sizes[0])}..{_size_text(sizes[-1])}" if sizes else "-"
        return f"{head}  {'probe':<9}  {rate:<8} sizes {span}{where}"
    if p.get("global_batch_size"):
        return (f"{head}  global batch {p['global_batch_size']} ({p['batch_size']}/worker)  "
                f"{rate:<8} repeat {p['repeat']}{where}")
    return f"{head}  batch {p['batch_size']:<3}  {rate:<8} repeat {p['repeat']}{where}"


def new_sweep_id(now: datetime, suffix: str | None = None) -> str:
    """Sortable, unique sweep id: UTC time to the second plus 4 random hex digits.

    >>> new_sweep_id(datetime(2026, 11, 21, 15, 30, tzinfo=UTC), "ab12")
    '20261121-153000-ab12'
    """
    if now.tzinfo is not None:
        now = now.astimezone(UTC)
    suffix = secrets.token_hex(2) if suffix is None else suffix
    if not re.fullmatch(r"[0-9a-z]{1,8}", suffix):
        raise InputError(f"sweep id suffix {suffix!r} must be 1-8 lowercase letters or digits")
    return f"{now:%Y%m%d-%H%M%S}-{suffix}"
