"""What limits each measured point, named from the one model the report shows.

The model is scalelab.model.bucket_model.add_prediction's: the overlap model where a per-layer profile
exists, the ring model (its limit) where none does. A point is one (series, world size) above
its series' baseline N0; its verdict is one of BOTTLENECKS with one sentence saying why, and an
"undetermined" verdict always ends with the measurement that would settle it. A series'
bottleneck is the verdict of its largest world size.

How sure the wording is follows from the model's error against the measured points
(model_error): under CONFIDENT_ERROR the sentences state what limits a point; otherwise they
say "likely".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from scalelab.model import datapath, layouts
from scalelab.model.analysis import SERIES_KEYS, batch_text

COMPUTE_BOUND_EFFICIENCY = 0.90  # efficiency at or above this: little is lost to scaling
NETWORK_SHARE = 0.10  # predicted exposed communication at or above this share of a step: network
TRACKING_TOLERANCE = 0.15  # |measured - predicted| efficiency within this: the model explains it
LINK_SHORTFALL = 0.80  # measured link below this fraction of the requested rate: emulation-bound
INPUT_SLOWDOWN = 1.10  # real-data step this much slower than synthetic: input-bound
INPUT_SHARE = 0.10  # real data: waiting for the loader this share of a step or more: input-bound
COMPUTE_INFLATION = 1.25  # compute per step this much above the smallest size's: contention
CONFIDENT_ERROR = 0.03  # the model's largest error under this (3 points): plain statements

BOTTLENECKS = ("network-bound", "compute-bound", "input-bound", "straggler-bound", "emulation-bound",
               "undetermined")
VERDICT_COLUMNS = ("verdict", "verdict_why", "verdict_settle")

_SETTLE_RERUN = ("Repeating the run (--repeats 3) to tell noise from a real gap, and comparing "
                 "each rank's compute time per step (ranks in runs.jsonl) to find a slow rank, "
                 "would settle it.")
_SETTLE_REPEAT = ("Repeating the run (--repeats 3) to tell noise from a real gap would settle "
                  "it.")
_SETTLE_LINK = ("Measuring the link (invoke check --links, or a sweep with the allreduce probe) "
                "would settle it.")


def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 100:.0f}%"


def _eff(x: float) -> str:
    """An efficiency as the report's tables print it (one decimal), so a sentence and its row
    read the same number."""
    return "n/a" if math.isnan(x) else f"{x * 100:.1f}%"


def ms(seconds: float) -> str:
    """A time per step in milliseconds, as a person reads it.

    >>> ms(1.38245), ms(0.0363), ms(0.0042)
    ('1,382 ms', '36 ms', '4.2 ms')
    """
    v = seconds * 1000
    return f"{v:,.0f} ms" if abs(v) >= 10 else f"{v:.1f} ms"


# ---------------------------------------------------------------------------- the model's error

@dataclass(frozen=True)
class ModelError:
    """The model's efficiency error over the measured multi-node points (in fractions)."""

    max: float
    median: float
    n: int
    by_model: dict[str, int]  # points per model ("overlap", "ring")
    left_out: int  # emulated points the fidelity guard flagged: not what the model describes

    @property
    def confident(self) -> bool:
        return self.n > 0 and self.max < CONFIDENT_ERROR

    def sentence(self) -> str:
        """The one sentence that states the error on the page.

        >>> ModelError(0.011, 0.004, 12, {"overlap": 12}, 0).sentence()  # doctest: +ELLIPSIS
        'Model error: over the 12 measured multi-node points the prediction is off by at most 1.1 points of efficiency (median 0.4), all from the overlap model. ... stated plainly.'
        """
        if self.n == 0:
            return ("Model error: no measured multi-node point has a prediction to check the model "
                    "against, so the verdicts say \"likely\".")
        which = (f"all from the {next(iter(self.by_model))} model" if len(self.by_model) == 1
                 else ", ".join(f"{k} from the {m} model" for m, k in sorted(self.by_model.items())))
        left = (f" ({self.left_out} emulated points the fidelity guard flagged are left out)"
                if self.left_out else "")
        sure = (f"Under {CONFIDENT_ERROR * 100:.0f} points, so the verdicts below are stated "
                "plainly." if self.confident else
                f"That is {CONFIDENT_ERROR * 100:.0f} points or more, so the verdicts below say "
                "\"likely\".")
        return (f"Model error: over the {self.n} measured multi-node points{left} the prediction "
                f"is off by at most {self.max * 100:.1f} points of efficiency (median "
                f"{self.median * 100:.1f}), {which}. {sure}")


