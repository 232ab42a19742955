#!/usr/bin/env bash
# Single-GPU ResNet-50 AMP, synthetic ImageNet: images/s to compare with published figures
# (H100 SXM: about 2,600-2,800 img/s in public benchmarks). Run on a machine with a GPU and
# the project's venv (./bootstrap.sh); CUDA torch is needed there, not the CPU build:
#   pip install -c constraints.txt torch==2.13.0 --index-url <your CUDA wheel index>
# Usage: bench/perf/gpu_resnet50.sh [batch=256] [steps=50]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
BATCH=${1:-256}
STEPS=${2:-50}
"$PY" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device visible to torch")'
"$PY" bench/workloads/resnet.py --model resnet50 --precision amp --channels-last \
  --batch-size "$BATCH" --warmup 15 --steps "$STEPS" --device cuda \
  | "$PY" -c '
import json, sys
for line in sys.stdin:
    if "SCALELAB_RESULT " in line:
        r = json.loads(line.split("SCALELAB_RESULT ", 1)[1])
        rank = r["ranks"][0]
        print(f"resnet50 amp batch {r[\"batch_size\"]}: {r[\"images_per_sec\"]:.0f} img/s, "
              f"step {rank[\"step_time_mean_s\"]*1000:.1f} ms (p95 {rank[\"step_time_p95_s\"]*1000:.1f}), "
              f"GPU {r[\"env\"].get(\"gpu_model\")}")
'
