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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scalelab import analysis
from scalelab.errors import ScalelabError
from scalelab.state import write_atomic
from scalelab.units import format_rate

log = logging.getLogger(__name__)

RUNS_FILE = "runs.jsonl"
SWEEP_FILE = "sweep.json"
CSV_FILE = "results.csv"

CSV_COLUMNS = [
    "sweep_id", "run_id", "target", "nodes", "procs_per_node", "world_size", "model", "engine",
    "precision", "batch_size", "bandwidth_mbit", "repeat", "status", "images_per_sec",
    "images_per_sec_per_worker", "step_time_mean_s", "step_time_p95_s", "comm_fraction",
    "busbw_mb_s", "link_mbit_measured", "scaling_efficiency", "started_at", "duration_s", "error", "link_error",
    "baseline_world_size",
]
# Kept in the frame (the report and analysis use them), not written to results.csv.
EXTRA_COLUMNS = ["data", "bandwidth", "steps", "image_size", "gradient_bytes",
                 "compute_time_mean_s", "comm_time_mean_s", "n_ranks"]

ALLREDUCE_COLUMNS = ["sweep_id", "run_id", "status", "nodes", "procs_per_node", "world_size",
                     "bandwidth_mbit", "bandwidth", "repeat", "size_bytes", "time_s",
                     "algbw_mb_s", "busbw_mb_s"]


class ReportError(ScalelabError):
    """A sweep's results cannot be found, read or reported."""


# ---------------------------------------------------------------------------- reading

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


def load_runs(sweep_dir: Path | str) -> list[dict[str, Any]]:
    """Raw records of a sweep, last record per run id, read by the store of record itself
    (a torn last line from a crash is skipped with a warning there); [] when no run has
    finished yet."""
    from scalelab import store

    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ReportError(f"sweep directory {sweep_dir} does not exist")
    return list(store.read_runs(sweep_dir).values())


# ---------------------------------------------------------------------------- frames

def _num(value: Any) -> float:
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _bandwidth_label(mbit: float) -> str:
    return format_rate(None if math.isnan(mbit) else mbit)


def _params(rec: dict[str, Any]) -> dict[str, Any]:
    p = rec.get("params")
    return p if isinstance(p, dict) else {}


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


