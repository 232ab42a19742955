"""A sweep read for the report: finding it, loading and checking its store, analysing it."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from scalelab.core.errors import ReportError
from scalelab.core.state import reports_dir
from scalelab.model import analysis, bucket_model, datapath, fabric, stragglers, verdict
from scalelab.results import frames, store

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- finding sweeps

def known_sweeps(root: Path | None = None) -> list[str]:
    """Ids of the sweeps under the reports root, oldest first."""
    return store.list_sweeps(Path(root) if root else reports_dir())


def resolve_sweep(ref: str | Path, root: Path | None = None) -> Path:
    """A sweep directory from an id, a unique prefix of one, ``latest`` (the reports/latest
    symlink) or a path to a sweep directory: scalelab.results.store.resolve_sweep, never a second
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
    runs: pd.DataFrame  # scalelab.results.frames.to_frame
    allreduce: pd.DataFrame  # scalelab.results.frames.allreduce_frame
    probes: pd.DataFrame  # one row per allreduce probe: run_id, status, error, duration_s
    env_fingerprints: int  # distinct environment fingerprints over all records
    missing: list[str] = field(default_factory=list)  # planned run ids without a record
    # one row per rank of every train run: scalelab.results.frames.rank_frame
    ranks: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=frames.RANK_COLUMNS))

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
    meta = frames.load_sweep(path)
    records = frames.load_runs(path)
    sweep_id = str(meta.get("sweep_id") or path.name)
    if not records:
        raise ReportError(f"sweep {sweep_id!r} has no runs recorded yet ({path / store.RUNS_FILE}"
                          " is empty or missing); run or resume it with invoke bench")
    runs = frames.to_frame(records, frames.plan_min_nodes({"sweep_id": sweep_id, **meta}))
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
    recorded = {r.run_id for r in records}
    missing = [str(r) for r in meta.get("planned_runs") or [] if str(r) not in recorded]
    if missing:
        log.warning("sweep %s: %d of %d planned runs have no record", sweep_id, len(missing),
                    len(meta.get("planned_runs") or []))
    probes = pd.DataFrame(
        [{"sweep_id": sweep_id, "run_id": r.run_id, "status": r.status, "error": r.error,
          "duration_s": 0.0 if math.isnan(r.duration_s) else r.duration_s,
          "slurm_job_id": str(r.slurm.get("job_id") or "")}
         for r in records if r.kind == "allreduce"],
        columns=["sweep_id", "run_id", "status", "error", "duration_s", "slurm_job_id"])
    envs = len({software_fingerprint(r.env) for r in records})
    # The raw records are not kept: a million live dicts make every garbage collection
    # during figure drawing slow.
    return SweepData(path, sweep_id, meta, runs, frames.allreduce_frame(records), probes,
                     envs, missing, frames.rank_frame(records))


# ---------------------------------------------------------------------------- analysis bundle

@dataclass
class Analysis:
    sweeps: list[SweepData]
    runs: pd.DataFrame
    allreduce: pd.DataFrame
    modelled: pd.DataFrame  # one row per point: bucket_model.add_prediction + verdict.add_verdicts
    bottlenecks: list[verdict.Bottleneck]
    alpha_s: float
    alpha_source: str
    overlap: bool
    error: verdict.ModelError
    stragglers: stragglers.Stragglers  # each run's slow ranks, and each sweep's noise
    # the Failures table's rate: each node fails once every this many hours (None: Llama 3's)
    node_mtbf_h: float | None = None


def analyse(sweeps: list[SweepData], alpha_s: float | None, overlap: bool) -> Analysis:
    runs = pd.concat([s.runs for s in sweeps], ignore_index=True)
    ar = pd.concat([s.allreduce for s in sweeps], ignore_index=True)
    if alpha_s is None:
        fitted = analysis.fit_alpha_s(ar)
        alpha, source = ((fitted, "fitted to the allreduce probes' smallest messages")
                         if fitted is not None else
                         (analysis.DEFAULT_ALPHA_S, "default constant (no allreduce probes)"))
    else:
        alpha, source = alpha_s, "given"
    profiles = set(runs["fabric_profile"]) if "fabric_profile" in runs and len(runs) else set()
    if (alpha_s is None and len(profiles) == 1
            and (fab := fabric.maybe(next(iter(profiles)))) is not None):
        # every run's links stood for one profiled fabric: the model takes its latency
        alpha, source = fab.per_hop_latency_s, f"the {fab.name} fabric profile's"
    ring = analysis.add_model(analysis.summarize(runs), alpha, overlap,
                              profile_alpha=alpha_s is None)
    # one prediction per point: the overlap model where a profile exists, else the ring model
    modelled = bucket_model.add_prediction(ring, alpha)
    # each rank's compute against its peers': the slow ranks, and each point's wait for them
    slow = stragglers.find(pd.concat([s.ranks for s in sweeps], ignore_index=True), runs)
    modelled = stragglers.add_to_points(modelled, slow)
    # real data: the storage's and the loaders' ceilings on what training is fed
    modelled = datapath.add_input_ceiling(modelled)
    limits = {s.sweep_id: analysis.host_limits(s.meta) for s in sweeps}
    judged, error, bottlenecks = verdict.judge(modelled, limits)
    return Analysis(sweeps, runs, ar, judged, bottlenecks, alpha, source, overlap, error, slow)
