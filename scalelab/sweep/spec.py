"""Sweep specs from what users type: command-line options or a YAML sweep file, validated,
with one line that names the fix for anything wrong.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from scalelab.core.errors import InputError, suggest
from scalelab.core.state import PROJECT_ROOT
from scalelab.core.units import format_rate, parse_int_range, parse_rate_list, parse_size_bytes
from scalelab.model.comm import COMPRESSIONS
from scalelab.model.models import MODELS
from scalelab.sweep.planner import (
    DEVICES,
    ENGINES,
    FABRICS,
    LAUNCHERS,
    MEMORY_FORMATS,
    PRECISIONS,
    RUNTIMES,
    SYNTHETIC,
    SweepSpec,
    check_comm,
)

log = logging.getLogger(__name__)

SWEEPS_DIR = PROJECT_ROOT / "bench" / "sweeps"


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


def _price(value: Any, what: str) -> float:
    """A price per node-hour: a finite number above 0.

    >>> _price("2.5", "--price-per-node-hour")
    2.5
    >>> _price("-1", "--price-per-node-hour")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: --price-per-node-hour: -1 must be a number above 0, e.g. 2.5 for 2.50 per node and hour
    """
    try:
        price = float(value)
    except (TypeError, ValueError):
        price = float("nan")
    if isinstance(value, bool) or not (math.isfinite(price) and price > 0):
        raise InputError(f"{what}: {value} must be a number above 0, e.g. 2.5 for 2.50 per node "
                         "and hour")
    return price


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


def _choice(value: Any, what: str, allowed: Sequence[str]) -> str:
    text = str(value).strip().lower()
    if text not in allowed:
        hint = suggest(text, allowed)
        raise InputError(f"{what}: unknown {text!r}; {hint + ' ' if hint else ''}choose one of "
                         f"{', '.join(allowed)}")
    return text


def _fabric_profile(value: Any, what: str) -> str:
    from scalelab.model import fabric

    return _choice(value, what, fabric.names())


def _intra_link(value: Any, what: str) -> str | None:
    from scalelab.model import fabric

    got = fabric.intra_link(value, what)
    return None if got is None else got[0]


def _data(value: Any, what: str) -> str:
    text = str(value).strip()
    if text == SYNTHETIC:
        return text
    if not text.startswith("/"):
        raise InputError(f"{what}: {value!r} must be 'synthetic' or an absolute dataset path "
                         "on the nodes, e.g. /data/imagenet")
    return text


def _accelerator(value: Any, what: str) -> str | None:
    from scalelab.model import accel

    text = str(value).strip()
    if text.lower() in ("none", "off"):
        return None
    if accel.is_path(text):
        # kept absolute in the sweep's plan, so a resume from elsewhere finds the same file
        text = str(Path(text).expanduser().resolve())
    try:
        accel.check_name(text)
    except InputError as exc:
        raise InputError(f"{what}: {exc}") from None
    return text


def _dilation(value: Any, what: str) -> float | None:
    """A factor >= 1, or auto (None: the driver picks one per link rate)."""
    if str(value).strip().lower() == "auto":
        return None
    try:
        k = float(value)
    except (TypeError, ValueError):
        k = math.nan
    if not k >= 1 or math.isinf(k):
        raise InputError(f"{what}: {value!r} is not a dilation factor; give a number >= 1 "
                         "(waits k times longer, links k times slower) or auto")
    return k


def _partition(value: Any, what: str) -> str:
    text = str(value).strip()
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,39}", text):
        raise InputError(f"{what}: {value!r} is not a Slurm partition name; give e.g. gpu")
    return text


def _positive_list(value: Any, what: str, example: str) -> list[float]:
    """Numbers above 0, comma-separated or a YAML list, sorted and without repeats.

    >>> _positive_list("50,10,25", "--bucket-cap-mb", "25,50")
    [10.0, 25.0, 50.0]
    >>> _positive_list("0", "--bucket-cap-mb", "25,50")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: --bucket-cap-mb: '0' must be a number above 0; give e.g. 25,50
    """
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    out: set[float] = set()
    for item in items:
        try:
            x = float(item) if not isinstance(item, bool) else math.nan
        except (TypeError, ValueError):
            x = math.nan
        if not (math.isfinite(x) and x > 0):
            raise InputError(f"{what}: {str(item).strip()!r} must be a number above 0; give "
                             f"e.g. {example}")
        out.add(x)
    if not out:
        raise InputError(f"{what}: empty; give e.g. {example}")
    return sorted(out)


def _choice_list(value: Any, what: str, allowed: Sequence[str]) -> list[str]:
    """Choices, comma-separated or a YAML list, in the order of allowed, without repeats."""
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    chosen = {_choice(i, what, allowed) for i in items}
    return [c for c in allowed if c in chosen]


def _strip_what(exc: InputError, what: str) -> str:
    return str(exc).removeprefix(f"{what}: ")


# sweep-file key -> (SweepSpec field, parser(value, label)); the CLI option is the key with dashes
_KEYS: dict[str, tuple[str, Any]] = {
    "nodes": ("nodes", lambda v, w: _int_list(v, w)),
    "batch_size": ("batch_sizes", lambda v, w: _int_list(v, w)),
    # strong scaling: global batches split over each run's ranks (beside or instead of batch_size)
    "global_batch_size": ("global_batch_sizes", lambda v, w: _int_list(v, w)),
    "bandwidth": ("bandwidths", _rates),
    "procs_per_node": ("procs_per_node", lambda v, w: _int_list(v, w)),
    "model": ("model", lambda v, w: _choice(v, w, list(MODELS))),
    "engine": ("engine", lambda v, w: _choice(v, w, ENGINES)),
    "precision": ("precisions", lambda v, w: _choice_list(v, w, PRECISIONS)),
    "repeats": ("repeats", lambda v, w: _one_int(v, w, 1)),
    "steps": ("steps", lambda v, w: _one_int(v, w, 1)),
    "warmup": ("warmup", lambda v, w: _one_int(v, w, 0)),
    "image_size": ("image_size", lambda v, w: _one_int(v, w, 8)),
    "data": ("data", _data),
    "timeout_s": ("timeout_s", _seconds),
    "allreduce_probe": ("allreduce_probe", _flag),
    "netprobe": ("netprobe", _flag),
    "warm_start": ("warm_start", _flag),
    "allreduce_sizes": ("allreduce_sizes", _sizes),
    "allreduce_iters": ("allreduce_iters", lambda v, w: _one_int(v, w, 1)),
    "description": ("description", lambda v, w: str(v).strip()),
    "accelerator": ("accelerator", lambda v, w: _accelerator(v, w)),
    "dilation": ("dilation", lambda v, w: _dilation(v, w)),
    "launcher": ("launcher", lambda v, w: _choice(v, w, LAUNCHERS)),
    "partition": ("partition", lambda v, w: _partition(v, w)),
    "device": ("device", lambda v, w: _choice(v, w, DEVICES)),
    "fabric": ("fabric", lambda v, w: _choice(v, w, FABRICS)),
    # what an allreduce achieves on the fabric: the share of the line rate shaped links carry
    "fabric_profile": ("fabric_profile", lambda v, w: _fabric_profile(v, w)),
    # the path between the ranks of one node (emulated GPUs): a name or a rate, shaped there
    "intra_link": ("intra_link", lambda v, w: _intra_link(v, w)),
    "memory_format": ("memory_formats", lambda v, w: _choice_list(v, w, MEMORY_FORMATS)),
    # the flag of before memory_format became an axis: true is memory_format channels_last
    "channels_last": ("memory_formats",
                      lambda v, w: ["channels_last" if _flag(v, w) else "contiguous"]),
    "loader_workers": ("loader_workers", lambda v, w: _one_int(v, w, 0)),
    "pin_memory": ("pin_memory", lambda v, w: _choice(v, w, ("auto", "on", "off"))),
    "runtime": ("runtime", lambda v, w: _choice(v, w, RUNTIMES)),
    "price_per_node_hour": ("price_per_node_hour", lambda v, w: _price(v, w)),
    # communication settings (axes; each engine has its own: comm.COMM_ENGINE)
    "bucket_cap_mb": ("bucket_cap_mb", lambda v, w: _positive_list(v, w, "25,50")),
    "fusion_threshold_mb": ("fusion_threshold_mb", lambda v, w: _positive_list(v, w, "64,128")),
    "cycle_time_ms": ("cycle_time_ms", lambda v, w: _positive_list(v, w, "1,5")),
    "compression": ("compression", lambda v, w: _choice_list(v, w, COMPRESSIONS)),
}
SWEEP_KEYS = tuple(_KEYS)
_ALIASES = ("channels_last",)  # keys that set another key's field: never written back


def _fields_from(values: Mapping[str, Any], label: Any) -> dict[str, Any]:
    """Parse given values (file keys) into SweepSpec fields; label(key) names the source."""
    out: dict[str, Any] = {}
    if _given(values.get("channels_last")) and _given(values.get("memory_format")):
        raise InputError(f"{label('channels_last')} and {label('memory_format')} both set the "
                         f"memory format; keep {label('memory_format')} only")
    for key, raw in values.items():
        if not _given(raw):
            continue
        fname, parse = _KEYS[key]
        out[fname] = parse(raw, label(key))
    return out


def _build(fields: dict[str, Any], source: str | None) -> SweepSpec:
    missing = [k for k, f in (("nodes", "nodes"), ("batch_size", "batch_sizes"))
               if f not in fields]
    if fields.get("global_batch_sizes") and "batch_size" in missing:
        missing.remove("batch_size")  # strong scaling alone
        fields = {**fields, "batch_sizes": []}
    if missing:
        flags = " and ".join(f"--{k.replace('_', '-')}" for k in missing)
        where = f"{source} gives no {' or '.join(missing)}; add it there or " if source else ""
        raise InputError(f"{where}give {flags}, e.g. --nodes 1-3 --batch-size 32,64 (or "
                         "--global-batch-size 256 for a global batch split over the ranks)")
    spec = SweepSpec(**fields)
    check_comm(spec)  # another engine's setting is refused before any cluster is looked at
    if spec.accelerator:
        # a profile that cannot serve every planned batch size is refused before any cluster
        # is looked at
        from scalelab.sweep.planner import check_emulation

        check_emulation(spec, spec.image_size or MODELS[spec.model].image_size)
    return spec


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


REFERENCE = "slices"  # bench/sweeps/slices.yml: the reference experiment


def reference_batch_sizes() -> str:
    """The reference experiment's batch sizes per worker, as --batch-size takes them: what a
    command line that gives nodes but no batch size sweeps.

    >>> reference_batch_sizes()
    '32,64,96'
    """
    value = _file_fields(find_sweep_file(REFERENCE))["batch_sizes"]
    return ",".join(str(v) for v in value)


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
    'resnet50'
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
    global_batch_size: str | int | None = None,
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
    accelerator: str | None = None,
    dilation: str | float | None = None,
    launcher: str | None = None,
    partition: str | None = None,
    device: str | None = None,
    fabric: str | None = None,
    fabric_profile: str | None = None,
    intra_link: str | None = None,
    channels_last: bool | str | None = None,
    memory_format: str | None = None,
    loader_workers: str | int | None = None,
    pin_memory: str | None = None,
    runtime: str | None = None,
    warm_start: bool | str | None = None,
    price_per_node_hour: str | float | None = None,
    bucket_cap_mb: str | None = None,
    fusion_threshold_mb: str | None = None,
    cycle_time_ms: str | None = None,
    compression: str | None = None,
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
        if key in _ALIASES:
            continue
        value = getattr(spec, fname)
        if key == "bandwidth":
            value = [format_rate(v) for v in value]
        elif isinstance(value, list):
            value = list(value)
        if value is None or (key == "batch_size" and value == []):  # strong scaling only
            continue
        out[key] = value
    return out
