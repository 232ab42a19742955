"""The Python inside the GPU benchmark scripts runs here too, on what the workload prints.

bench/perf/gpu_resnet50.sh and gpu_session.sh reach their Python only on a GPU machine, whose
minutes are few: a quoting slip or a renamed result key there costs a lent GPU's run. Here that
Python is lifted out of the scripts as they are and run on a real CPU result of the workload.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from conftest import ROOT

PERF = ROOT / "bench" / "perf"


def _parser() -> str:
    """The Python gpu_resnet50.sh pipes the workload's output into, as bash passes it."""
    text = (PERF / "gpu_resnet50.sh").read_text()
    quoted = text.split("| \"$PY\" -c '", 1)[1].rsplit("'", 1)[0]
    # what bash hands Python: a single-quoted word ends at the next quote
    return subprocess.run(["bash", "-c", f"printf %s '{quoted}'"], capture_output=True,
                          text=True, check=True, timeout=10).stdout


def _cpu_result() -> str:
    proc = subprocess.run([sys.executable, "bench/workloads/resnet.py", "--model", "resnet20",
                           "--batch-size", "4", "--warmup", "1", "--steps", "2", "--device",
                           "cpu", "--channels-last"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_gpu_resnet50_prints_its_figure_line_from_a_real_result():
    code = _parser()
    assert code.count("'") == 0  # a quote inside would end bash's word early
    out = _cpu_result()
    proc = subprocess.run([sys.executable, "-c", code], input=out, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    result = json.loads(out.split("SCALELAB_RESULT ", 1)[1].splitlines()[0])
    # the real result's own figures, as the docs quote them (resnet50 is the script's label)
    assert re.fullmatch(r"resnet50 fp32 \(tf32 None\) channels_last batch 4: \d+ img/s, step "
                        r"[\d.]+ ms \(p95 [\d.]+\), cpu \S.*, peak GPU memory None MiB, "
                        r"backend \S+", line), line
    assert f"{result['images_per_sec']:.0f} img/s" in line
    assert line.endswith(f"backend {result['backend']}")


def test_gpu_resnet50_without_a_result_says_so():
    proc = subprocess.run([sys.executable, "-c", _parser()], input="no result here\n",
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "gpu_resnet50.sh: resnet.py printed no SCALELAB_RESULT line"


def test_gpu_session_facts_step_reads_this_machine(tmp_path):
    """The facts step's heredoc, run here: the probe configure runs, parsed into the keys the
    session prints (no GPU here: none are listed)."""
    text = (PERF / "gpu_session.sh").read_text()
    code = text.split("\"$PY\" - \"$PY\" > \"$OUT/facts.json\" <<'EOF' || fail \"facts\"\n",
                      1)[1].split("\nEOF\n", 1)[0]
    proc = subprocess.run([sys.executable, "-", sys.executable], input=code, cwd=ROOT,
                          capture_output=True, text=True, timeout=180,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin:/usr/sbin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    facts = json.loads(proc.stdout)
    assert facts["gpus"] == 0 and facts["gpu_list"] == []
    assert facts["cores"] >= 1 and facts["torch"].startswith("2.13.0")


def test_gpu_session_stamps_a_profile_with_the_gpu_it_was_recorded_on(tmp_path):
    """The profile step's stamping heredoc, run here on a profile file: the GPU's name and
    NCCL come from torch.cuda, which has no device here, so those two calls (and nvidia-smi)
    are stand-ins; the rest (json, the provenance text, the file) is the script's own."""
    text = (PERF / "gpu_session.sh").read_text()
    code = text.split("\"$PY\" - \"$prof\" <<'EOF' || fail \"stamping $prof\"\n",
                      1)[1].split("\nEOF\n", 1)[0]
    stand_in = ("import torch\n"
                "torch.cuda.get_device_name = lambda *a: 'NVIDIA H200'\n"
                "torch.cuda.is_available = lambda: True\n"
                "torch.cuda.nccl.version = lambda: (2, 21, 5)\n")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 550.54.15\n")
    smi.chmod(0o755)
    prof = tmp_path / "h200-resnet50-amp.json"
    prof.write_text(json.dumps({"device": "h200", "provenance": "measured by invoke profile"}))
    proc = subprocess.run([sys.executable, "-", str(prof)], input=stand_in + code,
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": f"{smi.parent}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(prof.read_text())
    assert prof.read_text().endswith("}\n")
    assert re.fullmatch(r"measured by invoke profile; recorded with bench/perf/gpu_session.sh "
                        r"on one NVIDIA H200 \(driver 550\.54\.15, CUDA \S+, cuDNN \d+\.\d+, "
                        r"NCCL 2\.21\.5\)", doc["provenance"]), doc["provenance"]
