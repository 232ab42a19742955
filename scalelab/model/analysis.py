"""How training scales: efficiency, confidence intervals, the ring-allreduce model.

Pure functions over numbers or over the run frame that scalelab.results.frames builds (one row per
train run). Nothing here reads files, logs figures as if measured, or plots. The overlap model
is scalelab.model.bucket_model; what limits each point, named from the model, is scalelab.model.verdict.

Definitions used throughout:

* A *series* is the set of runs that differ only in node count and repeat: same sweep, model,
  engine, precision, input data, batch size per worker, link bandwidth and processes per node
  (SERIES_KEYS). Processes per node is part of it because ranks on one node share that node's
  link and talk to each other without it: mixing 1x2 and 2x1 layouts would put two different
  machines at the same world size.
* Scaling efficiency of a run = throughput(N) / ((N / N0) x throughput(N0)), N0 the smallest
  world size the plan gives its series (its baseline_world_size), throughput(N0) the mean over
  that size's ok repeats; no ok run at N0 means no efficiency for the series, never a silently
  larger N0.
* Confidence intervals are 95 %, Student t, over repeats. The interval of the efficiency (a
  ratio) is the t interval of the per-repeat efficiencies, each computed against the *mean*
  baseline: it carries the spread of the run at N but treats the baseline mean as exact, so it
  is slightly narrow when the baseline is noisy (the baseline's own spread shows as the interval
  at N0 around 100 %). One repeat gives no interval (NaN), never a made-up one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from scalelab.core.errors import InputError
from scalelab.model import fabric, layouts
from scalelab.model.stats import ci_half

# settings: the variant settings that differ from their defaults, communication settings and
# any variant axis that names its own series ("" for none; scalelab.results.frames), so runs
# of other settings are separate series
# scaling: weak (batch_size is each worker's) or strong (batch_size is the global batch, split
# over the ranks: batch_per_worker shrinks as the world grows); see scalelab.results.frames._scaling
SERIES_KEYS = ("sweep_id", "model", "engine", "precision", "data", "batch_size", "bandwidth",
               "procs_per_node", "settings", "memory_format", "scaling")

# Per-hop latency of one ring step (software + wire) for TCP transports (gloo) on Ethernet,
# used when no allreduce probe gives a fit. 50 us is the order measured for small-message
# allreduce over 1-10 Gbit/s TCP; it only matters for small models or many ranks.
DEFAULT_ALPHA_S = 50e-6

# The fidelity guard of emulated accelerators (issue: emulation on one host): a run is
# emulation-bound when, during its timed steps, the host had less than this CPU idle ...
HOST_IDLE_MIN = 0.10
# ... or the emulated compute per step exceeded the profile's by more than this ...
COMPUTE_FIDELITY = 0.05
# ... or the link, measured at its dilated rate, delivered less than this share of it.
LINK_FIDELITY = 0.90


# ---------------------------------------------------------------------------- scaling efficiency

def scaling_efficiency(throughput: float, world_size: int, base_throughput: float,
                       base_world_size: int) -> float:
    """throughput(N) / ((N / N0) x throughput(N0)).

    Worked example: 1 rank does 100 images/s, 4 ranks do 320 images/s together;
    ideal is 4 / 1 x 100 = 400, so efficiency = 320 / 400 = 0.8.

    >>> scaling_efficiency(320.0, 4, 100.0, 1)
    0.8
    >>> scaling_efficiency(300.0, 8, 100.0, 2)
    0.75
    """
    if world_size < 1 or base_world_size < 1:
        raise InputError("scaling_efficiency: world sizes must be 1 or more")
    if not base_throughput > 0:
        return math.nan
    return throughput / ((world_size / base_world_size) * base_throughput)


def _ok_mask(frame: pd.DataFrame) -> pd.Series:
    return ((frame["status"] == "ok") & frame["images_per_sec"].notna()
            & frame["world_size"].notna() & frame["batch_size"].notna())


def fidelity(frame: pd.DataFrame, target: np.ndarray | None = None) -> pd.Series:
    """Why each emulated-accelerator run is emulation-bound ("" when it is faithful, and for
    runs that compute for real, which the bottleneck rules judge instead). target: each row's
    rate as fabric_terms gives it, where the caller has it already.

    >>> f = pd.DataFrame({"accelerator": ["v100", "v100", "v100", ""],
    ...     "host_cpu_idle": [0.5, 0.04, 0.5, 0.0], "compute_time_mean_s": [0.2, 0.2, 0.3, 1.0],
    ...     "profile_step_s": [0.2, 0.2, 0.2, float("nan")], "bandwidth_mbit": [1000.0] * 4,
    ...     "link_mbit_measured": [950.0, 950.0, 950.0, 10.0]})
    >>> list(fidelity(f))  # doctest: +NORMALIZE_WHITESPACE
    ['', 'host saturated: 4% CPU idle in the timed steps',
     "compute waits stretched: 0.3 s per step against the profile's 0.2 s (+50%)", '']
    """
    out = []
    # the rate a link should carry: the fabric profile's share of the line, the line itself
    # on the ideal fabric
    if target is None:
        target, _ = fabric_terms(frame, DEFAULT_ALPHA_S)
    for i, row in enumerate(frame.itertuples(index=False)):
        why = ""
        if getattr(row, "accelerator", ""):
            idle = float(row.host_cpu_idle)
            comp, prof = float(row.compute_time_mean_s), float(row.profile_step_s)
            link, rate = float(row.link_mbit_measured), float(target[i])
            if idle == idle and idle < HOST_IDLE_MIN:
                why = f"host saturated: {idle * 100:.0f}% CPU idle in the timed steps"
            elif comp == comp and prof > 0 and comp > prof * (1 + COMPUTE_FIDELITY):
                why = (f"compute waits stretched: {comp:.3g} s per step against the profile's "
                       f"{prof:.3g} s (+{(comp / prof - 1) * 100:.0f}%)")
            elif link > 0 and rate > 0 and link < LINK_FIDELITY * rate:
                why = (f"link short of its rate: {link:.0f} of {rate:.0f} Mbit/s "
                       f"({link / rate * 100:.0f}%)")
        out.append(why)
    return pd.Series(out, index=frame.index, dtype=object)


def batch_text(batch: Any, scaling: Any = "weak") -> str:
    """A series' batch as what it is: each worker's (weak scaling) or the global batch split over
    the ranks (strong scaling).

    >>> batch_text(64), batch_text(512.0, "strong")
    ('batch 64/worker', 'global batch 512')
    """
    b = int(batch) if isinstance(batch, int | float | np.integer | np.floating) and batch == batch \
        else batch
    return f"global batch {b}" if scaling == "strong" else f"batch {b}/worker"


def with_series_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with every SERIES_KEYS column: a frame from before settings,
    memory_format or strong scaling (or made by hand) gets them as "" (the engine's defaults),
    "contiguous" and "weak", and batch_per_worker as its batch_size.

    >>> f = with_series_columns(pd.DataFrame({"model": ["m"], "batch_size": [32]}))
    >>> list(f["settings"]), list(f["memory_format"]), list(f["scaling"]), list(f["batch_per_worker"])
    ([''], ['contiguous'], ['weak'], [32])
    """
    missing = {k: v for k, v in (("settings", ""), ("memory_format", "contiguous"),
                                 ("scaling", "weak")) if k not in frame.columns}
    if "batch_per_worker" not in frame.columns and "batch_size" in frame.columns:
        missing["batch_per_worker"] = frame["batch_size"]
    return frame.assign(**missing) if missing else frame


