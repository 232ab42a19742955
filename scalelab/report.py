"""The HTML report: one self-contained index.html per sweep, or one comparing several sweeps.

Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot, no global
backend switch) and embedded as base64 PNG; styles are inline; the page carries a Content
Security Policy that forbids scripts and any load other than its own data: images, so it opens
offline and nothing taken from the results can run. Every text that comes from results is
HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import importlib.metadata
import io
import json
import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from scalelab import analysis, results, store
from scalelab.results import ReportError
from scalelab.state import reports_dir, write_atomic

log = logging.getLogger(__name__)

__all__ = ["ReportError", "SweepData", "build", "build_comparison", "build_report",
           "known_sweeps", "load_sweep_data", "resolve_sweep"]

# Okabe & Ito (2008), colour-blind safe; yellow and black last (weak on white / reserved).
OKABE_ITO = ["#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442",
             "#000000"]
LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
SHORT_KIND = {"network-bound": "network", "compute-bound": "compute", "input-bound": "input",
              "emulation-bound": "emulation", "undetermined": "?"}
DPI = 100
STEP_SPLIT_MAX_SIZES = 8  # world sizes shown as bar groups in the step-time figure
BUSBW_MAX_SIZES = 8  # world sizes drawn in the allreduce figure
ALL_RUNS_OPEN_MAX = 200  # the all-runs table starts folded above this many rows


# ---------------------------------------------------------------------------- finding sweeps

def known_sweeps(root: Path | None = None) -> list[str]:
    """Ids of the sweeps under the reports root, oldest first."""
    return store.list_sweeps(Path(root) if root else reports_dir())


def resolve_sweep(ref: str | Path, root: Path | None = None) -> Path:
    """A sweep directory from an id, a unique prefix of one, ``latest`` (the reports/latest
    symlink) or a path to a sweep directory: scalelab.store.resolve_sweep, never a second
    lookup."""
    if not str(ref).strip():
        raise ReportError("no sweep given; pass a sweep id, latest, or a sweep directory")
    return store.resolve_sweep(Path(root) if root else reports_dir(), ref, paths=True).resolve()


# ---------------------------------------------------------------------------- loading

@dataclass
class SweepData:
    """One sweep as read from its store of record."""

    path: Path
    sweep_id: str
    meta: dict[str, Any]
    runs: pd.DataFrame  # scalelab.results.to_frame
    allreduce: pd.DataFrame  # scalelab.results.allreduce_frame
    probes: pd.DataFrame  # one row per allreduce probe: run_id, status, error, duration_s
    env_fingerprints: int  # distinct environment fingerprints over all records
    missing: list[str] = field(default_factory=list)  # planned run ids without a record

    @property
    def synthetic(self) -> bool:
        return bool(self.meta.get("synthetic"))


# per-run facts that differ by design between runs of one sweep: who ran, not what software
_PER_RUN_ENV = ("hostnames", "nodes", "tc", "pid")


def software_fingerprint(env: dict[str, Any]) -> str:
    """The software and hardware part of a run's environment, as one comparable string.

    >>> a = {"torch": "2.13.0", "hostnames": ["n0"], "tc": "1gbit"}
    >>> software_fingerprint(a) == software_fingerprint({**a, "hostnames": ["n0", "n1"]})
    True
    """
    return json.dumps({k: v for k, v in env.items() if k not in _PER_RUN_ENV}, sort_keys=True)


def load_sweep_data(ref: str | Path, root: Path | None = None) -> SweepData:
    """Resolve, read and check a sweep; a ReportError says why it cannot be reported."""
    path = resolve_sweep(ref, root)
    meta = results.load_sweep(path)
    records = results.load_runs(path)
    sweep_id = str(meta.get("sweep_id") or path.name)
    if not records:
        raise ReportError(f"sweep {sweep_id!r} has no runs recorded yet ({path / store.RUNS_FILE}"
                          " is empty or missing); run or resume it with invoke bench")
    runs = results.to_frame(records, results.plan_min_nodes({"sweep_id": sweep_id, **meta}))
    if runs.empty:
        raise ReportError(f"sweep {sweep_id!r} has no training runs, only allreduce probes; "
                          "nothing to report")
    ok = runs["status"] == "ok"
    if not ok.any():
        counts = ", ".join(f"{k} {v}" for k, v in runs["status"].value_counts().items())
        first = next((e for e in runs["error"] if e.strip()), "no error text")
        first = first.strip().splitlines()[-1][:200]
        raise ReportError(f"all {len(runs)} training runs of sweep {sweep_id!r} failed ({counts});"
                          f" first error: {first}; see {path / store.RUNS_FILE}")
    recorded = {str(r.get("run_id")) for r in records}
    missing = [str(r) for r in meta.get("planned_runs") or [] if str(r) not in recorded]
    if missing:
        log.warning("sweep %s: %d of %d planned runs have no record", sweep_id, len(missing),
                    len(meta.get("planned_runs") or []))
    probes = pd.DataFrame(
        [{"sweep_id": sweep_id, "run_id": str(r.get("run_id", "")),
          "status": str(r.get("status", "")), "error": str(r.get("error") or ""),
          "duration_s": float(r.get("duration_s") or 0.0)}
         for r in records if r.get("kind") == "allreduce"],
        columns=["sweep_id", "run_id", "status", "error", "duration_s"])
    envs = len({software_fingerprint(r.get("env") or {}) for r in records})
    # The raw records are not kept: a million live dicts make every garbage collection
    # during figure drawing slow.
    return SweepData(path, sweep_id, meta, runs, results.allreduce_frame(records), probes,
                     envs, missing)


# ---------------------------------------------------------------------------- analysis bundle

@dataclass
class _Analysis:
    sweeps: list[SweepData]
    runs: pd.DataFrame
    allreduce: pd.DataFrame
    modelled: pd.DataFrame
    bottlenecks: list[analysis.Bottleneck]
    alpha_s: float
    alpha_source: str
    overlap: bool


def _analyse(sweeps: list[SweepData], alpha_s: float | None, overlap: bool) -> _Analysis:
    runs = pd.concat([s.runs for s in sweeps], ignore_index=True)
    ar = pd.concat([s.allreduce for s in sweeps], ignore_index=True)
    if alpha_s is None:
        fitted = analysis.fit_alpha_s(ar)
        alpha, source = ((fitted, "fitted to the allreduce probes' smallest messages")
                         if fitted is not None else
                         (analysis.DEFAULT_ALPHA_S, "default constant (no allreduce probes)"))
    else:
        alpha, source = alpha_s, "given"
    modelled = analysis.add_model(analysis.summarize(runs), alpha, overlap)
    limits = {s.sweep_id: analysis.host_limits(s.meta) for s in sweeps}
    return _Analysis(sweeps, runs, ar, modelled, analysis.classify(modelled, limits), alpha,
                     source, overlap)


# ---------------------------------------------------------------------------- figure helpers

def _bw_order(labels: Iterable[str], mbit: dict[str, float]) -> list[str]:
    def key(label: str) -> tuple:
        v = mbit.get(label, math.nan)
        return (math.isnan(v), v if not math.isnan(v) else 0.0, label)
    return sorted(set(labels), key=key)


@dataclass
class _Layout:
    """How series map onto panels, colours and line styles, shared by every figure."""

    panel_col: str | None  # "bandwidth" or None (one shared panel)
    panels: list[str]
    batch_colour: dict[int, str]
    style_cols: list[str]
    styles: dict[tuple, tuple[str, str]]  # style key -> (linestyle, marker)

    def style_key(self, row: Any) -> tuple:
        return tuple(row[c] for c in self.style_cols)

    def style_label(self, key: tuple) -> str:
        parts = []
        for col, val in zip(self.style_cols, key, strict=True):
            parts.append({"procs_per_node": f"{val} proc/node", "sweep_id": f"{val}",
                          "bandwidth": f"{val}"}.get(col, f"{val}"))
        return " · ".join(parts)


def _layout(modelled: pd.DataFrame, compare: bool) -> _Layout:
    mbit = dict(zip(modelled["bandwidth"], modelled["bandwidth_mbit"].astype(float), strict=False))
    bws = _bw_order(modelled["bandwidth"], mbit)
    per_bw_sweeps = modelled.groupby("bandwidth")["sweep_id"].nunique()
    by_panel = not compare or (len(bws) > 1 and bool((per_bw_sweeps > 1).any()))
    candidates = ["sweep_id", "model", "engine", "precision", "data", "procs_per_node"]
    if not by_panel:
        candidates.insert(1, "bandwidth")
    style_cols = [c for c in candidates if modelled[c].nunique(dropna=False) > 1]
    if compare and "sweep_id" not in style_cols:
        style_cols.insert(0, "sweep_id")
    keys = (sorted({tuple(r) for r in modelled[style_cols].itertuples(index=False)}, key=str)
            if style_cols else [()])
    styles = {k: (LINESTYLES[i % len(LINESTYLES)], MARKERS[i % len(MARKERS)])
              for i, k in enumerate(keys)}
    batches = sorted(int(b) for b in modelled["batch_size"].unique())
    colours = {b: OKABE_ITO[i % len(OKABE_ITO)] for i, b in enumerate(batches)}
    return _Layout("bandwidth" if by_panel else None, bws if by_panel else ["all"], colours,
                   style_cols, styles)


def _figure(n_panels: int, height: float = 3.3) -> tuple[Figure, list[Any]]:
    ncols = n_panels if n_panels <= 3 else (2 if n_panels == 4 else 3)
    nrows = math.ceil(n_panels / ncols)
    width = 8.5 if n_panels == 1 else 3.6 * ncols + 2.2
    fig = Figure(figsize=(width, height * nrows + 0.7), dpi=DPI, layout="constrained")
    axes = list(fig.subplots(nrows, ncols, sharey=True, squeeze=False).ravel())
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes[:n_panels]


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _panel_frames(df: pd.DataFrame, lay: _Layout) -> list[tuple[str, pd.DataFrame]]:
    if lay.panel_col is None:
        return [("all", df)]
    return [(p, df[df[lay.panel_col] == p]) for p in lay.panels]


def _series(df: pd.DataFrame, lay: _Layout) -> Iterable[tuple[tuple, int, pd.DataFrame]]:
    cols = [*lay.style_cols, "batch_size"]
    for key, grp in df.groupby(cols, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        yield tuple(key[:-1]), int(key[-1]), grp.sort_values("world_size")


def _legend(fig: Figure, lay: _Layout, extra: list[tuple[Any, str]] = ()) -> None:
    handles = [Line2D([], [], color=c, lw=2.5, label=f"batch {b}/worker")
               for b, c in lay.batch_colour.items()]
    if len(lay.styles) > 1:
        handles += [Line2D([], [], color="#444", ls=ls, marker=mk, label=lay.style_label(k))
                    for k, (ls, mk) in lay.styles.items()]
    for h, label in extra:
        h.set_label(label)
        handles.append(h)
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)


def _panel_title(ax: Any, lay: _Layout, panel: str) -> None:
    if lay.panel_col == "bandwidth":
        ax.set_title(f"link {panel}", fontsize=10)


def _ws_ticks(ax: Any, values: Iterable[int]) -> None:
    vals = sorted(set(int(v) for v in values))
    if 0 < len(vals) <= 12:
        ax.set_xticks(vals)
    ax.set_xlabel("world size (ranks)")
    ax.grid(True, alpha=0.3)


def _errbar(ax: Any, x: Any, mean: Any, lo: Any, hi: Any, colour: str, ls: str, mk: str,
            scale: float = 1.0) -> None:
    m = np.asarray(mean, float) * scale
    err = np.vstack([m - np.asarray(lo, float) * scale, np.asarray(hi, float) * scale - m])
    err = np.nan_to_num(np.clip(err, 0, None))
    ax.errorbar(x, m, yerr=err, color=colour, ls=ls, marker=mk, ms=4, lw=1.6,
                capsize=3 if len(m) <= 12 else 0)


# ---------------------------------------------------------------------------- figures

@dataclass
class _Fig:
    title: str
    caption: str
    png_b64: str
    alt: str


def _fig_metric(a: _Analysis, lay: _Layout, col: str, title: str, ylabel: str, caption: str,
                scale: float = 1.0, ideal: bool = False, hundred: bool = False) -> _Fig:
    df = a.modelled
    fig, axes = _figure(len(lay.panels))
    for ax, (panel, pdf) in zip(axes, _panel_frames(df, lay), strict=True):
        for skey, batch, grp in _series(pdf, lay):
            ls, mk = lay.styles[skey]
            colour = lay.batch_colour[batch]
            x = grp["world_size"].to_numpy()
            _errbar(ax, x, grp[f"{col}_mean"], grp[f"{col}_lo"], grp[f"{col}_hi"], colour, ls,
                    mk, scale)
            if ideal and len(grp):
                base = grp.iloc[0]
                ax.plot(x, base[f"{col}_mean"] * x / base["world_size"] * scale, color=colour,
                        ls=(0, (1, 2)), lw=1.1, alpha=0.8)
        if hundred:
            ax.axhline(100, color="#555", lw=2.2, alpha=0.5, zorder=0)
        _panel_title(ax, lay, panel)
        _ws_ticks(ax, pdf["world_size"])
    # once all panels hold their data: the axes share y, and set_ylim freezes autoscaling
    axes[0].set_ylim(bottom=0)
    axes[0].set_ylabel(ylabel)
    extra = []
    if ideal:
        extra.append((Line2D([], [], color="#444", ls=(0, (1, 2))), "ideal (linear from smallest)"))
    if hundred:
        extra.append((Line2D([], [], color="#555", lw=2.2, alpha=0.5), "100% (ideal)"))
    _legend(fig, lay, extra)
    fig.suptitle(title, fontsize=12)
    return _Fig(title, caption, _png(fig), title)


def _fig_step_split(a: _Analysis, lay: _Layout) -> _Fig:
    title = "Step time split into compute and communication"
    df = a.modelled
    fig, axes = _figure(len(lay.panels))
    all_sizes = sorted(df["world_size"].unique())
    if len(all_sizes) > STEP_SPLIT_MAX_SIZES:  # more groups of bars than anyone can read
        picks = np.unique(np.round(np.linspace(0, len(all_sizes) - 1, STEP_SPLIT_MAX_SIZES)))
        shown = {all_sizes[int(i)] for i in picks}
        df = df[df["world_size"].isin(shown)]
    for ax, (panel, pdf) in zip(axes, _panel_frames(df, lay), strict=True):
        sizes = sorted(pdf["world_size"].unique())
        pos = {ws: i for i, ws in enumerate(sizes)}
        series = list(_series(pdf, lay))
        width = 0.8 / max(len(series), 1)
        for i, (_skey, batch, grp) in enumerate(series):
            colour = lay.batch_colour[batch]
            x = grp["world_size"].map(pos).to_numpy(float) - 0.4 + width * (i + 0.5)
            step = grp["step_time_mean_s"].to_numpy(float)
            compute = grp["compute_time_mean_s"].to_numpy(float)
            comm = grp["comm_time_mean_s"].to_numpy(float)
            compute = np.where(np.isnan(compute), step - np.nan_to_num(comm), compute)
            comm = np.where(np.isnan(comm), np.clip(step - compute, 0, None), comm)
            ax.bar(x, compute, width, color=colour, edgecolor=colour, lw=0.5)
            ax.bar(x, comm, width, bottom=compute, color="white", edgecolor=colour,
                   hatch="////", lw=0.5)
            ax.scatter(x, step, marker="_", color="k", s=(width * 60) ** 2 / 4 + 20, lw=1.2,
                       zorder=3)
        ax.set_xticks(range(len(sizes)), [str(int(s)) for s in sizes])
        ax.set_xlabel("world size (ranks)")
        ax.grid(True, axis="y", alpha=0.3)
        _panel_title(ax, lay, panel)
    axes[0].set_ylabel("time per step (s)")
    _legend(fig, lay, [(Patch(facecolor="#999", edgecolor="#999"), "compute"),
                       (Patch(facecolor="white", edgecolor="#444", hatch="////"), "communication"),
                       (Line2D([], [], color="k", marker="_", ls="", ms=10), "measured step")])
    if len(lay.styles) > 1:
        order = " / ".join(lay.style_label(k) for k in lay.styles)
        caption_extra = f" Within each world size, bars go by {order}, then batch size."
    else:
        caption_extra = " Within each world size, bars go by batch size."
    if len(all_sizes) > STEP_SPLIT_MAX_SIZES:
        caption_extra += (f" {STEP_SPLIT_MAX_SIZES} of the {len(all_sizes)} world sizes are "
                          "shown, evenly spread from the smallest to the largest.")
    fig.suptitle(title, fontsize=12)
    caption = ("Mean over ranks and repeats of the compute and communication time each rank "
               "measured. Where the framework overlaps them the stack exceeds the measured "
               "step (black tick)." + caption_extra)
    return _Fig(title, caption, _png(fig), title)


def _fig_busbw(a: _Analysis, lay: _Layout) -> _Fig | None:
    ar = a.allreduce
    ar = ar[(ar["status"] == "ok") & ar["busbw_mb_s"].notna()] if not ar.empty else ar
    if ar.empty:
        return None
    title = "Allreduce bus bandwidth vs message size"
    mean = (ar.groupby(["sweep_id", "bandwidth", "nodes", "procs_per_node", "world_size",
                        "size_bytes"], as_index=False)
            .agg(busbw_mb_s=("busbw_mb_s", "mean"), bandwidth_mbit=("bandwidth_mbit", "first")))
    mbit = dict(zip(mean["bandwidth"], mean["bandwidth_mbit"].astype(float), strict=False))
    panels = (_bw_order(mean["bandwidth"], mbit) if lay.panel_col else ["all"])
    sizes = sorted(mean["world_size"].unique())
    mean_sizes = len(sizes)
    if len(sizes) > BUSBW_MAX_SIZES:  # a legend of 30 shades helps nobody
        sizes = [sizes[int(i)] for i in np.unique(np.round(
            np.linspace(0, len(sizes) - 1, BUSBW_MAX_SIZES)))]
        mean = mean[mean["world_size"].isin(sizes)]
    cmap = matplotlib.colormaps["cividis"]
    ws_colour = {ws: cmap(0.85 * i / max(len(sizes) - 1, 1)) for i, ws in enumerate(sizes)}
    sweeps = sorted(mean["sweep_id"].unique())
    # one panel per link: line style tells sweeps apart; one shared panel: sweep and link
    line_keys = (sweeps if lay.panel_col else
                 sorted({(s, b) for s, b in zip(mean["sweep_id"], mean["bandwidth"], strict=True)}))
    key_ls = {k: LINESTYLES[i % len(LINESTYLES)] for i, k in enumerate(line_keys)}
    fig, axes = _figure(len(panels))
    for ax, panel in zip(axes, panels, strict=True):
        pdf = mean if lay.panel_col is None else mean[mean["bandwidth"] == panel]
        for (sweep, bw, _n, _ppn, ws), grp in pdf.groupby(
                ["sweep_id", "bandwidth", "nodes", "procs_per_node", "world_size"]):
            grp = grp.sort_values("size_bytes")
            ls = key_ls[sweep] if lay.panel_col else key_ls[(sweep, bw)]
            ax.plot(grp["size_bytes"], grp["busbw_mb_s"], color=ws_colour[ws], ls=ls,
                    marker="o", ms=3, lw=1.5)
        for bw in pdf["bandwidth"].unique():
            rate = mbit.get(bw, math.nan)
            if not math.isnan(rate):
                ax.axhline(rate / 8, color="#777", ls="--", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, alpha=0.3)
        if lay.panel_col:
            ax.set_title(f"link {panel}", fontsize=10)
    axes[0].set_ylabel("bus bandwidth (MB/s)")
    handles = [Line2D([], [], color=ws_colour[ws], lw=2.5, label=f"{int(ws)} ranks")
               for ws in sizes]
    if len(line_keys) > 1:
        handles += [Line2D([], [], color="#444", ls=ls,
                           label=k if isinstance(k, str) else " · ".join(k))
                    for k, ls in key_ls.items()]
    handles.append(Line2D([], [], color="#777", ls="--", label="requested link rate / 8"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=12)
    caption = ("Bus bandwidth = algorithm bandwidth x 2(N-1)/N, comparable with the link rate "
               "(dashed, MB/s = Mbit/s / 8); mean over probe repeats. Colour here encodes the "
               "world size, not the batch size.")
    if len(sizes) < mean_sizes:
        caption += (f" {len(sizes)} of the {mean_sizes} probed world sizes are shown, evenly "
                    "spread from the smallest to the largest.")
    return _Fig(title, caption, _png(fig), title)


def _fig_model(a: _Analysis, lay: _Layout) -> _Fig:
    title = "Measured vs predicted scaling efficiency"
    df = a.modelled
    kinds = {tuple(b.series[k] for k in analysis.SERIES_KEYS): b.kind for b in a.bottlenecks}
    fig, axes = _figure(len(lay.panels))
    for ax, (panel, pdf) in zip(axes, _panel_frames(df, lay), strict=True):
        for skey, batch, grp in _series(pdf, lay):
            ls, mk = lay.styles[skey]
            colour = lay.batch_colour[batch]
            x = grp["world_size"].to_numpy()
            _errbar(ax, x, grp["eff_mean"], grp["eff_lo"], grp["eff_hi"], colour, "-", mk, 100)
            ax.plot(x, grp["predicted_eff"] * 100, color=colour, ls="--", lw=1.3)
            last = grp.iloc[-1]
            kind = kinds.get(tuple(last[k] for k in analysis.SERIES_KEYS), "undetermined")
            ax.annotate(SHORT_KIND.get(kind, kind), (last["world_size"], last["eff_mean"] * 100),
                        xytext=(4, 0), textcoords="offset points", fontsize=7, color=colour,
                        va="center")
        ax.axhline(100, color="k", lw=1, ls=":")
        ax.margins(x=0.12)
        _panel_title(ax, lay, panel)
        _ws_ticks(ax, pdf["world_size"])
    top = np.nanmax([df["eff_hi"].max(), df["eff_mean"].max(), df["predicted_eff"].max(), 1.0])
    axes[0].set_ylim(0, max(115.0, float(top) * 100 + 5))
    axes[0].set_ylabel("scaling efficiency (%)")
    _legend(fig, lay, [(Line2D([], [], color="#444", ls="-", marker="o"), "measured (95% CI)"),
                       (Line2D([], [], color="#444", ls="--"), "ring-allreduce model")])
    fig.suptitle(title, fontsize=12)
    mode = "max(compute, comm) (full overlap)" if a.overlap else "compute + comm (no overlap)"
    caption = (f"Model: step = {mode}, comm = 2(N-1)/N x S/B + alpha x 2(N-1), "
               f"alpha = {a.alpha_s * 1e6:.1f} us ({a.alpha_source}). The word at the end of "
               "each line names that series' bottleneck (see the bottleneck table).")
    if len(lay.styles) > 1:
        caption += " Line markers tell the series apart; line style is measured vs model here."
    return _Fig(title, caption, _png(fig), title)


def _figures(a: _Analysis, lay: _Layout) -> list[_Fig]:
    ci = "Error bars: 95% confidence interval over repeats (Student t); none with one repeat."
    figs = [
        _fig_metric(a, lay, "thr", "Total throughput vs world size", "images/s (sum over ranks)",
                    "Images per second summed over all ranks, with the ideal linear scaling "
                    "from the smallest world size of each series (dotted). " + ci, ideal=True),
        _fig_metric(a, lay, "eff", "Scaling efficiency vs world size", "scaling efficiency (%)",
                    "throughput(N) / ((N/N0) x throughput(N0)), N0 the smallest world size of "
                    "the series; the thick grey line is 100%. " + ci, scale=100.0, hundred=True),
        _fig_metric(a, lay, "per_worker", "Throughput per worker", "images/s per rank",
                    "Mean over ranks of each rank's images per second. " + ci),
        _fig_step_split(a, lay),
    ]
    bus = _fig_busbw(a, lay)
    if bus is not None:
        figs.append(bus)
    figs.append(_fig_model(a, lay))
    return figs


# ---------------------------------------------------------------------------- HTML helpers

def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return ""
        return f"{value:.{digits}g}" if abs(value) < 1e6 else f"{value:.0f}"
    return str(value)


def _col_text(series: pd.Series, kind: str) -> pd.Series:
    """Vectorised cell text for a column: escaped strings."""
    if kind == "pct":
        vals = series.astype(float)
        out = (vals * 100).map(lambda v: "" if math.isnan(v) else f"{v:.1f}%")
    elif kind == "num":
        out = series.astype(float).map(lambda v: "" if math.isnan(v) else f"{v:.4g}")
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


def _summary_pairs(s: SweepData) -> list[tuple[str, Any]]:
    meta, runs, ar = s.meta, s.runs, s.allreduce
    nodes = [n for n in meta.get("nodes") or [] if isinstance(n, dict)]
    cpus = sorted({float(n.get("cpus") or 0) for n in nodes})
    gpus = sorted({int(n.get("gpus") or 0) for n in nodes})
    plan = meta.get("plan") or {}
    requested = plan.get("bandwidth") or plan.get("bandwidths") or sorted(runs["bandwidth"].unique())
    measured = runs.groupby("bandwidth")["link_mbit_measured"].mean().dropna()
    measured_txt = ", ".join(f"{bw}: {v:.0f} Mbit/s" for bw, v in measured.items()) or "not measured"
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
        ("GPUs per node", ", ".join(str(g) for g in gpus) or "unknown"),
        ("host cores (local target)", _fmt(limits["host_cpus"]) or "unknown"),
        ("link rates requested", ", ".join(str(r) for r in requested)),
        ("link rates measured (mean)", measured_txt),
        ("allreduce busbw at largest message", busbw_txt),
        ("date and duration", when),
        ("training runs", f"{len(runs)} recorded: {status_txt}"),
        ("allreduce probes", f"{len(s.probes)} recorded, {probe_ok} ok"),
        ("planned runs", f"{len(meta.get('planned_runs') or [])} planned, "
                         f"{len(s.missing)} without a record"),
        ("environment fingerprints", f"{s.env_fingerprints} distinct"
         + (" (runs ran on different software!)" if s.env_fingerprints > 1 else "")),
    ]
    return pairs


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


def _bottleneck_table(a: _Analysis, lay: _Layout) -> str:
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


def _scaling_table(a: _Analysis) -> str:
    df = a.modelled.assign(_bw=a.modelled["bandwidth_mbit"].astype(float).fillna(np.inf))
    df = df.sort_values(["sweep_id", "_bw", "batch_size", "procs_per_node", "model", "engine",
                         "precision", "data", "world_size"], kind="stable")
    df["thr_ci"] = _ci_text(df["thr_lo"], df["thr_hi"], "{:.4g}")
    df["eff_ci"] = _ci_text(df["eff_lo"] * 100, df["eff_hi"] * 100, "{:.1f}")
    cols = [("bandwidth", "link", "str"), ("batch_size", "batch/worker", "int"),
            ("procs_per_node", "proc/node", "int"), ("world_size", "world size", "int"),
            ("n", "repeats", "int"), ("thr_mean", "images/s", "num"),
            ("thr_ci", "95% CI", "str"), ("per_worker_mean", "images/s/worker", "num"),
            ("eff_mean", "efficiency", "pct"), ("eff_ci", "95% CI (%)", "str"),
            ("predicted_eff", "model efficiency", "pct"),
            ("step_time_mean_s", "step (s)", "num"), ("comm_fraction", "comm fraction", "pct"),
            ("link_mbit_model", "model link (Mbit/s)", "num"), ("link_source", "link from", "str")]
    if len(a.sweeps) > 1:
        cols.insert(0, ("sweep_id", "sweep", "str"))
    varying = [c for c in ("model", "engine", "precision", "data") if df[c].nunique() > 1]
    for c in reversed(varying):
        cols.insert(1, (c, c, "str"))
    return _table(df, cols, "scaling")


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


def _runs_tables(a: _Analysis) -> str:
    runs = a.runs
    multi = len(a.sweeps) > 1
    cols = ([("sweep_id", "sweep", "str")] if multi else []) + RUN_COLUMNS
    failed = runs[runs["status"] != "ok"]
    parts = ["<h2 id=\"failed\">Failed runs</h2>"]
    if failed.empty:
        parts.append('<p class="note">No training run failed.</p>')
    else:
        parts.append(_table(failed, ([("sweep_id", "sweep", "str")] if multi else [])
                            + [("run_id", "run", "str"), ("status", "status", "str"),
                               ("world_size", "world", "int"), ("batch_size", "batch", "int"),
                               ("bandwidth", "link", "str"), ("started_at", "started", "str"),
                               ("error", "error", "pre")], "failed"))
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


def _method_note(a: _Analysis) -> str:
    mode = "max(compute, comm)" if a.overlap else "compute + comm"
    return (
        '<h2 id="method">How these numbers are computed</h2><ul class="note">'
        "<li>Throughput of a run is the sum of its ranks' images/s, never rank 0 x N; per-worker "
        "throughput is the mean over ranks; step p95 is the worst rank's p95 (the slowest rank "
        "gates every synchronous step).</li>"
        "<li>Scaling efficiency = throughput(N) / ((N/N0) x throughput(N0)), N0 the smallest world "
        "size of the series (same sweep, model, engine, precision, data, batch per worker, link, "
        "processes per node); throughput(N0) is the mean of its repeats.</li>"
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


def _render(a: _Analysis, title: str, compare: bool, csv_links: list[tuple[str, str]]) -> str:
    lay = _layout(a.modelled, compare)
    figs = _figures(a, lay)
    parts = [f"<h1>{_e(title)}</h1>", _banners(a.sweeps),
             f'<p class="note">Generated {datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")} by '
             f"scalelab {_e(_version())}. Results: "
             + ", ".join(f'<a href="{_e(href)}">{_e(name)}</a>' for name, href in csv_links)
             + ". Sections: <a href=\"#figures\">figures</a>, <a href=\"#bottlenecks\">"
             "bottlenecks</a>, <a href=\"#scaling\">scaling table</a>, <a href=\"#failed\">"
             "failed runs</a>, <a href=\"#runs\">all runs</a>.</p>",
             '<h2 id="summary">Summary</h2>']
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
    parts.append(_runs_tables(a))
    for s in a.sweeps:
        parts.append(_sweep_details(s))
    parts.append(_method_note(a))
    return _page(title, "\n".join(parts))


# ---------------------------------------------------------------------------- entry points

def build_report(sweep: str | Path, out_dir: Path | str | None = None, *,
                 alpha_s: float | None = None, overlap: bool = False,
                 root: Path | None = None) -> Path:
    """Write index.html for one sweep (and its results.csv); returns the page's path.

    ``sweep``: an id under the reports root, ``latest`` or a sweep directory. ``out_dir``
    defaults to the sweep's own directory. ``alpha_s``: per-hop latency for the model (default:
    fitted to the allreduce probes, else analysis.DEFAULT_ALPHA_S). ``overlap``: model
    communication as fully overlapped with compute.
    """
    data = load_sweep_data(sweep, root)
    out = _out_dir(Path(out_dir) if out_dir else data.path)
    csv_path = data.path / results.CSV_FILE
    write_atomic(csv_path, results.frame_to_csv(data.runs), mode=0o644)
    a = _analyse([data], alpha_s, overlap)
    title = f"scalelab report: {data.sweep_id}" + (" (SYNTHETIC DATA)" if data.synthetic else "")
    page = _render(a, title, False, [(results.CSV_FILE, _rel(csv_path, out))])
    path = out / "index.html"
    write_atomic(path, page, mode=0o644)
    log.info("wrote %s", path)
    return path


def build_comparison(sweeps: Sequence[str | Path], out_dir: Path | str | None = None, *,
                     alpha_s: float | None = None, overlap: bool = False,
                     root: Path | None = None) -> Path:
    """Write one index.html comparing several sweeps on shared axes; returns its path.

    ``out_dir`` defaults to <reports root>/compare-<id1>-vs-<id2>...
    """
    if len(sweeps) < 2:
        raise ReportError("comparison needs two or more sweeps, e.g. --compare lab-a,lab-b")
    datas = [load_sweep_data(s, root) for s in sweeps]
    ids = [d.sweep_id for d in datas]
    if len(set(ids)) < len(ids):
        raise ReportError(f"comparison lists the same sweep twice: {', '.join(ids)}")
    out = _out_dir(Path(out_dir) if out_dir else (Path(root) if root else reports_dir()) / (
        "compare-" + "-vs-".join(ids)))
    links = []
    for d in datas:
        csv_path = d.path / results.CSV_FILE
        write_atomic(csv_path, results.frame_to_csv(d.runs), mode=0o644)
        links.append((f"{d.sweep_id}/{results.CSV_FILE}", _rel(csv_path, out)))
    a = _analyse(datas, alpha_s, overlap)
    title = "scalelab comparison: " + " vs ".join(ids)
    if any(d.synthetic for d in datas):
        title += " (SYNTHETIC DATA)"
    path = out / "index.html"
    write_atomic(path, _render(a, title, True, links), mode=0o644)
    log.info("wrote %s", path)
    return path


def _out_dir(out: Path) -> Path:
    """The output directory, made if missing; a path that cannot be one is a ReportError
    before anything is written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"cannot write the report to {out}: {exc.strerror}; give --out a "
                          "directory you can write") from None
    return out


