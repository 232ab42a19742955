"""Checkpoints of the training workload (bench/workloads/ckpt.py) under torchrun on this host:
PyTorch Distributed Checkpoint files a fresh model loads, written between the ranks or by each
node, sync or async, only the last kept, and the figures of each checkpoint in the result."""

from __future__ import annotations

import os
import shutil
import socket

import pytest
from test_workloads import _losses, load_workload, torchrun

COMMON = ("--model", "resnet20", "--batch-size", "8", "--steps", "6", "--warmup", "1",
          "--device", "cpu")


@pytest.mark.parametrize("mode, place", [("sync", "shared"), ("async", "nodes")])
def test_a_run_saves_every_n_steps_keeps_the_last_and_trains_as_without(mode, place, tmp_path):
    """Two ranks, a checkpoint every 2 of 6 timed steps: three checkpoints after steps 3, 5
    and 7 (the warm-up step counts), each the model's weights and the optimizer's momentum;
    the losses are those of a run without checkpoints; only the last checkpoint is left, and a
    fresh model loads it."""
    import torch
    import torch.distributed.checkpoint as dcp

    plain = torchrun(2, "resnet.py", *COMMON)
    res = torchrun(2, "resnet.py", *COMMON, "--checkpoint-every", "2", "--checkpoint-mode",
                   mode, "--checkpoint-place", place, "--checkpoint-dir", str(tmp_path / "ck"))
    assert _losses(res) == pytest.approx(_losses(plain), rel=1e-6)
    ck = res["checkpoint"]
    assert (ck["every"], ck["mode"], ck["place"]) == (2, mode, place)
    assert [s["step"] for s in ck["saved"]] == [3, 5, 7]
    # weights and momentum: twice the parameters' bytes, and the batch norms' buffers and
    # DCP's header of each tensor (about 1 KB: 13 % of ResNet-20's 0.27 M parameters)
    params = res["num_params"] * 4
    for s in ck["saved"]:
        assert 2 * params <= s["bytes"] <= 2.4 * params, s
        assert s["blocked_s"] > 0
        assert (s["background_s"] is not None) == (mode == "async")
    roles = sorted(r["checkpoint"]["role"] for r in res["ranks"])
    # shared: both ranks write a share (DCP gives each replicated tensor to one rank); nodes:
    # the node's first rank writes all of it
    assert roles == (["share", "share"] if place == "shared" else ["all", "none"])
    if place == "shared":
        assert all(s["bytes"] > 0 for r in res["ranks"] for s in r["checkpoint"]["saved"])
    left = sorted(os.listdir(tmp_path / "ck"))
    assert left == ["step-000007"]
    where = tmp_path / "ck" / "step-000007"
    if place == "nodes":
        where = where / socket.gethostname()
    # what a fresh rank would load into: an untrained model, a zero momentum per parameter
    model = load_workload("models").build_model("resnet20", res["num_classes"])
    state = load_workload("ckpt").state_of(model, None, list(model.named_parameters()))()
    before = {k: v.clone() for k, v in state["model"].items()}
    dcp.load(state, checkpoint_id=str(where), no_dist=True)
    changed = [k for k, v in state["model"].items()
               if v.dtype.is_floating_point and not torch.equal(v, before[k])]
    assert changed, "the checkpoint held the untrained weights"
    assert any(v.abs().sum() > 0 for v in state["optim"].values()), "no momentum saved"


def test_horovods_rank_0_writes_a_shared_checkpoint_alone(tmp_path):
    """Horovod's ranks are no torch.distributed group: on a shared place rank 0 writes the
    whole state in DCP's files, the other rank nothing, and the last checkpoint is left."""
    from test_workloads import BIN, PY, WORKLOADS, _horovod_missing, parse_result, run_cmd

    if _horovod_missing():
        pytest.skip(_horovod_missing())
    horovodrun = shutil.which("horovodrun", path=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    proc = run_cmd([horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", "--network-interface",
                    "lo", PY, str(WORKLOADS / "resnet.py"), "--engine", "horovod", *COMMON,
                    "--threads", "1", "--checkpoint-every", "3", "--checkpoint-place", "shared",
                    "--checkpoint-dir", str(tmp_path / "ck")], timeout=180)
    res = parse_result(proc.stdout)
    roles = {r["rank"]: r["checkpoint"]["role"] for r in res["ranks"]}
    assert roles == {0: "all", 1: "none"}
    saved = res["checkpoint"]["saved"]
    assert [s["step"] for s in saved] == [4, 7]
    for s in saved:
        assert 2 * res["num_params"] * 4 <= s["bytes"] <= 2.4 * res["num_params"] * 4, s
    assert sorted(os.listdir(tmp_path / "ck")) == ["step-000007"]
    assert (tmp_path / "ck" / "step-000007" / socket.gethostname() / ".metadata").is_file()
