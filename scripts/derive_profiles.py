#!/usr/bin/env python3
"""Write the derived device profiles scalelab ships (bench/profiles/<gpu>-<model>-<precision>.json
for the V100 and the A100; the H100's are measured, by bench/perf/gpu_session.sh, and this
script leaves them alone).

Each of these is *derived*: the step time is a published single-GPU training throughput (the table
below, with its source), split over layers, forward and backward in the proportions measured
by bench/workloads/devprofile.py on this project's reference host (bench/profiles/splits/),
and the optimizer step is SGD's memory traffic at the GPU's memory bandwidth. A profile
measured on the device itself (`invoke profile` there) is better; these make the emulation
runnable anywhere and say in their provenance how they were made.

    python scripts/derive_profiles.py            # rewrite the derived ones
    python scripts/derive_profiles.py --check    # exit 1 when a shipped profile is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench" / "workloads"))
sys.path.insert(0, str(ROOT))
import emulate  # noqa: E402

from scalelab.model.networks import MODELS  # noqa: E402  (the one model registry)

OUT = ROOT / "bench" / "profiles"
SPLITS = OUT / "splits"

DLE = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
       "'Training performance results', 1 GPU, pytorch-21.03 container; batch size from "
       "ConvNets/configs.yml")
# (gpu, device name, HBM GB/s, precision, per-GPU batch, ResNet-50 img/s, source, note)
PUBLISHED = [
    ("v100", "NVIDIA V100 16GB (derived)", 900, "fp32", 112, 367.0, DLE, "DGX-1 16GB, FP32"),
    ("v100", "NVIDIA V100 16GB (derived)", 900, "amp", 256, 1200.0, DLE, "DGX-1 16GB, mixed precision"),
    ("a100", "NVIDIA A100 80GB (derived)", 2039, "fp32", 256, 938.0, DLE, "DGX A100 80GB, TF32"),
    ("a100", "NVIDIA A100 80GB (derived)", 2039, "amp", 256, 2470.0, DLE, "DGX A100 80GB, mixed precision"),
]
# models without a published figure of their own: ResNet-50's throughput x the FLOP ratio
BY_FLOPS = ("resnet101",)


def derive(split: dict, gpu: str, device: str, hbm_gbs: float, precision: str, batch: int,
           img_s: float, provenance: str) -> dict:
    params = MODELS[split["model"]].params
    # SGD with momentum and weight decay reads weight, gradient, momentum and writes weight,
    # momentum: 5 fp32 accesses per parameter (master weights stay fp32 under amp)
    opt_s = params * 4 * 5 / (hbm_gbs * 1e9)
    t = emulate.totals(split)
    compute = batch / img_s - opt_s
    f = compute / (t["fwd_s"] + t["bwd_s"])
    return emulate.check({
        "schema": emulate.SCHEMA, "model": split["model"], "device": device,
        "precision": precision, "batch_size": batch, "image_size": split["image_size"],
        "source": "derived", "provenance": provenance, "optimizer_s": round(opt_s, 7),
        "layers": [{"name": layer["name"], "params": layer["params"], "numel": layer["numel"],
                    "fwd_s": round(layer["fwd_s"] * f, 7), "bwd_s": round(layer["bwd_s"] * f, 7)}
                   for layer in split["layers"]],
    }, f"{gpu}-{split['model']}-{precision}")


def profiles() -> dict[str, dict]:
    out = {}
    for gpu, device, hbm, precision, batch, img_s, source, note in PUBLISHED:
        for model in ("resnet50", *BY_FLOPS):
            split = emulate.load(SPLITS / f"{model}.json")
            rate = img_s
            how = f"{img_s:g} img/s ({note}) from {source}"
            if model != "resnet50":
                ratio = MODELS["resnet50"].gflops_fwd / MODELS[model].gflops_fwd
                rate = img_s * ratio
                how = (f"{rate:.1f} img/s: ResNet-50's {img_s:g} img/s ({note}, {source}) x the "
                       f"forward GFLOP ratio {MODELS['resnet50'].gflops_fwd}/{MODELS[model].gflops_fwd}")
            prov = (f"derived: step time from {how}; per-layer forward/backward split as measured "
                    f"on a CPU ({split['provenance']}); optimizer step = SGD memory traffic at "
                    f"{hbm} GB/s")
            out[f"{gpu}-{model}-{precision}.json"] = derive(split, gpu, device, hbm, precision,
                                                            batch, rate, prov)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare, write nothing")
    a = ap.parse_args()
    stale = []
    for name, doc in profiles().items():
        text = json.dumps(doc, indent=1) + "\n"
        path = OUT / name
        if a.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            t = emulate.totals(doc)
            print(f"{name}: batch {doc['batch_size']}, step {t['step_s'] * 1000:.1f} ms "
                  f"({doc['batch_size'] / t['step_s']:.0f} img/s)")
    if stale:
        print(f"stale: {', '.join(stale)}; run python scripts/derive_profiles.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
