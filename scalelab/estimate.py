"""Rough wall-time estimates of planned runs (for --dry-run and the progress ETA).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from scalelab import analysis
from scalelab.models import MODELS, gradient_bytes
from scalelab.sweep import RunPlan

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------ estimates

CPU_GFLOPS = 30.0  # one core running PyTorch convs, measured: resnet20 b32 ~0.13 s/step
GPU_GFLOPS = 12_000.0  # a V100/A100-class GPU on ResNet-50 training, fp32 order of magnitude
STARTUP_S = 10.0  # launch over SSH, import torch, rendezvous, build the model
RESHAPE_S = 5.0  # set a rate on every link, plus the netprobe
NATIVE_MBIT = 10_000.0  # what an unshaped link is assumed to carry


def default_step_s(model: str, device: str = "cpu") -> float:
    """Seconds of one training step (forward + backward = 3x forward) at batch 32, one process.

    >>> round(default_step_s("resnet20"), 2), round(default_step_s("resnet50", "gpu"), 3)
    (0.13, 0.033)
    """
    gflops = GPU_GFLOPS if device == "gpu" else CPU_GFLOPS
    return 3 * MODELS[model].gflops_fwd * 32 / gflops


def _ring_s(nbytes: float, world: int, mbit: float | None) -> float:
    """Ring allreduce over the link (the report's model, without its per-hop latency)."""
    return analysis.ring_allreduce_time_s(world, nbytes, mbit or NATIVE_MBIT, alpha_s=0.0)


def estimate_run_s(run: RunPlan, per_step_s: Mapping[str, float] | None = None,
                   startup_s: float = STARTUP_S, device: str = "cpu") -> float:
    """Rough wall time of one run: startup + (warmup + steps) * (compute + allreduce).

    Compute and communication are added, not overlapped, so the estimate errs long.
    per_step_s maps model -> seconds per step of one process at batch 32 and the model's
    image size (e.g. measured in an earlier sweep); models it lacks get default_step_s(device).
    """
    p = run.params
    world, mbit = p["world_size"], p["bandwidth_mbit"]
    iters = p["steps"] + p["warmup"]
    if run.kind == "allreduce":
        return startup_s + sum(iters * (_ring_s(size, world, mbit) + 0.001)
                               for size in run.allreduce_sizes)
    model = p["model"]
    if p.get("accelerator"):
        # the device's step from its profile; dilation k stretches all of it (k unknown before
        # the host is calibrated: 1)
        from scalelab import accel

        doc = accel.resolve(p["accelerator"], model, p["precision"], p["batch_size"],
                            p["image_size"])
        k = float(p.get("dilation") or 1)
        return startup_s + iters * k * (accel.step_s(doc) + _ring_s(gradient_bytes(model), world, mbit))
    base = (per_step_s or {}).get(model) or default_step_s(model, device)
    scale = (p["image_size"] / MODELS[model].image_size) ** 2
    compute = base * p["batch_size"] / 32 * scale
    return startup_s + iters * (compute + _ring_s(gradient_bytes(model), world, mbit))


def estimate_duration_s(runs: Sequence[RunPlan], per_step_s: Mapping[str, float] | None = None,
                        startup_s: float = STARTUP_S, device: str = "cpu") -> float:
    """Rough wall time of a plan (for --dry-run), link reconfigurations included.

    device is "gpu" on a cluster with GPUs (it picks the default per-step times).
    """
    total = 0.0
    rate: object = object()
    for run in runs:
        if run.params["bandwidth_mbit"] != rate:
            rate = run.params["bandwidth_mbit"]
            total += RESHAPE_S
        total += estimate_run_s(run, per_step_s, startup_s, device)
    return total
