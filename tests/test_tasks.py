"""Meta-tests that keep the task layer honest: every task has help, every option too."""

from __future__ import annotations

import importlib.util
import inspect
import re

import pytest
from conftest import ROOT, invoke

_spec = importlib.util.spec_from_file_location("scalelab_tasks", ROOT / "tasks.py")
tasks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tasks)

TASKS = sorted(tasks.ns.tasks)


def test_the_tasks_the_readme_promises_exist():
    assert {"provision", "configure", "bench", "report", "destroy", "status", "demo", "test",
            "lint"} <= set(TASKS)


@pytest.mark.parametrize("name", TASKS)
def test_every_task_has_a_summary_and_help_on_every_option(name):
    task = tasks.ns.tasks[name]
    assert (task.__doc__ or "").strip(), f"{name} has no docstring"
    params = [p for p in inspect.signature(task.body).parameters if p != "c"]
    missing = [p for p in params if p not in (task.help or {})]
    assert not missing, f"invoke {name}: no help for {missing}"


@pytest.mark.parametrize("name", TASKS)
def test_help_runs_and_every_task_is_in_the_readme(name):
    proc = invoke("--help", name)
    assert proc.returncode == 0, proc.stderr
    readme = (ROOT / "README.md").read_text()
    assert re.search(rf"`{name}`", readme), f"README does not mention invoke {name}"


def test_the_task_reference_is_what_invoke_help_prints_now():
    """docs/tasks.md is generated from `invoke --help TASK` for every task; a task or an
    option whose help changed without the page being regenerated fails here."""
    gen = importlib.util.spec_from_file_location("gen_task_docs", ROOT / "scripts" / "gen_task_docs.py")
    module = importlib.util.module_from_spec(gen)
    gen.loader.exec_module(module)
    assert module.task_names() == TASKS
    page = (ROOT / "docs" / "tasks.md").read_text()
    assert page == module.render(), f"docs/tasks.md is out of date; run {module.REGENERATE}"


def test_bench_with_nodes_only_sweeps_the_reference_experiment(tmp_path):
    """The shortest sweep, `invoke bench --nodes 1-2`: no "give --batch-size", but every
    axis not given from the reference experiment, as this CPU cluster that cannot shape runs it,
    named in one line before the plan."""
    from test_bad_inputs import FAKE, _fake_cluster

    state = tmp_path / "state"
    _fake_cluster(state, "local")
    proc = invoke("bench", "--cluster", FAKE, "--nodes", "1-2", "--model", "resnet20",
                  "--dry-run", env={"SCALELAB_HOME": str(state),
                                    "SCALELAB_REPORTS": str(tmp_path / "reports")})
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("axes not given come from the reference experiment "
                            "(bench/sweeps/slices.yml): batch-size 32,64,96, engine horovod"), first
    assert "fp32 (its amp needs GPUs" in first and "model" not in first  # --model was given
    planned = re.findall(r"train-n0\d-p1-b(\d+)-(\w+)-r(\d)", proc.stdout)
    assert sorted({int(b) for b, _, _ in planned}) == [32, 64, 96]
    assert {r for _, _, r in planned} == {"0", "1", "2"}  # its 3 repeats
    assert "probe" in proc.stdout  # and its allreduce probes
    assert not (tmp_path / "reports").exists()  # a dry run writes nothing


def test_the_progress_bar_says_how_long_the_sweep_has_left(monkeypatch, capsys):
    """Before any run ends the time left is the sweep's estimate; then the estimate for the
    runs to go, at the pace the finished runs kept against theirs."""
    from scalelab.run import progress
    from scalelab.run.driver import Progress

    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    bar = progress.Bar(4, 400.0)
    bar.update(Progress(0, 4, "r0", "1 node", None))
    assert "about 0:06:40 left" in capsys.readouterr().err
    clock[0] += 200.0  # the first run took twice its share of the estimate
    bar.update(Progress(0, 4, "r0", "1 node", {"status": "failed", "error": "gloo aborted"}))
    bar.update(Progress(1, 4, "r1", "2 nodes", None))
    shown = capsys.readouterr()
    assert "about 0:10:00 left" in shown.err and "r0: failed: gloo aborted" in shown.out
    bar.close()


def test_bench_with_neither_nodes_nor_a_sweep_file_is_the_demo_sweep():
    """`invoke bench` alone runs the demo sweep, as `--sweep demo` names it (and another sweep
    file gives another plan, so the comparison can tell them apart)."""
    body = tasks.ns.tasks["bench"].body
    asked = {k: p.default for k, p in inspect.signature(body).parameters.items() if k != "c"}
    bare = tasks._bench_spec("demo", asked)
    assert bare == tasks._bench_spec("demo", {**asked, "sweep": "demo"})
    assert bare != tasks._bench_spec("demo", {**asked, "sweep": "ci"})
