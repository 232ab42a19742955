"""Synthetic sweeps: realistic but generated sweep stores for tests, benchmarks and the example.

Kept apart from scalelab.results.frames (which reads real stores) so that nothing that measures can
reach it by accident. A generated sweep.json says ``synthetic`` and its report says so in a
banner on top.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.cluster.targets.interface import DEFAULT_TARGET
from scalelab.core.units import format_rate
from scalelab.model import analysis
from scalelab.results.store import RUNS_FILE, SWEEP_FILE
from scalelab.sweep.planner import allreduce_run_id, train_run_id

ALPHA_S = 60e-6  # the generated links' per-hop latency
ENV = {"python": "3.11.7", "torch": "2.13.0+cpu", "kernel": "6.1.0-27-amd64",
       "cpu_model": "Intel(R) Xeon(R) Platinum 8375C", "hostname": "lab-host"}


def synthetic_sweep(root: Path | str, sweep_id: str = "synthetic", *,
                    nodes: Sequence[int] = (1, 2, 3, 4), procs_per_node: Sequence[int] = (1,),
                    batch_sizes: Sequence[int] = (16, 32, 64),
                    bandwidths: Sequence[float | None] = (1000.0, 10000.0), repeats: int = 3,
                    model: str = "resnet18", gradient_bytes: int = 46_758_000,
                    target: str = DEFAULT_TARGET, host_cpus: int = 16, cpus_per_node: float = 4.0,
                    compute_s_per_image: float = 0.004, compute_overhead_s: float = 0.02,
                    failed: Sequence[str] = (), missing: int = 0, allreduce: bool = True,
                    seed: int = 0, cluster: str = "demo",
                    slow_nodes: dict[str, float] | None = None) -> Path:
    """Write a synthetic but realistic sweep (sweep.json + runs.jsonl) under root/sweep_id.

    For tests, the report benchmark and the example report; sweep.json says ``synthetic``
    and the report shows it. Step time = compute (batch x compute_s_per_image + overhead) +
    ring allreduce over ~95 % of the requested link, with 3 % lognormal noise per rank.
    ``failed`` lists error texts, each given to one run (its status failed, no ranks);
    ``missing`` leaves that many planned runs without a record (an interrupted sweep).
    ``slow_nodes`` maps node names (``<cluster>-n<i>``) to a compute factor, e.g.
    {"demo-n2": 1.3}: that node's ranks compute 30 % longer per step, and since every step is
    synchronous every rank's step then waits for the slowest, the others' wait counted in their
    exposed communication (without it, ranks are independent as before).
    """
    rng = np.random.default_rng(seed)
    sweep_dir = Path(root) / sweep_id
    sweep_dir.mkdir(parents=True, exist_ok=True)
    start = datetime(2026, 11, 20, 9, 0, 0, tzinfo=UTC)
    clock = start
    node_names = [f"{cluster}-n{i}" for i in range(max(nodes))]
    lines: list[str] = []
    planned: list[str] = []

    def record(run_id: str, kind: str, params: dict[str, Any], n: int, ranks: list, link: float,
               bw: float | None, duration: float, **allreduce: Any) -> str:
        planned.append(run_id)
        return json.dumps({
            "sweep_id": sweep_id, "run_id": run_id, "kind": kind, "status": "ok",
            "params": {"nodes": n, "procs_per_node": params.pop("ppn"),
                       "world_size": params.pop("ws"), "model": model, "engine": "ddp",
                       "precision": "fp32", **params},
            "target": target, "node_names": node_names[:n], "ranks": ranks, **allreduce,
            "gradient_bytes": gradient_bytes,
            "link_mbit_measured": round(link, 1) if bw and n > 1 else None,
            "env": ENV, "started_at": _stamp(clock), "duration_s": duration, "error": ""})

    if allreduce:
        for bw, n, ppn in itertools.product(bandwidths, nodes, procs_per_node):
            if n * ppn < 2:
                continue
            link, items = _allreduce_items(rng, n, n * ppn, bw)
            lines.append(record(allreduce_run_id(n, ppn, bw), "allreduce", {
                "ppn": ppn, "ws": n * ppn, "batch_size": None, "bandwidth_mbit": bw, "repeat": 0,
                "steps": 20, "warmup": 5, "image_size": None, "data": None}, n, [], link, bw, 4.0,
                allreduce=items))
            clock += timedelta(seconds=6)
    train_ids = []
    steps = 30
    for bw, n, ppn, batch, rep in itertools.product(bandwidths, nodes, procs_per_node,
                                                    batch_sizes, range(repeats)):
        run_id = train_run_id(n, ppn, batch, bw, rep)
        train_ids.append(run_id)
        link = (bw or 25000.0) * rng.uniform(0.93, 0.97)
        ranks = _train_ranks(rng, n, ppn, batch * compute_s_per_image + compute_overhead_s,
                             float(analysis.ring_allreduce_time_s(
                                 n * ppn, gradient_bytes, link if n > 1 else 200000.0, ALPHA_S)),
                             batch, node_names, slow_nodes)
        duration = 12.0 + steps * float(np.mean([x["step_time_mean_s"] for x in ranks]))
        lines.append(record(run_id, "train", {
            "ppn": ppn, "ws": n * ppn, "batch_size": batch, "bandwidth_mbit": bw, "repeat": rep,
            "steps": steps, "warmup": 5, "image_size": 64, "data": "synthetic"}, n, ranks, link,
            bw, round(duration, 2)))
        clock += timedelta(seconds=duration + 3)
    lines = _failed_and_missing(lines, train_ids, list(failed), missing)
    (sweep_dir / RUNS_FILE).write_text("\n".join(lines) + "\n")
    sweep = {
        "sweep_id": sweep_id, "cluster": cluster, "target": target, "synthetic": True,
        "created_at": _stamp(start), "finished_at": None if missing else _stamp(clock),
        "host_cpus": host_cpus,
        "plan": {"nodes": list(nodes), "procs_per_node": list(procs_per_node),
                 "batch_size": list(batch_sizes),
                 "bandwidth": [format_rate(b) for b in bandwidths], "repeats": repeats,
                 "model": [model], "engine": ["ddp"], "precision": ["fp32"], "steps": steps,
                 "warmup": 5, "image_size": 64, "data": "synthetic", "allreduce_probe": allreduce},
        "nodes": _nodes_doc(node_names, target, cpus_per_node),
        "software": {"scalelab": "0.1.0", "python": "3.11.7", "torch": "2.13.0+cpu",
                     "backend": "gloo", "kernel": "6.1.0-27-amd64", "host_cpus": host_cpus},
        "planned_runs": planned,
    }
    (sweep_dir / SWEEP_FILE).write_text(json.dumps(sweep, indent=2) + "\n")
    return sweep_dir


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _allreduce_items(rng: np.random.Generator, n: int, ws: int,
                     bw: float | None) -> tuple[float, list[dict[str, Any]]]:
    """A probe's measured link and its sizes: ring allreduce at ~95 % of the link, 3 % noise."""
    link = (bw or 25000.0) * rng.uniform(0.93, 0.97)
    items = []
    for size in [1 << k for k in range(10, 27, 2)]:
        t = float(analysis.ring_allreduce_time_s(ws, size, link if n > 1 else 200000.0, ALPHA_S))
        t *= rng.lognormal(0, 0.03)
        algbw = size / t / 1e6
        items.append({"size_bytes": size, "time_s": round(t, 9), "algbw_mb_s": round(algbw, 3),
                      "busbw_mb_s": round(algbw * 2 * (ws - 1) / ws, 3)})
    return link, items


