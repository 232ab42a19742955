"""The report's page: escaped text, tables, banners and sections, one self-contained HTML file."""

from __future__ import annotations

import importlib.metadata
import logging
import math
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from scalelab.model import analysis, bucket_model, datapath, fabric, published, verdict
from scalelab.model.analysis import batch_text
from scalelab.model.verdict import VERDICT_COLUMNS
from scalelab.report import failures, tables
from scalelab.report.data import Analysis
from scalelab.report.figures import draw_figures, layout
from scalelab.report.markup import esc, kv, page, rate_label, readable, table
from scalelab.report.summary import banners, summary_pairs, sweep_details

log = logging.getLogger(__name__)
ALL_RUNS_OPEN_MAX = 200  # the all-runs table starts folded above this many rows

# ---------------------------------------------------------------------------- HTML sections


def _bottleneck_section(a: Analysis) -> str:
    """The model's error, stated once, then each series' verdict at its largest world size."""
    frame = tables.bottleneck_rows(a)
    cols = [("series", "series", "str"), ("n", "at world size", "int"),
            ("eff", "measured efficiency", "pct"), ("pred", "model efficiency", "pct"),
            ("exposed_ms", "exposed comm (ms/step)", "num"), ("kind", "bottleneck", "str"),
            ("why", "why", "str")]
    if tables.mixed(a.modelled):
        cols.insert(4, ("model", "predicted by", "str"))
    if len(a.sweeps) > 1:
        cols.insert(0, ("sweep", "sweep", "str"))
    return ('<h2 id="bottlenecks">Bottleneck per series</h2>'
            f'<p class="model-error"><strong>{esc(a.error.sentence())}</strong></p>'
            f'<p class="note">{esc(tables.models_used(a.modelled))}</p>'
            + table(frame, cols, "bottlenecks"))


def _scaling_table(a: Analysis) -> str:
    df = a.modelled.assign(_bw=a.modelled["bandwidth_mbit"].astype(float).fillna(np.inf))
    df = df.sort_values(["sweep_id", "_bw", "batch_size", "procs_per_node", "model", "engine",
                         "precision", "data", "world_size"], kind="stable")
    df["thr_ci"] = _ci_text(df["thr_lo"], df["thr_hi"], lambda v: readable(v, 4))
    df["eff_ci"] = _ci_text(df["eff_lo"] * 100, df["eff_hi"] * 100, "{:.1f}".format)
    # the share of the time gradients were in flight that backward computation hid
    inflight = df["comm_inflight_mean_s"].astype(float)
    df["hidden"] = ((inflight - df["comm_time_mean_s"].astype(float)).clip(lower=0)
                    / inflight.where(inflight > 0))
    # to fit a 1280-px window: no column that another one implies (comm fraction is exposed
    # over step; where the model's link rate came from is said under Bottleneck per series)
    cols = [("bandwidth", "link", "str"), ("batch_size", "batch", "batch"),
            ("world_size", "world size", "int"),
            ("n", "repeats", "int"), ("thr_mean", "images/s", "num"),
            ("thr_ci", "95% CI", "str"), ("per_worker_mean", "per worker", "num"),
            ("eff_mean", "efficiency", "pct"), ("eff_ci", "95% CI (%)", "str"),
            ("model_eff", "model efficiency", "pct"),
            ("step_time_mean_s", "step (ms)", "ms"),
            ("comm_inflight_mean_s", "comm in flight (ms)", "ms"),
            ("comm_time_mean_s", "comm exposed (ms)", "ms"), ("hidden", "comm hidden", "pct"),
            ("link_mbit_model", "model link (Mbit/s)", "num"),
            ("verdict_text", "verdict", "wrap")]
    if df["procs_per_node"].nunique() > 1 or (df["procs_per_node"] != 1).any():
        cols.insert(2, ("procs_per_node", "proc/node", "int"))
    df["verdict_text"] = [tables.verdict_label(r) for r in df[list(VERDICT_COLUMNS) + [
        "model_exposed_s", "straggler_hosts", "straggler_wait_s"]].to_dict("records")]
    if tables.mixed(a.modelled):
        cols.insert(cols.index(("model_eff", "model efficiency", "pct")) + 1,
                    ("predicted_by", "predicted by", "str"))
    if len(a.sweeps) > 1:
        cols.insert(0, ("sweep_id", "sweep", "str"))
    varying = [c for c in ("model", "engine", "precision", "memory_format", "data",
                           "settings") if c in df and df[c].nunique() > 1]
    names = {"settings": "settings", "memory_format": "memory format"}
    for c in reversed(varying):
        cols.insert(1, (c, names.get(c, c), "str"))
    return table(df, cols, "scaling")


