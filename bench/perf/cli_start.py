"""How long `invoke` takes to start and to refuse bad input, and what it loads on the way.

Times --runs starts (the median, and the fastest) of each of: `invoke --list`, `invoke bench
--help`, and a refused sweep (`invoke bench --cluster nosuch --nodes 0`: one line, exit 1),
each a fresh interpreter as a user's shell starts it; then lists which of pandas, numpy and
torch the refusal loaded (none: they come in where a frame or an estimate is made).
No cluster, no root.

Usage: .venv/bin/python bench/perf/cli_start.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CASES = {"invoke --list": ["--list"], "invoke bench --help": ["bench", "--help"],
         "a refused sweep": ["bench", "--cluster", "nosuch", "--nodes", "0"]}
PROBE = ("import runpy, sys\n"
         "sys.argv = ['invoke', *sys.argv[1:]]\n"
         "try:\n"
         "    runpy.run_module('invoke', run_name='__main__')\n"
         "except SystemExit:\n"
         "    pass\n"
         "print('LOADED', sorted({m.split('.')[0] for m in sys.modules}"
         " & {'pandas', 'numpy', 'torch'}))\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    if not 1 <= a.runs <= 200:
        ap.error("--runs 1-200")
    for label, args in CASES.items():
        times = []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT,
                           capture_output=True, timeout=120)
            times.append(time.perf_counter() - t0)
        print(f"{label:>20}: median {statistics.median(times):.3f} s, fastest "
              f"{min(times):.3f} s over {a.runs} starts")
    out = subprocess.run([sys.executable, "-c", PROBE, *CASES["a refused sweep"]], cwd=ROOT,
                         capture_output=True, text=True, timeout=120).stdout
    print("the refusal loaded: " + next((ln[7:] for ln in out.splitlines()
                                         if ln.startswith("LOADED")), "?"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
