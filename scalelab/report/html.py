"""The report's page: escaped text, tables, banners and sections, one self-contained HTML file."""

from __future__ import annotations

import html
import importlib.metadata
import json
import logging
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from scalelab.model import analysis, verdict
from scalelab.model.analysis import batch_text
from scalelab.model.verdict import VERDICT_COLUMNS
from scalelab.report import model
from scalelab.report.data import Analysis, SweepData
from scalelab.report.figures import draw_figures, layout
from scalelab.results import store

log = logging.getLogger(__name__)
ALL_RUNS_OPEN_MAX = 200  # the all-runs table starts folded above this many rows

# ---------------------------------------------------------------------------- HTML helpers

def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def readable(value: float, digits: int = 3) -> str:
    """A number as a person reads it: thousands separators, no exponent, `digits` significant
    figures below 1000.

    >>> readable(17440.4), readable(95970.0), readable(950.2), readable(12.345), readable(0.0005896)
    ('17,440', '95,970', '950', '12.3', '0.00059')
    >>> readable(float("nan")), readable(0.0), readable(-2.5)
    ('', '0', '-2.5')
    """
    if value is None or math.isnan(value):
        return ""
    if value == 0:
        return "0"
    size = abs(value)
    if size >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    decimals = max(0, digits - 1 - math.floor(math.log10(size)))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def rate_label(mbit: float) -> str:
    """A link rate as a person reads it.

    >>> rate_label(9585.0), rate_label(958.5), rate_label(100000.0)
    ('9.59 Gbit/s', '958 Mbit/s', '100 Gbit/s')
    """
    return f"{readable(mbit / 1000)} Gbit/s" if mbit >= 1000 else f"{readable(mbit)} Mbit/s"


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        return readable(float(value), digits)
    return str(value)


def _col_text(series: pd.Series, kind: str) -> pd.Series:
    """Vectorised cell text for a column: escaped strings."""
    if kind == "pct":
        vals = series.astype(float)
        out = (vals * 100).map(lambda v: "" if math.isnan(v) else f"{v:.1f}%")
    elif kind == "num":
        out = series.astype(float).map(lambda v: readable(v, 4))
    elif kind == "ms":  # a time in seconds, shown in ms rounded as verdict.ms writes it
        out = series.astype(float).map(lambda v: readable(model._ms_number(v), 4))
    elif kind == "int":
        out = series.map(lambda v: "" if pd.isna(v) else str(int(v)))
    else:
        out = series.astype(str).map(html.escape)
    return out


def batch_cells(frame: pd.DataFrame) -> pd.Series:
    """Cell text of a frame's batch_size as what it is: 64/worker (weak scaling) or 512 global
    (strong scaling: split over the ranks).

    >>> batch_cells(pd.DataFrame({"batch_size": [64, 512], "scaling": ["weak", "strong"]})).tolist()
    ['64/worker', '512 global']
    >>> batch_cells(pd.DataFrame({"batch_size": [32]})).tolist()  # a frame from before
    ['32/worker']
    """
    strong = (frame["scaling"] == "strong") if "scaling" in frame else pd.Series(
        False, index=frame.index)
    return pd.Series([("" if pd.isna(b) else f"{int(b)} global" if s else f"{int(b)}/worker")
                      for b, s in zip(frame["batch_size"], strong, strict=True)],
                     index=frame.index)


def _table(frame: pd.DataFrame, columns: list[tuple[str, str, str]], cls: str = "") -> str:
    """An HTML table; columns are (frame column, header, kind: str|num|ms|int|pct|pre|wrap),
    ms a time in seconds shown in milliseconds (the header says ms), wrap being text that may
    wrap in a table whose cells otherwise do not."""
    head = "".join(f"<th>{_e(h)}</th>" for _, h, _ in columns)
    if frame.empty:
        return (f'<div class="fit"><table class="{cls}"><thead><tr>{head}</tr></thead>'
                "<tbody></tbody></table></div>")
    cells = []
    for col, _, kind in columns:
        if kind == "batch":  # the batch a series holds fixed: each worker's, or the global one
            text = batch_cells(frame)
        else:
            text = _col_text(frame[col], "str" if kind in ("pre", "wrap") else kind)
        if kind == "pre":
            text = "<pre>" + text + "</pre>"
        tag = ('<td class="n">' if kind in ("num", "ms", "int", "pct", "batch") else
               '<td class="w">' if kind == "wrap" else "<td>")
        cells.append(tag + text + "</td>")
    rows = cells[0]
    for c in cells[1:]:
        rows = rows + c
    body = "<tr>" + rows + "</tr>"
    # in a box of the page's width: a table wider than the window scrolls in it, never the page
    return (f'<div class="fit"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>'
            + "\n".join(body.tolist()) + "</tbody></table></div>")


def _kv(pairs: Sequence[tuple[str, Any]]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs)
    return f'<table class="kv">{rows}</table>'


