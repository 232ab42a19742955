"""The GPU path (CUDA, NCCL, AMP, bf16, TF32, channels_last): opt-in, runs only where torch sees a GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

SKIP_REASON = ("no CUDA device here; run with: invoke test --gpu on a machine with an NVIDIA GPU and a "
               "CUDA build of torch (bench/perf/gpu_resnet50.sh measures throughput)")

torch = pytest.importorskip("torch", reason=SKIP_REASON)
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason=SKIP_REASON)


def parse_result(stdout: str) -> dict:
    """The one SCALELAB_RESULT line (compact JSON: search the parsed result, not the text)."""
    lines = [x for x in stdout.splitlines() if "SCALELAB_RESULT " in x]
    assert len(lines) == 1, f"expected exactly one result line, got {len(lines)}:\n{stdout[-2000:]}"
    return json.loads(lines[0].split("SCALELAB_RESULT ", 1)[1])


def run_resnet(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "bench/workloads/resnet.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return parse_result(proc.stdout)


def small_cuda_run(precision: str) -> dict:
    return run_resnet("--model", "resnet20", "--precision", precision, "--batch-size", "32",
                      "--warmup", "1", "--steps", "2", "--device", "cuda")


def test_resnet50_amp_channels_last_runs_on_the_gpu():
    r = run_resnet("--model", "resnet50", "--precision", "amp", "--channels-last",
                   "--batch-size", "64", "--warmup", "3", "--steps", "5", "--device", "cuda")
    assert r["env"]["gpu_model"]
    assert r["device"] == "cuda" and r["backend"] == "nccl" and r["channels_last"] is True
    rank = r["ranks"][0]
    assert rank["device"] == "cuda:0"
    assert rank["device_name"] == torch.cuda.get_device_name()
    assert rank["gpu_mem_peak_mb"] > 0
    assert r["gradient_bytes"] == 25_557_032 * 2  # fp16 gradients under amp
    assert r["comm_dtype"] == "float16"
    assert r["images_per_sec"] > 50  # far above any CPU: the run was on the GPU


def test_fp32_is_true_fp32_and_tf32_says_so():
    """cuDNN convolutions default to TF32 on Ampere and later: fp32 must switch it off."""
    fp32 = small_cuda_run("fp32")
    assert fp32["precision"] == "fp32" and fp32["tf32"] is False
    tf32 = small_cuda_run("tf32")
    assert tf32["precision"] == "tf32" and tf32["tf32"] is True
    for r in (fp32, tf32):
        assert r["comm_dtype"] == "float32" and r["gradient_bytes"] == 4 * 269_722


def test_bf16_autocasts_and_communicates_bfloat16():
    r = small_cuda_run("bf16")
    assert r["precision"] == "bf16" and r["device"] == "cuda"
    assert r["comm_dtype"] == "bfloat16" and r["gradient_bytes"] == 2 * 269_722
    assert r["ranks"][0]["device"].startswith("cuda") and r["ranks"][0]["gpu_mem_peak_mb"] > 0


def test_two_rank_ddp_over_nccl():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs for NCCL between ranks")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "bench/workloads/resnet.py", "--model",
                           "resnet18", "--batch-size", "32", "--steps", "5", "--warmup", "2",
                           "--backend", "nccl"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = parse_result(proc.stdout)
    assert r["world_size"] == 2 and r["backend"] == "nccl" and r["device"] == "cuda"
    devices = [rank["device"] for rank in r["ranks"]]
    assert all(d.startswith("cuda") for d in devices), devices
    assert devices == ["cuda:0", "cuda:1"]  # one GPU per local rank, never shared


def test_a_gpu_profile_is_measured_with_cuda_events_and_emulates_that_gpu(tmp_path):
    """invoke profile on the GPU, then an emulated rank on the host computes for as long."""
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "-m", "invoke", "profile", "--model", "resnet50",
                           "--batch-size", "256", "--precision", "amp", "--device", "cuda",
                           "--channels-last", "--steps", "10", "--output", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["source"] == "measured" and doc["device"] == torch.cuda.get_device_name()
    assert doc["memory_format"] == "channels_last" and "channels_last" in doc["provenance"]
    step = sum(x["fwd_s"] + x["bwd_s"] for x in doc["layers"]) + doc["optimizer_s"]
    assert 256 / step > 300  # any training GPU of the last years does ResNet-50 amp faster
    # at batch 256 (about 11 GiB of GPU memory), the batch the shipped profiles are for: the
    # first H100 run emulated an NCHW profile at batch 64 undilated and ran 11 % over it (a
    # sweep's fidelity guard flags that and its auto dilation absorbs it; undilated, this
    # direct run has neither)
    r = run_resnet("--model", "resnet50", "--precision", "amp", "--batch-size", "256",
                   "--profile", str(out), "--warmup", "2", "--steps", "5")
    assert r["ranks"][0]["compute_time_mean_s"] == pytest.approx(step, rel=0.05)


GPU_IMAGE = os.environ.get("SCALELAB_GPU_IMAGE", "")


@pytest.mark.skipif(not (GPU_IMAGE and shutil.which("docker")),
                    reason="opt-in: SCALELAB_GPU_IMAGE=<an archive invoke image --base wrote on a "
                           "CUDA base, e.g. docker-archive:ngc-pytorch.tar> and a Docker engine "
                           "with the NVIDIA container toolkit")
def test_a_rank_in_the_training_image_trains_on_the_gpu():
    """The GPU container path as bench starts it: the image loaded from its archive, nvidia-smi
    inside a container lists this machine's GPUs, and one rank, started by the docker argv
    bench builds (scalelab.run.containers, GPUs passed through), trains on CUDA; its container
    is gone afterwards."""
    from scalelab.cluster import image as images
    from scalelab.run import containers

    meta = images.read_meta(Path(GPU_IMAGE))
    subprocess.run(["docker", "load", "-i", GPU_IMAGE], check=True, capture_output=True,
                   timeout=1800)
    smi = subprocess.run(["docker", "run", "--rm", "--gpus", "all", meta["tag"], "nvidia-smi",
                          "-L"], capture_output=True, text=True, timeout=300)
    assert smi.returncode == 0 and smi.stdout.count("GPU ") == torch.cuda.device_count(), \
        smi.stdout + smi.stderr
    mark = "0123abcd@gpu-test"
    spec = containers.Spec(meta["tag"], meta["id"], gpus=True)
    argv = containers.docker_argv(spec, [
        f"{images.PREFIX}/venv/bin/python", "bench/workloads/resnet.py", "--model", "resnet20",
        "--precision", "amp", "--batch-size", "32", "--warmup", "1", "--steps", "3",
        "--device", "cuda"], [], mark, 0, spec.workdir)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "SCALELAB_LAUNCH": mark})
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = parse_result(proc.stdout)
    assert r["device"] == "cuda" and r["ranks"][0]["device"].startswith("cuda")
    assert r["ranks"][0]["gpu_mem_peak_mb"] > 0
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={containers.LABEL}={mark}"],
                          capture_output=True, text=True, timeout=60).stdout
    assert left.strip() == ""