def baseline_world_size(frame: pd.DataFrame,
                        min_nodes: Mapping[str, int] | None = None) -> pd.Series:
    """The world size each run's efficiency is measured against: its series' planned smallest.

    With the plan known (min_nodes: sweep id -> the plan's smallest node count) it is that
    node count x the series' procs per node; without it, the smallest world size recorded for
    the series, whatever the runs' status. Never the smallest that happened to succeed: if the
    baseline's runs all failed, efficiency is empty rather than silently measured against 2.

    >>> df = pd.DataFrame({"sweep_id": "s", "model": "resnet50", "engine": "ddp",
    ...     "precision": "fp32", "data": "synthetic", "batch_size": 32, "bandwidth": "1gbit",
    ...     "procs_per_node": 2, "world_size": [4, 6]})
    >>> baseline_world_size(df).tolist(), baseline_world_size(df, {"s": 1}).tolist()
    ([4.0, 4.0], [2.0, 2.0])
    """
    frame = with_series_columns(frame)
    if frame.empty:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    keys = list(SERIES_KEYS)
    seen = frame.groupby(keys, dropna=False)["world_size"].transform("min").astype(float)
    if not min_nodes:
        return seen
    planned = frame["sweep_id"].map(lambda s: min_nodes.get(str(s), math.nan)).astype(float)
    planned = planned * frame["procs_per_node"].astype(float)
    return planned.fillna(seen)


