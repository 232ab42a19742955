"""Rough wall-time estimates of planned runs (for --dry-run and the progress ETA).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

from scalelab.model import accel
from scalelab.model.networks import MODELS, gradient_bytes
from scalelab.sweep.planner import RunPlan
from scalelab.sweep.starts import run_starts_directly

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------ estimates

CPU_GFLOPS = 30.0  # one core running PyTorch convs, measured: resnet20 b32 ~0.13 s/step
GPU_GFLOPS = 12_000.0  # a V100/A100-class GPU on ResNet-50 training, fp32 order of magnitude
STARTUP_S = 10.0  # launch over SSH, import torch, rendezvous, build the model
# on the local target a DDP rank (one per node) is forked from a warm-start server with torch
# imported: SSH, rendezvous, model and reap only (bench/perf/sweep_overhead.py: 1.5-1.8 s
# beyond the steps, a bit more with the driver's share), and the servers start once a sweep
WARM_STARTUP_S = 3.0
WARM_SERVERS_S = 12.0
RESHAPE_S = 5.0  # set a rate on every link, plus the netprobe
NATIVE_MBIT = 10_000.0  # what an unshaped link is assumed to carry
# what a small host moves over its nodes' veth links at once, before a sweep calibrates it
# (a 2-core host: 20-25 Gbit/s), for dilation auto
HOST_MBIT_GUESS = 20_000.0
# and what one pass over memory costs it, its cores, and a local node's CPU share (the
# sweep calibrates the first and reads the others; these are this machine's)
PASS_S_PER_BYTE_GUESS = 1e-10
HOST_CPUS_GUESS = os.cpu_count() or 2
NODE_CPUS_GUESS = 1


def default_step_s(model: str, device: str = "cpu") -> float:
    """Seconds of one training step (forward + backward = 3x forward) at batch 32, one process.

    >>> round(default_step_s("resnet20"), 2), round(default_step_s("resnet50", "gpu"), 3)
    (0.13, 0.033)
    """
    gflops = GPU_GFLOPS if device == "gpu" else CPU_GFLOPS
    return 3 * MODELS[model].gflops_fwd * 32 / gflops


def _ring_s(nbytes: float, world: int, mbit: float | None) -> float:
    """Ring allreduce over the link (the report's model, without its per-hop latency)."""
    from scalelab.model import analysis  # numpy and pandas: when a plan is estimated, not on
    # every start of invoke bench (a refusal needs neither)

    return analysis.ring_allreduce_time_s(world, nbytes, mbit or NATIVE_MBIT, alpha_s=0.0)


def estimate_run_s(run: RunPlan, per_step_s: Mapping[str, float] | None = None,
                   startup_s: float = STARTUP_S, device: str = "cpu",
                   shared_host: bool = False) -> float:
    """Rough wall time of one run: startup + (warmup + steps) * (compute + allreduce).

    Compute and communication are added, not overlapped, so the estimate errs long.
    per_step_s maps model -> seconds per step of one process at batch 32 and the model's
    image size (e.g. measured in an earlier sweep); models it lacks get default_step_s(device).
    shared_host: the nodes share one host (the local target), where dilation auto picks k > 1.
    """
    p = run.params
    world, mbit = p["world_size"], p["bandwidth_mbit"]
    iters = p["steps"] + p["warmup"]
    if run.kind == "allreduce":
        return startup_s + sum(iters * (_ring_s(size, world, mbit) + 0.001)
                               for size in run.allreduce_sizes)
    model = p["model"]
    if p.get("accelerator"):
        # the device's step from its profile; dilation k stretches all of it (with auto, k is
        # known once the sweep has calibrated the host: guessed from HOST_MBIT_GUESS here)

        doc = accel.resolve(p["accelerator"], model, p["precision"], p["batch_size"],
                            p["image_size"])
        bwd = max(sum(layer["bwd_s"] for layer in doc["layers"]), 1e-6)
        k = float(p.get("dilation") or (accel.emulation_dilation(
            world, p["nodes"], mbit, HOST_MBIT_GUESS, gradient_bytes(model), bwd,
            p["precision"], PASS_S_PER_BYTE_GUESS, HOST_CPUS_GUESS, NODE_CPUS_GUESS,
            p.get("intra_mbit")) if shared_host else 1))
        return startup_s + iters * k * (accel.step_s(doc) + _ring_s(gradient_bytes(model), world, mbit))
    base = (per_step_s or {}).get(model) or default_step_s(model, device)
    scale = (p["image_size"] / MODELS[model].image_size) ** 2
    compute = base * p["batch_size"] / 32 * scale
    return startup_s + iters * (compute + _ring_s(gradient_bytes(model), world, mbit))


def estimate_duration_s(runs: Sequence[RunPlan], per_step_s: Mapping[str, float] | None = None,
                        startup_s: float = STARTUP_S, device: str = "cpu",
                        shared_host: bool = False, warm: bool = False) -> float:
    """Rough wall time of a plan (for --dry-run), link reconfigurations included.

    device is "gpu" on a cluster with GPUs (it picks the default per-step times).
    shared_host: the nodes share one host's cores (the local target); warm: there, the ranks of
    runs started without a launcher are forked from warm-start servers (starts.starts_directly).

    >>> from scalelab.sweep.planner import RunPlan
    >>> r = RunPlan("train", "train-x", {"world_size": 2, "bandwidth_mbit": None, "steps": 0,
    ...     "warmup": 0, "model": "resnet20", "batch_size": 32, "image_size": 32,
    ...     "engine": "ddp", "procs_per_node": 1}, ("n0", "n1"), 60.0)
    >>> estimate_duration_s([r, r]) - RESHAPE_S, estimate_duration_s([r, r], shared_host=True, warm=True) - RESHAPE_S
    (20.0, 18.0)
    """
    total = 0.0
    rate: object = object()
    servers = False
    for run in runs:
        if run.params["bandwidth_mbit"] != rate:
            rate = run.params["bandwidth_mbit"]
            total += RESHAPE_S
        forked = warm and run_starts_directly(run, shared_host)
        if forked and not servers:
            total, servers = total + WARM_SERVERS_S, True
        total += estimate_run_s(run, per_step_s, WARM_STARTUP_S if forked else startup_s, device,
                                shared_host)
    return total
