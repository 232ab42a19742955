"""The report's Failures section: per run that had a failure injected, what coming back cost,
and what the goodput model (scalelab.model.goodput) makes of it at a stated failure rate."""

from __future__ import annotations

import math

import pandas as pd

from scalelab.model import goodput
from scalelab.report.data import Analysis
from scalelab.report.markup import esc, table

# what the model adds to a row (NaN where it cannot: a dilated run)
MODELLED = ("tau", "goodput", "young_steps", "daly_steps", "goodput_daly", "eff", "eff_after",
            "dominant", "goodput_own", "goodput_measured")


def own_step(r: pd.Series) -> float:
    """A run's mean step time over all its attempts where it was measured (a run with a
    period, Ns: from its step lines), else its last attempt's."""
    step = float(r.get("trained_step_s", math.nan))
    return step if step > 0 else float(r["step_time_mean_s"])


def _own(r: pd.Series, column: str, otherwise: float) -> float:
    """A cost measured over all of a run's attempts (a run with a period: C, R), else the
    last attempt's."""
    v = float(r.get(column, math.nan))
    return v if v >= 0 else otherwise


def measured(r: pd.Series) -> float:
    """A run's goodput as measured: its timed steps at its mean step time over the wall time
    its training took, checkpoints, kills, restarts and redone steps in it; NaN without that
    wall time (only a run with a period, Ns, records it)."""
    steps, wall = float(r.get("trained_steps", math.nan)), float(r.get("trained_s", math.nan))
    return steps * own_step(r) / wall if wall > 0 and steps > 0 else math.nan


def seen_mtbf_s(r: pd.Series) -> float:
    """The failure rate a run killed at a rate (--inject-failure Ns) saw, as an MTBF: the
    seconds its kills' clock ran over its kills, as N is a mean of that clock; the asked N for
    a record from before the clock was recorded, NaN for a run without a rate. The kills are
    random (a Poisson process), and a run of a few of them sees a rate well off the asked
    one: the model is checked at the rate the run saw.

    >>> seen_mtbf_s(pd.Series({"failure_every_s": 20.0, "trained_up_s": 240.0,
    ...                        "failures_injected": 10}))
    24.0
    >>> seen_mtbf_s(pd.Series({"failure_every_s": 20.0, "failures_injected": 10}))
    20.0
    """
    every_s = float(r.get("failure_every_s", math.nan))
    if not every_s > 0:
        return math.nan
    up, kills = float(r.get("trained_up_s", math.nan)), float(r.get("failures_injected", 0))
    return up / kills if up > 0 and kills > 0 else every_s


def frame(runs: pd.DataFrame, node_mtbf_h: float) -> pd.DataFrame:
    """One row per ok run with an injected failure and its checkpoints: C (the checkpoints'
    blocking time), R (kill to every rank ready), the interval tau (the run's every x its mean
    step time), the job's MTBF on its nodes, goodput at tau and at Daly's interval, Young's
    and Daly's intervals in steps, and the term that loses the most at tau."""
    cols = ["failed_node", "recovery_ready_s", "checkpoint_blocked_s", "checkpoint_every"]
    if runs.empty or any(c not in runs for c in cols):
        return pd.DataFrame()
    ok = runs[(runs["status"] == "ok") & (runs["failed_node"].astype(str) != "")
              & runs["recovery_ready_s"].notna()]
    out = []
    for _, r in ok.iterrows():
        c, rr = float(r["checkpoint_blocked_s"]), float(r["recovery_ready_s"])
        step, every = float(r["step_time_mean_s"]), float(r["checkpoint_every"] or 0)
        if not every or math.isnan(c) or not step > 0:
            continue
        m = goodput.job_mtbf_s(node_mtbf_h, int(r["nodes"]))
        row = {"nodes": int(r["nodes"]), "world_size": int(r["world_size"]),
               "failed_node": r["failed_node"], "redone": r["recomputed_steps"],
               "c": c, "r": rr, "every": int(every), "mtbf_h": m / 3600.0,
               "kills": r.get("failures_injected", math.nan),
               **dict.fromkeys(MODELLED, math.nan)}
        dilation = float(r.get("dilation") or 1.0)
        if not math.isnan(dilation) and dilation > 1.0:
            # an emulated device's steps are its time, C and R the host's: no model
            out.append(row)
            continue
        tau, daly = every * step, goodput.daly_s(c, m)
        eff = float(r.get("scaling_efficiency", float("nan")))
        at = goodput.goodput(tau, c, rr, m)
        own = goodput.goodput(every * own_step(r), _own(r, "trained_save_s", c),
                              _own(r, "trained_restart_s", rr), seen_mtbf_s(r))
        out.append({
            **row, "tau": tau, "goodput": at, "young_steps": goodput.young_s(c, m) / step,
            "daly_steps": daly / step, "goodput_daly": goodput.goodput(daly, c, rr, m),
            "eff": eff, "eff_after": eff * at if not math.isnan(eff) else float("nan"),
            "dominant": goodput.terms(tau, c, rr, m).dominant(),
            "goodput_own": own, "goodput_measured": measured(r)})
    return pd.DataFrame(out)


