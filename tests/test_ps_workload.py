"""resnet.py --engine ps on GPU nodes: a parameter server never takes a GPU.

The engine's training itself (workers' losses equal to DDP's, each server's shard of the
bytes, one and two servers, --ps-overlap on and off) is run under torchrun in
test_workloads.py. What is checked here needs no GPU and no process group: which device each
local rank asks for. scalelab's ps_commands runs a colocated node's server after its one worker
per GPU, as local rank GPUs, which has no GPU of its own; had the server asked for one,
resolve_device would have refused the run (and on a dedicated server node with a GPU, it would
have held a CUDA context it never uses)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

WORKLOADS = Path(__file__).resolve().parents[1] / "bench" / "workloads"


@pytest.fixture(scope="module")
def resnet():
    """bench/workloads/resnet.py as a module, its siblings' names off sys.path and sys.modules
    again afterwards (resnet.py keeps its own references to them)."""
    saved_path = list(sys.path)
    before = set(sys.modules)
    try:
        spec = importlib.util.spec_from_file_location("_scalelab_wl_resnet_ps", WORKLOADS / "resnet.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - before:
            if (getattr(sys.modules[name], "__file__", None) or "").startswith(str(WORKLOADS)):
                del sys.modules[name]


class Asked(Exception):
    """Raised by the stand-in resolve_device: set_up goes no further (no process group)."""


@pytest.fixture
def asked(resnet, monkeypatch):
    """The (device, local rank) pairs set_up asks resolve_device for; it stops there."""
    calls = []

    def resolve_device(requested, local_rank):
        calls.append((requested, local_rank))
        raise Asked

    monkeypatch.setattr(resnet.common, "resolve_device", resolve_device)
    return calls


@pytest.mark.parametrize("local_rank, local_world, servers_here, device", [
    (0, 3, 1, "cuda"),  # workers: the GPU asked for
    (1, 3, 1, "cuda"),
    (2, 3, 1, "cpu"),  # the node's server, after its workers: on the host
    (0, 1, 1, "cpu"),  # a dedicated server node's one process
    (1, 4, 2, "cuda"),
    (2, 4, 2, "cpu"),
    (3, 4, 2, "cpu"),
    (0, 2, 0, "cuda"),  # no server on this node
])
def test_a_parameter_server_asks_for_the_host_and_a_worker_for_its_gpu(
        resnet, asked, monkeypatch, local_rank, local_world, servers_here, device):
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    a = resnet.parse_args(["--model", "resnet20", "--device", "cuda", "--engine", "ps",
                           "--ps-servers-here", str(servers_here)])
    with pytest.raises(Asked):
        resnet.set_up(a)
    assert asked == [(device, local_rank)]


def test_ddp_ranks_ask_for_their_gpu_whatever_the_node_runs(resnet, asked, monkeypatch):
    """Only --engine ps has servers: a DDP rank's device is as before."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(Asked):
        resnet.set_up(resnet.parse_args(["--model", "resnet20", "--device", "cuda"]))
    assert asked == [("cuda", 1)]