def model_error(modelled: pd.DataFrame) -> ModelError:
    """|measured - predicted| efficiency over the multi-node points that have both (rows of
    bucket_model.add_prediction), emulated points flagged by the fidelity guard left out."""
    if modelled.empty or "model_eff" not in modelled:
        return ModelError(math.nan, math.nan, 0, {}, 0)
    multi = modelled[(modelled["nodes"] > 1) & modelled["eff_mean"].notna()
                     & modelled["model_eff"].notna()]
    flagged = (multi["fidelity"].astype(str) != "") if "fidelity" in multi else multi["nodes"] < 0
    use = multi[~flagged]
    if use.empty:
        return ModelError(math.nan, math.nan, 0, {}, int(flagged.sum()))
    err = (use["eff_mean"].astype(float) - use["model_eff"].astype(float)).abs()
    counts = {str(k): int(v) for k, v in use["predicted_by"].value_counts().items()}
    return ModelError(float(err.max()), float(err.median()), len(use), counts, int(flagged.sum()))


# ---------------------------------------------------------------------------- per point

def add_verdicts(modelled: pd.DataFrame, limits: dict[str, dict[str, Any]] | None = None,
                 error: ModelError | None = None) -> pd.DataFrame:
    """Adds verdict (one of BOTTLENECKS; "" at a series' baseline, which is the reference),
    verdict_why (one sentence; for "undetermined" it ends with the measurement that would
    settle it) and verdict_settle (that measurement, "" otherwise) to every row of
    bucket_model.add_prediction's frame. ``limits`` maps sweep_id -> analysis.host_limits(sweep.json).

    Rules for a point, first match wins:

    1. input-bound: the data is real and a step waits INPUT_SHARE of its time or more for the
       loader, or it is INPUT_SLOWDOWN x slower than the matching synthetic-data point;
    2. emulation-bound: an emulated accelerator's run failed the fidelity guard; or, for runs
       that compute for real below COMPUTE_BOUND_EFFICIENCY, on emulated nodes the ranks
       outnumber the host cores or a node's CPU share;
    3. straggler-bound (see straggler_bound): half or more of the point's runs have a rank
       that scalelab.model.stragglers flagged, the model with the others' wait for it added to each
       step lands within TRACKING_TOLERANCE of the measured efficiency and closer than the
       model alone, and the wait is at least the communication the model leaves exposed;
    4. emulation-bound, as in 2: compute per rank grew by COMPUTE_INFLATION over the smallest
       size's, or the link gave under LINK_SHORTFALL of its rate;
    5. from the model: no prediction (no link rate) or a gap over TRACKING_TOLERANCE is
       undetermined (compute-bound if efficiency is still COMPUTE_BOUND_EFFICIENCY or more);
       else network-bound when the exposed communication is NETWORK_SHARE of the step or more,
       with that time per step, and compute-bound when it is less.

    Where the ranks' compute times were compared (the stragglers columns), an "undetermined"
    verdict states what that comparison found instead of asking for it.
    """
    out = modelled.copy()
    for col in VERDICT_COLUMNS:
        out[col] = pd.Series("", index=out.index, dtype=object)
    if out.empty:
        return out
    limits = limits or {}
    sure = bool(error and error.confident)
    keys = list(SERIES_KEYS)
    synth = out[out["data"] == "synthetic"].set_index(
        [k for k in keys if k != "data"] + ["world_size"])["step_time_mean_s"]
    for _key, grp in out.groupby(keys, dropna=False, sort=False):
        base = grp.loc[grp["world_size"].idxmin()]
        n0 = float(grp["baseline_world_size"].iloc[0]) if "baseline_world_size" in grp else math.nan
        n0 = n0 if n0 == n0 else float(base["world_size"])
        lim = limits.get(str(base["sweep_id"]), {})
        for i, row in grp.iterrows():
            if float(row["world_size"]) <= n0:
                continue
            kind, why, settle = _judge_point(row, base, synth, lim, sure)
            out.at[i, "verdict"] = kind
            out.at[i, "verdict_why"] = f"{why} {settle}".strip()
            out.at[i, "verdict_settle"] = settle
    return out