def _slow_ranks_section(a: Analysis) -> str:
    """Each run's ranks against their peers: the flagged ones with their node and the others'
    wait, or one sentence that none was, with the threshold either way."""
    frame = tables.slow_rank_rows(a)
    parts = ['<h2 id="slow-ranks">Slow ranks</h2>']
    parts += [f'<p class="note">{esc(x)}</p>' for x in tables.slow_rank_notes(a)]
    if not frame.empty:
        cols = [("run", "run", "str"), ("node", "node", "str"), ("rank", "rank", "int"),
                ("world_size", "world size", "int"), ("batch_size", "batch", "batch"),
                ("link", "link", "str"), ("compute_ms", "its compute (ms/step)", "num"),
                ("others_ms", "others' median (ms/step)", "num"),
                ("excess", "slower by", "pct"), ("wait_ms", "others wait (ms/step)", "num")]
        if len(a.sweeps) > 1:
            cols.insert(0, ("sweep", "sweep", "str"))
        open_attr = " open" if len(frame) <= ALL_RUNS_OPEN_MAX else ""
        parts.append(f"<details{open_attr}><summary>{len(frame):,} flagged ranks (the others' "
                     "wait is the rank's compute minus their median: their exposed "
                     "communication grows by it)</summary>"
                     + table(frame, cols, "slowranks") + "</details>")
    pairs = tables.link_pair_rows(a)
    if pairs.empty:
        parts.append(f'<p class="note">{esc(tables.LINK_PAIRS_NOTE)}</p>')
        return "\n".join(parts)
    flagged = int((pairs["flag"] != "").sum())
    when = ", ".join(sorted(set(pairs["measured_at"])))
    parts.append(f'<h3 id="link-pairs">Every pair\'s link rate (invoke check --links, {esc(when)})'
                 f'</h3><p class="note">{flagged} of {len(pairs)} pairs slow (below 80 % of '
                 "the median) or failed: a node in every slow pair has a slow NIC or link, "
                 "and its ranks wait in every collective.</p>")
    cols = [("pair", "pair", "str"), ("mbit", "Mbit/s", "num"),
            ("of_median", "of the median", "pct"), ("flag", "", "str")]
    if len(a.sweeps) > 1:
        cols.insert(0, ("sweep", "sweep", "str"))
    parts.append(table(pairs, cols, "linkpairs"))
    return "\n".join(parts)


def _cost_section(a: Analysis) -> str:
    """Cost per million images across node count x link rate, where the sweep set a price."""
    price, frame = tables.cost_rows(a)
    if price is None:
        return ""
    parts = ['<h2 id="cost">Cost per million images</h2>',
             f'<p class="note">At {price:,.2f} per node-hour (the sweep&#39;s '
             "price_per_node_hour): price x nodes / images per hour, from each point&#39;s mean "
             "throughput; the cheapest node count per link and batch is marked. More nodes cost "
             "more per image wherever scaling efficiency is below 100%.</p>"]
    cols = [("link", "link", "str"), ("batch_size", "batch", "batch"),
            ("nodes", "nodes", "int"), ("world_size", "world size", "int"),
            ("thr_mean", "images/s", "num"), ("cost", "cost per million images", "num"),
            ("cheapest", "", "str")]
    if len(a.sweeps) > 1:
        cols.insert(0, ("sweep_id", "sweep", "str"))
    parts.append(table(frame, cols, "cost"))
    return "\n".join(parts)


