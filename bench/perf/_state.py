"""Shared by the benchmark scripts that bring up emulated machines: root, and state of their own.

Each run gets fresh, private SCALELAB_HOME / SCALELAB_INVENTORIES / SCALELAB_REPORTS under a
temporary directory, so a benchmark never touches the user's clusters or reports.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def private_state() -> Path:
    """Exit with one line unless root; point scalelab's state at a new temporary directory."""
    if os.geteuid() != 0:
        sys.exit("error: needs root (it brings up emulated machines); run it as root")
    tmp = Path(tempfile.mkdtemp(prefix="scalelab-perf-"))
    os.environ["SCALELAB_HOME"] = str(tmp / "home")
    os.environ["SCALELAB_INVENTORIES"] = str(tmp / "inventories")
    os.environ["SCALELAB_REPORTS"] = str(tmp / "reports")
    return tmp
