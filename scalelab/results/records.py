"""A run's record as readers see it: typed, of any store version.

The store keeps each record as the JSON its writer made (scalelab.results.store); readers (the
frames, the report, resume's counts) get a RunRecord made by RunRecord.of: its params upgraded
to this version's RunParams (scalelab.sweep.settings), and each measured part in its own type,
empty where a record lacks it or holds something else there (a hand-edited or damaged store is
reported as far as it can be, never crashed on).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scalelab.sweep.settings import RunParams


def text(value: Any) -> str:
    """A text field: "" where there is none."""
    return "" if value is None else str(value)


def number(value: Any) -> float:
    """A figure: a float, NaN where there is none (or it is no number)."""
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _part(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _items(value: Any) -> tuple[dict[str, Any], ...]:
    return tuple(v for v in value if isinstance(v, dict)) if isinstance(value, list) else ()


@dataclass(frozen=True)
class RunRecord:
    """One run's record (docs/dev/CONTRACTS.md), typed."""

    sweep_id: str
    run_id: str
    kind: str  # train | allreduce
    status: str
    params: Any  # RunParams
    target: str
    node_names: tuple[str, ...]
    ranks: tuple[dict[str, Any], ...]  # each rank's figures, as the rank reported them
    allreduce: tuple[dict[str, Any], ...]  # a probe's sizes and times
    gradient_bytes: float
    link_mbit_measured: float
    link_mbit_single_stream: float
    link_error: str
    started_at: str
    duration_s: float
    error: str
    env: dict[str, Any]
    timeline: dict[str, Any]
    accelerator: dict[str, Any]
    slurm: dict[str, Any]
    placement: dict[str, Any]
    comm: dict[str, Any]
    storage: dict[str, Any]  # a real-data run: what its source gave (scalelab.run.storageprobe)
    ps: dict[str, Any]  # an --engine ps run: its servers' figures, overlap, colocated
    # a run with --checkpoint-every: every checkpoint's figures, where they went, kept or not
    checkpoint: dict[str, Any]
    # a run with --inject-failure: what was killed, when, and how the run came back
    failure: dict[str, Any]

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> RunRecord:
        """A stored record (a JSON object of any store version) as this version reads it.

        >>> r = RunRecord.of({"run_id": "x", "params": {"nodes": 2, "engine": "ddp",
        ...                   "batch_size": 32}, "ranks": [{"rank": 0}, "junk"]})
        >>> r.kind, r.params.bucket_cap_mb, r.params.fabric_profile, len(r.ranks)
        ('train', 25.0, 'ideal', 1)
        """
        params = raw.get("params")
        return cls(
            sweep_id=text(raw.get("sweep_id")), run_id=text(raw.get("run_id")),
            kind=text(raw.get("kind") or "train"), status=text(raw.get("status")),
            params=RunParams.of(params if isinstance(params, dict) else {}),
            target=text(raw.get("target")),
            node_names=tuple(n for n in raw.get("node_names") or [] if isinstance(n, str))
            if isinstance(raw.get("node_names"), list) else (),
            ranks=_items(raw.get("ranks")), allreduce=_items(raw.get("allreduce")),
            gradient_bytes=number(raw.get("gradient_bytes")),
            link_mbit_measured=number(raw.get("link_mbit_measured")),
            link_mbit_single_stream=number(raw.get("link_mbit_single_stream")),
            link_error=text(raw.get("link_error")), started_at=text(raw.get("started_at")),
            duration_s=number(raw.get("duration_s")), error=text(raw.get("error")),
            env=_part(raw.get("env")), timeline=_part(raw.get("timeline")),
            accelerator=_part(raw.get("accelerator")), slurm=_part(raw.get("slurm")),
            placement=_part(raw.get("placement")), comm=_part(raw.get("comm")),
            storage=_part(raw.get("storage")), ps=_part(raw.get("ps")),
            checkpoint=_part(raw.get("checkpoint")), failure=_part(raw.get("failure")))


def typed(records: Any) -> list[RunRecord]:
    """Records as RunRecords, those given as stored JSON objects converted."""
    return [r if isinstance(r, RunRecord) else RunRecord.of(r) for r in records]