def _datapath_section(a: Analysis) -> str:
    """Where runs read real data: what the input gave against what training would take, per
    point, and the sizing of storage and loader cores for real devices from the probes."""
    df = a.modelled
    if df.empty or "input_ips" not in df:
        return ""
    real = df[df["data"].astype(str) != "synthetic"].copy()
    if real.empty:
        return ""
    real["kb"] = real["data_bytes_per_image"].astype(float) / 1e3
    parts = ['<h2 id="datapath">Data and storage</h2>',
             '<p class="note">Each real-data point: the images/s training would take (the network '
             "and compute model), and what the input can give: the storage probe&#39;s MB/s to "
             "the point&#39;s nodes reading at once over the bytes an image, and one core&#39;s "
             "decode rate (the decode probe) times the loader workers. The smaller is the "
             "input&#39;s ceiling; where it is below the demand, the point is modelled and "
             "judged input-bound (docs/data.md). Accelerator busy: compute time over step "
             "time, the ranks&#39; mean, as MLPerf Storage counts an accelerator&#39;s "
             'utilisation (it asks for 90 %).</p>']
    cols = [("data", "data", "wrap"), ("world_size", "ranks", "int"),
            ("thr_mean", "measured images/s", "num"),
            ("input_demand_ips", "training would take", "num"),
            ("storage_read_mb_s", "storage MB/s", "num"), ("kb", "KB an image", "num"),
            ("input_storage_ips", "storage gives images/s", "num"),
            ("decode_img_s_per_core", "decode images/s a core", "num"),
            ("input_decode_ips", "loaders give images/s", "num"),
            ("accel_busy", "accelerator busy", "pct"),
            ("input_limit", "input limit", "str"), ("verdict", "verdict", "str")]
    parts.append(table(real, cols, "datapath"))
    probed = real[real["storage_read_mb_s"].astype(float) > 0]
    if probed.empty:
        return "\n".join(parts)
    best = probed.loc[probed["storage_read_mb_s"].astype(float).idxmax()]
    sized = datapath.sizing(float(best["data_bytes_per_image"]),
                            float(best["decode_img_s_per_core"]),
                            float(best["storage_read_mb_s"]), datapath.profile_rates())
    parts.append(
        f'<p class="note">Sizing from these probes: {float(best["data_bytes_per_image"]) / 1e3:.0f} '
        f'KB an image, {float(best["decode_img_s_per_core"]):,.0f} images/s decoded a core, and '
        f'{float(best["storage_read_mb_s"]):,.1f} MB/s from the storage to '
        f'{int(best["nodes"])} node(s). Each device: the MB/s and loader cores that keep it '
        f"fed at its profile&#39;s ResNet-50 rate (batch {datapath.SIZING_BATCH}), the storage "
        f"GB/s for nodes of {datapath.GPUS_PER_NODE}, and how many such devices this storage "
        "feeds. The decode rate is this cluster&#39;s CPU at the sweep&#39;s input size.</p>")
    cols = [("device", "device", "str"), ("images_per_gpu", "images/s", "num"),
            ("mb_s_per_gpu", "MB/s each", "num"), ("cores_per_gpu", "loader cores each", "num"),
            *[(f"gb_s_{n}", f"GB/s, {n} node{'s' if n > 1 else ''}", "num")
              for n in datapath.SIZING_NODES],
            ("gpus_fed", "this storage feeds", "int")]
    parts.append(table(sized, cols, "sizing"))
    return "\n".join(parts)


def _checkpoint_section(a: Analysis) -> str:
    """Where runs saved checkpoints: a checkpoint's size and what it cost, per point."""
    runs = a.runs
    if runs.empty or "checkpoint_bytes" not in runs:
        return ""
    ck = runs[(runs["status"] == "ok") & (runs["checkpoint_bytes"].astype(float) > 0)].copy()
    if ck.empty:
        return ""
    keys = ["nodes", "world_size", "checkpoint_every", "checkpoint_mode", "checkpoint_to"]
    ck = ck.groupby(keys, as_index=False, dropna=False).agg(
        mb=("checkpoint_bytes", lambda x: x.astype(float).mean() / 1e6),
        blocked=("checkpoint_blocked_s", "mean"),
        background=("checkpoint_background_s", "mean"),
        write=("checkpoint_write_mb_s", "mean"),
        step=("step_time_mean_s", "mean"), dilation=("dilation", "max"))
    # the share of training time the checkpoints took: blocked over the steps between two
    # checkpoints and the checkpoint; not for a dilated run, whose steps are the device's time
    undilated = ck["dilation"].astype(float).fillna(1.0) == 1.0
    lost = ck["blocked"] / (ck["checkpoint_every"].astype(float) * ck["step"] + ck["blocked"])
    ck["lost"] = lost.where(undilated)
    parts = ['<h2 id="checkpoints">Checkpoints</h2>',
             '<p class="note">Each point that saved checkpoints (docs/checkpoints.md): a '
             "checkpoint&#39;s size (every writer&#39;s bytes), the seconds training was blocked "
             "(the slowest rank&#39;s), for async the seconds the write went on after that, the "
             "write&#39;s MB/s, and the share of training time the checkpoints blocked at "
             "this interval. Seconds are the host&#39;s own: a disk is not dilated, so a "
             "dilated run shows no share.</p>"]
    cols = [("nodes", "nodes", "int"), ("world_size", "ranks", "int"),
            ("checkpoint_every", "every (steps)", "int"), ("checkpoint_mode", "mode", "str"),
            ("checkpoint_to", "to", "wrap"), ("mb", "MB", "num"),
            ("blocked", "blocked s", "num"), ("background", "background s", "num"),
            ("write", "write MB/s", "num"), ("lost", "training time blocked", "pct")]
    parts.append(table(ck, cols, "checkpoints"))
    return "\n".join(parts)


