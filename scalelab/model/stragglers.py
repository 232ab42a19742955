"""Slow ranks: each rank's compute time per step against its peers', run by run.

In synchronous data parallelism a step ends when the last rank's gradients are in, so a rank
that computes longer than the others makes them wait, and the wait shows up in their exposed
communication, not in their compute. The rule, for every ok run with two ranks or more:

* a rank's *excess* is its compute time per step (compute_time_mean_s) over the median of the
  *other* ranks of its run, minus 1: 0.30 means it computed 30 % longer than its peers;
* the *noise* is how much a rank's excess moves when nothing is slow, from the sweep itself:
  the differences between successive runs of the same rank in the same layout (same world
  size and processes per node, so the same node holds it), over repeats and over the sweep's
  other batch sizes and link rates. A node that is slow in every run cancels out of those
  differences, so it cannot hide itself in the noise; one slow in a single run adds two large
  differences among many. As a robust standard deviation: the median of the differences
  divided by 0.954 (0.6745 x sqrt 2, the median of |a - b| for two normal draws of standard
  deviation 1). A sweep with fewer than MIN_SAMPLES such differences (every layout run once)
  takes the spread of the excess over all ranks of its runs instead, 1.4826 x its median
  absolute deviation, which a minority of slow ranks barely moves; with fewer ranks than
  that, the floor alone;
* a rank is *flagged* when its excess is above the threshold max(NOISE_FLOOR,
  NOISE_SIGMAS x noise);
* its *wait* is its compute time minus the others' median: per step, the time the others
  spent waiting for it. A run's wait is its largest flagged rank's (everyone waits for the
  slowest), 0 when none is flagged.

>>> ranks = pd.DataFrame({"sweep_id": "s", "run_id": "r", "rank": [0, 1, 2, 3],
...     "host": ["n0", "n1", "n2", "n3"], "compute_time_mean_s": [0.200, 0.202, 0.260, 0.199]})
>>> runs = pd.DataFrame({"sweep_id": ["s"], "run_id": ["r"], "status": ["ok"], "repeat": [0],
...     "world_size": [4], **{k: ["x"] for k in SERIES_KEYS if k != "sweep_id"}})
>>> found = find(ranks, runs)
>>> found.noise["s"].threshold  # one run of 4 ranks: too few samples, the floor alone
0.05
>>> row = found.flagged.iloc[0]
>>> row["host"], round(float(row["excess"]), 3), round(float(row["wait_s"]) * 1000, 1)
('n2', 0.3, 60.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from scalelab.model.analysis import SERIES_KEYS

NOISE_FLOOR = 0.05  # below 5 % a slower rank is clock, turbo and OS jitter, too small to name
# 4 standard deviations: a sweep holds thousands of rank measurements; at 3 about one in 740
# would be flagged by noise alone, at 4 about one in 32,000
NOISE_SIGMAS = 4.0
MIN_SAMPLES = 8  # differences (or ranks) below which a spread is not estimated
_DIFF_TO_SD = 0.6745 * math.sqrt(2)  # median |a - b| of two N(0, 1) draws
_MAD_TO_SD = 1.4826  # 1 / 0.6745: median absolute deviation of N(0, 1) to its sd

POINT_KEYS = [*SERIES_KEYS, "world_size"]
POINT_COLUMNS = ("straggler_runs_checked", "straggler_runs", "straggler_wait_s",
                 "straggler_hosts", "straggler_excess", "straggler_threshold")


# ---------------------------------------------------------------------------- the rule

def threshold(spread: float) -> float:
    """The excess above which a rank is flagged: the larger of NOISE_FLOOR and NOISE_SIGMAS x
    the noise (its standard deviation; NaN when it could not be estimated).

    >>> threshold(0.004), threshold(0.03), threshold(float("nan"))
    (0.05, 0.12, 0.05)
    """
    return NOISE_FLOOR if not spread == spread else max(NOISE_FLOOR, NOISE_SIGMAS * spread)


@dataclass(frozen=True)
class Noise:
    """One sweep's noise in a rank's excess, and the threshold it sets."""

    spread: float  # standard deviation of the excess (fraction); NaN when not estimated
    source: str  # "runs", "ranks" or "" (too few samples: the floor alone)
    samples: int

    @property
    def threshold(self) -> float:
        return threshold(self.spread)

    def sentence(self) -> str:
        """How the threshold was set, in one sentence.

        >>> Noise(0.031, "runs", 96).sentence()  # doctest: +NORMALIZE_WHITESPACE
        "A rank is flagged when its compute time per step is more than 12.4% above the median
        of its run's other ranks: 4 x the run-to-run noise (the same rank's excess moved by
        3.1% from one run of its layout to the next, over 96 differences), or the 5% floor if
        that is larger."
        """
        head = (f"A rank is flagged when its compute time per step is more than "
                f"{self.threshold * 100:.1f}% above the median of its run's other ranks: ")
        sig = f"{NOISE_SIGMAS:g}"
        if self.source == "runs":
            how = (f"{sig} x the run-to-run noise (the same rank's excess moved by "
                   f"{self.spread * 100:.1f}% from one run of its layout to the next, over "
                   f"{self.samples:,} differences)")
        elif self.source == "ranks":
            how = (f"{sig} x the noise, taken from the spread of the excess over all "
                   f"{self.samples:,} ranks of the sweep's runs ({self.spread * 100:.1f}%), "
                   "no rank having run twice in one layout")
        else:
            return (head + f"the {NOISE_FLOOR * 100:.0f}% floor alone, because too few ranks "
                    "and runs were measured to estimate the noise, so a flag may be noise: "
                    "repeating the sweep (--repeats 3) would tell.")
        return head + how + f", or the {NOISE_FLOOR * 100:.0f}% floor if that is larger."


def others_median(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each value, the median of the other values of its group (NaN when it is alone).

    >>> others_median(np.array([0, 0, 0, 1, 1, 2]), np.array([1.0, 1.3, 1.1, 2.0, 4.0, 5.0]))
    array([1.2 , 1.05, 1.15, 4.  , 2.  ,  nan])
    """
    n = len(values)
    out = np.full(n, np.nan)
    if n == 0:
        return out
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    first = np.r_[True, g[1:] != g[:-1]]
    starts = np.flatnonzero(first)
    gid = np.cumsum(first) - 1
    start, size = starts[gid], np.diff(np.r_[starts, n])[gid]
    k = np.arange(n) - start  # position within the sorted group
    # the median of the size - 1 others sits at their positions (size-2)//2 and (size-1)//2;
    # an other's position at or after k is one further in the whole sorted group
    lo, hi = (size - 2) // 2, (size - 1) // 2
    lo, hi = lo + (lo >= k), hi + (hi >= k)
    med = (v[np.clip(start + lo, 0, n - 1)] + v[np.clip(start + hi, 0, n - 1)]) / 2
    out[order] = np.where(size > 1, med, np.nan)
    return out