def _jsonish(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return "" if value is None else str(value)


def _parse_time(text: Any) -> datetime | None:
    if not text:
        return None
    try:
        t = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min {s:02d} s"


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;
color:#1b1b1b;background:#fff;line-height:1.45}
main{max-width:1240px;margin:0 auto;padding:1rem 1.5rem 3rem}
h1{font-size:1.6rem;margin:.4rem 0}h2{font-size:1.25rem;margin-top:2rem;
border-bottom:2px solid #0072B2;padding-bottom:.2rem}h3{font-size:1.05rem}
.banner{padding:.6rem 1rem;border-radius:4px;margin:.6rem 0;font-weight:600}
.synthetic{background:#fff3cd;border:2px solid #E69F00}
.partial{background:#fde2e1;border:2px solid #D55E00}
.note{color:#444;font-size:.92rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.85rem}
th,td{border:1px solid #ccc;padding:.2rem .45rem;text-align:left;vertical-align:top}
thead th{background:#eef4fa;position:sticky;top:0}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.fit{max-width:100%;overflow-x:auto}
table.scaling{font-size:.8rem}
table.scaling th,table.scaling td{padding:.2rem .3rem}
th{font-weight:600}
table.runs td{white-space:nowrap}
table td.n{white-space:nowrap}
table td.w{white-space:normal;min-width:9rem}
.model-error{margin:.4rem 0}
table.kv th{background:#f6f6f6;font-weight:600;white-space:nowrap}
pre{margin:0;white-space:pre-wrap;word-break:break-word;max-width:60rem;font-size:.8rem}
figure{margin:1.2rem 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.88rem;color:#333;max-width:70rem}
.kind{font-weight:600;white-space:nowrap}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(340px,1fr));gap:1rem}
details summary{cursor:pointer;font-weight:600;margin:.4rem 0}
code{background:#f3f3f3;padding:0 .2rem}
"""

CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
       "form-action 'none'")


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{CSS}</style></head>"
            f"<body><main>{body}</main></body></html>\n")


# ---------------------------------------------------------------------------- HTML sections

def _banners(sweeps: list[SweepData]) -> str:
    out = []
    synthetic = [s.sweep_id for s in sweeps if s.synthetic]
    if synthetic:
        out.append('<div class="banner synthetic">SYNTHETIC DATA: '
                   f"{_e(', '.join(synthetic))} was generated by scalelab.results.synthetic."
                   "synthetic_sweep to show the report, not measured on a cluster.</div>")
    for s in sweeps:
        if s.missing:
            shown = ", ".join(s.missing[:20]) + (" ..." if len(s.missing) > 20 else "")
            total = len(s.meta.get("planned_runs") or [])
            out.append(f'<div class="banner partial">Partial sweep {_e(s.sweep_id)}: '
                       f"{len(s.missing)} of {total} planned runs have no record "
                       f"(not run yet, or interrupted); shown is what exists. Missing: "
                       f"{_e(shown)}</div>")
        elif not s.meta.get("finished_at") and s.meta:
            out.append(f'<div class="banner partial">Sweep {_e(s.sweep_id)} has no finished_at:'
                       " it may still be running or was interrupted.</div>")
        out.extend(_baseline_banner(s))
    return "".join(out)


def _baseline_banner(s: SweepData) -> list[str]:
    """Series whose efficiency is empty because no run at their baseline succeeded."""
    missing = analysis.missing_baselines(s.runs)
    if missing.empty:
        return []
    series = "; ".join(
        f"{r.model} {r.engine} {batch_text(r.batch_size, getattr(r, 'scaling', 'weak'))} at "
        f"{r.bandwidth}, "
        f"{int(r.procs_per_node)} per node (N0 = {int(r.baseline_world_size)})"
        for r in missing.itertuples())
    return [f'<div class="banner partial">No scaling efficiency for {_e(series)}: no run at '
            "the baseline world size N0 (the plan's smallest) succeeded, and efficiency is never "
            "measured against a larger N0. Run them again with <code>invoke bench --resume "
            f"{_e(s.sweep_id)} --retry-failed</code>.</div>"]


def _gpus_text(runs: Any, declared: list[int]) -> str:
    """GPUs per node as the ranks used them, nvidia-smi's count beside it.

    >>> import pandas as pd
    >>> r = pd.DataFrame({"gpus_per_node": [8.0, 8.0], "gpu_model": ["NVIDIA H100", ""],
    ...                   "accelerator": ["", ""]})
    >>> _gpus_text(r, [8])
    '8 x NVIDIA H100 used by the ranks (nvidia-smi: 8)'
    >>> _gpus_text(pd.DataFrame({"gpus_per_node": [0.0], "gpu_model": [""],
    ...                          "accelerator": [""]}), [8])
    'none used: the ranks ran on CPUs (nvidia-smi: 8)'
    >>> _gpus_text(pd.DataFrame({"gpus_per_node": [0.0], "gpu_model": [""],
    ...                          "accelerator": ["v100"], "procs_per_node": [1.0],
    ...                          "model": ["resnet50"], "precision": ["fp32"]}), [0])
    '1 x emulated V100, profile v100-resnet50-fp32'
    """
    smi = f" (nvidia-smi: {', '.join(str(g) for g in declared)})" if any(declared) else ""
    if any(a for a in runs.get("accelerator", [])):
        rows = runs[runs["accelerator"].astype(bool)]
        names, profiles = set(), set()
        for _, r in rows.iterrows():
            acc = str(r["accelerator"])
            stem = acc.rsplit("/", 1)[-1].removesuffix(".json")
            # a shipped profile is named by accelerator, model and precision; a file by itself
            names.add(stem.upper() if "/" not in acc else stem)
            profiles.add(stem if "/" in acc else
                         f"{acc}-{r.get('model', '?')}-{r.get('precision', '?')}")
        ppn = rows["procs_per_node"].dropna() if "procs_per_node" in rows else []
        count = "/".join(str(int(v)) for v in sorted(set(ppn))) if len(ppn) else "1"
        return (f"{count} x emulated {', '.join(sorted(names))}, profile "
                f"{', '.join(sorted(profiles))}{smi}")
    used = runs["gpus_per_node"].dropna() if "gpus_per_node" in runs else []
    if len(used) == 0:
        return (", ".join(str(g) for g in declared) + " (nvidia-smi; the ranks did not say)"
                if declared else "unknown")
    most = int(max(used))
    if most == 0:
        return f"none used: the ranks ran on CPUs{smi}"
    models = sorted({m for m in runs["gpu_model"] if m})
    return f"{most} x {', '.join(models) or 'GPU'} used by the ranks{smi}"


def _transport_text(runs: Any) -> str:
    """The transports the ranks' collectives used, with their backends."""
    if "transport" not in runs:
        return "not recorded"
    pairs = runs[runs["transport"] != ""].groupby(["backend", "transport"]).size()
    return ", ".join(f"{t} ({b}, {n} runs)" for (b, t), n in pairs.items()) or "not recorded"


def _runtime_text(runs: Any) -> str:
    """Where the ranks ran: on the nodes, or in containers of which image (its digest).

    >>> import pandas as pd
    >>> _runtime_text(pd.DataFrame({"runtime": ["container"], "image_id": ["sha256:ab"]}))
    'in containers of image sha256:ab (1 runs)'
    """
    if "runtime" not in runs or not (runs["runtime"] == "container").any():
        return "on the nodes (no container)"
    inside = runs[runs["runtime"] == "container"].groupby("image_id").size()
    text = ", ".join(f"in containers of image {i or 'unknown'} ({n} runs)"
                     for i, n in inside.items())
    host = int((runs["runtime"] != "container").sum())
    return text + (f"; on the nodes ({host} runs)" if host else "")


def _summary_pairs(s: SweepData) -> list[tuple[str, Any]]:
    meta, runs, ar = s.meta, s.runs, s.allreduce
    nodes = [n for n in meta.get("nodes") or [] if isinstance(n, dict)]
    cpus = sorted({float(n.get("cpus") or 0) for n in nodes})
    gpus = sorted({int(n.get("gpus") or 0) for n in nodes})
    plan = meta.get("plan") or {}
    requested = plan.get("bandwidth") or plan.get("bandwidths") or sorted(runs["bandwidth"].unique())
    measured = runs.groupby("bandwidth")["link_mbit_measured"].mean().dropna()
    single = (runs.groupby("bandwidth")["link_mbit_single_stream"].mean().dropna()
              if "link_mbit_single_stream" in runs else {})
    measured_txt = ", ".join(
        f"{bw}: {v:,.0f} Mbit/s" + (f" (one stream {single[bw]:,.0f})" if bw in single else "")
        for bw, v in measured.items()) or "not measured"
    if "link_error" in runs:
        # a failed measurement is shown, never only logged: the model then uses the requested rate
        failed = runs[(runs["link_error"] != "") & runs["link_mbit_measured"].isna()]
        for bw, err in failed.groupby("bandwidth")["link_error"].first().items():
            measured_txt += f"; {bw}: measurement failed ({err})"
    busbw_txt = "no allreduce probes"
    if not ar.empty and ar["busbw_mb_s"].notna().any():
        okar = ar[ar["status"] == "ok"]
        largest = okar.loc[okar.groupby("run_id")["size_bytes"].idxmax()]
        peak = largest.groupby("bandwidth")["busbw_mb_s"].max()
        busbw_txt = ", ".join(f"{bw}: {v:.0f} MB/s" for bw, v in peak.items())
    created, finished = _parse_time(meta.get("created_at")), _parse_time(meta.get("finished_at"))
    if created and finished:
        when = f"{meta.get('created_at')} to {meta.get('finished_at')} ({_duration((finished - created).total_seconds())})"
    else:
        total = runs["duration_s"].sum() + s.probes["duration_s"].sum()
        when = (f"started {meta.get('created_at') or 'unknown'}, not finished "
                f"({_duration(total)} of recorded run time)")
    status = runs["status"].value_counts()
    status_txt = ", ".join(f"{k} {v}" for k, v in status.items())
    probe_ok = int((s.probes["status"] == "ok").sum())
    limits = analysis.host_limits(meta)
    pairs: list[tuple[str, Any]] = [
        ("sweep", s.sweep_id),
        ("cluster / target", f"{meta.get('cluster', '?')} / {meta.get('target') or ', '.join(runs['target'].unique())}"),
        ("nodes", f"{len(nodes)} ({', '.join(n.get('name', '?') for n in nodes[:8])}"
                  f"{' ...' if len(nodes) > 8 else ''})" if nodes else "unknown"),
        ("CPUs per node", ", ".join(f"{c:g}" for c in cpus) or "unknown"),
        ("GPUs per node", _gpus_text(runs, gpus)),
        ("host cores (local target)", _fmt(limits["host_cpus"]) or "unknown"),
        ("link rates requested", ", ".join(str(r) for r in requested)),
        ("fabric profile", ", ".join(sorted(set(runs.get("fabric_profile", ["ideal"])) - {""}))
         + (" (what it carried and its sources: below the tables)"
            if set(runs.get("fabric_profile", [])) - {"", "ideal"} else "")),
        ("link rates measured (mean)", measured_txt),
        ("transport (from the ranks)", _transport_text(runs)),
        ("allreduce busbw at largest message", busbw_txt),
        ("launcher", _launchers(runs, s.probes)),
        ("ranks ran", _runtime_text(runs)),
        ("date and duration", when),
        ("training runs", f"{len(runs)} recorded: {status_txt}"),
        ("training run time by phase", _time_split(runs)),
        ("allreduce probes", f"{len(s.probes)} recorded, {probe_ok} ok"),
        ("planned runs", f"{len(meta.get('planned_runs') or [])} planned, "
                         f"{len(s.missing)} without a record"),
        ("environment fingerprints", f"{s.env_fingerprints} distinct"
         + (" (runs ran on different software!)" if s.env_fingerprints > 1 else "")),
    ]
    tf_used = (meta.get("software") or {}).get("terraform")
    if isinstance(tf_used, dict) and tf_used.get("version"):  # a Terraform target's sweep
        pairs.insert(2, ("Terraform that applied the cluster",
                         f"{tf_used.get('binary') or 'terraform'} {tf_used['version']}"))
    return pairs


def _launchers(runs: pd.DataFrame, probes: pd.DataFrame) -> str:
    """How the runs started, and for Slurm jobs their ids (probes' jobs included).

    >>> r = pd.DataFrame({"launcher": ["slurm", "slurm"], "slurm_job_id": ["12", "14"]})
    >>> _launchers(r, pd.DataFrame({"slurm_job_id": ["13"]}))
    'slurm: 3 jobs (ids 12-14)'
    >>> _launchers(pd.DataFrame({"launcher": ["direct"] * 3, "slurm_job_id": [""] * 3}),
    ...            pd.DataFrame())
    'direct (over SSH): 3 runs'
    """
    parts = []
    for name, group in runs.groupby("launcher", sort=True):
        if name == "slurm":
            ids = [*group["slurm_job_id"]]
            if "slurm_job_id" in probes:
                ids += [*probes["slurm_job_id"]]
            nums = sorted(int(i) for i in ids if str(i).isdigit())
            span = f" (ids {nums[0]}-{nums[-1]})" if len(nums) > 1 else \
                (f" (id {nums[0]})" if nums else "")
            parts.append(f"slurm: {len(nums)} jobs{span}")
        else:
            parts.append(f"{name or 'unrecorded'} (over SSH): {len(group)} runs")
    return "; ".join(parts) or "unknown"


def _time_split(runs: pd.DataFrame) -> str:
    """Shares of the ok training runs' wall time by phase (scalelab.run.driver.timeline)."""
    cols = [c for c in store.TIMELINE_KEYS if c in runs]
    timed = runs[(runs["status"] == "ok")].dropna(subset=cols) if cols else runs.iloc[:0]
    if timed.empty:
        return "not recorded (runs from before scalelab recorded timelines)"
    total = float(timed[cols].to_numpy().sum())
    parts = [f"{c.removesuffix('_s').replace('_', ' ')} {100 * timed[c].sum() / total:.0f} %"
             for c in cols]
    steps = 100 * (timed["warmup_s"].sum() + timed["timed_s"].sum()) / total
    per_run = (total - timed["warmup_s"].sum() - timed["timed_s"].sum()) / len(timed)
    return (f"{', '.join(parts)}: steps (warm-up and timed) {steps:.0f} % of "
            f"{_duration(total)}; {per_run:.1f} s per run beyond its steps")


def _sweep_details(s: SweepData) -> str:
    meta = s.meta
    plan = meta.get("plan") or {}
    software = meta.get("software") or {}
    nodes = pd.DataFrame([n for n in meta.get("nodes") or [] if isinstance(n, dict)])
    parts = [f"<h3>Sweep parameters ({_e(s.sweep_id)})</h3>",
             _kv([(k, _jsonish(v)) for k, v in plan.items()]) if plan else
             '<p class="note">sweep.json has no plan.</p>',
             f"<h3>Software manifest ({_e(s.sweep_id)})</h3>",
             _kv([(k, _jsonish(v)) for k, v in software.items()]) if software else
             '<p class="note">sweep.json has no software manifest.</p>']
    if not nodes.empty:
        for col in ("name", "role", "private_address", "cpus", "gpus", "iface"):
            if col not in nodes:
                nodes[col] = ""
        parts += [f"<h3>Nodes ({_e(s.sweep_id)})</h3>",
                  _table(nodes, [("name", "name", "str"), ("role", "role", "str"),
                                 ("private_address", "cluster address", "str"),
                                 ("cpus", "CPUs", "str"), ("gpus", "GPUs", "str"),
                                 ("iface", "interface", "str")])]
    return "".join(parts)


def _bottleneck_section(a: Analysis) -> str:
    """The model's error, stated once, then each series' verdict at its largest world size."""
    frame = model.bottleneck_rows(a)
    cols = [("series", "series", "str"), ("n", "at world size", "int"),
            ("eff", "measured efficiency", "pct"), ("pred", "model efficiency", "pct"),
            ("exposed_ms", "exposed comm (ms/step)", "num"), ("kind", "bottleneck", "str"),
            ("why", "why", "str")]
    if model.mixed(a.modelled):
        cols.insert(4, ("model", "predicted by", "str"))
    if len(a.sweeps) > 1:
        cols.insert(0, ("sweep", "sweep", "str"))
    return ('<h2 id="bottlenecks">Bottleneck per series</h2>'
            f'<p class="model-error"><strong>{_e(a.error.sentence())}</strong></p>'
            f'<p class="note">{_e(model.models_used(a.modelled))}</p>'
            + _table(frame, cols, "bottlenecks"))


def _scaling_table(a: Analysis) -> str:
    df = a.modelled.assign(_bw=a.modelled["bandwidth_mbit"].astype(float).fillna(np.inf))
    df = df.sort_values(["sweep_id", "_bw", "batch_size", "procs_per_node", "model", "engine",
                         "precision", "data", "world_size"], kind="stable")
    df["thr_ci"] = _ci_text(df["thr_lo"], df["thr_hi"], lambda v: readable(v, 4))
    df["eff_ci"] = _ci_text(df["eff_lo"] * 100, df["eff_hi"] * 100, "{:.1f}".format)
    # the share of the time gradients were in flight that backward computation hid
    inflight = df["comm_inflight_mean_s"].astype(float)
    df["hidden"] = ((inflight - df["comm_time_mean_s"].astype(float)).clip(lower=0)
                    / inflight.where(inflight > 0))
    # to fit a 1280-px window: no column that another one implies (comm fraction is exposed
    # over step; where the model's link rate came from is said under Bottleneck per series)
    cols = [("bandwidth", "link", "str"), ("batch_size", "batch", "batch"),
            ("world_size", "world size", "int"),
            ("n", "repeats", "int"), ("thr_mean", "images/s", "num"),
            ("thr_ci", "95% CI", "str"), ("per_worker_mean", "per worker", "num"),
            ("eff_mean", "efficiency", "pct"), ("eff_ci", "95% CI (%)", "str"),
            ("model_eff", "model efficiency", "pct"),
            ("step_time_mean_s", "step (ms)", "ms"),
            ("comm_inflight_mean_s", "comm in flight (ms)", "ms"),
            ("comm_time_mean_s", "comm exposed (ms)", "ms"), ("hidden", "comm hidden", "pct"),
            ("link_mbit_model", "model link (Mbit/s)", "num"),
            ("verdict_text", "verdict", "wrap")]
    if df["procs_per_node"].nunique() > 1 or (df["procs_per_node"] != 1).any():
        cols.insert(2, ("procs_per_node", "proc/node", "int"))
    df["verdict_text"] = [model.verdict_label(r) for r in df[list(VERDICT_COLUMNS) + [
        "model_exposed_s", "straggler_hosts", "straggler_wait_s"]].to_dict("records")]
    if model.mixed(a.modelled):
        cols.insert(cols.index(("model_eff", "model efficiency", "pct")) + 1,
                    ("predicted_by", "predicted by", "str"))
    if len(a.sweeps) > 1:
        cols.insert(0, ("sweep_id", "sweep", "str"))
    varying = [c for c in ("model", "engine", "precision", "memory_format", "data",
                           "comm_setting") if c in df and df[c].nunique() > 1]
    names = {"comm_setting": "comm settings", "memory_format": "memory format"}
    for c in reversed(varying):
        cols.insert(1, (c, names.get(c, c), "str"))
    return _table(df, cols, "scaling")


def _slow_ranks_section(a: Analysis) -> str:
    """Each run's ranks against their peers: the flagged ones with their node and the others'
    wait, or one sentence that none was, with the threshold either way."""
    frame = model.slow_rank_rows(a)
    parts = ['<h2 id="slow-ranks">Slow ranks</h2>']
    parts += [f'<p class="note">{_e(x)}</p>' for x in model.slow_rank_notes(a)]
    if not frame.empty:
        cols = [("run", "run", "str"), ("node", "node", "str"), ("rank", "rank", "int"),
                ("world_size", "world size", "int"), ("batch_size", "batch", "batch"),
                ("link", "link", "str"), ("compute_ms", "its compute (ms/step)", "num"),
                ("others_ms", "others' median (ms/step)", "num"),
                ("excess", "slower by", "pct"), ("wait_ms", "others wait (ms/step)", "num")]
        if len(a.sweeps) > 1:
            cols.insert(0, ("sweep", "sweep", "str"))
        open_attr = " open" if len(frame) <= ALL_RUNS_OPEN_MAX else ""
        parts.append(f"<details{open_attr}><summary>{len(frame):,} flagged ranks (the others' "
                     "wait is the rank's compute minus their median: their exposed "
                     "communication grows by it)</summary>"
                     + _table(frame, cols, "slowranks") + "</details>")
    pairs = model.link_pair_rows(a)
    if pairs.empty:
        parts.append(f'<p class="note">{_e(model.LINK_PAIRS_NOTE)}</p>')
        return "\n".join(parts)
    flagged = int((pairs["flag"] != "").sum())
    when = ", ".join(sorted(set(pairs["measured_at"])))
    parts.append(f'<h3 id="link-pairs">Every pair\'s link rate (invoke check --links, {_e(when)})'
                 f'</h3><p class="note">{flagged} of {len(pairs)} pairs slow (below 80 % of '
                 "the median) or failed: a node in every slow pair has a slow NIC or link, "
                 "and its ranks wait in every collective.</p>")
    cols = [("pair", "pair", "str"), ("mbit", "Mbit/s", "num"),
            ("of_median", "of the median", "pct"), ("flag", "", "str")]
    if len(a.sweeps) > 1:
        cols.insert(0, ("sweep", "sweep", "str"))
    parts.append(_table(pairs, cols, "linkpairs"))
    return "\n".join(parts)


def _cost_section(a: Analysis) -> str:
    """Cost per million images across node count x link rate, where the sweep set a price."""
    price, frame = model.cost_rows(a)
    if price is None:
        return ""
    parts = ['<h2 id="cost">Cost per million images</h2>',
             f'<p class="note">At {price:,.2f} per node-hour (the sweep&#39;s '
             "price_per_node_hour): price x nodes / images per hour, from each point&#39;s mean "
             "throughput; the cheapest node count per link and batch is marked. More nodes cost "
             "more per image wherever scaling efficiency is below 100%.</p>"]
    cols = [("link", "link", "str"), ("batch_size", "batch", "batch"),
            ("nodes", "nodes", "int"), ("world_size", "world size", "int"),
            ("thr_mean", "images/s", "num"), ("cost", "cost per million images", "num"),
            ("cheapest", "", "str")]
    if len(a.sweeps) > 1:
        cols.insert(0, ("sweep_id", "sweep", "str"))
    parts.append(_table(frame, cols, "cost"))
    return "\n".join(parts)


def _comm_settings_section(a: Analysis) -> str:
    """Communication settings (bucket size, fusion threshold, cycle time, compression), where
    the sweep varies one: each setting's measured efficiency beside the model's prediction,
    the best per link rate named, and predicted-only rows for settings not run."""
    from scalelab.model import overlap

    frame = overlap.comm_settings(a.runs, a.alpha_s)
    if frame.empty:
        return ""
    frame = frame.copy()
    frame["what"] = np.where(frame["measured"], "measured", "predicted only (not run)")
    frame["mark"] = np.where(frame["best"], "best", "")
    frame.loc[frame["is_default"] & frame["measured"], "mark"] += np.where(
        frame.loc[frame["is_default"] & frame["measured"], "best"], ", default", "default")
    parts = ['<h2 id="comm-settings">Communication settings</h2>',
             '<p class="note">Per link rate, batch and world size: each setting&#39;s measured '
             "scaling efficiency (against the same setting&#39;s smallest world size) and "
             "images/s, beside the overlap model&#39;s prediction for it (bucket or fusion size "
             "and fp16 compression change the timeline it replays; no prediction without a "
             "per-layer profile). Rows marked predicted only were not run.</p><ul>"]
    point = ["sweep_id", "bandwidth", "batch_size", "scaling", "world_size"]
    for key, grp in frame.groupby(point, sort=False):
        best = grp[grp["best"]]
        if best.empty:
            continue
        b = best.iloc[0]
        text = (f"{key[1]}, {batch_text(key[2], key[3])}, {int(key[4])} ranks: best "
                "measured setting "
                f"{b['setting']} ({100 * b['eff']:.1f}% efficiency, {b['images_per_sec']:,.1f} "
                "images/s)")
        if b["gain_points"] == b["gain_points"]:
            text += (", the default" if b["is_default"] else
                     f", {b['gain_points']:+.1f} points and {b['gain_ips']:+,.1f} images/s "
                     "over the default")
        else:
            text += "; the default was not run"
        parts.append(f'<li class="best-setting">{_e(text)}</li>')
    parts.append("</ul>")
    cols = [("bandwidth", "link", "str"), ("batch_size", "batch", "batch"),
            ("world_size", "world size", "int"), ("setting", "setting", "str"),
            ("what", "row", "str"), ("eff", "efficiency measured", "pct"),
            ("model_eff", "efficiency predicted", "pct"),
            ("images_per_sec", "images/s", "num"), ("mark", "", "str")]
    if len(a.sweeps) > 1:
        cols.insert(0, ("sweep_id", "sweep", "str"))
    parts.append(_table(frame, cols, "comm-settings"))
    return "\n".join(parts)


def _fabric_note(a: Analysis, ideal_too: bool = True) -> str:
    """Which fabric the shaped links stood for, what it made them carry, and the sources
    (ideal_too: say so for the ideal fabric as well)."""
    from scalelab.model import fabric

    runs = a.runs
    if runs.empty or runs["bandwidth_mbit"].isna().all():
        return ""
    names = sorted(set(runs.get("fabric_profile", ["ideal"])) - {""}) or [fabric.IDEAL]
    out = []
    for name in names:
        fab = fabric.maybe(name)
        if fab is None and not ideal_too:
            continue
        if fab is None:
            out.append('<p class="note fabric">Fabric profile: ideal. A shaped link '
                       "carried its line rate as tc gives it (Gloo reaches 90-96 % of it on a "
                       "veth). Real Ethernet with TCP carries less, most of all with several GPUs "
                       "per node: <code>--fabric-profile ethernet-tcp</code> shapes and models "
                       "that.</p>")
            continue
        sel = runs[(runs["fabric_profile"] == name) & runs["bandwidth_mbit"].notna()]
        pairs = sorted({(float(b), int(p)) for b, p in zip(sel["bandwidth_mbit"],
                                                          sel["procs_per_node"], strict=True) if p == p})
        lines = "; ".join(
            f"{_e(rate_label(b))} with {p} rank{'s' if p > 1 else ''} per node carried "
            f"{fab.share(b, p) * 100:.1f} % of it ({_e(rate_label(fab.collective_mbit(b, p)))}, "
            f"tc at {_e(rate_label(fab.tc_mbit(b, p)))} for the framing tc does not count); "
            f"source: {_e(fab.source_for(b).rstrip('.'))}" for b, p in pairs)
        out.append(f'<p class="note fabric">Fabric profile: {_e(fab.name)} '
                   f"({_e(fab.description)}). {lines}. Per-hop latency in the model "
                   f"{fab.per_hop_latency_s * 1e6:g} us; source: "
                   f"{_e(' '.join(fab.latency_source.split()).rstrip('.'))}.</p>")
    return "\n".join(out)


def _emulation_section(a: Analysis) -> str:
    """Emulated accelerators: fidelity per point, the model against the measurement, and
    predictions beyond the measured points."""
    df = model.emulation_rows(a)
    if df.empty:
        return ""
    src = sorted(set(df["accelerator_source"].astype(str)) - {""})
    parts = ['<h2 id="emulation">Emulated accelerator</h2>',
             '<p class="note">Every rank kept the real model&#39;s parameters and the engine&#39;s real '
             f"gradient communication over its shaped link; forward, backward and the optimizer "
             f"step were waits from a device profile ({_e(', '.join(src) or 'unknown')}). With "
             f"dilation k the waits were k times longer and the links k times slower, and every "
             f"time here is divided by k. A point is emulation-bound when in its timed steps the "
             f"host had under {analysis.HOST_IDLE_MIN * 100:.0f}% CPU idle, the compute waits "
             f"stretched over {analysis.COMPUTE_FIDELITY * 100:.0f}% past the profile, or the "
             f"link gave under {analysis.LINK_FIDELITY * 100:.0f}% of its dilated rate. The "
             f"model is the overlap model: it replays the bucket timeline (a bucket&#39;s "
             f"transfer starts when its last gradient is ready and the previous bucket&#39;s "
             f"transfer is done); its error is stated once, under Bottleneck per series.</p>"]
    parts.append(_fabric_note(a))
    cols = [("bandwidth", "link", "str"), ("batch_size", "batch", "batch"),
            ("world_size", "world size", "int"), ("dilation", "k", "num"),
            ("eff_mean", "measured efficiency", "pct"), ("model_eff", "model efficiency", "pct"),
            ("profile_step_s", "profile step (ms)", "ms"),
            ("compute_time_mean_s", "emulated compute (ms)", "ms"),
            ("host_cpu_idle", "host idle", "pct"), ("link_utilisation", "link busy", "pct"),
            ("fidelity_text", "fidelity", "str")]
    if model.mixed(df):
        cols.insert(6, ("predicted_by", "predicted by", "str"))
    parts.append(_table(df, cols, "emulation"))
    wf = model.what_if_rows(a, df)
    if not wf.empty:
        wf["link"] = wf["link_mbit"].map(rate_label)
        from scalelab.model import published

        total, within, worst, missing = published.summary()
        parts.append('<p class="note"><strong>Predictions, not measurements:</strong> the '
                     "overlap model beyond the measured points (more nodes; the link 10x "
                     "faster). Its error on this sweep&#39;s measured points is the one stated "
                     "under Bottleneck per series. Against published clusters (data-parallel "
                     "ResNet at up to 32 GPUs on a stated network, each on its fabric profile "
                     f"and with its table&#39;s one-node GPU-side cost where it has one) the "
                     f"same model is within {published.AIM_POINTS:g} points at {within} of "
                     f"{total} points; its largest miss is {worst:.1f} points, where it "
                     f"leaves out {_e(missing.split(':')[0])} "
                     "(<code>bench/perf/published_check.py</code> prints every point and what "
                     "each miss leaves out).</p>")
        parts.append(_table(wf, [("from", "from the measured series", "str"),
                                 ("link", "predicted link", "str"),
                                 ("world_size", "world size", "int"),
                                 ("link_mbit", "link (Mbit/s)", "num"),
                                 ("images_per_sec", "predicted images/s", "num"),
                                 ("eff", "predicted efficiency", "pct")], "whatif"))
    return "\n".join(parts)


def _ci_text(lo: pd.Series, hi: pd.Series, fmt: Callable[[float], str]) -> pd.Series:
    return pd.Series([("" if math.isnan(a) else f"{fmt(a)} – {fmt(b)}")
                      for a, b in zip(lo.astype(float), hi.astype(float), strict=True)],
                     index=lo.index)


RUN_COLUMNS = [("run_id", "run", "str"), ("nodes", "nodes", "int"),
               ("procs_per_node", "proc/node", "int"), ("world_size", "world", "int"),
               ("batch_size", "batch", "batch"), ("bandwidth", "link", "str"),
               ("repeat", "repeat", "int"), ("status", "status", "str"),
               ("images_per_sec", "images/s", "num"),
               ("images_per_sec_per_worker", "images/s/worker", "num"),
               ("step_time_mean_s", "step mean (ms)", "ms"),
               ("step_time_p95_s", "step p95 (ms)", "ms"), ("comm_fraction", "comm", "pct"),
               ("busbw_mb_s", "busbw (MB/s)", "num"),
               ("link_mbit_measured", "link (Mbit/s)", "num"),
               ("scaling_efficiency", "efficiency", "pct"), ("started_at", "started", "str"),
               ("duration_s", "duration (s)", "num")]


def _runs_tables(a: Analysis) -> str:
    runs = a.runs
    multi = len(a.sweeps) > 1
    jobs = [("slurm_job_id", "Slurm job", "str")] if (runs["slurm_job_id"] != "").any() else []
    cols = ([("sweep_id", "sweep", "str")] if multi else []) + RUN_COLUMNS + jobs
    failed = runs[runs["status"] != "ok"]
    parts = ["<h2 id=\"failed\">Failed runs</h2>"]
    if failed.empty:
        parts.append('<p class="note">No training run failed.</p>')
    else:
        parts.append(_table(failed, ([("sweep_id", "sweep", "str")] if multi else [])
                            + [("run_id", "run", "str"), ("status", "status", "str"),
                               ("world_size", "world", "int"), ("batch_size", "batch", "batch"),
                               ("bandwidth", "link", "str"), ("started_at", "started", "str"),
                               *jobs, ("error", "error", "pre")], "failed"))
    bad_probes = pd.concat([s.probes for s in a.sweeps], ignore_index=True)
    bad_probes = bad_probes[bad_probes["status"] != "ok"]
    if not bad_probes.empty:
        parts.append("<h3>Failed allreduce probes</h3>")
        parts.append(_table(bad_probes, [("sweep_id", "sweep", "str"), ("run_id", "run", "str"),
                                         ("status", "status", "str"), ("error", "error", "pre")]))
    open_attr = " open" if len(runs) <= ALL_RUNS_OPEN_MAX else ""
    parts += ["<h2 id=\"runs\">All training runs</h2>",
              f"<details{open_attr}><summary>{len(runs)} runs (one row per run; the same "
              "figures as results.csv)</summary>", _table(runs, cols, "runs"), "</details>"]
    return "".join(parts)


def _method_note(a: Analysis) -> str:
    mode = "max(compute, comm)" if a.overlap else "compute + comm"
    return (
        '<h2 id="method">How these numbers are computed</h2><ul class="note">'
        "<li>Throughput of a run is the sum of its ranks' images/s, never rank 0 x N; per-worker "
        "throughput is the mean over ranks; step p95 is the worst rank's p95 (the slowest rank "
        "gates every synchronous step).</li>"
        "<li>Scaling efficiency = throughput(N) / ((N/N0) x throughput(N0)), N0 the smallest world "
        "size the plan gives the series (same sweep, model, engine, precision, data, batch per "
        "worker, link, processes per node); throughput(N0) is the mean of its ok repeats. A "
        "series with no ok run at N0 has no efficiency: a larger N0 would silently read as "
        "100 %.</li>"
        "<li>95% intervals: Student t over repeats. For efficiency, each repeat's efficiency "
        "against the mean baseline, so the baseline's own noise shows at N0 rather than at every "
        "N. One repeat: no interval.</li>"
        "<li>Model: one prediction per point. Where a per-layer profile gives the times at "
        "which gradients become ready (emulated accelerators), the overlap model replays the "
        "engine's buckets: a bucket's ring allreduce starts when its last gradient is ready and "
        "the previous bucket's is done, and step = forward + max(backward, last allreduce end) "
        "+ optimizer. Elsewhere the ring model, one allreduce of the whole gradient: step = "
        f"{mode}. Both: comm = 2(N-1)/N x S/B + alpha x 2(N-1); S = gradient bytes at the "
        "run's precision; B = measured link rate, else the requested one, else allreduce busbw; "
        f"alpha = {a.alpha_s * 1e6:.1f} us ({_e(a.alpha_source)}); ranks on one node do not use "
        "the link. Exposed communication = predicted step - predicted step without "
        "communication.</li>"
        "<li>Verdict per point above N0, first match: input-bound (real data, and a step waits "
        f"{verdict.INPUT_SHARE * 100:.0f}% of its time for input or is "
        f"{(verdict.INPUT_SLOWDOWN - 1) * 100:.0f}% slower than on synthetic data), "
        "emulation-bound (the fidelity guard, or local ranks outnumber host cores), "
        "straggler-bound (a rank flagged under Slow ranks in half or more of the point's runs, "
        "and the model with the others' wait "
        f"for it added to every step lands within {verdict.TRACKING_TOLERANCE * 100:.0f} points "
        "of the measurement and nearer than without it, the wait being at least the exposed "
        "communication), emulation-bound (compute per rank grew, or the measured link is below "
        f"{verdict.LINK_SHORTFALL * 100:.0f}% of the request), then from the model: "
        "network-bound when the exposed communication is at "
        f"least {verdict.NETWORK_SHARE * 100:.0f}% of the step and the measurement is within "
        f"{verdict.TRACKING_TOLERANCE * 100:.0f} points of the model, compute-bound when it is "
        "less; a point the model cannot predict or explain is undetermined, and its verdict "
        "names the measurement that would settle it. A series' bottleneck is its largest world "
        "size's verdict. Verdicts are stated plainly when the model's largest error is under "
        f"{verdict.CONFIDENT_ERROR * 100:.0f} points, else as \"likely\".</li></ul>")


def render(a: Analysis, title: str, compare: bool, csv_links: list[tuple[str, str]]) -> str:
    lay = layout(a.modelled, compare)
    figs = draw_figures(a, lay)
    parts = [f"<h1>{_e(title)}</h1>", _banners(a.sweeps),
             f'<p class="note">Generated {datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")} by '
             f"scalelab {_e(_version())}. Results: "
             + ", ".join(f'<a href="{_e(href)}">{_e(name)}</a>' for name, href in csv_links)
             + ". Sections: <a href=\"#figures\">figures</a>, <a href=\"#bottlenecks\">"
             "bottlenecks</a>, <a href=\"#scaling\">scaling table</a>, <a href=\"#slow-ranks\">"
             "slow ranks</a>, <a href=\"#failed\">"
             "failed runs</a>, <a href=\"#runs\">all runs</a>.</p>",
             '<h2 id="summary">Summary</h2>']
    found = model.findings(a)
    if found:
        parts.insert(2, '<section class="findings"><h2 id="findings">What this sweep found</h2><ul>'
                     + "".join(f"<li>{_e(x)}</li>" for x in found) + "</ul></section>")
    if compare:
        sums = [dict(_summary_pairs(s)) for s in a.sweeps]
        keys = list(dict.fromkeys(k for d in sums for k in d))  # rows only some sweeps have
        frame = pd.DataFrame([{"what": k, **{f"s{i}": d.get(k, "") for i, d in enumerate(sums)}}
                              for k in keys])
        parts.append(_table(frame, [("what", "", "str")] + [
            (f"s{i}", s.sweep_id, "str") for i, s in enumerate(a.sweeps)], "kv"))
    else:
        parts.append(_kv(_summary_pairs(a.sweeps[0])))
    parts.append(_bottleneck_section(a))
    parts.append('<h2 id="figures">Figures</h2>')
    parts.append('<p class="note">One colour per batch size in every figure except the '
                 "allreduce one (Okabe-Ito palette, colour-blind safe)"
                 + ("; panels are link rates" if lay.panel_col else "; all series share one set of axes")
                 + ".</p>")
    for f in figs:
        parts.append(f'<figure><img alt="{_e(f.alt)}" src="data:image/png;base64,{f.png_b64}">'
                     f"<figcaption><strong>{_e(f.title)}.</strong> {_e(f.caption)}</figcaption>"
                     f"{_figure_data(f.data, len(a.sweeps) > 1)}</figure>")
    parts.append('<h2 id="scaling">Scaling table</h2>')
    parts.append(_scaling_table(a))
    parts.append(_slow_ranks_section(a))
    parts.append(_cost_section(a))
    comm = _comm_settings_section(a)  # only where a sweep varies a setting
    if comm:
        parts.append(comm)
    emulation = _emulation_section(a)
    parts.append(emulation)
    if not emulation:  # there the fabric note opens the section; elsewhere it stands alone
        parts.append(_fabric_note(a, ideal_too=False))
    parts.append(_runs_tables(a))
    for s in a.sweeps:
        parts.append(_sweep_details(s))
    parts.append(_method_note(a))
    return _page(title, "\n".join(parts))


def _figure_data(data: pd.DataFrame | None, multi: bool) -> str:
    """The numbers a figure plots, folded under it: what a screen reader and a test can read."""
    if data is None or data.empty:
        return ""
    cols = [("bandwidth", "link", "str"), ("batch_size", "batch", "batch"),
            ("procs_per_node", "proc/node", "int"), ("world_size", "world size", "int"),
            ("eff_mean", "measured efficiency", "pct"), ("model_eff", "predicted efficiency", "pct"),
            ("predicted_by", "predicted by", "str")]
    if multi:
        cols.insert(0, ("sweep_id", "sweep", "str"))
    return ("<details><summary>The numbers in this figure</summary>"
            + _table(data, cols, "figdata") + "</details>")


def _version() -> str:
    try:
        return importlib.metadata.version("scalelab")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"