def _comm_settings_section(a: Analysis) -> str:
    """Communication settings (bucket size, fusion threshold, cycle time, compression), where
    the sweep varies one: each setting's measured efficiency beside the model's prediction,
    the best per link rate named, and predicted-only rows for settings not run."""
    frame = bucket_model.comm_settings(a.runs, a.alpha_s)
    if frame.empty:
        return ""
    frame = frame.copy()
    frame["what"] = np.where(frame["measured"], "measured", "predicted only (not run)")
    frame["mark"] = np.where(frame["best"], "best", "")
    frame.loc[frame["is_default"] & frame["measured"], "mark"] += np.where(
        frame.loc[frame["is_default"] & frame["measured"], "best"], ", default", "default")
    parts = ['<h2 id="comm-settings">Communication settings</h2>',
             '<p class="note">Per link rate, batch and world size: each setting&#39;s measured '
             "scaling efficiency (against the same setting&#39;s smallest world size) and "
             "images/s, beside the overlap model&#39;s prediction for it (bucket or fusion size "
             "and fp16 compression change the timeline it replays; no prediction without a "
             "per-layer profile). Rows marked predicted only were not run.</p><ul>"]
    point = ["sweep_id", "bandwidth", "batch_size", "scaling", "world_size"]
    for key, grp in frame.groupby(point, sort=False):
        best = grp[grp["best"]]
        if best.empty:
            continue
        b = best.iloc[0]
        text = (f"{key[1]}, {batch_text(key[2], key[3])}, {int(key[4])} ranks: best "
                "measured setting "
                f"{b['setting']} ({100 * b['eff']:.1f}% efficiency, {b['images_per_sec']:,.1f} "
                "images/s)")
        if b["gain_points"] == b["gain_points"]:
            text += (", the default" if b["is_default"] else
                     f", {b['gain_points']:+.1f} points and {b['gain_ips']:+,.1f} images/s "
                     "over the default")
        else:
            text += "; the default was not run"
        parts.append(f'<li class="best-setting">{esc(text)}</li>')
    parts.append("</ul>")
    cols = [("bandwidth", "link", "str"), ("batch_size", "batch", "batch"),
            ("world_size", "world size", "int"), ("setting", "setting", "str"),
            ("what", "row", "str"), ("eff", "efficiency measured", "pct"),
            ("model_eff", "efficiency predicted", "pct"),
            ("images_per_sec", "images/s", "num"), ("mark", "", "str")]
    if len(a.sweeps) > 1:
        cols.insert(0, ("sweep_id", "sweep", "str"))
    parts.append(table(frame, cols, "comm-settings"))
    return "\n".join(parts)


def _fabric_note(a: Analysis, ideal_too: bool = True) -> str:
    """Which fabric the shaped links stood for, what it made them carry, and the sources
    (ideal_too: say so for the ideal fabric as well)."""
    runs = a.runs
    if runs.empty or runs["bandwidth_mbit"].isna().all():
        return ""
    names = sorted(set(runs.get("fabric_profile", ["ideal"])) - {""}) or [fabric.IDEAL]
    out = []
    for name in names:
        fab = fabric.maybe(name)
        if fab is None and not ideal_too:
            continue
        if fab is None:
            out.append('<p class="note fabric">Fabric profile: ideal. A shaped link '
                       "carried its line rate as tc gives it (Gloo reaches 90-96 % of it on a "
                       "veth). Real Ethernet with TCP carries less, most of all with several GPUs "
                       "per node: <code>--fabric-profile ethernet-tcp</code> shapes and models "
                       "that.</p>")
            continue
        sel = runs[(runs["fabric_profile"] == name) & runs["bandwidth_mbit"].notna()]
        pairs = sorted({(float(b), int(p)) for b, p in zip(sel["bandwidth_mbit"],
                                                          sel["procs_per_node"], strict=True) if p == p})
        lines = "; ".join(
            f"{esc(rate_label(b))} with {p} rank{'s' if p > 1 else ''} per node carried "
            f"{fab.share(b, p) * 100:.1f} % of it ({esc(rate_label(fab.collective_mbit(b, p)))}, "
            f"tc at {esc(rate_label(fab.tc_mbit(b, p)))} for the framing tc does not count); "
            f"source: {esc(fab.source_for(b).rstrip('.'))}" for b, p in pairs)
        delayed = "hop_delay_us" in sel and bool((sel["hop_delay_us"] > 0).any())
        out.append(f'<p class="note fabric">Fabric profile: {esc(fab.name)} '
                   f"({esc(fab.description)}). {lines}. Per-hop latency "
                   f"{fab.per_hop_latency_s * 1e6:g} us, in the model and "
                   + ("on the links (tc netem, k times as long)" if delayed else
                      "not on the links (the kernel of the host the sweep ran on had no tc netem)")
                   + f"; source: {esc(' '.join(fab.latency_source.split()).rstrip('.'))}.</p>")
    return "\n".join(out)


