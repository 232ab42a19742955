"""The report's figures: matplotlib's object API on the Agg canvas, embedded as base64 PNG."""

from __future__ import annotations

import base64
import io
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from scalelab.model import analysis
from scalelab.model.analysis import batch_text
from scalelab.report import tables
from scalelab.report.data import Analysis

log = logging.getLogger(__name__)
# Okabe & Ito (2008), colour-blind safe; yellow and black last (weak on white / reserved).
OKABE_ITO = ["#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442",
             "#000000"]
LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
SHORT_KIND = {"network-bound": "network", "compute-bound": "compute", "input-bound": "input",
              "emulation-bound": "emulation", "straggler-bound": "straggler",
              "undetermined": "?"}
DPI = 100
STEP_SPLIT_MAX_SIZES = 8  # world sizes shown as bar groups in the step-time figure
BUSBW_MAX_SIZES = 8  # world sizes drawn in the allreduce figure



# ---------------------------------------------------------------------------- figure helpers

def _bw_order(labels: Iterable[str], mbit: dict[str, float]) -> list[str]:
    def key(label: str) -> tuple:
        v = mbit.get(label, math.nan)
        return (math.isnan(v), v if not math.isnan(v) else 0.0, label)
    return sorted(set(labels), key=key)


@dataclass
class Layout:
    """How series map onto panels, colours and line styles, shared by every figure."""

    panel_col: str | None  # "bandwidth" or None (one shared panel)
    panels: list[str]
    batch_colour: dict[int, str]
    style_cols: list[str]
    styles: dict[tuple, tuple[str, str]]  # style key -> (linestyle, marker)
    strong: frozenset = frozenset()  # batch sizes that are global batches (strong scaling)

    def style_key(self, row: Any) -> tuple:
        return tuple(row[c] for c in self.style_cols)

    def style_label(self, key: tuple) -> str:
        parts = []
        for col, val in zip(self.style_cols, key, strict=True):
            parts.append({"procs_per_node": f"{val} proc/node", "sweep_id": f"{val}",
                          "bandwidth": f"{val}",
                          "settings": f"{val or 'default settings'}",
                          "scaling": f"{val} scaling"}.get(col, f"{val}"))
        return " · ".join(parts)


def layout(modelled: pd.DataFrame, compare: bool) -> Layout:
    """Panels (one per bandwidth), one Okabe-Ito colour per batch size (a global batch is
    labelled as one) and line styles for whatever else varies.

    >>> m = pd.DataFrame({"bandwidth": ["1gbit", "1gbit", "10gbit"], "sweep_id": "s",
    ...     "bandwidth_mbit": [1000.0, 1000.0, 10000.0], "batch_size": [64, 256, 64],
    ...     "scaling": ["weak", "strong", "weak"]})
    >>> lay = layout(m, compare=False)
    >>> lay.panels, lay.batch_colour == {64: OKABE_ITO[0], 256: OKABE_ITO[1]}, sorted(lay.strong)
    (['1gbit', '10gbit'], True, [256])
    """
    mbit = dict(zip(modelled["bandwidth"], modelled["bandwidth_mbit"].astype(float), strict=False))
    bws = _bw_order(modelled["bandwidth"], mbit)
    per_bw_sweeps = modelled.groupby("bandwidth")["sweep_id"].nunique()
    by_panel = not compare or (len(bws) > 1 and bool((per_bw_sweeps > 1).any()))
    candidates = ["sweep_id", "model", "engine", "precision", "memory_format", "data",
                  "procs_per_node", "settings", "scaling"]
    if not by_panel:
        candidates.insert(1, "bandwidth")
    style_cols = [c for c in candidates
                  if c in modelled and modelled[c].nunique(dropna=False) > 1]
    if compare and "sweep_id" not in style_cols:
        style_cols.insert(0, "sweep_id")
    keys = (sorted({tuple(r) for r in modelled[style_cols].itertuples(index=False)}, key=str)
            if style_cols else [()])
    styles = {k: (LINESTYLES[i % len(LINESTYLES)], MARKERS[i % len(MARKERS)])
              for i, k in enumerate(keys)}
    batches = sorted(int(b) for b in modelled["batch_size"].unique())
    colours = {b: OKABE_ITO[i % len(OKABE_ITO)] for i, b in enumerate(batches)}
    scaling = modelled.get("scaling", pd.Series("weak", index=modelled.index))
    # a batch that is a global one in every series that has it (a batch both ways is told
    # apart by the line style of the scaling)
    strong = frozenset(int(b) for b in modelled.loc[scaling == "strong", "batch_size"].unique()
                       ) - frozenset(int(b) for b in modelled.loc[scaling != "strong",
                                                                  "batch_size"].unique())
    return Layout("bandwidth" if by_panel else None, bws if by_panel else ["all"], colours,
                   style_cols, styles, strong)


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