def _train_ranks(rng: np.random.Generator, n: int, ppn: int, compute: float, comm: float,
                 batch: int, node_names: list[str],
                 slow_nodes: dict[str, float] | None) -> list[dict[str, Any]]:
    """Each rank's figures: compute and communication with 3 % noise; where a node is slow,
    everyone waits for the slowest rank's gradients."""
    draws = [(compute * rng.lognormal(0, 0.03) * (slow_nodes or {}).get(node_names[r // ppn], 1.0),
              comm * rng.lognormal(0, 0.03), rng.uniform(1.04, 1.12)) for r in range(n * ppn)]
    gate = max(c for c, _, _ in draws)
    ranks = []
    for r, (c, m, p95) in enumerate(draws):
        if slow_nodes:
            m += gate - c
        step = c + m
        ranks.append({"rank": r, "host": node_names[r // ppn],
                      "images_per_sec": round(batch / step, 4),
                      "step_time_mean_s": round(step, 6), "step_time_p95_s": round(step * p95, 6),
                      "compute_time_mean_s": round(c, 6), "comm_time_mean_s": round(m, 6),
                      # generated without overlap: all of it exposed
                      "comm_inflight_mean_s": round(m, 6)})
    return ranks


def _failed_and_missing(lines: list[str], train_ids: list[str], fails: list[str],
                        missing: int) -> list[str]:
    """Failures land on the largest runs, where they happen in practice; the missing runs are
    the last ones (an interrupted sweep)."""
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
    return lines


def _nodes_doc(node_names: list[str], target: str, cpus: float) -> list[dict[str, Any]]:
    return [{"name": name, "address": f"10.213.0.{i + 2}", "private_address": f"10.213.0.{i + 2}",
             "role": "head" if i == 0 else "worker", "target": target, "ssh_user": "root",
             "ssh_port": 22, "ssh_key": "", "cpus": cpus, "gpus": 0, "iface": "eth0", "extra": {}}
            for i, name in enumerate(node_names)]
