"""Emulated accelerators: device profiles (measured, derived, shipped), emulated ranks whose
compute follows the profile at 1 and 8 ranks, with DDP and Horovod, and the overlap model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from scalelab.core.errors import InputError
from scalelab.model import accel, bucket_model
from scalelab.run.launch import parse_result

WORKLOADS = ROOT / "bench" / "workloads"
PY = sys.executable


def result_of(stdout: str) -> dict:
    res = parse_result(stdout)  # as the driver reads it (horovodrun prefixes rank tags)
    assert res is not None, stdout[-2000:]
    return res


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    """A profile measured here by the profiler, for resnet20 at batch 16."""
    out = tmp_path_factory.mktemp("prof") / "r20.json"
    proc = subprocess.run([PY, str(WORKLOADS / "devprofile.py"), "--model", "resnet20",
                           "--batch-size", "16", "--steps", "2", "--warmup", "1", "--threads", "1",
                           "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def paced(doc: dict, step_s: float, path: Path) -> Path:
    """The profile with its split kept and its step set to step_s."""
    f = (step_s - doc["optimizer_s"]) / sum(x["fwd_s"] + x["bwd_s"] for x in doc["layers"])
    out = {**doc, "layers": [{**x, "fwd_s": x["fwd_s"] * f, "bwd_s": x["bwd_s"] * f}
                             for x in doc["layers"]]}
    path.write_text(json.dumps(out))
    return path


def test_the_profiler_times_every_layer_of_the_model(measured):
    sys.path.insert(0, str(WORKLOADS))
    import models

    names = [n for n, _ in models.build_model("resnet20").named_parameters()]
    layered = [p for x in measured["layers"] for p in x["params"]]
    assert sorted(layered) == sorted(names)
    assert sum(x["numel"] for x in measured["layers"]) == models.REGISTRY["resnet20"]["params"]
    # forward runs the layers in order: the stem first, the classifier last
    assert measured["layers"][0]["name"] == "conv1" and measured["layers"][-1]["name"] == "fc"
    assert all(x["fwd_s"] > 0 and x["bwd_s"] > 0 for x in measured["layers"])
    assert measured["source"] == "measured" and "devprofile.py" in measured["provenance"]


def test_a_profile_records_the_memory_layout_it_timed(measured, tmp_path):
    """On tensor cores NHWC and NCHW differ by 1.7x (an H100 timed 4,701 and 2,666 img/s with
    amp): a profile says which it timed, in its memory_format and its provenance."""
    assert measured["memory_format"] == "contiguous"
    out = tmp_path / "nhwc.json"
    proc = subprocess.run([PY, "-m", "invoke", "profile", "--model", "resnet20", "--batch-size",
                           "4", "--steps", "1", "--device", "cpu", "--channels-last",
                           "--output", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["memory_format"] == "channels_last" and ", channels_last," in doc["provenance"]


def _emulate(profile: Path, *extra: str, nproc: int = 1, engine: str = "ddp",
             steps: int = 5) -> dict:
    args = [str(WORKLOADS / "resnet.py"), "--model", "resnet20", "--batch-size", "16",
            "--profile", str(profile), "--steps", str(steps), "--warmup", "2", "--engine", engine,
            *extra]
    if engine == "horovod":
        argv = [str(Path(PY).with_name("horovodrun")), "--gloo", "-np", str(nproc), "-H",
                f"localhost:{nproc}", PY, *args]
    elif nproc > 1:
        argv = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                *args]
    else:
        argv = [PY, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return result_of(proc.stdout)


@pytest.mark.slow
def test_an_emulated_rank_computes_for_as_long_as_its_profile_says(measured, tmp_path):
    prof = paced(measured, 0.25, tmp_path / "p.json")
    res = _emulate(prof)
    rank = res["ranks"][0]
    assert res["accelerator"]["profile_step_s"] == pytest.approx(0.25)
    assert rank["compute_time_mean_s"] == pytest.approx(0.25, rel=0.05)
    assert rank["images_per_sec"] == pytest.approx(16 / rank["step_time_mean_s"], rel=0.05)
    # sleeping, not spinning: a spinning rank would keep one of the host's cores busy for
    # its whole 0.25 s "compute"; a sleeping one leaves the host mostly idle
    assert rank["host_cpu_idle"] > 0.25, rank["host_cpu_idle"]


@pytest.mark.slow
def test_dilation_stretches_the_waits_and_reports_device_time(measured, tmp_path):
    import time

    prof = paced(measured, 0.1, tmp_path / "p.json")
    t = time.monotonic()
    res = _emulate(prof, "--dilation", "4", steps=4)
    rank = res["ranks"][0]
    assert res["dilation"] == 4.0
    # reported in the device's time ...
    assert rank["compute_time_mean_s"] == pytest.approx(0.1, rel=0.05)
    # ... while each step took 4 x as long on the wall clock
    assert rank["timed_wall_s"] == pytest.approx(4 * sum(rank["step_times_s"]), rel=0.1)
    assert time.monotonic() - t > 6 * 0.4


@pytest.mark.slow
def test_waits_do_not_stretch_with_eight_ranks_on_two_cores(measured, tmp_path):
    prof = paced(measured, 0.25, tmp_path / "p.json")
    res = _emulate(prof, nproc=8, steps=4)
    assert res["world_size"] == 8
    computes = [r["compute_time_mean_s"] for r in res["ranks"]]
    assert all(c == pytest.approx(0.25, rel=0.05) for c in computes), computes


@pytest.mark.slow
def test_horovod_emulated_ranks_follow_the_profile(measured, tmp_path):
    import horovod.torch  # noqa: F401  (bootstrap builds it; a broken build fails here)
    prof = paced(measured, 0.25, tmp_path / "p.json")
    res = _emulate(prof, nproc=2, engine="horovod", steps=4)
    assert res["engine"] == "horovod" and res["world_size"] == 2
    for r in res["ranks"]:
        assert r["compute_time_mean_s"] == pytest.approx(0.25, rel=0.05)


MEASURED_ON = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}


def test_shipped_profiles_are_fresh_valid_and_say_where_they_come_from():
    proc = subprocess.run([PY, str(ROOT / "scripts" / "derive_profiles.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert {"v100", "a100", "h100"} <= set(accel.names())
    for (gpu, model, precision), path in accel.shipped().items():
        doc = accel.load(path)
        assert (doc["model"], doc["precision"]) == (model, precision)
        if gpu in MEASURED_ON:  # measured on a lent GPU by bench/perf/gpu_session.sh
            assert doc["source"] == "measured" and doc["device"] == MEASURED_ON[gpu]
            assert "devprofile.py" in doc["provenance"] and "gpu_session.sh" in doc["provenance"]
            assert doc["memory_format"] == "channels_last" and "TF32 on" in doc["provenance"]
        else:
            assert doc["source"] == "derived" and "img/s" in doc["provenance"]
    # the H100 profiles give back what the same H100 trained at (channels_last, batch 256):
    # 4,507 img/s with amp and 2,448 in TF32 (bench/perf/gpu_resnet50.sh); the profile's
    # per-layer timing leaves out the input copy and the loss, so it reads a little faster
    # and the H200's amp profile what that H200 trained at, 5,567 img/s (docs/dev/gpu-runs)
    for gpu, precision, trained in (("h100", "amp", 4507), ("h100", "fp32", 2448), ("h200", "amp", 5567)):
        prof = accel.load(accel.shipped()[(gpu, "resnet50", precision)])
        assert prof["batch_size"] / accel.step_s(prof) == pytest.approx(trained, rel=0.05)
    # the published figure is what the profile gives back: V100 fp32 ResNet-50, 367 img/s
    v100 = accel.load(accel.shipped()[("v100", "resnet50", "fp32")])
    assert v100["batch_size"] / accel.step_s(v100) == pytest.approx(367, rel=1e-3)


def test_a_profile_scales_to_the_batch_size_and_says_so():
    doc = accel.resolve("v100", "resnet50", "fp32", 56, 224)
    full = accel.load(accel.shipped()[("v100", "resnet50", "fp32")])
    assert doc["batch_size"] == 56
    fb = sum(x["fwd_s"] + x["bwd_s"] for x in doc["layers"])
    assert fb == pytest.approx(sum(x["fwd_s"] + x["bwd_s"] for x in full["layers"]) / 2)
    assert doc["optimizer_s"] == full["optimizer_s"]
    assert "scaled from batch 112 to 56" in doc["provenance"]
    # a changed profile is staged under a new name on the nodes
    assert accel.staged_path(doc) != accel.staged_path(full)


def test_a_profile_for_another_precision_or_input_is_refused():
    with pytest.raises(InputError, match="image_size 224, the sweep's is 112"):
        accel.resolve("v100", "resnet50", "fp32", 32, 112)
    with pytest.raises(InputError, match="no a100 profile for resnet18 fp32"):
        accel.resolve("a100", "resnet18", "fp32", 32, 224)


def _toy(bwd: list[float], numel: list[int]) -> dict:
    return {"optimizer_s": 0.0, "layers": [{"fwd_s": 0.0, "bwd_s": b, "numel": n}
                                           for b, n in zip(bwd, numel, strict=True)]}


def test_the_overlap_model_hides_communication_behind_backward():
    # backward: the last layer (4 MB of gradient) is ready after 0.1 s, then 0.9 s of backward
    # follow while its allreduce runs: hidden at 10 Gbit/s, not at 100 Mbit/s
    doc = _toy([0.9, 0.1], [1_000, 1_000_000])
    fast = bucket_model.predict_step_s(doc, "ddp", 2, 10_000.0, alpha_s=0)
    assert fast == pytest.approx(1.0, abs=1e-3)
    slow = bucket_model.predict_step_s(doc, "ddp", 2, 100.0, alpha_s=0)
    # 4 MB at 100 Mbit/s: 0.32 s from 0.1 s, then the first layer's 4 KB after 1.0 s
    assert slow == pytest.approx(1.0 + 4_000 * 8 / 100e6, abs=1e-3)
    # the additive model would say 1.0 + 0.32
    assert slow < 1.0 + 4_004_000 * 8 / 100e6


def test_horovod_fuses_what_is_ready_when_it_is_free():
    doc = _toy([0.01] * 10, [1_000_000] * 10)  # 10 x 4 MB, one every 10 ms
    ddp = bucket_model.predict_step_s(doc, "ddp", 4, 1000.0, alpha_s=1e-3)
    hvd = bucket_model.predict_step_s(doc, "horovod", 4, 1000.0, alpha_s=1e-3)
    # the link dominates either way: 40 MB x 1.5 at 1 Gbit/s = 0.48 s at least
    assert ddp > 0.48 and hvd > 0.48
    # Horovod fuses, so it pays the per-hop latency fewer times than tensor by tensor would
    singles = sum(bucket_model.analysis.ring_allreduce_time_s(4, 4_000_000, 1000.0, 1e-3)
                  for _ in range(10))
    assert hvd < 0.01 + singles


def test_a_gpu_side_cost_must_be_a_stretch_with_its_source():
    from scalelab.model import accel, bucket_model

    doc = accel.resolve("v100", "resnet50", "fp32", 32, 224)
    for bad, why in (({"gpu_side_stretch": 0.9, "gpu_side_source": "x"}, "must be a number >= 1"),
                     ({"gpu_side_stretch": 1.1}, "needs gpu_side_source")):
        with pytest.raises(accel.emulate.ProfileError, match=why):
            accel.emulate.check({**doc, **bad})
    # the model takes it as the ranks do: alone as is, with peers stretched
    stretched = {**doc, "gpu_side_stretch": 1.2, "gpu_side_source": "x"}
    alone = bucket_model.predict_step_s(doc, "ddp", 1, float("inf"))
    assert bucket_model.predict_step_s(stretched, "ddp", 1, float("inf")) == pytest.approx(alone)
    fast = 1e9  # a link so fast that only compute counts
    assert bucket_model.predict_step_s(stretched, "ddp", 4, fast, alpha_s=0) == pytest.approx(
        1.2 * bucket_model.predict_step_s(doc, "ddp", 4, fast, alpha_s=0), rel=1e-3)
