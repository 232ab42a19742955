"""Read a sweep's store of record (reports/<sweep_id>/runs.jsonl) into frames and results.csv.

Raw records stay raw: every figure here is derived from the per-rank numbers each record
carries, at read time. Layout and record schema: docs/dev/CONTRACTS.md.
"""

from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scalelab.core.errors import ReportError
from scalelab.core.state import write_atomic
from scalelab.core.units import format_rate
from scalelab.model import analysis
from scalelab.model.comm import comm_label
from scalelab.results.records import RunRecord, number, text, typed
from scalelab.results.store import SWEEP_FILE, TIMELINE_KEYS, read_records
from scalelab.sweep.settings import SETTINGS, Setting, series_label

log = logging.getLogger(__name__)

CSV_FILE = "results.csv"

CSV_COLUMNS = [
    "sweep_id", "run_id", "target", "nodes", "procs_per_node", "world_size", "model", "engine",
    "precision", "batch_size", "bandwidth_mbit", "repeat", "status", "images_per_sec",
    "images_per_sec_per_worker", "step_time_mean_s", "step_time_p95_s", "comm_fraction",
    "busbw_mb_s", "link_mbit_measured", "scaling_efficiency", "started_at", "duration_s", "error", "link_error",
    "baseline_world_size", "accelerator", "dilation", "host_cpu_idle", "link_utilisation",
    "fidelity", "launcher", "slurm_job_id",
    # what the ranks really ran on (a run's placement record) and the one-stream link rate
    "device", "backend", "transport", "gpus_per_node", "gpu_model", "gpu_mem_peak_mb",
    "link_mbit_single_stream",
    # host, or container: then the training image's id (sha256), as every rank ran it
    "runtime", "image_id",
    # the communication settings the ranks used (comm.COMM_KEYS; empty where the engine has
    # no such setting; a store from before them: the engine's defaults)
    "bucket_cap_mb", "fusion_threshold_mb", "cycle_time_ms", "compression",
    # the convolutions' memory layout: contiguous (NCHW) or channels_last (NHWC)
    "memory_format",
    # weak (a fixed batch per worker: batch_size is it) or strong scaling (a fixed global batch:
    # batch_size is that global batch, split evenly over the ranks); batch_per_worker is what
    # each rank trained on either way
    "scaling", "batch_per_worker",
    # the fabric profile (bench/fabrics/) the shaped links carried and the model used; ideal:
    # the line rate as tc gives it
    "fabric_profile",
    # the path between the ranks of one node as stated (--intra-link) and its Mbit/s per ring
    # edge; empty: the node's loopback unshaped, which the model takes as free
    "intra_link", "intra_mbit",
    # real data: what the ranks' loaders read from storage in the timed steps, MB/s all ranks
    # together, and bytes per image trained on (tar headers included); empty for synthetic
    "data_read_mb_s", "data_bytes_per_image",
    # real data: what the source gave in the storage probe (MB/s to the run's nodes reading at
    # once) and the decode probe (images/s one core's input pipeline makes of its images)
    "storage_read_mb_s", "decode_img_s_per_core",
]
# the settings declared since (scalelab.sweep.settings, Setting.column), after those above,
# then accel_busy: the accelerator's utilisation as MLPerf Storage counts it, the ranks' mean
# of compute time over step time (what an emulated device computes of each step's wall
# time), then the settings declared after store version 10
SETTING_COLUMNS = {st.column: st for st in SETTINGS if st.column}
CSV_COLUMNS += [c for c, st in SETTING_COLUMNS.items() if c not in CSV_COLUMNS and st.since <= 10]
CSV_COLUMNS += ["accel_busy"]
CSV_COLUMNS += [c for c, st in SETTING_COLUMNS.items() if c not in CSV_COLUMNS and st.since <= 12]
# runs with --checkpoint-every (store version 12): a checkpoint's bytes (all writers), the
# seconds it blocked training and, async, its write's after that (means over the run's
# checkpoints, the slowest rank's, in wall time), and the write's MB/s
CHECKPOINT_COLUMNS = {"checkpoint_bytes": "bytes_per_checkpoint",
                      "checkpoint_blocked_s": "blocked_s_mean",
                      "checkpoint_background_s": "background_s_mean",
                      "checkpoint_write_mb_s": "write_mb_s"}
