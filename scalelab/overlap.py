"""The overlap-aware model: a step predicted from the bucket timeline, not compute + comm.

With per-layer backward times (a device profile), gradients become ready one layer at a time,
last layer first. The engine groups them (DDP: buckets of 25 MiB, the first 1 MiB, in the order
gradients become ready; Horovod: whatever is ready when its background thread is next free,
fused up to 64 MiB) and reduces one group after another over the link. A group's transfer starts when its last
gradient is ready and the previous group's transfer is done; its per-hop latencies are not
link time and overlap the previous group's transfer:

    end_j = max(end_(j-1) + transfer_j,  ready_j + latency + transfer_j)
    transfer_j = 2(N-1)/N x bytes_j / link,  latency = 2(N-1) x alpha

    step = forward + max(backward, end_last) + optimizer

so communication hides behind the backward pass until the link cannot keep up. The ring time
is analysis.ring_allreduce_time_s (the same formula as the non-overlapped model).

The report shows one prediction per point (add_prediction): this model's wherever a profile
gives the per-layer gradient-ready times, the ring model's (its limit) only where none does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scalelab import analysis

MIB = 1 << 20
DDP_FIRST_BUCKET = 1 * MIB  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET = 25 * MIB  # DDP's bucket_cap_mb default
HOROVOD_FUSION = 64 * MIB  # HOROVOD_FUSION_THRESHOLD default


def ready_times(doc: dict[str, Any], bytes_per_elem: int) -> list[tuple[float, int]]:
    """(time after backward starts at which a layer's gradients are ready, their bytes), in
    the order backward produces them (the profile's layers reversed)."""
    t = 0.0
    out = []
    for layer in reversed(doc["layers"]):
        t += layer["bwd_s"]
        out.append((t, int(layer.get("numel") or 0) * bytes_per_elem))
    return out


def ddp_groups(ready: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """DDP's buckets: filled in ready order, closed once they reach their cap.

    >>> ddp_groups([(1.0, MIB), (2.0, 10 * MIB), (3.0, 20 * MIB), (4.0, 1)])
    [(1.0, 1048576), (3.0, 31457280), (4.0, 1)]
    """
    groups, size, cap = [], 0, DDP_FIRST_BUCKET
    for t, b in ready:
        size += b
        if size >= cap:
            groups.append((t, size))
            size, cap = 0, DDP_BUCKET
    if size:
        groups.append((ready[-1][0], size))
    return groups


def timeline_end(ready: Sequence[tuple[float, int]], engine: str, world: int, link_mbit: float,
                 alpha_s: float) -> float:
    """When the last allreduce ends, in seconds after backward starts.

    Groups share the link one after another, but a group's per-hop latencies (alpha x 2(N-1))
    are not link time: the engine has it in flight while the previous group still holds the
    link (gloo and NCCL run several collectives at once), so a group ends at
    max(previous end + its transfer, its ready time + its whole ring time).
    """
    def transfer(nbytes: int) -> float:
        return float(analysis.ring_allreduce_time_s(world, nbytes, link_mbit, 0.0))

    latency = float(analysis.ring_allreduce_time_s(world, 0, link_mbit, alpha_s))
    end = 0.0
    if engine == "horovod":
        i = 0
        while i < len(ready):
            start = max(end, ready[i][0])
            size = 0
            while i < len(ready) and ready[i][0] <= start and size + ready[i][1] <= max(HOROVOD_FUSION, ready[i][1]):
                size += ready[i][1]
                i += 1
            end = max(end + transfer(size), start + latency + transfer(size))
        return end
    for t, size in ddp_groups(ready):
        end = max(end + transfer(size), t + latency + transfer(size))
    return end


def predict_step_s(doc: dict[str, Any], engine: str, world: int, link_mbit: float,
                   precision: str = "fp32", alpha_s: float = analysis.DEFAULT_ALPHA_S) -> float:
    """A step of `world` ranks over links of link_mbit with this profile (see module doc).

    >>> doc = {"optimizer_s": 0.0, "layers": [{"fwd_s": 0.1, "bwd_s": 0.1, "numel": 25_000_000},
    ...                                       {"fwd_s": 0.1, "bwd_s": 0.1, "numel": 1000}]}
    >>> round(predict_step_s(doc, "ddp", 1, 1000.0), 3)          # one rank: no communication
    0.4
    >>> # forward 0.2 s, then 100 MB ready 0.2 s into backward take 0.8 s at 1 Gbit/s
    >>> round(predict_step_s(doc, "ddp", 2, 1000.0, alpha_s=0), 3)
    1.2
    """
    fwd = sum(layer["fwd_s"] for layer in doc["layers"])
    bwd = sum(layer["bwd_s"] for layer in doc["layers"])
    if world <= 1 or not link_mbit or math.isnan(link_mbit):
        return fwd + bwd + doc["optimizer_s"]
    ready = ready_times(doc, 2 if precision in ("amp", "bf16") else 4)
    return fwd + max(bwd, timeline_end(ready, engine, world, link_mbit, alpha_s)) + doc["optimizer_s"]


def _profile(row: Any) -> dict[str, Any] | None:
    return _profile_or_reason(row)[0]


def _profile_or_reason(row: Any) -> tuple[dict[str, Any] | None, str]:
    """A row's per-layer profile, or why it has none (the reason the ring model stands in)."""
    from scalelab import accel
    from scalelab.errors import InputError
    from scalelab.models import MODELS

    if not row.get("accelerator"):
        return None, "no per-layer profile (the ranks computed for real)"
    try:
        return accel.resolve(str(row["accelerator"]), str(row["model"]), str(row["precision"]),
                             int(row["batch_size"]), MODELS[str(row["model"])].image_size), ""
    except (InputError, KeyError, ValueError, TypeError):
        return None, (f"no {row['accelerator']} profile for {row['model']} {row['precision']} "
                      "was found")


def add_overlap_model(modelled: Any, alpha_s: float = analysis.DEFAULT_ALPHA_S) -> Any:
    """Adds overlap_step_s, overlap_compute_s (the profile's step alone: forward, backward,
    optimizer), overlap_eff (step(N0) / step(N)) and overlap_note (why a row has no overlap
    prediction, "" where it has one) to the rows of a modelled summary (analysis.add_model)
    whose series ran on an emulated accelerator, from its profile and the same link rate as
    the ring model (link_mbit_model); NaN elsewhere."""
    import numpy as np

    out = modelled.copy()
    out["overlap_step_s"] = np.nan
    out["overlap_compute_s"] = np.nan
    out["overlap_note"] = "no per-layer profile (the ranks computed for real)"
    if out.empty:
        out["overlap_eff"] = np.asarray([], dtype=float)
        return out
    emulated = out["accelerator"].astype(bool) if "accelerator" in out else out["nodes"] < 0
    for i, row in out[emulated].iterrows():  # only rows with a profile: a big sweep stays fast
        doc, why = _profile_or_reason(row)
        rate = float(row["link_mbit_model"]) if int(row["nodes"]) > 1 else math.inf
        if doc is not None and not rate > 0:  # NaN: no link rate known, so nothing to predict
            doc, why = None, "no link rate known"
        out.at[i, "overlap_note"] = why
        if doc is not None:
            out.at[i, "overlap_compute_s"] = predict_step_s(
                doc, str(row["engine"]), 1, math.inf, str(row["precision"]), alpha_s)
            out.at[i, "overlap_step_s"] = predict_step_s(
                doc, str(row["engine"]), int(row["world_size"]), rate, str(row["precision"]),
                alpha_s)
    keys = list(analysis.SERIES_KEYS)
    base_ws = out.groupby(keys, dropna=False)["world_size"].transform("min")
    base = out["overlap_step_s"].where(out["world_size"] == base_ws).groupby(
        [out[k] for k in keys], dropna=False).transform("max")
    out["overlap_eff"] = base / out["overlap_step_s"]
    return out


def add_prediction(modelled: Any, alpha_s: float = analysis.DEFAULT_ALPHA_S) -> Any:
    """The one prediction per point that the report shows: the overlap model's where it can be
    computed (a per-layer profile and a link rate), else the ring model's (analysis.add_model,
    the overlap model's limit with nothing hidden), never both.

    Adds predicted_by ("overlap", "ring", or "" where neither can), model_note (why the ring
    model stands in, "" for the overlap model), model_step_s, model_compute_s (the step without
    communication), model_exposed_s (communication per step not hidden behind compute: step -
    compute), model_share (exposed / step) and model_eff.

    >>> import pandas as pd
    >>> ring = pd.DataFrame({"predicted_step_s": [0.5], "predicted_compute_s": [0.4],
    ...     "predicted_eff": [0.8], "overlap_step_s": [float("nan")],
    ...     "overlap_compute_s": [float("nan")], "overlap_eff": [float("nan")],
    ...     "overlap_note": ["no per-layer profile (the ranks computed for real)"]})
    >>> row = add_prediction(ring).iloc[0]
    >>> row["predicted_by"], round(float(row["model_exposed_s"]), 3), round(float(row["model_share"]), 3)
    ('ring', 0.1, 0.2)
    """
    import numpy as np

    out = modelled if "overlap_step_s" in modelled else add_overlap_model(modelled, alpha_s)
    out = out.copy()
    use = out["overlap_eff"].notna() & out["overlap_step_s"].notna()
    ring_ok = out["predicted_eff"].notna() & out["predicted_step_s"].notna()
    out["predicted_by"] = np.where(use, "overlap", np.where(ring_ok, "ring", ""))
    note = out["overlap_note"].fillna("").astype(str)
    out["model_note"] = np.where(use, "", np.where(ring_ok, note, "no link rate known"))
    out["model_step_s"] = out["overlap_step_s"].where(use, out["predicted_step_s"])
    out["model_compute_s"] = out["overlap_compute_s"].where(use, out["predicted_compute_s"])
    out["model_eff"] = out["overlap_eff"].where(use, out["predicted_eff"])
    out["model_exposed_s"] = (out["model_step_s"] - out["model_compute_s"]).clip(lower=0)
    out["model_share"] = out["model_exposed_s"] / out["model_step_s"]
    return out


def what_if(row: Any, world_sizes: Sequence[int], link_factors: Sequence[float],
            alpha_s: float = analysis.DEFAULT_ALPHA_S) -> list[dict[str, Any]]:
    """Predictions beyond the measured points for one series (its largest measured row):
    efficiency at other world sizes and link rates, from the overlap model."""
    doc = _profile(row)
    rate = float(row["link_mbit_model"])
    if doc is None or not rate > 0:
        return []
    one = predict_step_s(doc, str(row["engine"]), 1, math.inf, str(row["precision"]), alpha_s)
    out = []
    for f in link_factors:
        for n in world_sizes:
            step = predict_step_s(doc, str(row["engine"]), n, rate * f, str(row["precision"]), alpha_s)
            out.append({"world_size": n, "link_mbit": rate * f, "step_s": step,
                        "eff": one / step, "images_per_sec": n * int(row["batch_size"]) / step})
    return out
