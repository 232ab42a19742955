"""Every setting of a sweep, declared once.

An entry of SETTINGS is all scalelab knows about a setting: its sweep-file key (the bench
option is the key with dashes), how its value is parsed, its default and help, whether it is a
variant axis (every value planned as its own runs), the runs.jsonl params key it is recorded
under, the run-id segment of a variant value, the results.csv column, and what a store written
before the setting existed reads as. From the table come SweepSpec, the sweep-file keys, the
options and help of invoke bench, the recorded params (RunParams), the run-id tags of variant
axes, the CSV columns of settings and the upgrade of older stores.

Adding a variant axis is one entry here (with `since` = the next STORE_VERSION) and its use
where the workload reads it; tests/test_settings.py adds a made-up one and follows it through.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scalelab.core.errors import InputError
from scalelab.model import accel
from scalelab.model.comm import COMM_DEFAULTS, COMPRESSIONS
from scalelab.model.networks import MODELS
from scalelab.sweep import values
from scalelab.sweep.setting import Planned, Setting
from scalelab.sweep.values import SYNTHETIC

ENGINES = ("ddp", "horovod", "ps")
# where a parameter server's shards are summed: on K nodes of their own, after the run's
# nodes (BytePS's CPU servers), or one on every worker node beside its ranks
PS_PLACEMENTS = ("dedicated", "colocated")
SWITCHES = ("on", "off")
LAUNCHERS = ("ssh", "slurm")
RUNTIMES = ("host", "container")  # where ranks run: on the node, or in the training image
# fp32: true FP32 (TF32 off, which Ampere and Hopper convolutions use by default); tf32: TF32
# on; amp: fp16 autocast with loss scaling on GPUs (bfloat16 on CPUs); bf16: bfloat16 autocast
PRECISIONS = ("fp32", "tf32", "amp", "bf16")
# the convolutions' memory layout: torch's default (NCHW), or NHWC (faster on tensor cores)
MEMORY_FORMATS = ("contiguous", "channels_last")
DEVICES = ("auto", "cuda", "cpu")  # auto: cuda on nodes with GPUs, never CPU there
FABRICS = ("auto", "tcp", "rdma")  # auto: rdma where every node has an active port, unshaped
PIN_MEMORY = ("auto", "on", "off")
KINDS = ("train", "allreduce")
# how a checkpoint blocks training: until its files are written (sync), or while the state is
# copied to host memory, the files written in the background (async: DCP's async_save)
CHECKPOINT_MODES = ("sync", "async")
CHECKPOINT_ENGINES = ("ddp", "horovod")  # the parameter servers' state is not saved yet
FAILURE_ENGINES = ("ddp", "horovod")  # what brings them back: torchrun's agents, Horovod elastic


def _num_tag(value: float) -> str:
    return f"{value:g}".replace(".", "p")


def _comm_before(key: str, engines: tuple[str, ...]) -> Callable[[Mapping[str, Any]], Any]:
    """A run from before the communication axes ran at its engine's default; an allreduce
    probe (no batch size) and a run of an engine without the setting have none."""

    def before(params: Mapping[str, Any]) -> Any:
        if "batch_size" in params and params.get("batch_size") is None:
            return None
        return COMM_DEFAULTS[key] if params.get("engine") in engines else None
    return before


def _comm(key: str, tag: str, engines: tuple[str, ...], example: str, help: str) -> Setting:
    return Setting(key, key, "list[float] | None",
                   lambda x, w: values.positive_list(x, w, example), None, help, variant=True,
                   engines=engines, single=COMM_DEFAULTS[key],
                   tag=lambda x: tag + _num_tag(x), tag_lone=True, series=False, record=key,
                   column=key, since=5, before=_comm_before(key, engines))


def _checkpoint_before(value: Any) -> Callable[[Mapping[str, Any]], Any]:
    """A train run from before checkpoints saved none (0 for the interval, None for the rest);
    an allreduce probe and a parameter-server run have none."""

    def before(params: Mapping[str, Any]) -> Any:
        if params.get("batch_size") is None or params.get("engine") not in CHECKPOINT_ENGINES:
            return None
        return value
    return before


def _checkpoints_on(combo: Mapping[str, Any]) -> bool:
    return bool(combo.get("checkpoint_every"))


def _check_checkpoint_settings(spec: Any) -> None:
    """A checkpoint setting without --checkpoint-every above 0 asks for nothing: refused. A
    node's NFS server ends with the sweep, so what it holds cannot be kept."""
    served = next((p for p in spec.checkpoint_to or [] if values.served_by(p)), None)
    if any(spec.checkpoint_every or []) and spec.keep_checkpoints and served:
        raise InputError(f"--keep-checkpoints: the NFS server of --checkpoint-to {served} ends "
                         "with the sweep, and its checkpoints with it; keep them on nodes or a "
                         "path the nodes mount, or drop --keep-checkpoints")
    if any(spec.checkpoint_every or []):
        return
    given = [k for k, v in (("checkpoint-mode", spec.checkpoint_mode),
                            ("checkpoint-to", spec.checkpoint_to),
                            ("keep-checkpoints", spec.keep_checkpoints)) if v]
    if given:
        raise InputError(f"--{given[0]} applies to runs that save checkpoints; add "
                         "--checkpoint-every N (steps between checkpoints), or drop it")