CSV_COLUMNS += list(CHECKPOINT_COLUMNS)
# then the settings declared since (store version 13 on), then, for runs with
# --inject-failure, what failed and how the run came back (the record's "failure"): the node,
# the last step its ranks finished, the step the run went on from (empty: from the start),
# the seconds from the kill until the first restarted rank's process started and until every
# rank was ready to train again, and the steps done twice
CSV_COLUMNS += [c for c in SETTING_COLUMNS if c not in CSV_COLUMNS]
FAILURE_COLUMNS = {"failed_node": "node", "failed_after_step": "killed_step",
                   "recovered_from_step": "from_step", "recovery_back_s": "back_s",
                   "recovery_ready_s": "ready_s", "recomputed_steps": "recomputed_steps",
                   # a run with a period (Ns): the kills, and its training's wall time
                   "failures_injected": "kills", "failure_every_s": "every_s",
                   "trained_s": "trained_s", "trained_steps": "trained_steps",
                   "trained_step_s": "step_s", "trained_save_s": "save_s",
                   "trained_restart_s": "restart_s", "trained_up_s": "up_s"}
# FAILURE_COLUMNS read from the failure itself (the others from its recovery)
_FAILURE_OWN = ("killed_step", "every_s", "trained_s", "trained_steps", "step_s", "save_s",
                "restart_s", "up_s")
CSV_COLUMNS += list(FAILURE_COLUMNS)
# Kept in the frame (the report and analysis use them), not written to results.csv.
EXTRA_COLUMNS = ["data", "bandwidth", "steps", "image_size", "gradient_bytes",
                 "compute_time_mean_s", "comm_time_mean_s", "comm_inflight_mean_s",
                 "data_time_mean_s", "n_ranks",
                 "profile_step_s", "accelerator_source", *TIMELINE_KEYS,  # where a run's wall time went (NaN when not recorded)
                 # the variant settings that differ from their defaults, as one series key
                 "settings",
                 # the per-hop delay the links added (real time; NaN: none)
                 "hop_delay_us"]
EXTRA_COLUMNS = [c for c in EXTRA_COLUMNS if c not in CSV_COLUMNS]

ALLREDUCE_COLUMNS = ["sweep_id", "run_id", "status", "nodes", "procs_per_node", "world_size",
                     "bandwidth_mbit", "bandwidth", "repeat", "size_bytes", "time_s",
                     "algbw_mb_s", "busbw_mb_s"]


# ---------------------------------------------------------------------------- reading


def gpus_per_node(ranks: list[Any]) -> float:
    """The GPUs a run's ranks used per node, from the ranks' own devices (0 on CPUs; NaN
    when the ranks did not say).

    >>> gpus_per_node([{"host": "a", "device": "cuda:0"}, {"host": "a", "device": "cuda:1"},
    ...                {"host": "b", "device": "cuda:0"}, {"host": "b", "device": "cuda:1"}])
    2.0
    >>> gpus_per_node([{"host": "a", "device": "cpu"}]), gpus_per_node([{"host": "a"}])
    (0.0, nan)
    """
    used: dict[str, set[str]] = {}
    told = False
    for rk in ranks:
        if not isinstance(rk, dict) or not rk.get("device"):
            continue
        told = True
        if str(rk["device"]).startswith("cuda"):
            used.setdefault(str(rk.get("host", "")), set()).add(str(rk["device"]))
    if not told:
        return math.nan
    return float(max((len(v) for v in used.values()), default=0))

def load_sweep(sweep_dir: Path | str) -> dict[str, Any]:
    """sweep.json of a sweep directory ({} with a warning when it is missing)."""
    path = Path(sweep_dir) / SWEEP_FILE
    if not path.exists():
        log.warning("%s is missing; the report will lack the sweep's plan and cluster", path)
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path} is not valid JSON ({exc}); restore it from the sweep") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


