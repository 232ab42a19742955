"""The input's ceilings in the model (scalelab.model.datapath), on frames made by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from scalelab.model import datapath


def _points(storage_mb_s: float, decode: float) -> pd.DataFrame:
    base = {"sweep_id": "s", "model": "resnet50", "engine": "ddp", "precision": "fp32",
            "data": "http://10.0.0.12:8610/in/shards/shard-{000000..000009}.tar",
            "batch_size": 32, "bandwidth": "native", "procs_per_node": 1, "settings": "",
            "scaling": "weak", "batch_per_worker": 32, "baseline_world_size": 1,
            "model_step_s": 0.1, "data_bytes_per_image": 112_000.0, "loader_workers": 2,
            "storage_read_mb_s": storage_mb_s, "decode_img_s_per_core": decode}
    return pd.DataFrame([{**base, "world_size": 1, "nodes": 1, "model_eff": 1.0},
                         {**base, "world_size": 2, "nodes": 2, "model_eff": 0.95}])


def test_the_storage_ceiling_sets_the_modelled_step_and_efficiency():
    """11.2 MB/s of 112 KB images feed 100 images/s; two ranks would take 640: each step
    waits for its input (2 x 32 / 100 = 0.64 s), and the efficiency falls by the ratio of
    supply to demand against the baseline's (0.95 x (100/640) / (100/320))."""
    out = datapath.add_input_ceiling(_points(11.2, 300.0))
    two = out[out["world_size"] == 2].iloc[0]
    assert two["input_limit"] == "storage" and bool(two["model_input_bound"])
    assert two["input_storage_ips"] == pytest.approx(100.0)
    assert two["input_decode_ips"] == pytest.approx(300.0 * 2 * 2)
    assert two["input_demand_ips"] == pytest.approx(640.0)
    assert two["model_step_s"] == pytest.approx(0.64)
    assert two["model_eff"] == pytest.approx(0.95 * (100 / 640) / (100 / 320))


def test_the_decode_ceiling_binds_where_the_cores_are_slower_than_the_storage():
    out = datapath.add_input_ceiling(_points(1000.0, 50.0))  # 50/core x 2 workers a rank
    two = out[out["world_size"] == 2].iloc[0]
    assert two["input_limit"] == "decode" and two["input_ips"] == pytest.approx(200.0)


def test_enough_input_or_no_probe_leaves_the_model_as_it_was():
    for frame in (_points(1e6, 1e6), _points(math.nan, math.nan)):
        out = datapath.add_input_ceiling(frame)
        assert not out["model_input_bound"].any()
        assert list(out["model_step_s"]) == [0.1, 0.1] and list(out["model_eff"]) == [1.0, 0.95]


def test_the_sizing_table_has_every_shipped_profile_and_mlperf_last():
    """One row per shipped ResNet-50 device profile, then MLPerf Storage's emulated H100:
    1,786 samples/s of 114,660 bytes kept 90 % busy need 184.3 MB/s each."""
    rates = datapath.profile_rates()
    assert {label.split()[0] for label, _ in rates} == {"A100", "H100", "H200", "V100"}
    table = datapath.sizing(112_000.0, 300.0, 1000.0, rates)
    assert len(table) == len(rates) + 1
    last = table.iloc[-1]
    assert last["device"].startswith("MLPerf Storage emulated H100")
    assert last["mb_s_per_gpu"] == pytest.approx(1786 * 114_660 * 0.9 / 1e6)
    assert last["gpus_fed"] == 5  # 1,000 MB/s over 184.3 each
    assert last["gb_s_64"] == pytest.approx(last["mb_s_per_gpu"] * 8 * 64 / 1e3)
