"""Prints the resident memory of one warm-start server (bench/workloads/warm.py serve), the
figure the memory check counts per node where ranks are forked from such servers
(scalelab.sweep.memory.WARM_SERVER_BYTES).

    .venv/bin/python bench/perf/warm_server_memory.py

The server is this script's own child, started on an abstract socket of its own and ended by
its pid once measured.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scalelab.sweep.memory import WARM_SERVER_BYTES  # noqa: E402


def main() -> None:
    name = f"scalelab-perf-{secrets.token_hex(4)}"
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench/workloads/warm.py"), "serve",
                             name, "60"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()  # "SCALELAB_WARM ready PID" once imported
        if line[:2] != ["SCALELAB_WARM", "ready"]:
            raise SystemExit(f"the server did not start: {line}")
        status = Path(f"/proc/{line[2]}/status").read_text().splitlines()
        kb = {k: int(v.split()[0]) for k, v in (s.split(":", 1) for s in status)
              if k in ("VmRSS", "RssAnon", "RssFile")}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"warm-start server (torch, DDP and the workloads imported), {os.cpu_count()} CPUs:")
    for k, v in kb.items():
        print(f"  {k:8} {v:>9,} kB = {v * 1024 / 1e6:6.0f} MB")
    print(f"the memory check counts {WARM_SERVER_BYTES / 1e6:.0f} MB per server "
          f"(scalelab.sweep.memory.WARM_SERVER_BYTES)")


if __name__ == "__main__":
    main()
