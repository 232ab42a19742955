"""The dilation k an emulated sweep runs at counts every process that takes the host's cores:
a parameter server beside its worker copies the gradients as a second rank of the node does."""

from __future__ import annotations

import pytest

from scalelab.cluster.nodes import Node
from scalelab.run import emulation
from scalelab.run.emulation import Emulation
from scalelab.sweep.planner import RunPlan


@pytest.fixture(autouse=True)
def _memory(monkeypatch):
    """One memory pass speed for every k here (the host's, timed, would vary between calls):
    10 GB/s."""
    monkeypatch.setattr(emulation, "memory_pass_s_per_byte", lambda: 1e-10)


def _k(engine: str, ppn: int, nodes: int = 1, **ps: object) -> float:
    params = {"accelerator": "v100", "model": "resnet50", "precision": "fp32",
              "batch_size": 32, "image_size": 224, "bandwidth_mbit": None, "nodes": nodes,
              "procs_per_node": ppn, "engine": engine, **ps}
    run = RunPlan("train", "r0", params, tuple(f"n{i}" for i in range(nodes)), 60.0)
    cluster = [Node(f"n{i}", f"10.9.0.{i + 1}", f"10.9.0.{i + 1}", "head" if i == 0 else
                    "worker", "local", cpus=1.0) for i in range(4)]
    emu = Emulation([run], cluster, "", "/w", shared_host=True, calibrate=lambda: None,
                    host_cpus=2)
    return emu.dilation(run)


def test_a_colocated_parameter_server_counts_as_the_second_rank_of_its_node():
    ring = _k("ddp", 2)
    assert _k("ps", 1, ps_placement="colocated", ps_servers=None) == ring
    # one rank alone copies less: this is what the server's copies add
    assert _k("ddp", 1) < ring