def load_runs(sweep_dir: Path | str) -> list[RunRecord]:
    """The records of a sweep, last record per run id, upgraded to this store version by the
    store of record itself
    (a torn last line from a crash is skipped with a warning there); [] when no run has
    finished yet."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ReportError(f"sweep directory {sweep_dir} does not exist")
    return read_records(sweep_dir)


# ---------------------------------------------------------------------------- frames

def _bandwidth_label(mbit: float) -> str:
    return format_rate(None if math.isnan(mbit) else mbit)


def _scaling(p: dict[str, Any]) -> dict[str, Any]:
    """A run's scaling and batches: a strong-scaling run (a global batch split over its ranks)
    is in the series of its global batch, so its batch_size is that; a run from before strong
    scaling, or of a fixed batch per worker, scaled weakly.

    >>> _scaling({"batch_size": 64, "global_batch_size": 256})
    {'scaling': 'strong', 'batch_size': 256.0, 'batch_per_worker': 64.0}
    >>> _scaling({"batch_size": 64})
    {'scaling': 'weak', 'batch_size': 64.0, 'batch_per_worker': 64.0}
    """
    per_worker = number(p.get("batch_size"))
    if p.get("global_batch_size"):
        return {"scaling": "strong", "batch_size": number(p["global_batch_size"]),
                "batch_per_worker": per_worker}
    return {"scaling": "weak", "batch_size": per_worker, "batch_per_worker": per_worker}


def _cell(setting: Setting, value: Any) -> Any:
    """A setting's results.csv cell: a number (NaN where the run has none) or text ("")."""
    return number(value) if setting.numeric else text(value)


def plan_min_nodes(meta: dict[str, Any]) -> dict[str, int]:
    """{sweep id: the plan's smallest node count} from sweep.json ({} when it has no plan).

    >>> plan_min_nodes({"sweep_id": "s1", "plan": {"nodes": [2, 4, 8]}})
    {'s1': 2}
    >>> plan_min_nodes({})
    {}
    """
    nodes = (meta.get("plan") or {}).get("nodes") if isinstance(meta.get("plan"), dict) else None
    ints = [n for n in nodes or [] if isinstance(n, int) and not isinstance(n, bool) and n >= 1]
    if not ints or not meta.get("sweep_id"):
        return {}
    return {str(meta["sweep_id"]): min(ints)}


# a train record's own columns, in the order to_frame builds them
RUN_COLUMNS = ["sweep_id", "run_id", "target", "nodes", "procs_per_node", "world_size", "model",
               "engine", "precision", "batch_size", "bandwidth_mbit", "repeat", "status",
               "link_mbit_measured", "link_error", "started_at", "duration_s", "error", "data",
               "bandwidth", "steps", "image_size", "gradient_bytes", "accelerator", "dilation",
               "profile_step_s", "accelerator_source", "launcher", "slurm_job_id",
               *TIMELINE_KEYS, "device", "backend", "transport", "gpus_per_node", "gpu_model",
               "gpu_mem_peak_mb", "link_mbit_single_stream", "runtime", "image_id",
               "bucket_cap_mb", "fusion_threshold_mb", "cycle_time_ms", "compression",
               "settings", "memory_format", "scaling", "batch_per_worker", "fabric_profile",
               "intra_link", "intra_mbit", "hop_delay_us", "storage_read_mb_s",
               "decode_img_s_per_core"]
RUN_COLUMNS += [c for c in SETTING_COLUMNS if c not in RUN_COLUMNS]
RUN_COLUMNS += list(CHECKPOINT_COLUMNS) + list(FAILURE_COLUMNS)
# each rank's figures as to_frame reads them: short name -> the record's key
RANK_FIELDS = {"ips": "images_per_sec", "step": "step_time_mean_s", "p95": "step_time_p95_s",
               "compute": "compute_time_mean_s", "comm": "comm_time_mean_s",
               "inflight": "comm_inflight_mean_s", "idle": "host_cpu_idle", "tx": "nic_tx_bytes",
               "wall": "timed_wall_s", "data": "data_time_mean_s", "rbytes": "data_bytes",
               "rrate": "data_read_mb_s"}


