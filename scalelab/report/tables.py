"""The model's part of the report as frames and sentences, no HTML: which model predicted each
point, each series' verdict, what the sweep found, and predictions beyond the measured points.

Every prediction here is the one per point that scalelab.model.bucket_model.add_prediction chose (the
overlap model where a per-layer profile exists, else the ring model), so the tables, the
figure and the verdicts cannot disagree.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from scalelab.model import analysis, bucket_model, stragglers, verdict
from scalelab.model.analysis import batch_text
from scalelab.report.data import Analysis
from scalelab.run import linkprobe

WHAT_IF_SIZES = (16, 32, 64)  # world sizes the what-if table adds beyond twice the largest
WHAT_IF_LINKS = (1.0, 10.0)  # the measured link, and one 10x faster


def models_used(modelled: pd.DataFrame) -> str:
    """One sentence: which model the page's predictions come from, and for points where the
    ring model stands in, why.

    >>> df = pd.DataFrame({"predicted_by": ["overlap", "overlap", "ring"],
    ...     "model_note": ["", "", "no per-layer profile (the ranks computed for real)"]})
    >>> models_used(df)  # doctest: +NORMALIZE_WHITESPACE
    'Predictions come from the overlap model (the bucket timeline of a per-layer profile) for 2
    points, and from the ring model (one whole-gradient ring allreduce, no bucket timeline) for 1
    point where it cannot be computed: no per-layer profile (the ranks computed for real).'
    """
    by = modelled["predicted_by"] if "predicted_by" in modelled else pd.Series(dtype=str)
    counts = by.value_counts()
    n_overlap, n_ring = int(counts.get("overlap", 0)), int(counts.get("ring", 0))
    n_none = int(counts.get("", 0))
    overlap = "the overlap model (the bucket timeline of a per-layer profile)"
    ring = "the ring model (one whole-gradient ring allreduce, no bucket timeline)"
    why = "; ".join(sorted(set(modelled.loc[by == "ring", "model_note"].astype(str)) - {""}))
    if n_ring == 0 and n_overlap:
        text = f"Predictions come from {overlap} for every point"
    elif n_overlap == 0 and n_ring:
        text = f"Predictions come from {ring} for every point: {why or 'no per-layer profile'}"
    elif n_overlap and n_ring:
        text = (f"Predictions come from {overlap} for {_points(n_overlap)}, and from {ring} for "
                f"{_points(n_ring)} where it cannot be computed: {why}")
    else:
        text = "No point has a prediction"
    if n_none:
        text += f"; {_points(n_none)} without one (no link rate known)"
    return text + "."


def _points(n: int) -> str:
    return f"{n} point" if n == 1 else f"{n} points"


def mixed(modelled: pd.DataFrame) -> bool:
    """Whether the page's predictions come from more than one model (then each row says which)."""
    return "predicted_by" in modelled and modelled["predicted_by"].nunique() > 1


def bottleneck_rows(a: Analysis) -> pd.DataFrame:
    """One row per series: its verdict at its largest world size, ordered by sweep, link rate,
    batch, procs per node."""
    mbit = dict(zip(a.modelled["bandwidth"], a.modelled["bandwidth_mbit"].astype(float),
                    strict=False))

    def order(b: verdict.Bottleneck) -> tuple:
        s = b.series
        rate = mbit.get(s["bandwidth"], math.nan)
        return (s["sweep_id"], math.isnan(rate), 0.0 if math.isnan(rate) else rate,
                s["batch_size"], s["procs_per_node"], str(s["model"]), str(s["data"]))

    rows = []
    for b in sorted(a.bottlenecks, key=order):
        s = b.series
        rows.append({"sweep": s["sweep_id"], "series": f"{batch_text(s['batch_size'], s.get('scaling'))}, link "
                     f"{s['bandwidth']}, {s['procs_per_node']} proc/node, {s['model']} "
                     f"{s['engine']} {s['precision']} {s['data']}"
                     + (f", {s['memory_format']}" if s.get("memory_format") == "channels_last"
                        else "")
                     + (f", {s['settings']}" if s.get("settings") else ""),
                     "n": b.world_size, "eff": b.measured_eff, "pred": b.predicted_eff,
                     "model": b.model, "exposed_ms": _ms_number(b.exposed_s),
                     "share": b.comm_share,
                     "kind": b.kind, "why": b.explanation})
    return pd.DataFrame(rows, columns=["sweep", "series", "n", "eff", "pred", "model",
                                       "exposed_ms", "share", "kind", "why"])


