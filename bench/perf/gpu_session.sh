#!/usr/bin/env bash
# Everything scalelab checks on one GPU machine, in one go, each step logged whatever the last
# one did (a lent GPU's minutes are few): Horovod built with NCCL operations
# (scripts/build_horovod.sh into the interpreter's venv), the node facts as configure reads
# them, the GPU tests (invoke test --gpu), ResNet-50 device profiles at fp32 and amp for
# --accelerator, and single-GPU ResNet-50 images/s per precision and layout, and through one
# Horovod rank (bench/perf/gpu_resnet50.sh).
# Usage: bench/perf/gpu_session.sh OUTDIR [NAME]
#   NAME (default h100) names the profiles: OUTDIR/NAME-resnet50-{fp32,amp}.json, stamped with
#   the GPU, driver, CUDA, cuDNN and NCCL they were timed on, ready for bench/profiles/.
#   PYTHON picks the interpreter (a CUDA build of torch; default python3).
#   ONLY="horovod facts tests profiles throughput" picks steps (default: all).
#   RUNS="amp:1 amp:0" picks the throughput runs, precision:channels_last (1 NHWC, 0 NCHW).
#   Offline (a lent machine): put the horovod 0.28.1 sdist and its setup_requires' wheels (cffi,
#   pycparser) in DIR and export PIP_FIND_LINKS=DIR PIP_NO_INDEX=1 first.
# Exits 1 if any step failed (each step still runs).
set -uo pipefail
OUT=${1:?usage: gpu_session.sh OUTDIR [NAME]}
NAME=${2:-h100}
PY=$(command -v "${PYTHON:-python3}") || { echo "no interpreter ${PYTHON:-python3}" >&2; exit 2; }
ONLY=${ONLY:-horovod facts tests profiles throughput}
RUNS=${RUNS:-amp:1 amp:0 bf16:1 tf32:1 fp32:1}
for s in $ONLY; do
  case $s in horovod|facts|tests|profiles|throughput) ;;
    *) echo "ONLY: unknown step '$s' (horovod, facts, tests, profiles, throughput)" >&2; exit 2;; esac
done
for r in $RUNS; do
  case $r in fp32:[01]|tf32:[01]|amp:[01]|bf16:[01]) ;;
    *) echo "RUNS: '$r' is not PRECISION:0|1 (fp32, tf32, amp, bf16)" >&2; exit 2;; esac
done
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
want() { case " $ONLY " in *" $1 "*) return 0;; esac; return 1; }
step() { echo "=== $* ($(date -u +%H:%M:%S))"; }
failed=0
fail() { echo "!!! $*"; failed=1; }

step machine
nvidia-smi -L || fail "nvidia-smi"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
          "devices", torch.cuda.device_count(), "cudnn", torch.backends.cudnn.version())' \
  || fail "torch"
nproc

if want horovod; then
  step "Horovod with NCCL operations (scripts/build_horovod.sh)"
  SCALELAB_VENV=$(dirname "$(dirname "$PY")") bash scripts/build_horovod.sh \
    > "$OUT/horovod-build.txt" 2>&1 || fail "horovod build"
  grep build_horovod: "$OUT/horovod-build.txt"
  "$(dirname "$PY")/horovodrun" --check-build || fail "horovodrun --check-build"
fi

if want facts; then
  step facts "(the probe configure runs on every node, here on this machine)"
  "$PY" - "$PY" > "$OUT/facts.json" <<'EOF' || fail "facts"
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
fi

if want tests; then
  step "GPU tests (invoke test --gpu)"
  "$PY" -m invoke test --gpu > "$OUT/gpu-tests.txt" 2>&1 || fail "GPU tests"
  tail -n 30 "$OUT/gpu-tests.txt"
fi

# channels_last: the layout training on tensor cores wants (--memory-format in sweeps); the
# profile times what the runs it stands for compute
if want profiles; then
  for prec in fp32 amp; do
    step "profile resnet50 $prec batch 256 channels_last"
    prof=$OUT/$NAME-resnet50-$prec.json
    if "$PY" -m invoke profile --model resnet50 --precision "$prec" --batch-size 256 \
        --steps 20 --device cuda --channels-last --output "$prof"; then
      "$PY" - "$prof" <<'EOF' || fail "stamping $prof"
import json, subprocess, sys
import torch
path = sys.argv[1]
doc = json.load(open(path))
driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                        capture_output=True, text=True).stdout.split("\n")[0].strip()
cudnn = torch.backends.cudnn.version() or 0
nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-"
doc["provenance"] += (f"; recorded with bench/perf/gpu_session.sh on one "
                      f"{torch.cuda.get_device_name()} (driver {driver}, CUDA "
                      f"{torch.version.cuda}, cuDNN {cudnn // 10000}.{cudnn // 100 % 100}, "
                      f"NCCL {nccl})")
json.dump(doc, open(path, "w"), indent=1)
open(path, "a").write("\n")
EOF
    else
      fail "profile $prec"
    fi
  done
fi

if want throughput; then
  for run in $RUNS; do
    step "throughput resnet50 ${run%:*} batch 256 channels_last=${run#*:}"
    PYTHON="$PY" PRECISION=${run%:*} CHANNELS_LAST=${run#*:} bench/perf/gpu_resnet50.sh 256 50 \
      > "$OUT/last-throughput.log" 2>&1 || fail "throughput $run"
    grep '^resnet50 ' "$OUT/last-throughput.log" | tee -a "$OUT/throughput.txt"
  done
  if want horovod; then
    step "throughput resnet50 amp batch 256 channels_last, one Horovod rank (NCCL allreduce)"
    PYTHON="$PY" ENGINE=horovod bench/perf/gpu_resnet50.sh 256 50 > "$OUT/last-throughput.log" 2>&1 \
      || fail "throughput horovod"
    grep '^resnet50 ' "$OUT/last-throughput.log" | sed 's/^/horovod /' | tee -a "$OUT/throughput.txt"
  fi
fi
step "done$( [ $failed = 0 ] || echo ', with failures (!!! above)')"
exit $failed
