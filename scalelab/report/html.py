"""The report's page: escaped text, tables, banners and sections, one self-contained HTML file."""

from __future__ import annotations

import html
import importlib.metadata
import json
import logging
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from scalelab import analysis, store
from scalelab.report.data import Analysis, SweepData
from scalelab.report.figures import Layout, draw_figures, layout

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
    elif kind == "int":
        out = series.map(lambda v: "" if pd.isna(v) else str(int(v)))
    else:
        out = series.astype(str).map(html.escape)
    return out


def _table(frame: pd.DataFrame, columns: list[tuple[str, str, str]], cls: str = "") -> str:
    """An HTML table; columns are (frame column, header, kind: str|num|int|pct|pre)."""
    head = "".join(f"<th>{_e(h)}</th>" for _, h, _ in columns)
    if frame.empty:
        return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody></tbody></table>'
    cells = []
    for col, _, kind in columns:
        text = _col_text(frame[col], "str" if kind == "pre" else kind)
        if kind == "pre":
            text = "<pre>" + text + "</pre>"
        tag = '<td class="n">' if kind in ("num", "int", "pct") else "<td>"
        cells.append(tag + text + "</td>")
    rows = cells[0]
    for c in cells[1:]:
        rows = rows + c
    body = "<tr>" + rows + "</tr>"
    return (f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>'
            + "\n".join(body.tolist()) + "</tbody></table>")


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
table.scaling td,table.runs td{white-space:nowrap}
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
                   f"{_e(', '.join(synthetic))} was generated by scalelab.synthetic."
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
        f"{r.model} {r.engine} batch {int(r.batch_size)} at {r.bandwidth}, "
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
    ...                          "accelerator": ["v100"]}), [0])
    'emulated v100, one per rank'
    """
    smi = f" (nvidia-smi: {', '.join(str(g) for g in declared)})" if any(declared) else ""
    emulated = sorted({a for a in runs.get("accelerator", []) if a})
    if emulated:
        return f"emulated {', '.join(emulated)}, one per rank{smi}"
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
        ("link rates measured (mean)", measured_txt),
        ("transport (from the ranks)", _transport_text(runs)),
        ("allreduce busbw at largest message", busbw_txt),
        ("launcher", _launchers(runs, s.probes)),
        ("date and duration", when),
        ("training runs", f"{len(runs)} recorded: {status_txt}"),
        ("training run time by phase", _time_split(runs)),
        ("allreduce probes", f"{len(s.probes)} recorded, {probe_ok} ok"),
        ("planned runs", f"{len(meta.get('planned_runs') or [])} planned, "
                         f"{len(s.missing)} without a record"),
        ("environment fingerprints", f"{s.env_fingerprints} distinct"
         + (" (runs ran on different software!)" if s.env_fingerprints > 1 else "")),
    ]
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
    """Shares of the ok training runs' wall time by phase (scalelab.driver.timeline)."""
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


def _bottleneck_table(a: Analysis, lay: Layout) -> str:
    mbit = dict(zip(a.modelled["bandwidth"], a.modelled["bandwidth_mbit"].astype(float),
                    strict=False))

    def order(b: analysis.Bottleneck) -> tuple:
        s = b.series
        rate = mbit.get(s["bandwidth"], math.nan)
        return (s["sweep_id"], math.isnan(rate), 0.0 if math.isnan(rate) else rate,
                s["batch_size"], s["procs_per_node"], str(s["model"]), str(s["data"]))

    rows = []
    for b in sorted(a.bottlenecks, key=order):
        s = b.series
        rows.append({"sweep": s["sweep_id"], "series": f"batch {s['batch_size']}/worker, link "
                     f"{s['bandwidth']}, {s['procs_per_node']} proc/node, {s['model']} "
                     f"{s['engine']} {s['precision']} {s['data']}",
                     "n": b.world_size, "eff": b.measured_eff, "pred": b.predicted_eff,
                     "share": b.comm_share, "kind": b.kind, "why": b.explanation})
    frame = pd.DataFrame(rows)
    cols = [("series", "series", "str"), ("n", "at world size", "int"),
            ("eff", "measured efficiency", "pct"), ("pred", "model efficiency", "pct"),
            ("share", "model comm share", "pct"), ("kind", "bottleneck", "str"),
            ("why", "why", "str")]
    if len(a.sweeps) > 1:
        cols.insert(0, ("sweep", "sweep", "str"))
    return _table(frame, cols, "bottlenecks")