def add_efficiency(frame: pd.DataFrame, base_ws: pd.Series | None = None) -> pd.Series:
    """Per-run scaling efficiency against the mean baseline of its series (NaN if not ok).

    The frame needs SERIES_KEYS, world_size, status and images_per_sec. base_ws is each run's
    baseline (baseline_world_size; by default as recorded, without the plan); a series with no
    ok run at its baseline gets no efficiency at all.

    >>> df = pd.DataFrame({"sweep_id": "s", "model": "resnet50", "engine": "ddp",
    ...     "precision": "fp32", "data": "synthetic", "batch_size": 32, "bandwidth": "1gbit",
    ...     "procs_per_node": 1, "status": "ok", "world_size": [1, 1, 2, 2],
    ...     "images_per_sec": [99.0, 101.0, 180.0, 190.0]})
    >>> add_efficiency(df).round(3).tolist()
    [0.99, 1.01, 0.9, 0.95]
    >>> df.loc[:1, "status"] = "failed"  # every 1-node run failed: no baseline, no efficiency
    >>> add_efficiency(df).tolist()
    [nan, nan, nan, nan]
    """
    frame = with_series_columns(frame)
    out = pd.Series(np.nan, index=frame.index, dtype=float)
    ok = _ok_mask(frame)
    if not ok.any():
        return out
    if base_ws is None:
        base_ws = baseline_world_size(frame)
    keys = list(SERIES_KEYS)
    good = frame.loc[ok, [*SERIES_KEYS, "world_size", "images_per_sec"]].assign(
        _base_ws=base_ws[ok])
    at_base = good[good["world_size"].astype(float) == good["_base_ws"]]
    base = at_base.groupby(keys, dropna=False)["images_per_sec"].mean().rename("_base_thr")
    merged = good.join(base, on=keys)  # series without an ok baseline run: NaN
    eff = merged["images_per_sec"] / ((merged["world_size"] / merged["_base_ws"])
                                      * merged["_base_thr"])
    out.loc[good.index] = eff.to_numpy(dtype=float)
    return out


