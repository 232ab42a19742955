"""One declaration per setting (scalelab.sweep.settings), and a store that says its version.

The made-up axis is added to a copy of the package by editing settings.py alone, then followed
through every boundary a user meets: the bench option and its help, the sweep-file key, the
run ids, the records, results.csv and an older store read beside it.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

from scalelab import report
from scalelab.cluster.nodes import Node
from scalelab.results import frames, store
from scalelab.sweep import planner, settings, sweepfile

STORES = ROOT / "tests" / "data" / "stores"

# a made-up variant axis, declared once: the only change to the copy
ZETA = '''
    Setting("zeta", "zeta", "list[float] | None", lambda x, w: values.positive_list(x, w, "1,2"),
            None, "zeta values to sweep (a made-up axis)", variant=True, single=1.0,
            tag=lambda x: "z" + _num_tag(x), record="zeta", column="zeta", since=10,
            before=1.0),'''

PROBE = textwrap.dedent('''
    import csv, json, sys
    from pathlib import Path
    import scalelab
    from scalelab.cluster.nodes import Node
    from scalelab.results import frames, store
    from scalelab.sweep import planner, settings, sweepfile

    out = {"package": scalelab.__file__}
    sweep = Path(sys.argv[1])
    sweep.write_text("nodes: [1, 2]\\nbatch_size: 32\\nmodel: resnet20\\nrepeats: 1\\n"
                     "zeta: [1, 2.5]\\n")
    spec = sweepfile.spec_from_options(sweep_file=str(sweep), steps="3")
    out["spec"] = spec.zeta
    out["cli"] = sweepfile.spec_from_options(nodes="1", batch_size="8", zeta="3").zeta
    nodes = [Node(f"x-n{i}", f"10.9.0.{i + 10}", f"10.9.0.{i + 10}",
                  "head" if i == 0 else "worker", "local", cpus=1.0) for i in range(2)]
    runs = planner.plan(spec, nodes, can_shape=True)
    out["ids"] = [r.run_id for r in runs]
    out["params"] = [r.params.get("zeta", "absent") for r in runs]
    out["line"] = planner.describe(runs[1])
    root = Path(sys.argv[2])
    d = store.create_sweep(root, "zeta", {"cluster": "x", "target": "local",
                                         "created_at": "2026-11-27T00:00:00Z",
                                         "plan": sweepfile.spec_to_dict(spec), "nodes": [],
                                         "planned_runs": len(runs)})
    rank = {"rank": 0, "host": "x-n0", "images_per_sec": 10.0, "step_time_mean_s": 3.2,
            "step_time_p95_s": 3.3, "compute_time_mean_s": 3.0, "comm_time_mean_s": 0.2}
    for r in runs:
        store.append_run(d, store.new_record("zeta", r, target="local", status="ok",
                                             started_at="2026-11-27T00:00:00Z",
                                             ranks=[rank] * r.params["world_size"]
                                             if r.kind == "train" else []))
    out["series"] = sorted(set(frames.to_frame(frames.load_runs(d))["settings"]))
    out["plan_key"] = json.loads((d / "sweep.json").read_text())["plan"].get("zeta")
    with frames.write_csv(d).open() as f:
        out["csv"] = [(row["run_id"], row["zeta"]) for row in csv.DictReader(f)]
    with frames.write_csv(Path(sys.argv[3])).open() as f:
        out["old"] = sorted({row["zeta"] for row in csv.DictReader(f)})
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def with_zeta(tmp_path_factory) -> Path:
    """A copy of the project whose settings table has one more entry, and nothing else."""
    copy = tmp_path_factory.mktemp("zeta") / "project"
    copy.mkdir()
    shutil.copy2(ROOT / "tasks.py", copy / "tasks.py")
    for folder in ("scalelab", "bench"):
        shutil.copytree(ROOT / folder, copy / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    table = copy / "scalelab" / "sweep" / "settings.py"
    text = table.read_text()
    end = "\n)\n\nBY_KEY"
    assert text.count(end) == 1
    table.write_text(text.replace(end, ZETA.rstrip("\n") + end))
    changed = [p.relative_to(copy) for p in copy.rglob("*.py")
               if p.read_bytes() != (ROOT / p.relative_to(copy)).read_bytes()]
    assert changed == [Path("scalelab/sweep/settings.py")]
    return copy


def test_a_made_up_axis_declared_once_reaches_every_boundary(with_zeta, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(STORES / "v7-9d6573b", old)
    got = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "z.yml"), str(tmp_path / "reports"),
         str(old)], cwd=with_zeta, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(with_zeta)})
    assert got.returncode == 0, got.stderr[-3000:]
    out = json.loads(got.stdout.splitlines()[-1])
    assert out["package"].startswith(str(with_zeta))
    assert out["spec"] == [1.0, 2.5] and out["cli"] == [3.0]  # sweep-file key, bench option
    assert out["ids"] == ["train-n01-p1-b032-native-z1-r0", "train-n01-p1-b032-native-z2p5-r0",
                          "allreduce-n02-p1-native", "train-n02-p1-b032-native-z1-r0",
                          "train-n02-p1-b032-native-z2p5-r0"]
    assert out["params"] == [1.0, 2.5, None, 1.0, 2.5]  # recorded; a probe has none
    assert out["line"].endswith("repeat 0  zeta 2.5")  # the progress line and --dry-run say it
    assert out["plan_key"] == [1.0, 2.5]  # sweep.json's plan says it, so resume plans it
    assert out["csv"] == [["train-n01-p1-b032-native-z1-r0", "1"],
                          ["train-n01-p1-b032-native-z2p5-r0", "2.5"],
                          ["train-n02-p1-b032-native-z1-r0", "1"],
                          ["train-n02-p1-b032-native-z2p5-r0", "2.5"]]
    assert out["series"] == ["", "zeta 2.5"]  # its values are separate series in the report
    assert out["old"] == ["1"]  # a store from before the axis ran at its `before`


def test_the_made_up_axis_is_an_option_of_invoke_bench(with_zeta):
    got = subprocess.run([str(Path(sys.executable).parent / "invoke"), "--help", "bench"],
                         cwd=with_zeta, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert "--zeta=STRING" in got.stdout and "a made-up axis" in got.stdout
    here = subprocess.run([str(Path(sys.executable).parent / "invoke"), "--help", "bench"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "--zeta" not in here.stdout  # the copy, not this tree, has it


# ---------------------------------------------------------------------------- store versions

# each fixture is a store written by the commit in its name (reports/example there), cut to
# its first records: the store version it was, and what its params lacked
FIXTURES = {
    "v1-83e53ce": (1, {"accelerator": None, "device": "cpu", "runtime": "host",
                       "bucket_cap_mb": 25.0, "fabric_profile": "ideal", "intra_link": None}),
    "v3-f05eb71": (3, {"runtime": "host", "bucket_cap_mb": 25.0, "compression": "none",
                       "global_batch_size": None, "fabric_profile": "ideal"}),
    "v7-9d6573b": (7, {"intra_link": None, "intra_mbit": None}),
    # a 2-node sweep of emulated V100s, 2 ranks a node on a pcie3 path, run for this fixture
    "v8-541d3c6": (8, {}),
}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_an_old_store_is_read_as_the_version_it_was_and_upgraded(name, tmp_path):
    d = tmp_path / name
    shutil.copytree(STORES / name, d)
    version, filled = FIXTURES[name]
    assert store.store_version(d) == version
    raw = store.read_runs(d)
    for rec in store.read_records(d):
        params = vars(rec.params)
        assert tuple(params) == settings.PARAM_KEYS
        before = raw[rec.run_id]["params"]
        assert {k: params[k] for k in before} == before  # what it said stays
        train = rec.kind == "train"
        for key, value in filled.items():
            assert key not in before
            assert params[key] == (value if train or key not in
                                   ("bucket_cap_mb", "compression") else None), key
    # results.csv of the old store has every column, the new ones at what the store ran at
    with frames.write_csv(d).open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == frames.CSV_COLUMNS
    assert {r["fabric_profile"] for r in rows} <= {"ideal", "ethernet-tcp"}
    assert {r["runtime"] for r in rows} == {"host"}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_an_old_store_resumes_under_its_own_plan(name, tmp_path):
    """Planning the stored plan again gives every stored run's id and, upgraded, its params:
    resume redoes nothing that was done and refuses nothing."""
    d = tmp_path / name
    shutil.copytree(STORES / name, d)
    meta = json.loads((d / "sweep.json").read_text())
    spec = sweepfile.spec_from_mapping(meta["plan"], "sweep.json")
    # a sweep folder names no node's address (it may be shared): the cluster's record does
    nodes = [Node.from_dict({"address": f"10.9.0.{i + 10}", **n})
             for i, n in enumerate(meta["nodes"])]
    runs = planner.plan(spec, nodes, can_shape=True)
    done = store.read_runs(d)
    assert set(done) <= {r.run_id for r in runs}
    todo = store.missing_runs(d, runs)
    assert not {r.run_id for r in todo} & {k for k, r in done.items() if r["status"] == "ok"}


def test_a_new_store_says_its_version_and_a_newer_one_is_refused(tmp_path):
    d = store.create_sweep(tmp_path, "s1", {"cluster": "c", "target": "local",
                                            "created_at": "x", "plan": {}, "nodes": [],
                                            "planned_runs": 0})
    meta = json.loads((d / "sweep.json").read_text())
    assert meta["schema_version"] == settings.STORE_VERSION
    assert store.store_version(d) == settings.STORE_VERSION
    meta["schema_version"] = settings.STORE_VERSION + 1
    (d / "sweep.json").write_text(json.dumps(meta))
    with pytest.raises(store.StoreError, match="newer than this scalelab"):
        store.read_records(d)


def test_a_spec_cannot_be_changed_once_built():
    with pytest.raises(dataclasses.FrozenInstanceError):
        sweepfile.spec_from_options(nodes="1", batch_size="8").model = "resnet18"


def test_the_contract_s_params_table_is_the_settings_table():
    gen = importlib.util.spec_from_file_location(
        "gen_contract_params", ROOT / "scripts" / "gen_contract_params.py")
    mod = importlib.util.module_from_spec(gen)
    gen.loader.exec_module(mod)
    page = mod.PAGE.read_text()
    assert mod.render(page) == page, (
        "docs/dev/CONTRACTS.md's params table is stale: run "
        ".venv/bin/python scripts/gen_contract_params.py")
    for key in settings.PARAM_KEYS:
        assert f"| `{key}` |" in page


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_old_store_still_reports(name, tmp_path):
    d = tmp_path / name
    shutil.copytree(STORES / name, d)
    page = report.build_report(d).read_text()
    meta = json.loads((d / "sweep.json").read_text())
    assert meta["sweep_id"] in page
    ok = [r for r in store.read_runs(d).values() if r["kind"] == "train" and r["status"] == "ok"]
    rows = frames.to_frame(frames.load_runs(d))
    assert len(rows) == len(ok) and rows["images_per_sec"].notna().all()
