"""The workloads that run on cluster nodes (bench/workloads/), exercised on this machine.

Multi-rank runs use torchrun / horovodrun on loopback only (127.0.0.1, GLOO_SOCKET_IFNAME=lo);
every subprocess has a timeout.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch  # (pinned in the venv: a missing or broken torch fails, never skips)
from PIL import Image

from scalelab.run import commands

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = REPO / "bench" / "workloads"
PY = sys.executable
BIN = Path(sys.executable).parent

IMAGENET_PARAMS = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
}
# He et al. 2015, Table 6 (option A shortcuts, 10 classes): 0.27M, 0.46M, 0.66M, 0.85M.
CIFAR_PARAMS = {
    "resnet20": (269_722, 0.27e6),
    "resnet32": (464_154, 0.46e6),
    "resnet44": (658_586, 0.66e6),
    "resnet56": (853_018, 0.85e6),
}
RANK_KEYS = {
    "rank",
    "host",
    "images_per_sec",
    "step_time_mean_s",
    "step_time_p95_s",
    "compute_time_mean_s",
    "comm_time_mean_s",
}
ENV_KEYS = {"torch", "python", "gloo", "nccl", "horovod", "cpu_model", "gpu_model", "cuda_driver", "hostnames"}


def load_workload(name: str):
    """Import bench/workloads/<name>.py without leaving its sibling imports on sys.path."""
    saved_path = list(sys.path)
    saved_mods = {m: sys.modules.get(m) for m in ("common", "models", "imagedata", "shards")}
    try:
        sys.path.insert(0, str(WORKLOADS))
        spec = importlib.util.spec_from_file_location(f"_scalelab_wl_{name}", WORKLOADS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path[:] = saved_path
        for m, v in saved_mods.items():
            if v is None:
                sys.modules.pop(m, None)
            else:
                sys.modules[m] = v


@pytest.fixture(scope="module")
def models():
    return load_workload("models")


@pytest.fixture(scope="module")
def allreduce_mod():
    return load_workload("allreduce")


@pytest.fixture(scope="module")
def imagedata():
    return load_workload("imagedata")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
        PYTHONUNBUFFERED="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def parse_result(stdout: str) -> dict:
    """The one SCALELAB_RESULT line (horovodrun prefixes lines with '[0]<stdout>:')."""
    lines = [ln for ln in stdout.splitlines() if "SCALELAB_RESULT " in ln]
    assert len(lines) == 1, f"expected exactly one result line, got {len(lines)}:\n{stdout}"
    return json.loads(lines[0].split("SCALELAB_RESULT ", 1)[1])


def run_cmd(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, env=run_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed rc={proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc


def torchrun(nproc: int, script: str, *args: str, timeout: float = 120) -> dict:
    cmd = [
        str(BIN / "torchrun"),
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(WORKLOADS / script),
        *args,
    ]
    return parse_result(run_cmd(cmd, timeout).stdout)


def check_train_result(res: dict, world: int, model: str = "resnet20") -> None:
    assert res["world_size"] == world and res["model"] == model
    assert len(res["ranks"]) == world
    assert [r["rank"] for r in res["ranks"]] == list(range(world))
    for r in res["ranks"]:
        assert RANK_KEYS <= set(r)
        assert r["images_per_sec"] > 0
        assert r["step_time_p95_s"] >= r["step_time_mean_s"] * 0.5 > 0
        assert r["comm_time_mean_s"] >= 0 and r["compute_time_mean_s"] > 0
        # step = data + compute + exposed comm, by construction
        assert r["compute_time_mean_s"] + r["comm_time_mean_s"] <= r["step_time_mean_s"] + 1e-9
        assert len(r["step_times_s"]) == res["steps"]
    assert res["images_per_sec"] == pytest.approx(sum(r["images_per_sec"] for r in res["ranks"]))
    assert ENV_KEYS <= set(res["env"])
    assert res["env"]["torch"] == torch.__version__


@pytest.mark.parametrize("name", sorted(p.stem for p in WORKLOADS.glob("*.py")
                                         if ">>> " in p.read_text()))
def test_docstring_examples_hold(name):
    """Every workload's examples (pytest collects scalelab's doctests, not these)."""
    import doctest

    result = doctest.testmod(load_workload(name))
    assert result.attempted > 0 and result.failed == 0


# -- models ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,expected", sorted(IMAGENET_PARAMS.items()))
def test_imagenet_resnets_match_torchvision_parameter_counts(models, name, expected):
    model = models.build_model(name, 1000)
    assert sum(p.numel() for p in model.parameters()) == expected


@pytest.mark.parametrize("name,expected", sorted(CIFAR_PARAMS.items()))
def test_cifar_resnets_match_the_paper(models, name, expected):
    exact, paper = expected
    model = models.build_model(name)  # 10 classes by default
    n = sum(p.numel() for p in model.parameters())
    assert n == exact
    assert round(n / 1e4) * 1e4 == paper  # the paper rounds to 0.01M
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)


def test_imagenet_model_forward_shape(models):
    out = models.build_model("resnet18", 7)(torch.randn(1, 3, 64, 64))
    assert out.shape == (1, 7)


def test_unknown_model_names_the_known_ones(models):
    with pytest.raises(ValueError) as e:
        models.build_model("vgg16", 10)
    for known in ("resnet20", "resnet50", "resnet152"):
        assert known in str(e.value)


def test_one_model_registry_for_planner_and_workloads(models):
    """models.json is what both sides read; its parameter counts must be the built models',
    so the gradient the planner and the report assume is the one the ranks allreduce."""
    from scalelab.model import networks

    for name in networks.MODELS:
        built = models.build_model(name)
        assert networks.gradient_bytes(name) == models.gradient_bytes(built, "fp32"), name


@pytest.mark.parametrize("name", ["resnet20", "resnet50"])
def test_registry_activation_bytes_are_what_autograd_saves(models, name):
    """Memory checks rest on activation_bytes_per_image: measure it again, as it was recorded
    (storage bytes autograd saves for backward, batch 2 minus batch 1 = one image)."""
    import torch

    from scalelab.model import networks

    model, size = models.build_model(name), networks.MODELS[name].image_size
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    total = []
    for batch in (1, 2):
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(torch.randn(batch, 3, size, size))
        total.append(sum(saved.values()))
    assert total[1] - total[0] == pytest.approx(networks.MODELS[name].activation_bytes, rel=0.02)


def test_gradient_bytes_by_precision(models):
    m = models.build_model("resnet50", 1000)
    assert models.gradient_bytes(m, "fp32") == 4 * 25_557_032
    assert models.gradient_bytes(m, "amp") == 2 * 25_557_032
    with pytest.raises(ValueError, match="fp32"):
        models.gradient_bytes(m, "int8")


# -- resnet.py -------------------------------------------------------------------------------


@pytest.mark.slow  # ~3 s quiet, >10 s when the 2 cores are shared
def test_resnet_single_process_prints_one_valid_result():
    proc = run_cmd(
        [
            PY,
            str(WORKLOADS / "resnet.py"),
            "--model",
            "resnet20",
            "--batch-size",
            "8",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--threads",
            "1",
        ],
        timeout=120,
    )
    res = parse_result(proc.stdout)
    check_train_result(res, 1)
    assert res["engine"] == "ddp" and res["precision"] == "fp32"
    assert res["image_size"] == 32 and res["batch_size"] == 8
    assert res["gradient_bytes"] == 4 * 269_722
    assert res["env"]["hostnames"] == [socket.gethostname()]
    assert proc.stdout.count("SCALELAB_RESULT") == 1


def test_resnet_rejects_unknown_model_with_the_known_list():
    proc = subprocess.run(
        [PY, str(WORKLOADS / "resnet.py"), "--model", "nope"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=run_env(),
    )
    assert proc.returncode == 2
    assert "resnet56" in proc.stderr and "SCALELAB_RESULT" not in proc.stdout


@pytest.mark.slow
def test_resnet_two_ranks_gathers_each_ranks_own_figures():
    res = torchrun(
        2,
        "resnet.py",
        "--model",
        "resnet20",
        "--batch-size",
        "16",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--precision",
        "amp",
    )
    check_train_result(res, 2)
    r0, r1 = res["ranks"]
    assert r0["pid"] != r1["pid"]
    assert r0["step_times_s"] != r1["step_times_s"]  # measured per rank, not rank 0 copied
    assert res["gradient_bytes"] == 2 * 269_722
    assert res["comm_dtype"] == "bfloat16" and res["timing_method"] == "ddp-comm-hook"


# -- real data -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ds")
    proc = run_cmd(
        [
            PY,
            str(WORKLOADS / "make_dataset.py"),
            "--out",
            str(out),
            "--classes",
            "3",
            "--images-per-class",
            "8",
            "--size",
            "40",
            "--shard-size",
            "6",
        ],
        timeout=60,
    )
    desc = parse_result(proc.stdout)
    assert desc["num_images"] == 24 and desc["num_shards"] == 4
    return out


def test_an_imagenet_like_dataset_weighs_what_imagenet_does(tmp_path, imagedata):
    """--like imagenet: photo-sized JPEGs (mostly 500 px on the long side) of 100-125 KB on
    average, as ImageNet's training photos average 110-115 KB, which the input pipeline reads
    from the shards and crops to the model's 224 px like any real data."""
    proc = run_cmd([PY, str(WORKLOADS / "make_dataset.py"), "--out", str(tmp_path), "--classes",
                    "4", "--images-per-class", "15", "--like", "imagenet", "--layout", "shards",
                    "--shard-size", "20"], timeout=120)
    desc = parse_result(proc.stdout)
    assert desc["like"] == "imagenet" and desc["num_shards"] == 3
    sizes, sides = [], []
    for shard in sorted((tmp_path / "shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                if m.name.endswith(".jpg"):
                    data = tar.extractfile(m).read()
                    sizes.append(len(data))
                    sides.append(max(Image.open(io.BytesIO(data)).size))
    assert len(sizes) == 60 and desc["mean_bytes"] == round(sum(sizes) / 60)
    assert 100_000 <= desc["mean_bytes"] <= 125_000, desc["mean_bytes"]
    assert sides.count(500) >= 30 and 300 <= min(sides) and max(sides) <= 800
    img = Image.open(io.BytesIO(data)).convert("RGB")
    assert tuple(imagedata.TrainTransform(224, seed=0)(img).shape) == (3, 224, 224)


def test_make_dataset_writes_both_layouts(tiny_dataset):
    classes = sorted(p.name for p in (tiny_dataset / "folders").iterdir())
    assert classes == ["class_000", "class_001", "class_002"]
    assert all(len(list((tiny_dataset / "folders" / c).glob("*.jpg"))) == 8 for c in classes)
    shards = sorted((tiny_dataset / "shards").glob("*.tar"))
    assert len(shards) == 4
    with tarfile.open(shards[0]) as tar:
        names = tar.getnames()
    assert len(names) == 12 and names[0].endswith(".jpg") and names[1].endswith(".cls")
    assert names[0].split(".")[0] == names[1].split(".")[0]


def test_train_transform_crops_flips_and_normalises(imagedata, tiny_dataset):
    from PIL import Image

    img = Image.open(next((tiny_dataset / "folders" / "class_000").glob("*.jpg")))
    t = imagedata.TrainTransform(24, seed=1)(img)
    assert t.shape == (3, 24, 24) and t.dtype == torch.float32
    assert -2.2 < float(t.min()) and float(t.max()) < 2.7  # (x/255 - mean) / std range
    import random

    rng = random.Random(0)
    for w, h in ((40, 40), (500, 40), (40, 500)):
        for _ in range(50):
            left, top, right, bottom = imagedata.random_resized_crop_box(w, h, rng)
            assert 0 <= left < right <= w and 0 <= top < bottom <= h


def _one_epoch(imagedata, shards, rank, world, n):
    ds = imagedata.TarShardDataset(shards, imagedata.TrainTransform(16), rank, world)
    return [sample for _, sample in zip(range(n), ds, strict=False)]


def test_tar_shards_are_split_disjointly_across_ranks(imagedata, tiny_dataset):
    """Each rank reads whole shards of its own (WebDataset's tar reading), every sample once per
    epoch, and counts the bytes it read: the shards' own, tar headers included."""
    shards = imagedata.shard_urls(str(tiny_dataset / "shards"))
    got = [_one_epoch(imagedata, shards, rank, 2, 12) for rank in range(2)]  # 24 / 2 samples
    labels = [label for part in got for _, label, _, _ in part]
    assert sorted(labels) == sorted([c for c in range(3) for _ in range(8)])
    read = sum(nbytes for part in got for _, _, nbytes, _ in part)
    # each sample says when it was read, in order (what a run's read rate is taken over)
    stamps = [at for part in got for _, _, _, at in part]
    assert all(a <= b for a, b in zip(stamps[:12], stamps[1:12], strict=False))
    members = 0
    for shard in shards:
        with tarfile.open(shard) as tar:
            members += sum(m.size for m in tar.getmembers())
    assert members < read <= sum(os.path.getsize(s) for s in shards)
    # fewer shards than (rank, worker) slots: refused, naming the fix
    with pytest.raises(ValueError, match=r"1 shard\(s\) for 2 rank\(s\) x 1 loader worker\(s\)"
                       r".*give at least 2 shards or fewer loader workers"):
        imagedata.make_loader(shards[0], image_size=16, batch_size=2, workers=0, rank=0,
                              world=2, num_classes=None, pin_memory=False)


def test_shards_are_not_read_up_front_for_their_classes(imagedata, tiny_dataset):
    """Counting the classes would read the whole set: shards have ImageNet's 1,000 unless
    --num-classes says; class folders count theirs."""
    common = dict(image_size=16, batch_size=2, workers=0, rank=0, world=1, pin_memory=False)
    assert imagedata.make_loader(str(tiny_dataset / "shards"), num_classes=None,
                                 **common).num_classes == 1000
    assert imagedata.make_loader(str(tiny_dataset / "shards"), num_classes=3,
                                 **common).num_classes == 3
    assert imagedata.make_loader(str(tiny_dataset / "folders"), num_classes=None,
                                 **common).num_classes == 3


def test_tar_shards_are_read_from_a_web_server_as_from_disk(imagedata, tiny_dataset):
    """Shards at http:// URLs (a {low..high} range) are the same samples as on disk, through a
    real HTTP server; a server that is gone fails the read naming the shard and curl's exit."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                                directory=str(tiny_dataset / "shards"))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/shard-{{000000..000003}}.tar"
        urls = imagedata.shard_urls(url)
        assert len(urls) == 4
        web = _one_epoch(imagedata, urls, 0, 1, 24)
        disk = _one_epoch(imagedata, imagedata.shard_urls(str(tiny_dataset / "shards")), 0, 1, 24)
        assert [label for _, label, _, _ in web] == [label for _, label, _, _ in disk]
        assert all(torch.equal(a[0], b[0]) for a, b in zip(web, disk, strict=True))
        assert sum(n for _, _, n, _ in web) == sum(n for _, _, n, _ in disk)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(imagedata.DataReadError, match=r"shard-0000\d\d\.tar: reading stopped "
                       r"after 0 bytes: curl exit 7 \(could not connect"):
        _one_epoch(imagedata, urls, 0, 1, 1)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["folders", "shards"])
def test_resnet_trains_on_real_data(tiny_dataset, layout):
    proc = run_cmd(
        [
            PY,
            str(WORKLOADS / "resnet.py"),
            "--model",
            "resnet20",
            "--batch-size",
            "4",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--threads",
            "1",
            "--workers",
            "1",
            "--data",
            str(tiny_dataset / layout),
            # folders count their classes; shards are not read up front for theirs
            *(["--num-classes", "3"] if layout == "shards" else []),
        ],
        timeout=120,
    )
    res = parse_result(proc.stdout)
    check_train_result(res, 1)
    assert res["data_layout"] == layout and res["num_classes"] == 3
    # what the loader read for the 12 images the timed steps trained on: the JPEGs' bytes (and
    # the shards' tar headers), each image read once
    jpeg = sum(p.stat().st_size for p in (tiny_dataset / "folders").rglob("*.jpg")) / 24
    assert 0.5 * jpeg < res["data_bytes_per_image"] < 3 * jpeg + 2048, (res["data_bytes_per_image"], jpeg)
    assert res["data_bytes"] == res["ranks"][0]["data_bytes"] > 0
    assert res["gradient_bytes"] == 4 * (269_722 - 7 * 65)  # fc has 3 outputs, not 10


def test_resnet_missing_dataset_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        [
            PY,
            str(WORKLOADS / "resnet.py"),
            "--model",
            "resnet20",
            "--data",
            str(tmp_path / "absent"),
            "--steps",
            "1",
            "--warmup",
            "0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=run_env(),
    )
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_a_rank_that_dies_of_an_exception_writes_torchruns_error_file(tmp_path):
    """A dataset whose images are not images: the rank ends with PIL's exception, and that
    exception is in the JSON file TORCHELASTIC_ERROR_FILE names, as torchrun (and scalelab,
    for ranks it starts itself) reads it back to say why a run failed."""
    for c in ("c0", "c1"):
        (tmp_path / "data" / c).mkdir(parents=True)
        for i in range(4):
            (tmp_path / "data" / c / f"{i}.jpg").write_text("not a jpeg\n")
    err = tmp_path / "error.json"
    proc = subprocess.run(
        [PY, str(WORKLOADS / "resnet.py"), "--model", "resnet20", "--batch-size", "4",
         "--steps", "2", "--warmup", "0", "--threads", "1", "--workers", "0",
         "--data", str(tmp_path / "data")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**run_env(), "TORCHELASTIC_ERROR_FILE": str(err)},
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    record = json.loads(err.read_text())
    assert record["message"]["message"].startswith("UnidentifiedImageError: cannot identify image")
    assert "resnet.py" in record["message"]["extraInfo"]["py_callstack"]


@pytest.mark.parametrize("script", ["resnet.py", "allreduce.py"])
def test_each_rank_entry_point_is_recorded(script):
    """The main torchrun starts carries @common.recorded itself (a helper inserted between the
    decorator and main once took it, and failed ranks wrote no error file)."""
    import ast

    tree = ast.parse((WORKLOADS / script).read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert [ast.unparse(d) for d in main.decorator_list] == ["common.recorded"]


# -- allreduce.py ----------------------------------------------------------------------------


def test_busbw_formula_hand_computed(allreduce_mod):
    # 64 MB in 0.5 s on 4 ranks: algbw = 64e6 / 0.5 / 1e6 = 128 MB/s;
    # busbw = 128 * 2 * (4 - 1) / 4 = 192 MB/s (nccl-tests' allreduce bus factor).
    assert allreduce_mod.bandwidths(64_000_000, 0.5, 4) == (128.0, 192.0)
    assert allreduce_mod.bandwidths(1_000_000, 0.001, 2) == (1000.0, 1000.0)
    assert allreduce_mod.bandwidths(1_000_000, 0.001, 1)[1] == 0.0
    assert allreduce_mod.message_sizes(4096, 64 << 20, 4) == [
        4 << 10,
        16 << 10,
        64 << 10,
        256 << 10,
        1 << 20,
        4 << 20,
        16 << 20,
        64 << 20,
    ]


@pytest.mark.slow
def test_allreduce_two_ranks_on_loopback():
    res = torchrun(
        2, "allreduce.py", "--min-bytes", "4K", "--max-bytes", "256K", "--factor", "8", "--iters", "3", "--warmup", "1"
    )
    assert res["world_size"] == 2 and res["backend"] == "gloo"
    assert [s["size_bytes"] for s in res["sizes"]] == [4096, 32768, 262144]
    for s in res["sizes"]:
        assert len(s["per_rank_time_s"]) == 2
        assert s["time_s"] == max(s["per_rank_time_s"])
        assert s["algbw_mb_s"] == pytest.approx(s["size_bytes"] / s["time_s"] / 1e6)
        assert s["busbw_mb_s"] == pytest.approx(s["algbw_mb_s"] * 2 * (2 - 1) / 2)


# -- horovod ---------------------------------------------------------------------------------


def _horovod_missing() -> str | None:
    if importlib.util.find_spec("horovod") is None:
        return "horovod not installed (build it with scripts/build_horovod.sh)"
    if shutil.which("horovodrun", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}") is None:
        return "horovodrun not on PATH"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_horovod_missing() is not None, reason=str(_horovod_missing()))
def test_horovod_two_ranks_on_loopback():
    horovodrun = shutil.which("horovodrun", path=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    proc = run_cmd(
        [
            horovodrun,
            "--gloo",
            "-np",
            "2",
            "-H",
            "localhost:2",
            "--network-interface",
            "lo",
            PY,
            str(WORKLOADS / "resnet.py"),
            "--engine",
            "horovod",
            "--model",
            "resnet20",
            "--batch-size",
            "16",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--threads",
            "1",
            # the layout GPUs train in (1.7x faster on an H100), with fp16 compression: Horovod
            # takes contiguous tensors only, and these gradients are not (the first GPU run of
            # the Horovod engine stopped here; the ddp and contiguous paths run in test_bench)
            "--channels-last",
            "--compression",
            "fp16",
        ],
        timeout=180,
    )
    res = parse_result(proc.stdout)
    check_train_result(res, 2)
    assert res["engine"] == "horovod" and res["timing_method"] == "horovod-synchronize"
    assert res["env"]["horovod"] and res["channels_last"] is True
    assert res["comm"]["compression"] == "fp16"
    assert res["ranks"][0]["pid"] != res["ranks"][1]["pid"]


@pytest.mark.skipif(_horovod_missing() is not None, reason=str(_horovod_missing()))
def test_horovod_averages_channels_last_gradients_and_broadcasts_their_weights():
    """The workload's wrappers (tests/data/hvd_channels_last.py, two ranks): rank 0's weights
    reach rank 1 and stay channels_last; each reduced gradient is the mean of the ranks' own,
    with and without fp16 compression; Horovod alone refuses the same gradients."""
    horovodrun = shutil.which("horovodrun", path=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    proc = run_cmd([horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", "--network-interface",
                    "lo", PY, str(REPO / "tests" / "data" / "hvd_channels_last.py"),
                    str(WORKLOADS)], timeout=180)
    for check in ("broadcast", "none", "fp16", "plain-refused"):
        assert proc.stdout.count(f"CHECKED {check}") == 2, (check, proc.stdout[-3000:])


# -- precision and device placement ----------------------------------------------------------


def test_gradient_bytes_of_tf32_and_bf16(models):
    m = models.build_model("resnet20")
    assert models.gradient_bytes(m, "tf32") == models.gradient_bytes(m, "fp32") == 4 * 269_722
    assert models.gradient_bytes(m, "bf16") == models.gradient_bytes(m, "amp") == 2 * 269_722


@pytest.mark.slow  # a 2-step training run, like test_resnet_single_process_prints_one_valid_result
def test_resnet_bf16_on_cpu_records_what_it_ran_on():
    proc = run_cmd(
        [PY, str(WORKLOADS / "resnet.py"), "--model", "resnet20", "--batch-size", "8", "--steps", "2",
         "--warmup", "1", "--threads", "1", "--precision", "bf16", "--device", "cpu"],
        timeout=120,
    )
    res = parse_result(proc.stdout)
    check_train_result(res, 1)
    assert res["precision"] == "bf16" and res["device"] == "cpu" and res["tf32"] is None
    assert res["backend"] == "gloo" and res["channels_last"] is False
    assert res["comm_dtype"] == "bfloat16" and res["gradient_bytes"] == 2 * 269_722
    assert res["loader_workers"] is None and res["pin_memory"] is None  # synthetic data
    (r0,) = res["ranks"]
    assert r0["device"] == "cpu" and r0["device_name"] == "cpu" and r0["gpu_mem_peak_mb"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA: --device cuda is valid here")
def test_resnet_device_cuda_without_cuda_is_one_clear_line():
    proc = subprocess.run(
        [PY, str(WORKLOADS / "resnet.py"), "--model", "resnet20", "--device", "cuda", "--steps", "1",
         "--warmup", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=60, env=run_env(),
    )
    assert proc.returncode != 0 and "SCALELAB_RESULT" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("resnet.py: --device cuda") and "--device cpu" in lines[0]


def test_resolve_device_gives_each_local_rank_its_own_gpu(monkeypatch):
    """No GPU needed: torch.cuda is faked to report two devices."""
    common = load_workload("common")
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert common.resolve_device("cuda", 1) == torch.device("cuda", 1)
    assert common.resolve_device("auto", 0) == torch.device("cuda", 0)
    assert chosen == [1, 0]
    with pytest.raises(SystemExit) as e:
        common.resolve_device("cuda", 3)  # a modulo would have put it on GPU 1, beside rank 1
    msg = str(e.value.code)
    assert "\n" not in msg
    assert "local rank 3 but torch sees 2 GPUs (CUDA_VISIBLE_DEVICES=0,1)" in msg
    assert msg.endswith("run at most 2 processes per node")
    assert chosen == [1, 0]


# ------------------------------------------------------------------------------ communication settings

def test_comm_settings_reach_resnet_args_and_horovods_environment():

    ddp = {"model": "resnet20", "batch_size": 32, "precision": "fp32", "steps": 2, "warmup": 1,
           "engine": "ddp", "image_size": None, "data": "synthetic", "bucket_cap_mb": 50.0,
           "fusion_threshold_mb": None, "cycle_time_ms": None, "compression": "fp16"}
    argv = commands.workload_args(ddp)
    assert argv[-4:] == ["--bucket-cap-mb", "50", "--compression", "fp16"]
    resnet = load_workload("resnet")
    a = resnet.parse_args(argv)
    assert (a.bucket_cap_mb, a.compression) == (50.0, "fp16")
    # at the defaults the command is what it was before the axes
    default = {**ddp, "bucket_cap_mb": 25.0, "compression": "none"}
    assert not any(x.startswith(("--bucket", "--compression")) for x in commands.workload_args(default))

    hvd = {**ddp, "engine": "horovod", "bucket_cap_mb": None, "fusion_threshold_mb": 64.0,
           "cycle_time_ms": 5.0, "compression": "none"}
    argv = commands.workload_args(hvd)
    a = resnet.parse_args(argv)
    env: dict[str, str] = {}
    used = resnet.horovod_env(a.fusion_threshold_mb, a.cycle_time_ms, env)
    assert env == {"HOROVOD_FUSION_THRESHOLD": str(64 << 20), "HOROVOD_CYCLE_TIME": "5"}
    assert used == {"fusion_threshold_mb": 64.0, "cycle_time_ms": 5.0}


def test_resnet_refuses_another_engines_comm_flags():
    resnet = load_workload("resnet")
    with pytest.raises(SystemExit):
        resnet.parse_args(["--engine", "ddp", "--fusion-threshold-mb", "64"])
    with pytest.raises(SystemExit):
        resnet.parse_args(["--engine", "horovod", "--bucket-cap-mb", "50"])
    with pytest.raises(SystemExit):
        resnet.parse_args(["--bucket-cap-mb", "0"])


def test_every_workload_leaves_its_process_group_behind_a_barrier():
    """The exit path of every workload that tears a torch process group down: a barrier
    first, so that no rank closes its sockets under a peer's collective still in flight (gloo
    aborts on that), then destroy_process_group. A workload that forgets the barrier fails
    here."""
    import ast

    seen = []
    for path in sorted((Path(__file__).resolve().parent.parent / "bench/workloads").glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef):
                continue
            calls = [(c.lineno, ast.unparse(c.func)) for c in ast.walk(fn)
                     if isinstance(c, ast.Call)]
            destroys = [line for line, name in calls if name == "dist.destroy_process_group"]
            if not destroys:
                continue
            seen.append(path.name)
            # the group's last operation before each teardown (in source order) is the barrier
            for d in destroys:
                last = max((c for c in calls if c[0] < d and c[1].startswith("dist.")),
                           default=(0, "nothing"))
                assert last[1] == "dist.barrier", \
                    f"{path.name}:{fn.name} destroys its group after {last[1]}, not a barrier"
    assert set(seen) >= {"resnet.py", "allreduce.py"}, seen


# ------------------------------------------------------------------ parameter servers (--engine ps)

def _losses(res: dict) -> list[float]:
    return [r["final_loss"] for r in sorted(res["ranks"], key=lambda r: r["rank"])]


@pytest.mark.parametrize("servers, overlap", [(1, "on"), (2, "off")])
def test_parameter_servers_train_as_ddp_does_and_each_server_sums_its_shard(servers, overlap):
    """Two workers and one or two server processes: the workers' losses after three steps are
    DDP's own (the servers summed every gradient and the workers averaged them), and each
    server took its shard of every worker's gradients each step, and sent as much back."""
    # small buckets: several a step, pushed while earlier ones are still being pulled
    common = ("--model", "resnet20", "--batch-size", "8", "--steps", "3", "--warmup", "1",
              "--device", "cpu", "--bucket-cap-mb", "0.25")
    ddp = torchrun(2, "resnet.py", *common)
    # pieces of 64 KB: each server's shard of a bucket in several, summed and sent back one by one
    ps = torchrun(2 + servers, "resnet.py", *common, "--engine", "ps", "--ps-servers-here",
                  str(servers), "--ps-overlap", overlap, "--ps-piece-kb", "64")
    assert ps["world_size"] == 2 and ps["backend"] == "ps-gloo"
    assert ps["timing_method"] == "ps-comm-hook"
    assert _losses(ps) == pytest.approx(_losses(ddp), rel=1e-5)
    assert ps["ps"]["overlap"] is (overlap == "on")
    got = ps["ps"]["servers"]
    assert [s["rank"] for s in got] == [2 + k for k in range(servers)]
    grads = ps["gradient_bytes"]
    for s in got:
        assert s["steps"] == 4  # the warm-up step too
        # a 0.25 MB bucket's shard in 64 KB pieces: more pieces than the step has buckets
        assert s["pieces_per_step"] >= 2 * 4 / servers
        # its shard (1/K of the gradients, to an element) from both workers, and back
        assert s["bytes_in_per_step"] == s["bytes_out_per_step"]
        assert abs(s["bytes_in_per_step"] - 2 * grads / servers) <= 2 * 4 * s["pieces_per_step"]
    assert sum(s["bytes_in_per_step"] for s in got) == 2 * grads


def test_parameter_servers_without_a_server_are_refused():
    cmd = [str(BIN / "torchrun"), "--nnodes", "1", "--nproc-per-node", "2", "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), str(WORKLOADS / "resnet.py"),
           "--engine", "ps", "--model", "resnet20", "--steps", "1", "--device", "cpu"]
    proc = subprocess.run(cmd, cwd=REPO, env=run_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "--engine ps needs workers and servers; this run has 2 worker(s) and 0 server(s)" \
        in proc.stderr
