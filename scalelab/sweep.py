"""Sweep planning: options or a sweep file -> a validated, ordered list of runs.

Pure apart from reading the sweep file: no SSH, no clock, no randomness unless passed in.
Execution and resume live with the caller; the store of record is scalelab.store.

Vocabulary:
  batch size   per process (per GPU), as in Horovod's and tf_cnn_benchmarks' figures, so a
               run's global batch is batch_size * world_size (weak scaling);
  steps        timed training steps per run, after `warmup` untimed ones;
  repeat       the same configuration run again, 0-based in run ids and records.

Order of runs (plan()):
  bandwidth -> repeat -> nodes -> procs_per_node -> batch size.
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

>>> cluster = [Node(f"demo-n{i}", f"10.0.0.{i}", f"10.0.0.{i}", "head" if i == 0 else "worker",
...                 "local", cpus=1.0) for i in range(3)]
>>> spec = spec_from_options(nodes="1-2", batch_size="32", bandwidth="1gbit", repeats=2,
...                          model="resnet20")
>>> [r.run_id for r in plan(spec, cluster, can_shape=True)]  # doctest: +NORMALIZE_WHITESPACE
['train-n01-p1-b032-bw1000-r0', 'allreduce-n02-p1-bw1000', 'train-n02-p1-b032-bw1000-r0',
 'train-n01-p1-b032-bw1000-r1', 'train-n02-p1-b032-bw1000-r1']
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from scalelab import analysis, memory
from scalelab.errors import InputError
from scalelab.nodes import Node, sort_nodes
from scalelab.units import format_rate, parse_int_range, parse_rate_list, parse_size_bytes

log = logging.getLogger(__name__)

SWEEPS_DIR = Path(__file__).resolve().parent.parent / "bench" / "sweeps"


@dataclass(frozen=True)
class ModelInfo:
    """What planning needs to know about a model: input size, gradient size, work, memory."""

    image_size: int  # default input side in pixels
    params: int  # trainable parameters (fp32 gradient = 4 bytes each)
    gflops_fwd: float  # forward pass, GFLOP per image at image_size
    activation_bytes: int  # fp32 bytes saved for backward per image at image_size


# The one model registry, shared with the workloads that build the models (torchvision's
# ImageNet ResNets and He et al. (2016) CIFAR ResNets); see its "_about".
MODELS_FILE = Path(__file__).resolve().parent.parent / "bench" / "workloads" / "models.json"
MODELS: dict[str, ModelInfo] = {
    name: ModelInfo(r["image_size"], r["params"], r["gflops_fwd"], r["activation_bytes_per_image"])
    for name, r in json.loads(MODELS_FILE.read_text()).items() if not name.startswith("_")
}
ENGINES = ("ddp", "horovod")
PRECISIONS = ("fp32", "amp")
KINDS = ("train", "allreduce")
SYNTHETIC = "synthetic"

# the keys of runs.jsonl "params" (docs/dev/CONTRACTS.md), in contract order
PARAM_KEYS = ("nodes", "procs_per_node", "world_size", "model", "engine", "precision",
              "batch_size", "bandwidth_mbit", "repeat", "steps", "warmup", "image_size", "data")


@dataclass
class SweepSpec:
    """The axes and fixed settings of a sweep, validated and in canonical units."""

    nodes: list[int]
    batch_sizes: list[int]
    bandwidths: list[float | None] = field(default_factory=lambda: [None])  # Mbit/s, None=native
    procs_per_node: list[int] = field(default_factory=lambda: [1])
    model: str = "resnet50"
    engine: str = "ddp"
    precision: str = "fp32"
    repeats: int = 3  # enough for a confidence interval; sweep files for quick looks say 1
    steps: int = 30
    warmup: int = 5
    image_size: int | None = None  # None = the model's default (MODELS)
    data: str = SYNTHETIC  # or an absolute dataset path on the nodes
    timeout_s: float = 900.0  # per run, launch to exit
    allreduce_probe: bool = True  # one allreduce probe per (bandwidth, nodes, procs_per_node)
    netprobe: bool = True  # measure each link rate once it is set (link_mbit_measured)
    allreduce_sizes: list[int] = field(
        default_factory=lambda: [4 << 10, 64 << 10, 1 << 20, 16 << 20])
    allreduce_iters: int = 10  # timed allreduces per size (params "steps" of a probe)
    description: str = ""


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


# ------------------------------------------------------------------------------ value parsers

def _given(value: Any) -> bool:
    return value is not None and value != ""


def _one_int(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool):
        raise InputError(f"{what}: {value!r} is not a whole number")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        n = value
    else:
        text = str(value).strip()
        if not re.fullmatch(r"-?\d+", text):
            raise InputError(f"{what}: {value!r} is not a whole number; give e.g. {max(minimum, 3)}")
        n = int(text)
    if n < minimum:
        raise InputError(f"{what}: {n} is below the minimum of {minimum}")
    return n


def _seconds(value: Any, what: str) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        s = float(str(value).strip().removesuffix("s"))
    except ValueError:
        raise InputError(f"{what}: {value!r} is not a number of seconds; give e.g. 600") from None
    if not math.isfinite(s) or s <= 0:
        raise InputError(f"{what}: {value!r} must be a positive number of seconds, e.g. 600")
    return s


def _flag(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise InputError(f"{what}: {value!r} is not true or false")


def _int_list(value: Any, what: str, minimum: int = 1) -> list[int]:
    """A range expression, a number, or a YAML list of either."""
    if isinstance(value, list | tuple):
        if not value:
            raise InputError(f"{what}: empty list; give e.g. 1-3 or [1, 2, 4]")
        out: set[int] = set()
        for item in value:
            out.update(parse_int_range(item, what, minimum))
        return sorted(out)
    return parse_int_range(value, what, minimum)


def _rates(value: Any, what: str) -> list[float | None]:
    if isinstance(value, list | tuple):
        if not value:
            raise InputError(f"{what}: empty list; give e.g. [1gbit, 10gbit] or native")
        value = ",".join(str(v) for v in value)
    try:
        return parse_rate_list(str(value))
    except InputError as exc:
        raise InputError(f"{what}: {_strip_what(exc, 'bandwidth')}") from None


def _sizes(value: Any, what: str) -> list[int]:
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    if not items or not any(str(i).strip() for i in items):
        raise InputError(f"{what}: empty; give e.g. 4K,64K,1M,16M")
    try:
        return sorted({parse_size_bytes(i if isinstance(i, int) else str(i).strip())
                       for i in items})
    except InputError as exc:
        raise InputError(f"{what}: {_strip_what(exc, 'size')}") from None


def suggest(word: str, options: Sequence[str]) -> str:
    """'did you mean ...?' for the closest options (ties all named), or "" if none is close.

    >>> suggest("batchsize", ["nodes", "batch_size"]), suggest("resnet51", ["resnet50", "resnet56"])
    ("did you mean 'batch_size'?", "did you mean 'resnet50' or 'resnet56'?")
    """
    scores = {o: difflib.SequenceMatcher(None, word, o).ratio() for o in options}
    best = max(scores.values(), default=0.0)
    if best < 0.6:
        return ""
    close = [repr(o) for o in options if scores[o] == best]
    return f"did you mean {' or '.join(close)}?"


def _choice(value: Any, what: str, allowed: Sequence[str]) -> str:
    text = str(value).strip().lower()
    if text not in allowed:
        hint = suggest(text, allowed)
        raise InputError(f"{what}: unknown {text!r}; {hint + ' ' if hint else ''}choose one of "
                         f"{', '.join(allowed)}")
    return text


def _data(value: Any, what: str) -> str:
    text = str(value).strip()
    if text == SYNTHETIC:
        return text
    if not text.startswith("/"):
        raise InputError(f"{what}: {value!r} must be 'synthetic' or an absolute dataset path "
                         "on the nodes, e.g. /data/imagenet")
    return text


def _strip_what(exc: InputError, what: str) -> str:
    return str(exc).removeprefix(f"{what}: ")


# sweep-file key -> (SweepSpec field, parser(value, label)); the CLI option is the key with dashes
_KEYS: dict[str, tuple[str, Any]] = {
    "nodes": ("nodes", lambda v, w: _int_list(v, w)),
    "batch_size": ("batch_sizes", lambda v, w: _int_list(v, w)),
    "bandwidth": ("bandwidths", _rates),
    "procs_per_node": ("procs_per_node", lambda v, w: _int_list(v, w)),
    "model": ("model", lambda v, w: _choice(v, w, list(MODELS))),
    "engine": ("engine", lambda v, w: _choice(v, w, ENGINES)),
    "precision": ("precision", lambda v, w: _choice(v, w, PRECISIONS)),
    "repeats": ("repeats", lambda v, w: _one_int(v, w, 1)),
    "steps": ("steps", lambda v, w: _one_int(v, w, 1)),
    "warmup": ("warmup", lambda v, w: _one_int(v, w, 0)),
    "image_size": ("image_size", lambda v, w: _one_int(v, w, 8)),
    "data": ("data", _data),
    "timeout_s": ("timeout_s", _seconds),
    "allreduce_probe": ("allreduce_probe", _flag),
    "netprobe": ("netprobe", _flag),
    "allreduce_sizes": ("allreduce_sizes", _sizes),
    "allreduce_iters": ("allreduce_iters", lambda v, w: _one_int(v, w, 1)),
    "description": ("description", lambda v, w: str(v).strip()),
}
SWEEP_KEYS = tuple(_KEYS)


def _fields_from(values: Mapping[str, Any], label: Any) -> dict[str, Any]:
    """Parse given values (file keys) into SweepSpec fields; label(key) names the source."""
    out: dict[str, Any] = {}
    for key, raw in values.items():
        if not _given(raw):
            continue
        fname, parse = _KEYS[key]
        out[fname] = parse(raw, label(key))
    return out


def _build(fields: dict[str, Any], source: str | None) -> SweepSpec:
    missing = [k for k, f in (("nodes", "nodes"), ("batch_size", "batch_sizes"))
               if f not in fields]
    if missing:
        flags = " and ".join(f"--{k.replace('_', '-')}" for k in missing)
        where = f"{source} gives no {' or '.join(missing)}; add it there or " if source else ""
        raise InputError(f"{where}give {flags}, e.g. --nodes 1-3 --batch-size 32,64")
    return SweepSpec(**fields)


# ------------------------------------------------------------------------------ sweep files

class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice (PyYAML would keep the last silently)."""