def _scaling_table(a: Analysis) -> str:
    df = a.modelled.assign(_bw=a.modelled["bandwidth_mbit"].astype(float).fillna(np.inf))
    df = df.sort_values(["sweep_id", "_bw", "batch_size", "procs_per_node", "model", "engine",
                         "precision", "data", "world_size"], kind="stable")
    df["thr_ci"] = _ci_text(df["thr_lo"], df["thr_hi"], "{:.4g}")
    df["eff_ci"] = _ci_text(df["eff_lo"] * 100, df["eff_hi"] * 100, "{:.1f}")
    # the share of the time gradients were in flight that backward computation hid
    inflight = df["comm_inflight_mean_s"].astype(float)
    df["hidden"] = ((inflight - df["comm_time_mean_s"].astype(float)).clip(lower=0)
                    / inflight.where(inflight > 0))
    cols = [("bandwidth", "link", "str"), ("batch_size", "batch/worker", "int"),
            ("procs_per_node", "proc/node", "int"), ("world_size", "world size", "int"),
            ("n", "repeats", "int"), ("thr_mean", "images/s", "num"),
            ("thr_ci", "95% CI", "str"), ("per_worker_mean", "images/s/worker", "num"),
            ("eff_mean", "efficiency", "pct"), ("eff_ci", "95% CI (%)", "str"),
            ("predicted_eff", "model efficiency", "pct"),
            ("step_time_mean_s", "step (s)", "num"), ("comm_fraction", "comm fraction", "pct"),
            ("comm_inflight_mean_s", "comm in flight (s)", "num"),
            ("comm_time_mean_s", "comm exposed (s)", "num"), ("hidden", "comm hidden", "pct"),
            ("link_mbit_model", "model link (Mbit/s)", "num"), ("link_source", "link from", "str")]
    if len(a.sweeps) > 1:
        cols.insert(0, ("sweep_id", "sweep", "str"))
    varying = [c for c in ("model", "engine", "precision", "data") if df[c].nunique() > 1]
    for c in reversed(varying):
        cols.insert(1, (c, c, "str"))
    return _table(df, cols, "scaling")


def findings(a: Analysis) -> list[str]:
    """What the sweep found, in numbers, one line per batch size: the efficiency each link rate
    reached at the largest world size, and from which world size the network is the bottleneck
    (the first whose efficiency falls below analysis.COMPUTE_BOUND_EFFICIENCY and whose series is
    judged network-bound)."""
    df = a.modelled
    if df.empty:
        return []
    kinds = {tuple(b.series[k] for k in analysis.SERIES_KEYS): b.kind for b in a.bottlenecks}
    lines = []
    keys = [k for k in analysis.SERIES_KEYS if k not in ("bandwidth",)]
    for key, grp in df.groupby(keys, dropna=False, sort=True):
        series = dict(zip(keys, key, strict=True))
        parts, starts = [], []
        grp = grp.assign(_bw=grp["bandwidth_mbit"].astype(float).fillna(np.inf))
        for bw, g in grp.sort_values(["_bw", "world_size"]).groupby("bandwidth", sort=False):
            last = g.iloc[-1]
            eff = float(last["eff_mean"])
            parts.append(f"at {bw}, {int(last['world_size'])} ranks reach "
                         + (f"{_fmt(eff * 100, 3)}% efficiency" if not math.isnan(eff) else
                            "an efficiency that could not be measured"))
            kind = kinds.get(tuple({**series, "bandwidth": bw}[k] for k in analysis.SERIES_KEYS))
            low = g[(g["eff_mean"].astype(float) < analysis.COMPUTE_BOUND_EFFICIENCY)
                    & (g["world_size"] > 1)]
            if kind == "network-bound" and not low.empty:
                starts.append(f"from N = {int(low.iloc[0]['world_size'])} at {bw}")
            elif kind == "emulation-bound":
                starts.append(f"at {bw} the emulation, not the network, limits the largest runs")
        what = f"{series['model']}, batch {int(series['batch_size'])}"
        acc = str(grp["accelerator"].iloc[0]) if "accelerator" in grp and grp["accelerator"].iloc[0] else ""
        if acc:
            what += f" on emulated {acc}"
        line = f"{what}: " + "; ".join(parts) + "."
        net = [x for x in starts if x.startswith("from")]
        emu = [x for x in starts if not x.startswith("from")]
        if net:
            line += " The network is the bottleneck " + ", ".join(net) + "."
        if emu:
            line += " " + "; ".join(emu).capitalize() + "."
        lines.append(line)
    return lines


