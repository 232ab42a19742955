"""Emulated accelerators: a rank that keeps the real model's parameters and the engine's real
gradient communication, and replaces forward and backward computation with waits taken from a
device profile, layer by layer.

A device profile (JSON; docs/emulation.md) lists the model's layers in forward order, each
with the parameters it owns and its forward and backward time on the device:

    {"schema": 1, "model": "resnet50", "device": "...", "precision": "fp32", "batch_size": 64,
     "image_size": 224, "source": "measured|derived", "provenance": "...",
     "optimizer_s": 0.001,
     "gpu_side_stretch": 1.045, "gpu_side_source": "...",    (optional)
     "memory_format": "channels_last",    (optional: the layout the device was timed in)
     "layers": [{"name": "conv1", "params": ["conv1.weight"], "numel": 9408,
                 "fwd_s": ..., "bwd_s": ...}, ...]}

How a step runs here. The model is a chain of autograd functions, one per layer, over the real
model's parameter tensors. Forward through layer i waits fwd_s[i]; backward through it waits
bwd_s[i] and then hands each of its parameters a gradient, so the engine's own hooks (DDP's
reducer and buckets, Horovod's per-tensor allreduce) see gradients become ready in the real
order at the real times and overlap communication with the rest of backward exactly as they
would on the device. The optimizer step is a wait too.

Waits are sleeps, not spins (ten emulated ranks must not compete for two cores), and they are
paced against a running deadline: each wait ends at step start + the sum of the profile's times
so far, so a late wake-up (a busy host, the engine's own copying) is absorbed by the next wait
instead of stretching the step. Only the engine's real work (communication, copying gradients
into buckets) can make a step longer than its profile, as on the device.

Time dilation (DieCast): with factor k every wait is k times the profile's time and the
controller shapes every link to rate / k; the workload divides the times it reports by k, so
a 2-core host can stand in for links it could not drive at full rate.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

SCHEMA = 1
SOURCES = ("measured", "derived")
LAYOUTS = ("contiguous", "channels_last")


class ProfileError(ValueError):
    """A device profile that cannot be used for this run."""


def _number(layer: dict[str, Any], key: str, where: str) -> float:
    v = layer.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != v:
        raise ProfileError(f"{where}: {key} must be a number of seconds >= 0, got {v!r}")
    return float(v)


def check(doc: Any, where: str = "profile") -> dict[str, Any]:
    """Validate a profile document's shape; return it. ProfileError names the first problem."""
    if not isinstance(doc, dict):
        raise ProfileError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: schema must be {SCHEMA}, got {doc.get('schema')!r}")
    for key in ("model", "device", "precision", "provenance"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise ProfileError(f"{where}: {key} must be a non-empty string")
    if doc["precision"] not in ("fp32", "amp"):
        raise ProfileError(f"{where}: precision must be fp32 or amp, got {doc['precision']!r}")
    if doc.get("source") not in SOURCES:
        raise ProfileError(f"{where}: source must be one of {', '.join(SOURCES)}, got {doc.get('source')!r}")
    for key in ("batch_size", "image_size"):
        v = doc.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ProfileError(f"{where}: {key} must be an integer >= 1, got {v!r}")
    _number(doc, "optimizer_s", where)
    if doc.get("memory_format", "contiguous") not in LAYOUTS:
        raise ProfileError(f"{where}: memory_format must be one of {', '.join(LAYOUTS)}, got "
                           f"{doc['memory_format']!r}")
    stretch = doc.get("gpu_side_stretch")  # optional: the GPU-side cost of training with peers
    if stretch is not None:
        if isinstance(stretch, bool) or not isinstance(stretch, int | float) or not stretch >= 1:
            raise ProfileError(f"{where}: gpu_side_stretch must be a number >= 1 (1 / the "
                               f"efficiency of one node of its GPUs), got {stretch!r}")
        if not isinstance(doc.get("gpu_side_source"), str) or not doc["gpu_side_source"]:
            raise ProfileError(f"{where}: gpu_side_stretch needs gpu_side_source, saying where "
                               "the figure comes from")
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise ProfileError(f"{where}: layers must be a non-empty list")
    seen: set[str] = set()
    for i, layer in enumerate(layers):
        lw = f"{where}: layers[{i}]"
        if not isinstance(layer, dict) or not isinstance(layer.get("name"), str):
            raise ProfileError(f"{lw}: expected an object with a name")
        params = layer.get("params")
        if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
            raise ProfileError(f"{lw} ({layer['name']}): params must be a list of parameter names")
        dup = seen.intersection(params)
        if dup:
            raise ProfileError(f"{lw} ({layer['name']}): parameter {sorted(dup)[0]} belongs to two layers")
        seen.update(params)
        _number(layer, "fwd_s", lw)
        _number(layer, "bwd_s", lw)
        numel = layer.get("numel")  # elements of its parameters (optional: the overlap model's)
        if numel is not None and (isinstance(numel, bool) or not isinstance(numel, int) or numel < 0):
            raise ProfileError(f"{lw} ({layer['name']}): numel must be an integer >= 0, got {numel!r}")
    return doc


def load(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{p}: no such profile") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProfileError(f"{p}: not a JSON profile ({e})") from None
    return check(doc, str(p))


def for_world(doc: dict[str, Any], world_size: int) -> dict[str, Any]:
    """The profile as a rank of world_size runs it: with peers (world_size > 1) every time
    grows by the profile's gpu_side_stretch, the GPU-side cost of communication (kernels and
    copies that compete with compute, a PCIe root and host shared with the other GPUs),
    measured as 1 / the efficiency of one node of its GPUs; alone, or without the field, as is.

    >>> doc = {"optimizer_s": 0.1, "gpu_side_stretch": 1.25, "gpu_side_source": "x",
    ...        "layers": [{"fwd_s": 0.2, "bwd_s": 0.4}]}
    >>> totals(for_world(doc, 8))["step_s"], totals(for_world(doc, 1))["step_s"]
    (0.875, 0.7000000000000001)
    """
    f = float(doc.get("gpu_side_stretch") or 1.0)
    if world_size <= 1 or f == 1.0:
        return doc
    return {**doc, "optimizer_s": doc["optimizer_s"] * f,
            "layers": [{**ly, "fwd_s": ly["fwd_s"] * f, "bwd_s": ly["bwd_s"] * f}
                       for ly in doc["layers"]]}


def totals(doc: dict[str, Any]) -> dict[str, float]:
    """Forward, backward, optimizer and step time of one step on the device, in seconds."""
    fwd = sum(layer["fwd_s"] for layer in doc["layers"])
    bwd = sum(layer["bwd_s"] for layer in doc["layers"])
    return {"fwd_s": fwd, "bwd_s": bwd, "optimizer_s": doc["optimizer_s"],
            "step_s": fwd + bwd + doc["optimizer_s"]}


class Pacer:
    """Sleeps to a running deadline: wait(d) returns at (start + sum of waits so far) * k."""

    def __init__(self, dilation: float = 1.0) -> None:
        if dilation < 1:
            raise ProfileError(f"dilation must be >= 1, got {dilation}")
        self.k = float(dilation)
        self.deadline = time.perf_counter()
        self.slept_s = 0.0  # time actually asleep (what compute cost the host: nothing)

    def start(self) -> None:
        self.deadline = time.perf_counter()

    def wait(self, seconds: float) -> None:
        self.deadline += seconds * self.k
        left = self.deadline - time.perf_counter()
        if left > 0:
            time.sleep(left)
            self.slept_s += left


def build(doc: dict[str, Any], model_params: list[tuple[str, Any]], dilation: float = 1.0):
    """The emulated network over `model_params` (the real model's named parameters, in
    registration order). Returns (module, pacer). The module's forward(x) returns a scalar
    loss whose backward runs the profile's backward waits and fills every parameter's
    gradient, layer by layer in reverse order."""
    import torch
    from torch import nn

    by_name = dict(model_params)
    named = [p for layer in doc["layers"] for p in layer["params"]]
    missing = sorted(set(by_name) - set(named))
    unknown = sorted(set(named) - set(by_name))
    if missing or unknown:
        what = (f"has no layer for parameter {missing[0]}" if missing
                else f"names parameter {unknown[0]}, which the model does not have")
        raise ProfileError(f"the {doc['device']} profile {what}: it was made for another model "
                           f"than this {doc['model']}")
    pacer = Pacer(dilation)
    fwd = [layer["fwd_s"] for layer in doc["layers"]]
    bwd = [layer["bwd_s"] for layer in doc["layers"]]
    # The gradients handed to the engine: one zero, broadcast to each parameter's shape (no
    # memory of its own). The caller never clears .grad, so after the first step autograd adds
    # it into the existing gradient in place (with DDP's gradient_as_bucket_view, straight into
    # the bucket) and the host does the least a real step would: no allocation, no page
    # faults, one pass over the gradients.
    zero = {t.dtype: torch.zeros((), dtype=t.dtype) for t in by_name.values()}
    zeros = [[zero[by_name[p].dtype].expand(by_name[p].shape) for p in layer["params"]]
             for layer in doc["layers"]]

    class Layer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, idx, *params):  # noqa: ARG004 - params are inputs for autograd
            ctx.idx = idx
            pacer.wait(fwd[idx])
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            pacer.wait(bwd[ctx.idx])
            return (g, None, *zeros[ctx.idx])

    class Emulated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # keep the real model's names, so DDP/Horovod see the same parameters
            self.names = [n for n, _ in model_params]
            self.params = nn.ParameterList([by_name[n] for n in self.names])
            index = {n: i for i, n in enumerate(self.names)}
            self.groups = [[index[p] for p in layer["params"]] for layer in doc["layers"]]

        def forward(self, x):
            pacer.start()
            for i, group in enumerate(self.groups):
                x = Layer.apply(x, i, *[self.params[j] for j in group])
            return x.sum()

    return Emulated(), pacer