def missing_baselines(frame: pd.DataFrame) -> pd.DataFrame:
    """Series that have ok runs but no ok run at their baseline: their efficiency is empty.

    The frame needs baseline_world_size (results.to_frame adds it). One row per such series:
    SERIES_KEYS and baseline_world_size.
    """
    cols = [*SERIES_KEYS, "baseline_world_size"]
    if frame.empty or "baseline_world_size" not in frame:
        return pd.DataFrame(columns=cols)
    frame = with_series_columns(frame)
    ok = _ok_mask(frame)
    at_base = ok & (frame["world_size"].astype(float) == frame["baseline_world_size"])
    keys = list(SERIES_KEYS)
    g = frame.assign(_ok=ok, _at=at_base).groupby(keys, dropna=False)
    flags = g.agg(_ok=("_ok", "any"), _at=("_at", "any"),
                  baseline_world_size=("baseline_world_size", "first")).reset_index()
    return flags[flags["_ok"] & ~flags["_at"]][cols].reset_index(drop=True)


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (series, world size) over ok repeats: means and 95 % CIs.

    Columns: SERIES_KEYS, world_size, nodes, target, n (repeats), and for throughput
    (``thr``), per-worker throughput (``per_worker``) and efficiency (``eff``): ``_mean``,
    ``_lo``, ``_hi``; plus the means of step_time_mean_s, compute_time_mean_s,
    comm_time_mean_s, comm_inflight_mean_s (time gradients were in flight, overlapped or not),
    data_time_mean_s (time a rank waited for its input batch), comm_fraction, link_mbit_measured, busbw_mb_s, gradient_bytes and
    bandwidth_mbit. Rows are sorted by series then world size.
    """
    frame = with_series_columns(frame)
    keys = [*SERIES_KEYS, "world_size"]
    ok = frame[_ok_mask(frame)]
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "n"])
    # worked out over every run, not only ok ones: the baseline is the planned smallest size
    eff = (frame["scaling_efficiency"] if "scaling_efficiency" in frame
           else add_efficiency(frame))[ok.index]
    work = ok.assign(_eff=eff)
    for col in ("comm_inflight_mean_s", "data_time_mean_s"):  # frames from before they were recorded
        if col not in work:
            work[col] = np.nan
    if "baseline_world_size" not in work:
        work["baseline_world_size"] = baseline_world_size(frame)[work.index]
    # frames from before emulated accelerators
    for col, empty in (("accelerator", ""), ("fidelity", ""), ("dilation", 1.0),
                       ("host_cpu_idle", np.nan), ("link_utilisation", np.nan),
                       ("profile_step_s", np.nan), ("accelerator_source", ""),
                       ("fabric_profile", "ideal"), ("intra_mbit", np.nan)):
        if col not in work:
            work[col] = empty
    g = work.groupby(keys, dropna=False, sort=True)
    out = g.agg(
        nodes=("nodes", "first"), target=("target", "first"), n=("images_per_sec", "count"),
        thr_mean=("images_per_sec", "mean"), thr_std=("images_per_sec", "std"),
        per_worker_mean=("images_per_sec_per_worker", "mean"),
        per_worker_std=("images_per_sec_per_worker", "std"),
        eff_mean=("_eff", "mean"), eff_std=("_eff", "std"),
        step_time_mean_s=("step_time_mean_s", "mean"),
        step_time_p95_s=("step_time_p95_s", "mean"),
        compute_time_mean_s=("compute_time_mean_s", "mean"),
        comm_time_mean_s=("comm_time_mean_s", "mean"),
        comm_inflight_mean_s=("comm_inflight_mean_s", "mean"),
        data_time_mean_s=("data_time_mean_s", "mean"),
        comm_fraction=("comm_fraction", "mean"),
        link_mbit_measured=("link_mbit_measured", "mean"),
        busbw_mb_s=("busbw_mb_s", "mean"),
        gradient_bytes=("gradient_bytes", "mean"),
        batch_per_worker=("batch_per_worker", "first"),
        # one series holds one communication setting (settings is a series key)
        **{k: (k, "first") for k in ("bucket_cap_mb", "fusion_threshold_mb", "compression",
                                     "ps_placement", "ps_servers", "ps_overlap")
           if k in work},
        bandwidth_mbit=("bandwidth_mbit", "first"),
        baseline_world_size=("baseline_world_size", "first"),
        accelerator=("accelerator", "first"),
        fabric_profile=("fabric_profile", "first"),
        intra_mbit=("intra_mbit", "first"),
        accelerator_source=("accelerator_source", "first"),
        dilation=("dilation", "mean"),
        profile_step_s=("profile_step_s", "mean"),
        host_cpu_idle=("host_cpu_idle", "min"),
        link_utilisation=("link_utilisation", "mean"),
        fidelity=("fidelity", lambda col: next((str(x) for x in col if x), "")),
        # real data: what the loaders read per image and what the source's probes gave
        **{k: (k, "mean") for k in ("data_bytes_per_image", "storage_read_mb_s",
                                    "decode_img_s_per_core", "loader_workers", "accel_busy")
           if k in work},
    ).reset_index()
    for name in ("thr", "per_worker", "eff"):
        half = ci_half(out[f"{name}_std"], out["n"])
        out[f"{name}_lo"] = out[f"{name}_mean"] - half
        out[f"{name}_hi"] = out[f"{name}_mean"] + half
        out = out.drop(columns=f"{name}_std")
    return out


# ---------------------------------------------------------------------------- the communication model

def ring_allreduce_time_s(world_size: Any, grad_bytes: Any, link_mbit: Any,
                          alpha_s: float = DEFAULT_ALPHA_S) -> Any:
    """Time of one ring allreduce: 2(N-1)/N x S/B + alpha x 2(N-1).

    S = gradient bytes, B = link rate in bytes/s (link_mbit x 1e6 / 8), N = ranks in the ring.
    Each rank sends and receives 2(N-1)/N x S over its link (reduce-scatter then allgather)
    in 2(N-1) steps, each paying the latency alpha. Works on scalars and numpy arrays;
    N = 1 costs nothing, an infinite link leaves only the latency term.

    Worked example: N = 4, S = 100 MB, B = 1000 Mbit/s = 125 MB/s:
    2 x 3 / 4 x 100 / 125 = 1.2 s, plus 50 us x 6 = 0.0003 s, so 1.2003 s.

    >>> round(ring_allreduce_time_s(4, 100e6, 1000.0), 6)
    1.2003
    >>> ring_allreduce_time_s(1, 100e6, 1000.0)
    0.0
    """
    n = np.asarray(world_size, dtype=float)
    s = np.asarray(grad_bytes, dtype=float)
    rate = np.asarray(link_mbit, dtype=float) * 1e6 / 8
    with np.errstate(divide="ignore", invalid="ignore"):
        bw_term = np.where(n > 1, 2 * (n - 1) / n * s / rate, 0.0)
    lat_term = alpha_s * 2 * np.maximum(n - 1, 0)
    result = bw_term + lat_term
    return float(result) if result.ndim == 0 else result


def predict_step_time_s(compute_s: Any, comm_s: Any, overlap: bool = False) -> Any:
    """Step time from compute and communication: their sum, or their max with full overlap.

    >>> predict_step_time_s(0.4, 0.3), predict_step_time_s(0.4, 0.3, overlap=True)
    (0.7, 0.4)
    """
    result = np.maximum(compute_s, comm_s) if overlap else np.add(compute_s, comm_s)
    return float(result) if np.ndim(result) == 0 else result


def model_link_mbit(measured_mbit: Any, requested_mbit: Any, busbw_mb_s: Any) -> tuple[Any, Any]:
    """The link rate the model uses and where it came from, first known of:
    measured (link_mbit_measured), requested (bandwidth_mbit), allreduce busbw (MB/s x 8).

    >>> model_link_mbit(940.0, 1000.0, 100.0)
    (940.0, 'measured')
    >>> model_link_mbit(float("nan"), float("nan"), 110.0)
    (880.0, 'busbw')
    """
    m = np.asarray(measured_mbit, dtype=float)
    r = np.asarray(requested_mbit, dtype=float)
    b = np.asarray(busbw_mb_s, dtype=float) * 8
    rate = np.where(~np.isnan(m), m, np.where(~np.isnan(r), r, b))
    source = np.where(~np.isnan(m), "measured",
                      np.where(~np.isnan(r), "requested", np.where(~np.isnan(b), "busbw", "none")))
    if rate.ndim == 0:
        return float(rate), str(source)
    return rate, source


def fabric_terms(frame: pd.DataFrame, alpha_s: float,
                 profile_alpha: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the requested rate as the row's fabric profile says collectives carry it
    (bandwidth_mbit x the profile's share; the line rate itself on the ideal fabric), and the
    per-hop latency (the profile's unless profile_alpha is False, as with a latency the user
    gave; alpha_s on the ideal fabric).

    >>> f = pd.DataFrame({"bandwidth_mbit": [1000.0, 1000.0], "procs_per_node": [1, 1],
    ...                   "fabric_profile": ["ideal", "ethernet-tcp"]})
    >>> rate, alpha = fabric_terms(f, 50e-6)
    >>> rate.tolist(), (alpha * 1e6).round(1).tolist()
    ([1000.0, 941.0], [50.0, 40.0])
    """
    requested = frame["bandwidth_mbit"].astype(float).to_numpy().copy()
    alpha = np.full(len(frame), float(alpha_s))
    profiles = frame["fabric_profile"] if "fabric_profile" in frame else [None] * len(frame)
    ppns = frame["procs_per_node"] if "procs_per_node" in frame else [1] * len(frame)
    for i, (name, ppn) in enumerate(zip(profiles, ppns, strict=True)):
        fab = fabric.maybe(name)
        if fab is None:
            continue
        if requested[i] == requested[i]:
            requested[i] = fab.collective_mbit(requested[i], int(ppn) if ppn == ppn else 1)
        if profile_alpha:
            alpha[i] = fab.per_hop_latency_s
    return requested, alpha