def _judge_point(row: pd.Series, base: pd.Series, synth: pd.Series, lim: dict[str, Any],
                 sure: bool) -> tuple[str, str, str]:
    n = int(row["world_size"])
    eff = float(row["eff_mean"])
    found = _input_bound(row, synth, n, sure)
    if found:
        return found
    if math.isnan(eff):
        n0 = row.get("baseline_world_size", base["world_size"])
        return "undetermined", (f"At {n} ranks there is no efficiency: no run at the baseline "
                                f"N0 = {int(n0)} succeeded."), (
            f"A successful run at N0 (invoke bench --resume {row['sweep_id']} "
            "--retry-failed) would settle it.")
    if row.get("accelerator") and row.get("fidelity"):
        # emulated accelerators sleep instead of computing: the fidelity guard's measurements,
        # not core counts, say whether the host kept up
        return "emulation-bound", (
            f"At {n} ranks the emulation fell short ({row['fidelity']}), so the "
            f"{_eff(eff)} efficiency reflects the host, not the emulated cluster."), ""
    real = not row.get("accelerator") and eff < COMPUTE_BOUND_EFFICIENCY
    found = (_oversubscribed(row, lim, n, eff) if real else None) or straggler_bound(row, sure) \
        or (_emulation_bound(row, base, lim, n, eff) if real else None)
    kind, why, settle = found or _judge_model(row, n, eff, sure)
    if kind in ("network-bound", "compute-bound") and _num(row, "straggler_runs") > 0:
        why += f" {slow_ranks_said(row)}."  # a slow rank beside what sets the pace: said too
    return kind, why, settle


def _input_bound(row: pd.Series, synth: pd.Series, n: int, sure: bool
                 ) -> tuple[str, str, str] | None:
    data = row["data"]
    if data in ("synthetic", "", None):
        return None
    step = float(row["step_time_mean_s"])
    wait = float(row.get("data_time_mean_s", math.nan))
    pace = "sets" if sure else "likely sets"
    if row.get("model_input_bound") is True:
        return "input-bound", input_said(row, n, pace), ""
    if wait == wait and step > 0 and wait >= INPUT_SHARE * step:
        return "input-bound", (
            f"At {n} ranks each step waits {ms(wait)} for its input batch ({_pct(wait / step)} "
            f"of a {ms(step)} step) while reading {data}, so the input pipeline {pace} the "
            "pace."), ""
    key = tuple(row[k] for k in SERIES_KEYS if k != "data") + (row["world_size"],)
    ref = synth.get(key) if key in synth.index else None
    if ref is not None and not isinstance(ref, pd.Series) and step > INPUT_SLOWDOWN * ref:
        return "input-bound", (
            f"With real data a step takes {step:.3g} s against {float(ref):.3g} s on "
            f"synthetic data at {n} ranks, so the input pipeline, not the network, {pace} "
            "the pace."), ""
    return None


def input_said(row: Any, n: int, pace: str) -> str:
    """The input ceiling that binds at a point, with the probes' numbers."""
    storage, decode = _num(row, "input_storage_ips"), _num(row, "input_decode_ips")
    parts = []
    if storage == storage:
        nodes = int(_num(row, "nodes"))
        parts.append(f"the storage delivers {_num(row, 'storage_read_mb_s'):.1f} MB/s to {nodes} "
                     f"node{'s' if nodes > 1 else ''} reading at once, at "
                     f"{_num(row, 'data_bytes_per_image') / 1e3:.0f} KB an image "
                     f"{storage:,.0f} images/s")
    if decode == decode:
        workers = datapath.loader_slots(_num(row, "loader_workers"), n)
        parts.append(f"the loaders decode {_num(row, 'decode_img_s_per_core'):,.0f} images/s a "
                     f"core x {workers:.0f} workers, {decode:,.0f} images/s")
    limit = "storage" if row.get("input_limit") == "storage" else "decoding on the loaders"
    return (f"At {n} ranks training would take {_num(row, 'input_demand_ips'):,.0f} images/s "
            f"but the input gives {_num(row, 'input_ips'):,.0f}: {', and '.join(parts)}; so the "
            f"{limit} {pace} the pace.")


# ---------------------------------------------------------------------------- slow ranks

def _num(row: Any, key: str) -> float:
    value = row.get(key) if hasattr(row, "get") else None
    try:
        return math.nan if value is None else float(value)
    except (TypeError, ValueError):
        return math.nan


