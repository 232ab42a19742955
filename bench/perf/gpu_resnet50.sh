#!/usr/bin/env bash
# Single-GPU ResNet-50, synthetic ImageNet: images/s to compare with published figures
# (H100 SXM, amp: about 2,600-2,800 img/s in public benchmarks). Run on a machine with a GPU
# and the project's venv (./bootstrap.sh); CUDA torch is needed there, not the CPU build:
#   pip install -c constraints.txt torch==2.13.0 --index-url <your CUDA wheel index>
# Usage: bench/perf/gpu_resnet50.sh [batch=256] [steps=50]
#   PRECISION=fp32|tf32|amp|bf16 (default amp) picks the precision mode; CHANNELS_LAST=0 trains
#   in NCHW (the default is NHWC, channels_last); ENGINE=horovod trains one Horovod rank under
#   horovodrun (its gradients go through Horovod's NCCL allreduce; build it first with
#   scripts/build_horovod.sh), ENGINE=ddp (the default) a plain process.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
BATCH=${1:-256}
STEPS=${2:-50}
PRECISION=${PRECISION:-amp}
LAYOUT=--channels-last
[ "${CHANNELS_LAST:-1}" = 0 ] && LAYOUT=
"$PY" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device visible to torch")'
LAUNCH=()
case ${ENGINE:-ddp} in
  ddp) ;;
  horovod) LAUNCH=("$(dirname "$PY")/horovodrun" -np 1 -H localhost:1);;
  *) echo "ENGINE: '$ENGINE' is not ddp or horovod" >&2; exit 2;;
esac
"${LAUNCH[@]}" "$PY" bench/workloads/resnet.py --model resnet50 --precision "$PRECISION" $LAYOUT \
  --batch-size "$BATCH" --warmup 15 --steps "$STEPS" --device cuda --engine "${ENGINE:-ddp}" \
  | "$PY" -c '
import json
import sys

for line in sys.stdin:
    if "SCALELAB_RESULT " not in line:
        continue
    r = json.loads(line.split("SCALELAB_RESULT ", 1)[1])
    rank = r["ranks"][0]
    batch, ips, precision, tf32 = r["batch_size"], r["images_per_sec"], r["precision"], r["tf32"]
    layout = "channels_last" if r["channels_last"] else "NCHW"
    step_ms = rank["step_time_mean_s"] * 1000
    p95_ms = rank["step_time_p95_s"] * 1000
    name, dev, peak = rank["device_name"], rank["device"], rank["gpu_mem_peak_mb"]
    backend = r["backend"]
    print(f"resnet50 {precision} (tf32 {tf32}) {layout} batch {batch}: {ips:.0f} img/s, "
          f"step {step_ms:.1f} ms (p95 {p95_ms:.1f}), {dev} {name}, peak GPU memory {peak} MiB, "
          f"backend {backend}")
    sys.exit(0)
sys.exit("gpu_resnet50.sh: resnet.py printed no SCALELAB_RESULT line")
'