def _panel_frames(df: pd.DataFrame, lay: Layout) -> list[tuple[str, pd.DataFrame]]:
    if lay.panel_col is None:
        return [("all", df)]
    return [(p, df[df[lay.panel_col] == p]) for p in lay.panels]


def _series(df: pd.DataFrame, lay: Layout) -> Iterable[tuple[tuple, int, pd.DataFrame]]:
    cols = [*lay.style_cols, "batch_size"]
    for key, grp in df.groupby(cols, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        yield tuple(key[:-1]), int(key[-1]), grp.sort_values("world_size")


def _legend(fig: Figure, lay: Layout, extra: list[tuple[Any, str]] = ()) -> None:
    handles = [Line2D([], [], color=c, lw=2.5,
                      label=batch_text(b, "strong" if b in lay.strong else "weak"))
               for b, c in lay.batch_colour.items()]
    if len(lay.styles) > 1:
        handles += [Line2D([], [], color="#444", ls=ls, marker=mk, label=lay.style_label(k))
                    for k, (ls, mk) in lay.styles.items()]
    for h, label in extra:
        h.set_label(label)
        handles.append(h)
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)


def _panel_title(ax: Any, lay: Layout, panel: str) -> None:
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
    data: pd.DataFrame | None = None  # the numbers plotted, where the page shows them too