def _mapping_no_dupes(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} given twice", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_no_dupes)


def find_sweep_file(name_or_path: str | Path, sweeps_dir: Path = SWEEPS_DIR) -> Path:
    """A sweep file by path, or by name under bench/sweeps/ (``demo`` -> demo.yml)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    for candidate in (sweeps_dir / f"{name_or_path}.yml", sweeps_dir / f"{name_or_path}.yaml"):
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in sweeps_dir.glob("*.y*ml")) if sweeps_dir.is_dir() else []
    raise InputError(f"sweep file {str(name_or_path)!r} not found; give a path or one of: "
                     f"{', '.join(known) or 'none'} (in {sweeps_dir})")


def spec_from_mapping(data: Any, source: str) -> SweepSpec:
    """Build a spec from a sweep-file mapping (also sweep.json's "plan"); strict keys."""
    return _build(_mapping_fields(data, source), source)


def _mapping_fields(data: Any, source: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InputError(f"{source}: must be a mapping of keys such as nodes, batch_size, "
                         "bandwidth (see bench/sweeps/demo.yml)")
    for key in data:
        if key not in _KEYS:
            hint = suggest(str(key), SWEEP_KEYS) or f"valid keys: {', '.join(_KEYS)}"
            # a key that is no name is not echoed: a wrong path (a credentials file, say)
            # must not put that file's content into the terminal or a CI log
            shown = repr(key) if re.fullmatch(r"[A-Za-z_][\w.-]{0,39}", str(key)) else \
                "(not shown: it is not a name, is this a sweep file?)"
            raise InputError(f"{source}: unknown key {shown}; {hint}")
    for key, value in data.items():
        # values are scalars or flat lists of them; anything deeper is refused before it is
        # ever turned into text (YAML aliases can nest a list into billions of elements)
        items = value if isinstance(value, list) else [value]
        if isinstance(value, dict) or any(isinstance(i, list | dict) for i in items):
            raise InputError(f"{source}: {key}: must be a value or a list of values, not a "
                             "nested structure")
    return _fields_from(data, lambda k: f"{source}: {k}")


def load_sweep_file(path: str | Path) -> SweepSpec:
    """Read and validate bench/sweeps/NAME.yml (same keys as the CLI, underscores for dashes).

    >>> load_sweep_file(SWEEPS_DIR / "demo.yml").model
    'resnet20'
    """
    return _build(_file_fields(Path(path)), str(path))


def _file_fields(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"sweep file {path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(f"sweep file {path}: not a UTF-8 text file; give a YAML sweep file "
                         "such as bench/sweeps/demo.yml") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{path}:{where} not valid YAML: {problem}") from None
    return _mapping_fields(data, str(path))


def spec_from_options(
    nodes: str | int | None = None,
    batch_size: str | int | None = None,
    bandwidth: str | None = None,
    procs_per_node: str | int | None = None,
    model: str | None = None,
    engine: str | None = None,
    precision: str | None = None,
    repeats: str | int | None = None,
    steps: str | int | None = None,
    warmup: str | int | None = None,
    image_size: str | int | None = None,
    data: str | None = None,
    timeout_s: str | float | None = None,
    allreduce_probe: bool | str | None = None,
    netprobe: bool | str | None = None,
    allreduce_sizes: str | None = None,
    allreduce_iters: str | int | None = None,
    sweep_file: str | Path | None = None,
) -> SweepSpec:
    """Build a spec from CLI strings; None or "" means not given.

    With sweep_file (a path or a name under bench/sweeps/), the file gives the values and
    every option that is given overrides the file's.

    >>> s = spec_from_options(nodes="1-3", batch_size="32,64", bandwidth="100mbit,1gbit")
    >>> s.nodes, s.batch_sizes, s.bandwidths, s.model
    ([1, 2, 3], [32, 64], [100.0, 1000.0], 'resnet50')
    """
    given = {k: v for k, v in locals().items() if k != "sweep_file" and _given(v)}
    fields = _fields_from(given, lambda k: f"--{k.replace('_', '-')}")
    if _given(sweep_file):
        path = find_sweep_file(sweep_file)
        return _build({**_file_fields(path), **fields}, str(path))
    return _build(fields, None)


def spec_to_dict(spec: SweepSpec) -> dict[str, Any]:
    """The spec as sweep-file keys (for sweep.json "plan"); spec_from_mapping reads it back.

    >>> d = spec_to_dict(spec_from_options(nodes="1-2", batch_size=32, bandwidth="native,1gbit"))
    >>> d["nodes"], d["bandwidth"], d["batch_size"]
    ([1, 2], ['native', '1gbit'], [32])
    >>> spec_from_mapping(d, "sweep.json").bandwidths
    [None, 1000.0]
    """
    out: dict[str, Any] = {}
    for key, (fname, _) in _KEYS.items():
        value = getattr(spec, fname)
        if key == "bandwidth":
            value = [format_rate(v) for v in value]
        elif isinstance(value, list):
            value = list(value)
        if value is None:
            continue
        out[key] = value
    return out


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


def train_run_id(nodes: int, ppn: int, batch: int, mbit: float | None, repeat: int) -> str:
    """Id of a train run: stable, sortable within a group, readable.

    >>> train_run_id(4, 1, 64, 1000.0, 0)
    'train-n04-p1-b064-bw1000-r0'
    """
    return f"train-n{nodes:02d}-p{ppn}-b{batch:03d}-{_rate_tag(mbit)}-r{repeat}"


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
    used = nodes[:want]
    if any(n.gpus > 0 for n in nodes):
        fewest = min(used, key=lambda n: n.gpus)
        ppn = max(spec.procs_per_node)
        if ppn > fewest.gpus:
            fix = (f"use --procs-per-node {format_int_list(range(1, fewest.gpus + 1))}"
                   if fewest.gpus else f"leave node {fewest.name} out of the cluster")
            raise InputError(f"--procs-per-node {ppn} but node {fewest.name} has {fewest.gpus} "
                             f"GPU{'s' if fewest.gpus != 1 else ''}; {fix}")
    else:
        if spec.precision == "amp":
            raise InputError(f"--precision amp needs GPUs and {name} has none; "
                             "use --precision fp32")
        ppn = max(spec.procs_per_node)
        for node in used:
            if node.cpus and ppn > math.ceil(node.cpus):
                # oversubscribed ranks time-share the cores: it runs, but measures contention
                log.warning("--procs-per-node %d exceeds the %g CPUs of node %s", ppn,
                            node.cpus, node.name)
                break
    return used


def plan(spec: SweepSpec, cluster_nodes: list[Node], can_shape: bool,
         cluster: str = "") -> list[RunPlan]:
    """Validate spec against the cluster and expand it into ordered runs (see module doc).

    cluster names the cluster in error messages; can_shape says whether the target can put
    a rate on links (tc). Raises InputError with one line that says the fix.
    """
    used = _check_cluster(spec, cluster_nodes, can_shape, cluster)
    info = MODELS[spec.model]
    image = spec.image_size or info.image_size
    memory.check(used, spec.nodes, spec.procs_per_node, spec.batch_sizes, model=spec.model,
                 params=info.params, activation_bytes=info.activation_bytes,
                 image_scale=(image / info.image_size) ** 2, amp=spec.precision == "amp")
    runs: list[RunPlan] = []
    for mbit in spec.bandwidths:
        for repeat in range(spec.repeats):
            for n in spec.nodes:
                names = tuple(node.name for node in used[:n])
                for ppn in spec.procs_per_node:
                    common = {"nodes": n, "procs_per_node": ppn, "world_size": n * ppn,
                              "model": spec.model, "engine": spec.engine,
                              "precision": spec.precision}
                    if spec.allreduce_probe and repeat == 0 and n * ppn > 1:
                        params = {**common, "batch_size": None, "bandwidth_mbit": mbit,
                                  "repeat": 0, "steps": spec.allreduce_iters, "warmup": 1,
                                  "image_size": None, "data": None}
                        runs.append(RunPlan("allreduce", allreduce_run_id(n, ppn, mbit),
                                            _ordered(params), names, spec.timeout_s,
                                            tuple(spec.allreduce_sizes)))
                    for batch in spec.batch_sizes:
                        params = {**common, "batch_size": batch, "bandwidth_mbit": mbit,
                                  "repeat": repeat, "steps": spec.steps,
                                  "warmup": spec.warmup, "image_size": image, "data": spec.data}
                        runs.append(RunPlan("train", train_run_id(n, ppn, batch, mbit, repeat),
                                            _ordered(params), names, spec.timeout_s))
    return runs


def _ordered(params: dict[str, Any]) -> dict[str, Any]:
    return {k: params[k] for k in PARAM_KEYS}


def gradient_bytes(model: str) -> int:
    """fp32 gradient of a model, what every step all-reduces.

    >>> gradient_bytes("resnet20")
    1078888
    """
    return MODELS[model].params * 4


# ------------------------------------------------------------------------------ estimates

CPU_GFLOPS = 30.0  # one core running PyTorch convs, measured: resnet20 b32 ~0.13 s/step
GPU_GFLOPS = 12_000.0  # a V100/A100-class GPU on ResNet-50 training, fp32 order of magnitude
STARTUP_S = 10.0  # launch over SSH, import torch, rendezvous, build the model
RESHAPE_S = 5.0  # set a rate on every link, plus the netprobe
NATIVE_MBIT = 10_000.0  # what an unshaped link is assumed to carry


def default_step_s(model: str, device: str = "cpu") -> float:
    """Seconds of one training step (forward + backward = 3x forward) at batch 32, one process.

    >>> round(default_step_s("resnet20"), 2), round(default_step_s("resnet50", "gpu"), 3)
    (0.13, 0.033)
    """
    gflops = GPU_GFLOPS if device == "gpu" else CPU_GFLOPS
    return 3 * MODELS[model].gflops_fwd * 32 / gflops


def _ring_s(nbytes: float, world: int, mbit: float | None) -> float:
    """Ring allreduce over the link (the report's model, without its per-hop latency)."""
    return analysis.ring_allreduce_time_s(world, nbytes, mbit or NATIVE_MBIT, alpha_s=0.0)


def estimate_run_s(run: RunPlan, per_step_s: Mapping[str, float] | None = None,
                   startup_s: float = STARTUP_S, device: str = "cpu") -> float:
    """Rough wall time of one run: startup + (warmup + steps) * (compute + allreduce).

    Compute and communication are added, not overlapped, so the estimate errs long.
    per_step_s maps model -> seconds per step of one process at batch 32 and the model's
    image size (e.g. measured in an earlier sweep); models it lacks get default_step_s(device).
    """
    p = run.params
    world, mbit = p["world_size"], p["bandwidth_mbit"]
    iters = p["steps"] + p["warmup"]
    if run.kind == "allreduce":
        return startup_s + sum(iters * (_ring_s(size, world, mbit) + 0.001)
                               for size in run.allreduce_sizes)
    model = p["model"]
    base = (per_step_s or {}).get(model) or default_step_s(model, device)
    scale = (p["image_size"] / MODELS[model].image_size) ** 2
    compute = base * p["batch_size"] / 32 * scale
    return startup_s + iters * (compute + _ring_s(gradient_bytes(model), world, mbit))


def estimate_duration_s(runs: Sequence[RunPlan], per_step_s: Mapping[str, float] | None = None,
                        startup_s: float = STARTUP_S, device: str = "cpu") -> float:
    """Rough wall time of a plan (for --dry-run), link reconfigurations included.

    device is "gpu" on a cluster with GPUs (it picks the default per-step times).
    """
    total = 0.0
    rate: object = object()
    for run in runs:
        if run.params["bandwidth_mbit"] != rate:
            rate = run.params["bandwidth_mbit"]
            total += RESHAPE_S
        total += estimate_run_s(run, per_step_s, startup_s, device)
    return total


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
    """
    p = run.params
    plural = "s" if p["nodes"] != 1 else " "
    head = f"{run.kind:<9} {p['nodes']:>2} node{plural} x {p['procs_per_node']}"
    rate = format_rate(p["bandwidth_mbit"])
    if run.kind == "allreduce":
        sizes = run.allreduce_sizes
        span = f"{_size_text(sizes[0])}..{_size_text(sizes[-1])}" if sizes else "-"
        return f"{head}  {'probe':<9}  {rate:<8} sizes {span}"
    return f"{head}  batch {p['batch_size']:<3}  {rate:<8} repeat {p['repeat']}"


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