def to_frame(records: Sequence[RunRecord | dict[str, Any]],
             min_nodes: dict[str, int] | None = None) -> pd.DataFrame:
    """One row per train run: CSV_COLUMNS then EXTRA_COLUMNS.

    Per-rank figures are combined, never extrapolated from rank 0:
    images_per_sec = sum over ranks; images_per_sec_per_worker = mean over ranks;
    step_time_mean_s = mean of the ranks' means (ranks run the same number of steps);
    step_time_p95_s = max over ranks of their p95, because in synchronous data parallelism the
    slowest rank gates every step, and percentiles of different ranks cannot be averaged;
    comm_fraction = mean over ranks of comm_time_mean_s / step_time_mean_s.
    busbw_mb_s comes from the allreduce probe with the same nodes, procs per node and
    bandwidth, at its largest message (mean over ok probes). scaling_efficiency: see
    scalelab.model.analysis.add_efficiency; baseline_world_size, the N0 it is measured against, is
    the plan's smallest node count (min_nodes: sweep id -> count, from plan_min_nodes) x procs
    per node. records: RunRecords, or stored JSON objects (read as RunRecord.of reads them).
    """
    records = typed(records)
    runs = [r for r in records if r.kind == "train"]
    frame = pd.DataFrame([_run_row(rec) for rec in runs], columns=RUN_COLUMNS)
    per_run = _per_run([row for idx, rec in enumerate(runs) for row in _rank_rows(idx, rec)])
    frame = frame.join(per_run)
    frame["n_ranks"] = frame["n_ranks"].fillna(0).astype(int)
    for col in ("nodes", "procs_per_node", "world_size", "batch_size", "repeat",
                "batch_per_worker"):
        frame[col] = frame[col].astype("Int64") if frame[col].isna().any() else frame[col].astype(int)
    frame["busbw_mb_s"] = _probe_busbw(frame, allreduce_frame(records))
    # the share of the link (its shaped, dilated rate: the line, or a fabric profile's share
    # of it) that training kept busy in the timed steps
    target, _ = analysis.fabric_terms(frame, analysis.DEFAULT_ALPHA_S)
    frame["link_utilisation"] = frame["tx_mbit"] / (target / frame["dilation"])
    frame["fidelity"] = analysis.fidelity(frame, target)
    # bytes over the images trained on: each rank's own batch (the global one's share when
    # the scaling is strong) x steps x ranks
    frame["data_bytes_per_image"] = frame["data_bytes"] / (
        frame["batch_per_worker"] * frame["steps"] * frame["n_ranks"]).astype(float)
    frame["baseline_world_size"] = analysis.baseline_world_size(frame, min_nodes)
    frame["scaling_efficiency"] = (analysis.add_efficiency(
        frame, base_ws=frame["baseline_world_size"]) if len(frame) else [])
    return frame[CSV_COLUMNS + EXTRA_COLUMNS]


def _run_row(rec: RunRecord) -> dict[str, Any]:
    """One train record's own columns (RUN_COLUMNS), its ranks' figures aside."""
    p = vars(rec.params)
    nodes = number(p["nodes"])
    ppn = number(p["procs_per_node"])
    ws = number(p["world_size"])
    if math.isnan(ws) and not (math.isnan(nodes) or math.isnan(ppn)):
        ws = nodes * ppn
    bw = number(p["bandwidth_mbit"])
    env, placed = rec.env, rec.placement
    return {
        "sweep_id": rec.sweep_id, "run_id": rec.run_id, "target": rec.target, "nodes": nodes,
        "procs_per_node": ppn, "world_size": ws, "model": text(p["model"]),
        "engine": text(p["engine"]), "precision": text(p["precision"]),
        "batch_size": number(p["batch_size"]), "bandwidth_mbit": bw, "repeat": number(p["repeat"]),
        "status": rec.status, "link_mbit_measured": rec.link_mbit_measured,
        "link_error": rec.link_error, "started_at": rec.started_at,
        "duration_s": rec.duration_s, "error": rec.error,
        "bandwidth": _bandwidth_label(bw),
        "steps": number(p["steps"]), "image_size": number(p["image_size"]),
        "gradient_bytes": rec.gradient_bytes,
        "dilation": number(p["dilation"]) if p["accelerator"] else 1.0,
        "profile_step_s": number(rec.accelerator.get("profile_step_s")),
        "accelerator_source": str(rec.accelerator.get("source") or ""),
        # how the ranks started: direct, torchrun, horovodrun (over SSH) or slurm
        "launcher": str(env.get("launcher") or ""),
        "slurm_job_id": str(rec.slurm.get("job_id") or ""),
        **{k: number(rec.timeline.get(k)) for k in TIMELINE_KEYS},
        "device": str(placed.get("device") or ""),
        "backend": str(placed.get("backend") or ""),
        "transport": str(placed.get("transport") or ""),
        "gpus_per_node": gpus_per_node(list(rec.ranks)),
        "gpu_model": ", ".join(n for n in placed.get("device_names") or [] if n != "cpu"),
        "gpu_mem_peak_mb": number(placed.get("gpu_mem_peak_mb")),
        "link_mbit_single_stream": rec.link_mbit_single_stream,
        "image_id": str((env.get("image") or {}).get("id") or "")
        if isinstance(env.get("image"), dict) else "",
        **{c: _cell(st, p[st.record]) for c, st in SETTING_COLUMNS.items()},
        "data": str(p["data"] or "synthetic"),
        "settings": ", ".join(x for x in (comm_label(p), series_label(p)) if x),
        "memory_format": "channels_last" if p["channels_last"] else "contiguous",
        **_scaling(p),
        "intra_mbit": number(p["intra_mbit"]),
        # the per-hop delay the links added (real time; a fabric profile's latency times k)
        "hop_delay_us": number(env.get("hop_delay_us")),
        "storage_read_mb_s": number(rec.storage.get("read_mb_s")),
        "decode_img_s_per_core": number(rec.storage.get("decode_img_s_per_core")),
        **{c: number(rec.checkpoint.get(k)) for c, k in CHECKPOINT_COLUMNS.items()},
        **_failure(rec.failure),
    }