def _intra_note(a: Analysis) -> str:
    """The path between the emulated GPUs of a node, where a sweep stated one."""
    runs = a.runs
    stated = sorted(set(runs["intra_link"]) - {""}) if "intra_link" in runs else []
    return "\n".join(
        f'<p class="note fabric">Path between the GPUs of a node: {esc(name)}, '
        f"{esc(rate_label(fabric.intra_link(name)[1]))} per edge of the allreduce ring (source: "
        f"{esc(fabric.intra_source(name).rstrip('.'))}). Each node&#39;s loopback, which its "
        "ranks reach each other over, was shaped to that rate times the ring&#39;s edges on "
        "it, and the model paced the ring by its slowest edge.</p>" for name in stated)


def _emulation_section(a: Analysis) -> str:
    """Emulated accelerators: fidelity per point, the model against the measurement, and
    predictions beyond the measured points."""
    df = tables.emulation_rows(a)
    if df.empty:
        return ""
    src = sorted(set(df["accelerator_source"].astype(str)) - {""})
    parts = ['<h2 id="emulation">Emulated accelerator</h2>',
             '<p class="note">Every rank kept the real model&#39;s parameters and the engine&#39;s real '
             f"gradient communication over its shaped link; forward, backward and the optimizer "
             f"step were waits from a device profile ({esc(', '.join(src) or 'unknown')}). With "
             f"dilation k the waits were k times longer and the links k times slower, and every "
             f"time here is divided by k. A point is emulation-bound when in its timed steps the "
             f"host had under {analysis.HOST_IDLE_MIN * 100:.0f}% CPU idle, the compute waits "
             f"stretched over {analysis.COMPUTE_FIDELITY * 100:.0f}% past the profile, or the "
             f"link gave under {analysis.LINK_FIDELITY * 100:.0f}% of its dilated rate. The "
             f"model is the overlap model: it replays the bucket timeline (a bucket&#39;s "
             f"transfer starts when its last gradient is ready and the previous bucket&#39;s "
             f"transfer is done); its error is stated once, under Bottleneck per series.</p>"]
    parts.append(_fabric_note(a))
    parts += [note for note in (_intra_note(a),) if note]
    cols = [("bandwidth", "link", "str"), ("batch_size", "batch", "batch"),
            ("world_size", "world size", "int"), ("dilation", "k", "num"),
            ("eff_mean", "measured efficiency", "pct"), ("model_eff", "model efficiency", "pct"),
            ("profile_step_s", "profile step (ms)", "ms"),
            ("compute_time_mean_s", "emulated compute (ms)", "ms"),
            ("host_cpu_idle", "host idle", "pct"), ("link_utilisation", "link busy", "pct"),
            ("fidelity_text", "fidelity", "str")]
    if tables.mixed(df):
        cols.insert(6, ("predicted_by", "predicted by", "str"))
    parts.append(table(df, cols, "emulation"))
    wf = tables.what_if_rows(a, df)
    if not wf.empty:
        wf["link"] = wf["link_mbit"].map(rate_label)

        total, within, worst, missing = published.summary()
        parts.append('<p class="note"><strong>Predictions, not measurements:</strong> the '
                     "overlap model beyond the measured points (more nodes; the link 10x "
                     "faster). Its error on this sweep&#39;s measured points is the one stated "
                     "under Bottleneck per series. Against published clusters (data-parallel "
                     "ResNet at up to 32 GPUs on a stated network, each on its fabric profile "
                     f"and with its table&#39;s one-node GPU-side cost where it has one) the "
                     f"same model is within {published.AIM_POINTS:g} points at {within} of "
                     f"{total} points; its largest miss is {worst:.1f} points, where it "
                     f"leaves out {esc(missing.split(':')[0])} "
                     "(<code>bench/perf/published_check.py</code> prints every point and what "
                     "each miss leaves out).</p>")
        parts.append(table(wf, [("from", "from the measured series", "str"),
                                 ("link", "predicted link", "str"),
                                 ("world_size", "world size", "int"),
                                 ("link_mbit", "link (Mbit/s)", "num"),
                                 ("images_per_sec", "predicted images/s", "num"),
                                 ("eff", "predicted efficiency", "pct")], "whatif"))
    return "\n".join(parts)


