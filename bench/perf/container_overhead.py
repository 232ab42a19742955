"""What running ranks in containers costs against running them on the host.

Provisions a local cluster, builds (or takes from the cache) the training image and loads it
with `invoke configure --image`, then runs the same 2-node training run through `invoke bench`
as a user would, alternating runtimes run by run (host, host without the warm start, container;
the next round in the reverse order), and prints per runtime the medians of
  * images/s (the run's total), aim: the container within 1 % of the host;
  * start-up, from the launch to the first step (launch, import, rendezvous, setup) and the
    end (finish and reap), aim: the container at most 1 s above host ranks started the same
    way (directly, each rank importing torch: "host, cold"); "host, warm" is what the local
    target's host runs get from its warm-start servers, which containers cannot use.
Needs root, docker.io and mmdebstrap (./bootstrap.sh installs both).

Usage: .venv/bin/python bench/perf/container_overhead.py [--rounds 3] [--steps 20]
       [--model resnet50] [--image-size 64] [--batch-size 16] [--bandwidth 1gbit]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from _state import private_state  # noqa: E402

VARIANTS = {"host, warm": [], "host, cold": ["--no-warm-start"],
            "container": ["--runtime", "container"]}
START = ("launch_s", "import_s", "rendezvous_s", "setup_s")
END = ("finish_s", "reap_s")


def _invoke(*args: str, timeout: float = 3600) -> str:
    proc = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"invoke {args[0]} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def _one_run(cluster: str, a: argparse.Namespace, extra: list[str]) -> dict[str, float]:
    out = _invoke("bench", "--cluster", cluster, "--no-report", "--nodes", "2", "--repeats", "1",
                  "--model", a.model, "--batch-size", str(a.batch_size), "--steps", str(a.steps),
                  "--bandwidth", a.bandwidth, "--sweep", str(a.sweep_file), *extra)
    results = Path(out.strip().splitlines()[-1].split("results: ", 1)[1])
    with open(results) as fh:
        row = next(r for r in csv.DictReader(fh) if r["run_id"].startswith("train-"))
    if row["status"] != "ok":
        sys.exit(f"a run failed: {row['error']}")
    sweep_dir = results.parent
    import json

    rec = next(json.loads(line) for line in (sweep_dir / "runs.jsonl").read_text().splitlines()
               if line.strip() and json.loads(line)["kind"] == "train")
    tl = rec.get("timeline") or {}
    return {"ips": float(row["images_per_sec"]), "start": sum(tl.get(k, 0.0) for k in START),
            "end": sum(tl.get(k, 0.0) for k in END), "launcher": row["launcher"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--bandwidth", default="1gbit")
    a = ap.parse_args()
    tmp = private_state()
    a.sweep_file = tmp / "sweep.yml"
    a.sweep_file.write_text(f"image_size: {a.image_size}\nwarmup: 3\nallreduce_probe: false\n"
                            "netprobe: false\ntimeout_s: 1200\n")
    from scalelab.cluster.targets.local import LocalCluster

    archive = _invoke("image").strip().splitlines()[-1].split()[1]
    lc = LocalCluster("ctrperf")
    lc.provision(2)
    try:
        _invoke("configure", "--cluster", lc.name, "--tags", "docker_nvidia", "--image", archive)
        got: dict[str, list[dict[str, float]]] = {k: [] for k in VARIANTS}
        for r in range(a.rounds):
            order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                got[name].append(_one_run(lc.name, a, VARIANTS[name]))
                print(f"round {r + 1}: {name:<11} {got[name][-1]['ips']:8.1f} images/s, "
                      f"start-up {got[name][-1]['start']:.2f} s, end {got[name][-1]['end']:.2f} s",
                      flush=True)
    finally:
        lc.destroy()
    med = {k: {f: statistics.median(x[f] for x in v) for f in ("ips", "start", "end")}
           for k, v in got.items()}
    print(f"\n{a.model} at {a.image_size} px, batch {a.batch_size}, {a.steps} timed steps, "
          f"2 nodes x 1 rank (1 core each), {a.bandwidth}; medians of {a.rounds} runs each "
          f"(cpu count {os.cpu_count()})")
    for k, m in med.items():
        print(f"  {k:<11} {m['ips']:8.1f} images/s   start-up {m['start']:.2f} s   "
              f"end {m['end']:.2f} s")
    c, h, w = med["container"], med["host, cold"], med["host, warm"]
    print(f"container vs host: images/s {100 * (c['ips'] / h['ips'] - 1):+.1f} % vs cold, "
          f"{100 * (c['ips'] / w['ips'] - 1):+.1f} % vs warm (aim within 1 %); start-up "
          f"{c['start'] - h['start']:+.2f} s vs cold (aim at most +1 s), "
          f"{c['start'] - w['start']:+.2f} s vs warm; end {c['end'] - h['end']:+.2f} s vs cold")


if __name__ == "__main__":
    main()