def _check_failure_settings(spec: Any) -> None:
    """A failure scalelab can inject and restart from: on a node of every run, after a timed
    step the runs still have steps past; Horovod's runs on 2 nodes or more."""
    for f in [f for f in spec.inject_failure or [] if f != values.NO_FAILURE]:
        fail = values.failure(f)
        k = fail.node
        if k is not None and k >= min(spec.nodes):
            raise InputError(f"--inject-failure {f}: node {k} is past the {min(spec.nodes)} "
                             f"node(s) of the smallest run (0 is the first); choose a node "
                             f"below {min(spec.nodes)}, or leave @{k} out (a node at random)")
        if spec.engine == "horovod" and min(spec.nodes) < 2:
            raise InputError(f"--inject-failure {f}: Horovod's elastic driver brings a run back "
                             "with its other nodes and needs 2 or more, and the sweep has a "
                             f"{min(spec.nodes)}-node run; start --nodes at 2, or use "
                             "--engine ddp (torchrun restarts a lone node)")
        if fail.step is not None and fail.step >= spec.steps:
            raise InputError(f"--inject-failure {f}: the runs have {spec.steps} timed steps, and "
                             "a failure needs steps after it to recover into; choose a step "
                             f"below {spec.steps}, or raise --steps")


def _place_tag(place: str) -> str:
    """nodes: cknodes; a path or a node's server: ckp and a short hash of it (run ids stay
    short and safe)."""
    if place == values.NODE_DISKS:
        return "cknodes"
    return "ckp" + hashlib.sha1(place.encode()).hexdigest()[:6]


def _data_tag(source: str) -> str:
    """A data source's run-id segment: syn, or d and six hex digits of its text (two paths may
    share a last name)."""
    if source == SYNTHETIC:
        return "syn"
    return "d" + hashlib.sha1(source.encode()).hexdigest()[:6]


def check_emulation(spec: Any, image_size: int,
                    per_worker: Sequence[int] | None = None) -> None:
    """An emulated accelerator must have a usable profile for every batch size per worker (the
    spec's, or per_worker: those the plan's global batches split into): InputError otherwise,
    before anything runs."""
    for precision in spec.precisions:
        for batch in spec.batch_sizes if per_worker is None else per_worker:
            for fmt in spec.memory_formats:
                accel.resolve(spec.accelerator, spec.model, precision, batch, image_size,
                              channels_last=fmt == "channels_last")


def _check_accelerator(spec: Any) -> None:
    """A profile that cannot serve every planned batch size is refused before any cluster."""
    if spec.accelerator:
        check_emulation(spec, spec.image_size or MODELS[spec.model].image_size)


def _check_intra_link(spec: Any) -> None:
    if spec.intra_link and not spec.accelerator:
        raise InputError(f"--intra-link {spec.intra_link}: the path between the GPUs of a "
                         "node is emulated for emulated GPUs only; add --accelerator (a real "
                         "node's GPUs already are the path), or leave --intra-link out")