def row_alpha_s(row: Any, alpha_s: float) -> float:
    """One row's per-hop latency: the model's column where the row has one, else its fabric
    profile's, else alpha_s."""
    a = row.get("model_alpha_s") if hasattr(row, "get") else None
    if isinstance(a, float | int) and a == a:
        return float(a)
    fab = fabric.maybe(row.get("fabric_profile") if hasattr(row, "get") else None)
    return fab.per_hop_latency_s if fab is not None else alpha_s


def fit_alpha_s(allreduce: pd.DataFrame) -> float | None:
    """Per-hop latency from the allreduce probes: at each multi-node probe's smallest message,
    alpha = (time - 2(N-1)/N x size/B) / (2(N-1)); the median over probes, floored at 0.
    B is the probe's requested link rate (an unshaped link counts as infinite here, so its
    whole small-message time is latency). None when there is no usable probe.

    >>> ar = pd.DataFrame({"status": "ok", "nodes": [2, 2], "world_size": [2, 2],
    ...     "size_bytes": [1024, 1 << 20], "time_s": [1.1e-4, 0.02],
    ...     "bandwidth_mbit": [1000.0, 1000.0]})
    >>> round(fit_alpha_s(ar) * 1e6, 1)   # (110 us - 1 x 1024 / 125e6 s) / 2
    50.9
    """
    if allreduce is None or allreduce.empty:
        return None
    ar = allreduce[(allreduce["status"] == "ok") & (allreduce["nodes"] > 1)
                   & (allreduce["world_size"] > 1)]
    if ar.empty:
        return None
    run_key = "run_id" if "run_id" in ar else "nodes"
    smallest = ar.loc[ar.groupby([run_key, "world_size"])["size_bytes"].idxmin()]
    n = smallest["world_size"].astype(float)
    rate = smallest["bandwidth_mbit"].astype(float).fillna(np.inf) * 1e6 / 8
    alpha = (smallest["time_s"] - 2 * (n - 1) / n * smallest["size_bytes"] / rate) / (2 * (n - 1))
    alpha = alpha.dropna()
    if alpha.empty:
        return None
    return max(float(alpha.median()), 0.0)