def _emulation_section(a: Analysis) -> str:
    """Emulated accelerators: fidelity per point, both models against the measurement, and
    predictions beyond the measured points."""
    df = a.modelled
    if "accelerator" not in df or not df["accelerator"].astype(bool).any():
        return ""
    df = df[df["accelerator"].astype(bool)].copy()
    df = df.assign(_bw=df["bandwidth_mbit"].astype(float).fillna(np.inf)).sort_values(
        ["_bw", "batch_size", "world_size"], kind="stable")
    df["ring_err"] = (df["predicted_eff"] - df["eff_mean"]).abs()
    if "overlap_eff" not in df:
        df["overlap_eff"] = np.nan
    df["overlap_err"] = (df["overlap_eff"] - df["eff_mean"]).abs()
    df["fidelity_text"] = df["fidelity"].where(df["fidelity"].astype(bool), "faithful")
    src = sorted(set(df["accelerator_source"].astype(str)) - {""})
    parts = ['<h2 id="emulation">Emulated accelerator</h2>',
             '<p class="note">Every rank kept the real model&#39;s parameters and the engine&#39;s real '
             f"gradient communication over its shaped link; forward, backward and the optimizer "
             f"step were waits from a device profile ({_e(', '.join(src) or 'unknown')}). With "
             f"dilation k the waits were k times longer and the links k times slower, and every "
             f"time here is divided by k. A point is emulation-bound when in its timed steps the "
             f"host had under {analysis.HOST_IDLE_MIN * 100:.0f}% CPU idle, the compute waits "
             f"stretched over {analysis.COMPUTE_FIDELITY * 100:.0f}% past the profile, or the "
             f"link gave under {analysis.LINK_FIDELITY * 100:.0f}% of its dilated rate. The ring "
             f"model adds compute and communication; the overlap model replays the bucket "
             f"timeline (a bucket's transfer starts when its last gradient is ready and the "
             f"previous bucket's transfer is done).</p>"]
    cols = [("bandwidth", "link", "str"), ("batch_size", "batch", "int"),
            ("world_size", "world size", "int"), ("dilation", "k", "num"),
            ("eff_mean", "measured efficiency", "pct"),
            ("predicted_eff", "ring model", "pct"), ("ring_err", "error", "pct"),
            ("overlap_eff", "overlap model", "pct"), ("overlap_err", "error", "pct"),
            ("profile_step_s", "profile step (s)", "num"),
            ("compute_time_mean_s", "emulated compute (s)", "num"),
            ("host_cpu_idle", "host idle", "pct"), ("link_utilisation", "link busy", "pct"),
            ("fidelity_text", "fidelity", "str")]
    parts.append(_table(df, cols, "emulation"))
    from scalelab import overlap as bucket_model

    rows = []
    for _, g in df.groupby(["bandwidth", "batch_size"], sort=False):
        last = g.iloc[-1]
        nmax = int(last["world_size"])
        err = float(g["overlap_err"].max())
        for r in bucket_model.what_if(last, sorted({nmax * 2, 16, 32, 64} - {nmax}), (1.0, 10.0),
                                      a.alpha_s):
            # a row is labelled by the link it predicts for, never by the measured series'
            # (a "10x faster" row of the 1gbit series is a 10gbit row)
            link = rate_label(float(r["link_mbit"])) if r.get("link_mbit") else "?"
            rows.append({"from": f"{last['bandwidth']}, batch {int(last['batch_size'])}",
                         "link": link, **r, "err": err})
    if rows:
        wf = pd.DataFrame(rows).sort_values(["from", "link_mbit", "world_size"], kind="stable")
        parts.append('<p class="note"><strong>Predictions, not measurements:</strong> the '
                     "overlap model beyond the measured points (more nodes; the link 10x "
                     "faster), with the largest error it made on this sweep's measured points "
                     "beside each.</p>")
        parts.append(_table(wf, [("from", "from the measured series", "str"),
                                 ("link", "predicted link", "str"),
                                 ("world_size", "world size", "int"),
                                 ("link_mbit", "link (Mbit/s)", "num"),
                                 ("images_per_sec", "predicted images/s", "num"),
                                 ("eff", "predicted efficiency", "pct"),
                                 ("err", "model error on this sweep", "pct")], "whatif"))
    return "\n".join(parts)