SETTINGS: tuple[Setting, ...] = (
    # the layout of each run: what is swept over the cluster
    Setting("nodes", "nodes", "list[int]", lambda x, w: values.int_list(x, w), dataclasses.MISSING,
            "node counts to sweep: 4, 1-10, 1,2,4,8 or 1-16:2"),
    # None: the GPUs torch sees per node on GPU nodes, 1 elsewhere (scalelab.cluster.gpu)
    Setting("procs_per_node", "procs_per_node", "list[int] | None",
            lambda x, w: values.int_list(x, w), None,
            "ranks per node (GPUs per node on GPU clusters), e.g. 1,4,8"),
    Setting("batch_size", "batch_sizes", "list[int]", lambda x, w: values.int_list(x, w),
            dataclasses.MISSING,
            "per-worker batch sizes, e.g. 32,64,96 (weak scaling: each rank keeps its batch)"),
    # strong scaling: global batches split over each run's ranks (beside or instead of
    # batch_size); each run is one or the other and is reported as what it is
    Setting("global_batch_size", "global_batch_sizes", "list[int] | None",
            lambda x, w: values.int_list(x, w), None,
            "global batch sizes split evenly over each run's ranks, e.g. 256 (strong scaling; "
            "beside or instead of --batch-size)"),
    Setting("bandwidth", "bandwidths", "list[float | None]", values.rates, [None],
            "link rates to sweep, e.g. 1gbit,10gbit (native = unshaped)"),
    # the workload
    Setting("model", "model", "str", lambda x, w: values.choice(x, w, list(MODELS)), "resnet50",
            "resnet18/34/50/101/152 (ImageNet) or resnet20/32/44/56 (CIFAR-style)",
            record="model"),
    Setting("engine", "engine", "str", lambda x, w: values.choice(x, w, ENGINES), "ddp",
            "ddp (torchrun; on the local target ranks are forked from a per-node server that "
            "has torch imported), horovod (horovodrun) or ps (synchronous parameter servers "
            "over torch.distributed, started by torchrun)", record="engine"),
    Setting("steps", "steps", "int", lambda x, w: values.one_int(x, w, 1), 30,
            "timed training steps per run (after warm-up)", record="steps"),
    Setting("warmup", "warmup", "int", lambda x, w: values.one_int(x, w, 0), 5,
            "untimed training steps before the timed ones", bench=False, record="warmup"),
    # None: the model's own (MODELS); recorded as the size the run used
    Setting("image_size", "image_size", "int | None", lambda x, w: values.one_int(x, w, 8), None,
            "input images' side in pixels (default: the model's own)", bench=False,
            record="image_size"),
    # variant axes: every value its own runs (the product in this order), named in the run id
    Setting("precision", "precisions", "list[str]",
            lambda x, w: values.choice_list(x, w, PRECISIONS), ["fp32"],
            "precisions to sweep: fp32 (TF32 off), tf32, amp (fp16 with loss scaling), "
            "bf16, or several, e.g. fp32,amp; tf32 and amp need GPUs",
            variant=True, single="fp32", tag=str, series=False, record="precision"),
    Setting("memory_format", "memory_formats", "list[str]",
            lambda x, w: values.choice_list(x, w, MEMORY_FORMATS), ["contiguous"],
            "memory formats to sweep: contiguous (NCHW, the default), channels_last (NHWC), or "
            "contiguous,channels_last", variant=True, single="contiguous",
            tag=lambda x: "nhwc" if x == "channels_last" else "nchw", series=False,
            record="channels_last", to_record=lambda x: x == "channels_last", since=3,
            before=False),
    # the switch of before memory_format became an axis: true is memory_format channels_last
    Setting("channels_last", "memory_formats", "list[str]",
            lambda x, w: ["channels_last" if values.flag(x, w) else "contiguous"], None,
            "NHWC memory format (faster convolutions on tensor cores); the same as "
            "--memory-format channels_last", switch=False, alias_of="memory_format"),
    # communication settings: each engine has its own (an engine without one records None)
    _comm("bucket_cap_mb", "bk", ("ddp", "ps"), "25,50",
          "DDP's gradient bucket sizes in MB to sweep, e.g. 10,25,50 (default 25, torch's "
          "own); with --engine ps the buckets pushed to the servers"),
    _comm("fusion_threshold_mb", "fu", ("horovod",), "64,128",
          "Horovod fusion thresholds in MB to sweep, e.g. 32,128 (HOROVOD_FUSION_THRESHOLD; "
          "default 128, Horovod's own)"),
    _comm("cycle_time_ms", "ct", ("horovod",), "1,5",
          "Horovod cycle times in ms to sweep, e.g. 1,5 (HOROVOD_CYCLE_TIME; default 1, "
          "Horovod's own)"),
    dataclasses.replace(
        _comm("compression", "", ENGINES, "", ""), type="list[str] | None",
        parse=lambda x, w: values.choice_list(x, w, COMPRESSIONS), tag=str,
        help="gradient compression to sweep: none, fp16 or none,fp16 (DDP: the fp16 compress "
             "hook's cast; Horovod: hvd.Compression.fp16)"),
    # the parameter-server engine's layout: each names its own series beside the ring's
    Setting("ps_placement", "ps_placement", "list[str] | None",
            lambda x, w: values.choice_list(x, w, PS_PLACEMENTS), None,
            "--engine ps: where the servers run, to sweep: dedicated (K nodes of their own "
            "after the run's nodes, as BytePS's CPU servers) or colocated (one on every "
            "worker node), e.g. dedicated,colocated (default dedicated)",
            variant=True, engines=("ps",), single="dedicated", tag=lambda x: f"ps{x[:3]}",
            tag_lone=True, record="ps_placement", column="ps_placement", since=11),
    Setting("ps_servers", "ps_servers", "list[int] | None",
            lambda x, w: values.int_list(x, w, 1), None,
            "--engine ps with dedicated servers: server counts K to sweep, e.g. 1,2,4 (each "
            "on a node of its own; default 1)", variant=True, engines=("ps",), single=1,
            tag=lambda x: f"k{x}", tag_lone=True,
            applies=lambda combo: combo.get("ps_placement") == "dedicated",
            record="ps_servers", column="ps_servers", since=11),
    Setting("ps_overlap", "ps_overlap", "list[str] | None",
            lambda x, w: values.choice_list(x, w, SWITCHES), None,
            "--engine ps: push each bucket during backward as soon as its gradients are "
            "ready (on, the default) or all after backward (off), to sweep, e.g. on,off",
            variant=True, engines=("ps",), single="on", tag=lambda x: f"ov{x}", tag_lone=True,
            record="ps_overlap", column="ps_overlap", since=11),
    # checkpoints (docs/failures.md): every N timed steps, how, and where
    Setting("checkpoint_every", "checkpoint_every", "list[int] | None",
            lambda x, w: values.int_list(x, w, 0), None,
            "save the run's state (PyTorch Distributed Checkpoint) every N timed steps, to "
            "sweep, e.g. 0,5,10 (0, the default: never); its blocking time is left out of the "
            "steps' and recorded on its own", variant=True, engines=CHECKPOINT_ENGINES,
            single=0, tag=lambda x: f"ck{x}", tag_lone=True, record="checkpoint_every",
            column="checkpoint_every", since=12, before=_checkpoint_before(0)),
    Setting("checkpoint_mode", "checkpoint_mode", "list[str] | None",
            lambda x, w: values.choice_list(x, w, CHECKPOINT_MODES), None,
            "with --checkpoint-every: sync (training waits for the files) or async (only for "
            "the copy to host memory; DCP's async_save), to sweep, e.g. sync,async (default "
            "sync)", variant=True, engines=CHECKPOINT_ENGINES, single="sync",
            tag=lambda x: f"ck{x}", tag_lone=True, applies=_checkpoints_on,
            record="checkpoint_mode", column="checkpoint_mode", since=12,
            before=_checkpoint_before(None)),
    Setting("checkpoint_to", "checkpoint_to", "list[str] | None", values.checkpoint_places, None,
            "with --checkpoint-every: nodes (each node's own disk, the default), an absolute "
            "path every node sees (e.g. an NFS mount) or nfs@NODE (an NFS server scalelab runs "
            "on that node of the cluster for the sweep), to sweep, e.g. nodes,nfs@lab-n3; a "
            "run's checkpoints are removed after it", variant=True,
            engines=CHECKPOINT_ENGINES, single=values.NODE_DISKS, tag=_place_tag, tag_lone=True,
            applies=_checkpoints_on, record="checkpoint_to", column="checkpoint_to", since=12,
            before=_checkpoint_before(None)),
    Setting("keep_checkpoints", "keep_checkpoints", "bool", values.flag, False,
            "keep every run's last checkpoint where it was written, until you remove it "
            "(default: removed after the run)", switch=False,
            record="keep_checkpoints", since=12, before=False,
            check=_check_checkpoint_settings),
    # failures on purpose (docs/checkpoints.md): one node's ranks killed, the run restarted
    Setting("inject_failure", "inject_failure", "list[str] | None", values.failures, None,
            "kill a node's ranks, to sweep: off (the default), STEP (after that timed step, the "
            "node at random), Ns (after N seconds of training on average, at random, again and "
            "again, a node at random each time) or either with @K (the run's K-th node, 0 the "
            "first), e.g. off,12,60s; the ranks come back through torchrun's agents (ddp), "
            "Horovod's elastic driver (horovod, runs of 2 nodes or more) or a new job step "
            "(ddp under --launcher slurm) and go on from the last checkpoint",
            variant=True, engines=FAILURE_ENGINES, single=values.NO_FAILURE,
            tag=lambda x: "f" + x.replace("@", "n"), tag_lone=True, record="inject_failure",
            column="inject_failure", since=13,
            before=lambda p: values.NO_FAILURE if p.get("engine") in FAILURE_ENGINES
            and p.get("batch_size") is not None else None, check=_check_failure_settings),
    # a data source per value: where the ranks' batches come from (sources, docs/data.md)
    Setting("data", "data", "list[str]", values.data, [SYNTHETIC],
            "data sources to sweep: synthetic (the default), an absolute path on the nodes "
            "(class folders or tar shards, e.g. /data/imagenet), or tar shards at an http:// "
            "or nfs:// URL (invoke stage prints one), or several, comma-separated",
            variant=True, single=SYNTHETIC, tag=_data_tag, series=False, record="data",
            column="data"),
    # None: the storage node's link at the cluster's rate
    Setting("storage_bandwidth", "storage_bandwidths", "list[float | None] | None", values.rates,
            None, "with shards a node outside the run serves (invoke stage --to http): that "
            "node's link rates to sweep, e.g. 20mbit,1gbit (default: the cluster's rate)",
            variant=True, single=None, tag=lambda x: "st" + _num_tag(x), tag_lone=True,
            applies=lambda combo: combo.get("data") != SYNTHETIC,
            record="storage_bandwidth_mbit", column="storage_bandwidth_mbit", since=10,
            before=None),
    # the input pipeline of real data: axes of real-data runs only (a synthetic run records
    # the first value, as it did before these were axes)
    Setting("loader_workers", "loader_workers", "list[int]",
            lambda x, w: values.int_list(x, w, 0), [2],
            "real data (--data): DataLoader workers per rank to sweep, e.g. 1,2,4 (default 2)",
            variant=True, single=2, tag=lambda x: f"lw{x}", series=False,
            applies=lambda combo: combo.get("data") != SYNTHETIC, unapplied_first=True,
            record="loader_workers", column="loader_workers", since=3, before=Planned(2)),
    Setting("pin_memory", "pin_memory", "list[str]",
            lambda x, w: values.choice_list(x, w, PIN_MEMORY), ["auto"],
            "real data: pinned host memory for batches to sweep, on, off or auto (on when the "
            "ranks train on GPUs), e.g. on,off", variant=True, single="auto",
            tag=lambda x: f"pin{x}", series=False,
            applies=lambda combo: combo.get("data") != SYNTHETIC, unapplied_first=True,
            record="pin_memory", since=3, before=Planned("auto")),
    # emulation: accelerators and the links between them
    Setting("accelerator", "accelerator", "str | None", values.accelerator, None,
            "emulate this GPU on every rank (v100, a100, h100, or a profile .json from invoke "
            "profile): real gradients over the real links, compute from the profile",
            record="accelerator", column="accelerator", since=2, before=None,
            check=_check_accelerator),
    # None: the driver picks k per link rate and records the k it chose
    Setting("dilation", "dilation", "float | None", values.dilation, None,
            "time dilation k with --accelerator (a number >= 1, or auto: the smallest k the "
            "host keeps up with)", record="dilation", since=2, before=None),
    Setting("fabric_profile", "fabric_profile", "str", values.fabric_profile, "ideal",
            "what an allreduce achieves on the fabric: ethernet-tcp or rdma (shaped links "
            "carry its share of the line rate, sourced in bench/fabrics/, and the model uses "
            "it) or ideal (the default: the line rate as tc gives it)",
            record="fabric_profile", column="fabric_profile", since=7, before="ideal"),
    # None: each node's loopback unshaped, which the model takes as free
    Setting("intra_link", "intra_link", "str | None", values.intra_link, None,
            "with --accelerator and --procs-per-node 2 or more on a local cluster: the path "
            "between the GPUs of one node, pcie3, pcie4, nvlink-v100 or a rate such as 64gbit "
            "(each node's loopback is shaped to it and the model takes it; default: unshaped, "
            "taken as free)", record="intra_link", column="intra_link", since=8, before=None,
            check=_check_intra_link),
    # where and how the ranks run
    # recorded resolved from the nodes' facts (never auto)
    Setting("device", "device", "str", lambda x, w: values.choice(x, w, DEVICES), "auto",
            "cuda, cpu or auto (default: cuda on nodes with GPUs, never their CPUs)",
            record="device", since=3, before=Planned("cpu")),
    Setting("fabric", "fabric", "str", lambda x, w: values.choice(x, w, FABRICS), "auto",
            "tcp, rdma or auto (default: rdma where every node has an active RDMA port and no "
            "rate is shaped; a shaped rate is always tcp)",
            record="fabric", since=3, before=Planned("tcp")),
    Setting("runtime", "runtime", "str", lambda x, w: values.choice(x, w, RUNTIMES), "host",
            "host (ranks on the nodes) or container (every rank in a container of the "
            "training image: invoke image, then invoke configure --image)",
            record="runtime", column="runtime", since=4, before=Planned("host")),
    # None: the cluster's default (ssh where scalelab reaches the nodes, slurm behind a login)
    Setting("launcher", "launcher", "str | None", lambda x, w: values.choice(x, w, LAUNCHERS), None,
            "ssh (ranks started over SSH) or slurm (every run a Slurm job on the head node's "
            "Slurm; set it up with invoke configure --tags slurm)"),
    Setting("partition", "partition", "str | None", values.partition, None,
            "with --launcher slurm: the partition (default: the cluster's default one)"),
    # on nodes that share one host's cores: ranks are forked from a warm-start server with
    # torch imported (scalelab.run.warmstart); off: every rank starts its interpreter
    Setting("warm_start", "warm_start", "bool", values.flag, True,
            "on nodes that share one host's cores, fork ranks from warm-start servers with "
            "torch imported (default); --no-warm-start: every rank starts its own interpreter",
            switch=True),
    # repeats, probes and limits
    Setting("repeats", "repeats", "int", lambda x, w: values.one_int(x, w, 1), 3,
            "repeats of every configuration (3 gives a 95% confidence interval)"),
    Setting("timeout_s", "timeout_s", "float", values.seconds, 900.0,
            "seconds a run may take, launch to exit, before it is ended (and its Slurm job "
            "cancelled)", cli="timeout"),
    Setting("allreduce_probe", "allreduce_probe", "bool", values.flag, True,
            "one allreduce probe per link rate, node count and ranks per node", bench=False),
    Setting("netprobe", "netprobe", "bool", values.flag, True,
            "measure each link rate once it is set (link_mbit_measured)", bench=False),
    # up to 256 MB: NCCL reaches its bus bandwidth only with messages this large
    Setting("allreduce_sizes", "allreduce_sizes", "list[int]", values.sizes,
            [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20],
            "allreduce probe message sizes, e.g. 4K,64K,1M,16M,256M (the default: NCCL "
            "reaches its bus bandwidth only near 256M)"),
    Setting("allreduce_iters", "allreduce_iters", "int", lambda x, w: values.one_int(x, w, 1), 10,
            "timed allreduces per message size of a probe (its params' steps)", bench=False),
    # what the report adds
    Setting("description", "description", "str", lambda x, w: str(x).strip(), "",
            "one line on what the sweep is for, kept in sweep.json's plan", bench=False),
    # the report then tables the cost per million images across node count x link rate
    Setting("price_per_node_hour", "price_per_node_hour", "float | None", values.price, None,
            "what a node-hour costs (any currency): the report adds the cost per million "
            "images across node count x link rate"),
)

BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}
# The store's schema version. 1-8 were never written down: a store without "schema_version"
# in sweep.json is read as the version its params' keys say (store_version_of). 9 is the first
# that says its version; a setting declared with a later `since` makes that the version.
STORE_VERSION = max([9, *(s.since for s in SETTINGS)])
FILE_KEYS = tuple(BY_KEY)
VARIANTS = tuple(s for s in SETTINGS if s.variant)

# params keys the planner fills from a run's layout rather than from one setting: the layout
# (nodes x procs per node, the batch of each rank or the global one, the link rate, the
# repeat) and the intra-node path's rate; with the store version that added each and what an
# older store reads as
LAYOUT_RECORD: tuple[tuple[str, int, Any, str], ...] = (
    ("nodes", 1, None, "the run's node count (the first nodes of the cluster, head first)"),
    ("procs_per_node", 1, None, "ranks per node"),
    ("world_size", 1, None, "nodes x procs_per_node"),
    ("batch_size", 1, None, "each rank's batch (null for an allreduce probe)"),
    ("bandwidth_mbit", 1, None, "the link rate in Mbit/s (null: native, unshaped)"),
    ("repeat", 1, None, "the repeat of the configuration, from 0"),
    ("global_batch_size", 6, None, "a strong-scaling run's global batch, split evenly over "
     "its ranks (batch_size is its share); null for a batch per worker and for probes"),
    ("intra_mbit", 8, None, "the intra-node path's Mbit/s per ring edge (null: unshaped)"))