def _layout_section(a: Analysis) -> str:
    """Ring allreduce or parameter servers: the layout the model predicts fastest for each
    emulated series, at more nodes and a faster link; "" without an emulated series."""
    lay = tables.layout_rows(a, tables.emulation_rows(a))
    if lay.empty:
        return ""
    lay["link"] = lay["link_mbit"].map(rate_label)
    lay["margin_text"] = [f"{m * 100:.0f}%" for m in lay["margin"]]
    lay["beats"] = ["never" if b is None or b != b else f"{int(b)} or more"
                    for b in lay["beats_ring_from"]]
    measured = ", ".join(sorted({str(x) for x in a.modelled["engine"]}))
    return "\n".join([
        '<h2 id="layout">Layout: ring allreduce or parameter servers</h2>',
        '<p class="note"><strong>Predictions, not measurements</strong> (this sweep measured '
        f"{esc(measured)}): the overlap model&#39;s images/s for each layout at the series&#39; "
        "batch, precision and buckets. A ring sends 2(N-1)/N of the gradients each way on "
        "every NIC; servers colocated on the worker nodes send as much; K dedicated server "
        "nodes carry N/K of them each way while a worker sends and receives its own once, so "
        "from K &gt; N&sup2;/(2(N-1)) servers they beat the ring by up to 2(N-1)/N. "
        "&ldquo;servers&rdquo; is the fewest dedicated servers within 1% of the best of "
        f"{', '.join(str(k) for k in bucket_model.LAYOUT_SERVERS)}; "
        "<code>--engine ps</code> measures a layout (docs/engines.md).</p>",
        table(lay, [("from", "from the measured series", "str"), ("link", "link", "str"),
                    ("nodes", "nodes", "int"), ("ring_ips", "ring images/s", "num"),
                    ("colocated_ips", "colocated servers images/s", "num"),
                    ("servers", "dedicated servers", "int"),
                    ("dedicated_ips", "dedicated images/s", "num"),
                    ("fastest", "fastest", "str"), ("margin_text", "by", "str"),
                    ("beats", "servers that beat the ring", "str")], "layout")])


def _ci_text(lo: pd.Series, hi: pd.Series, fmt: Callable[[float], str]) -> pd.Series:
    return pd.Series([("" if math.isnan(a) else f"{fmt(a)} – {fmt(b)}")
                      for a, b in zip(lo.astype(float), hi.astype(float), strict=True)],
                     index=lo.index)


RUN_COLUMNS = [("run_id", "run", "str"), ("nodes", "nodes", "int"),
               ("procs_per_node", "proc/node", "int"), ("world_size", "world", "int"),
               ("batch_size", "batch", "batch"), ("bandwidth", "link", "str"),
               ("repeat", "repeat", "int"), ("status", "status", "str"),
               ("images_per_sec", "images/s", "num"),
               ("images_per_sec_per_worker", "images/s/worker", "num"),
               ("step_time_mean_s", "step mean (ms)", "ms"),
               ("step_time_p95_s", "step p95 (ms)", "ms"), ("comm_fraction", "comm", "pct"),
               ("busbw_mb_s", "busbw (MB/s)", "num"),
               ("link_mbit_measured", "link (Mbit/s)", "num"),
               ("scaling_efficiency", "efficiency", "pct"), ("started_at", "started", "str"),
               ("duration_s", "duration (s)", "num")]