def _ms_number(seconds: float) -> float:
    """Milliseconds rounded as verdict.ms writes them, so a table cell and its sentence agree.

    >>> _ms_number(0.03629), _ms_number(1.38245), _ms_number(0.00423)
    (36.0, 1382.0, 4.2)
    """
    v = seconds * 1000
    return float(round(v) if abs(v) >= 10 else round(v, 1))


def verdict_label(row: Any) -> str:
    """A point's verdict as the scaling table shows it: the name, with the exposed
    communication per step when network-bound, the slow node and the others' wait for it per
    step when straggler-bound, and what would settle it when undetermined.

    >>> verdict_label({"verdict": "network-bound", "model_exposed_s": 0.0363, "verdict_settle": ""})
    'network-bound, 36 ms exposed'
    >>> verdict_label({"verdict": "straggler-bound", "straggler_hosts": "n2",
    ...                "straggler_wait_s": 0.0781})
    'straggler-bound, n2, 78 ms wait'
    >>> verdict_label({"verdict": "", "model_exposed_s": 0.0, "verdict_settle": ""})
    'baseline'
    """
    kind = row["verdict"]
    if not kind:
        return "baseline"
    if kind == "network-bound":
        return f"{kind}, {verdict.ms(float(row['model_exposed_s']))} exposed"
    if kind == "straggler-bound":
        return (f"{kind}, {row['straggler_hosts']}, "
                f"{verdict.ms(float(row['straggler_wait_s']))} wait")
    if kind == "undetermined":
        return f"{kind}: {row['verdict_settle']}"
    return str(kind)


def findings(a: Analysis) -> list[str]:
    """What the sweep found, in numbers, one line per batch size: the efficiency each link rate
    reached at the largest world size, and from which world size the network is the bottleneck
    (the first point below verdict.COMPUTE_BOUND_EFFICIENCY whose verdict is network-bound);
    then one line per node that held a slow rank (stragglers.node_findings)."""
    df = a.modelled
    if df.empty:
        return []
    lines = []
    keys = [k for k in analysis.SERIES_KEYS if k not in ("bandwidth",)]
    for key, grp in df.groupby(keys, dropna=False, sort=True):
        series = dict(zip(keys, key, strict=True))
        parts, net, emu, slow = [], [], [], []
        grp = grp.assign(_bw=grp["bandwidth_mbit"].astype(float).fillna(np.inf))
        for bw, g in grp.sort_values(["_bw", "world_size"]).groupby("bandwidth", sort=False):
            last = g.iloc[-1]
            eff = float(last["eff_mean"])
            parts.append(f"at {bw}, {int(last['world_size'])} ranks reach "
                         + (f"{eff * 100:.3g}% efficiency" if not math.isnan(eff) else
                            "an efficiency that could not be measured"))
            low = g[(g["eff_mean"].astype(float) < verdict.COMPUTE_BOUND_EFFICIENCY)
                    & (g["verdict"] == "network-bound")]
            if not low.empty:
                net.append(f"from N = {int(low.iloc[0]['world_size'])} at {bw}")
            stuck = g[g["verdict"] == "straggler-bound"]
            if not stuck.empty:
                slow.append(f"from N = {int(stuck.iloc[0]['world_size'])} at {bw}")
            if last["verdict"] == "emulation-bound":
                emu.append(f"at {bw} the emulation, not the network, limits the largest runs")
        what = f"{series['model']}, {batch_text(series['batch_size'], series.get('scaling'))}"
        acc = str(grp["accelerator"].iloc[0]) if "accelerator" in grp else ""
        if acc:
            what += f" on emulated {acc}"
        line = f"{what}: " + "; ".join(parts) + "."
        if net:
            line += " The network is the bottleneck " + ", ".join(net) + "."
        if slow:
            line += " A slow rank, not the network, is the bottleneck " + ", ".join(slow) + "."
        if emu:
            line += " " + "; ".join(emu).capitalize() + "."
        lines.append(line)
    return lines + stragglers.node_findings(a.stragglers)


def emulation_rows(a: Analysis) -> pd.DataFrame:
    """The points that ran on an emulated accelerator, by link rate, batch and world size, with
    the fidelity guard's verdict as text ("faithful" when it passed)."""
    df = a.modelled
    if "accelerator" not in df or not df["accelerator"].astype(bool).any():
        return df.iloc[0:0]
    df = df[df["accelerator"].astype(bool)].copy()
    df = df.assign(_bw=df["bandwidth_mbit"].astype(float).fillna(np.inf)).sort_values(
        ["_bw", "batch_size", "world_size"], kind="stable")
    df["fidelity_text"] = df["fidelity"].where(df["fidelity"].astype(bool), "faithful")
    return df


