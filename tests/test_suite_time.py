"""bench/perf/suite_time.py: where the suite's time goes, read from the JUnit file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "perf" / "suite_time.py"


def _junit(path: Path, n: int) -> Path:
    cases = "".join(f'<testcase classname="tests.test_bench" name="test_{i}" time="{i}.0"/>'
                    for i in range(n))
    cases += '<testcase classname="tests.test_tasks" name="test_x" time="0.5"/>'
    path.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return path


def test_it_sums_per_file_and_lists_the_slowest(tmp_path):
    junit = _junit(tmp_path / "junit.xml", 4)  # 0 + 1 + 2 + 3 s, and 0.5 s in another file
    out = subprocess.run([sys.executable, str(SCRIPT), str(junit), "--top", "2"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "5 tests, 6 s (0.1 min); the 2 slowest: 5 s (77 %)"
    assert "      6.0  tests/test_bench.py" in lines
    assert not any("test_tasks.py" in ln for ln in lines)  # under a second: not listed per file
    assert lines[-2:] == ["      3.0  tests/test_bench.py::test_3", "      2.0  tests/test_bench.py::test_2"]


def test_piped_into_head_it_ends_quietly(tmp_path):
    """`suite_time.py | head` as the README's readers type it: no BrokenPipeError traceback."""
    junit = _junit(tmp_path / "junit.xml", 5000)  # more output than a pipe holds
    proc = subprocess.run(f"{sys.executable} {SCRIPT} {junit} --top 5000 | head -3",
                          shell=True, capture_output=True, text=True, timeout=60)
    assert proc.stdout.startswith("5001 tests, ")
    assert proc.stderr == ""


def test_no_junit_file_is_one_line_and_a_failure(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "absent.xml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: no JUnit file at {tmp_path / 'absent.xml'}; run invoke test (or bash .ci/run) first"]