def _runs_tables(a: Analysis) -> str:
    runs = a.runs
    multi = len(a.sweeps) > 1
    jobs = [("slurm_job_id", "Slurm job", "str")] if (runs["slurm_job_id"] != "").any() else []
    cols = ([("sweep_id", "sweep", "str")] if multi else []) + RUN_COLUMNS + jobs
    failed = runs[runs["status"] != "ok"]
    parts = ["<h2 id=\"failed\">Failed runs</h2>"]
    if failed.empty:
        parts.append('<p class="note">No training run failed.</p>')
    else:
        parts.append(table(failed, ([("sweep_id", "sweep", "str")] if multi else [])
                            + [("run_id", "run", "str"), ("status", "status", "str"),
                               ("world_size", "world", "int"), ("batch_size", "batch", "batch"),
                               ("bandwidth", "link", "str"), ("started_at", "started", "str"),
                               *jobs, ("error", "error", "pre")], "failed"))
    bad_probes = pd.concat([s.probes for s in a.sweeps], ignore_index=True)
    bad_probes = bad_probes[bad_probes["status"] != "ok"]
    if not bad_probes.empty:
        parts.append("<h3>Failed allreduce probes</h3>")
        parts.append(table(bad_probes, [("sweep_id", "sweep", "str"), ("run_id", "run", "str"),
                                         ("status", "status", "str"), ("error", "error", "pre")]))
    open_attr = " open" if len(runs) <= ALL_RUNS_OPEN_MAX else ""
    parts += ["<h2 id=\"runs\">All training runs</h2>",
              f"<details{open_attr}><summary>{len(runs)} runs (one row per run; the same "
              "figures as results.csv)</summary>", table(runs, cols, "runs"), "</details>"]
    return "".join(parts)


def _method_note(a: Analysis) -> str:
    mode = "max(compute, comm)" if a.overlap else "compute + comm"
    return (
        '<h2 id="method">How these numbers are computed</h2><ul class="note">'
        "<li>Throughput of a run is the sum of its ranks' images/s, never rank 0 x N; per-worker "
        "throughput is the mean over ranks; step p95 is the worst rank's p95 (the slowest rank "
        "gates every synchronous step).</li>"
        "<li>Scaling efficiency = throughput(N) / ((N/N0) x throughput(N0)), N0 the smallest world "
        "size the plan gives the series (same sweep, model, engine, precision, data, batch per "
        "worker, link, processes per node); throughput(N0) is the mean of its ok repeats. A "
        "series with no ok run at N0 has no efficiency: a larger N0 would silently read as "
        "100 %.</li>"
        "<li>95% intervals: Student t over repeats. For efficiency, each repeat's efficiency "
        "against the mean baseline, so the baseline's own noise shows at N0 rather than at every "
        "N. One repeat: no interval.</li>"
        "<li>Model: one prediction per point. Where a per-layer profile gives the times at "
        "which gradients become ready (emulated accelerators), the overlap model replays the "
        "engine's buckets: a bucket's ring allreduce starts when its last gradient is ready and "
        "the previous bucket's is done, and step = forward + max(backward, last allreduce end) "
        "+ optimizer. Elsewhere the ring model, one allreduce of the whole gradient: step = "
        f"{mode}. Both: comm = 2(N-1)/N x S/B + alpha x 2(N-1); S = gradient bytes at the "
        "run's precision; B = measured link rate, else the requested one, else allreduce busbw; "
        f"alpha = {a.alpha_s * 1e6:.1f} us ({esc(a.alpha_source)}); ranks on one node do not use "
        "the link. Exposed communication = predicted step - predicted step without "
        "communication.</li>"
        "<li>Verdict per point above N0, first match: input-bound (real data, and a step waits "
        f"{verdict.INPUT_SHARE * 100:.0f}% of its time for input or is "
        f"{(verdict.INPUT_SLOWDOWN - 1) * 100:.0f}% slower than on synthetic data), "
        "emulation-bound (the fidelity guard, or local ranks outnumber host cores), "
        "straggler-bound (a rank flagged under Slow ranks in half or more of the point's runs, "
        "and the model with the others' wait "
        f"for it added to every step lands within {verdict.TRACKING_TOLERANCE * 100:.0f} points "
        "of the measurement and nearer than without it, the wait being at least the exposed "
        "communication), emulation-bound (compute per rank grew, or the measured link is below "
        f"{verdict.LINK_SHORTFALL * 100:.0f}% of the request), then from the model: "
        "network-bound when the exposed communication is at "
        f"least {verdict.NETWORK_SHARE * 100:.0f}% of the step and the measurement is within "
        f"{verdict.TRACKING_TOLERANCE * 100:.0f} points of the model, compute-bound when it is "
        "less; a point the model cannot predict or explain is undetermined, and its verdict "
        "names the measurement that would settle it. A series' bottleneck is its largest world "
        "size's verdict. Verdicts are stated plainly when the model's largest error is under "
        f"{verdict.CONFIDENT_ERROR * 100:.0f} points, else as \"likely\".</li></ul>")