LAYOUT_KEYS = ["sweep_id", "world_size", "procs_per_node", "rank"]  # one rank on one node


def estimate_noise(excess: pd.DataFrame) -> Noise:
    """The noise of one sweep's excess (rows of rank_excess): the spread of the differences
    between successive runs of the same rank in the same layout (LAYOUT_KEYS: the same node
    holds it), over repeats and the sweep's other batch sizes and link rates; without
    MIN_SAMPLES of them, the spread over all ranks; else none (the floor alone).

    Rank 3 is 30 % slow in every run: it cancels out between runs; the differences are 0.02
    or 0.03 (median 0.025), so the noise is 0.025 / 0.954:

    >>> e = pd.DataFrame({"sweep_id": "s", "world_size": 4, "procs_per_node": 1,
    ...     "rank": [0, 1, 2, 3] * 3, "repeat": [0] * 4 + [1] * 4 + [2] * 4,
    ...     "excess": [0.01, -0.01, 0.0, 0.30, -0.02, 0.02, 0.02, 0.32, 0.0, 0.0, -0.01, 0.29]})
    >>> n = estimate_noise(e); n.source, n.samples, round(n.spread, 4), round(threshold(n.spread), 3)
    ('runs', 8, 0.0262, 0.105)
    """
    order = LAYOUT_KEYS + [k for k in (*POINT_KEYS, "repeat") if k in excess
                           and k not in LAYOUT_KEYS]
    ordered = excess.sort_values(order, kind="stable")
    diffs = ordered.groupby(LAYOUT_KEYS, dropna=False, sort=False)["excess"].diff()
    diffs = diffs.dropna().abs()
    if len(diffs) >= MIN_SAMPLES:
        return Noise(float(diffs.median()) / _DIFF_TO_SD, "runs", len(diffs))
    e = excess["excess"].dropna()
    if len(e) >= MIN_SAMPLES:
        return Noise(_MAD_TO_SD * float((e - e.median()).abs().median()), "ranks", len(e))
    return Noise(math.nan, "", len(e))


