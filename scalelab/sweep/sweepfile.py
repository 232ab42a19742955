"""Sweep specs from what users type: command-line options or a YAML sweep file, validated,
with one line that names the fix for anything wrong. The keys and their parsers are the
settings table's (scalelab.sweep.settings).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from scalelab.cluster import targets
from scalelab.cluster.nodes import nodes_of
from scalelab.core.errors import InputError, suggest
from scalelab.core.state import PROJECT_ROOT
from scalelab.core.units import format_rate
from scalelab.sweep.settings import BY_KEY, FILE_KEYS, SETTINGS, SweepSpec, check_spec
from scalelab.sweep.values import given

log = logging.getLogger(__name__)

SWEEPS_DIR = PROJECT_ROOT / "bench" / "sweeps"
# the bench options that are sweep settings, by option name
OPTIONS = {s.option: s for s in SETTINGS if s.bench}



def _fields_from(values: Mapping[str, Any], label: Any) -> dict[str, Any]:
    """Parse given values (file keys) into SweepSpec fields; label(key) names the source."""
    out: dict[str, Any] = {}
    if given(values.get("channels_last")) and given(values.get("memory_format")):
        raise InputError(f"{label('channels_last')} and {label('memory_format')} both set the "
                         f"memory format; keep {label('memory_format')} only")
    for key, raw in values.items():
        if not given(raw):
            continue
        setting = BY_KEY[key]
        out[setting.field] = setting.parse(raw, label(key))
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
    check_spec(spec)  # the static checks, before any cluster is looked at
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
        if key not in BY_KEY:
            hint = suggest(str(key), FILE_KEYS) or f"valid keys: {', '.join(FILE_KEYS)}"
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


def spec_from_options(sweep_file: str | Path | None = None, **options: Any) -> SweepSpec:
    """Build a spec from CLI strings; None or "" means not given.

    With sweep_file (a path or a name under bench/sweeps/), the file gives the values and
    every option that is given overrides the file's.

    >>> s = spec_from_options(nodes="1-3", batch_size="32,64", bandwidth="100mbit,1gbit")
    >>> s.nodes, s.batch_sizes, s.bandwidths, s.model
    ([1, 2, 3], [32, 64], [100.0, 1000.0], 'resnet50')
    """
    unknown = sorted(set(options) - set(BY_KEY))
    if unknown:
        raise TypeError(f"spec_from_options() got unknown settings {unknown}")
    asked = {k: x for k, x in options.items() if given(x)}
    fields = _fields_from(asked, lambda k: f"--{BY_KEY[k].option.replace('_', '-')}")
    if given(sweep_file):
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
    for key, setting in BY_KEY.items():
        if setting.alias_of:
            continue
        value = getattr(spec, setting.field)
        if key == "bandwidth":
            value = [format_rate(v) for v in value]
        elif isinstance(value, list):
            value = list(value)
        if value is None or (key == "batch_size" and value == []):  # strong scaling only
            continue
        out[key] = value
    return out


def reference_fill(rec: dict[str, Any], given: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """What a command line that names nodes but no batch takes from the reference experiment
    (bench/sweeps/slices.yml): every axis it does not give, as the cluster can run it: links
    at their own rate where the target cannot shape them, fp32 where no GPU computes (amp needs
    one). rec is the cluster's record. Returns the options to add (over the reference file)
    and the one line that says so.
    """
    caps = targets.capabilities(rec)
    ref = spec_from_options(sweep_file=REFERENCE)
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
            f"{REFERENCE}.yml): {', '.join(taken)}"
            + (f"; {'; '.join(notes)}" if notes else "") + "; give any of them to override")
    return fill, line
