"""The goodput model against a measured run with failures at a stated rate, on the local target.

A local cluster of --nodes nodes (needs root). One `invoke bench` sweep trains --model
(ResNet-50 by default) on emulated --accelerator devices (V100 by default) for --steps timed
steps, saving a checkpoint every --every steps to each node's own disk, twice: as is
(--inject-failure off) and with a node's ranks, one drawn at random each time, killed after
a random time of training, --period seconds on average (--inject-failure Ns: a Poisson
process in the time the ranks train). Under --engine ddp torchrun's agents restart every
rank, which go on from the last checkpoint; under --engine horovod (2 nodes or more)
Horovod's elastic driver brings the node's ranks back with the state committed at it.

Prints, per repeat, the measured goodput (the timed steps at the run's mean step time, over
all its attempts, over the wall time its training took, kills, restarts, checkpoints and
redone steps in it) and the model (scalelab.model.goodput) from the run's own step time, C
(a checkpoint's blocking time) and R (from a kill until the next attempt's first step was
done, less a step), each a mean over all its attempts from its step lines: at the rate asked,
and at the rate the run saw (M seen: the seconds the kills' clock ran over the kills; a run of
a few random kills sees a rate well off the asked one), and the difference of the measured
from the latter in points. The run without failures gives C for comparison; "last R" is the
last kill's kill-to-all-ready time. The cluster is destroyed at the end, also on a failure.

Usage: .venv/bin/python bench/perf/goodput_check.py [--nodes 2] [--period 20] [--every 25]
       [--steps 600] [--repeats 2] [--model resnet50] [--accelerator v100] [--batch-size 32]
       [--engine ddp|horovod]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _state import destroy, invoke, private_state  # noqa: E402

from scalelab.model import goodput  # noqa: E402


def _step(run: dict) -> float:
    return sum(r["step_time_mean_s"] for r in run["ranks"]) / len(run["ranks"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--period", type=int, default=20, help="seconds of training between kills")
    ap.add_argument("--every", type=int, default=25, help="timed steps between checkpoints")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--accelerator", default="v100")
    ap.add_argument("--batch-size", default="32")
    ap.add_argument("--engine", choices=["ddp", "horovod"], default="ddp")
    a = ap.parse_args()
    if not (1 <= a.nodes <= 16 and 5 <= a.period <= 3600 and 1 <= a.every <= a.steps <= 5000
            and 1 <= a.repeats <= 5):
        ap.error("--nodes 1-16, --period 5-3600, 1 <= --every <= --steps <= 5000, "
                 "--repeats 1-5")
    if a.engine == "horovod" and a.nodes < 2:
        ap.error("--engine horovod: --nodes 2 or more")
    private_state()
    name = f"gp{uuid.uuid4().hex[:4]}"
    invoke("provision", "--target", "local", "--cluster", name, "--nodes", str(a.nodes))
    try:
        invoke("bench", "--cluster", name, "--no-report", "--sweep", "ci", "--nodes",
               str(a.nodes), "--engine", a.engine, "--batch-size", a.batch_size,
               "--model", a.model,
               "--accelerator", a.accelerator, "--steps", str(a.steps), "--repeats",
               str(a.repeats), "--bandwidth", "native", "--checkpoint-every", str(a.every),
               "--inject-failure", f"off,{a.period}s", "--timeout", "3600", timeout=7200)
        reports = Path(os.environ["SCALELAB_REPORTS"])
        sweep_dir = reports / os.readlink(reports / "latest")
        runs = [r for r in map(json.loads, (sweep_dir / "runs.jsonl").read_text()
                               .splitlines()) if r["kind"] == "train"]
    finally:
        destroy(name)
    print(f"{a.engine}: {a.model} on emulated {a.accelerator}, {a.nodes} nodes, batch {a.batch_size}, "
          f"{a.steps} timed steps, a checkpoint every {a.every} to each node's own disk; a "
          f"node's ranks killed after {a.period} s of training on average, again and again")
    plain = [r for r in runs if not r.get("failure") and r["status"] == "ok"]
    c = sum(r["checkpoint"]["blocked_s_mean"] for r in plain) / max(1, len(plain))
    print(f"without failures: C {c:.3f} s a checkpoint, step "
          f"{sum(map(_step, plain)) / max(1, len(plain)):.4f} s, dilation "
          f"{plain[0]['params'].get('dilation') if plain else '?'}")
    print(f"{'repeat':>6} {'status':>7} {'kills':>5} {'C s':>6} {'R s':>6} {'last R':>6} "
          f"{'tau s':>6} {'trained s':>9} {'M seen s':>8} "
          f"{'measured':>8} {'at asked':>8} {'at seen':>7} {'diff pts':>8}")
    diffs = []
    for r in (r for r in runs if r.get("failure")):
        f, back = r["failure"], r["failure"].get("recovery") or {}
        step = f.get("step_s") or _step(r)  # over all its attempts
        tau, rr = a.every * step, f.get("restart_s") or back.get("ready_s")
        cc = f.get("save_s") or c  # its checkpoints over all its attempts
        measured = (f["trained_steps"] * step / f["trained_s"]
                    if f.get("trained_s") else math.nan)
        kills = len(f.get("kills") or [])
        # the rate the run saw: its kills' clock over its kills (the kills are random)
        seen = f["up_s"] / kills if f.get("up_s") and kills else math.nan
        asked = goodput.goodput(tau, cc, rr, float(a.period)) if rr else math.nan
        model = goodput.goodput(tau, cc, rr, seen) if rr and seen > 0 else math.nan
        diffs.append(100 * (measured - model))
        print(f"{r['params']['repeat']:>6} {r['status']:>7} {kills:>5} "
              f"{cc:>6.3f} {rr or math.nan:>6.2f} {back.get('ready_s') or math.nan:>6.2f} "
              f"{tau:>6.2f} {f.get('trained_s') or math.nan:>9.1f} {seen:>8.1f} "
              f"{100 * measured:>7.1f}% {100 * asked:>7.1f}% {100 * model:>6.1f}% "
              f"{diffs[-1]:>+8.1f}")
        if r["status"] != "ok":
            print(f"    {r['error'][:300]}")
    if diffs:
        print(f"mean difference (measured - model at the rate seen) "
              f"{sum(diffs) / len(diffs):+.1f} points over {len(diffs)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