# ---------------------------------------------------------------------------- per rank, per run

def rank_excess(ranks: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Every rank of every ok run with two ranks or more that reported a compute time:
    POINT_KEYS, run_id, repeat, rank, host, compute_s, others_s (the other ranks' median),
    excess and wait_s (compute_s - others_s). ``ranks``: scalelab.results.frames.rank_frame;
    ``runs``: scalelab.results.frames.to_frame."""
    cols = ["sweep_id", "run_id", "status", "repeat", *[k for k in POINT_KEYS if k != "sweep_id"]]
    meta = runs[cols].drop_duplicates(["sweep_id", "run_id"], keep="last")
    df = ranks.merge(meta[meta["status"] == "ok"], on=["sweep_id", "run_id"], how="inner")
    df = df.rename(columns={"compute_time_mean_s": "compute_s"})
    df = df[df["compute_s"].astype(float) > 0].reset_index(drop=True)
    run_no = df.groupby(["sweep_id", "run_id"], sort=False).ngroup().to_numpy()
    df["others_s"] = others_median(run_no, df["compute_s"].to_numpy(dtype=float))
    df = df[df["others_s"] > 0].reset_index(drop=True)
    df["excess"] = df["compute_s"] / df["others_s"] - 1
    df["wait_s"] = df["compute_s"] - df["others_s"]
    return df


@dataclass
class Stragglers:
    """The slow ranks of one or more sweeps, and the noise threshold of each."""

    ranks: pd.DataFrame  # rank_excess, with "flagged" and the sweep's "threshold"
    noise: dict[str, Noise]

    @property
    def flagged(self) -> pd.DataFrame:
        """The flagged ranks, by sweep, point and repeat."""
        f = self.ranks[self.ranks["flagged"]]
        return f.sort_values(["sweep_id", "world_size", "run_id", "rank"], kind="stable")

    def per_run(self) -> pd.DataFrame:
        """One row per checked run: POINT_KEYS, run_id, flagged (its flagged ranks), wait_s
        (its largest flagged rank's wait, 0 when none), hosts (the flagged ranks' nodes)."""
        r = self.ranks.assign(_w=self.ranks["wait_s"].where(self.ranks["flagged"], 0.0),
                              _h=self.ranks["host"].astype(str).where(self.ranks["flagged"], ""))
        g = r.groupby([*POINT_KEYS, "run_id"], dropna=False, sort=False)
        out = g.agg(flagged=("flagged", "sum"), wait_s=("_w", "max"), excess=("excess", "max"),
                    hosts=("_h", lambda h: ", ".join(sorted({x for x in h if x}))))
        return out.reset_index()


def find(ranks: pd.DataFrame, runs: pd.DataFrame) -> Stragglers:
    """Flags the slow ranks of every ok run (see the module's rule), each sweep judged against
    its own noise."""
    df = rank_excess(ranks, runs)
    noise = {str(s): estimate_noise(g) for s, g in df.groupby("sweep_id", sort=False)}
    limit = df["sweep_id"].map(lambda s: noise[str(s)].threshold).astype(float)
    df["threshold"] = limit
    df["flagged"] = df["excess"] > limit
    return Stragglers(df, noise)


# ---------------------------------------------------------------------------- per point

def add_to_points(points: pd.DataFrame, found: Stragglers) -> pd.DataFrame:
    """POINT_COLUMNS added to each (series, world size) row of the summary: the ok runs whose
    ranks were checked and those with a flagged rank, the mean wait per step over the checked
    runs (0 in a run without a flagged rank; NaN when none was checked), the flagged nodes,
    the flagged ranks' mean excess and the sweep's threshold."""
    out = points.copy()
    per = found.per_run()
    if out.empty or per.empty:
        return out.assign(straggler_runs_checked=0, straggler_runs=0, straggler_wait_s=math.nan,
                          straggler_hosts="", straggler_excess=math.nan,
                          straggler_threshold=math.nan)
    per["_flag_excess"] = per["excess"].where(per["flagged"] > 0)
    agg = per.groupby(POINT_KEYS, dropna=False, sort=False).agg(
        straggler_runs_checked=("run_id", "size"),
        straggler_runs=("flagged", lambda f: int((f > 0).sum())),
        straggler_wait_s=("wait_s", "mean"),
        straggler_hosts=("hosts", lambda h: ", ".join(sorted({x for s in h for x in
                                                              str(s).split(", ") if x}))),
        straggler_excess=("_flag_excess", "mean")).reset_index()
    agg["straggler_threshold"] = agg["sweep_id"].map(
        lambda s: found.noise[str(s)].threshold).astype(float)
    out = out.merge(agg, on=POINT_KEYS, how="left")
    out["straggler_runs_checked"] = out["straggler_runs_checked"].fillna(0).astype(int)
    out["straggler_runs"] = out["straggler_runs"].fillna(0).astype(int)
    out["straggler_hosts"] = out["straggler_hosts"].fillna("")
    return out


def node_findings(found: Stragglers) -> list[str]:
    """One sentence per node that held a flagged rank: in how many of its checked runs, by how
    much its ranks computed longer than their peers, and the others' wait per step (medians
    over the runs where it was flagged)."""
    f = found.flagged
    if f.empty:
        return []
    multi = f["sweep_id"].nunique() > 1
    runs_of = found.ranks.groupby(["sweep_id", "host"])["run_id"].nunique()
    lines = []
    for (sweep, host), g in f.groupby(["sweep_id", "host"], sort=True):
        per_run = g.groupby("run_id").agg(excess=("excess", "max"), wait=("wait_s", "max"))
        total = int(runs_of.get((sweep, host), len(per_run)))
        where = f" (sweep {sweep})" if multi else ""
        lines.append(
            f"Node {host}{where} was slow in {len(per_run):,} of the {total:,} runs it took "
            f"part in: its ranks computed {per_run['excess'].median() * 100:.0f}% longer per "
            f"step than their peers, so the others waited "
            f"{_ms(float(per_run['wait'].median()))} per step for it (median over those "
            "runs).")
    return lines


def _ms(seconds: float) -> str:
    """A time per step in milliseconds, as scalelab.model.verdict.ms writes it.

    >>> _ms(0.0312), _ms(0.0042), _ms(1.5)
    ('31 ms', '4.2 ms', '1,500 ms')
    """
    v = seconds * 1000
    return f"{v:,.0f} ms" if abs(v) >= 10 else f"{v:.1f} ms"
