"""GPU nodes measured for what they are, tested here without a GPU.

The refusals are what a user with a GPU testbed would meet first: a node with GPUs whose torch
cannot use them, Horovod without NCCL, more processes than GPUs torch sees, --device cuda on a
node without any, and a shaped rate on an RDMA fabric. The facts come from a real SSH probe of
an emulated node on which the test places stand-ins for nvidia-smi and /sys/class/infiniband
(a real GPU host's answers, recorded from nvidia-smi 550 on an 8 x H100 node).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, invoke, needs_root, needs_sshd

from scalelab.cluster import facts, gpu, ssh
from scalelab.cluster.nodes import Node
from scalelab.cluster.targets import Runtime
from scalelab.cluster.targets.local import runtime_paths
from scalelab.core.errors import InputError
from scalelab.run import admission, commands, launch
from scalelab.sweep import sweepfile

CUDA_TORCH = {"version": "2.13.0+cu128", "cuda": "12.8", "cuda_available": True, "devices": 8,
              "nccl": "2.27.3"}
HVD_NCCL = {"version": "0.28.1", "nccl": True, "gloo": True, "mpi": False}
IB = [{"device": "mlx5_0", "port": 1, "rate_gbit": 400.0, "link_layer": "InfiniBand",
       "active": True}]


def gpu_node(i: int = 0, gpus: int = 8, torch_can: dict | None = None, horovod: dict | None = None,
             rdma: list | None = None, iface: str = "ens5") -> Node:
    f = {"torch_can": dict(CUDA_TORCH if torch_can is None else torch_can),
         "horovod_can": dict(HVD_NCCL if horovod is None else horovod),
         "rdma": list(rdma or []), "cuda_driver": "12.4"}
    return Node(f"g{i}", f"10.0.0.{i}", f"10.0.0.{i}", "head" if i == 0 else "worker", "static",
                cpus=64.0, gpus=gpus, iface=iface, facts=f)


def spec(**kw):
    base = {"nodes": "1-2", "batch_size": "32"}
    return sweepfile.spec_from_options(**{**base, **kw})


def test_auto_trains_on_the_gpus_one_rank_per_gpu():
    p = gpu.resolve(spec(), [gpu_node(0), gpu_node(1)], shaped=False)
    assert (p.device, p.fabric, p.procs_per_node) == ("cuda", "tcp", [8])
    # 1 node x 10 GPUs against 10 nodes x 1 GPU stays expressible
    assert gpu.resolve(spec(procs_per_node="1"), [gpu_node(0)], shaped=False).procs_per_node == [1]


def test_a_cpu_build_of_torch_on_gpu_nodes_is_refused():
    cpu_torch = {"version": "2.13.0+cpu", "cuda": None, "cuda_available": False, "devices": 0}
    with pytest.raises(InputError, match=r"node g1 has 8 GPUs \(nvidia-smi\) but its torch "
                                         r"2\.13\.0\+cpu is a CPU build; configure it with a CUDA"):
        gpu.resolve(spec(), [gpu_node(0), gpu_node(1, torch_can=cpu_torch)], shaped=False)


def test_a_cuda_torch_the_driver_cannot_run_is_refused_with_the_versions():
    newer = {**CUDA_TORCH, "cuda_available": False, "devices": 0}
    with pytest.raises(InputError, match="CUDA 12.8.*driver supports CUDA 12.4"):
        gpu.resolve(spec(), [gpu_node(0, torch_can=newer)], shaped=False)


def test_horovod_without_nccl_operations_is_refused_on_gpus():
    gloo_only = {**HVD_NCCL, "nccl": False}
    with pytest.raises(InputError, match="node g0's Horovod 0.28.1 was built without NCCL"):
        gpu.resolve(spec(engine="horovod"), [gpu_node(0, horovod=gloo_only)], shaped=False)
    # DDP does not need Horovod's NCCL
    assert gpu.resolve(spec(), [gpu_node(0, horovod=gloo_only)], shaped=False).device == "cuda"


def test_more_processes_than_gpus_torch_sees_are_refused():
    hidden = {**CUDA_TORCH, "devices": 4}  # CUDA_VISIBLE_DEVICES or MIG hide four
    with pytest.raises(InputError, match="--procs-per-node 8 but torch sees 4 GPUs on node g0 "
                                         r"\(nvidia-smi counts 8"):
        gpu.resolve(spec(procs_per_node="8"), [gpu_node(0, torch_can=hidden)], shaped=False)
    # left to itself, it sweeps the GPUs torch sees, not nvidia-smi's count
    assert gpu.resolve(spec(), [gpu_node(0, torch_can=hidden)], shaped=False).procs_per_node == [4]


def test_device_cuda_on_a_node_without_gpus_is_refused():
    cpu_node = Node("c1", "a", "a", "worker", "static", cpus=8.0)
    with pytest.raises(InputError, match="--device cuda but node c1 has no GPU"):
        gpu.resolve(spec(device="cuda"), [gpu_node(0), cpu_node], shaped=False)


def test_auto_never_falls_back_to_the_cpus_of_gpu_nodes():
    cpu_node = Node("c0", "a", "a", "head", "static", cpus=8.0)
    assert gpu.resolve(spec(), [cpu_node], shaped=False).device == "cpu"
    assert gpu.resolve(spec(), [gpu_node(0)], shaped=False).device == "cuda"
    # asked for outright, the CPUs are what the user gets (and the log says so)
    assert gpu.resolve(spec(device="cpu"), [gpu_node(0)], shaped=False).device == "cpu"


def test_the_fabric_is_tcp_whenever_a_rate_is_shaped_and_rdma_cannot_be():
    ib = [gpu_node(0, rdma=IB), gpu_node(1, rdma=IB)]
    assert gpu.resolve(spec(), ib, shaped=False).fabric == "rdma"
    assert gpu.resolve(spec(bandwidth="10gbit"), ib, shaped=True).fabric == "tcp"
    with pytest.raises(InputError, match="tc shapes the IP interface and RDMA bypasses it"):
        gpu.resolve(spec(fabric="rdma", bandwidth="10gbit"), ib, shaped=True)
    with pytest.raises(InputError, match="node g1 has no active RDMA port"):
        gpu.resolve(spec(fabric="rdma"), [ib[0], gpu_node(1)], shaped=False)


@pytest.mark.parametrize("engine", ["ddp", "horovod"])
def test_a_shaped_launch_keeps_nccl_gloo_and_horovod_on_each_nodes_shaped_interface(engine):
    """Nodes whose cluster interfaces have different names: every rank's NCCL and Gloo are
    given each node's own interface, never RDMA, and NCCL logs its transport."""
    nodes = [gpu_node(0, iface="ens5", rdma=IB), gpu_node(1, iface="enp1s0", rdma=IB)]
    rt = Runtime("/v/bin/python", "/w", "/kh")
    name, cmds = commands.rank_commands(engine, nodes, 8, "resnet.py", [], rt, 29500,
                                      fabric="tcp", device="cuda")
    for cmd in cmds:
        assert cmd.env["NCCL_IB_DISABLE"] == "1" and cmd.env["NCCL_NET"] == "Socket"
        assert cmd.env["NCCL_DEBUG"] == "INFO" and "NET" in cmd.env["NCCL_DEBUG_SUBSYS"]
    if engine == "horovod":
        (cmd,) = cmds
        assert cmd.env["NCCL_SOCKET_IFNAME"] == "ens5,enp1s0"
        assert cmd.env["GLOO_SOCKET_IFNAME"] == "ens5,enp1s0"
        assert cmd.argv[cmd.argv.index("--network-interfaces") + 1] == "ens5,enp1s0"
    else:
        assert [c.env["NCCL_SOCKET_IFNAME"] for c in cmds] == ["ens5", "enp1s0"]
        assert [c.env["GLOO_SOCKET_IFNAME"] for c in cmds] == ["ens5", "enp1s0"]
    _, rdma = commands.rank_commands(engine, nodes, 8, "resnet.py", [], rt, 29500,
                                   fabric="rdma", device="cuda")
    assert all(c.env["NCCL_IB_DISABLE"] == "0" and "NCCL_NET" not in c.env for c in rdma)


