"""Fault-injection and bad-input figures for the README, from a real run of the tests.

Runs the fault suite (tests/faults), the bad-input table (tests/test_bad_inputs.py) and the
security review (tests/test_security.py) with a ledger that each injected fault and each
refused bad input writes a line to, then prints: faults injected, faults survived, results
lost, bad inputs tried, and the time it took. Needs root for the faults (local clusters).

Usage: .venv/bin/python bench/perf/faults_summary.py [--ledger FILE] [-- PYTEST ARGS]
       .venv/bin/python bench/perf/faults_summary.py --only-summarise --ledger FILE
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITES = ["tests/faults", "tests/test_bad_inputs.py", "tests/test_security.py"]


def summarise(ledger: Path) -> dict:
    entries = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()] \
        if ledger.exists() else []
    faults = [e for e in entries if e["kind"] == "fault"]
    bad = [e for e in entries if e["kind"] == "bad_input"]
    generated = [e for e in entries if e["kind"] == "bad_input_generated"]
    return {
        "faults_injected": len(faults),
        "faults_survived": sum(1 for e in faults if e.get("survived")),
        "results_lost": sum(int(e.get("lost") or 0) for e in faults),
        "bad_inputs_tried": len(bad),
        "bad_inputs_generated": len(generated),
        "faults": [(e["name"].split("::")[-1], e.get("survived"), e.get("lost")) for e in faults],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledger", help="ledger file (default: a temporary one)")
    ap.add_argument("--only-summarise", action="store_true", help="read the ledger, run nothing")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args()
    ledger = Path(args.ledger or tempfile.mkstemp(prefix="faults-", suffix=".jsonl")[1])
    rc, wall = 0, 0.0
    if not args.only_summarise:
        ledger.write_text("")
        t0 = time.monotonic()
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             *SUITES, *args.pytest_args], cwd=ROOT,
                            env={**os.environ, "SCALELAB_FAULT_LEDGER": str(ledger)}).returncode
        wall = time.monotonic() - t0
    s = summarise(ledger)
    print()
    for name, survived, lost in s["faults"]:
        print(f"  {'survived' if survived else 'FAILED  '}  lost={lost}  {name}")
    print()
    print("| what | figure | command |")
    print("|---|---|---|")
    cmd = "`.venv/bin/python bench/perf/faults_summary.py`"
    print(f"| faults injected / survived (local target) | {s['faults_injected']} / "
          f"{s['faults_survived']} | {cmd} |")
    print(f"| results lost to those faults | {s['results_lost']} | same |")
    print(f"| bad inputs tried (each: one line, non-zero exit, nothing written) | "
          f"{s['bad_inputs_tried']} + {s['bad_inputs_generated']} generated sweep files | same |")
    if wall:
        print(f"| time for the three suites (pytest exit {rc}) | {wall:.0f} s | same |")
    print(f"\nledger: {ledger}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