def what_if_rows(a: Analysis, emulated: pd.DataFrame) -> pd.DataFrame:
    """The overlap model beyond the measured points of each emulated series (its largest
    measured row): more nodes, and the link 10x faster. A row is to be labelled by the link it
    predicts for (link_mbit), never by the measured series' ("from"): a "10x faster" row of
    the 1gbit series is a 10gbit row."""
    rows = []
    for _, g in emulated.groupby(["bandwidth", "batch_size", "scaling"], sort=False):
        last = g.iloc[-1]
        nmax = int(last["world_size"])
        sizes = sorted({nmax * 2, *WHAT_IF_SIZES} - {nmax})
        for r in bucket_model.what_if(last, sizes, WHAT_IF_LINKS, a.alpha_s):
            rows.append({"from": f"{last['bandwidth']}, "
                         f"{batch_text(last['batch_size'], last.get('scaling'))}", **r})
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(rows).sort_values(["from", "link_mbit", "world_size"], kind="stable")


LAYOUT_NODES = (2, 4, 8, 16, 32)  # the node counts the layout table predicts for


def layout_rows(a: Analysis, emulated: pd.DataFrame) -> pd.DataFrame:
    """Ring or parameter servers, by the overlap model, for each link's emulated series of the
    largest batch (its largest measured row) at LAYOUT_NODES and its largest node count, on
    its link and one 10x faster:
    images/s of each layout, the dedicated servers needed, the fastest and by how much."""
    rows = []
    weak = emulated[emulated["scaling"] != "strong"] if "scaling" in emulated else emulated
    for _, g in weak.groupby(["bandwidth", "engine", "settings"], sort=False, dropna=False):
        g = g[g["batch_size"] == g["batch_size"].max()]  # one series a link: its largest batch
        last = g.iloc[-1]
        ppn = int(last.get("procs_per_node") or 1)
        counts = sorted({*LAYOUT_NODES, int(last["nodes"])} - {1})
        for r in bucket_model.layout_choices(last, counts, WHAT_IF_LINKS, a.alpha_s):
            rows.append({"from": f"{last['bandwidth']}, {batch_text(last['batch_size'])}, "
                                 f"{ppn} a node", **r})
    if not rows:
        return pd.DataFrame()
    out = pd.DataFrame(rows).drop_duplicates(["from", "link_mbit", "nodes"])
    return out.sort_values(["from", "link_mbit", "nodes"], kind="stable")


# ---------------------------------------------------------------------------- slow ranks

SLOW_RANK_COLUMNS = ["sweep", "run", "node", "rank", "world_size", "batch_size", "scaling",
                     "link", "compute_ms", "others_ms", "excess", "wait_ms"]
# a sweep measures one link per run (head to second node); every pair comes from the last
# `invoke check --links` before it, kept in sweep.json "link_pairs"
LINK_PAIRS_NOTE = (
    "Per-pair link rates: none kept with this sweep. A sweep measures one link per run, the "
    "head node to the second (the scaling table's model link); run invoke check --links "
    "before a sweep and its rates for every pair of nodes are kept with the sweep and shown "
    "here, the slow ones flagged, beside the slow ranks.")
LINK_PAIR_COLUMNS = ["sweep", "pair", "mbit", "of_median", "flag", "measured_at"]


def link_pair_rows(a: Analysis) -> pd.DataFrame:
    """Every pair's rate from the check --links each sweep kept (sweep.json "link_pairs"):
    sweep, pair ("n0 <-> n1"), Mbit/s, share of the typical rate, the flag (slow or failed,
    scalelab.run.linkprobe.slow_pairs), when it was measured. Empty when no sweep kept any."""
    rows = []
    for s in a.sweeps:
        doc = s.meta.get("link_pairs")
        pairs = linkprobe.measurements(doc) if isinstance(doc, dict) else []
        if not pairs:
            continue
        typical = linkprobe.typical_rate(pairs)
        flagged = {(m.server, m.client): why for m, why in linkprobe.slow_pairs(pairs)}
        for m in pairs:
            share = (m.mbit / typical) if m.mbit is not None and typical else None
            why = flagged.get((m.server, m.client), "")
            rows.append({"sweep": s.sweep_id, "pair": f"{m.server} <-> {m.client}",
                         "mbit": m.mbit, "of_median": share,
                         "flag": ("FAILED" if m.mbit is None else "SLOW") if why else "",
                         "measured_at": str(doc.get("measured_at") or "")})
    return pd.DataFrame(rows, columns=LINK_PAIR_COLUMNS)


