"""scalelab's imports point one way: no module reaches itself through its imports.

Imports inside functions count as much as those at the top of a module: a lazy import hides a
circle from Python's import machinery, not from the reader who follows the flow.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (top level or inside functions)."""
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    top = package.name
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] == top:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.split(".")[0] == top}
        # a package's __init__ runs before any of its modules: importing it is not a circle
        graph[name] = {m for m in found if m in modules and m != name
                       and not name.startswith(m + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_scalelab_has_no_import_circles():
    found = circles(import_graph(ROOT / "scalelab"))
    assert found == [], "modules that import each other, directly or around a circle:\n" + \
        "\n".join(" -> ".join(c) for c in found)


def imports_the_router(path: Path) -> bool:
    """Whether a module imports scalelab.cluster.targets itself (the router, the package's
    __init__) or a name of it, which import_graph does not count as an edge of the package's
    own modules; importing a sibling module (interface, tfmodule) is not that."""
    siblings = {p.stem for p in path.parent.glob("*.py")}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (
                node.module == "scalelab.cluster.targets"
                and any(a.name not in siblings for a in node.names)
                or node.module == "scalelab.cluster" and any(a.name == "targets"
                                                             for a in node.names)):
            return True
        if isinstance(node, ast.Import) and any(a.name == "scalelab.cluster.targets"
                                                for a in node.names):
            return True
    return False


def test_the_targets_import_only_the_interface_never_the_router(tmp_path):
    folder = ROOT / "scalelab" / "cluster" / "targets"
    targets = [p for p in folder.glob("*.py") if p.name not in ("__init__.py", "interface.py")]
    assert targets
    assert [p.name for p in targets if imports_the_router(p)] == []
    bad = tmp_path / "t.py"
    bad.write_text("def f():\n    from scalelab.cluster import targets\n")
    assert imports_the_router(bad)  # the check sees a lazy import of the router


def test_the_check_finds_a_circle_through_a_lazy_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.c import g\n")
    (pkg / "c.py").write_text("import pkg.a\ndef g():\n    pass\n")
    (pkg / "d.py").write_text("from pkg import a\n")
    assert circles(import_graph(pkg)) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_workloads_import_nothing_of_scalelab():
    """What runs on the nodes needs only torch (and Horovod): the controller's package is not
    installed there."""
    offenders = []
    for path in sorted((ROOT / "bench" / "workloads").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(n.split(".")[0] == "scalelab" for n in names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


# the stages from the ground up: a package imports only its own modules and those below it
LAYERS = ("core", "model", "cluster", "sweep", "results", "run", "report")


def layer_of(module: str) -> int:
    return LAYERS.index(module.split(".")[1])


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a package to one above it in LAYERS."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if m.count(".") > 1
                  for t in targets if t.count(".") > 0 and layer_of(t) > layer_of(m))


def test_every_module_lives_in_a_stage_package():
    graph = import_graph(ROOT / "scalelab")
    loose = [m for m in graph if m != "scalelab" and m.split(".")[1] not in LAYERS]
    assert loose == [], f"put these in one of {', '.join(LAYERS)} (docs/ARCHITECTURE.md):\n{loose}"


def test_imports_point_down_the_stages():
    found = upward_imports(import_graph(ROOT / "scalelab"))
    assert found == [], ("imports from a stage to one above it (order: " + " < ".join(LAYERS)
                         + "):\n" + "\n".join(found))


def test_the_stage_check_finds_an_upward_import(tmp_path):
    pkg = tmp_path / "scalelab"
    for part in ("", "core", "run"):
        (pkg / part).mkdir(exist_ok=True)
        (pkg / part / "__init__.py").write_text("")
    (pkg / "run" / "driver.py").write_text("from scalelab.core import units\n")
    (pkg / "core" / "units.py").write_text("def f():\n    from scalelab.run import driver\n")
    assert upward_imports(import_graph(pkg)) == ["scalelab.core.units -> scalelab.run.driver"]


def test_node_side_code_the_controller_runs_is_declared_and_plain():
    """scalelab.core.nodeside.SHARED is every file of bench/workloads/ the controller runs:
    each imports only the standard library, and no other module loads code by path."""
    import sys

    from scalelab.core import nodeside

    for name in nodeside.SHARED:
        path = ROOT / "bench" / "workloads" / f"{name}.py"
        tops = set()  # what loading it imports: its top-level imports (torch waits in functions)
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.Import):
                tops |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                tops.add((node.module or "").split(".")[0])
        assert tops <= set(sys.stdlib_module_names) | {"__future__"}, (name, tops)
        assert nodeside.load(name).__file__ == str(path)
    loaders = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scalelab").rglob("*.py")
                     if "spec_from_file_location" in p.read_text())
    assert loaders == ["scalelab/core/nodeside.py"]


def test_invoke_starts_and_refuses_without_pandas_numpy_or_torch():
    """`invoke bench --help` and a refused sweep load none of the heavy libraries: pandas and
    numpy come in where a frame or a plan's estimate is made, torch only on the nodes. A
    module-level import of one of them on the way makes every start and every refusal
    slower (bench/perf/cli_start.py prints the time)."""
    import subprocess
    import sys

    probe = ("import runpy, sys\n"
             "sys.argv = ['invoke', *sys.argv[1:]]\n"
             "try:\n"
             "    runpy.run_module('invoke', run_name='__main__')\n"
             "except SystemExit:\n"
             "    pass\n"
             "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'numpy', 'torch'})\n"
             "print('HEAVY', ','.join(heavy))\n")
    for args in (["bench", "--help"], ["bench", "--cluster", "nosuch", "--nodes", "0"]):
        proc = subprocess.run([sys.executable, "-c", probe, *args], cwd=ROOT, text=True,
                              capture_output=True, timeout=60)
        said = [ln for ln in proc.stdout.splitlines() if ln.startswith("HEAVY")]
        assert said == ["HEAVY "], (args, said, proc.stderr[-1000:])
        if args[1] != "--help":
            assert proc.stderr.strip().startswith("error: "), proc.stderr
