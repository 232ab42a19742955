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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas only where a frame is made: `invoke bench` starts without it
    import pandas as pd

INPUT_COLUMNS = ("input_storage_ips", "input_decode_ips", "input_ips", "input_limit",
                 "input_demand_ips", "model_input_bound")


def loader_slots(loader_workers: Any, ranks: float) -> float:
    """The readers a run's loaders are: every rank's workers, each reading whole shards of its
    own (a rank without workers reads in its own process: one). NaN where workers is unknown.

    >>> loader_slots(2, 8), loader_slots(0, 8), loader_slots(None, 8)
    (16.0, 8.0, nan)
    """
    try:
        w = float(loader_workers)
    except (TypeError, ValueError):
        return math.nan
    return max(w, 1.0) * ranks if w == w else math.nan


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
    storage, decode = supply(_num(row, "storage_read_mb_s"), bpi,
                             _num(row, "decode_img_s_per_core"),
                             loader_slots(_num(row, "loader_workers"), ws))
    known = [x for x in (storage, decode) if x == x and x > 0]
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
    import pandas as pd

    from scalelab.model.analysis import SERIES_KEYS

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
        base = base if base > 0 else 1.0
        for i in grp.index:
            if out.at[i, "model_input_bound"] or base < 1.0:
                out.at[i, "model_eff"] = out.at[i, "model_eff"] * float(ratio[i]) / base
            if out.at[i, "model_input_bound"]:
                out.at[i, "model_step_s"] = float(out.at[i, "model_input_s"])
    return out


# ---------------------------------------------------------------------------- sizing

# MLPerf Storage's ResNet-50 workload: an emulated H100 consumes 1,786 samples/s of 114,660
# bytes, and a storage setup passes while accelerators stay busy 90 % of the time (AU)
MLPERF_H100 = ("MLPerf Storage emulated H100 (AU 90%)", 1786.0, 114_660.0, 0.90)
GPUS_PER_NODE = 8
SIZING_NODES = (1, 4, 16, 64)
SIZING_BATCH = 64


def profile_rates(model: str = "resnet50", batch: int = SIZING_BATCH) -> list[tuple[str, float]]:
    """(label, images/s of one GPU) for the shipped device profiles of a model, at a batch."""
    from scalelab.model import accel

    out = []
    for (name, m, precision), path in sorted(accel.shipped().items()):
        if m == model:
            doc = accel.scaled(accel.load(path), batch)
            out.append((f"{name.upper()} {model} {precision}", batch / accel.step_s(doc)))
    return out


def sizing(bytes_per_image: float, decode_per_core: float, storage_mb_s: float,
           rates: list[tuple[str, float]]) -> pd.DataFrame:
    """What storage and loader cores each device needs to be fed, and how many of them the
    measured storage feeds: one row per device, the MLPerf Storage H100 last.

    >>> row = sizing(112_000, 300.0, 250.0, [("X", 1000.0)]).iloc[0]
    >>> round(row["mb_s_per_gpu"]), float(round(row["cores_per_gpu"], 2)), int(row["gpus_fed"])
    (112, 3.33, 2)
    """
    import pandas as pd

    rows = []
    for label, ips, size, share in [*[(x, r, bytes_per_image, 1.0) for x, r in rates],
                                    MLPERF_H100]:
        need = ips * size * share / 1e6  # MB/s one device must be given
        row = {"device": label, "images_per_gpu": ips, "mb_s_per_gpu": need,
               "cores_per_gpu": ips * share / decode_per_core if decode_per_core > 0 else math.nan,
               "gpus_fed": math.floor(storage_mb_s / need) if storage_mb_s == storage_mb_s
               else math.nan}
        for n in SIZING_NODES:
            row[f"gb_s_{n}"] = need * GPUS_PER_NODE * n / 1e3
        rows.append(row)
    return pd.DataFrame(rows)