def _ci_text(lo: pd.Series, hi: pd.Series, fmt: str) -> pd.Series:
    return pd.Series([("" if math.isnan(a) else f"{fmt.format(a)} – {fmt.format(b)}")
                      for a, b in zip(lo.astype(float), hi.astype(float), strict=True)],
                     index=lo.index)


RUN_COLUMNS = [("run_id", "run", "str"), ("nodes", "nodes", "int"),
               ("procs_per_node", "proc/node", "int"), ("world_size", "world", "int"),
               ("batch_size", "batch", "int"), ("bandwidth", "link", "str"),
               ("repeat", "repeat", "int"), ("status", "status", "str"),
               ("images_per_sec", "images/s", "num"),
               ("images_per_sec_per_worker", "images/s/worker", "num"),
               ("step_time_mean_s", "step mean (s)", "num"),
               ("step_time_p95_s", "step p95 (s)", "num"), ("comm_fraction", "comm", "pct"),
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
                               ("world_size", "world", "int"), ("batch_size", "batch", "int"),
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
        f"<li>Model: step = {mode}; comm = 2(N-1)/N x S/B + alpha x 2(N-1); S = gradient bytes "
        "at the run's precision; B = measured link rate, else the requested one, else allreduce "
        f"busbw; alpha = {a.alpha_s * 1e6:.1f} us ({_e(a.alpha_source)}); compute = measured "
        "compute time at the smallest world size; ranks on one node do not use the link.</li>"
        "<li>Bottleneck at the largest world size, first match: input-bound (real data 10% slower "
        "than synthetic), compute-bound (efficiency at least 90%), emulation-bound (local ranks "
        "outnumber host cores, or measured link below 80% of requested), network-bound (model "
        "comm share at least 10% and measured within 15 points of the model), else "
        "undetermined.</li></ul>")


def render(a: Analysis, title: str, compare: bool, csv_links: list[tuple[str, str]]) -> str:
    lay = layout(a.modelled, compare)
    figs = draw_figures(a, lay)
    parts = [f"<h1>{_e(title)}</h1>", _banners(a.sweeps),
             f'<p class="note">Generated {datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")} by '
             f"scalelab {_e(_version())}. Results: "
             + ", ".join(f'<a href="{_e(href)}">{_e(name)}</a>' for name, href in csv_links)
             + ". Sections: <a href=\"#figures\">figures</a>, <a href=\"#bottlenecks\">"
             "bottlenecks</a>, <a href=\"#scaling\">scaling table</a>, <a href=\"#failed\">"
             "failed runs</a>, <a href=\"#runs\">all runs</a>.</p>",
             '<h2 id="summary">Summary</h2>']
    found = findings(a)
    if found:
        parts.insert(2, '<section class="findings"><h2 id="findings">What this sweep found</h2><ul>'
                     + "".join(f"<li>{_e(x)}</li>" for x in found) + "</ul></section>")
    if compare:
        sums = [dict(_summary_pairs(s)) for s in a.sweeps]
        keys = list(sums[0].keys())
        frame = pd.DataFrame([{"what": k, **{f"s{i}": d.get(k, "") for i, d in enumerate(sums)}}
                              for k in keys])
        parts.append(_table(frame, [("what", "", "str")] + [
            (f"s{i}", s.sweep_id, "str") for i, s in enumerate(a.sweeps)], "kv"))
    else:
        parts.append(_kv(_summary_pairs(a.sweeps[0])))
    parts.append('<h2 id="bottlenecks">Bottleneck per series</h2>')
    parts.append(_bottleneck_table(a, lay))
    parts.append('<h2 id="figures">Figures</h2>')
    parts.append('<p class="note">One colour per batch size in every figure except the '
                 "allreduce one (Okabe-Ito palette, colour-blind safe)"
                 + ("; panels are link rates" if lay.panel_col else "; all series share one set of axes")
                 + ".</p>")
    for f in figs:
        parts.append(f'<figure><img alt="{_e(f.alt)}" src="data:image/png;base64,{f.png_b64}">'
                     f"<figcaption><strong>{_e(f.title)}.</strong> {_e(f.caption)}</figcaption>"
                     "</figure>")
    parts.append('<h2 id="scaling">Scaling table</h2>')
    parts.append(_scaling_table(a))
    parts.append(_emulation_section(a))
    parts.append(_runs_tables(a))
    for s in a.sweeps:
        parts.append(_sweep_details(s))
    parts.append(_method_note(a))
    return _page(title, "\n".join(parts))


def _version() -> str:
    try:
        return importlib.metadata.version("scalelab")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"
