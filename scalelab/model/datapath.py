"""The input's share of the model: what the storage and the loaders can supply against what
training would take.

For a point that read real data, two ceilings on the images per second the whole run can be
fed, from the probes the sweep made (scalelab.run.storageprobe) and the bytes its loaders read:

* storage: the source's aggregate read rate to the run's nodes reading at once, over the bytes
  per image (tar headers included): read_mb_s x 1e6 / bytes_per_image;
* decode: one core's images/s of the input pipeline (decode, crop, flip, normalise) times the
  loader workers of every rank, each a process on a core of its own (as on GPU nodes).

The input supplies the smaller. Where it is below what the network and compute model predicts
(world x batch per worker / model_step_s), each step waits for its input instead, and the
point's modelled step and efficiency are the input's: efficiency scales by
min(1, supply / demand) at the point over the same ratio at the series' baseline.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from scalelab.model.analysis import SERIES_KEYS

INPUT_COLUMNS = ("input_storage_ips", "input_decode_ips", "input_ips", "input_limit",
                 "input_demand_ips", "model_input_bound")


def supply(read_mb_s: float, bytes_per_image: float, decode_per_core: float,
           decode_workers: float) -> tuple[float, float]:
    """(storage ceiling, decode ceiling) in images/s for the whole run; NaN where unknown.

    >>> [round(x) for x in supply(12.5, 112_000, 300.0, 4)]
    [112, 1200]
    """
    storage = read_mb_s * 1e6 / bytes_per_image if bytes_per_image > 0 else math.nan
    return storage, decode_per_core * decode_workers


def _num(row: Any, key: str) -> float:
    try:
        value = float(row.get(key))
    except (TypeError, ValueError):
        return math.nan
    return value


def _point(row: Any) -> dict[str, Any]:
    ws, b = _num(row, "world_size"), _num(row, "batch_per_worker")
    if math.isnan(b):
        b = _num(row, "batch_size")
    bpi = _num(row, "data_bytes_per_image")
    workers = _num(row, "loader_workers")
    storage, decode = supply(_num(row, "storage_read_mb_s"), bpi,
                             _num(row, "decode_img_s_per_core"),
                             max(workers, 1.0) * ws if workers == workers else math.nan)
    known = [x for x in (storage, decode) if x == x]
    ips = min(known) if known else math.nan
    limit = "" if not known else ("storage" if ips == storage else "decode")
    step = _num(row, "model_step_s")
    demand = ws * b / step if step > 0 else math.nan
    return {"input_storage_ips": storage, "input_decode_ips": decode, "input_ips": ips,
            "input_limit": limit, "input_demand_ips": demand,
            "model_input_bound": bool(ips == ips and demand == demand and ips < demand)}


def add_input_ceiling(modelled: pd.DataFrame) -> pd.DataFrame:
    """INPUT_COLUMNS added to bucket_model.add_prediction's frame, and model_step_s and
    model_eff lowered to the input's where it binds (model_input_s: the step the input allows)."""
    out = modelled.copy()
    if out.empty:
        for col in (*INPUT_COLUMNS, "model_input_s"):
            out[col] = pd.Series(dtype=object)
        return out
    cols = pd.DataFrame([_point(row) for _, row in out.iterrows()], index=out.index)
    for col in INPUT_COLUMNS:
        out[col] = cols[col]
    ratio = (out["input_ips"] / out["input_demand_ips"]).clip(upper=1.0).fillna(1.0)
    per_worker = out["batch_per_worker"] if "batch_per_worker" in out else out["batch_size"]
    out["model_input_s"] = out["world_size"] * per_worker / out["input_ips"]
    keys = [k for k in SERIES_KEYS if k in out]
    for _key, grp in out.groupby(keys, dropna=False, sort=False):
        n0 = grp["baseline_world_size"].iloc[0] if "baseline_world_size" in grp else math.nan
        at_base = grp[grp["world_size"] == n0] if n0 == n0 else grp.loc[[grp["world_size"].idxmin()]]
        base = float(ratio[at_base.index[0]]) if len(at_base) else 1.0
        for i in grp.index:
            if out.at[i, "model_input_bound"] or base < 1.0:
                out.at[i, "model_eff"] = out.at[i, "model_eff"] * float(ratio[i]) / base
            if out.at[i, "model_input_bound"]:
                out.at[i, "model_step_s"] = float(out.at[i, "model_input_s"])
    return out
