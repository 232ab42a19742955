#!/usr/bin/env bash
# Everything scalelab checks on one GPU machine, in one go, each step logged whatever the last
# one did (a lent GPU's minutes are few): the node facts as configure reads them, the GPU tests
# (invoke test --gpu), ResNet-50 device profiles at fp32 and amp for --accelerator, and
# single-GPU ResNet-50 images/s at each precision (bench/perf/gpu_resnet50.sh).
# Usage: bench/perf/gpu_session.sh OUTDIR [NAME]
#   NAME (default h100) names the profiles: OUTDIR/NAME-resnet50-{fp32,amp}.json, which
#   bench/profiles/ takes as they are. PYTHON picks the interpreter (a CUDA build of torch);
#   ONLY="facts tests profiles throughput" picks steps (default: all); RUNS="amp:1 fp32:0" picks
#   the throughput runs (precision:channels_last).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: gpu_session.sh OUTDIR [NAME]}
NAME=${2:-h100}
PY=$(command -v "${PYTHON:-python3}")
ONLY=${ONLY:-facts tests profiles throughput}
want() { case " $ONLY " in *" $1 "*) return 0;; esac; return 1; }
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
step() { echo "=== $* ($(date -u +%H:%M:%S))"; }

step machine
nvidia-smi -L
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
          "devices", torch.cuda.device_count(), "cudnn", torch.backends.cudnn.version())'
nproc

want facts && {
step facts "(the probe configure runs on every node, here on this machine)"
"$PY" - "$PY" > "$OUT/facts.json" <<'EOF'
import json, subprocess, sys
from scalelab.cluster import facts
py = sys.argv[1]
text = subprocess.run(["sh", "-c", facts.probe_script("127.0.0.1", py, ".")],
                      capture_output=True, text=True, timeout=120).stdout
f = facts.parse_probe(text, py, ".")
print(json.dumps({k: f[k] for k in ("gpus", "gpu_model", "gpu_memory_mb", "gpu_list",
                                    "cuda_driver", "gpu_topology", "rdma", "torch",
                                    "torch_can", "horovod_can", "cores")}, indent=1))
EOF
cat "$OUT/facts.json"
}

want tests && {
step "GPU tests (invoke test --gpu)"
"$PY" -m invoke test --gpu 2>&1 | tee "$OUT/gpu-tests.txt" | tail -n 30
}

# channels_last: the layout training on tensor cores uses (--memory-format in sweeps); the
# profile must time what the runs it stands in for compute
want profiles && for prec in fp32 amp; do
  step "profile resnet50 $prec batch 256 channels_last"
  "$PY" -m invoke profile --model resnet50 --precision "$prec" --batch-size 256 --steps 20 \
    --device cuda --channels-last --output "$OUT/$NAME-resnet50-$prec.json" 2>&1 | tail -n 3
done

want throughput && for run in ${RUNS:-amp:1 amp:0 bf16:1 tf32:1 fp32:1}; do
  step "throughput resnet50 ${run%:*} batch 256 channels_last=${run#*:}"
  PYTHON="$PY" PRECISION=${run%:*} CHANNELS_LAST=${run#*:} bench/perf/gpu_resnet50.sh 256 50 \
    2>&1 | tail -n 1 | tee -a "$OUT/throughput.txt"
done
step done
