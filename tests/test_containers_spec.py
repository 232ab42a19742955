"""The `docker run` line a rank becomes under --runtime container, without an engine: GPUs
passed through only where the run trains on them, the RDMA devices only where its fabric is
rdma, a data set bound in read-only only where the run reads one; and every flag before the
image, where docker (not the rank) reads it. (tests/test_containers.py runs real engines.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scalelab.cluster.nodes import Node
from scalelab.run import commands, containers, driver, launch

IMAGE = containers.Spec("scalelab/train:0123456789abcdef", "sha256:" + "1" * 64)
PY = "/opt/scalelab/venv/bin/python"


def _argv(spec: containers.Spec, data: str = "synthetic") -> list[str]:
    rank = [PY, "/opt/scalelab/bench/workloads/resnet.py", "--model", "resnet20",
            "--data", data]
    return containers.docker_argv(spec, rank, ["RANK", "SCALELAB_LAUNCH"], "ab12@n1", 0,
                                  spec.workdir)


def _flags(argv: list[str]) -> list[str]:
    """What docker itself reads: everything before the image."""
    assert argv.count(IMAGE.image) == 1, argv
    return argv[:argv.index(IMAGE.image)]


def _has(flags: list[str], *seq: str) -> bool:
    return any(flags[i:i + len(seq)] == list(seq) for i in range(len(flags)))


@pytest.mark.parametrize("gpus", [True, False])
def test_gpus_passed_through_only_for_gpu_runs(gpus):
    argv = _argv(containers.Spec(IMAGE.image, IMAGE.image_id, gpus=gpus))
    assert _has(_flags(argv), "--gpus", "all") is gpus
    assert ("--gpus" in argv) is gpus


RDMA = (("--device", "/dev/infiniband"), ("--cap-add", "IPC_LOCK"),
        ("--ulimit", "memlock=-1:-1"))


@pytest.mark.parametrize("rdma", [True, False])
def test_rdma_devices_only_for_rdma_fabric(rdma):
    argv = _argv(containers.Spec(IMAGE.image, IMAGE.image_id, rdma=rdma))
    for pair in RDMA:
        assert _has(_flags(argv), *pair) is rdma, (pair, argv)
    assert ("/dev/infiniband" in argv) is rdma


def test_data_set_bound_read_only_at_the_same_path():
    argv = _argv(IMAGE, data="/srv/imagenet")
    flags = _flags(argv)
    assert _has(flags, "-v", "/srv/imagenet:/srv/imagenet:ro")
    assert flags.count("-v") == 1  # the data set once, nothing else
    assert argv[-2:] == ["--data", "/srv/imagenet"]  # the rank still reads it where it was


def test_synthetic_data_binds_nothing():
    flags = _flags(_argv(IMAGE))
    assert "-v" not in flags and "--mount" not in flags


def test_gpus_rdma_and_data_together():
    flags = _flags(_argv(containers.Spec(IMAGE.image, IMAGE.image_id, gpus=True, rdma=True),
                         data="/nfs/imagenet"))
    assert _has(flags, "--gpus", "all")
    assert all(_has(flags, *pair) for pair in RDMA)
    assert _has(flags, "-v", "/nfs/imagenet:/nfs/imagenet:ro")


# ---- the launcher: the run's device and fabric decide the Spec, its params the data bind

def _launched(monkeypatch, device: str, fabric: str, data: str) -> list[list[str]]:
    seen: list[commands.RankCommand] = []

    def fake_run(cmds, rt, **kw):
        seen.extend(cmds)
        return launch.LaunchResult("ok", None, "", [], 0.0)

    monkeypatch.setattr(launch, "run", fake_run)
    nodes = [Node(f"c-n{i}", f"10.0.0.1{i}", f"10.0.0.1{i}", "head" if i == 0 else "worker",
                  "static", cpus=8.0, gpus=1 if device == "cuda" else 0, iface="eth0")
             for i in range(2)]
    rt = launch.Runtime("/v/bin/python", "/w", "/kh")
    starter = driver.Launcher("ssh", nodes[0], rt, emulated=False, container=IMAGE)
    params = {"model": "resnet20", "batch_size": 16, "precision": "fp32", "steps": 5,
              "warmup": 1, "engine": "ddp", "image_size": None, "data": data,
              "device": device, "fabric": fabric, "procs_per_node": 1}
    run = SimpleNamespace(run_id="r", kind="train", params=params)
    starter.run(run, "ddp", nodes, "bench/workloads/resnet.py", commands.workload_args(params),
                29500, 60.0, None, None)
    assert seen and all(c.container is not None for c in seen)
    return [_flags(containers.docker_argv(c.container, c.argv, sorted(c.env), "ab12@n1", i,
                                          c.container.workdir)) for i, c in enumerate(seen)]


def test_launcher_gpu_rdma_run_with_a_data_set(monkeypatch):
    for flags in _launched(monkeypatch, "cuda", "rdma", "/srv/imagenet"):
        assert _has(flags, "--gpus", "all")
        assert all(_has(flags, *pair) for pair in RDMA)
        assert _has(flags, "-v", "/srv/imagenet:/srv/imagenet:ro")


def test_launcher_cpu_tcp_synthetic_run(monkeypatch):
    for flags in _launched(monkeypatch, "cpu", "tcp", "synthetic"):
        assert "--gpus" not in flags and "/dev/infiniband" not in flags
        assert "-v" not in flags


def test_the_slurm_oci_bundle_names_the_images_python_and_the_profiles_rank_read():
    """The docker_nvidia role writes paths inside the image into Slurm's OCI bundle: its venv's
    python (checked there) and the bind of the profiles directory the emulated ranks read.
    Both are where the image and the driver put them, so a move of either fails here, not in a
    Slurm container on a cluster."""
    from pathlib import Path

    import yaml

    from scalelab.cluster import image
    from scalelab.model import accel

    role = Path(__file__).resolve().parents[1] / "playbooks" / "roles" / "docker_nvidia"
    oci = (role / "tasks" / "oci.yml").read_text()
    assert f'{{{{ docker_nvidia_oci_bundle }}}}/rootfs{image.PYTHON}"' in oci
    profiles = yaml.safe_load((role / "vars" / "main.yml").read_text())[
        "docker_nvidia_oci_profiles"]
    assert profiles == ("{{ scalelab_workdir | default('" + image.PREFIX + "') }}"
                        f"/bench/workloads/{accel.STAGE_DIR}")
