"""Node-side code the controller runs too, declared in one place.

What runs on the nodes lives in bench/workloads/ and imports nothing of scalelab (the package
is not installed there). Where the controller must apply the same rule as the nodes (an
accelerator profile's format and checker), it loads that file rather than keep a second copy:
SHARED names each such file, and load() is the only way scalelab reads one.
tests/test_import_graph.py holds that a shared file imports only the standard library and that
no other module of scalelab loads code by path.
"""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

from scalelab.core.state import PROJECT_ROOT

WORKLOADS_DIR = PROJECT_ROOT / "bench" / "workloads"
# module name -> why the controller runs it
SHARED = {
    "emulate": "an accelerator profile's format, checker and step totals: the nodes emulate "
               "with it, the controller checks and models profiles with it",
}


@functools.cache
def load(name: str) -> ModuleType:
    """A shared node-side module (SHARED), loaded once from bench/workloads/."""
    if name not in SHARED:
        raise KeyError(f"{name} is not a node-side module the controller shares (SHARED)")
    spec = importlib.util.spec_from_file_location(f"scalelab_nodeside_{name}",
                                                  WORKLOADS_DIR / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