def _failure(failure: dict[str, Any]) -> dict[str, Any]:
    """A run's FAILURE_COLUMNS: empty (NaN) without an injected failure."""
    back = failure.get("recovery") or {}
    out: dict[str, Any] = {"failed_node": str(failure.get("node") or "")}
    for c, k in FAILURE_COLUMNS.items():
        if c == "failures_injected":  # a record before kills were listed had at most one
            kills = failure.get("kills")
            out[c] = number(len(kills) if kills is not None
                            else (1 if failure.get("killed_at") is not None else None))
        elif c != "failed_node":
            out[c] = number((failure if k in _FAILURE_OWN else back).get(k))
    return out


def _rank_rows(idx: int, rec: RunRecord) -> list[tuple]:
    """A record's ranks as raw tuples (RANK_FIELDS), converted column by column later:
    per-value float() is slow."""
    return [(idx, *(rk.get(k) for k in RANK_FIELDS.values())) for rk in rec.ranks]


def _per_run(rank_rows: list[tuple]) -> pd.DataFrame:
    """Per-rank figures combined per run (see to_frame)."""
    ranks_df = pd.DataFrame(rank_rows, columns=["idx", *RANK_FIELDS])
    for col in RANK_FIELDS:
        if ranks_df[col].dtype.kind != "f":
            ranks_df[col] = pd.to_numeric(ranks_df[col].where(
                ranks_df[col].map(lambda v: not isinstance(v, bool))), errors="coerce")
    ranks_df["comm_frac"] = ranks_df["comm"] / ranks_df["step"]
    ranks_df["busy"] = ranks_df["compute"] / ranks_df["step"]
    ranks_df["tx_mbit"] = ranks_df["tx"] * 8 / ranks_df["wall"] / 1e6  # wall clock: on the link
    g = ranks_df.groupby("idx")
    return pd.DataFrame({
        # min_count=1: a run whose ranks all lack the figure gives NaN, not 0 images/s
        "images_per_sec": g["ips"].sum(min_count=1),
        "images_per_sec_per_worker": g["ips"].mean(),
        "step_time_mean_s": g["step"].mean(),
        "step_time_p95_s": g["p95"].max(),
        "comm_fraction": g["comm_frac"].mean(),
        "accel_busy": g["busy"].mean(),
        "compute_time_mean_s": g["compute"].mean(),
        "comm_time_mean_s": g["comm"].mean(),
        "comm_inflight_mean_s": g["inflight"].mean(),
        "data_time_mean_s": g["data"].mean(),  # waiting for the input batch
        "data_read_mb_s": g["rrate"].sum(min_count=1),
        "data_bytes": g["rbytes"].sum(min_count=1),
        "n_ranks": g.size(),
        "host_cpu_idle": g["idle"].min(),  # the worst moment any rank saw
        "tx_mbit": g["tx_mbit"].mean(),
    })


