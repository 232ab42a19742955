"""What the kills' schedule does to measured goodput: a simulation, no cluster.

A run of --steps steps of --step seconds checkpoints every --every steps (each save blocks
--c seconds); a kill sends it back to its last checkpoint and costs --r seconds before it
trains again; at most --max-kills kills a run. Two schedules of kills, --period seconds
apart on average, are simulated --trials times each:

* poisson: what `--inject-failure Ns` does (scalelab.run.failures.Injector.gap_s): the gap
  until each kill is an exponential draw of mean --period, in the time the run trains (the
  clock stops while it restarts);
* jittered: what it did before (commit 7c86871): the k-th kill due at a uniform draw in
  [k + 0.5, k + 1.5) periods of wall time from the first step, waiting for the ranks to
  train again when it falls in a restart.

Prints, per schedule, the goodput (the steps' time over the wall time) over all trials and
its spread from run to run, and the model (scalelab.model.goodput) at the asked rate; for
the Poisson schedule also how far each run is from the model at the rate it saw (its
training time over its kills), the check bench/perf/goodput_check.py makes.

Usage: .venv/bin/python bench/perf/goodput_schedules.py [--c 1.368] [--r 8.89] [--step 0.2844]
       [--every 25] [--steps 600] [--period 20] [--max-kills 20] [--trials 2000]
(the defaults are the first 4-node goodput check at commit 7c86871, in docs/checkpoints.md)
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scalelab.model import goodput  # noqa: E402


def run(next_kill: Callable[[int, float, float], float], work: float, tau: float, c: float,
        r: float, step: float, max_kills: int) -> tuple[float, int, float]:
    """One run: (wall seconds, kills, seconds the kills' clock ran). next_kill(k, t, up): the
    wall time at which kill k falls, given the wall time t and the clock's seconds up when the
    ranks trained again (math.inf: none)."""
    t = done = saved = seg = up = 0.0
    kills = 0
    due = next_kill(0, t, up) if max_kills else math.inf
    while done < work - 1e-9:
        phase = min(tau - seg, work - done)  # training to the next save or the end
        saving = phase == tau - seg and done + phase < work - 1e-9
        length = phase + (c if saving else 0.0)
        if due < t + length:  # killed: back to the last checkpoint
            up += max(due - t, 0.0)
            t = max(due, t) + r
            done, seg, kills = saved, 0.0, kills + 1
            due = next_kill(kills, t, up) if kills < max_kills else math.inf
            due = max(due, t + step)  # a kill needs ranks that train
            continue
        t, up, done = t + length, up + length, done + phase
        seg = 0.0 if saving else seg + phase
        if saving:
            saved = done
    return t, kills, up


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--c", type=float, default=1.368, help="seconds a checkpoint blocks")
    ap.add_argument("--r", type=float, default=8.89, help="seconds from a kill to training")
    ap.add_argument("--step", type=float, default=0.2844, help="seconds a step")
    ap.add_argument("--every", type=int, default=25, help="steps between checkpoints")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--period", type=float, default=20.0, help="mean seconds between kills")
    ap.add_argument("--max-kills", type=int, default=20)
    ap.add_argument("--trials", type=int, default=2000)
    a = ap.parse_args()
    if not (a.c >= 0 and a.r >= 0 and a.step > 0 and 1 <= a.every <= a.steps <= 100_000
            and a.period > 0 and 0 <= a.max_kills <= 1000 and 1 <= a.trials <= 100_000):
        ap.error("--c, --r >= 0; --step, --period > 0; 1 <= --every <= --steps <= 100000; "
                 "--max-kills 0-1000; --trials 1-100000")
    work, tau = a.steps * a.step, a.every * a.step
    model = goodput.goodput(tau, a.c, a.r, a.period)
    print(f"C {a.c} s, R {a.r} s, tau {tau:.2f} s, {a.steps} steps of {a.step} s, a kill every "
          f"{a.period} s on average (at most {a.max_kills}), {a.trials} runs a schedule")
    print(f"model at the asked rate: {100 * model:.1f} % (Daly's form, failures also while "
          f"restarting: {100 * tau / (a.period * math.exp(a.r / a.period) * math.expm1((tau + a.c) / a.period)):.1f} %)")

    def poisson(rng: random.Random) -> Callable[[int, float, float], float]:
        return lambda k, t, up: t + rng.expovariate(1.0 / a.period)

    def jittered(rng: random.Random) -> Callable[[int, float, float], float]:
        return lambda k, t, up: (k + 0.5 + rng.random()) * a.period

    print(f"{'schedule':>9} {'goodput':>8} {'sd pts':>6} {'kills':>6} {'model - it':>10} "
          f"{'|run - model at seen| pts: median':>33} {'<5 pts':>7}")
    for name, schedule in (("poisson", poisson), ("jittered", jittered)):
        walls, kills, off = [], [], []
        for trial in range(a.trials):
            wall, k, up = run(schedule(random.Random(trial)), work, tau, a.c, a.r, a.step,
                              a.max_kills)
            walls.append(wall)
            kills.append(k)
            if name == "poisson" and k:
                off.append(100 * abs(work / wall - goodput.goodput(tau, a.c, a.r, up / k)))
        g = work / statistics.fmean(walls)
        sd = 100 * statistics.pstdev([work / w for w in walls])
        seen = (f"{statistics.median(off):>33.1f} {sum(x < 5 for x in off) / len(off):>6.0%}"
                if off else f"{'':>33} {'':>7}")
        print(f"{name:>9} {100 * g:>7.1f}% {sd:>6.1f} {statistics.fmean(kills):>6.1f} "
              f"{100 * (model - g):>+10.1f} {seen}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
