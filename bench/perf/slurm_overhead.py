"""What running each benchmark run as a Slurm job costs, against starting its ranks over SSH.

Provisions a local cluster, sets Slurm up on it with the slurm role (`invoke configure --tags
slurm`, timed, then again to show it converges), and runs the same sweep (default: the ci sweep
over 1-3 nodes, unshaped) with `--launcher slurm` and with the SSH launcher, alternating, so
both see the same machine. Prints, per launcher and node count, the median time a training run
took beyond its warm-up and timed steps (launch, rendezvous, set-up, reap; for Slurm the
allocation and the step launch), the allreduce probes' median duration, how long the driver
waited after each job for sacct to list it as over, and each sweep's wall time.
Needs root and Slurm installed (./bootstrap.sh).

Usage: .venv/bin/python bench/perf/slurm_overhead.py [--rounds 2] [--nodes 3] [--sweep ci]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from _state import private_state  # noqa: E402


def _invoke(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"invoke {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return wall, proc


def _sweep_dir(stdout: str) -> Path:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("results: "))
    return Path(line.split(": ", 1)[1]).parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="sweeps per launcher, alternating")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--sweep", default="ci")
    a = ap.parse_args()
    private_state()
    if not Path("/usr/sbin/slurmctld").exists():
        sys.exit("error: Slurm is not installed; run ./bootstrap.sh first")
    from scalelab.cluster.targets.local import LocalCluster

    lc = LocalCluster("perfslurm")
    lc.provision(a.nodes)
    try:
        first, _ = _invoke("configure", "--cluster", lc.name, "--tags", "slurm")
        again, proc = _invoke("configure", "--cluster", lc.name, "--tags", "slurm")
        changes = proc.stdout.split(" changes")[0].rsplit(" ", 1)[-1]
        print(f"slurm role on {a.nodes} local nodes: first {first:.0f} s, again {again:.0f} s "
              f"({changes} changes)")
        walls: dict[str, list[float]] = {"ssh": [], "slurm": []}
        beyond: dict[tuple[str, int], list[float]] = {}
        probes: dict[str, list[float]] = {"ssh": [], "slurm": []}
        sacct: list[float] = []
        for _ in range(a.rounds):
            for launcher in ("slurm", "ssh"):
                wall, proc = _invoke("bench", "--cluster", lc.name, "--sweep", a.sweep,
                                     "--nodes", f"1-{a.nodes}", "--bandwidth", "native",
                                     "--no-report", "--launcher", launcher)
                walls[launcher].append(wall)
                for line in (_sweep_dir(proc.stdout) / "runs.jsonl").read_text().splitlines():
                    r = json.loads(line)
                    if r["status"] != "ok":
                        continue
                    if r.get("slurm"):
                        sacct.append(r["slurm"]["sacct_wait_s"])
                    if r["kind"] == "allreduce":
                        probes[launcher].append(r["duration_s"])
                    elif r.get("timeline"):
                        steps = r["timeline"]["warmup_s"] + r["timeline"]["timed_s"]
                        beyond.setdefault((launcher, r["params"]["nodes"]), []).append(
                            r["duration_s"] - steps)
    finally:
        lc.destroy()
    print(f"\nsweep {a.sweep}, nodes 1-{a.nodes}, unshaped, {a.rounds} sweeps per launcher "
          "(medians, s)")
    print(f"{'':32}{'ssh':>8}{'slurm':>8}{'extra':>8}")
    for n in range(1, a.nodes + 1):
        s, m = (statistics.median(beyond.get((lname, n), [float("nan")]))
                for lname in ("ssh", "slurm"))
        print(f"  training run beyond its steps, {n} node{'s' if n > 1 else ' '}"
              f"{s:6.2f}{m:8.2f}{m - s:+8.2f}")
    s, m = (statistics.median(probes[lname] or [float("nan")]) for lname in ("ssh", "slurm"))
    print(f"  allreduce probe, whole run      {s:6.2f}{m:8.2f}{m - s:+8.2f}")
    print(f"  waiting for sacct to list a job as over, after srun returned: median "
          f"{statistics.median(sacct):.2f} s, range {min(sacct):.2f}-{max(sacct):.2f} s "
          "(not in the runs' own durations)")
    s, m = (statistics.median(walls[lname]) for lname in ("ssh", "slurm"))
    print(f"  whole sweep (wall)              {s:6.1f}{m:8.1f}{m - s:+8.1f}")
    print(f"host: {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
