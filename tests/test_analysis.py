"""Analysis and results loading: arithmetic checked against hand computations (in comments)."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pandas as pd
import pytest

from scalelab.core.errors import InputError, ScalelabError
from scalelab.model import accel, analysis, bucket_model, verdict
from scalelab.model.analysis import (
    add_efficiency,
    add_model,
    baseline_world_size,
    fit_alpha_s,
    host_limits,
    missing_baselines,
    ring_allreduce_time_s,
    scaling_efficiency,
    summarize,
)
from scalelab.model.stats import mean_ci, t_critical
from scalelab.results import frames

# ------------------------------------------------------------------------------ helpers


def run_row(**kw) -> dict:
    """One row of the run frame (frames.to_frame's columns), with quiet defaults."""
    row = {"sweep_id": "s", "run_id": "r", "target": "aws", "nodes": 1, "procs_per_node": 1,
           "world_size": 1, "model": "resnet50", "engine": "ddp", "precision": "fp32",
           "batch_size": 32, "bandwidth_mbit": 1000.0, "bandwidth": "1gbit", "repeat": 0,
           "status": "ok", "images_per_sec": 80.0, "images_per_sec_per_worker": 80.0,
           "step_time_mean_s": 0.4, "step_time_p95_s": 0.45, "comm_fraction": 0.0,
           "busbw_mb_s": math.nan, "link_mbit_measured": math.nan, "started_at": "",
           "duration_s": 10.0, "error": "", "data": "synthetic", "steps": 30, "image_size": 224,
           "gradient_bytes": 50e6, "compute_time_mean_s": 0.4, "comm_time_mean_s": 0.0,
           "n_ranks": 1}
    row.update(kw)
    if "world_size" not in kw:
        row["world_size"] = row["nodes"] * row["procs_per_node"]
    return row


def layout_run(nodes: int, step: float, batch: int = 32, **kw) -> dict:
    """A run whose ranks each took `step` seconds per step (so images/s = ranks x batch/step)."""
    ws = nodes * kw.get("procs_per_node", 1)
    per = batch / step
    base = {"nodes": nodes, "world_size": ws, "batch_size": batch, "step_time_mean_s": step,
            "images_per_sec": per * ws, "images_per_sec_per_worker": per}
    return run_row(**{**base, **kw})


def modelled(rows: list[dict], alpha_s: float = 0.0, overlap: bool = False) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    frame["scaling_efficiency"] = add_efficiency(frame)
    return add_model(summarize(frame), alpha_s=alpha_s, overlap=overlap)


# ------------------------------------------------------------------------------ statistics


@pytest.mark.parametrize("df, expected", [
    # two-sided 95% critical values from any Student t table
    (1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (9, 2.262), (19, 2.093), (30, 2.042),
    (120, 1.980),
])
def test_t_critical_matches_the_table(df, expected):
    assert t_critical(df) == pytest.approx(expected, abs=6e-4)


def test_t_critical_rejects_bad_degrees_of_freedom():
    with pytest.raises(InputError, match="positive integer"):
        t_critical(0)


def test_mean_ci_hand_computed():
    # values 0.80, 0.85, 0.90: mean 0.85, sample sd 0.05, n 3, t(2) = 4.3027
    # half width = 4.30265 x 0.05 / sqrt(3) = 4.30265 x 0.0288675 = 0.124207
    ci = mean_ci([0.80, 0.85, 0.90])
    assert ci.mean == pytest.approx(0.85)
    assert ci.half_width == pytest.approx(0.124207, abs=2e-6)
    assert (ci.lo, ci.hi, ci.n) == (pytest.approx(0.725793, abs=2e-6),
                                    pytest.approx(0.974207, abs=2e-6), 3)


def test_one_repeat_gives_no_interval_and_nans_are_ignored():
    ci = mean_ci([7.0, float("nan")])
    assert ci.mean == 7.0 and ci.n == 1
    assert math.isnan(ci.lo) and math.isnan(ci.hi)
    assert mean_ci([]).n == 0


# ------------------------------------------------------------------------------ efficiency


def test_scaling_efficiency_hand_computed():
    # 4 ranks at 320 images/s against 1 rank at 100: ideal 400, efficiency 0.8
    assert scaling_efficiency(320, 4, 100, 1) == pytest.approx(0.8)
    # baseline of 2 ranks at 100 images/s, 8 ranks at 300: ideal 8/2 x 100 = 400 -> 0.75
    assert scaling_efficiency(300, 8, 100, 2) == pytest.approx(0.75)
    assert math.isnan(scaling_efficiency(300, 8, 0.0, 2))


def test_efficiency_is_per_repeat_against_the_mean_baseline_with_t_interval():
    rows = [layout_run(1, 0.4, images_per_sec=99.0, repeat=0),
            layout_run(1, 0.4, images_per_sec=101.0, repeat=1),
            layout_run(2, 0.4, images_per_sec=180.0, repeat=0),
            layout_run(2, 0.4, images_per_sec=190.0, repeat=1),
            layout_run(2, 0.4, images_per_sec=500.0, repeat=2, status="failed")]
    frame = pd.DataFrame(rows)
    eff = add_efficiency(frame)
    # baseline mean (99 + 101) / 2 = 100; 180 / (2 x 100) = 0.9, 190 / 200 = 0.95
    assert eff.iloc[:4].tolist() == pytest.approx([0.99, 1.01, 0.9, 0.95])
    assert math.isnan(eff.iloc[4])  # failed runs get no efficiency
    frame["scaling_efficiency"] = eff
    s = summarize(frame).set_index("world_size")
    # N=2: mean 0.925, sd |0.95 - 0.90| / sqrt(2) = 0.0353553, t(1) = 12.7062,
    # half = 12.7062 x 0.0353553 / sqrt(2) = 12.7062 x 0.025 = 0.317655
    assert s.loc[2, "eff_mean"] == pytest.approx(0.925)
    assert s.loc[2, "eff_hi"] - s.loc[2, "eff_mean"] == pytest.approx(0.317655, abs=1e-5)
    # throughput at N=2: mean 185, sd 7.0711, half = 12.7062 x 7.0711 / sqrt(2) = 63.531
    assert s.loc[2, "thr_mean"] == pytest.approx(185.0)
    assert s.loc[2, "thr_mean"] - s.loc[2, "thr_lo"] == pytest.approx(63.531, abs=1e-3)
    assert s.loc[2, "n"] == 2  # the failed repeat is not counted


def test_baseline_is_the_smallest_world_size_of_each_series():
    # ppn 2 series starts at 2 ranks: 1 node x 2 at 150 images/s; 2 nodes x 2 at 240
    # -> 240 / (4/2 x 150) = 0.8, not compared with the ppn 1 series
    rows = [layout_run(1, 0.4, images_per_sec=80.0),
            layout_run(2, 0.4, images_per_sec=150.0),
            layout_run(1, 0.4, procs_per_node=2, images_per_sec=150.0),
            layout_run(2, 0.4, procs_per_node=2, images_per_sec=240.0)]
    eff = add_efficiency(pd.DataFrame(rows))
    assert eff.tolist() == pytest.approx([1.0, 150 / 160, 1.0, 0.8])


def test_baseline_is_the_planned_smallest_size_never_the_smallest_that_succeeded():
    rows = [layout_run(1, 0.4, images_per_sec=100.0, status="failed"),
            layout_run(2, 0.4, images_per_sec=180.0),
            layout_run(4, 0.4, images_per_sec=320.0)]
    frame = pd.DataFrame(rows)
    # the 1-node run failed: no efficiency at all (2 nodes would otherwise read 100 %)
    assert add_efficiency(frame).isna().all()
    assert baseline_world_size(frame).tolist() == [1.0, 1.0, 1.0]
    # the plan started at 1 node but no 1-node run was recorded yet: the plan still decides
    later = frame.iloc[1:]
    assert add_efficiency(later, baseline_world_size(later, {"s": 1})).isna().all()
    assert add_efficiency(later).tolist() == pytest.approx([1.0, 320 / 360])  # no plan: as recorded
    frame["baseline_world_size"] = baseline_world_size(frame)
    assert missing_baselines(frame)[["batch_size", "baseline_world_size"]].values.tolist() == [
        [32, 1.0]]


# ------------------------------------------------------------------------------ the model


def test_ring_allreduce_hand_computed():
    # N=2, S=50 MB, B=1000 Mbit/s=125 MB/s: 2 x 1/2 x 50/125 = 0.4 s, + 50 us x 2 = 0.4001 s
    assert ring_allreduce_time_s(2, 50e6, 1000.0, 50e-6) == pytest.approx(0.4001)
    # N=8, S=100 MB, B=10 Gbit/s=1250 MB/s: 2 x 7/8 x 0.08 = 0.14 s, + 50 us x 14 = 0.1407 s
    assert ring_allreduce_time_s(8, 100e6, 10000.0, 50e-6) == pytest.approx(0.1407)
    assert ring_allreduce_time_s(1, 100e6, 1000.0) == 0.0
    arr = ring_allreduce_time_s(np.array([1, 2, 4]), 50e6, 1000.0, 0.0)
    # N=4: 2 x 3/4 x 0.4 = 0.6 s
    assert arr.tolist() == pytest.approx([0.0, 0.4, 0.6])


def test_link_rate_precedence():
    assert analysis.model_link_mbit(900.0, 1000.0, 100.0) == (900.0, "measured")
    assert analysis.model_link_mbit(math.nan, 1000.0, 100.0) == (1000.0, "requested")
    # busbw 100 MB/s = 800 Mbit/s
    assert analysis.model_link_mbit(math.nan, math.nan, 100.0) == (800.0, "busbw")


def test_model_predicts_step_and_efficiency_hand_computed():
    # compute 0.4 s measured at 1 rank; S = 50 MB over 1000 Mbit/s, alpha 0:
    # N=2: comm 0.4 -> step 0.8 -> efficiency 0.4 / 0.8 = 0.5, comm share 0.5
    # N=4: comm 0.6 -> step 1.0 -> efficiency 0.4; overlap: max(0.4, 0.6) = 0.6 -> 0.6667
    rows = [layout_run(1, 0.4), layout_run(2, 0.8, comm_time_mean_s=0.4),
            layout_run(4, 1.0, comm_time_mean_s=0.6)]
    m = modelled(rows).set_index("world_size")
    assert m["predicted_step_s"].tolist() == pytest.approx([0.4, 0.8, 1.0])
    assert m["predicted_eff"].tolist() == pytest.approx([1.0, 0.5, 0.4])
    assert m.loc[2, "predicted_comm_share"] == pytest.approx(0.5)
    assert m.loc[2, "link_source"] == "requested" and m.loc[1, "link_source"] == "intra-node"
    o = modelled(rows, overlap=True).set_index("world_size")
    assert o["predicted_eff"].tolist() == pytest.approx([1.0, 1.0, 0.4 / 0.6])


def test_alpha_is_fitted_from_the_smallest_probe_message():
    # N=4, 1000 Mbit/s, 1 KiB in 1.5 x 1024 / 125e6 + 6 x 80 us = 4.92288e-4 s -> alpha 80 us
    ar = pd.DataFrame({"run_id": "p", "status": "ok", "nodes": 4, "world_size": 4,
                       "size_bytes": [1024, 1 << 24], "time_s": [4.92288e-4, 0.2],
                       "bandwidth_mbit": 1000.0})
    assert fit_alpha_s(ar) == pytest.approx(80e-6, rel=1e-6)
    assert fit_alpha_s(ar.iloc[0:0]) is None


# ------------------------------------------------------------------------------ bottleneck


def judged(rows, limits=None) -> tuple[pd.DataFrame, verdict.ModelError, list]:
    """Rows through the report's pipeline: the one prediction per point, then the verdicts."""
    return verdict.judge(bucket_model.add_prediction(modelled(rows), alpha_s=0.0), limits)


def kinds(rows, limits=None) -> dict:
    out = {}
    for b in judged(rows, limits)[2]:
        out[(b.series["batch_size"], b.series["data"])] = b
    return out


def test_network_bound_when_measured_tracks_a_heavy_model():
    rows = [layout_run(1, 0.4), layout_run(2, 0.8, comm_time_mean_s=0.4),
            layout_run(4, 1.0, comm_time_mean_s=0.6)]
    b = kinds(rows)[(32, "synthetic")]
    assert b.kind == "network-bound"
    assert b.world_size == 4 and b.measured_eff == pytest.approx(0.4)
    assert "1,000 Mbit/s" in b.explanation and b.explanation.endswith(".")


def test_compute_bound_when_efficiency_is_near_one():
    # 1 MB of gradients: comm(4) = 1.5 x 1e6 / 125e6 = 0.012 s, step 0.412 -> 97%
    rows = [layout_run(n, 0.4 + 0.004 * (n > 1), gradient_bytes=1e6) for n in (1, 2, 4)]
    assert kinds(rows)[(32, "synthetic")].kind == "compute-bound"


def test_emulation_bound_when_ranks_outnumber_host_cores():
    rows = [layout_run(n, 0.4 * n, gradient_bytes=1e6, target="local") for n in (1, 2, 4)]
    lim = {"s": host_limits({"target": "local", "host_cpus": 2, "nodes": [{"cpus": 1}]})}
    b = kinds(rows, lim)[(32, "synthetic")]
    assert b.kind == "emulation-bound" and "2 host cores" in b.explanation


def test_compute_that_grows_with_ranks_is_contention_not_network():
    # each rank does the same work, yet compute per step goes 0.09 s -> 0.28 s at 2 ranks
    # (the CI sweep on a 2-core host showed exactly this); comm 0.03 s is not the cause
    rows = [layout_run(1, 0.095, batch=16, compute_time_mean_s=0.092, gradient_bytes=1.08e6),
            layout_run(2, 0.311, batch=16, compute_time_mean_s=0.279, comm_time_mean_s=0.03,
                       gradient_bytes=1.08e6, link_mbit_measured=960.0)]
    local = [dict(r, target="local") for r in rows]
    lim = {"s": host_limits({"target": "local", "host_cpus": 2, "nodes": [{"cpus": 1}]})}
    b = kinds(local, lim)[(16, "synthetic")]
    assert b.kind == "emulation-bound" and "0.092 s at 1 to 0.279 s at 2" in b.explanation
    assert kinds(rows)[(16, "synthetic")].kind == "undetermined"  # a real cluster: named, not blamed


def test_emulation_bound_when_the_link_falls_short_of_the_request():
    rows = [layout_run(1, 0.4)] + [layout_run(n, 0.4 * n, gradient_bytes=1e6,
                                              link_mbit_measured=500.0) for n in (2, 4)]
    b = kinds(rows)[(32, "synthetic")]
    assert b.kind == "emulation-bound" and "500 of the 1000" in b.explanation


def test_input_bound_when_real_data_is_slower_than_synthetic():
    rows = [layout_run(n, 0.4, gradient_bytes=1e6) for n in (1, 2)]
    rows += [layout_run(n, 0.6, gradient_bytes=1e6, data="/data/imagenet") for n in (1, 2)]
    k = kinds(rows)
    assert k[(32, "/data/imagenet")].kind == "input-bound"
    assert k[(32, "synthetic")].kind == "compute-bound"


def test_undetermined_with_one_size_or_an_unexplained_gap():
    assert kinds([layout_run(2, 0.4)])[(32, "synthetic")].kind == "undetermined"
    # model says ~97% (1 MB of gradients) but measured 50%, no emulation: the gap is named
    rows = [layout_run(1, 0.4, gradient_bytes=1e6), layout_run(2, 0.8, gradient_bytes=1e6)]
    b = kinds(rows)[(32, "synthetic")]
    assert b.kind == "undetermined" and "does not explain" in b.explanation
    assert b.explanation.endswith("would settle it.")


# ------------------------------------------------------------------------------ one model, one verdict


def emulated_series(batch: int = 64, link: float = 1000.0, scale: float = 1.0) -> tuple[list, dict]:
    """resnet50 on an emulated V100 over 1, 2 and 4 nodes, each measured step the overlap
    model's own prediction x scale (x scale beyond one node), and the steps themselves."""
    doc = accel.resolve("v100", "resnet50", "fp32", batch, 224)
    steps = {n: bucket_model.predict_step_s(doc, "ddp", n, link if n > 1 else math.inf, alpha_s=0.0)
             for n in (1, 2, 4)}
    rows = [layout_run(n, steps[n] * (scale if n > 1 else 1.0), batch=batch, accelerator="v100",
                       fidelity="", gradient_bytes=102e6, compute_time_mean_s=steps[1],
                       comm_time_mean_s=steps[n] - steps[1], bandwidth_mbit=link,
                       link_mbit_measured=link if n > 1 else math.nan)
            for n in (1, 2, 4)]
    return rows, steps


def test_one_prediction_per_point_overlap_where_a_profile_exists_ring_elsewhere():
    emu, steps = emulated_series(link=10000.0)
    real = [dict(r, accelerator="", fidelity="") for r in (
        layout_run(1, 0.4), layout_run(2, 0.8, comm_time_mean_s=0.4),
        layout_run(4, 1.0, comm_time_mean_s=0.6))]
    m, _, _ = judged(emu + real)
    m = m.set_index(["batch_size", "world_size"])
    # the profiled series: the overlap model's step, hand-replayed with the profile
    assert set(m.loc[64, "predicted_by"]) == {"overlap"}
    assert m.loc[(64, 4), "model_eff"] == pytest.approx(steps[1] / steps[4])
    assert m.loc[(64, 4), "model_exposed_s"] == pytest.approx(steps[4] - steps[1])
    assert m.loc[(64, 4), "predicted_eff"] < m.loc[(64, 4), "model_eff"] - 0.2  # ring: no overlap
    # the series that computed for real: the ring model stands in, and says why
    assert set(m.loc[32, "predicted_by"]) == {"ring"}
    assert m.loc[32, "model_eff"].tolist() == pytest.approx([1.0, 0.5, 0.4])
    assert m.loc[(32, 4), "model_exposed_s"] == pytest.approx(0.6)  # compute 0.4 + comm 0.6
    assert "no per-layer profile" in m.loc[(32, 4), "model_note"]


def test_the_verdict_comes_from_the_same_prediction_and_carries_the_exposed_comm():
    emu, steps = emulated_series()
    m, error, found = judged(emu)
    b = found[0]
    assert b.kind == "network-bound" and b.world_size == 4 and b.model == "overlap"
    assert b.predicted_eff == pytest.approx(steps[1] / steps[4])
    assert b.exposed_s == pytest.approx(steps[4] - steps[1])
    assert f"{verdict.ms(steps[4] - steps[1])} of that communication is exposed" in b.explanation
    assert "the overlap model predicts" in b.explanation
    # every point above N0 is judged, the baseline is not
    assert m.set_index("world_size")["verdict"].to_dict() == {
        1: "", 2: "network-bound", 4: "network-bound"}
    # the ring model's worked example: 0.6 s of 50 MB over 1000 Mbit/s at 4 ranks, none hidden
    heavy = kinds([layout_run(1, 0.4), layout_run(2, 0.8, comm_time_mean_s=0.4),
                   layout_run(4, 1.0, comm_time_mean_s=0.6)])[(32, "synthetic")]
    assert "600 ms of that communication is exposed" in heavy.explanation
    assert heavy.exposed_s == pytest.approx(0.6) and heavy.model == "ring"


def test_the_model_error_is_computed_once_and_sets_how_sure_the_wording_is():
    exact, _ = emulated_series()
    _, error, found = judged(exact)
    assert error.n == 2 and error.max == pytest.approx(0.0, abs=1e-9)  # multi-node points only
    assert error.confident and "stated plainly" in error.sentence()
    assert "so the link sets the pace" in found[0].explanation
    # measured steps 30% slower than predicted beyond one node: efficiency e / 1.3, not e
    slow, steps = emulated_series(scale=1.3)
    _, error, found = judged(slow)
    effs = [steps[1] / steps[n] for n in (2, 4)]
    assert error.max == pytest.approx(max(e - e / 1.3 for e in effs))
    assert error.median == pytest.approx(sum(e - e / 1.3 for e in effs) / 2)
    assert error.max >= verdict.CONFIDENT_ERROR and not error.confident
    assert "likely" in error.sentence() and "so the link likely sets the pace" in found[0].explanation


def test_undetermined_always_says_what_would_settle_it():
    no_link = [layout_run(n, 0.4 * n, bandwidth_mbit=math.nan, bandwidth="native")
               for n in (1, 2)]
    no_base = [layout_run(1, 0.4, status="failed"), layout_run(2, 0.8), layout_run(4, 1.0)]
    grew = [layout_run(1, 0.095, batch=16, compute_time_mean_s=0.092, gradient_bytes=1.08e6),
            layout_run(2, 0.311, batch=16, compute_time_mean_s=0.279, comm_time_mean_s=0.03,
                       gradient_bytes=1.08e6, link_mbit_measured=960.0)]
    gap = [layout_run(1, 0.4, gradient_bytes=1e6), layout_run(2, 0.8, gradient_bytes=1e6)]
    for rows, what in ((no_link, "Measuring the link"), (no_base, "A successful run at N0"),
                       (grew, "Comparing each rank's compute time"), (gap, "Repeating the run"),
                       ([layout_run(2, 0.4)], "A run at a second node count")):
        (b,) = judged(rows)[2]
        assert b.kind == "undetermined", rows
        assert what in b.explanation and b.explanation.endswith("would settle it."), b.explanation


def test_input_bound_from_the_loader_wait_only_with_real_data():
    # a step of 0.5 s waits 0.1 s for its batch (20%): the loader is the limit with real data
    rows = [layout_run(n, 0.5, gradient_bytes=1e6, data="/data/imagenet", data_time_mean_s=0.1)
            for n in (1, 2)]
    b = kinds(rows)[(32, "/data/imagenet")]
    assert b.kind == "input-bound" and "waits 100 ms for its input batch (20%" in b.explanation
    # the same wait on synthetic data is not called input-bound: nothing to load
    synthetic = [dict(r, data="synthetic") for r in rows]
    assert kinds(synthetic)[(32, "synthetic")].kind == "compute-bound"
    # the wait is the ranks' own record, averaged over them
    ranks = [dict(r, data_time_mean_s=w) for r, w in zip(THREE_RANKS, (0.1, 0.2, 0.3), strict=True)]
    assert frames.to_frame([train_record(ranks=ranks)]).iloc[0]["data_time_mean_s"] == \
        pytest.approx(0.2)


def test_host_limits_reads_the_manifest():
    lim = host_limits({"target": "aws", "host_cpus": None, "nodes": [{"cpus": 8}, {"cpus": 4}]})
    assert lim["target"] == "aws" and math.isnan(lim["host_cpus"]) and lim["node_cpus"] == 4


# ------------------------------------------------------------------------------ results loading


def rank(i, ips, step, p95, compute, comm):
    return {"rank": i, "host": f"n{i}", "images_per_sec": ips, "step_time_mean_s": step,
            "step_time_p95_s": p95, "compute_time_mean_s": compute, "comm_time_mean_s": comm}


def train_record(run_id="train-n03-p1-b032-bw1000-r0", status="ok", ranks=None, **params):
    p = {"nodes": 3, "procs_per_node": 1, "world_size": 3, "model": "resnet50", "engine": "ddp",
         "precision": "fp32", "batch_size": 32, "bandwidth_mbit": 1000.0, "repeat": 0,
         "steps": 30, "warmup": 5, "image_size": 224, "data": "synthetic"}
    p.update(params)
    return {"sweep_id": "s", "run_id": run_id, "kind": "train", "status": status, "params": p,
            "target": "aws", "node_names": ["n0", "n1", "n2"], "ranks": ranks or [],
            "gradient_bytes": 102e6, "link_mbit_measured": 940.0, "env": {},
            "started_at": "2026-11-20T09:00:00Z", "duration_s": 40.0,
            "error": "" if status == "ok" else "boom"}


def probe_record(run_id, bw, busbw, nodes=3):
    return {"sweep_id": "s", "run_id": run_id, "kind": "allreduce", "status": "ok",
            "params": {"nodes": nodes, "procs_per_node": 1, "world_size": nodes,
                       "bandwidth_mbit": bw, "repeat": 0},
            "allreduce": [{"size_bytes": 1024, "time_s": 1e-3, "algbw_mb_s": 1.0,
                           "busbw_mb_s": 5.0},
                          {"size_bytes": 1 << 20, "time_s": 1e-2, "algbw_mb_s": 80.0,
                           "busbw_mb_s": busbw}]}


THREE_RANKS = [rank(0, 100.0, 0.32, 0.35, 0.20, 0.12), rank(1, 110.0, 0.30, 0.40, 0.21, 0.09),
               rank(2, 120.0, 0.28, 0.33, 0.19, 0.09)]


def test_ranks_are_summed_not_extrapolated_from_rank_zero():
    frame = frames.to_frame([train_record(ranks=THREE_RANKS)])
    row = frame.iloc[0]
    assert row["images_per_sec"] == pytest.approx(330.0)  # 100 + 110 + 120, not 3 x 100
    assert row["images_per_sec_per_worker"] == pytest.approx(110.0)
    assert row["step_time_mean_s"] == pytest.approx(0.30)  # (0.32 + 0.30 + 0.28) / 3
    assert row["step_time_p95_s"] == pytest.approx(0.40)  # worst rank's p95
    # comm / step per rank: 0.12/0.32 = 0.375, 0.09/0.30 = 0.3, 0.09/0.28 = 0.3214286
    assert row["comm_fraction"] == pytest.approx((0.375 + 0.3 + 0.09 / 0.28) / 3)
    assert row["n_ranks"] == 3 and row["bandwidth"] == "1gbit"


def test_busbw_comes_from_the_matching_probe_at_its_largest_message():
    recs = [train_record(ranks=THREE_RANKS), probe_record("a1", 1000.0, 110.0),
            probe_record("a2", 1000.0, 112.0), probe_record("a3", 10000.0, 900.0),
            probe_record("a4", 1000.0, 50.0, nodes=2)]
    frame = frames.to_frame(recs)
    assert len(frame) == 1  # probes are not train rows
    assert frame.iloc[0]["busbw_mb_s"] == pytest.approx(111.0)  # mean of 110 and 112


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path, caplog):
    lines = [json.dumps(train_record(status="failed")),
             json.dumps(train_record(ranks=THREE_RANKS)),  # same run_id: this one wins
             json.dumps(train_record(run_id="train-n03-p1-b064-bw1000-r0"))[:57]]
    (tmp_path / "runs.jsonl").write_text("\n".join(lines))  # no final newline: a crash
    with caplog.at_level(logging.WARNING, logger="scalelab.results.store"):
        recs = frames.load_runs(tmp_path)
    assert [r.run_id for r in recs] == ["train-n03-p1-b032-bw1000-r0"]
    assert recs[0].status == "ok"
    assert any("truncated" in r.getMessage() for r in caplog.records)


def test_missing_runs_file_is_empty_and_missing_dir_is_an_error(tmp_path):
    assert frames.load_runs(tmp_path) == []
    with pytest.raises(ScalelabError, match="does not exist"):
        frames.load_runs(tmp_path / "nope")


def test_csv_has_the_contract_columns_and_native_is_empty(tmp_path):
    recs = [train_record(ranks=THREE_RANKS),
            train_record(run_id="train-n03-p1-b032-native-r0", bandwidth_mbit=None,
                         ranks=THREE_RANKS),
            train_record(run_id="train-n03-p1-b032-bw1000-r1", status="failed")]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    path = frames.write_csv(tmp_path)
    assert path == tmp_path / "results.csv"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv", "runs.jsonl"]
    csv = pd.read_csv(path, keep_default_na=False)
    assert list(csv.columns) == frames.CSV_COLUMNS
    assert csv["bandwidth_mbit"].tolist() == ["1000", "", "1000"]
    failed = csv[csv["status"] == "failed"].iloc[0]
    assert failed["images_per_sec"] == "" and failed["error"] == "boom"
    assert csv["images_per_sec"].iloc[0] == "330"


# ------------------------------------------------------------------------------ slow ranks


def with_ranks_checked(frame: pd.DataFrame, wait: float, hosts: str = "n1") -> pd.DataFrame:
    """The stragglers columns on every multi-rank point: 3 runs checked, all flagged with
    `wait` per step (none when wait is 0), against the 5 % floor."""
    multi = frame["world_size"] > 1
    return frame.assign(
        straggler_runs_checked=multi * 3, straggler_runs=(multi & (wait > 0)) * 3,
        straggler_wait_s=np.where(multi, wait, np.nan), straggler_hosts=hosts if wait else "",
        straggler_excess=0.3 if wait else np.nan, straggler_threshold=0.05)


def test_a_gap_the_slow_rank_explains_is_straggler_bound_and_otherwise_said():
    # the model predicts ~97 % (1 MB of gradients, comm 8 ms at 2 ranks), 0.4 / 0.52 = 77 %
    # was measured: a rank 30 % slower makes the others wait 0.12 s, which is the whole gap
    rows = [layout_run(1, 0.4, gradient_bytes=1e6), layout_run(2, 0.52, gradient_bytes=1e6)]
    base = bucket_model.add_prediction(modelled(rows), alpha_s=0.0)
    (b,) = verdict.judge(with_ranks_checked(base, 0.12))[2]
    assert b.kind == "straggler-bound"
    assert "node n1 held a rank that computed 30% longer per step" in b.explanation
    assert "the others waited 120 ms per step for it" in b.explanation
    # no rank data: the old advice; ranks compared and none slow: that finding instead
    (b,) = verdict.judge(base)[2]
    assert b.kind == "undetermined" and "comparing each rank's compute time" in b.explanation
    m, _, (b,) = verdict.judge(with_ranks_checked(base, 0.0))
    assert b.kind == "undetermined" and "comparing each rank" not in b.explanation
    # the scaling table shows the settle text: it carries the finding too
    assert m.set_index("world_size").loc[2, "verdict_settle"].startswith("No rank computed")
    assert "No rank computed more than 5.0% longer per step than its run's other ranks" in \
        b.explanation and b.explanation.endswith("would settle it.")
    # a wait that leaves most of the gap unexplained is named, not blamed
    (b,) = verdict.judge(with_ranks_checked(base, 0.01))[2]
    assert b.kind == "undetermined" and "the others waited 10 ms per step" in b.explanation


def test_a_slow_rank_costing_less_than_the_link_leaves_the_point_network_bound():
    # 0.4 s of exposed communication per step at 2 ranks; the slow rank costs 0.05 s more
    rows = [layout_run(1, 0.4), layout_run(2, 0.85, comm_time_mean_s=0.45)]
    judged_ = verdict.judge(with_ranks_checked(
        bucket_model.add_prediction(modelled(rows), alpha_s=0.0), 0.05))
    (b,) = judged_[2]
    assert b.kind == "network-bound" and "Node n1 held a rank" in b.explanation


def test_overlap_prediction_follows_bucket_size_and_compression():
    """The model replays the run's own buckets: a bucket that holds the whole gradient cannot
    overlap backward, small ones can, and fp16 halves the bytes on the wire."""
    layers = [{"fwd_s": 0.01, "bwd_s": 0.02, "numel": 2_000_000} for _ in range(20)]
    doc = {"optimizer_s": 0.0, "layers": layers}  # 160 MB of fp32 gradients, 0.4 s backward
    steps = {mb: bucket_model.predict_step_s(doc, "ddp", 4, 10_000.0, group_mb=mb)
             for mb in (5.0, 25.0, 500.0)}
    assert steps[500.0] > steps[25.0] + 0.05  # one bucket at the end: nothing hidden
    assert steps[5.0] != steps[25.0]
    assert bucket_model.predict_step_s(doc, "ddp", 4, 10_000.0) == steps[25.0]  # DDP's default
    fp16 = bucket_model.predict_step_s(doc, "ddp", 4, 10_000.0, group_mb=500.0, compression="fp16")
    assert fp16 < steps[500.0]
    # Horovod's fusion threshold is its group size: on a slow link with a large per-hop
    # latency, fusing what is ready saves latencies that one tensor per group pays
    slow = {mb: bucket_model.predict_step_s(doc, "horovod", 4, 1000.0, alpha_s=0.005, group_mb=mb)
            for mb in (1.0, 500.0)}
    assert slow[500.0] < slow[1.0] - 0.1


def test_a_network_bound_parameter_server_point_names_its_busiest_nic():
    """The verdict of a parameter-server point says which NIC sets the pace and its bytes: a
    single dedicated server's at 4 workers, a worker's with as many servers as workers."""
    from scalelab.model import verdict

    row = pd.Series({"engine": "ps", "nodes": 4, "procs_per_node": 1, "world_size": 4,
                     "ps_placement": "dedicated", "ps_servers": 1.0, "gradient_bytes": 100e6,
                     "model_eff": 0.30, "predicted_by": "overlap", "model_exposed_s": 3.0,
                     "model_share": 0.7, "comm_time_mean_s": 3.1, "link_mbit_model": 1000.0,
                     "intra_mbit": float("nan")})
    kind, why, _ = verdict._judge_model(row, 4, 0.31, True)
    assert kind == "network-bound"
    assert "with 1 dedicated parameter server the busiest is a server node's NIC, 400 MB" in why
    kind, why, _ = verdict._judge_model(pd.Series({**row.to_dict(), "ps_servers": 4.0}), 4,
                                        0.31, True)
    assert "with 4 dedicated parameter servers the busiest is a worker node's NIC, 100 MB" in why