def add_model(summary: pd.DataFrame, alpha_s: float = DEFAULT_ALPHA_S,
              overlap: bool = False, profile_alpha: bool = True) -> pd.DataFrame:
    """Predicted step time and efficiency for every (series, world size) of a summary.

    Compute time per step = the measured mean compute time at the series' smallest world size
    (the single-node step without communication; when ranks report no split, that size's step
    time minus its modelled communication). Communication = ring_allreduce_time_s with
    S = gradient_bytes (the run's precision) and B from model_link_mbit. A single-node series
    talks over loopback/shared memory, so its bandwidth term is taken as zero. Predicted
    step(N) = compute + comm(N), or max of the two with ``overlap``; predicted efficiency =
    step(N0) / step(N), because with a fixed batch per worker throughput is N x batch / step.
    A strong-scaling series (a fixed global batch) computes batch_per_worker(N) /
    batch_per_worker(N0) of the base compute per step, and its efficiency is the same ratio of
    throughputs, G / step(N) against N / N0 x G / step(N0).

    Adds: link_mbit_model, link_source, predicted_comm_s, predicted_compute_s (the compute
    above), predicted_step_s, predicted_comm_share (comm / predicted step) and predicted_eff.
    These are the ring model's; the report's one prediction per point is
    scalelab.model.bucket_model.add_prediction's, which falls back to them where no profile exists.
    """
    out = with_series_columns(summary).copy()
    if out.empty:
        for col in ("link_mbit_model", "link_source", "predicted_comm_s", "predicted_compute_s",
                    "predicted_step_s", "predicted_comm_share", "predicted_eff"):
            out[col] = pd.Series(dtype=float)
        return out
    requested, alpha = fabric_terms(out, alpha_s, profile_alpha)
    out["link_target_mbit"] = requested
    rate, source = model_link_mbit(out["link_mbit_measured"], requested, out["busbw_mb_s"])
    # one node talks over loopback, unless its parameter servers are nodes of their own
    lays = [layouts.of_row(r) for r in out.to_dict("records")]
    local = (out["nodes"].to_numpy() <= 1) & np.array(
        [lay.placement != layouts.DEDICATED for lay in lays], dtype=bool)
    rate = np.where(local, np.inf, rate)
    out["link_mbit_model"] = np.where(np.isinf(rate), np.nan, rate)
    out["link_source"] = np.where(local, "intra-node", source)
    out["model_alpha_s"] = alpha
    comm = ring_allreduce_time_s(out["world_size"].to_numpy(), out["gradient_bytes"].to_numpy(),
                                 rate, alpha)
    # parameter servers: their busiest NIC's bytes, push and pull (scalelab.model.layouts)
    alphas = np.broadcast_to(np.asarray(alpha, dtype=float), (len(out),))
    comm = np.array(comm, dtype=float)
    for i, lay in enumerate(lays):
        if lay.ps:
            comm[i] = layouts.comm_time_s(lay, float(out["gradient_bytes"].iat[i]),
                                          float(rate[i]), float(alphas[i]))
    out["predicted_comm_s"] = comm
    keys = list(SERIES_KEYS)
    base_ws = out.groupby(keys, dropna=False)["world_size"].transform("min")
    is_base = out["world_size"] == base_ws
    compute_base = out["compute_time_mean_s"].where(
        out["compute_time_mean_s"].notna(), out["step_time_mean_s"] - out["predicted_comm_s"])
    base_compute = (compute_base.where(is_base).groupby([out[k] for k in keys], dropna=False)
                    .transform("max"))
    # the share of the base's compute a rank does at N: 1 with a fixed batch per worker
    share = out["batch_per_worker"].astype(float) / out["batch_per_worker"].where(is_base).groupby(
        [out[k] for k in keys], dropna=False).transform("max").astype(float)
    share = share.where(out["scaling"] == "strong", 1.0)
    out["predicted_compute_s"] = base_compute * share
    out["predicted_step_s"] = predict_step_time_s(out["predicted_compute_s"],
                                                  out["predicted_comm_s"], overlap)
    out["predicted_eff"] = throughput_efficiency(out, out["predicted_step_s"], is_base, keys)
    out["predicted_comm_share"] = out["predicted_comm_s"] / out["predicted_step_s"]
    return out