@dataclass(frozen=True)
class Recorded:
    """One key of a run's params: the store version that added it and what an older store
    reads as (see Setting.before)."""

    key: str
    since: int
    before: Any
    doc: str
    setting: Setting | None = None

    def old_value(self, params: Mapping[str, Any]) -> Any:
        if self.setting is not None:
            return self.setting.old_value(params)
        return self.before


def _record_schema() -> tuple[Recorded, ...]:
    keys = [Recorded(*entry) for entry in LAYOUT_RECORD]
    keys += [Recorded(s.record, s.since, s.before, s.help, s) for s in SETTINGS if s.record]
    return tuple(sorted(keys, key=lambda r: r.since))  # stable: the table's order per version


RECORD = _record_schema()
PARAM_KEYS = tuple(r.key for r in RECORD)  # a run's params, in the order they are written


def _spec_field(s: Setting) -> tuple[str, Any, Any]:
    if s.default is dataclasses.MISSING:
        return (s.field, s.type, dataclasses.field())
    if isinstance(s.default, list):
        return (s.field, s.type, dataclasses.field(default_factory=lambda d=s.default: list(d)))
    return (s.field, s.type, dataclasses.field(default=s.default))


def _spec_class() -> type:
    fields = [_spec_field(s) for s in SETTINGS if not s.alias_of]
    fields.sort(key=lambda f: f[2].default is not dataclasses.MISSING
                or f[2].default_factory is not dataclasses.MISSING)  # required ones first
    cls = dataclasses.make_dataclass(
        "SweepSpec", fields, frozen=True, namespace={
            "__doc__": "The axes and fixed settings of a sweep, validated and in canonical "
                       "units: one attribute per entry of scalelab.sweep.settings.SETTINGS."})
    cls.__module__ = __name__
    return cls