def _fig_metric(a: Analysis, lay: Layout, col: str, title: str, ylabel: str, caption: str,
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
            # from the series' baseline N0 only: with no ok run there, no line (see the banner)
            if ideal and len(grp) and grp.iloc[0]["world_size"] == grp.iloc[0]["baseline_world_size"]:
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
        extra.append((Line2D([], [], color="#444", ls=(0, (1, 2))), "ideal (linear from N0)"))
    if hundred:
        extra.append((Line2D([], [], color="#555", lw=2.2, alpha=0.5), "100% (ideal)"))
    _legend(fig, lay, extra)
    fig.suptitle(title, fontsize=12)
    return _Fig(title, caption, _png(fig), title)


def _fig_step_split(a: Analysis, lay: Layout) -> _Fig:
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
            inflight = grp["comm_inflight_mean_s"].to_numpy(float)
            if not np.isnan(inflight).all():  # when gradient communication began
                ax.scatter(x, compute + comm - inflight, marker="v", color=colour,
                           edgecolor="k", lw=0.5, s=24, zorder=4)
        ax.set_xticks(range(len(sizes)), [str(int(s)) for s in sizes])
        ax.set_xlabel("world size (ranks)")
        ax.grid(True, axis="y", alpha=0.3)
        _panel_title(ax, lay, panel)
    axes[0].set_ylabel("time per step (s)")
    _legend(fig, lay, [(Patch(facecolor="#999", edgecolor="#999"), "compute"),
                       (Patch(facecolor="white", edgecolor="#444", hatch="////"), "communication"),
                       (Line2D([], [], color="k", marker="_", ls="", ms=10), "measured step"),
                       (Line2D([], [], color="#999", marker="v", markeredgecolor="k", ls="",
                               ms=6), "gradients in flight from here")])
    if len(lay.styles) > 1:
        order = " / ".join(lay.style_label(k) for k in lay.styles)
        caption_extra = f" Within each world size, bars go by {order}, then batch size."
    else:
        caption_extra = " Within each world size, bars go by batch size."
    if len(all_sizes) > STEP_SPLIT_MAX_SIZES:
        caption_extra += (f" {STEP_SPLIT_MAX_SIZES} of the {len(all_sizes)} world sizes are "
                          "shown, evenly spread from the smallest to the largest.")
    fig.suptitle(title, fontsize=12)
    caption = ("Mean over ranks and repeats. Communication (hatched) is the exposed part: the "
               "time a rank waited for gradients after its backward pass; compute is the rest "
               "of the step less input loading, so the stack is the measured step (black tick) "
               "less input time. The triangle marks when gradient communication began, counted "
               "back from the end of the exposed wait: between it and the top of the compute "
               "bar, communication ran hidden behind backward (overlap); a triangle at the "
               "top of the compute bar means none was hidden." + caption_extra)
    return _Fig(title, caption, _png(fig), title)


def _fig_busbw(a: Analysis, lay: Layout) -> _Fig | None:
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


def _fig_model(a: Analysis, lay: Layout) -> _Fig:
    """Measured efficiency against the page's one prediction per point (overlap model, or the
    ring model where no profile exists: dashed and dotted)."""
    title = "Measured vs predicted scaling efficiency"
    df = a.modelled
    kinds = {tuple(b.series[k] for k in analysis.SERIES_KEYS): b.kind for b in a.bottlenecks}
    fig, axes = _figure(len(lay.panels))
    for ax, (panel, pdf) in zip(axes, _panel_frames(df, lay), strict=True):
        for skey, batch, grp in _series(pdf, lay):
            mk = lay.styles[skey][1]
            colour = lay.batch_colour[batch]
            x = grp["world_size"].to_numpy()
            _errbar(ax, x, grp["eff_mean"], grp["eff_lo"], grp["eff_hi"], colour, "-", mk, 100)
            ring = (grp["predicted_by"] == "ring").all()
            ax.plot(x, grp["model_eff"] * 100, color=colour, ls=":" if ring else "--", lw=1.3)
            last = grp.iloc[-1]
            kind = kinds.get(tuple(last[k] for k in analysis.SERIES_KEYS), "undetermined")
            ax.annotate(SHORT_KIND.get(kind, kind), (last["world_size"], last["eff_mean"] * 100),
                        xytext=(4, 0), textcoords="offset points", fontsize=7, color=colour,
                        va="center")
        ax.axhline(100, color="k", lw=1, ls=":")
        ax.margins(x=0.12)
        _panel_title(ax, lay, panel)
        _ws_ticks(ax, pdf["world_size"])
    top = np.nanmax([df["eff_hi"].max(), df["eff_mean"].max(), df["model_eff"].max(), 1.0])
    axes[0].set_ylim(0, max(115.0, float(top) * 100 + 5))
    axes[0].set_ylabel("scaling efficiency (%)")
    used = set(df["predicted_by"]) - {""}
    extra = [(Line2D([], [], color="#444", ls="-", marker="o"), "measured (95% CI)")]
    if "overlap" in used:
        extra.append((Line2D([], [], color="#444", ls="--"), "overlap model"))
    if "ring" in used:
        extra.append((Line2D([], [], color="#444", ls=":"), "ring model (no profile)"))
    _legend(fig, lay, extra)
    fig.suptitle(title, fontsize=12)
    caption = (f"{tables.models_used(df)} Per-hop latency alpha = {a.alpha_s * 1e6:.1f} us "
               f"({a.alpha_source}); the model's error against these points is stated under "
               "Bottleneck per series. The word at the end of each line names that series' "
               "bottleneck (see the bottleneck table).")
    if len(lay.styles) > 1:
        caption += " Line markers tell the series apart; line style is measured vs model here."
    cols = ["sweep_id", "bandwidth", "batch_size", "scaling", "procs_per_node", "model",
            "engine", "precision", "data", "world_size", "eff_mean", "model_eff", "predicted_by"]
    data = df.assign(_bw=df["bandwidth_mbit"].astype(float).fillna(np.inf)).sort_values(
        ["sweep_id", "_bw", "batch_size", "procs_per_node", "world_size"], kind="stable")[cols]
    return _Fig(title, caption, _png(fig), title, data)


def draw_figures(a: Analysis, lay: Layout) -> list[_Fig]:
    ci = "Error bars: 95% confidence interval over repeats (Student t); none with one repeat."
    figs = [
        _fig_metric(a, lay, "thr", "Total throughput vs world size", "images/s (sum over ranks)",
                    "Images per second summed over all ranks, with the ideal linear scaling "
                    "from each series' baseline N0, the plan's smallest world size (dotted). " + ci,
                    ideal=True),
        _fig_metric(a, lay, "eff", "Scaling efficiency vs world size", "scaling efficiency (%)",
                    "throughput(N) / ((N/N0) x throughput(N0)), N0 the plan's smallest world size "
                    "of the series; the thick grey line is 100%. " + ci, scale=100.0, hundred=True),
        _fig_metric(a, lay, "per_worker", "Throughput per worker", "images/s per rank",
                    "Mean over ranks of each rank's images per second. " + ci),
        _fig_step_split(a, lay),
    ]
    bus = _fig_busbw(a, lay)
    if bus is not None:
        figs.append(bus)
    figs.append(_fig_model(a, lay))
    return figs