def _with_wait(row: Any) -> float:
    """The model's efficiency with the others' wait for the slow rank added to every step:
    model_eff x step / (step + wait), the baseline's step being unchanged.

    >>> round(_with_wait({"model_eff": 0.97, "model_step_s": 0.206, "straggler_wait_s": 0.06}), 3)
    0.751
    """
    step, wait = _num(row, "model_step_s"), _num(row, "straggler_wait_s")
    return _num(row, "model_eff") * step / (step + wait) if step > 0 and wait >= 0 else math.nan


def _slow_nodes(row: Any) -> str:
    """The flagged nodes of a point and the others' wait for them, e.g. 'node n2 held a rank
    that computed 30% longer per step than its peers in 3 of 3 runs, so the others waited 60 ms
    per step for it (mean over the runs)'."""
    hosts = [h for h in str(row.get("straggler_hosts") or "").split(", ") if h]
    which = f"node {hosts[0]}" if len(hosts) == 1 else f"nodes {', '.join(hosts)}"
    return (f"{which} held a rank that computed {_num(row, 'straggler_excess') * 100:.0f}% "
            f"longer per step than its peers in {int(row['straggler_runs'])} of "
            f"{int(row['straggler_runs_checked'])} runs, so the others waited "
            f"{ms(_num(row, 'straggler_wait_s'))} per step for it (mean over the runs)")


def slow_ranks_said(row: Any) -> str:
    """What comparing the ranks' compute times found at a point, as one sentence without its
    full stop; "" where they were not compared (no run with two ranks that gave compute times).

    >>> slow_ranks_said({"straggler_runs_checked": 3, "straggler_runs": 0,
    ...                  "straggler_threshold": 0.05})
    "No rank computed more than 5.0% longer per step than its run's other ranks (the noise threshold), so a slow rank does not explain it"
    """
    if not _num(row, "straggler_runs_checked") > 0:
        return ""
    if not _num(row, "straggler_runs") > 0:
        return (f"No rank computed more than {_num(row, 'straggler_threshold') * 100:.1f}% "
                "longer per step than its run's other ranks (the noise threshold), so a slow "
                "rank does not explain it")
    said = _slow_nodes(row)
    with_wait = _with_wait(row)
    if with_wait == with_wait:
        said += f"; with that wait in every step the model predicts {_eff(with_wait)}"
    return said[0].upper() + said[1:]


def straggler_bound(row: Any, sure: bool) -> tuple[str, str, str] | None:
    """straggler-bound when at least half of the point's runs have a flagged rank and the
    others' wait for it explains the measured efficiency better than the network does: the
    model with the wait added (_with_wait, the wait averaged over all the point's runs) is
    within TRACKING_TOLERANCE of the measurement and closer than the model alone, and the wait
    per step is at least the communication the model leaves exposed.

    >>> row = {"world_size": 4, "eff_mean": 0.78, "model_eff": 0.97, "model_step_s": 0.206,
    ...     "model_exposed_s": 0.006, "predicted_by": "ring", "straggler_runs_checked": 3,
    ...     "straggler_runs": 3, "straggler_wait_s": 0.06, "straggler_hosts": "n2",
    ...     "straggler_excess": 0.3, "straggler_threshold": 0.05}
    >>> kind, why, _ = straggler_bound(row, True); kind
    'straggler-bound'
    >>> why  # doctest: +NORMALIZE_WHITESPACE
    'At 4 ranks node n2 held a rank that computed 30% longer per step than its peers in 3 of 3
    runs, so the others waited 60 ms per step for it (mean over the runs), more than the 6.0 ms
    of communication the link leaves exposed: the ring model predicts 97.0% without that wait
    and 75.1% with it, against 78.0% measured, so the slow rank sets the pace.'
    >>> straggler_bound({**row, "model_exposed_s": 0.08}, True) is None  # the network costs more
    True
    """
    wait, eff, pred = _num(row, "straggler_wait_s"), _num(row, "eff_mean"), _num(row, "model_eff")
    flagged, checked = _num(row, "straggler_runs"), _num(row, "straggler_runs_checked")
    if not (flagged > 0 and 2 * flagged >= checked and wait > 0):
        return None  # a slow rank in a minority of the repeats is an incident, not the limit
    with_wait, exposed = _with_wait(row), _num(row, "model_exposed_s")
    off = abs(eff - with_wait)
    if not (off <= TRACKING_TOLERANCE and off < abs(eff - pred) and wait >= exposed):
        return None
    model = f"the {row['predicted_by']} model" if row.get("predicted_by") else "the model"
    likely = "" if sure else "likely "
    return "straggler-bound", (
        f"At {int(row['world_size'])} ranks {_slow_nodes(row)}, more than the {ms(exposed)} of "
        f"communication the link leaves exposed: {model} predicts {_eff(pred)} without that "
        f"wait and {_eff(with_wait)} with it, against {_eff(eff)} measured, so the slow rank "
        f"{likely}sets the pace."), ""


