"""Real-host path: configure time from the offline bundle, and per-run overhead static vs local.

Brings up 2 machines with the local target and hands them over as a `static` cluster, the way
tests/test_real_hosts.py and the README's testbed walk-through do. Then, through `invoke` as a
user types it:
  1. times `invoke configure --tags common,pytorch,horovod,workloads --bundle DIR` on the two
     hosts: the first run (installs for real from the bundle) and a second (converged);
  2. runs the same sweep (bench/sweeps/ci.yml, unshaped) on the static cluster and on the local
     one, alternating, and prints every run's wall time beside the time its rank 0 spent in
     timed steps: the difference is the per-run overhead (launch, rendezvous, warm-up, reap).
Needs root and sshd. Runs `invoke bundle --out DIR` first (idempotent; its time printed apart).

Usage: .venv/bin/python bench/perf/real_hosts_perf.py [--bundle test-artifacts/bundle] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from _state import private_state  # noqa: E402

from scalelab.cluster.targets.local import LocalCluster  # noqa: E402

TAGS = "common,pytorch,horovod,workloads"


def invoke(*args: str, timeout: float = 1800) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"invoke {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return took, proc


def hand_over(hosts: LocalCluster, name: str, tmp: Path) -> None:
    """The machines as someone else's testbed: a var-file, a trusted key, pinned host keys."""
    machines = hosts.nodes()
    key = tmp / "testbed_key"
    shutil.copy(hosts.key, key)
    shutil.copy(f"{hosts.key}.pub", f"{key}.pub")
    os.chmod(key, 0o600)
    var_file = tmp / "lab.tfvars.json"
    var_file.write_text(json.dumps({
        "hosts": [{"name": m.name, "address": m.address, **({"role": "head"} if i == 0 else {})}
                  for i, m in enumerate(machines)],
        "ssh_user": "root", "ssh_private_key_file": str(key)}))
    invoke("provision", "--target", "static", "--cluster", name, "--nodes", str(len(machines)),
           "--var-file", str(var_file), timeout=300)
    known = Path(os.environ["SCALELAB_HOME"]) / "clusters" / name / "known_hosts"
    for m in machines:
        scan = subprocess.run(["ssh-keyscan", "-t", "ed25519", m.address], capture_output=True,
                              text=True, timeout=20, check=True).stdout
        with open(known, "a") as fh:
            fh.write(scan)


def sweep(cluster: str) -> tuple[float, list[dict]]:
    took, _ = invoke("bench", "--cluster", cluster, "--sweep", "ci", "--bandwidth", "native",
                     "--no-report", timeout=1200)
    reports = Path(os.environ["SCALELAB_REPORTS"])
    runs_file = reports / os.readlink(reports / "latest") / "runs.jsonl"
    return took, [json.loads(x) for x in runs_file.read_text().splitlines()]


def overheads(runs: list[dict]) -> dict[str, list[float]]:
    """Per kind of run: wall time minus rank 0's timed steps (seconds), ok runs only."""
    out: dict[str, list[float]] = {}
    for r in runs:
        if r["status"] != "ok":
            continue
        timed = sum(r["ranks"][0].get("step_times_s") or []) if r["kind"] == "train" else 0.0
        key = f"{r['kind']} {len(r['node_names'])}n"
        out.setdefault(key, []).append(r["duration_s"] - timed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=str(ROOT / "test-artifacts" / "bundle"))
    ap.add_argument("--rounds", type=int, default=2, help="sweeps on each cluster, alternating")
    a = ap.parse_args()
    tmp = private_state()
    # idempotent: brings an older bundle up to the roles' package lists, downloads nothing new
    took, _ = invoke("bundle", "--out", a.bundle, timeout=3000)
    print(f"invoke bundle: {took:.0f} s (on the controller, once; not part of configure)")
    hosts = LocalCluster("perfhost")
    hosts.provision(2)
    lab = "perflab"
    try:
        hand_over(hosts, lab, tmp)
        first, _ = invoke("configure", "--cluster", lab, "--tags", TAGS, "--bundle", a.bundle)
        again, _ = invoke("configure", "--cluster", lab, "--tags", TAGS, "--bundle", a.bundle)
        print(f"configure, 2 hosts, tags {TAGS}, from the bundle: first {first:.0f} s, "
              f"second (converged, 0 changes) {again:.0f} s")
        walls: dict[str, list[float]] = {"local": [], "static": []}
        per: dict[str, dict[str, list[float]]] = {"local": {}, "static": {}}
        phases: dict[str, dict[str, list[float]]] = {"local": {}, "static": {}}
        for _ in range(a.rounds):
            for target, cluster in (("local", hosts.name), ("static", lab)):
                took, runs = sweep(cluster)
                walls[target].append(took)
                for k, v in overheads(runs).items():
                    per[target].setdefault(k, []).extend(v)
                for r in runs:  # where the time went (scalelab.run.driver.timeline)
                    for ph, v in (r.get("timeline") or {}).items():
                        phases[target].setdefault(ph, []).append(v)
        print(f"\nsame sweep (bench/sweeps/ci.yml, unshaped), {a.rounds} rounds each, medians:")
        print(f"{'run':<16} {'local overhead_s':>17} {'static overhead_s':>18} {'runs':>5}")
        for k in sorted(per["local"]):
            lo, st = per["local"][k], per["static"].get(k, [])
            if st:
                print(f"{k:<16} {statistics.median(lo):>17.2f} {statistics.median(st):>18.2f} "
                      f"{len(lo):>2}+{len(st)}")
        print(f"{'whole sweep':<16} {statistics.median(walls['local']):>17.1f} "
              f"{statistics.median(walls['static']):>18.1f}  (wall s, `invoke bench` start to end)")
        print("overhead = a run's wall time minus its rank 0's timed steps (warm-up included)")
        for target in ("local", "static"):
            split = {ph: statistics.median(v) for ph, v in phases[target].items() if v}
            if split:
                print(f"{target} training runs, median s: " + ", ".join(
                    f"{ph.removesuffix('_s')} {v:.2f}" for ph, v in split.items()))
    finally:
        if (Path(os.environ["SCALELAB_HOME"]) / "clusters" / lab / "cluster.json").exists():
            subprocess.run([sys.executable, "-m", "invoke", "destroy", "--cluster", lab],
                           cwd=ROOT, capture_output=True, timeout=300)
        hosts.destroy()


if __name__ == "__main__":
    main()