RANK_COLUMNS = ["sweep_id", "run_id", "rank", "host", "compute_time_mean_s"]


def rank_frame(records: Sequence[RunRecord | dict[str, Any]]) -> pd.DataFrame:
    """One row per rank of every train run, as the ranks reported them (RANK_COLUMNS; the
    compute time NaN where a rank did not give one): what scalelab.model.stragglers compares.

    >>> rank_frame([{"sweep_id": "s", "run_id": "r", "ranks": [
    ...     {"rank": 0, "host": "n0", "compute_time_mean_s": 0.2}, {"rank": 1, "host": "n1"}]}])
      sweep_id run_id  rank host  compute_time_mean_s
    0        s      r     0   n0                  0.2
    1        s      r     1   n1                  NaN
    """
    rows = [(rec.sweep_id, rec.run_id, rk.get("rank"), str(rk.get("host") or ""),
             rk.get("compute_time_mean_s"))
            for rec in typed(records) if rec.kind == "train" for rk in rec.ranks]
    frame = pd.DataFrame(rows, columns=RANK_COLUMNS)
    for col in ("rank", "compute_time_mean_s"):
        frame[col] = pd.to_numeric(frame[col].where(
            frame[col].map(lambda v: not isinstance(v, bool))), errors="coerce")
    return frame


def allreduce_frame(records: Sequence[RunRecord | dict[str, Any]]) -> pd.DataFrame:
    """One row per (allreduce probe run, message size)."""
    rows: list[tuple] = []
    for rec in typed(records):
        if rec.kind != "allreduce":
            continue
        p = rec.params
        nodes, ppn, ws = number(p.nodes), number(p.procs_per_node), number(p.world_size)
        if math.isnan(ws):
            ws = nodes * ppn
        bw = number(p.bandwidth_mbit)
        base = (rec.sweep_id, rec.run_id, rec.status, nodes, ppn, ws, bw,
                _bandwidth_label(bw), number(p.repeat))
        for item in rec.allreduce:
            rows.append(base + (number(item.get("size_bytes")), number(item.get("time_s")),
                                number(item.get("algbw_mb_s")), number(item.get("busbw_mb_s"))))
    return pd.DataFrame(rows, columns=ALLREDUCE_COLUMNS)


def _probe_busbw(frame: pd.DataFrame, ar: pd.DataFrame) -> pd.Series:
    keys = ["sweep_id", "nodes", "procs_per_node", "bandwidth"]
    ok = ar[(ar["status"] == "ok") & ar["busbw_mb_s"].notna()]
    if frame.empty or ok.empty:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    largest = ok.loc[ok.groupby("run_id")["size_bytes"].idxmax()]
    largest = largest.astype({"nodes": float, "procs_per_node": float})
    per_layout = largest.groupby(keys, as_index=False)["busbw_mb_s"].mean()
    left = frame[keys].astype({"nodes": float, "procs_per_node": float})
    merged = left.merge(per_layout, on=keys, how="left")  # a left merge keeps the left order
    return pd.Series(merged["busbw_mb_s"].to_numpy(dtype=float), index=frame.index)


def frame_to_csv(frame: pd.DataFrame) -> str:
    """results.csv text: CSV_COLUMNS, native bandwidth and missing figures as empty cells."""
    buf = io.StringIO()
    frame.reindex(columns=CSV_COLUMNS).to_csv(buf, index=False, na_rep="", float_format="%.6g")
    return buf.getvalue()


def write_csv(sweep_dir: Path | str) -> Path:
    """Write reports/<sweep_id>/results.csv from runs.jsonl, whole or not at all."""
    sweep_dir = Path(sweep_dir)
    path = sweep_dir / CSV_FILE
    frame = to_frame(load_runs(sweep_dir), plan_min_nodes(load_sweep(sweep_dir)))
    write_atomic(path, frame_to_csv(frame), mode=0o644)
    log.info("wrote %s", path)
    return path
