"""Sweep planning: options or a sweep file -> a validated, ordered list of runs.

Pure apart from reading the sweep file: no SSH, no clock, no randomness unless passed in.
Execution and resume live with the caller; the store of record is scalelab.results.store.

Vocabulary:
  batch size   per process (per GPU), as in Horovod's and tf_cnn_benchmarks' figures, so a
               run's global batch is batch_size * world_size (weak scaling);
  steps        timed training steps per run, after `warmup` untimed ones;
  repeat       the same configuration run again, 0-based in run ids and records.

Order of runs (plan()):
  bandwidth -> repeat -> nodes -> procs_per_node -> batch size -> the variant axes
  (precision, memory format, communication settings: scalelab.sweep.settings.VARIANTS).
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

>>> from scalelab.sweep.sweepfile import spec_from_options
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from scalelab.cluster import gpu
from scalelab.cluster.nodes import Node, sort_nodes
from scalelab.core.errors import InputError
from scalelab.core.units import format_rate
from scalelab.model import fabric
from scalelab.model.comm import comm_label
from scalelab.model.networks import MODELS
from scalelab.sweep import memory, starts
from scalelab.sweep.settings import (
    PARAM_KEYS,
    SETTINGS,
    VARIANTS,
    SweepSpec,
    check_emulation,
    series_label,
    variant_record,
    variant_tag,
    variant_values,
)
from scalelab.sweep.values import SYNTHETIC

log = logging.getLogger(__name__)


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


def allreduce_run_id(nodes: int, ppn: int, mbit: float | None) -> str:
    """Id of an allreduce probe; one per (nodes, procs_per_node, bandwidth).

    >>> allreduce_run_id(4, 1, None)
    'allreduce-n04-p1-native'
    """
    return f"allreduce-n{nodes:02d}-p{ppn}-{_rate_tag(mbit)}"


def server_nodes(params: Mapping[str, Any]) -> int:
    """The nodes a run's dedicated parameter servers take, after the run's own (0 for a run
    of another engine or with its servers colocated).

    >>> server_nodes({"engine": "ps", "ps_placement": "dedicated", "ps_servers": 2})
    2
    >>> server_nodes({"engine": "ps", "ps_placement": "colocated", "ps_servers": None})
    0
    """
    if params.get("engine") != "ps" or params.get("ps_placement") != "dedicated":
        return 0
    return int(params.get("ps_servers") or 0)


def ps_servers(params: Mapping[str, Any]) -> int:
    """The parameter servers a run asks for: K dedicated, or one a worker node (0: not ps).

    >>> ps_servers({"engine": "ps", "ps_placement": "colocated", "nodes": 3})
    3
    """
    if params.get("engine") != "ps":
        return 0
    return server_nodes(params) or int(params.get("nodes") or 0)


def _dedicated_servers(spec: SweepSpec) -> int:
    """The most server nodes any run of the sweep takes beside its own."""
    if spec.engine != "ps" or "dedicated" not in (spec.ps_placement or ["dedicated"]):
        return 0
    return max(spec.ps_servers or [1])


def _check_cluster(spec: SweepSpec, cluster_nodes: list[Node], can_shape: bool,
                   cluster: str) -> list[Node]:
    name = f"cluster {cluster}" if cluster else "the cluster"
    servers = _dedicated_servers(spec)
    if not cluster_nodes:
        raise InputError(f"{name} has no nodes; provision it with invoke provision "
                         f"--cluster {cluster or 'NAME'} --nodes {max(spec.nodes) + servers}")
    nodes = sort_nodes(list(cluster_nodes))
    target = nodes[0].target
    want = max(spec.nodes) + servers
    if servers and want > len(nodes):
        have = len(nodes)
        fits = [n for n in spec.nodes if n + servers <= have]
        fix_nodes = f"--nodes {format_int_list(fits)}" if fits else "fewer --ps-servers"
        raise InputError(
            f"--ps-servers {servers}: dedicated servers take nodes of their own after a run's, "
            f"so --nodes {format_int_list(spec.nodes)} needs {want} and {name} has {have}; "
            f"provision more with invoke provision --target {target} --cluster "
            f"{cluster or 'NAME'} --nodes {want} or use {fix_nodes}")
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
    return nodes[:want - servers]  # the ranks' nodes: a server's needs no GPU


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
        # checked when the spec was built (settings.check_spec)
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
    combos = variant_values(spec)
    intra = fabric.intra_link(spec.intra_link)
    # the fixed settings as every run records them: the spec's, with the device and fabric
    # resolved from the nodes and the intra-node path's rate
    recorded = {**fixed_record(spec), "device": placed.device, "fabric": placed.fabric,
                "intra_mbit": intra[1] if intra else None}
    runs: list[RunPlan] = []
    for mbit in spec.bandwidths:
        for repeat in range(spec.repeats):
            for n in spec.nodes:
                names = tuple(node.name for node in used[:n])
                for ppn in spec.procs_per_node:
                    common = {**recorded, "nodes": n, "procs_per_node": ppn,
                              "world_size": n * ppn}
                    if spec.allreduce_probe and repeat == 0 and n * ppn > 1:
                        # a probe reduces fp32 tensors; it carries the sweep's first
                        # precision because the emulation picks a rate's dilation from the
                        # first run at it (amp's casts cost passes), and the probe is first
                        # (an axis that was a lone setting records its first value, as then)
                        params = {**common,
                                  **{v.record: v.recorded(v.planned_values(spec)[0])
                                     if v.unapplied_first else None for v in VARIANTS},
                                  "precision": spec.precisions[0],
                                  "channels_last": False, "batch_size": None,
                                  "bandwidth_mbit": mbit, "repeat": 0,
                                  "steps": spec.allreduce_iters, "warmup": 1,
                                  "image_size": None, "data": None,
                                  "global_batch_size": None}
                        runs.append(RunPlan("allreduce", allreduce_run_id(n, ppn, mbit),
                                            _ordered(params), names, spec.timeout_s,
                                            tuple(spec.allreduce_sizes)))
                    for batch, global_batch in batches(spec, n * ppn):
                        for combo in combos:
                            params = {**common, **variant_record(combo), "batch_size": batch,
                                      "bandwidth_mbit": mbit, "repeat": repeat,
                                      "image_size": image, "global_batch_size": global_batch}
                            params["warmup"] = real_data_warmup(params)
                            rid = train_run_id(n, ppn, batch, mbit, repeat,
                                               variant_tag(spec, combo), global_batch)
                            runs.append(RunPlan("train", rid, _ordered(params), names,
                                                spec.timeout_s))
    return runs


# a DataLoader worker reads this many batches ahead of the steps (PyTorch's prefetch_factor)
PREFETCH_BATCHES = 2


def real_data_warmup(params: Mapping[str, Any]) -> int:
    """A train run's warm-up steps: the asked ones, and on real data at least enough to use
    up the batches its loaders read ahead while the ranks started, 4 a loader worker and 2
    more. Each worker holds 2 batches ready; where the input sets the pace a step uses about
    half a batch more than the workers read meanwhile, and the first steps are slow enough
    for them to fill up again. Timed steps that began with those batches ready ran faster
    than the storage gives (seen: 2.9-3.0 MB/s over a 2.5 MB/s link in 10 steps after 5).

    >>> real_data_warmup({"warmup": 5, "data": "synthetic", "loader_workers": 2})
    5
    >>> real_data_warmup({"warmup": 5, "data": "/d/shards", "loader_workers": 2})
    10
    >>> real_data_warmup({"warmup": 20, "data": "http://h/s-{0..3}.tar", "loader_workers": 0})
    20
    """
    asked = int(params.get("warmup") or 0)
    data = params.get("data")
    if not data or data == SYNTHETIC:
        return asked
    return max(asked, 2 * PREFETCH_BATCHES * max(int(params.get("loader_workers") or 0), 1) + 2)


def fixed_record(spec: SweepSpec) -> dict[str, Any]:
    """The settings every run of spec records as they are (not variant axes)."""
    return {st.record: getattr(spec, st.field) for st in SETTINGS
            if st.record and not st.variant}


def _ordered(params: dict[str, Any]) -> dict[str, Any]:
    return {k: params[k] for k in PARAM_KEYS}


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
    # any other variant axis whose value is not what runs before it had (settings.series_label)
    where += f"  {series_label(p)}" if series_label(p) else ""
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