def _oversubscribed(row: pd.Series, lim: dict[str, Any], n: int,
                    eff: float) -> tuple[str, str, str] | None:
    host = float(lim.get("host_cpus") or math.nan)
    node_cpus = float(lim.get("node_cpus") or math.nan)
    ppn = int(row["procs_per_node"])
    if lim.get("emulated") and host > 0 and n > host:
        return "emulation-bound", (
            f"{n} ranks share {host:g} host cores of the emulated cluster, so they compete for "
            f"CPU and the {_eff(eff)} efficiency reflects the emulation, not the network."), ""
    if lim.get("emulated") and node_cpus > 0 and ppn > node_cpus:
        return "emulation-bound", (
            f"{ppn} processes per node share a {node_cpus:g}-CPU node, so they compete for CPU "
            f"and the {_eff(eff)} efficiency reflects the emulation, not the network."), ""
    return None


def _emulation_bound(row: pd.Series, base: pd.Series, lim: dict[str, Any], n: int,
                     eff: float) -> tuple[str, str, str] | None:
    grew = float(row["compute_time_mean_s"]) / float(base["compute_time_mean_s"])
    if grew > COMPUTE_INFLATION:
        what = (f"Each rank's compute per step grew from {float(base['compute_time_mean_s']):.3g}"
                f" s at {int(base['world_size'])} to {float(row['compute_time_mean_s']):.3g} s at "
                f"{n} ranks for the same work")
        if lim.get("emulated"):
            return "emulation-bound", (
                f"{what}: the emulated nodes compete for the host's CPU cores, so the "
                f"{_eff(eff)} efficiency reflects the emulation, not the network."), ""
        said = slow_ranks_said(row)  # where the ranks were compared: what that found
        return "undetermined", (f"{what}, so the {_eff(eff)} efficiency is lost in compute, "
                                "not communication."), (
            f"{said}. The hosts' CPU load during the run would settle it." if said else
            "Comparing each rank's compute time per step (ranks in runs.jsonl) to find a slow "
            "rank, and the host's CPU load during the run, would settle it.")
    measured = float(row["link_mbit_measured"])
    # what the link should carry: the line rate, or its fabric profile's share of it
    requested = float(row.get("link_target_mbit", row["bandwidth_mbit"]))
    if requested != requested:
        requested = float(row["bandwidth_mbit"])
    if measured > 0 and requested > 0 and measured < LINK_SHORTFALL * requested:
        return "emulation-bound", (
            f"The link delivered {measured:.0f} of the {requested:.0f} Mbit/s requested "
            f"({_pct(measured / requested)}), so the shaped link, not the model, sets the pace."), ""
    return None


