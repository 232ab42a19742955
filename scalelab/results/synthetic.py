"""Synthetic sweeps: realistic but generated sweep stores for tests, benchmarks and the example.

Kept apart from scalelab.results.frames (which reads real stores) so that nothing that measures can
reach it by accident. A generated sweep.json says ``synthetic`` and its report says so in a
banner on top.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from scalelab.cluster.targets.interface import DEFAULT_TARGET
from scalelab.core.units import format_rate
from scalelab.model import analysis
from scalelab.results.store import RUNS_FILE, SWEEP_FILE
from scalelab.sweep.planner import allreduce_run_id, train_run_id


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
                    run_id = allreduce_run_id(n, ppn, bw)
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
                        run_id = train_run_id(n, ppn, batch, bw, rep)
                        planned.append(run_id)
                        train_ids.append(run_id)
                        link = (bw or 25000.0) * rng.uniform(0.93, 0.97)
                        compute = batch * compute_s_per_image + compute_overhead_s
                        comm = float(analysis.ring_allreduce_time_s(
                            ws, gradient_bytes, link if n > 1 else 200000.0, alpha))
                        ranks = []
                        draws = [(compute * rng.lognormal(0, 0.03)
                                  * (slow_nodes or {}).get(node_names[r // ppn], 1.0),
                                  comm * rng.lognormal(0, 0.03), rng.uniform(1.04, 1.12))
                                 for r in range(ws)]
                        gate = max(c for c, _, _ in draws)
                        for r, (c, m, p95) in enumerate(draws):
                            if slow_nodes:  # everyone waits for the slowest rank's gradients
                                m += gate - c
                            step = c + m
                            ranks.append({"rank": r, "host": node_names[r // ppn],
                                          "images_per_sec": round(batch / step, 4),
                                          "step_time_mean_s": round(step, 6),
                                          "step_time_p95_s": round(step * p95, 6),
                                          "compute_time_mean_s": round(c, 6),
                                          "comm_time_mean_s": round(m, 6),
                                          # generated without overlap: all of it exposed
                                          "comm_inflight_mean_s": round(m, 6)})
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