def cost_rows(a: Analysis) -> tuple[float | None, pd.DataFrame]:
    """Cost per million images for each (link, batch, node count) a sweep measured, from its
    plan's price_per_node_hour: price x nodes / (images/s x 3600) x 1e6. (None, empty) when
    no sweep has a price. With emulated accelerators, images/s are in the device's time."""
    prices = {s.sweep_id: (s.meta.get("plan") or {}).get("price_per_node_hour")
              for s in a.sweeps}
    prices = {k: float(v) for k, v in prices.items() if isinstance(v, int | float) and v > 0}
    if not prices:
        return None, pd.DataFrame()
    df = a.modelled[a.modelled["sweep_id"].isin(prices)].copy()
    df = df[df["thr_mean"].astype(float) > 0]
    if df.empty:
        return next(iter(prices.values())), pd.DataFrame()
    price = df["sweep_id"].map(prices).astype(float)
    df["nodes"] = (df["world_size"].astype(int) // df["procs_per_node"].astype(int)).clip(lower=1)
    df["cost"] = price * df["nodes"] / (df["thr_mean"].astype(float) * 3600) * 1e6
    df["link"] = df["bandwidth"].astype(str)
    df = analysis.with_series_columns(df)
    cheapest = df.groupby(["sweep_id", "link", "batch_size", "scaling"])["cost"].transform("min")
    df["cheapest"] = np.where(np.isclose(df["cost"], cheapest), "cheapest", "")
    keep = ["sweep_id", "link", "batch_size", "scaling", "nodes", "world_size", "thr_mean",
            "cost", "cheapest"]
    order = df.assign(_bw=df["bandwidth_mbit"].astype(float).fillna(np.inf)).sort_values(
        ["sweep_id", "_bw", "batch_size", "nodes"], kind="stable")
    return next(iter(prices.values())), order[keep].reset_index(drop=True)


def slow_rank_rows(a: Analysis) -> pd.DataFrame:
    """One row per flagged rank (scalelab.model.stragglers): its run, node, compute per step, the
    median of the run's other ranks, how much longer it computed, and the others' wait per
    step, in milliseconds rounded as the sentences write them; ordered by sweep, link rate,
    batch, world size, run and rank."""
    f = a.stragglers.flagged
    if f.empty:
        return pd.DataFrame(columns=SLOW_RANK_COLUMNS)
    rate = a.runs.drop_duplicates(["sweep_id", "run_id"]).set_index(
        ["sweep_id", "run_id"])["bandwidth_mbit"].astype(float)
    f = f.assign(_bw=[rate.get(k, np.nan) for k in zip(f["sweep_id"], f["run_id"],
                                                        strict=True)])
    f = f.assign(_bw=f["_bw"].fillna(np.inf)).sort_values(
        ["sweep_id", "_bw", "batch_size", "world_size", "run_id", "rank"], kind="stable")
    return pd.DataFrame({
        "sweep": f["sweep_id"], "run": f["run_id"], "node": f["host"], "rank": f["rank"],
        "world_size": f["world_size"], "batch_size": f["batch_size"],
        "scaling": f["scaling"] if "scaling" in f else "weak", "link": f["bandwidth"],
        "compute_ms": f["compute_s"].map(_ms_number), "others_ms": f["others_s"].map(_ms_number),
        "excess": f["excess"], "wait_ms": f["wait_s"].map(_ms_number)},
        columns=SLOW_RANK_COLUMNS)


def slow_rank_notes(a: Analysis) -> list[str]:
    """How each sweep's threshold was set, and one sentence when no rank was flagged."""
    s = a.stragglers
    multi = len(a.sweeps) > 1
    notes = []
    for d in a.sweeps:
        noise = s.noise.get(d.sweep_id)
        prefix = f"{d.sweep_id}: " if multi else ""
        notes.append(prefix + (noise.sentence() if noise else
                               "No ok run had two ranks that reported a compute time per step, "
                               "so no rank could be compared with its peers."))
    if s.flagged.empty and not s.ranks.empty:
        runs = s.ranks.groupby(["sweep_id", "run_id"]).ngroups
        limits = sorted({n.threshold for n in s.noise.values()})
        said = " or ".join(f"{x * 100:.1f}%" for x in limits)
        notes.append(f"No slow rank: in the {runs:,} runs compared, no rank's compute time per "
                     f"step was more than {said} above the median of its run's other ranks.")
    return notes
