"""No room too large: no module of scalelab, tasks.py or the workloads the nodes run
(bench/workloads/) over 600 lines, no function over 80 lines of code (its docstring aside). A
module that grows past it is split where its parts stand apart (docs/ARCHITECTURE.md lists
them; a new workload module reaches the nodes with the rest of bench/workloads/)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

MODULE_LINES = 600
FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return [*sorted((ROOT / "scalelab").rglob("*.py")), ROOT / "tasks.py",
            *sorted((ROOT / "bench" / "workloads").glob("*.py"))]


def function_sizes(source: str) -> dict[str, int]:
    """Each function's length in lines, its docstring not counted."""
    sizes = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines -= first.end_lineno - first.lineno + 1
            sizes[f"{node.name}:{node.lineno}"] = lines
    return sizes


def test_no_module_is_over_600_lines():
    big = {str(p.relative_to(ROOT)): n for p in _sources()
           if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert big == {}, f"split these (lines): {big}"


def test_no_function_is_over_80_lines():
    long = {f"{p.relative_to(ROOT)}:{name}": n for p in _sources()
            for name, n in function_sizes(p.read_text()).items() if n > FUNCTION_LINES}
    assert long == {}, f"split these (lines, docstrings aside): {long}"


def test_the_function_check_counts_code_not_its_docstring():
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    doc = '    """' + "\n" * 30 + '    """\n'
    sizes = function_sizes(f"def f():\n{doc}{body}\n\ndef g():\n{doc}    return 1\n")
    assert sizes == {"f:1": 82, "g:115": 2}  # f: its def line and 81 lines of code
