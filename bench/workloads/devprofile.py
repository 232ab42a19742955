#!/usr/bin/env python3
"""Measure a device profile: per-layer forward and backward times of one training step.

    python bench/workloads/devprofile.py --model resnet50 --batch-size 64 [--precision amp]
        [--device cuda|cpu|auto] [--steps 10] [--warmup 3] [--output PROFILE.json]

A layer is a module that owns parameters (a convolution, a batch norm, the classifier), in the
order forward runs them. Its forward time is from the end of the previous layer to its own end
(so activations, pooling and additions in between are charged to the layer that follows them);
its backward time is from the previous gradient to become ready to its own last gradient (the
post-accumulate-grad hooks, the moment the engines' communication hooks fire). Times sum to the
measured forward and backward. On a GPU every mark is a CUDA event on the compute stream, so the
times are execution, not kernel launch. Each figure is the median over --steps steps after
--warmup. The optimizer step (SGD with momentum, as the training benchmark uses) is timed too.

The output is a profile for bench/workloads/emulate.py (source "measured").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import emulate  # noqa: E402
import models  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Measure a device profile (per-layer step times).")
    p.add_argument("--model", default="resnet50", help=f"one of: {', '.join(models.model_names())}")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--precision", choices=["fp32", "amp"], default="fp32")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--channels-last", action="store_true",
                   help="NHWC memory format, as training with --channels-last runs (on a GPU "
                        "with tensor cores it is the fast layout for amp)")
    p.add_argument("--steps", type=int, default=10, help="measured steps (the median is kept)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (CPU; 0: torch's default)")
    p.add_argument("--output", default="-", help="where to write the profile ('-': stdout)")
    a = p.parse_args(argv)
    try:
        s = models.spec(a.model)
    except ValueError as e:
        p.error(str(e))
    a.image_size = a.image_size or s.default_image_size
    if min(a.batch_size, a.steps, a.image_size) < 1 or a.warmup < 0:
        p.error("--batch-size, --steps and --image-size must be >= 1, --warmup >= 0")
    return a


def measure(a: argparse.Namespace) -> dict:
    import torch
    from torch import nn

    if a.threads:
        torch.set_num_threads(a.threads)
    device = common.resolve_device(a.device, 0)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = models.build_model(a.model).to(device, memory_format=fmt)
    layers = [(name, m) for name, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]
    owner = {id(p): name for name, m in layers for p in m.parameters(recurse=False)}
    pnames = {id(p): n for n, p in model.named_parameters()}
    clock = common.StepClock(device)
    fwd_end: dict[str, object] = {}
    grad_at: dict[str, object] = {}
    order: list[str] = []

    def on_forward(name):
        def hook(_m, _i, _o):
            fwd_end[name] = clock.mark()
            if name not in order:
                order.append(name)

        return hook

    for name, m in layers:
        m.register_forward_hook(on_forward(name))
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda t: grad_at.__setitem__(owner[id(t)], clock.mark()))

    x = torch.randn(a.batch_size, 3, a.image_size, a.image_size, device=device).to(
        memory_format=fmt)
    y = torch.randint(0, models.spec(a.model).default_num_classes, (a.batch_size,), device=device)
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler("cuda") if a.precision == "amp" and device.type == "cuda" else None
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    samples: list[dict[str, float]] = []
    for i in range(a.warmup + a.steps):
        fwd_end.clear()
        grad_at.clear()
        opt.zero_grad()
        t0 = clock.mark()
        with torch.autocast(device.type, dtype=dtype, enabled=a.precision == "amp"):
            loss = criterion(model(x), y)
        t_loss = clock.mark()
        (scaler.scale(loss) if scaler else loss).backward()
        t_bwd = clock.mark()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        t_opt = clock.mark()
        clock.sync()
        if i < a.warmup:
            continue
        rec: dict[str, float] = {"optimizer_s": clock.seconds(t_bwd, t_opt)}
        prev = t0
        for name in order:
            rec[f"f:{name}"] = clock.seconds(prev, fwd_end[name])
            prev = fwd_end[name]
        rec[f"f:{order[-1]}"] += clock.seconds(prev, t_loss)  # the loss: charged to the last layer
        prev = t_loss
        ready = sorted(grad_at.items(), key=lambda kv: clock.seconds(t0, kv[1]))
        for name, mark in ready:
            rec[f"b:{name}"] = clock.seconds(prev, mark)
            prev = mark
        rec[f"b:{ready[-1][0]}"] += clock.seconds(prev, t_bwd)
        samples.append(rec)
    return _profile(a, torch, device, model, layers, order, pnames, samples)


def _profile(a: argparse.Namespace, torch, device, model, layers, order: list[str],
             pnames: dict[int, str], samples: list[dict[str, float]]) -> dict:
    """The profile: each layer's median forward and backward time over the measured steps,
    in forward order, and what it was measured on."""

    def med(key: str) -> float:
        return round(statistics.median(s[key] for s in samples), 7)

    return {
        "schema": emulate.SCHEMA,
        "model": a.model,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else (common.cpu_model() or "cpu"),
        "precision": a.precision,
        "batch_size": a.batch_size,
        "image_size": a.image_size,
        "source": "measured",
        "memory_format": common.memory_layout(model),
        "provenance": (
            f"measured by bench/workloads/devprofile.py on {platform.node()}, {device.type}, torch "
            f"{torch.__version__}{_tf32_note(torch, device)}, {common.memory_layout(model)}, "
            f"threads {torch.get_num_threads()}, "
            f"median of {a.steps} steps "
            f"after {a.warmup}, {datetime.now(UTC).strftime('%Y-%m-%d')}"
        ),
        "optimizer_s": med("optimizer_s"),
        "layers": [
            {
                "name": name,
                "params": [pnames[id(p)] for p in dict(layers)[name].parameters(recurse=False)],
                "numel": sum(p.numel() for p in dict(layers)[name].parameters(recurse=False)),
                "fwd_s": med(f"f:{name}"),
                "bwd_s": med(f"b:{name}"),
            }
            for name in order
        ],
    }


def _tf32_note(torch, device) -> str:
    """fp32 on a GPU since Ampere: cuDNN convolutions run in TF32 unless switched off (PyTorch's
    default), which a profile named fp32 must say."""
    if device.type != "cuda":
        return ""
    return f", cuDNN TF32 {'on' if torch.backends.cudnn.allow_tf32 else 'off'}"


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    t = time.time()
    prof = emulate.check(measure(a))
    text = json.dumps(prof, indent=1) + "\n"
    if a.output == "-":
        sys.stdout.write(text)
    else:
        with open(a.output, "w", encoding="utf-8") as f:
            f.write(text)
    tot = emulate.totals(prof)
    common.log("%s %s batch %d on %s: forward %.4f s, backward %.4f s, optimizer %.4f s (%.0f img/s); %.0f s",
               a.model, a.precision, a.batch_size, prof["device"], tot["fwd_s"], tot["bwd_s"],
               tot["optimizer_s"], a.batch_size / tot["step_s"], time.time() - t)
    return 0


if __name__ == "__main__":
    common.exit_now(main())
