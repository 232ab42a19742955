"""Sweep planning: options and sweep files -> validated, ordered, stably named runs."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalelab.cluster.nodes import Node
from scalelab.core.errors import InputError
from scalelab.model.comm import COMM_KEYS
from scalelab.model.networks import MODELS
from scalelab.sweep.estimate import estimate_duration_s
from scalelab.sweep.planner import (
    describe,
    new_sweep_id,
    plan,
)
from scalelab.sweep.settings import SweepSpec
from scalelab.sweep.sweepfile import (
    SWEEPS_DIR,
    find_sweep_file,
    load_sweep_file,
    spec_from_mapping,
    spec_from_options,
    spec_to_dict,
)


def make_cluster(n: int, gpus: int = 0, target: str = "local", name: str = "demo",
                 cpus: float = 1.0) -> list[Node]:
    # deliberately out of order: plan() must put the head first and n2 before n10
    nodes = [Node(f"{name}-n{i}", f"10.9.0.{i + 10}", f"10.9.0.{i + 10}",
                  "head" if i == 0 else "worker", target, cpus=cpus, gpus=gpus)
             for i in range(n)]
    return list(reversed(nodes))


def spec(**kw) -> SweepSpec:
    kw.setdefault("nodes", "1-3")
    kw.setdefault("batch_size", "32,64")
    kw.setdefault("model", "resnet20")
    return spec_from_options(**kw)


# ------------------------------------------------------------------------------ expansion


def test_expansion_counts():
    s = spec(bandwidth="100mbit,1gbit", repeats=2)
    runs = plan(s, make_cluster(3), can_shape=True)
    train = [r for r in runs if r.kind == "train"]
    probes = [r for r in runs if r.kind == "allreduce"]
    assert len(train) == 3 * 2 * 2 * 2  # nodes x batch x bandwidth x repeats
    # one probe per (bandwidth, nodes, ppn) with more than one process; none for 1 node x 1
    assert sorted(r.run_id for r in probes) == [
        "allreduce-n02-p1-bw100", "allreduce-n02-p1-bw1000",
        "allreduce-n03-p1-bw100", "allreduce-n03-p1-bw1000"]


def test_procs_per_node_multiplies_and_probes_single_node_multi_process():
    runs = plan(spec(nodes="1,2", procs_per_node="1,2", repeats=1), make_cluster(2, cpus=2),
                can_shape=True)
    ids = [r.run_id for r in runs]
    assert len([i for i in ids if i.startswith("train")]) == 2 * 2 * 2
    assert "allreduce-n01-p2-native" in ids and "allreduce-n01-p1-native" not in ids
    world = {r.run_id: r.params["world_size"] for r in runs}
    assert world["train-n02-p2-b064-native-r0"] == 4


def test_probes_can_be_turned_off():
    runs = plan(spec(allreduce_probe=False), make_cluster(3), can_shape=True)
    assert {r.kind for r in runs} == {"train"}


def test_order_groups_bandwidth_interleaves_repeats_and_probes_first():
    s = spec(bandwidth="1gbit,100mbit,native", procs_per_node="1,2", repeats=3)
    runs = plan(s, make_cluster(3, cpus=2), can_shape=True)
    rates = [r.params["bandwidth_mbit"] for r in runs]
    # each rate is one contiguous block, in the order given: one link change per rate
    changes = [a for a, b in zip(rates, rates[1:], strict=False) if a != b]
    assert len(changes) == 2
    assert list(dict.fromkeys(rates)) == [1000.0, 100.0, None]
    for rate in (1000.0, 100.0, None):
        block = [r for r in runs if r.params["bandwidth_mbit"] == rate and r.kind == "train"]
        keys = [(r.params["repeat"], r.params["nodes"], r.params["procs_per_node"],
                 r.params["batch_size"]) for r in block]
        assert keys == sorted(keys)  # repeat, then nodes, ppn, batch
    for i, run in enumerate(runs):
        if run.kind != "allreduce":
            continue
        triple = (run.params["bandwidth_mbit"], run.params["nodes"],
                  run.params["procs_per_node"])
        same = [j for j, r in enumerate(runs) if r.kind == "train" and triple == (
            r.params["bandwidth_mbit"], r.params["nodes"], r.params["procs_per_node"])]
        assert same and i < min(same)
        assert i == min(same) - 1  # right before its first train run


def test_run_ids_golden_and_stable():
    s = spec(nodes="1,2", batch_size="32", bandwidth="native,1gbit", repeats=2)
    ids = [r.run_id for r in plan(s, make_cluster(2), can_shape=True)]
    assert ids == [
        "train-n01-p1-b032-native-r0", "allreduce-n02-p1-native", "train-n02-p1-b032-native-r0",
        "train-n01-p1-b032-native-r1", "train-n02-p1-b032-native-r1",
        "train-n01-p1-b032-bw1000-r0", "allreduce-n02-p1-bw1000", "train-n02-p1-b032-bw1000-r0",
        "train-n01-p1-b032-bw1000-r1", "train-n02-p1-b032-bw1000-r1",
    ]
    # the same spec on another cluster of enough nodes plans the same ids and params
    again = plan(s, make_cluster(5, name="other"), can_shape=True)
    assert [r.run_id for r in again] == ids
    assert [r.params for r in again] == [r.params for r in plan(s, make_cluster(2), True)]


def test_params_hold_exactly_the_contract_keys():
    runs = plan(spec(bandwidth="1gbit"), make_cluster(3), can_shape=True)
    train = next(r for r in runs if r.run_id == "train-n03-p1-b064-bw1000-r0")
    assert train.params == {
        "nodes": 3, "procs_per_node": 1, "world_size": 3, "model": "resnet20", "engine": "ddp",
        "precision": "fp32", "batch_size": 64, "bandwidth_mbit": 1000.0, "repeat": 0,
        "steps": 30, "warmup": 5, "image_size": 32, "data": "synthetic", "accelerator": None,
        "dilation": None, "device": "cpu", "fabric": "tcp", "channels_last": False,
        "loader_workers": 2, "pin_memory": "auto", "runtime": "host",
        # DDP's own default bucket size; a DDP run has no Horovod settings
        "bucket_cap_mb": 25.0, "fusion_threshold_mb": None, "cycle_time_ms": None,
        "compression": "none", "global_batch_size": None, "fabric_profile": "ideal",
        "intra_link": None, "intra_mbit": None, "storage_bandwidth_mbit": None,
        # a DDP run has no parameter servers
        "ps_placement": None, "ps_servers": None, "ps_overlap": None,
        # no checkpoints (the interval 0: the mode and the place apply to none)
        "checkpoint_every": 0, "checkpoint_mode": None, "checkpoint_to": None,
        "keep_checkpoints": False,
        # no failure injected
        "inject_failure": "off"}
    assert train.node_names == ("demo-n0", "demo-n1", "demo-n2")
    probe = next(r for r in runs if r.kind == "allreduce")
    assert probe.params["batch_size"] is None and probe.params["image_size"] is None
    assert all(probe.params[k] is None for k in COMM_KEYS)
    # up to 256 MB by default: NCCL reaches its bus bandwidth only there
    assert probe.allreduce_sizes == (4096, 65536, 1 << 20, 16 << 20, 256 << 20)


def test_image_size_defaults_per_model_and_can_be_set():
    runs = plan(spec(model="resnet50", nodes="1"), make_cluster(1), True)
    assert {r.params["image_size"] for r in runs} == {224}
    runs = plan(spec(model="resnet50", nodes="1", image_size="128"), make_cluster(1), True)
    assert {r.params["image_size"] for r in runs} == {128}


@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(st.integers(1, 6), min_size=1, max_size=4, unique=True),
       batches=st.lists(st.integers(1, 256), min_size=1, max_size=3, unique=True),
       rates=st.lists(st.sampled_from(["native", "10mbit", "1gbit", "2500kbit"]), min_size=1,
                      max_size=3, unique=True),
       ppns=st.lists(st.integers(1, 3), min_size=1, max_size=2, unique=True),
       repeats=st.integers(1, 3))
def test_plan_size_and_unique_ids_for_any_axes(nodes, batches, rates, ppns, repeats):
    s = spec(nodes=",".join(map(str, nodes)), batch_size=",".join(map(str, batches)),
             bandwidth=",".join(rates), procs_per_node=",".join(map(str, ppns)),
             repeats=repeats)
    runs = plan(s, make_cluster(6, cpus=4), can_shape=True)
    ids = [r.run_id for r in runs]
    assert len(ids) == len(set(ids))
    multi = sum(1 for n in nodes for p in ppns if n * p > 1)
    assert len(runs) == len(rates) * (repeats * len(nodes) * len(ppns) * len(batches) + multi)


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("option, value, message", [
    ("nodes", "0", "--nodes: 0 in '0' is below the minimum of 1"),
    ("nodes", "10-1", "--nodes: '10-1' runs backwards; write it as 1-10"),
    ("nodes", "-1", "--nodes: -1"),
    ("nodes", "abc", "--nodes: 'abc' is not a number or range"),
    ("batch_size", "0", "--batch-size: 0 in '0' is below the minimum of 1"),
    ("batch_size", "-3", "--batch-size: -3"),
    ("batch_size", "abc", "--batch-size: 'abc' is not a number"),
    ("bandwidth", "fast", "--bandwidth: 'fast' is not a rate"),
    ("bandwidth", "0mbit", "--bandwidth: '0mbit' is zero"),
    ("model", "resnet51", "'resnet50' or 'resnet56'?"),
    ("model", "ResNet-50", "--model: unknown 'resnet-50'; did you mean 'resnet50'?"),
    ("model", "vgg16", "--model: unknown 'vgg16'; choose one of resnet18"),
    ("engine", "mpi", "--engine: unknown 'mpi'; choose one of ddp, horovod"),
    ("precision", "fp16", "--precision: unknown 'fp16'"),
    ("repeats", "0", "--repeats: 0 is below the minimum of 1"),
    ("steps", "ten", "--steps: 'ten' is not a whole number"),
    ("procs_per_node", "0", "--procs-per-node: 0"),
    ("timeout_s", "-5", "--timeout: '-5' must be a positive number of seconds"),
    ("allreduce_sizes", "1M,huge", "--allreduce-sizes: 'huge' is not a size"),
    ("data", "imagenet", "--data: 'imagenet' must be synthetic, an absolute path on the nodes"),
])
def test_bad_options_are_one_line_input_errors(option, value, message):
    with pytest.raises(InputError) as err:
        spec(**{option: value})
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_axes_say_what_to_give():
    with pytest.raises(InputError, match="give --batch-size, e.g. --nodes 1-3"):
        spec_from_options(nodes="1-3")


def test_more_nodes_than_the_cluster_says_how_to_fix():
    with pytest.raises(InputError) as err:
        plan(spec(nodes="1-10"), make_cluster(3), can_shape=True, cluster="demo")
    assert str(err.value) == (
        "--nodes 1-10 but cluster demo has 3 nodes; provision more with "
        "invoke provision --target local --cluster demo --nodes 10 or use --nodes 1-3")


def test_more_nodes_than_a_cloud_cluster_names_the_target():
    with pytest.raises(InputError, match="invoke provision --target aws --cluster lab "
                                         "--nodes 4 or use --nodes 1,2"):
        plan(spec(nodes="1,2,4"), make_cluster(2, target="aws", gpus=1), True, cluster="lab")


def test_a_rate_on_a_target_that_cannot_shape():
    with pytest.raises(InputError, match="--bandwidth 1gbit: target static cannot shape links; "
                                         "use --bandwidth native"):
        plan(spec(bandwidth="native,1gbit"), make_cluster(3, target="static"), can_shape=False)
    assert plan(spec(bandwidth="native"), make_cluster(3, target="static"), can_shape=False)


def test_procs_per_node_beyond_gpus():
    with pytest.raises(InputError, match="--procs-per-node 8 but node demo-n0 has 4 GPUs; "
                                         "use --procs-per-node 1-4"):
        plan(spec(procs_per_node="1,8", precision="amp"), make_cluster(3, gpus=4), True)
    runs = plan(spec(procs_per_node="1,4", precision="amp"), make_cluster(3, gpus=4), True)
    assert max(r.params["world_size"] for r in runs) == 12


def test_amp_needs_gpus():
    with pytest.raises(InputError, match="--precision amp needs GPUs and cluster demo runs on "
                                         "CPUs; use --precision fp32 or bf16"):
        plan(spec(precision="amp"), make_cluster(3), True, cluster="demo")


def test_oversubscribed_cpu_nodes_only_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="scalelab.sweep.planner"):
        runs = plan(spec(procs_per_node="2"), make_cluster(3, cpus=1.0), True)
    assert runs and "exceeds the 1 CPUs of node demo-n0" in caplog.text


# ------------------------------------------------------------------------------ sweep files


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_typo_in_a_sweep_file_names_key_file_and_fix(tmp_path):
    f = write(tmp_path / "x.yml", "nodes: 1-3\nbatchsize: 32\n")
    with pytest.raises(InputError) as err:
        load_sweep_file(f)
    assert str(err.value) == f"{f}: unknown key 'batchsize'; did you mean 'batch_size'?"


def test_unknown_key_without_a_close_match_lists_the_keys(tmp_path):
    f = write(tmp_path / "x.yml", "nodes: 1-3\nbatch_size: 32\ncolour: blue\n")
    with pytest.raises(InputError, match=r"unknown key 'colour'; valid keys: nodes, procs_per_node, batch_size"):
        load_sweep_file(f)


@pytest.mark.parametrize("text, message", [
    ("nodes: 1-3\nnodes: 1-5\nbatch_size: 32\n", "key 'nodes' given twice"),
    ("nodes: [1, 2\n", "not valid YAML"),
    ("- 1\n- 2\n", "must be a mapping"),
    ("", "must be a mapping"),
    ("nodes: 10-1\nbatch_size: 32\n", "nodes: '10-1' runs backwards"),
    ("nodes: 1-3\nbatch_size: [32, 0]\n", "batch_size: 0 in '0' is below the minimum"),
    ("nodes: 1-3\nbatch_size: 32\nbandwidth: [1gbit, fast]\n", "bandwidth: 'fast'"),
    ("nodes: 1-3\nbatch_size: 32\nallreduce_probe: maybe\n", "'maybe' is not true or false"),
    ("nodes: 1-3\n", "gives no batch_size; add it there or give --batch-size"),
])
def test_bad_sweep_files(tmp_path, text, message):
    f = write(tmp_path / "bad.yml", text)
    with pytest.raises(InputError) as err:
        load_sweep_file(f)
    assert message in str(err.value) and str(f) in str(err.value)


def test_sweep_file_accepts_lists_ranges_and_numbers(tmp_path):
    f = write(tmp_path / "ok.yml", "nodes: [1, 3-4]\nbatch_size: 32\nbandwidth: 1gbit\n"
                                   "procs_per_node: 2\nallreduce_sizes: [4K, 1048576]\n")
    s = load_sweep_file(f)
    assert (s.nodes, s.batch_sizes, s.bandwidths, s.procs_per_node, s.allreduce_sizes) == (
        [1, 3, 4], [32], [1000.0], [2], [4096, 1 << 20])


def test_cli_options_override_the_file(tmp_path):
    f = write(tmp_path / "base.yml", "nodes: 1-3\nbatch_size: [32, 64]\nbandwidth: 1gbit\n"
                                     "model: resnet20\nrepeats: 2\n")
    s = spec_from_options(sweep_file=str(f), nodes="1,2", repeats="1", bandwidth="",
                          precision=None)
    assert s.nodes == [1, 2] and s.repeats == 1  # given: overridden
    assert s.batch_sizes == [32, 64] and s.bandwidths == [1000.0]  # not given: from the file
    assert s.model == "resnet20"


def test_cli_can_supply_an_axis_the_file_leaves_out(tmp_path):
    f = write(tmp_path / "partial.yml", "batch_size: 16\nmodel: resnet32\n")
    s = spec_from_options(sweep_file=f, nodes="2")
    assert (s.nodes, s.batch_sizes, s.model) == ([2], [16], "resnet32")


def test_sweep_files_are_found_by_name(tmp_path):
    write(tmp_path / "mine.yml", "nodes: 1\nbatch_size: 8\n")
    assert find_sweep_file("mine", tmp_path) == tmp_path / "mine.yml"
    with pytest.raises(InputError, match=r"sweep file 'nope' not found; give a path or one of: "
                                         r"mine"):
        find_sweep_file("nope", tmp_path)
    assert find_sweep_file("demo") == SWEEPS_DIR / "demo.yml"


def test_spec_round_trips_through_sweep_json_plan():
    for name in ("demo", "cpu-demo", "ci", "slices"):
        s = load_sweep_file(SWEEPS_DIR / f"{name}.yml")
        assert spec_from_mapping(spec_to_dict(s), "sweep.json") == s
    s = spec(bandwidth="2500kbit,native", image_size=64)
    assert spec_from_mapping(spec_to_dict(s), "sweep.json") == s


# ------------------------------------------------------------------------------ shipped sweeps


def test_demo_sweep_is_the_reference_experiment_in_miniature():
    s = load_sweep_file(SWEEPS_DIR / "demo.yml")
    # ResNet-50 on emulated GPUs, up to 8 nodes, two batch sizes, 1 against 10 Gbit/s
    assert (s.model, s.accelerator, s.engine) == ("resnet50", "v100", "ddp")
    assert s.nodes == [1, 2, 4, 8] and len(s.batch_sizes) == 2
    assert s.bandwidths == [1000.0, 10000.0]
    # links as Ethernet with TCP carries them, not as tc's ideal rate
    assert s.fabric_profile == "ethernet-tcp"
    runs = plan(s, make_cluster(8), can_shape=True, cluster="demo")
    assert len(runs) == 16 and all(r.kind == "train" for r in runs)
    assert all(r.params["accelerator"] == "v100" and r.params["dilation"] is None for r in runs)


def test_cpu_demo_sweep_fits_three_local_nodes_and_a_few_minutes():
    s = load_sweep_file(SWEEPS_DIR / "cpu-demo.yml")
    assert MODELS[s.model].image_size == 32 and s.nodes == [1, 2, 3] and s.accelerator is None
    runs = plan(s, make_cluster(3), can_shape=True, cluster="demo")
    assert len([r for r in runs if r.kind == "train"]) == 12
    assert 150 <= estimate_duration_s(runs) <= 330


def test_ci_sweep_is_tiny():
    s = load_sweep_file(SWEEPS_DIR / "ci.yml")
    runs = plan(s, make_cluster(2), can_shape=True)
    assert s.nodes == [1, 2] and s.batch_sizes == [16] and s.steps <= 5
    assert s.bandwidths == [None, 1000.0] and len(runs) == 6


def test_slices_sweep_is_the_reference_experiment():
    s = load_sweep_file(SWEEPS_DIR / "slices.yml")
    assert (s.model, s.engine, s.precisions, s.repeats) == ("resnet50", "horovod", ["amp"], 3)
    assert (s.nodes, s.batch_sizes, s.bandwidths) == (list(range(1, 11)), [32, 64, 96],
                                                      [1000.0, 10_000.0])
    runs = plan(s, make_cluster(10, gpus=1, target="openstack"), can_shape=True)
    assert len([r for r in runs if r.kind == "train"]) == 180
    assert len([r for r in runs if r.kind == "allreduce"]) == 18
    with pytest.raises(InputError, match="amp needs GPUs"):
        plan(s, make_cluster(10), can_shape=True)


# ------------------------------------------------------------------------------ text, ids, time


def test_describe_is_one_readable_line():
    runs = plan(spec(bandwidth="100mbit"), make_cluster(3), True)
    lines = [describe(r) for r in runs]
    assert all("\n" not in line and "100mbit" in line for line in lines)
    train = describe(next(r for r in runs if r.run_id == "train-n03-p1-b064-bw100-r0"))
    assert re.search(r"train\s+3 nodes x 1\s+batch 64\s+100mbit\s+repeat 0", train)
    probe = describe(next(r for r in runs if r.kind == "allreduce"))
    assert "allreduce" in probe and "4K..256M" in probe


def test_estimates_grow_with_steps_and_shrink_with_bandwidth():
    cluster = make_cluster(3)

    def total(**kw):
        return estimate_duration_s(plan(spec(**kw), cluster, True))

    assert total(steps=60) > total(steps=30)
    assert total(bandwidth="10mbit") > total(bandwidth="1gbit")
    # a measured per-step time replaces the default guess
    runs = plan(spec(), cluster, True)
    assert estimate_duration_s(runs, {"resnet20": 2.0}) > estimate_duration_s(runs)


def test_sweep_ids_sort_by_time_and_do_not_collide():
    t = datetime(2026, 11, 21, 15, 30, tzinfo=UTC)
    assert new_sweep_id(t, "ab12") == "20261121-153000-ab12"
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", new_sweep_id(t))
    ids = [new_sweep_id(t + timedelta(seconds=s)) for s in (0, 1, 59, 3600, 86400)]
    assert ids == sorted(ids)
    assert len({new_sweep_id(t) for _ in range(50)}) > 40  # 4 random hex digits
    # the clock of the operator does not matter: ids are UTC
    cet = timezone(timedelta(hours=1))
    assert new_sweep_id(datetime(2026, 11, 21, 16, 30, tzinfo=cet), "x") == "20261121-153000-x"


def test_docstring_examples_hold():
    import doctest

    import scalelab.sweep.planner

    result = doctest.testmod(scalelab.sweep.planner, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 10


# ------------------------------------------------------------------------------ memory


def _gpu_hosts(n: int, gpu_mb: int) -> list[Node]:
    return [Node(name=f"g{i}", address=f"192.0.2.{i + 1}", private_address=f"10.0.0.{i + 1}",
                 role="head" if i == 0 else "worker", target="static", gpus=1, cpus=16,
                 facts={"gpus": 1, "gpu_memory_mb": gpu_mb, "memory_mb": 64_000})
            for i in range(n)]


def test_a_batch_no_gpu_can_hold_is_refused_with_the_largest_that_fits():
    hosts = _gpu_hosts(4, 16_384)  # 16 GiB GPUs, e.g. V100-16GB
    s = spec(nodes="1-4", batch_size="64,256", model="resnet50")
    with pytest.raises(InputError) as e:
        plan(s, hosts, can_shape=True, cluster="lab")
    # fp32: 4 x 4 x 25.56M = 409 MB state + 1 GiB runtime; 94.5 MB per image -> 166 fit
    assert str(e.value) == (
        "--batch-size 256: resnet50 needs about 23.9 GiB per rank at batch 256, more than "
        "node g0's 16.0 GiB GPU give its rank; the largest batch that fits every planned run "
        "is 166: use --batch-size 166 or less")
    # amp halves the activations: 256 fits on the same GPUs
    amp = spec(nodes="1-4", batch_size="64,256", model="resnet50", precision="amp")
    assert len(plan(amp, hosts, can_shape=True, cluster="lab")) > 0


def test_emulated_nodes_share_their_hosts_memory():
    shared = [Node(name=f"n{i}", address=f"10.1.0.{i + 2}", private_address=f"10.1.0.{i + 2}",
                   role="head" if i == 0 else "worker", target="local", cpus=1,
                   facts={"memory_mb": 8192, "memory_pool": "host h"}) for i in range(4)]
    s = spec(nodes="1,4", batch_size="32", model="resnet50")
    # 8 GiB x 0.9 less four warm-start servers of 304 MB, / 4 ranks = 1.52 GiB each; 409 MB
    # state + 512 MiB runtime + 94.5 MB an image: batch 32 needs 3.7 GiB, 7 images fit
    with pytest.raises(InputError, match=r"the 7.2 GiB that nodes n0-n3 share \(less 1.1 GiB "
                                         r"for their warm-start servers\) give each of 4 ranks; "
                                         r"the largest batch that fits every planned run is 7"):
        plan(s, shared, can_shape=True)
    # started cold (no servers), 7.2 GiB / 4 = 1.84 GiB each: 10 images fit
    with pytest.raises(InputError, match=r"the 7.2 GiB that nodes n0-n3 share give each of 4 "
                                         r"ranks; the largest batch that fits every planned run "
                                         r"is 10"):
        plan(spec(nodes="1,4", batch_size="32", model="resnet50", warm_start=False), shared,
             can_shape=True)
    # the same nodes on hosts of their own each have 7.2 GiB: batch 32 fits
    own = [Node(**{**n.__dict__, "facts": {"memory_mb": 8192}}) for n in shared]
    assert plan(s, own, can_shape=True)


def test_a_global_batch_is_checked_at_each_layout_by_its_share():
    """Strong scaling on 4 emulated nodes sharing 8 GiB (less their warm-start servers): 28
    images fit one rank alone and 7 per rank when 4 share; a global batch of 28 is 28 at 1 node
    and 7 at 4, so it fits both (a check of 28 per rank against 4 ranks would refuse it), while
    32 leaves 8 per rank at 4 nodes, which does not fit, and the line says where."""
    shared = [Node(name=f"n{i}", address=f"10.1.0.{i + 2}", private_address=f"10.1.0.{i + 2}",
                   role="head" if i == 0 else "worker", target="local", cpus=1,
                   facts={"memory_mb": 8192, "memory_pool": "host h"}) for i in range(4)]
    ok = plan(spec(nodes="1,4", batch_size=None, global_batch_size="28", model="resnet50"),
              shared, can_shape=True)
    assert sorted({(r.params["world_size"], r.params["batch_size"]) for r in ok
                   if r.kind == "train"}) == [(1, 28), (4, 7)]
    with pytest.raises(InputError) as e:
        plan(spec(nodes="1,4", batch_size=None, global_batch_size="32", model="resnet50"),
             shared, can_shape=True)
    assert str(e.value).startswith("--global-batch-size 32 gives each of 4 ranks 8 (4 nodes "
                                   "x 1); --batch-size 8: resnet50 needs"), str(e.value)


def test_demo_estimate_on_the_local_target_matches_the_measured_sweep():
    # measured (README, bench/perf/sweep_overhead.py): 152-159 s with warm-started ranks;
    # 233 s when every rank imported torch itself, which the cold estimate stands for
    runs = plan(load_sweep_file(SWEEPS_DIR / "demo.yml"), make_cluster(8), can_shape=True,
                cluster="demo")
    warm = estimate_duration_s(runs, shared_host=True, warm=True)
    cold = estimate_duration_s(runs, shared_host=True)
    assert 130 <= warm <= 190, warm
    assert cold - warm >= 16 * 5
    # on real hosts (nodes of their own) dilation auto stays 1: the steps take the profile's time
    assert estimate_duration_s(runs) < cold


# ------------------------------------------------------------------------------ communication axes

def test_comm_axes_at_defaults_keep_todays_run_ids():
    plain = plan(spec(bandwidth="1gbit"), make_cluster(3), can_shape=True)
    explicit = plan(spec(bandwidth="1gbit", bucket_cap_mb="25", compression="none"),
                    make_cluster(3), can_shape=True)
    assert [r.run_id for r in explicit] == [r.run_id for r in plain]
    assert "train-n02-p1-b032-bw1000-r0" in [r.run_id for r in plain]


def test_varied_bucket_size_and_compression_add_run_id_segments():
    runs = plan(spec(nodes="2", batch_size="32", bandwidth="1gbit", repeats=1,
                     bucket_cap_mb="25,50", compression="none,fp16"),
                make_cluster(2), can_shape=True)
    train = [r for r in runs if r.kind == "train"]
    assert [r.run_id for r in train] == [
        "train-n02-p1-b032-bw1000-bk25-none-r0", "train-n02-p1-b032-bw1000-bk25-fp16-r0",
        "train-n02-p1-b032-bw1000-bk50-none-r0", "train-n02-p1-b032-bw1000-bk50-fp16-r0"]
    assert [(r.params["bucket_cap_mb"], r.params["compression"]) for r in train] == [
        (25.0, "none"), (25.0, "fp16"), (50.0, "none"), (50.0, "fp16")]
    # one probe per (rate, nodes), whatever the settings
    assert [r.run_id for r in runs if r.kind == "allreduce"] == ["allreduce-n02-p1-bw1000"]
    # a single non-default value is named too, so its runs never look like default ones
    one = plan(spec(nodes="2", batch_size="32", bandwidth="1gbit", repeats=1,
                    bucket_cap_mb="50"), make_cluster(2), can_shape=True)
    assert [r.run_id for r in one if r.kind == "train"] == ["train-n02-p1-b032-bw1000-bk50-r0"]


def test_horovod_axes_vary_horovod_runs():
    runs = plan(spec(nodes="2", batch_size="32", bandwidth="1gbit", repeats=1, engine="horovod",
                     fusion_threshold_mb="64,128", cycle_time_ms="5"),
                make_cluster(2), can_shape=True)
    train = [r for r in runs if r.kind == "train"]
    assert [r.run_id for r in train] == ["train-n02-p1-b032-bw1000-fu64-ct5-r0",
                                         "train-n02-p1-b032-bw1000-fu128-ct5-r0"]
    assert all(r.params["bucket_cap_mb"] is None for r in train)
    assert [r.params["fusion_threshold_mb"] for r in train] == [64.0, 128.0]


@pytest.mark.parametrize(("engine", "option"), [
    ("ddp", {"fusion_threshold_mb": "64"}), ("ddp", {"cycle_time_ms": "5"}),
    ("horovod", {"bucket_cap_mb": "50"})])
def test_an_axis_of_the_other_engine_is_refused(engine, option):
    with pytest.raises(InputError, match="is a setting of --engine"):
        spec(engine=engine, **option)


@pytest.mark.parametrize(("option", "value"), [
    ("bucket_cap_mb", "0"), ("bucket_cap_mb", "-5"), ("cycle_time_ms", "x"),
    ("compression", "int8")])
def test_bad_comm_values_are_refused(option, value):
    engine = "horovod" if option == "cycle_time_ms" else "ddp"
    with pytest.raises(InputError, match=option.replace("_", "-")):
        spec(engine=engine, **{option: value})


def test_comm_axes_round_trip_through_the_sweep_json_plan():
    from scalelab.sweep.sweepfile import spec_from_mapping, spec_to_dict

    s = spec(bucket_cap_mb="10,50", compression="fp16")
    d = spec_to_dict(s)
    assert d["bucket_cap_mb"] == [10.0, 50.0] and d["compression"] == ["fp16"]
    assert "fusion_threshold_mb" not in d  # not given: an old plan's keys are unchanged
    assert spec_from_mapping(d, "sweep.json").bucket_cap_mb == [10.0, 50.0]
    assert "bucket_cap_mb" not in spec_to_dict(spec())


def test_each_data_source_is_its_own_runs_and_a_storage_rate_only_real_data_s():
    """--data sources are a variant axis (run ids syn, or d and six hex digits of the source:
    two paths with one last name stay apart); --storage-bandwidth applies to real data only
    (st<Mbit/s> in the run id), synthetic runs are planned once."""
    web = "http://10.0.0.12:8610/in/shards/shard-{000000..000009}.tar"
    runs = plan(spec(nodes="2", batch_size="64", repeats="1", data=f"synthetic,/a/in,/b/in,{web}",
                     storage_bandwidth="20mbit,1gbit"), make_cluster(3), can_shape=True)
    train = {r.run_id: r.params for r in runs if r.kind == "train"}
    by = {}
    for rid, p in train.items():
        by.setdefault(p["data"], []).append((rid, p["storage_bandwidth_mbit"]))
    assert [rid for rid, _ in by["synthetic"]] == ["train-n02-p1-b064-native-syn-r0"]
    assert by["synthetic"][0][1] is None
    tags = {source: {re.search(r"-(d[0-9a-f]{6})-", rid)[1] for rid, _ in got}
            for source, got in by.items() if source != "synthetic"}
    assert all(len(t) == 1 for t in tags.values()) and len(set.union(*tags.values())) == 3
    for source in ("/a/in", "/b/in", web):
        assert sorted((re.search(r"-(st\d+)-", rid)[1], mbit) for rid, mbit in by[source]) == [
            ("st1000", 1000.0), ("st20", 20.0)]


def test_loader_workers_and_pinned_memory_are_axes_of_real_data_only():
    """--loader-workers and --pin-memory sweep the input pipeline of real-data runs (lw<n> and
    pin<choice> in the run id); a synthetic run is planned once and records the first value,
    as it did when they were lone settings; a lone value leaves run ids unchanged."""
    runs = plan(spec(nodes="2", batch_size="64", repeats="1", data="synthetic,/a/in",
                     loader_workers="4,1", pin_memory="on,off"), make_cluster(2),
                can_shape=True)
    train = [(r.run_id, r.params) for r in runs if r.kind == "train"]
    synth = [(rid, p) for rid, p in train if p["data"] == "synthetic"]
    assert [rid for rid, _ in synth] == ["train-n02-p1-b064-native-syn-r0"]
    assert (synth[0][1]["loader_workers"], synth[0][1]["pin_memory"]) == (1, "on")
    real = sorted((p["loader_workers"], p["pin_memory"], re.search(r"-(lw\d+-pin\w+)-", rid)[1])
                  for rid, p in train if p["data"] == "/a/in")
    assert real == [(1, "off", "lw1-pinoff"), (1, "on", "lw1-pinon"),
                    (4, "off", "lw4-pinoff"), (4, "on", "lw4-pinon")]
    lone = plan(spec(nodes="2", batch_size="64", repeats="1", data="/a/in", loader_workers="4"),
                make_cluster(2), can_shape=True)
    assert [r.run_id for r in lone if r.kind == "train"] == ["train-n02-p1-b064-native-r0"]
    assert [r.params["loader_workers"] for r in lone if r.kind == "train"] == [4]
