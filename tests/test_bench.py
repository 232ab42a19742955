"""invoke bench for real: 2-node sweeps on the local cluster, their CSV and reports (a driver
killed and resumed is in tests/faults/test_driver_faults.py)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from conftest import invoke, needs_root, needs_sshd, unique_name

from scalelab.cluster import netshape
from scalelab.results import store

pytestmark = [needs_root, needs_sshd, pytest.mark.root, pytest.mark.slow]

CSV_COLUMNS = ["sweep_id", "run_id", "target", "nodes", "procs_per_node", "world_size", "model",
               "engine", "precision", "batch_size", "bandwidth_mbit", "repeat", "status",
               "images_per_sec", "images_per_sec_per_worker", "step_time_mean_s",
               "step_time_p95_s", "comm_fraction", "busbw_mb_s", "link_mbit_measured",
               "scaling_efficiency", "started_at", "duration_s", "error"]


@pytest.fixture(scope="module")
def cluster():
    from scalelab.cluster.targets.local import LocalCluster

    lc = LocalCluster(unique_name("b"))
    lc.provision(2)
    yield lc.name
    lc.destroy()


@pytest.fixture
def reports(tmp_path):
    return tmp_path / "reports"


def bench(cluster: str, reports: Path, *args: str, timeout: float = 600):
    return invoke("bench", "--cluster", cluster, *args,
                  env={"SCALELAB_REPORTS": str(reports)}, timeout=timeout)


def runs_of(sweep_dir: Path) -> list[dict]:
    path = sweep_dir / "runs.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def test_two_node_sweep_writes_the_csv_and_the_report(cluster, reports):
    proc = bench(cluster, reports, "--sweep", "ci", "--steps", "4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    latest = reports / "latest"
    assert latest.is_symlink()
    sweep_dir = reports / os.readlink(latest)
    with open(sweep_dir / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0].keys())[: len(CSV_COLUMNS)] == CSV_COLUMNS
    assert len(rows) == 4  # train runs: nodes 1,2 x rates native,1gbit
    assert {r["status"] for r in rows} == {"ok"}
    for r in rows:
        assert float(r["images_per_sec"]) > 0
        assert r["model"] == "resnet20" and r["target"] == "local"
    two = [r for r in rows if r["world_size"] == "2"]
    # throughput of 2 ranks is the sum of both ranks' own figures, never rank 0 x 2
    records = {x["run_id"]: x for x in runs_of(sweep_dir)}
    # a record holds what was measured; aggregates over runs (efficiency, speed-up) are
    # computed from the records for results.csv and the report, never stored in them
    stored = json.dumps(list(records.values()))
    assert "efficiency" not in stored and "speedup" not in stored and "speed_up" not in stored
    # the local target's nodes share the host's cores: ranks start without torchrun's agent,
    # forked from a warm-start server per node (the allreduce probe as well); the servers
    # are gone with the sweep
    assert {x["env"].get("launcher") for x in records.values()} == {"warm"}
    # what the ranks really ran on is recorded from the ranks: CPUs, Gloo over TCP, and the
    # plan asked for exactly that (resolved from the nodes, never "auto")
    for x in records.values():
        assert x["params"]["device"] == "cpu" and x["params"]["fabric"] == "tcp"
        assert x["placement"]["transport"] == "gloo-tcp", x["placement"]
        assert x["placement"]["backend"] == "gloo"
        if x["kind"] == "train":
            assert x["placement"]["device"] == "cpu"
            assert {r["device"] for r in x["ranks"]} == {"cpu"}
    assert not (sweep_dir / ".warm.json").exists()
    for r in two:
        ranks = records[r["run_id"]]["ranks"]
        assert len(ranks) == 2
        assert float(r["images_per_sec"]) == pytest.approx(sum(x["images_per_sec"] for x in ranks),
                                                        rel=1e-4)
        assert 0 < float(r["scaling_efficiency"]) < 1.5
        assert 0 <= float(r["comm_fraction"]) < 1
    shaped = [r for r in rows if r["bandwidth_mbit"]]
    assert {float(r["bandwidth_mbit"]) for r in shaped} == {1000.0}
    for r in shaped:
        assert 800 <= float(r["link_mbit_measured"]) <= 1100, r["link_mbit_measured"]
    assert all(r["bandwidth_mbit"] == "" for r in rows if r not in shaped)
    # the allreduce probes are recorded with busbw per size
    probes = [x for x in records.values() if x["kind"] == "allreduce"]
    assert len(probes) == 2 and all(p["allreduce"] for p in probes)
    assert (sweep_dir / "index.html").stat().st_size > 10_000
    assert "report:" in proc.stdout
    # every training run says where its wall time went, and the phases add up to it
    for r in records.values():
        if r["kind"] != "train":
            continue
        t = r["timeline"]
        assert tuple(t) == store.TIMELINE_KEYS, t
        assert sum(t.values()) == pytest.approx(r["duration_s"], abs=0.05)
        # the timed phase is the steps the rank timed (plus clock reads between them)
        assert t["timed_s"] >= sum(r["ranks"][0]["step_times_s"]) - 0.01
    assert "training run time by phase" in (sweep_dir / "index.html").read_text()
    # scalelab's own commands (reaping, staging, the rate) ride one connection per node:
    # the only connections a 2-rank run opens are its ranks' own
    for r in records.values():
        assert r["ssh"]["shared"] >= 1, r["ssh"]
        if r["kind"] == "train" and r["params"]["nodes"] == 2:
            assert r["ssh"]["opened"] == 2, (r["run_id"], r["ssh"])


@pytest.mark.parametrize("args, message", [
    (["--nodes", "1-10", "--batch-size", "32"], "provision more"),
    (["--nodes", "10-1", "--batch-size", "32"], "runs backwards"),
    (["--nodes", "0", "--batch-size", "32"], "below the minimum of 1"),
    (["--nodes", "1", "--batch-size", "0"], "batch"),
    (["--nodes", "1", "--batch-size", "-3"], "batch"),
    (["--nodes", "1", "--batch-size", "abc"], "batch"),
    (["--nodes", "1", "--batch-size", "32", "--model", "resnet9000"], "resnet9000"),
    (["--nodes", "1", "--batch-size", "32", "--engine", "mpi4ever"], "mpi4ever"),
    (["--nodes", "1", "--batch-size", "32", "--bandwidth", "fast"], "fast"),
    (["--nodes", "1-2", "--global-batch-size", "15"], "does not split evenly over 2 ranks"),
    (["--sweep", "no-such-sweep"], "not found"),
    (["--resume", "20990101-000000-dead"], "not found"),
])
def test_bad_bench_input_is_one_line_and_writes_nothing(cluster, reports, args, message):
    proc = bench(cluster, reports, *args, timeout=120)
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert message in err
    assert not reports.exists() or not any(reports.iterdir())


def test_typo_in_a_sweep_file_names_the_key(cluster, reports, tmp_path):
    bad = tmp_path / "typo.yml"
    bad.write_text("nodes: 1-2\nbatchsize: 32\n")
    proc = bench(cluster, reports, "--sweep", str(bad), timeout=120)
    assert proc.returncode != 0
    assert "unknown key 'batchsize'; did you mean 'batch_size'?" in proc.stderr
    assert not reports.exists()


def test_dry_run_lists_runs_and_writes_nothing(cluster, reports):
    proc = bench(cluster, reports, "--sweep", "ci", "--dry-run", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "6 runs on cluster" in proc.stdout and "estimated" in proc.stdout
    assert not reports.exists()


def test_horovod_engine_runs_across_two_nodes(cluster, reports):
    proc = bench(cluster, reports, "--nodes", "1,2", "--batch-size", "16", "--model", "resnet20",
                 "--engine", "horovod", "--steps", "3", "--repeats", "1", "--no-report")
    assert proc.returncode == 0, proc.stderr[-2000:]
    sweep_dir = reports / os.readlink(reports / "latest")
    train = [r for r in runs_of(sweep_dir) if r["kind"] == "train"]
    assert {r["status"] for r in train} == {"ok"}, [r["error"] for r in train]
    two = next(r for r in train if r["params"]["world_size"] == 2)
    assert sorted(x["host"] for x in two["ranks"]) == [f"{cluster}-n0", f"{cluster}-n1"]
    assert two["env"]["horovod"]
    assert two["placement"]["backend"] == "horovod-gloo"
    assert two["placement"]["transport"] == "gloo-tcp"


def test_strong_scaling_splits_the_global_batch_and_is_reported_as_such(cluster, reports):
    """--global-batch-size 16 over 1 and 2 nodes: each rank of the 2-node run trains on 8, the
    run's images/s is the global batch's, and results.csv and the page say strong scaling,
    beside a weak-scaling series of the same sweep."""
    proc = bench(cluster, reports, "--nodes", "1,2", "--global-batch-size", "16",
                 "--batch-size", "16", "--model", "resnet20", "--steps", "3", "--repeats", "1",
                 "--bandwidth", "native")
    assert proc.returncode == 0, proc.stderr[-2000:]
    sweep_dir = reports / os.readlink(reports / "latest")
    train = {r["run_id"]: r for r in runs_of(sweep_dir) if r["kind"] == "train"}
    assert sorted(train) == ["train-n01-p1-b016-native-r0", "train-n01-p1-g0016-native-r0",
                             "train-n02-p1-b016-native-r0", "train-n02-p1-g0016-native-r0"]
    assert {r["status"] for r in train.values()} == {"ok"}, [r["error"] for r in train.values()]
    two = train["train-n02-p1-g0016-native-r0"]
    assert two["params"]["global_batch_size"] == 16 and two["params"]["batch_size"] == 8
    for rank in two["ranks"]:  # each rank trained on its share: 8 images a step
        assert rank["images_per_sec"] == pytest.approx(8 / rank["step_time_mean_s"], rel=0.25)
    assert train["train-n02-p1-b016-native-r0"]["params"]["global_batch_size"] is None
    with open(sweep_dir / "results.csv") as fh:
        rows = {r["run_id"]: r for r in csv.DictReader(fh)}
    strong = rows["train-n02-p1-g0016-native-r0"]
    assert (strong["scaling"], strong["batch_size"], strong["batch_per_worker"]) == (
        "strong", "16", "8")
    weak = rows["train-n02-p1-b016-native-r0"]
    assert (weak["scaling"], weak["batch_size"], weak["batch_per_worker"]) == ("weak", "16", "16")
    # strong: efficiency = images/s(2) / (2 x images/s(1)), against its own 1-node run
    base = float(rows["train-n01-p1-g0016-native-r0"]["images_per_sec"])
    assert float(strong["scaling_efficiency"]) == pytest.approx(
        float(strong["images_per_sec"]) / (2 * base), rel=1e-4)  # csv: 6 digits
    page = (sweep_dir / "index.html").read_text()
    assert "16 global" in page and "16/worker" in page


def test_precision_and_memory_format_are_axes_each_run_as_asked(cluster, reports):
    """--precision fp32,bf16 --memory-format contiguous,channels_last: four series per point,
    each run's ranks used the precision and layout it asked for, and the report keeps them
    apart."""
    proc = bench(cluster, reports, "--nodes", "2", "--batch-size", "8", "--model", "resnet20",
                 "--precision", "fp32,bf16", "--memory-format", "contiguous,channels_last",
                 "--steps", "2", "--repeats", "1", "--bandwidth", "native")
    assert proc.returncode == 0, proc.stderr[-2000:]
    sweep_dir = reports / os.readlink(reports / "latest")
    train = {r["run_id"]: r for r in runs_of(sweep_dir) if r["kind"] == "train"}
    assert sorted(train) == [f"train-n02-p1-b008-native-{p}-{f}-r0" for p in ("bf16", "fp32")
                             for f in ("nchw", "nhwc")]
    for rid, r in train.items():
        assert r["status"] == "ok", r["error"]
        prec, fmt = rid.split("-")[-3:-1]
        assert r["placement"]["precision"] == prec
        assert r["placement"]["memory_format"] == ("channels_last" if fmt == "nhwc"
                                                   else "contiguous")
    with open(sweep_dir / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted((r["precision"], r["memory_format"]) for r in rows) == [
        ("bf16", "channels_last"), ("bf16", "contiguous"), ("fp32", "channels_last"),
        ("fp32", "contiguous")]
    html = (sweep_dir / "index.html").read_text()
    assert "memory format" in html and "channels_last" in html
    # the report's figures draw each (precision, layout) as a line of its own style
    from scalelab.report import figures
    from scalelab.report.data import analyse, load_sweep_data

    lay = figures.layout(analyse([load_sweep_data(sweep_dir)], None, True).modelled, False)
    assert lay.style_cols == ["precision", "memory_format"]
    assert sorted(lay.styles) == sorted((p, f) for p in ("bf16", "fp32")
                                        for f in ("channels_last", "contiguous"))
    assert len(set(lay.styles.values())) == 4


def test_emulated_accelerator_sweep_records_fidelity_and_reports_both_models(cluster, reports):
    """ResNet-50 on an emulated V100: real 102 MB gradients over the real shaped link."""
    proc = bench(cluster, reports, "--nodes", "1,2", "--batch-size", "32", "--model", "resnet50",
                 "--accelerator", "v100", "--bandwidth", "1gbit", "--steps", "3",
                 "--repeats", "1", "--allreduce-sizes", "4K,64K,1M,16M")
    assert proc.returncode == 0, proc.stderr[-2000:]
    sweep_dir = reports / os.readlink(reports / "latest")
    with open(sweep_dir / "results.csv") as fh:
        rows = {r["world_size"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"1", "2"} and {r["status"] for r in rows.values()} == {"ok"}
    records = {x["params"]["world_size"]: x for x in runs_of(sweep_dir) if x["kind"] == "train"}
    for ws, r in rows.items():
        rec = records[int(ws)]
        assert r["accelerator"] == "v100"
        assert float(r["dilation"]) >= 1 and rec["params"]["dilation"] == float(r["dilation"])
        assert rec["accelerator"]["source"] == "derived"
        # compute per step is the profile's (V100 fp32 at batch 32: 367 img/s); within 10 %:
        # a mean of 3 steps, where one wake-up late on a loaded 2-core CI machine moved it by 8 %
        # (left in wall time it would be off by the dilation the sweep chose)
        rank = rec["ranks"][0]
        assert rank["compute_time_mean_s"] == pytest.approx(
            rec["accelerator"]["profile_step_s"], rel=0.10)
        assert rec["accelerator"]["profile_step_s"] == pytest.approx(32 / 367, rel=0.02)
        assert r["host_cpu_idle"] != ""
    # two nodes: every step moves ResNet-50's gradient over a 1 Gbit/s link, which the
    # NIC counters saw and which takes most of the step
    two = records[2]
    assert two["gradient_bytes"] == 25_557_032 * 4
    tx = two["ranks"][0]["nic_tx_bytes"]
    assert tx >= 3 * two["gradient_bytes"] * 0.9 / 2  # a ring of 2 sends half, per step
    assert float(rows["2"]["scaling_efficiency"]) < 0.5
    assert 0.3 < float(rows["2"]["link_utilisation"]) <= 1.1
    page = (sweep_dir / "index.html").read_text()
    assert "What this sweep found" in page and "on emulated v100" in page
    assert "Emulated accelerator" in page and "overlap model" in page
    assert "Predictions, not measurements" in page


def test_nodes_of_several_emulated_gpus_on_a_fabric_profile(cluster, reports, tmp_path):
    """2 nodes x 2 emulated V100s (the reduced form of 8 x 4) on the ethernet-tcp profile,
    with a GPU-side cost in the profile and a slow path between a node's GPUs: every rank
    trains, its compute grows by that cost, tc holds the profile's share of the line and the
    stated path on each node's loopback, one node's step carries that path's allreduce as the
    model says, the report names the profile, the path and their sources."""
    from scalelab.model import accel, fabric

    doc = accel.resolve("v100", "resnet50", "fp32", 32, 224)
    profile = tmp_path / "v100-with-peers.json"
    profile.write_text(json.dumps({**doc, "gpu_side_stretch": 1.25,
                                   "gpu_side_source": "a test's figure"}))
    proc = bench(cluster, reports, "--nodes", "1,2", "--procs-per-node", "2", "--batch-size",
                 "32", "--model", "resnet50", "--accelerator", str(profile), "--bandwidth", "10gbit",
                 "--fabric-profile", "ethernet-tcp", "--intra-link", "2gbit", "--steps", "3",
                 "--repeats", "1", "--allreduce-sizes", "4K,64K")
    assert proc.returncode == 0, proc.stderr[-2000:]
    sweep_dir = reports / os.readlink(reports / "latest")
    with open(sweep_dir / "results.csv") as fh:
        rows = {r["world_size"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"2", "4"} and {r["status"] for r in rows.values()} == {"ok"}, rows
    assert {r["fabric_profile"] for r in rows.values()} == {"ethernet-tcp"}
    records = {x["params"]["world_size"]: x for x in runs_of(sweep_dir) if x["kind"] == "train"}
    four = records[4]
    assert len(four["ranks"]) == 4 and four["params"]["procs_per_node"] == 2
    # with peers every rank computed 1.25 x the profile's step, and its record says so
    step = accel.step_s(doc)
    for rec in records.values():
        assert rec["accelerator"]["profile_step_s"] == pytest.approx(1.25 * step, rel=0.01)
        assert rec["ranks"][0]["compute_time_mean_s"] == pytest.approx(1.25 * step, rel=0.05)
    # tc held the profile's share of 10 Gbit/s for nodes of several GPUs (not the share for
    # one GPU per node), dilated
    fab = fabric.load("ethernet-tcp")
    assert fab.share(10000.0, 2) < fab.share(10000.0, 1)
    want = fabric.tc_line_mbit(10000.0, "ethernet-tcp", 2) / four["params"]["dilation"]
    assert four["env"]["tc"] == netshape.describe(want)
    # what the link carried, in the emulated device's time: near the share, not the line
    assert 0.8 * fab.collective_mbit(10000.0, 2) < four["link_mbit_measured"] < 0.9 * 10000.0
    # each node's loopback held the stated path per ring edge: 2 edges on one node (the ring
    # closes there), 1 where it goes on to the next node; in the device's time
    for rec in records.values():
        p = rec["params"]
        assert (p["intra_link"], p["intra_mbit"]) == ("2gbit", 2000.0)
        edges = 2 if p["nodes"] == 1 else 1
        assert rec["env"]["tc_loopback"] == netshape.describe(edges * 2000.0 / p["dilation"])
    # and after the sweep no node's loopback is shaped any more
    from scalelab.cluster.targets.local import LocalCluster

    assert set(LocalCluster(cluster).link_rates("lo").values()) == {(None, None)}
    # one node: its ring runs on that path alone, 100 MB of gradient each way a step at
    # 2 Gbit/s, far slower than its compute; the measured step is the overlap model's
    from scalelab.report.data import analyse, load_sweep_data

    modelled = analyse([load_sweep_data(sweep_dir)], None, True).modelled
    one = modelled[modelled["world_size"] == 2].iloc[0]
    assert one["step_time_mean_s"] > 2 * 1.25 * step, one["step_time_mean_s"]
    assert one["step_time_mean_s"] == pytest.approx(one["overlap_step_s"], rel=0.15)
    page = (sweep_dir / "index.html").read_text()
    assert "Fabric profile: ethernet-tcp" in page and "an estimate, not a measurement" in page
    assert "Path between the GPUs of a node: 2gbit" in page
    # the profile's per-hop latency (40 us) on the links in the device's time where the
    # kernel has tc netem; in the model only where it has not, and the report says which
    from scalelab.cluster.targets import localhost

    if localhost.netem_available():
        assert four["env"]["hop_delay_us"] == pytest.approx(40.0 * four["params"]["dilation"])
        assert "in the model and on the links (tc netem" in page
    else:
        assert "hop_delay_us" not in four["env"]
        assert "in the model and not on the links (the kernel of the host" in page
