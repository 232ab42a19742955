"""Where the test suite's time goes, from the JUnit file `invoke test` writes.

`invoke test` (and so `bash .ci/run`) leaves test-artifacts/junit.xml: every test with its
time, set-up and tear-down included. This prints the whole, the share of the slowest tests,
the time per test file and the slowest tests, so that a change to the suite's time can be
put down to the tests that made it.

Usage: .venv/bin/python bench/perf/suite_time.py [JUNIT] [--top N]
       (JUNIT defaults to test-artifacts/junit.xml; on a fresh clone: /tmp/ci/test-artifacts/...)
"""

from __future__ import annotations

import argparse
import signal
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cases(path: Path) -> list[tuple[str, str, float]]:
    """(file, test, seconds) per test case of a JUnit file as pytest writes it."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        cls = case.get("classname", "")
        # pytest: classname is the dotted module path (plus a class), name the test
        module = cls.replace(".", "/")
        file = next((m + ".py" for m in (module, module.rsplit("/", 1)[0])
                     if (ROOT / f"{m}.py").exists()), module)
        out.append((file, case.get("name", ""), float(case.get("time", 0.0))))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("junit", nargs="?", default=str(ROOT / "test-artifacts" / "junit.xml"))
    p.add_argument("--top", type=int, default=25, help="slowest tests to list (default 25)")
    a = p.parse_args(argv)
    path = Path(a.junit)
    if not path.is_file():
        print(f"error: no JUnit file at {path}; run invoke test (or bash .ci/run) first",
              file=sys.stderr)
        return 1
    rows = cases(path)
    total = sum(t for _, _, t in rows)
    slow = sorted(rows, key=lambda r: -r[2])
    top = slow[:a.top]
    print(f"{len(rows)} tests, {total:.0f} s ({total / 60:.1f} min); the {len(top)} slowest: "
          f"{sum(t for _, _, t in top):.0f} s ({100 * sum(t for _, _, t in top) / total:.0f} %)")
    per_file: dict[str, float] = defaultdict(float)
    for file, _, t in rows:
        per_file[file] += t
    print("\nper file (s):")
    for file, t in sorted(per_file.items(), key=lambda x: -x[1]):
        if t >= 1.0:
            print(f"  {t:7.1f}  {file}")
    print("\nslowest tests (s):")
    for file, name, t in top:
        print(f"  {t:7.1f}  {file}::{name}")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `... | head` ends it quietly, as for ls
    sys.exit(main())
