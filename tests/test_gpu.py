"""The GPU path (CUDA, NCCL, AMP, channels_last): opt-in, runs only where torch sees a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device here; run on a GPU machine "
                                       "(bench/perf/gpu_resnet50.sh measures throughput)")


def run_resnet(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "bench/workloads/resnet.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if "SCALELAB_RESULT " in x)
    return json.loads(line.split("SCALELAB_RESULT ", 1)[1])


def test_resnet50_amp_channels_last_runs_on_the_gpu():
    r = run_resnet("--model", "resnet50", "--precision", "amp", "--channels-last",
                   "--batch-size", "64", "--warmup", "3", "--steps", "5", "--device", "cuda")
    assert r["env"]["gpu_model"]
    assert r["gradient_bytes"] == 25_557_032 * 2  # fp16 gradients under amp
    assert r["images_per_sec"] > 50


def test_two_rank_ddp_over_nccl():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs for NCCL between ranks")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "bench/workloads/resnet.py", "--model",
                           "resnet18", "--batch-size", "32", "--steps", "5", "--warmup", "2",
                           "--backend", "nccl"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"world_size": 2' in proc.stdout


def test_a_gpu_profile_is_measured_with_cuda_events_and_emulates_that_gpu(tmp_path):
    """invoke profile on the GPU, then an emulated rank on the host computes for as long."""
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "-m", "invoke", "profile", "--model", "resnet50",
                           "--batch-size", "64", "--precision", "amp", "--device", "cuda",
                           "--steps", "10", "--output", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["source"] == "measured" and doc["device"] == torch.cuda.get_device_name()
    step = sum(x["fwd_s"] + x["bwd_s"] for x in doc["layers"]) + doc["optimizer_s"]
    assert 64 / step > 300  # any training GPU of the last years does ResNet-50 amp faster
    r = run_resnet("--model", "resnet50", "--precision", "amp", "--batch-size", "64",
                   "--profile", str(out), "--warmup", "2", "--steps", "5")
    assert r["ranks"][0]["compute_time_mean_s"] == pytest.approx(step, rel=0.05)
