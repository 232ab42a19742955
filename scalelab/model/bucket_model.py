"""The overlap-aware model: a step predicted from the bucket timeline, not compute + comm.

With per-layer backward times (a device profile), gradients become ready one layer at a time,
last layer first. The engine groups them (DDP: buckets of 25 MiB, the first 1 MiB, in the order
gradients become ready; Horovod: whatever is ready when its background thread is next free,
fused up to its fusion threshold, 128 MiB by default) and reduces one group after another over the link. A group's transfer starts when its last
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

from scalelab.core.errors import InputError
from scalelab.model import accel, analysis, fabric, layouts
from scalelab.model.comm import COMM_DEFAULTS, comm_label
from scalelab.model.networks import MODELS

MIB = 1 << 20
DDP_FIRST_BUCKET = 1 * MIB  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET = 25 * MIB  # DDP's bucket_cap_mb default
HOROVOD_FUSION = 128 * MIB  # HOROVOD_FUSION_THRESHOLD default since Horovod 0.21 (was 64)


def ready_times(doc: dict[str, Any], bytes_per_elem: int) -> list[tuple[float, int]]:
    """(time after backward starts at which a layer's gradients are ready, their bytes), in
    the order backward produces them (the profile's layers reversed)."""
    t = 0.0
    out = []
    for layer in reversed(doc["layers"]):
        t += layer["bwd_s"]
        out.append((t, int(layer.get("numel") or 0) * bytes_per_elem))
    return out


def ddp_groups(ready: Sequence[tuple[float, int]],
               bucket_bytes: int = DDP_BUCKET) -> list[tuple[float, int]]:
    """DDP's buckets: filled in ready order, closed once they reach their cap (bucket_cap_mb;
    the first bucket is 1 MiB whatever the cap).

    >>> ddp_groups([(1.0, MIB), (2.0, 10 * MIB), (3.0, 20 * MIB), (4.0, 1)])
    [(1.0, 1048576), (3.0, 31457280), (4.0, 1)]
    >>> ddp_groups([(1.0, MIB), (2.0, 10 * MIB), (3.0, 20 * MIB), (4.0, 1)], 5 * MIB)
    [(1.0, 1048576), (2.0, 10485760), (3.0, 20971520), (4.0, 1)]
    """
    groups, size, cap = [], 0, DDP_FIRST_BUCKET
    for t, b in ready:
        size += b
        if size >= cap:
            groups.append((t, size))
            size, cap = 0, bucket_bytes
    if size:
        groups.append((ready[-1][0], size))
    return groups


def timeline_end(ready: Sequence[tuple[float, int]], engine: str, world: int, link_mbit: float,
                 alpha_s: float, group_bytes: int | None = None,
                 layout: layouts.Layout | None = None) -> float:
    """When the last allreduce ends, in seconds after backward starts.

    Groups share the link one after another, but a group's per-hop latencies (alpha x 2(N-1))
    are not link time: the engine has it in flight while the previous group still holds the
    link (gloo and NCCL run several collectives at once), so a group ends at
    max(previous end + its transfer, its ready time + its whole ring time). group_bytes: DDP's
    bucket cap or Horovod's fusion threshold (None: the engine's default).

    Parameter servers (a layout with servers) sum DDP-sized buckets the same way, each bucket
    on its busiest NIC's bytes (layouts.transfer_s) with two hops of latency; with dedicated
    servers the last bucket's pull follows its push.
    """
    if layout is not None and layout.ps:
        end, tail = 0.0, 0.0
        lat = layouts.hops(layout) * alpha_s
        for t, size in ddp_groups(ready, DDP_BUCKET if group_bytes is None else group_bytes):
            x, tail = layouts.transfer_s(layout, size, link_mbit)
            end = max(end + x, t + lat + x)
        return end + tail

    def transfer(nbytes: int) -> float:
        return float(analysis.ring_allreduce_time_s(world, nbytes, link_mbit, 0.0))

    latency = float(analysis.ring_allreduce_time_s(world, 0, link_mbit, alpha_s))
    end = 0.0
    if engine == "horovod":
        fusion = HOROVOD_FUSION if group_bytes is None else group_bytes
        i = 0
        while i < len(ready):
            start = max(end, ready[i][0])
            size = 0
            while i < len(ready) and ready[i][0] <= start and size + ready[i][1] <= max(fusion, ready[i][1]):
                size += ready[i][1]
                i += 1
            end = max(end + transfer(size), start + latency + transfer(size))
        return end
    for t, size in ddp_groups(ready, DDP_BUCKET if group_bytes is None else group_bytes):
        end = max(end + transfer(size), t + latency + transfer(size))
    return end


def predict_step_s(doc: dict[str, Any], engine: str, world: int, link_mbit: float,
                   precision: str = "fp32", alpha_s: float = analysis.DEFAULT_ALPHA_S,
                   group_mb: float | None = None, compression: str = "none",
                   gpu_stretch: float | None = None,
                   layout: layouts.Layout | None = None) -> float:
    """A step of `world` ranks over links of link_mbit with this profile (see module doc).

    group_mb: the run's DDP bucket_cap_mb or Horovod fusion threshold in MB (None: the
    engine's default); compression "fp16" sends 2 bytes per gradient element. gpu_stretch:
    the GPU-side cost of training beside other GPUs and communication (kernels and copies that
    compete with compute, a shared PCIe root and host), as the factor every compute time of a
    rank grows by when world > 1; measured on one node of G GPUs as 1 / its efficiency (None:
    the profile's gpu_side_stretch, 1 without one). layout: where the gradients are summed
    (layouts.of_row; None: the engine's ring); dedicated servers send over the network at
    one worker node too.

    >>> doc = {"optimizer_s": 0.0, "layers": [{"fwd_s": 0.1, "bwd_s": 0.1, "numel": 25_000_000},
    ...                                       {"fwd_s": 0.1, "bwd_s": 0.1, "numel": 1000}]}
    >>> round(predict_step_s(doc, "ddp", 1, 1000.0), 3)          # one rank: no communication
    0.4
    >>> # forward 0.2 s, then 100 MB ready 0.2 s into backward take 0.8 s at 1 Gbit/s
    >>> round(predict_step_s(doc, "ddp", 2, 1000.0, alpha_s=0), 3)
    1.2
    >>> round(predict_step_s(doc, "ddp", 2, 1000.0, alpha_s=0, compression="fp16"), 3)
    0.8
    """
    fwd = sum(layer["fwd_s"] for layer in doc["layers"])
    bwd = sum(layer["bwd_s"] for layer in doc["layers"])
    remote = layout is not None and layout.placement == layouts.DEDICATED
    if (world <= 1 and not remote) or not link_mbit or math.isnan(link_mbit):
        return fwd + bwd + doc["optimizer_s"]

    # with peers, the GPU-side cost as the ranks apply it (emulate.for_world)
    doc = accel.emulate.for_world(
        doc if gpu_stretch is None else {**doc, "gpu_side_stretch": gpu_stretch}, world)
    fwd = sum(layer["fwd_s"] for layer in doc["layers"])
    bwd = sum(layer["bwd_s"] for layer in doc["layers"])
    ready = ready_times(doc, 2 if precision in ("amp", "bf16") or compression == "fp16" else 4)
    group = None if group_mb is None else int(group_mb * MIB)
    end = timeline_end(ready, engine, world, link_mbit, alpha_s, group, layout)
    return fwd + max(bwd, end) + doc["optimizer_s"]


def _profile(row: Any) -> dict[str, Any] | None:
    return _profile_or_reason(row)[0]


def _per_worker(row: Any) -> int:
    """The batch each rank of a row trained on (a strong-scaling row's batch_size is global)."""
    b = row.get("batch_per_worker")
    return int(b if b is not None and b == b else row["batch_size"])


def _profile_or_reason(row: Any, batch: int | None = None) -> tuple[dict[str, Any] | None, str]:
    """A row's per-layer profile (at batch per worker, by default the row's), or why it has
    none (the reason the ring model stands in)."""

    if not row.get("accelerator"):
        return None, "no per-layer profile (the ranks computed for real)"
    try:
        return accel.resolve(str(row["accelerator"]), str(row["model"]), str(row["precision"]),
                             batch or _per_worker(row), MODELS[str(row["model"])].image_size), ""
    except (InputError, KeyError, ValueError, TypeError):
        return None, (f"no {row['accelerator']} profile for {row['model']} {row['precision']} "
                      "was found")


def _run_setting(row: Any) -> tuple[float | None, str]:
    """The bucket (DDP) or fusion (Horovod) size in MB and the compression a row's runs used
    (None and "none": the engine's defaults, as a row from before the settings were recorded).

    >>> _run_setting({"engine": "ddp", "bucket_cap_mb": 50.0, "compression": "fp16"})
    (50.0, 'fp16')
    >>> _run_setting({"engine": "horovod", "fusion_threshold_mb": float("nan")})
    (None, 'none')
    """
    key = "fusion_threshold_mb" if row.get("engine") == "horovod" else "bucket_cap_mb"
    mb = row.get(key)
    mb = float(mb) if isinstance(mb, int | float) and mb == mb else None
    comp = row.get("compression")
    return mb, comp if comp in ("none", "fp16") else "none"


def intra_paced(row: Any, link_mbit: float) -> float:
    """The rate a row's ring moves at: its slowest edge, the link between nodes or a stated
    path between the ranks of a node (intra_mbit; unstated: free).

    >>> intra_paced({"procs_per_node": 4, "intra_mbit": 80000.0}, math.inf)
    80000.0
    >>> intra_paced({"procs_per_node": 4, "intra_mbit": float("nan")}, 9000.0)
    9000.0
    >>> intra_paced({"procs_per_node": 1, "intra_mbit": 800.0}, 9000.0)   # no two share a node
    9000.0
    """
    intra = row.get("intra_mbit")
    if int(row.get("procs_per_node") or 1) < 2 or not isinstance(intra, int | float) \
            or not intra == intra or intra <= 0:
        return link_mbit
    return min(link_mbit, float(intra))


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
        layout = layouts.of_row(row)
        networked = int(row["nodes"]) > 1 or layout.placement == layouts.DEDICATED
        rate = intra_paced(row, float(row["link_mbit_model"]) if networked else math.inf)
        if doc is not None and not rate > 0:  # NaN: no link rate known, so nothing to predict
            doc, why = None, "no link rate known"
        out.at[i, "overlap_note"] = why
        if doc is not None:
            group_mb, compression = _run_setting(row)
            alpha = analysis.row_alpha_s(row, alpha_s)
            out.at[i, "overlap_compute_s"] = predict_step_s(
                doc, str(row["engine"]), 1, math.inf, str(row["precision"]), alpha)
            out.at[i, "overlap_step_s"] = predict_step_s(
                doc, str(row["engine"]), int(row["world_size"]), rate, str(row["precision"]),
                alpha, group_mb, compression, layout=layout)
    keys = list(analysis.SERIES_KEYS)
    out = analysis.with_series_columns(out)
    base_ws = out.groupby(keys, dropna=False)["world_size"].transform("min")
    out["overlap_eff"] = analysis.throughput_efficiency(out, out["overlap_step_s"],
                                                        out["world_size"] == base_ws, keys)
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


def _layout_at(row: Any, world: int) -> layouts.Layout:
    """A row's layout at another world size (its ranks per node; colocated servers follow the
    nodes, dedicated ones stay K)."""
    ppn = int(row.get("procs_per_node") or 1)
    return layouts.of_row({**dict(row), "nodes": max(1, world // ppn)})


def what_if(row: Any, world_sizes: Sequence[int], link_factors: Sequence[float],
            alpha_s: float = analysis.DEFAULT_ALPHA_S) -> list[dict[str, Any]]:
    """Predictions beyond the measured points for one series (its largest measured row):
    efficiency at other world sizes and link rates, from the overlap model."""
    doc = _profile(row)
    rate = float(row["link_mbit_model"])
    if doc is None or not rate > 0:
        return []
    alpha_s = analysis.row_alpha_s(row, alpha_s)
    strong = row.get("scaling") == "strong"  # a fixed global batch: its share per rank shrinks
    g = int(row["batch_size"])
    engine, precision = str(row["engine"]), str(row["precision"])
    one_doc = _profile_or_reason(row, g)[0] if strong else doc
    if one_doc is None:
        return []
    one_ips = (g if strong else _per_worker(row)) / predict_step_s(
        one_doc, engine, 1, math.inf, precision, alpha_s)  # images/s of one rank
    out = []
    for f in link_factors:
        for n in world_sizes:
            if strong and g % n:
                continue  # the global batch does not split over n ranks
            at = _profile_or_reason(row, g // n)[0] if strong else doc
            if at is None:
                continue
            step = predict_step_s(at, engine, n, intra_paced(row, rate * f), precision,
                                  alpha_s, layout=_layout_at(row, n))
            ips = (g if strong else n * _per_worker(row)) / step
            out.append({"world_size": n, "link_mbit": rate * f, "step_s": step,
                        "eff": ips / (n * one_ips), "images_per_sec": ips})
    return out


LAYOUT_SERVERS = (1, 2, 4, 8, 16, 32)  # the dedicated server counts the layout table tries


def layout_choices(row: Any, node_counts: Sequence[int], link_factors: Sequence[float],
                   alpha_s: float = analysis.DEFAULT_ALPHA_S,
                   server_counts: Sequence[int] = LAYOUT_SERVERS) -> list[dict[str, Any]]:
    """For one series with a profile (its largest measured row): at each node count and link
    rate, the overlap model's images/s for the ring, for parameter servers colocated on the
    worker nodes and for the fewest dedicated servers within 1 % of the best any count in
    server_counts gives; which is fastest and by how much over the next. The same batch,
    precision and buckets as the series ran with."""
    doc = _profile(row)
    rate = float(row.get("link_mbit_model") or math.nan)
    if doc is None or not rate > 0 or row.get("scaling") == "strong":
        return []
    alpha_s = analysis.row_alpha_s(row, alpha_s)
    ppn = int(row.get("procs_per_node") or 1)
    engine = str(row["engine"]) if row["engine"] != "ps" else "ddp"
    group_mb, compression = _run_setting({**dict(row), "engine": engine})
    precision, batch = str(row["precision"]), _per_worker(row)
    out = []
    for f in link_factors:
        link = intra_paced(row, rate * f)
        for n in node_counts:
            w = n * ppn

            def ips(layout: layouts.Layout, w: int = w, link: float = link) -> float:
                return w * batch / predict_step_s(doc, engine, w, link, precision, alpha_s,
                                                  group_mb, compression, layout=layout)

            ring = ips(layouts.Layout(n, ppn))
            colocated = ips(layouts.Layout(n, ppn, n, layouts.COLOCATED))
            dedicated = {k: ips(layouts.Layout(n, ppn, k, layouts.DEDICATED))
                         for k in server_counts}
            top = max(dedicated.values())
            k = min(k for k, v in dedicated.items() if v >= 0.99 * top)
            options = sorted([("ring", ring), ("colocated servers", colocated),
                              (f"{k} dedicated server{'s' if k != 1 else ''}", dedicated[k])],
                             key=lambda kv: -kv[1])
            out.append({"nodes": n, "link_mbit": rate * f, "ring_ips": ring,
                        "colocated_ips": colocated, "servers": k,
                        "dedicated_ips": dedicated[k], "fastest": options[0][0],
                        "margin": options[0][1] / options[1][1] - 1,
                        "beats_ring_from": layouts.servers_to_beat_ring(n) if ppn == 1
                        else None})
    return out


# ------------------------------------------------------------------------------ communication settings

def setting_label(engine: str, group_mb: float, compression: str) -> str:
    """How the report names a communication setting.

    >>> setting_label("ddp", 25.0, "none"), setting_label("horovod", 64.0, "fp16")
    ('bucket 25 MB', 'fusion 64 MB, fp16')
    """
    key = "fusion_threshold_mb" if engine == "horovod" else "bucket_cap_mb"
    return comm_label({key: float(group_mb), "compression": compression}, every=True)


def comm_settings(runs: Any, alpha_s: float = analysis.DEFAULT_ALPHA_S) -> Any:
    """Measured efficiency and images/s of each communication setting per (sweep, bandwidth,
    batch, world size), with the overlap model's prediction for it, and predicted-only rows
    for the settings not run (the default, and 0.5x and 2x of the measured group sizes).
    Empty unless the runs vary a setting. Columns: sweep_id, bandwidth, bandwidth_mbit,
    batch_size, world_size, engine, setting, group_mb, compression, cycle_time_ms, measured
    (bool), eff, images_per_sec, model_eff, is_default, best (the measured setting with the
    most images/s in its group), gain_points and gain_ips (the best's lead over the
    default, where the default was measured).

    Efficiency = throughput(N) / (N / N0 x throughput(N0)) within one setting (N0 the
    smallest world size of that setting's runs; the baseline of a setting that has no N0 run
    is the mean over the group's N0 runs of every setting).
    """
    import numpy as np
    import pandas as pd

    cols = ["sweep_id", "bandwidth", "bandwidth_mbit", "batch_size", "world_size", "engine",
            "setting", "group_mb", "compression", "cycle_time_ms", "measured", "eff",
            "images_per_sec", "model_eff", "is_default", "best", "gain_points", "gain_ips",
            "scaling"]
    if runs.empty or "bucket_cap_mb" not in runs:
        return pd.DataFrame(columns=cols)
    ok = runs[runs["status"] == "ok"].copy()
    ok = ok[ok["images_per_sec"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    hvd = ok["engine"] == "horovod"
    ok["group_mb"] = np.where(hvd, ok["fusion_threshold_mb"], ok["bucket_cap_mb"])
    ok["cycle_time_ms"] = ok["cycle_time_ms"].where(hvd)
    ok["compression"] = ok["compression"].replace("", "none")
    sets = ["group_mb", "compression", "cycle_time_ms"]
    if ok[sets].drop_duplicates().shape[0] <= 1:
        return pd.DataFrame(columns=cols)
    ok = analysis.with_series_columns(ok)  # a frame from before memory_format was a key
    out = _measured_settings(ok, sets)
    out = out[out["world_size"] > out.groupby(SETTING_KEYS, dropna=False)["world_size"]
              .transform("min")]
    out = _with_unmeasured_settings(out)
    out["model_eff"] = [_setting_prediction(r, alpha_s) for _, r in out.iterrows()]
    out["setting"] = [setting_label(str(r["engine"]), float(r["group_mb"]), str(r["compression"]))
                      + (f", cycle {r['cycle_time_ms']:g} ms" if r["cycle_time_ms"] == r["cycle_time_ms"]
                         and r["engine"] == "horovod" else "")
                      for _, r in out.iterrows()]
    default_mb = np.where(out["engine"] == "horovod", COMM_DEFAULTS["fusion_threshold_mb"],
                          COMM_DEFAULTS["bucket_cap_mb"])
    out["is_default"] = ((out["group_mb"] == default_mb) & (out["compression"] == "none")
                         & out["cycle_time_ms"].fillna(COMM_DEFAULTS["cycle_time_ms"]).eq(
                             COMM_DEFAULTS["cycle_time_ms"]))
    point = [*SETTING_KEYS, "world_size"]
    out = _best_and_gains(out, point)
    out = out.sort_values([*point, "measured", "group_mb", "compression"],
                          ascending=[True] * len(point) + [False, True, True])
    return out[cols].reset_index(drop=True)


# what one comparison of communication settings holds fixed (the world size aside)
SETTING_KEYS = ["sweep_id", "model", "engine", "precision", "memory_format", "data", "batch_size",
                "bandwidth", "procs_per_node", "scaling"]


def _measured_settings(ok: Any, sets: list[str]) -> Any:
    """A row per measured setting and world size: its images/s and its efficiency against its
    own smallest world size (or the group's, where it has no run there)."""
    import pandas as pd

    rows = []
    for key, grp in ok.groupby(SETTING_KEYS, dropna=False, sort=True):
        n0 = grp["world_size"].min()
        any_base = grp.loc[grp["world_size"] == n0, "images_per_sec"].mean()
        first = grp.iloc[0]
        for setting, sg in grp.groupby(sets, dropna=False, sort=True):
            base = sg.loc[sg["world_size"] == n0, "images_per_sec"].mean()
            base = any_base if not base > 0 else base
            for ws, wg in sg.groupby("world_size"):
                ips = float(wg["images_per_sec"].mean())
                rows.append({**dict(zip(SETTING_KEYS, key, strict=True)), "world_size": int(ws),
                             "group_mb": setting[0], "compression": setting[1],
                             "cycle_time_ms": setting[2], "measured": True,
                             "eff": ips / (ws / n0 * base), "images_per_sec": ips,
                             "bandwidth_mbit": first["bandwidth_mbit"],
                             "link_mbit": wg["link_mbit_measured"].mean(),
                             "accelerator": first.get("accelerator", ""),
                             "fabric_profile": first.get("fabric_profile", "ideal")})
    return pd.DataFrame(rows)


def _with_unmeasured_settings(out: Any) -> Any:
    """Adds predicted-only rows: the engine's default and half and double the measured group
    sizes, at every measured point."""
    import numpy as np
    import pandas as pd

    extra = []
    for _key, grp in out.groupby([*SETTING_KEYS, "world_size"], dropna=False, sort=True):
        first = grp.iloc[0]
        engine = str(first["engine"])
        default = COMM_DEFAULTS["fusion_threshold_mb" if engine == "horovod" else "bucket_cap_mb"]
        sizes = set(grp["group_mb"].dropna())
        want = {default} | {s * f for s in sizes for f in (0.5, 2.0)}
        for comp in sorted(set(grp["compression"])):
            for size in sorted(want - sizes):
                extra.append({**first.to_dict(), "group_mb": size, "compression": comp,
                              "measured": False, "eff": np.nan, "images_per_sec": np.nan})
    return pd.concat([out, pd.DataFrame(extra)], ignore_index=True) if extra else out


def _best_and_gains(out: Any, point: list[str]) -> Any:
    """Marks the best measured setting at each point (the one that trained fastest: images/s
    is what a user buys; at one world size and batch that is also the most efficient unless
    the settings' own baselines differ) and its lead over the default, where the default was
    measured."""
    import numpy as np

    measured_ips = out["images_per_sec"].where(out["measured"])
    top = measured_ips.groupby([out[k] for k in point], dropna=False).transform("max")
    out["best"] = out["measured"] & (measured_ips == top)
    base = out[out["measured"] & out["is_default"]].set_index(point)[["eff", "images_per_sec"]]
    gains_p, gains_i = [], []
    for _, r in out.iterrows():
        k = tuple(r[c] for c in point)
        if r["best"] and k in base.index:
            gains_p.append(100 * (r["eff"] - float(base.loc[k, "eff"])))
            gains_i.append(r["images_per_sec"] - float(base.loc[k, "images_per_sec"]))
        else:
            gains_p.append(np.nan)
            gains_i.append(np.nan)
    out["gain_points"], out["gain_ips"] = gains_p, gains_i
    return out


def _setting_prediction(row: Any, alpha_s: float) -> float:
    """The overlap model's efficiency for a setting (NaN without a profile or a link rate);
    a strong-scaling row's batch_size is the global batch, split over its world."""
    ws = int(row["world_size"])
    strong = row.get("scaling") == "strong"
    g = int(row["batch_size"])
    doc = _profile_or_reason(row, g // ws if strong else g)[0]
    one_doc = _profile_or_reason(row, g)[0] if strong else doc
    rate = row["link_mbit"]
    if rate != rate:  # not measured: the requested rate as the fabric's collectives carry it

        fab = fabric.maybe(row.get("fabric_profile"))
        rate = row["bandwidth_mbit"] if fab is None or row["bandwidth_mbit"] != row[
            "bandwidth_mbit"] else fab.collective_mbit(row["bandwidth_mbit"],
                                                       int(row.get("procs_per_node") or 1))
    if doc is None or one_doc is None or not (rate and rate > 0):
        return float("nan")
    alpha_s = analysis.row_alpha_s(row, alpha_s)
    one = predict_step_s(one_doc, str(row["engine"]), 1, math.inf, str(row["precision"]), alpha_s)
    step = predict_step_s(doc, str(row["engine"]), ws, intra_paced(row, float(rate)),
                          str(row["precision"]), alpha_s, float(row["group_mb"]),
                          str(row["compression"]), layout=layouts.of_row(row))
    return one / (ws * step) if strong else one / step
