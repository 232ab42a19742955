"""How long `invoke report` takes on a big sweep: 10,000 synthetic training runs.

Generates the sweep in a temporary reports root (not timed), then times each stage of a report
build and the whole build_report call. Target: the whole build in 10 s or less.

    .venv/bin/python bench/perf/report_perf.py [--runs 10000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scalelab import report  # noqa: E402
from scalelab.model import analysis, bucket_model, verdict
from scalelab.results import frames, store, synthetic

TARGET_S = 10.0


def axes_for(runs: int) -> dict:
    """Sweep axes giving about `runs` training runs: 16 node counts x 2 procs per node
    x 4 batch sizes x 4 links = 512 configurations, repeats to make up the count."""
    configs = 16 * 2 * 4 * 4
    return {"nodes": tuple(range(1, 17)), "procs_per_node": (1, 2),
            "batch_sizes": (16, 32, 64, 128), "bandwidths": (100.0, 1000.0, 10000.0, None),
            "repeats": max(1, round(runs / configs))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000, help="training runs to generate")
    parser.add_argument("--keep", type=Path, help="write the sweep and report here and keep them")
    args = parser.parse_args()

    root = args.keep or Path(tempfile.mkdtemp(prefix="scalelab-report-perf-"))
    try:
        axes = axes_for(args.runs)
        t0 = time.perf_counter()
        sweep_dir = synthetic.synthetic_sweep(root, "perf", failed=["bench: injected failure"] * 5,
                                            host_cpus=64, cpus_per_node=4, **axes)
        gen_s = time.perf_counter() - t0
        size_mb = (sweep_dir / store.RUNS_FILE).stat().st_size / 1e6

        # the whole build first, in a fresh state, as `invoke report` runs it
        t, c = time.perf_counter(), time.process_time()
        page = report.build_report(sweep_dir)
        total, total_cpu = time.perf_counter() - t, time.process_time() - c

        stages = {}
        t = time.perf_counter()
        records = frames.load_runs(sweep_dir)
        stages["load runs.jsonl"] = time.perf_counter() - t
        t = time.perf_counter()
        frame = frames.to_frame(records)
        stages["to_frame (ranks summed, efficiency)"] = time.perf_counter() - t
        n_records = len(records)
        del records
        t = time.perf_counter()
        modelled = bucket_model.add_prediction(analysis.add_model(analysis.summarize(frame)))
        stages["summarize + model"] = time.perf_counter() - t
        t = time.perf_counter()
        _judged, _error, bottlenecks = verdict.judge(modelled)
        stages["verdicts"] = time.perf_counter() - t
        data = report.load_sweep_data(sweep_dir)
        a = report.analyse([data], None, False)
        t = time.perf_counter()
        figs = report.draw_figures(a, report.layout(a.modelled, False))
        stages[f"{len(figs)} figures (matplotlib, PNG)"] = time.perf_counter() - t

        print(f"sweep: {len(frame)} training runs, {n_records - len(frame)} allreduce probes, "
              f"{int(frame['n_ranks'].sum())} rank records, runs.jsonl {size_mb:.1f} MB "
              f"(generated in {gen_s:.1f} s, not timed)")
        print(f"series: {len(bottlenecks)}, (series, world size) points: {len(modelled)}")
        print("stages, timed separately after the build:")
        for name, secs in stages.items():
            print(f"  {name:<40} {secs:6.2f} s")
        print(f"build_report total (load, CSV, analysis, figures, HTML): {total:.2f} s wall, "
              f"{total_cpu:.2f} s CPU (target {TARGET_S:.0f} s) -> "
              f"{'OK' if total <= TARGET_S else 'SLOW'}")
        print(f"index.html: {page.stat().st_size / 1e6:.1f} MB; results.csv: "
              f"{(sweep_dir / frames.CSV_FILE).stat().st_size / 1e6:.1f} MB")
        if args.keep:
            print(f"kept: {page}")
        return 0 if total <= TARGET_S else 1
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