def render(a: Analysis, title: str, compare: bool, csv_links: list[tuple[str, str]]) -> str:
    lay = layout(a.modelled, compare)
    figs = draw_figures(a, lay)
    parts = [f"<h1>{esc(title)}</h1>", banners(a.sweeps),
             f'<p class="note">Generated {datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")} by '
             f"scalelab {esc(_version())}. Results: "
             + ", ".join(f'<a href="{esc(href)}">{esc(name)}</a>' for name, href in csv_links)
             + ". Sections: <a href=\"#figures\">figures</a>, <a href=\"#bottlenecks\">"
             "bottlenecks</a>, <a href=\"#scaling\">scaling table</a>, <a href=\"#slow-ranks\">"
             "slow ranks</a>, <a href=\"#failed\">"
             "failed runs</a>, <a href=\"#runs\">all runs</a>.</p>",
             '<h2 id="summary">Summary</h2>']
    found = tables.findings(a)
    if found:
        parts.insert(2, '<section class="findings"><h2 id="findings">What this sweep found</h2><ul>'
                     + "".join(f"<li>{esc(x)}</li>" for x in found) + "</ul></section>")
    if compare:
        sums = [dict(summary_pairs(s)) for s in a.sweeps]
        keys = list(dict.fromkeys(k for d in sums for k in d))  # rows only some sweeps have
        frame = pd.DataFrame([{"what": k, **{f"s{i}": d.get(k, "") for i, d in enumerate(sums)}}
                              for k in keys])
        parts.append(table(frame, [("what", "", "str")] + [
            (f"s{i}", s.sweep_id, "str") for i, s in enumerate(a.sweeps)], "kv"))
    else:
        parts.append(kv(summary_pairs(a.sweeps[0])))
    parts.append(_bottleneck_section(a))
    parts.append('<h2 id="figures">Figures</h2>')
    parts.append('<p class="note">One colour per batch size in every figure except the '
                 "allreduce one (Okabe-Ito palette, colour-blind safe)"
                 + ("; panels are link rates" if lay.panel_col else "; all series share one set of axes")
                 + ".</p>")
    for f in figs:
        parts.append(f'<figure><img alt="{esc(f.alt)}" src="data:image/png;base64,{f.png_b64}">'
                     f"<figcaption><strong>{esc(f.title)}.</strong> {esc(f.caption)}</figcaption>"
                     f"{_figure_data(f.data, len(a.sweeps) > 1)}</figure>")
    parts.append('<h2 id="scaling">Scaling table</h2>')
    parts.append(_scaling_table(a))
    parts.append(_slow_ranks_section(a))
    parts.append(_datapath_section(a))
    parts.append(_checkpoint_section(a))
    parts.append(failures.section(a))
    parts.append(_cost_section(a))
    comm = _comm_settings_section(a)  # only where a sweep varies a setting
    if comm:
        parts.append(comm)
    emulation = _emulation_section(a)
    parts.append(emulation)
    parts.append(_layout_section(a))
    if not emulation:  # there the fabric note opens the section; elsewhere it stands alone
        parts.append(_fabric_note(a, ideal_too=False))
    parts.append(_runs_tables(a))
    for s in a.sweeps:
        parts.append(sweep_details(s))
    parts.append(_method_note(a))
    return page(title, "\n".join(parts))


def _figure_data(data: pd.DataFrame | None, multi: bool) -> str:
    """The numbers a figure plots, folded under it: what a screen reader and a test can read."""
    if data is None or data.empty:
        return ""
    cols = [("bandwidth", "link", "str"), ("batch_size", "batch", "batch"),
            ("procs_per_node", "proc/node", "int"), ("world_size", "world size", "int"),
            ("eff_mean", "measured efficiency", "pct"), ("model_eff", "predicted efficiency", "pct"),
            ("predicted_by", "predicted by", "str")]
    if multi:
        cols.insert(0, ("sweep_id", "sweep", "str"))
    return ("<details><summary>The numbers in this figure</summary>"
            + table(data, cols, "figdata") + "</details>")


def _version() -> str:
    try:
        return importlib.metadata.version("scalelab")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"