SweepSpec: Any = _spec_class()


def _params_class() -> type:
    cls = dataclasses.make_dataclass(
        "RunParams", [(r.key, Any) for r in RECORD], frozen=True, namespace={
            "__doc__": "A run's params as runs.jsonl holds them (PARAM_KEYS; RunParams.of "
                       "reads a record of any store version).",
            "of": classmethod(lambda cls, p: cls(**upgrade_params(p)))})
    cls.__module__ = __name__
    return cls


def upgrade_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A record's params as this version writes them: each key an older store lacks is what
    that store ran at (Setting.before), in PARAM_KEYS order; keys of no setting are dropped.

    >>> p = upgrade_params({"nodes": 2, "engine": "ddp", "batch_size": 32})
    >>> p["bucket_cap_mb"], p["fusion_threshold_mb"], p["fabric_profile"], p["runtime"]
    (25.0, None, 'ideal', 'host')
    """
    return {r.key: params[r.key] if r.key in params else r.old_value(params) for r in RECORD}


RunParams: Any = _params_class()


def store_version_of(params: Mapping[str, Any]) -> int:
    """The store version whose runs recorded exactly these params keys (a store from before
    versions were written): the newest version whose keys are all there.

    >>> store_version_of({"nodes": 1}), store_version_of({"nodes": 1, "fabric_profile": "x",
    ...                                                  "accelerator": None})
    (1, 7)
    """
    present = {r.since for r in RECORD if r.key in params}
    return max(present | {1})


def variant_values(spec: Any) -> list[dict[str, Any]]:
    """Every combination of the variant axes a train run of spec takes, {key: value}, the
    product in table order (the first axis outermost)."""
    combos: list[dict[str, Any]] = [{}]
    for s in VARIANTS:
        combos = [{**c, s.key: x} for c in combos
                  for x in (s.planned_values(spec) if s.applies is None or s.applies(c)
                            else s.planned_values(spec)[:1] if s.unapplied_first else [None])]
    return combos


def variant_tag(spec: Any, combo: Mapping[str, Any]) -> str:
    """The run-id segment of one combination: a value where its axis has several, or (tag_lone)
    where a lone one is not the default; "" where neither, so run ids stay those of sweeps from
    before an axis."""
    parts = []
    for s in VARIANTS:
        x = combo.get(s.key)
        if x is None or s.tag is None or (s.applies is not None and not s.applies(combo)):
            continue
        several = len(getattr(spec, s.field) or []) > 1
        if several or (s.tag_lone and x != s.single):
            parts.append(s.tag(x))
    return "-".join(parts)


def variant_record(combo: Mapping[str, Any]) -> dict[str, Any]:
    """A combination as params (each axis under its record key, as recorded)."""
    return {BY_KEY[k].record: BY_KEY[k].recorded(x) for k, x in combo.items()
            if BY_KEY[k].record}


def series_label(params: Mapping[str, Any]) -> str:
    """The variant settings of a run that name their own series (Setting.series) where they
    differ from what runs before them had: "key value" each, or "" for none."""
    parts = []
    for s in VARIANTS:
        if not (s.series and s.record):
            continue
        x = params.get(s.record)
        if x is not None and x != s.old_value(params) and not (isinstance(x, float)
                                                               and math.isnan(x)):
            parts.append(f"{s.key.replace('_', ' ')} {x}")
    return ", ".join(parts)


def check_engine(spec: Any) -> None:
    """A variant setting the sweep's engine does not have is refused (InputError)."""
    for s in VARIANTS:
        if s.engines and getattr(spec, s.field) and spec.engine not in s.engines:
            other = " or ".join(s.engines)
            raise InputError(f"--{s.key.replace('_', '-')} is a setting of --engine {other}; "
                             f"this sweep's engine is {spec.engine}: drop it or use --engine "
                             f"{s.engines[0]}")


def params_table() -> str:
    """The store contract's table of a run's params (docs/dev/CONTRACTS.md holds it between
    its markers; scripts/gen_contract_params.py writes it there)."""
    rows = ["| params key | since store version | a store before it reads as | setting | "
            "what it is |", "|---|---|---|---|---|"]
    for r in RECORD:
        s = r.setting
        if s is not None and isinstance(s.before, Planned):
            old = f"as the plan says ({s.before.value!r} alone)"
        elif s is not None and callable(s.before):
            old = "the engine's default (null where the engine lacks it, and in probes)"
        else:
            old = json.dumps(r.before)
        where = "" if s is None else (f"`--{s.option.replace('_', '-')}`" if s.bench
                                      else f"`{s.key}:` (sweep files)")
        rows.append(f"| `{r.key}` | {r.since} | "
                    f"{old if r.since > 1 else '-'} | {where} | {r.doc} |")
    return "\n".join(rows) + "\n"


def check_spec(spec: Any) -> None:
    """Every static check of a spec, in one pass: a variant setting its engine does not have,
    then each setting's own (Setting.check). InputError for the first that fails."""
    check_engine(spec)
    for s in SETTINGS:
        if s.check is not None:
            s.check(spec)