def throughput_efficiency(rows: pd.DataFrame, step_s: pd.Series, is_base: pd.Series,
                          keys: list[str]) -> pd.Series:
    """Efficiency from predicted step times: images/s at N (world x batch per worker / step)
    against N / N0 x images/s at N0, within each series. With a fixed batch per worker this is
    step(N0) / step(N); with a fixed global batch, N0 step(N0) / (N step(N)).

    >>> rows = pd.DataFrame({"s": ["a", "a"], "world_size": [1, 4], "batch_per_worker": [64, 16]})
    >>> throughput_efficiency(rows, pd.Series([1.0, 0.5]), rows["world_size"] == 1, ["s"]).tolist()
    [1.0, 0.5]
    """
    ws = rows["world_size"].astype(float)
    ips = ws * rows["batch_per_worker"].astype(float) / step_s
    groups = [rows[k] for k in keys]
    base_ips = ips.where(is_base).groupby(groups, dropna=False).transform("max")
    base_ws = ws.where(is_base).groupby(groups, dropna=False).transform("max")
    return ips / ((ws / base_ws) * base_ips)


# ---------------------------------------------------------------------------- the hosts

def host_limits(sweep: dict[str, Any]) -> dict[str, Any]:
    """What the emulation check needs from sweep.json: target, host cores, node CPU share.

    host_cpus is read from the top level, then from software/plan; node CPUs are the smallest
    known ``cpus`` of the nodes (0 = unknown).

    emulated: the nodes share one machine's CPUs (the target says so in sweep.json; sweeps
    recorded before that field existed had host_cpus only when emulated).

    >>> host_limits({"target": "local", "host_cpus": 2, "nodes": [{"cpus": 0.5}, {"cpus": 1}]})
    {'target': 'local', 'emulated': True, 'host_cpus': 2.0, 'node_cpus': 0.5}
    """
    def pick(*dicts: Any) -> float:
        for d in dicts:
            if isinstance(d, dict) and d.get("host_cpus"):
                return float(d["host_cpus"])
        return math.nan

    host = pick(sweep, sweep.get("software"), sweep.get("plan"), sweep.get("env"))
    cpus = [float(n.get("cpus") or 0) for n in sweep.get("nodes") or [] if isinstance(n, dict)]
    cpus = [c for c in cpus if c > 0]
    emulated = bool(sweep.get("emulated", bool(sweep.get("host_cpus"))))
    return {"target": sweep.get("target") or "", "emulated": emulated, "host_cpus": host,
            "node_cpus": min(cpus) if cpus else math.nan}