def to_frame(records: Sequence[dict[str, Any]],
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
    scalelab.analysis.add_efficiency; baseline_world_size, the N0 it is measured against, is
    the plan's smallest node count (min_nodes: sweep id -> count, from plan_min_nodes) x procs
    per node.
    """
    runs: list[dict[str, Any]] = []
    rank_rows: list[tuple] = []
    for idx, rec in enumerate(r for r in records if r.get("kind", "train") == "train"):
        p = _params(rec)
        nodes = _num(p.get("nodes"))
        ppn = _num(p.get("procs_per_node"))
        ws = _num(p.get("world_size"))
        if math.isnan(ws) and not (math.isnan(nodes) or math.isnan(ppn)):
            ws = nodes * ppn
        bw = _num(p.get("bandwidth_mbit"))
        ranks = rec.get("ranks") if isinstance(rec.get("ranks"), list) else []
        # raw values here, converted column by column below: per-value float() is slow
        rank_rows.extend((idx, rk.get("images_per_sec"), rk.get("step_time_mean_s"),
                          rk.get("step_time_p95_s"), rk.get("compute_time_mean_s"),
                          rk.get("comm_time_mean_s")) for rk in ranks if isinstance(rk, dict))
        runs.append({
            "sweep_id": str(rec.get("sweep_id", "")), "run_id": str(rec.get("run_id", "")),
            "target": str(rec.get("target", "")), "nodes": nodes, "procs_per_node": ppn,
            "world_size": ws, "model": str(p.get("model", "")), "engine": str(p.get("engine", "")),
            "precision": str(p.get("precision", "")), "batch_size": _num(p.get("batch_size")),
            "bandwidth_mbit": bw, "repeat": _num(p.get("repeat")),
            "status": str(rec.get("status", "")),
            "link_mbit_measured": _num(rec.get("link_mbit_measured")),
            "link_error": str(rec.get("link_error") or ""),
            "started_at": str(rec.get("started_at") or ""), "duration_s": _num(rec.get("duration_s")),
            "error": str(rec.get("error") or ""), "data": str(p.get("data") or "synthetic"),
            "bandwidth": _bandwidth_label(bw), "steps": _num(p.get("steps")),
            "image_size": _num(p.get("image_size")),
            "gradient_bytes": _num(rec.get("gradient_bytes")),
        })
    frame = pd.DataFrame(runs, columns=[
        "sweep_id", "run_id", "target", "nodes", "procs_per_node", "world_size", "model", "engine",
        "precision", "batch_size", "bandwidth_mbit", "repeat", "status", "link_mbit_measured",
        "link_error", "started_at", "duration_s", "error", "data", "bandwidth", "steps", "image_size",
        "gradient_bytes"])
    ranks_df = pd.DataFrame(rank_rows, columns=["idx", "ips", "step", "p95", "compute", "comm"])
    for col in ("ips", "step", "p95", "compute", "comm"):
        if ranks_df[col].dtype.kind != "f":
            ranks_df[col] = pd.to_numeric(ranks_df[col].where(
                ranks_df[col].map(lambda v: not isinstance(v, bool))), errors="coerce")
    ranks_df["comm_frac"] = ranks_df["comm"] / ranks_df["step"]
    g = ranks_df.groupby("idx")
    per_run = pd.DataFrame({
        # min_count=1: a run whose ranks all lack the figure gives NaN, not 0 images/s
        "images_per_sec": g["ips"].sum(min_count=1),
        "images_per_sec_per_worker": g["ips"].mean(),
        "step_time_mean_s": g["step"].mean(),
        "step_time_p95_s": g["p95"].max(),
        "comm_fraction": g["comm_frac"].mean(),
        "compute_time_mean_s": g["compute"].mean(),
        "comm_time_mean_s": g["comm"].mean(),
        "n_ranks": g.size(),
    })
    frame = frame.join(per_run)
    frame["n_ranks"] = frame["n_ranks"].fillna(0).astype(int)
    for col in ("nodes", "procs_per_node", "world_size", "batch_size", "repeat"):
        frame[col] = frame[col].astype("Int64") if frame[col].isna().any() else frame[col].astype(int)
    frame["busbw_mb_s"] = _probe_busbw(frame, allreduce_frame(records))
    frame["baseline_world_size"] = analysis.baseline_world_size(frame, min_nodes)
    frame["scaling_efficiency"] = (analysis.add_efficiency(
        frame, base_ws=frame["baseline_world_size"]) if len(frame) else [])
    return frame[CSV_COLUMNS + EXTRA_COLUMNS]


def allreduce_frame(records: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per (allreduce probe run, message size)."""
    rows: list[tuple] = []
    for rec in records:
        if rec.get("kind") != "allreduce":
            continue
        p = _params(rec)
        nodes = _num(p.get("nodes"))
        ppn = _num(p.get("procs_per_node"))
        ws = _num(p.get("world_size"))
        if math.isnan(ws):
            ws = nodes * ppn
        bw = _num(p.get("bandwidth_mbit"))
        base = (str(rec.get("sweep_id", "")), str(rec.get("run_id", "")),
                str(rec.get("status", "")), nodes, ppn, ws, bw, _bandwidth_label(bw),
                _num(p.get("repeat")))
        for item in rec.get("allreduce") or []:
            if isinstance(item, dict):
                rows.append(base + (_num(item.get("size_bytes")), _num(item.get("time_s")),
                                    _num(item.get("algbw_mb_s")), _num(item.get("busbw_mb_s"))))
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


# ---------------------------------------------------------------------------- synthetic sweeps

def _rate_tag(mbit: float | None) -> str:
    """The rate part of the driver's run ids (bw1000, native)."""
    if mbit is None:
        return "native"
    return "bw" + (f"{int(mbit)}" if float(mbit).is_integer() else f"{mbit:g}".replace(".", "p"))


def synthetic_sweep(root: Path | str, sweep_id: str = "synthetic", *,
                    nodes: Sequence[int] = (1, 2, 3, 4), procs_per_node: Sequence[int] = (1,),
                    batch_sizes: Sequence[int] = (16, 32, 64),
                    bandwidths: Sequence[float | None] = (1000.0, 10000.0), repeats: int = 3,
                    model: str = "resnet18", gradient_bytes: int = 46_758_000,
                    target: str = "local", host_cpus: int = 16, cpus_per_node: float = 4.0,
                    compute_s_per_image: float = 0.004, compute_overhead_s: float = 0.02,
                    failed: Sequence[str] = (), missing: int = 0, allreduce: bool = True,
                    seed: int = 0, cluster: str = "demo") -> Path:
    """Write a synthetic but realistic sweep (sweep.json + runs.jsonl) under root/sweep_id.

    For tests, the report benchmark and the example report; sweep.json says ``synthetic``
    and the report shows it. Step time = compute (batch x compute_s_per_image + overhead) +
    ring allreduce over ~95 % of the requested link, with 3 % lognormal noise per rank.
    ``failed`` lists error texts, each given to one run (its status failed, no ranks);
    ``missing`` leaves that many planned runs without a record (an interrupted sweep).
    """
    rng = np.random.default_rng(seed)
    sweep_dir = Path(root) / sweep_id
    sweep_dir.mkdir(parents=True, exist_ok=True)
    start = datetime(2026, 11, 20, 9, 0, 0, tzinfo=UTC)
    clock = start
    alpha = 60e-6
    node_names = [f"{cluster}-n{i}" for i in range(max(nodes))]
    lines: list[str] = []
    planned: list[str] = []
    fails = list(failed)

    def stamp(t: datetime) -> str:
        return t.strftime("%Y-%m-%dT%H:%M:%SZ")

    env = {"python": "3.11.7", "torch": "2.13.0+cpu", "kernel": "6.1.0-27-amd64",
           "cpu_model": "Intel(R) Xeon(R) Platinum 8375C", "hostname": "lab-host"}
    if allreduce:
        for bw in bandwidths:
            for n in nodes:
                for ppn in procs_per_node:
                    ws = n * ppn
                    if ws < 2:
                        continue
                    link = (bw or 25000.0) * rng.uniform(0.93, 0.97)
                    sizes = [1 << k for k in range(10, 27, 2)]
                    items = []
                    for size in sizes:
                        t = float(analysis.ring_allreduce_time_s(
                            ws, size, link if n > 1 else 200000.0, alpha))
                        t *= rng.lognormal(0, 0.03)
                        algbw = size / t / 1e6
                        items.append({"size_bytes": size, "time_s": round(t, 9),
                                      "algbw_mb_s": round(algbw, 3),
                                      "busbw_mb_s": round(algbw * 2 * (ws - 1) / ws, 3)})
                    run_id = f"allreduce-n{n:02d}-p{ppn}-{_rate_tag(bw)}"
                    planned.append(run_id)
                    lines.append(json.dumps({
                        "sweep_id": sweep_id, "run_id": run_id, "kind": "allreduce",
                        "status": "ok", "params": {
                            "nodes": n, "procs_per_node": ppn, "world_size": ws, "model": model,
                            "engine": "ddp", "precision": "fp32", "batch_size": None,
                            "bandwidth_mbit": bw, "repeat": 0, "steps": 20, "warmup": 5,
                            "image_size": None, "data": None},
                        "target": target, "node_names": node_names[:n], "ranks": [],
                        "allreduce": items, "gradient_bytes": gradient_bytes,
                        "link_mbit_measured": round(link, 1) if bw and n > 1 else None,
                        "env": env, "started_at": stamp(clock), "duration_s": 4.0, "error": ""}))
                    clock += timedelta(seconds=6)
    train_ids = []
    for bw in bandwidths:
        for n in nodes:
            for ppn in procs_per_node:
                for batch in batch_sizes:
                    for rep in range(repeats):
                        ws = n * ppn
                        run_id = f"train-n{n:02d}-p{ppn}-b{batch:03d}-{_rate_tag(bw)}-r{rep}"
                        planned.append(run_id)
                        train_ids.append(run_id)
                        link = (bw or 25000.0) * rng.uniform(0.93, 0.97)
                        compute = batch * compute_s_per_image + compute_overhead_s
                        comm = float(analysis.ring_allreduce_time_s(
                            ws, gradient_bytes, link if n > 1 else 200000.0, alpha))
                        ranks = []
                        for r in range(ws):
                            c = compute * rng.lognormal(0, 0.03)
                            m = comm * rng.lognormal(0, 0.03)
                            step = c + m
                            ranks.append({"rank": r, "host": node_names[r // ppn],
                                          "images_per_sec": round(batch / step, 4),
                                          "step_time_mean_s": round(step, 6),
                                          "step_time_p95_s": round(step * rng.uniform(1.04, 1.12), 6),
                                          "compute_time_mean_s": round(c, 6),
                                          "comm_time_mean_s": round(m, 6)})
                        steps = 30
                        duration = 12.0 + steps * float(np.mean([x["step_time_mean_s"]
                                                                for x in ranks]))
                        rec = {"sweep_id": sweep_id, "run_id": run_id, "kind": "train",
                               "status": "ok", "params": {
                                   "nodes": n, "procs_per_node": ppn, "world_size": ws,
                                   "model": model, "engine": "ddp", "precision": "fp32",
                                   "batch_size": batch, "bandwidth_mbit": bw, "repeat": rep,
                                   "steps": steps, "warmup": 5, "image_size": 64,
                                   "data": "synthetic"},
                               "target": target, "node_names": node_names[:n], "ranks": ranks,
                               "gradient_bytes": gradient_bytes,
                               "link_mbit_measured": round(link, 1) if bw and n > 1 else None,
                               "env": env, "started_at": stamp(clock),
                               "duration_s": round(duration, 2), "error": ""}
                        clock += timedelta(seconds=duration + 3)
                        lines.append(json.dumps(rec))
    # failures land on the largest runs, where they happen in practice
    for i, text in enumerate(fails):
        victim = train_ids[-1 - 2 * i]
        for j, line in enumerate(lines):
            rec = json.loads(line)
            if rec["run_id"] == victim:
                rec.update(status="failed", ranks=[], error=text, duration_s=31.5)
                lines[j] = json.dumps(rec)
    if missing:
        drop = set(train_ids[-missing:]) if not fails else set(train_ids[-missing - 1:-1])
        lines = [ln for ln in lines if json.loads(ln)["run_id"] not in drop]
    (sweep_dir / RUNS_FILE).write_text("\n".join(lines) + "\n")
    nodes_doc = [{"name": name, "address": f"10.213.0.{i + 2}",
                  "private_address": f"10.213.0.{i + 2}", "role": "head" if i == 0 else "worker",
                  "target": target, "ssh_user": "root", "ssh_port": 22, "ssh_key": "",
                  "cpus": cpus_per_node, "gpus": 0, "iface": "eth0", "extra": {}}
                 for i, name in enumerate(node_names)]
    sweep = {
        "sweep_id": sweep_id, "cluster": cluster, "target": target, "synthetic": True,
        "created_at": stamp(start), "finished_at": None if missing else stamp(clock),
        "host_cpus": host_cpus,
        "plan": {"nodes": list(nodes), "procs_per_node": list(procs_per_node),
                 "batch_size": list(batch_sizes),
                 "bandwidth": [format_rate(b) for b in bandwidths], "repeats": repeats,
                 "model": [model], "engine": ["ddp"], "precision": ["fp32"], "steps": 30,
                 "warmup": 5, "image_size": 64, "data": "synthetic", "allreduce_probe": allreduce},
        "nodes": nodes_doc,
        "software": {"scalelab": "0.1.0", "python": "3.11.7", "torch": "2.13.0+cpu",
                     "backend": "gloo", "kernel": "6.1.0-27-amd64", "host_cpus": host_cpus},
        "planned_runs": planned,
    }
    (sweep_dir / SWEEP_FILE).write_text(json.dumps(sweep, indent=2) + "\n")
    return sweep_dir