def build(sweeps: Sequence[str | Path] | str | Path, out_dir: Path | str | None = None,
          compare: bool = False, **kwargs: Any) -> list[Path]:
    """Build reports: one per sweep, or with ``compare`` one page for all of them.

    Without ``compare`` and with several sweeps, ``out_dir`` (if given) gets one folder per
    sweep id. Keyword arguments go to build_report / build_comparison (alpha_s, overlap, root).
    """
    if isinstance(sweeps, (str, Path)):
        sweeps = [sweeps]
    sweeps = list(sweeps)
    if not sweeps:
        raise ReportError("no sweep given; pass a sweep id, latest, or a sweep directory")
    if compare:
        return [build_comparison(sweeps, out_dir, **kwargs)]
    if len(sweeps) == 1:
        return [build_report(sweeps[0], out_dir, **kwargs)]
    paths = []
    for s in sweeps:
        sub = None
        if out_dir:
            sub = Path(out_dir) / resolve_sweep(s, kwargs.get("root")).name
        paths.append(build_report(s, sub, **kwargs))
    return paths


def _version() -> str:
    try:
        return importlib.metadata.version("scalelab")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _rel(target: Path, start: Path) -> str:
    try:
        return os.path.relpath(target, start)
    except ValueError:
        return target.as_uri()
