"""What a training run reports: each rank's record, and rank 0's result (resnet.py's gather).

The fields are the run record's "ranks" and the result's own keys (scalelab.results.records
reads them); resnet.py's phases (Rank, Data, Trainee, Engine, Timed) are what they come from.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import ckpt
import common
import emulate


def rank_record(a: argparse.Namespace, me: Any, eng: Any, timed: Any) -> dict[str, Any]:
    """What this rank measured and ran on."""
    import torch

    steps_rec, window, device, model = timed.steps, timed.window, me.device, eng.model
    step_times = [s["step_s"] for s in steps_rec]
    return {
        "rank": me.rank,
        "local_rank": me.local_rank,
        "host": me.host,
        "pid": os.getpid(),
        # emulated: the device's time is the steps' (host bookkeeping between steps is not the
        # device's, and would not be dilated like the steps); otherwise the timed window's
        # (the time checkpoints blocked training is in neither: it is recorded on its own)
        "images_per_sec": a.batch_size * len(step_times) / (
            sum(step_times) if a.emulated else (timed.t_last - timed.t_first - timed.blocked_s)),
        "step_time_mean_s": common.mean(step_times),
        "step_time_p95_s": common.percentile(step_times, 95),
        "compute_time_mean_s": common.mean([s["step_s"] - s["data_s"] - s["comm_s"] for s in steps_rec]),
        "comm_time_mean_s": common.mean([s["comm_s"] for s in steps_rec]),
        "comm_inflight_mean_s": common.mean([s["inflight_s"] for s in steps_rec]),
        "data_time_mean_s": common.mean([s["data_s"] for s in steps_rec]),
        # what its loader read from storage for the timed steps (real data), and at what rate:
        # what it read in the timed window, in the (emulated) device's time
        "data_bytes": timed.data_bytes,
        "data_read_mb_s": None if timed.read is None
        else timed.read[0] / 1e6 / max(timed.read[1], 1e-9) * a.dilation,
        "step_times_s": step_times,
        "final_loss": steps_rec[-1]["loss"],
        # the fidelity guard's figures over the timed steps (wall time, not dilated)
        "host_cpu_idle": window["host_cpu_idle"],
        "nic_tx_bytes": window["tx_bytes"],
        "nic_rx_bytes": window["rx_bytes"],
        "timed_wall_s": window["seconds"],
        "device": str(device),
        "device_name": me.device_name,
        # as the weights are laid out (an emulated rank has none: as asked)
        "memory_format": ("channels_last" if a.channels_last else "contiguous") if a.emulated
        else common.memory_layout(model),
        "gpu_mem_peak_mb": round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        if device.type == "cuda"
        else None,
        "env": common.env_fingerprint([me.host]),
        "checkpoint": eng.ckpt.as_record() if eng.ckpt is not None else None,
        # after a restart: how this attempt began (ckpt.resume, and when, in unix seconds)
        "attempt": eng.attempt,
    }


def result(a: argparse.Namespace, me: Any, data: Any, t: Any, eng: Any,
           ranks: list[dict[str, Any]], env: dict[str, Any],
           timeline: dict[str, float]) -> dict[str, Any]:
    """The SCALELAB_RESULT payload: the run's settings, every rank's record and the environment."""
    hvd, real = me.hvd, data.real
    return {
        "world_size": me.world,
        "model": a.model,
        "engine": a.engine,
        "precision": a.precision,
        "batch_size": a.batch_size,
        "image_size": a.image_size,
        "steps": a.steps,
        "warmup": a.warmup,
        "gradient_bytes": eng.grad_bytes,
        "images_per_sec": sum(r["images_per_sec"] for r in ranks),
        "ranks": ranks,
        "env": env,
        "num_classes": data.num_classes,
        "num_params": t.num_params,
        "data": a.data,
        "data_layout": data.layout,
        # bytes read from storage for the timed steps, all ranks, and per image trained on
        "data_bytes": None if real is None else sum(r["data_bytes"] for r in ranks),
        "data_bytes_per_image": None if real is None else sum(r["data_bytes"] for r in ranks)
        / (a.batch_size * len(ranks[0]["step_times_s"]) * me.world),
        "workers": a.workers if real is not None else 0,
        "loader_workers": a.workers if real is not None else None,
        "pin_memory": data.pin_memory if real is not None else None,
        "channels_last": a.channels_last,
        # what every rank's weights held: one format, or "mixed"
        "memory_format": (ranks[0]["memory_format"] if len(
            {r["memory_format"] for r in ranks}) == 1 else "mixed"),
        "device": me.device.type,
        "tf32": me.tf32,
        "backend": me.backend,
        "comm_dtype": eng.comm_dtype_name,
        # the communication settings this run used (the record's "comm")
        "comm": {
            "bucket_cap_mb": a.bucket_cap_mb if hvd is None else None,
            **(me.hvd_settings if hvd is not None
               else {"fusion_threshold_mb": None, "cycle_time_ms": None}),
            "compression": a.compression,
            "comm_dtype": eng.comm_dtype_name,
        },
        "timing_method": eng.timing_method,
        "timeline": {**timeline, "done": time.time()},
        "dilation": a.dilation,
        "checkpoint": ckpt.summary(a, ranks),
        "recovery": recovery(ranks),
        "accelerator": None
        if not a.emulated
        else {
            "device": a.emulated["device"],
            "source": a.emulated["source"],
            "provenance": a.emulated["provenance"],
            "precision": a.emulated["precision"],  # a tf32/bf16 run uses an fp32/amp profile
            **{f"profile_{k}": v for k, v in emulate.totals(a.emulated).items()},
        },
    }


def recovery(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How the last attempt of a restarted run came back (None: it was never restarted): its
    restart count and the step it went on from, the slowest load, and when the first rank's
    process started, every rank had joined the group, and every rank was ready to train.

    >>> r = lambda p, j, ld: {"attempt": {"restart": 1, "from_step": 10, "load_s": ld,
    ...                                   "process_at": p, "rendezvous_at": j, "ready_at": j + 1}}
    >>> recovery([r(100.0, 104.0, 0.5), r(101.0, 103.0, 0.7)])["all_joined_at"]
    104.0
    >>> recovery([{"attempt": None}]) is None
    True
    """
    tries = [r["attempt"] for r in ranks if r.get("attempt")]
    if not tries:
        return None
    return {"restart": max(t["restart"] for t in tries),
            "from_step": min(t["from_step"] for t in tries),
            "load_s": max(t["load_s"] for t in tries),
            "first_process_at": min(t["process_at"] for t in tries),
            "all_joined_at": max(t["rendezvous_at"] for t in tries),
            "all_ready_at": max(t["ready_at"] for t in tries)}