def test_the_transport_is_read_from_nccls_own_log():
    socket_log = ("g0:11:11 [0] NCCL INFO NET/Socket : Using [0]ens5:10.0.0.1<0>\n"
                  "g0:11:11 [0] NCCL INFO Using network Socket\n"
                  "g0:11:40 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n")
    assert gpu.transport(socket_log, "nccl") == "nccl-socket+p2p"
    ib_log = ("g0:11:11 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ens5\n"
              "g0:11:11 [0] NCCL INFO Using network IB\n")
    assert gpu.transport(ib_log, "horovod-nccl") == "nccl-ib"


# ----------------------------------------------------------- a stand-in GPU node, probed for real

FAKE_NVIDIA_SMI = textwrap.dedent("""\
    #!/bin/sh
    # stand-in for nvidia-smi 550 on an 8 x H100 SXM node (placed by tests/test_gpu_nodes.py)
    case "$*" in
      *--query-gpu=*)
        for i in 0 1 2 3 4 5 6 7; do
          echo "$i, NVIDIA H100 80GB HBM3, 81559, 550.54.15, 9.0, Disabled"
        done ;;
      "topo -m")
        # the header underlined with terminal escapes, as a real nvidia-smi 580 prints it
        printf '\\033[4m\\tGPU0\\tGPU1\\tNIC0\\tCPU Affinity\\033[0m\\nGPU0\\t X \\tNV18\\tPXB\\t0-55\\n' ;;
      *)
        echo "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4     |" ;;
    esac
""")