def _judge_model(row: pd.Series, n: int, eff: float, sure: bool) -> tuple[str, str, str]:
    pred = float(row["model_eff"])
    by = row["predicted_by"]
    if by == "ring" and row.get("engine") == "ps":
        by = "no-overlap"  # the ring model's form, with the parameter servers' bytes
    model = f"the {by} model" if by else "the model"
    if math.isnan(pred):
        return "undetermined", (
            f"At {n} ranks efficiency is {_eff(eff)}, but no link rate is known (native link, "
            "no measurement, no allreduce probe), so the model cannot predict it."), _SETTLE_LINK
    likely = "" if sure else "likely "
    exposed, share = float(row["model_exposed_s"]), float(row["model_share"])
    if abs(eff - pred) > TRACKING_TOLERANCE:
        if eff >= COMPUTE_BOUND_EFFICIENCY:
            hint = "" if row["predicted_by"] != "ring" else (
                " (without a per-layer profile it cannot see communication hidden behind the "
                "backward pass; `invoke profile` measures one)")
            return "compute-bound", (
                f"At {n} ranks efficiency is {_eff(eff)}, so little is lost and compute "
                f"{likely}sets the pace; {model} predicts {_eff(pred)}{hint}."), ""
        said = slow_ranks_said(row)  # where the ranks were compared: what that found
        return "undetermined", (
            f"At {n} ranks efficiency is {_eff(eff)} but {model} predicts {_eff(pred)}: a gap "
            f"of {abs(eff - pred) * 100:.0f} points that the link rate does not explain."), \
            f"{said}. {_SETTLE_REPEAT}" if said else _SETTLE_RERUN
    said = f"{model} predicts {_eff(pred)} against {_eff(eff)} measured"
    if share >= NETWORK_SHARE:
        measured = float(row.get("comm_time_mean_s", math.nan))
        seen = f"; measured {ms(measured)}" if measured == measured else ""
        link, intra = float(row["link_mbit_model"]), float(row.get("intra_mbit") or math.nan)
        path = (f"a {link:,.0f} Mbit/s link" if not intra < link else
                f"a {intra:,.0f} Mbit/s path between the GPUs of a node (slower than the link)")
        lay = layouts.of_row(row)
        if lay.ps:  # which NIC paces the step: a server's or a worker's
            nic, nbytes = layouts.busiest(lay, float(row["gradient_bytes"]))
            whose = ("a server node's NIC" if nic == "server" else "a worker node's NIC")
            where = (f"{lay.servers} {lay.placement} parameter server"
                     f"{'s' if lay.servers != 1 else ''}")
            path = (f"{path}; with {where} the busiest is {whose}, "
                    f"{nbytes / 1e6:.3g} MB each way a step")
        return "network-bound", (
            f"At {n} ranks each step moves {float(row['gradient_bytes']) / 1e6:.3g} MB of "
            f"gradients over {path} and {ms(exposed)} "
            f"of that communication is exposed, not hidden behind compute ({_pct(share)} of "
            f"the step{seen}): {said}, so the link {likely}sets the pace."), ""
    linear = (", and more nodes add throughput almost linearly"
              if eff >= COMPUTE_BOUND_EFFICIENCY else "")
    return "compute-bound", (
        f"At {n} ranks only {ms(exposed)} of communication per step is exposed ({_pct(share)} "
        f"of the step): {said}, so compute {likely}sets the pace{linear}."), ""


# ---------------------------------------------------------------------------- per series

@dataclass(frozen=True)
class Bottleneck:
    """What limits one series: the verdict of its largest world size."""

    series: dict[str, Any]
    kind: str  # one of BOTTLENECKS
    world_size: int
    measured_eff: float
    predicted_eff: float  # the model's (model_eff)
    exposed_s: float  # the model's exposed communication per step
    comm_share: float  # exposed / step, the model's
    model: str  # "overlap", "ring" or ""
    explanation: str  # one sentence (two for "undetermined": why, then what would settle it)

    @property
    def label(self) -> str:
        s = self.series
        return (f"{batch_text(s.get('batch_size'), s.get('scaling'))}, {s.get('bandwidth')}, "
                f"{s.get('procs_per_node')} proc/node")


def classify(judged: pd.DataFrame) -> list[Bottleneck]:
    """One Bottleneck per series (rows of add_verdicts): its largest world size's verdict; a
    series measured at its baseline only is undetermined and says what would settle it."""
    if judged.empty:
        return []
    keys = list(SERIES_KEYS)
    out: list[Bottleneck] = []
    for key, grp in judged.groupby(keys, dropna=False, sort=True):
        row = grp.loc[grp["world_size"].idxmax()]
        n = int(row["world_size"])
        kind, why = str(row["verdict"]), str(row["verdict_why"])
        if not kind:
            kind, why = "undetermined", (
                f"Only one world size ({n}) was measured, so scaling cannot be judged. A run at a "
                "second node count (e.g. invoke bench --nodes 1,2) would settle it.")
        out.append(Bottleneck(dict(zip(keys, key, strict=True)), kind, n,
                              float(row["eff_mean"]), float(row["model_eff"]),
                              float(row["model_exposed_s"]), float(row["model_share"]),
                              str(row["predicted_by"]), why))
    return out


def judge(modelled: pd.DataFrame, limits: dict[str, dict[str, Any]] | None = None
          ) -> tuple[pd.DataFrame, ModelError, list[Bottleneck]]:
    """The whole judgement of bucket_model.add_prediction's frame: the model's error, every point's
    verdict worded by it, and each series' bottleneck."""
    error = model_error(modelled)
    judged = add_verdicts(modelled, limits, error)
    return judged, error, classify(judged)
