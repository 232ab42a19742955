"""Emulated accelerators on the controller: device profiles by name or path, checked against
the run they are for, scaled to its batch size, and staged on the nodes.

A profile is one JSON per (model, device, precision, batch size); its format and how a rank
uses it are in bench/workloads/emulate.py (the one checker, shared with the nodes). Shipped
profiles are bench/profiles/<accelerator>-<model>-<precision>.json; `--accelerator NAME` picks
by name, `--accelerator PATH.json` takes a user's (e.g. from `invoke profile` on real hardware).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from scalelab.core import nodeside
from scalelab.core.errors import InputError, suggest
from scalelab.core.state import PROJECT_ROOT
from scalelab.model.fabric import loopback_mbit
from scalelab.model.networks import MODELS

ROOT = PROJECT_ROOT
PROFILES_DIR = ROOT / "bench" / "profiles"
STAGE_DIR = "profiles"  # under the workloads directory on every node

emulate = nodeside.load("emulate")  # the nodes' own checker (scalelab.core.nodeside)


def shipped() -> dict[tuple[str, str, str], Path]:
    """(accelerator, model, precision) -> file, for the profiles scalelab ships."""
    out = {}
    for f in sorted(PROFILES_DIR.glob("*.json")):
        parts = f.stem.split("-")
        if len(parts) == 3:
            out[(parts[0], parts[1], parts[2])] = f
    return out


def names() -> list[str]:
    return sorted({k[0] for k in shipped()})


def is_path(accelerator: str) -> bool:
    return accelerator.endswith(".json") or "/" in accelerator


def check_name(accelerator: str) -> None:
    """Refuse an accelerator that is neither a shipped name nor a readable profile file."""
    if is_path(accelerator):
        load(accelerator)
        return
    if accelerator not in names():
        raise InputError(f"unknown accelerator {accelerator!r}{suggest(accelerator, names())}: "
                         f"known: {', '.join(names())}, or give a profile file "
                         "(PROFILE.json, measured with `invoke profile`)")


def load(path: str | Path) -> dict[str, Any]:
    try:
        return emulate.load(Path(path).expanduser())
    except emulate.ProfileError as e:
        raise InputError(f"{e}: fix it or measure one with `invoke profile`") from None


def scaled(doc: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """The profile at another batch size: every layer's time in proportion to the batch (a
    GPU at these batch sizes is throughput-bound; the optimizer step does not depend on the
    batch). The provenance says so."""
    if batch_size == doc["batch_size"]:
        return doc
    f = batch_size / doc["batch_size"]
    out = dict(doc)
    out["layers"] = [{**layer, "fwd_s": layer["fwd_s"] * f, "bwd_s": layer["bwd_s"] * f}
                     for layer in doc["layers"]]
    out["batch_size"] = batch_size
    out["provenance"] = (f"{doc['provenance']}; scaled from batch {doc['batch_size']} to "
                         f"{batch_size} in proportion")
    return out


def resolve(accelerator: str, model: str, precision: str, batch_size: int,
            image_size: int, channels_last: bool | None = None) -> dict[str, Any]:
    """The profile a run uses: checked against its model, precision and input size, and
    (channels_last given, the profile stating the layout it was timed in) its memory format,
    at its batch size. InputError (one line) otherwise.

    >>> resolve("h100", "resnet50", "amp", 64, 224, channels_last=True)["batch_size"]
    64
    >>> resolve("h100", "resnet50", "amp", 64, 224, channels_last=False)
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: the profile h100-resnet50-amp.json was timed in channels_last, the sweep's layout is contiguous: add --memory-format channels_last, or measure one in contiguous (`invoke profile` without --channels-last)
    """
    if is_path(accelerator):
        doc = load(accelerator)
        src = accelerator
    else:
        check_name(accelerator)
        f = shipped().get((accelerator, model, precision))
        if f is None:
            have = sorted(f"{m} {p}" for a, m, p in shipped() if a == accelerator)
            raise InputError(f"no {accelerator} profile for {model} {precision}: it has "
                             f"{', '.join(have)}; measure one with `invoke profile --model {model} "
                             f"--precision {precision}` on the device and pass --accelerator PROFILE.json")
        doc = load(f)
        src = f.name
    for key, want in (("model", model), ("precision", precision), ("image_size", image_size)):
        if doc[key] != want:
            raise InputError(f"the profile {src} is for {key} {doc[key]}, the sweep's is {want}: "
                             f"use a profile made for {want} (`invoke profile --{key.replace('_', '-')} {want}`)")
    timed = doc.get("memory_format")
    want_fmt = None if channels_last is None else (
        "channels_last" if channels_last else "contiguous")
    if timed and want_fmt and timed != want_fmt:
        how = "with --channels-last" if channels_last else "without --channels-last"
        raise InputError(f"the profile {src} was timed in {timed}, the sweep's layout is "
                         f"{want_fmt}: add --memory-format {timed}, or measure one in {want_fmt} "
                         f"(`invoke profile` {how})")
    return scaled(doc, batch_size)


def staged_path(doc: dict[str, Any]) -> str:
    """Where a profile lies on the nodes, relative to the workloads directory: named by its
    content, so a changed profile is never mistaken for one staged before."""
    digest = hashlib.sha256(canonical(doc).encode()).hexdigest()[:16]
    return f"{STAGE_DIR}/{doc['model']}-{doc['precision']}-b{doc['batch_size']}-{digest}.json"


def canonical(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n"


def step_s(doc: dict[str, Any]) -> float:
    return emulate.totals(doc)["step_s"]


def auto_dilation(nodes: int, rate_mbit: float | None, host_mbit: float | None,
                  share: float = 0.5) -> float:
    """The smallest whole k at which the host can carry every node's link at once: the
    (shaped) rate of `nodes` links together must stay within `share` of what the host moved
    in its calibration (host_mbit). 1 with one node, with no shaping, or without a calibration.

    >>> auto_dilation(8, 10000, 20000)
    8.0
    >>> auto_dilation(8, 1000, 20000), auto_dilation(1, 10000, 20000), auto_dilation(8, None, 2e4)
    (1.0, 1.0, 1.0)
    """
    if nodes < 2 or not rate_mbit or not host_mbit:
        return 1.0
    return float(max(1, math.ceil(nodes * rate_mbit / (share * host_mbit))))


PASSES = 2  # passes over the gradient per rank per step on the host: autograd's add, gloo's sum
CPU_SHARE = 0.5  # of the host's cores the ranks' own work may take while they emulate backward
LOOPBACK_COPIES = 2  # a byte between two ranks of one node: copied in on send, out on receive


def cpu_dilation(ranks: int, nodes: int, grad: int, bwd_s: float, precision: str,
                 pass_s_per_byte: float, host_cpus: float, node_cpus: float) -> int:
    """The smallest whole k at which the ranks' own passes over their gradients fit in
    CPU_SHARE of the CPUs they have during the dilated backward pass: the host's cores for all
    ranks, and each node's CPUs for its own ranks. Ranks that share a node reduce among
    themselves over its loopback: every byte of their ring (2(G-1)/G of the gradient, each
    way) is copied by the kernel on send and on receive.

    >>> cpu_dilation(8, 8, 100_000_000, 0.1, "fp32", 1e-10, 2, 1)    # one rank per node
    2
    >>> cpu_dilation(4, 1, 100_000_000, 0.1, "fp32", 1e-10, 2, 1)    # 4 on one node of 1 CPU
    4
    """
    ppn = max(1, ranks // max(1, nodes))
    # amp: the engine's hook also casts each bucket to 16 bits and back
    passes = PASSES + (3 if precision in ("amp", "bf16") else 0)
    if ppn > 1:
        passes += LOOPBACK_COPIES * 2 * (ppn - 1) / ppn
    work = passes * grad * pass_s_per_byte / (CPU_SHARE * bwd_s)
    return max(1, math.ceil(max(ranks * work / host_cpus, ppn * work / node_cpus)))


def intra_dilation(nodes: int, ppn: int, intra_mbit: float | None, host_mbit: float | None,
                   share: float = 0.5) -> float:
    """The smallest whole k at which the host carries a node's shaped loopback (a stated
    intra-node path, --intra-link) when the ring runs on that path alone: one node. Over
    several nodes the ring moves at its slowest edge, the link, which the loopback then only
    keeps pace with, as it does unshaped (auto_dilation and cpu_dilation count that). 1 where
    no path is stated or without a calibration.

    >>> intra_dilation(1, 4, 80000.0, 20000.0)     # one node of 4 GPUs on PCIe gen3
    32.0
    >>> intra_dilation(2, 4, 80000.0, 20000.0), intra_dilation(1, 4, None, 20000.0)
    (1.0, 1.0)
    """
    lo = loopback_mbit(intra_mbit, nodes, ppn)
    if nodes > 1 or not lo or not host_mbit:
        return 1.0
    return float(max(1, math.ceil(lo / (share * host_mbit))))


def emulation_dilation(ranks: int, nodes: int, rate_mbit: float | None,
                       host_mbit: float | None, grad: int, bwd_s: float, precision: str,
                       pass_s_per_byte: float, host_cpus: float, node_cpus: float,
                       intra_mbit: float | None = None) -> float:
    """The k dilation auto gives a (rate, node count): the larger of what the links need
    (auto_dilation; with a stated intra-node path, the links and the nodes' shaped loopbacks
    together, intra_dilation) and what the ranks' own work needs (cpu_dilation); with several
    ranks per node their sum, since the links' copies and the ranks' loopback copies take the
    same cores.

    >>> emulation_dilation(8, 8, 1000.0, 20000.0, 100_000_000, 0.1, "fp32", 1e-10, 2, 1)
    2.0
    >>> emulation_dilation(32, 8, 10000.0, 20000.0, 100_000_000, 0.1, "fp32", 1e-10, 2, 1)
    24.0
    >>> emulation_dilation(4, 1, None, 20000.0, 100_000_000, 0.1, "fp32", 1e-10, 2, 1, 80000.0)
    36.0
    """
    k_link = max(auto_dilation(nodes, rate_mbit, host_mbit),
                 intra_dilation(nodes, max(1, ranks // max(1, nodes)), intra_mbit, host_mbit))
    k_cpu = cpu_dilation(ranks, nodes, grad, bwd_s, precision, pass_s_per_byte, host_cpus,
                         node_cpus)
    if ranks > nodes and k_link > 1:
        k_link += k_cpu
    return float(max(1, k_link, k_cpu))


def device_slug(name: str) -> str:
    """A device's name as a file name part.

    >>> device_slug("NVIDIA H100 80GB HBM3"), device_slug("cpu")
    ('h100-80gb-hbm3', 'cpu')
    """
    text = re.sub(r"^nvidia\s+", "", name.strip().lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "device"


def profile_command(model: str, batch_size: str | int, precision: str, device: str,
                    steps: str | int, output: str,
                    channels_last: bool) -> tuple[list[str], Path, Path, str]:
    """What `invoke profile` runs on this machine: the devprofile.py command, the temporary
    file it writes, the file it becomes and the device measured; InputError for what cannot
    be profiled here, before anything runs."""
    import sys

    if model not in MODELS:
        raise InputError(f"unknown model {model!r}{suggest(model, list(MODELS))}; known: "
                         f"{', '.join(MODELS)}")
    if precision not in ("fp32", "amp"):
        raise InputError(f"--precision {precision!r}: use fp32 or amp")
    if device not in ("auto", "cpu", "cuda"):
        raise InputError(f"--device {device!r}: use cuda, cpu or auto")
    for name, value in (("batch-size", batch_size), ("steps", steps)):
        if not str(value).isdigit() or int(value) < 1:
            raise InputError(f"--{name} {value!r}: give a whole number >= 1")
    import torch

    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise InputError(f"--device cuda but this machine's torch {torch.__version__} sees no "
                         "GPU; run invoke profile on the GPU node (or --device cpu to profile "
                         "this CPU)")
    device = device if device != "auto" else ("cuda" if has_cuda else "cpu")
    # the file name says what was measured: a CPU profile never passes for a GPU's
    what = device_slug(torch.cuda.get_device_name() if device == "cuda" else "cpu")
    out = Path(output or PROFILES_DIR / f"measured-{what}-{model}-{precision}-b{batch_size}.json")
    if not out.parent.is_dir():
        raise InputError(f"--output {output}: directory {out.parent} does not exist")
    tmp = out.with_name(f".{out.name}.tmp")
    cmd = [sys.executable, str(ROOT / "bench" / "workloads" / "devprofile.py"), "--model", model,
           "--batch-size", str(batch_size), "--precision", precision, "--device", device,
           "--steps", str(steps), "--output", str(tmp)]
    return cmd + (["--channels-last"] if channels_last else []), tmp, out, what