@pytest.mark.root
@needs_root
@needs_sshd
def test_a_gpu_node_with_cpu_torch_is_probed_and_refused_before_any_run(local_cluster, tmp_path):
    lc = local_cluster(2)
    nodes = lc.nodes()
    kh = str(lc.known_hosts)
    ib = "/var/lib/scalelab-test-ib"
    for n in nodes:
        # the node's root is its own copy-on-write layer: the host keeps neither file
        ssh.run(n, kh, f"cat > /usr/local/bin/nvidia-smi <<'EOF'\n{FAKE_NVIDIA_SMI}EOF\n"
                       "chmod 755 /usr/local/bin/nvidia-smi", timeout=30)
        # an InfiniBand port where the kernel would list one, over the real /sys/class
        ssh.run(n, kh, f"mkdir -p {ib}/infiniband/mlx5_0/ports/1 && cd {ib}/infiniband/mlx5_0/"
                       "ports/1 && echo '400 Gb/sec (4X NDR)' > rate && echo InfiniBand > "
                       "link_layer && echo '4: ACTIVE' > state && mount -t overlay overlay -o "
                       f"lowerdir={ib}:/sys/class /sys/class", timeout=30)
    python, workdir = runtime_paths()
    found = facts.probe(nodes, kh, python, workdir)
    f = found[nodes[0].name]
    assert f["gpus"] == 8 and f["gpu_model"] == "NVIDIA H100 80GB HBM3"
    assert f["gpu_list"][7] == {"index": 7, "name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559,
                                "driver": "550.54.15", "compute_cap": "9.0", "mig": "Disabled"}
    assert f["cuda_driver"] == "12.4" and "NV18" in f["gpu_topology"]
    assert f["gpu_topology"].startswith("GPU0\tGPU1") and "\x1b" not in f["gpu_topology"]
    assert f["rdma"] == [{"device": "mlx5_0", "port": 1, "rate_gbit": 400.0,
                          "link_layer": "InfiniBand", "active": True}]
    assert f["torch_can"]["cuda_available"] is False and f["torch_can"]["version"]
    assert f["iface"] == "eth0"
    facts.record(lc.name, found)

    proc = invoke("bench", "--cluster", lc.name, "--nodes", "1-2", "--batch-size", "32",
                  "--model", "resnet50", "--dry-run")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "has 8 GPUs (nvidia-smi) but its torch" in lines[0], proc.stderr
    assert "CPU build" in lines[0] and "runs on" not in proc.stdout

    # asked for the CPUs outright, RDMA cannot be had (Gloo is TCP), nor a shaped RDMA rate
    proc = invoke("bench", "--cluster", lc.name, "--nodes", "1-2", "--batch-size", "32",
                  "--device", "cpu", "--fabric", "rdma", "--dry-run")
    assert proc.returncode != 0 and "--fabric rdma needs --device cuda" in proc.stderr
    proc = invoke("bench", "--cluster", lc.name, "--nodes", "1-2", "--batch-size", "32",
                  "--device", "cpu", "--model", "resnet20", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    # measuring the CPUs of GPU nodes is said in the log (README), naming the nodes, and the
    # runs listed train on no GPU
    said = [line for line in proc.stderr.splitlines() if "--device cpu on nodes with GPUs" in line]
    assert len(said) == 1 and "the runs measure their CPUs" in said[0], proc.stderr
    assert all(n.name in said[0] for n in lc.nodes()), said
    assert "train" in proc.stdout and " cuda " not in proc.stdout, proc.stdout
    # the host was left as found
    assert not Path("/usr/local/bin/nvidia-smi").exists()


def test_amp_on_gpus_in_nchw_is_told_of_channels_last():
    """An H100 trained ResNet-50 amp at 2,587 img/s in NCHW, 4,507 in channels_last: a GPU
    sweep that leaves the default layout is told, one that asks for NHWC is not."""
    from scalelab.run.admission import layout_hint
    from scalelab.sweep.planner import plan

    nodes = [gpu_node(0), gpu_node(1)]
    nchw = plan(spec(nodes="1-2", precision="amp"), nodes, can_shape=True)
    assert {r.params["device"] for r in nchw if r.kind == "train"} == {"cuda"}
    assert "--memory-format channels_last" in layout_hint(nchw)
    assert layout_hint(plan(spec(nodes="1-2", precision="amp", memory_format="channels_last"),
                            nodes, can_shape=True)) is None
    assert layout_hint(plan(spec(nodes="1-2", precision="fp32"), nodes, can_shape=True)) is None


def test_a_run_whose_ranks_ran_elsewhere_than_planned_is_recorded_as_failed():
    from scalelab.run import driver
    from scalelab.sweep.planner import plan

    nodes = [gpu_node(0), gpu_node(1)]
    run = next(r for r in plan(spec(nodes="2", procs_per_node="1"), nodes, can_shape=True)
               if r.kind == "train")
    assert run.params["device"] == "cuda"
    on_cpu = {"backend": "gloo", "device": "cpu", "ranks": [
        {"device": "cpu", "device_name": "cpu", "gpu_mem_peak_mb": None, "images_per_sec": 9.0}]}
    res = launch.LaunchResult("ok", on_cpu, "", [], 1.0)
    rec = driver.run_record("s", run, "static", res, "2026-11-25T00:00:00Z", None, None)
    assert rec["status"] == "failed"
    assert rec["error"] == "the run asked for cuda but its ranks ran on cpu"
    assert rec["placement"]["transport"] == "gloo-tcp"


def test_slurm_hands_every_rank_every_nodes_interface():
    from scalelab.run import slurm

    nodes = [gpu_node(0, iface="ens5"), gpu_node(1, iface="enp1s0")]
    rt = Runtime("/v/bin/python", "/w", "/kh")
    (cmd,) = slurm.rank_commands("ddp", nodes, nodes[0], 1, "resnet.py", [], rt, 29500, "j",
                                 None, 60)
    assert cmd.env["NCCL_SOCKET_IFNAME"] == "ens5,enp1s0"
    assert cmd.env["GLOO_SOCKET_IFNAME"] == "ens5,enp1s0"


def test_profile_refuses_cuda_where_there_is_none_and_names_the_device(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: invoke test --gpu profiles it")
    proc = invoke("profile", "--device", "cuda", "--model", "resnet20", "--output",
                  str(tmp_path / "p.json"))
    assert proc.returncode == 1 and not (tmp_path / "p.json").exists()
    assert proc.stderr.strip() == ("error: --device cuda but this machine's torch "
                                   f"{torch.__version__} sees no GPU; run invoke profile on the "
                                   "GPU node (or --device cpu to profile this CPU)")


def test_the_eta_takes_gpu_step_times_only_for_runs_that_train_on_gpus():
    from scalelab.sweep import estimate
    from scalelab.sweep.planner import plan

    nodes = [gpu_node(0), gpu_node(1)]
    on_gpus = plan(spec(procs_per_node="1"), nodes, can_shape=True)
    on_cpus = plan(spec(procs_per_node="1", device="cpu"), nodes, can_shape=True)
    assert admission._device(on_gpus) == "gpu" and admission._device(on_cpus) == "cpu"
    gpu_eta = estimate.estimate_duration_s(on_gpus, device=admission._device(on_gpus))
    cpu_eta = estimate.estimate_duration_s(on_cpus, device=admission._device(on_cpus))
    assert gpu_eta < cpu_eta


@pytest.mark.parametrize("asked, ran, error", [
    ("channels_last", {"precision": "amp", "channels_last": True, "memory_format": "mixed"},
     "the run asked for channels_last but its ranks ran mixed"),
    ("contiguous", {"precision": "fp32", "channels_last": False,
                    "memory_format": "contiguous"},
     "the run asked for amp but its ranks ran fp32"),
])
def test_a_run_whose_ranks_used_another_precision_or_layout_is_failed(asked, ran, error):
    from scalelab.run import driver
    from scalelab.sweep.planner import plan

    nodes = [gpu_node(0), gpu_node(1)]
    run = next(r for r in plan(spec(nodes="2", procs_per_node="1", precision="amp",
                                    memory_format=asked), nodes, can_shape=True)
               if r.kind == "train")
    result = {"backend": "nccl", "device": "cuda", **ran, "ranks": [
        {"device": "cuda:0", "device_name": "H100", "gpu_mem_peak_mb": 1.0,
         "images_per_sec": 9.0}]}
    rec = driver.run_record("s", run, "static", launch.LaunchResult("ok", result, "", [], 1.0),
                            "2026-11-25T00:00:00Z", None, None)
    assert (rec["status"], rec["error"]) == ("failed", error)


@pytest.mark.slow
def test_horovods_build_on_a_gpu_node_takes_torchs_nccl_and_its_gpus_and_keeps_a_failed_log(
        tmp_path):
    """scripts/build_horovod.sh as a GPU head node runs it, with stand-ins for what this machine
    lacks: a CUDA torch (version, one compute-capability 9.0 GPU), the NCCL a torch from PyPI
    carries (nvidia/nccl with only libnccl.so.2) and nvcc. The script links that NCCL, builds for
    that GPU, and when the build fails (here: no CUDA toolkit for CMake) names the compiler's
    errors and keeps the whole log."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(textwrap.dedent("""\
        __version__ = "2.11.0+cu130"
        class version:
            cuda = "13.0"
        class cuda:
            device_count = staticmethod(lambda: 1)
            get_device_capability = staticmethod(lambda i: (9, 0))
        """))
    nccl = site / "nvidia" / "nccl"
    (nccl / "include").mkdir(parents=True)
    (nccl / "lib").mkdir()
    (nccl / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n")
    (nccl / "lib" / "libnccl.so.2").write_text("")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    # the stand-in torch first; installing into the real venv behind it is refused outright
    (venv / "bin" / "python").write_text(
        "#!/bin/sh\n"
        'case "$*" in *"-m pip install"*) echo "refused: pip install" >&2; exit 99;; esac\n'
        f'PYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
    (venv / "bin" / "nvcc").write_text("#!/bin/sh\nexit 1\n")
    for f in ("python", "nvcc"):
        (venv / "bin" / f).chmod(0o755)
    env = {**os.environ, "SCALELAB_VENV": str(venv), "SCALELAB_WHEEL_CACHE": str(tmp_path / "c"),
           "TMPDIR": str(tmp_path), "HOROVOD_BUILD_JOBS": "2"}
    env.pop("HOROVOD_GPU_OPERATIONS", None)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "build_horovod.sh")], env=env,
                          capture_output=True, text=True, timeout=600)
    err = proc.stderr
    assert proc.returncode == 1, err[-3000:]
    assert "HOROVOD_GPU_OPERATIONS=NCCL (CUDA archs 90)" in err, err[-3000:]
    assert f"NCCL: torch's own, {nccl / 'lib'}" in err
    assert "refused: pip install" not in err  # nothing went into the real venv
    py_tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    kept = tmp_path / f"build_horovod-horovod-0.28.1_torch-2.11.0+cu130_{py_tag}_nccl_cc90.log"
    assert f"the whole log is {kept}" in err and kept.is_file()
    log = kept.read_text()
    assert "CMake Error" in log and "the compiler's errors" in err
    assert not list((tmp_path / "c").glob("*/*.whl"))  # no wheel cached from a failed build