def section(a: Analysis) -> str:
    """The Failures section ("" where no run had a failure injected)."""
    node_mtbf_h = a.node_mtbf_h or goodput.LLAMA3_NODE_MTBF_H
    rate = ("Llama 3&#39;s pre-training rate per host of 8 GPUs; invoke report "
            "--node-mtbf-hours sets another" if a.node_mtbf_h is None else "as given")
    f = frame(a.runs, node_mtbf_h)
    if f.empty:
        return ""
    parts = ['<h2 id="failures">Failures</h2>',
             '<p class="note">Each run that had one node&#39;s ranks killed mid-run '
             "(--inject-failure, docs/checkpoints.md) and came back from its last checkpoint: "
             "C, the seconds a checkpoint blocked training; R, the seconds from the kill until "
             "every rank was ready to train again; the steps done twice. From them, the "
             "model (docs/checkpoints.md) gives the share of wall time left to training (goodput) at the run&#39;s "
             f"interval and at the best one, for nodes that each fail once every "
             f"{esc(f'{node_mtbf_h:,.0f}')} hours ({rate}), and names the term that loses "
             "the most. Efficiency after failures is "
             "the scaling efficiency between them times goodput. Seconds are the host&#39;s "
             "own; a dilated run&#39;s steps are its emulated device&#39;s time, so it gets no "
             "model. A run killed every N seconds of training on average (--inject-failure "
             "Ns, at random) also has the model at the rate it saw (its training time over its "
             "kills) beside the goodput it measured: its timed steps at its mean step time "
             "over the wall time its training took. Its model takes the step, C and R over "
             "all its attempts, R from each kill until the next step was done, less a "
             "step.</p>"]
    cols = [("nodes", "nodes", "int"), ("world_size", "ranks", "int"),
            ("failed_node", "killed", "str"), ("redone", "steps redone", "int"),
            ("c", "C s", "num"), ("r", "R s", "num"), ("every", "every (steps)", "int"),
            ("mtbf_h", "job MTBF h", "num"), ("goodput", "goodput", "pct"),
            ("young_steps", "Young (steps)", "int"), ("daly_steps", "Daly (steps)", "int"),
            ("goodput_daly", "goodput at Daly", "pct"), ("eff", "efficiency", "pct"),
            ("eff_after", "after failures", "pct"), ("dominant", "loses most", "wrap")]
    if f["goodput_measured"].notna().any():
        cols += [("kills", "kills", "int"), ("goodput_own", "model at the rate it saw", "pct"),
                 ("goodput_measured", "measured", "pct")]
    parts.append(table(f.sort_values(["nodes", "world_size"]), cols, "failures"))
    return "\n".join(parts)
