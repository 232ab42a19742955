"""The store of record: sweep.json, runs.jsonl appended and fsync'ed, latest, resume."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest
from conftest import fill, tiny_fs

from scalelab.cluster.nodes import Node
from scalelab.results import store
from scalelab.results.store import (
    StoreError,
    append_run,
    compact,
    create_sweep,
    finish_sweep,
    hold_sweep,
    list_sweeps,
    load_sweep,
    missing_runs,
    new_record,
    read_runs,
    update_latest,
)
from scalelab.sweep.planner import plan
from scalelab.sweep.sweepfile import spec_from_options, spec_to_dict

SID = "20261121-153000-ab12"
NODES = [Node(f"demo-n{i}", f"10.9.0.{i}", f"10.9.0.{i}", "head" if i == 0 else "worker",
              "local", cpus=1.0) for i in range(2)]
RANKS = [{"rank": 0, "host": "demo-n0", "images_per_sec": 100.0, "step_time_mean_s": 0.3,
          "step_time_p95_s": 0.4, "compute_time_mean_s": 0.2, "comm_time_mean_s": 0.1}]


@pytest.fixture
def runs():
    spec = spec_from_options(nodes="1,2", batch_size="32", bandwidth="1gbit", repeats=2,
                             model="resnet20")
    return plan(spec, NODES, can_shape=True, cluster="demo")


def meta(runs, **kw):
    spec = spec_from_options(nodes="1,2", batch_size="32", model="resnet20")
    return {"cluster": "demo", "target": "local", "created_at": "2026-11-21T15:30:00Z",
            "plan": spec_to_dict(spec), "nodes": [n.to_dict() for n in NODES],
            "software": {"torch": "2.13.0"}, "planned_runs": [r.run_id for r in runs], **kw}


@pytest.fixture
def sweep(tmp_path, runs):
    return create_sweep(tmp_path / "reports", SID, meta(runs))


def record(run, status="ok", sweep_id=SID, **kw):
    if status == "ok" and run.kind == "train":
        kw.setdefault("ranks", RANKS)
    error = "" if status in ("ok", "interrupted") else f"{status}: boom"
    return new_record(sweep_id, run, target="local", status=status,
                      started_at="2026-11-21T15:31:00Z", duration_s=12.5, error=error, **kw)


def lines(sweep_dir: Path) -> list[str]:
    return (sweep_dir / "runs.jsonl").read_text().splitlines()


# ------------------------------------------------------------------------------ sweeps


def test_create_sweep_writes_the_manifest(sweep, runs):
    data = json.loads((sweep / "sweep.json").read_text())
    assert data["sweep_id"] == SID and data["finished_at"] is None
    assert data["planned_runs"] == [r.run_id for r in runs]
    assert oct((sweep / "sweep.json").stat().st_mode & 0o777) == "0o644"
    finish_sweep(sweep, "2026-11-21T16:00:00Z")
    assert json.loads((sweep / "sweep.json").read_text())["finished_at"] == "2026-11-21T16:00:00Z"


def test_an_existing_sweep_id_is_refused(sweep, runs):
    with pytest.raises(StoreError, match=f"sweep {SID} already exists"):
        create_sweep(sweep.parent, SID, meta(runs))
    assert json.loads((sweep / "sweep.json").read_text())["sweep_id"] == SID


@pytest.mark.parametrize("bad", ["../evil", "latest", "", ".hidden", "a/b"])
def test_bad_sweep_ids_are_refused(tmp_path, runs, bad):
    with pytest.raises(StoreError, match="not valid"):
        create_sweep(tmp_path, bad, meta(runs))
    assert not (tmp_path / "evil").exists()


def test_manifest_must_be_complete(tmp_path, runs):
    m = meta(runs)
    del m["planned_runs"]
    with pytest.raises(StoreError, match="manifest lacks planned_runs"):
        create_sweep(tmp_path, SID, m)
    assert not (tmp_path / SID).exists()


# ------------------------------------------------------------------------------ append / read


def test_append_then_read_last_record_wins(sweep, runs):
    a, b = runs[0], runs[1]
    append_run(sweep, record(a, "interrupted"))
    append_run(sweep, record(b))
    append_run(sweep, record(a))
    got = read_runs(sweep)
    assert list(got) == [b.run_id, a.run_id]  # in the order the surviving records were written
    assert got[a.run_id]["status"] == "ok" and got[a.run_id]["ranks"] == RANKS
    assert len(lines(sweep)) == 3
    assert all(json.loads(line)["sweep_id"] == SID for line in lines(sweep))


def test_a_record_missing_required_keys_is_refused(sweep, runs):
    rec = record(runs[0])
    del rec["params"]["world_size"]
    with pytest.raises(StoreError, match="params lack world_size"):
        append_run(sweep, rec)
    rec = record(runs[0])
    del rec["env"], rec["started_at"]
    with pytest.raises(StoreError, match="record lacks env, started_at"):
        append_run(sweep, rec)
    assert not (sweep / "runs.jsonl").exists()


@pytest.mark.parametrize("change, message", [
    ({"status": "done"}, "status 'done' is not one of ok, failed, timeout, interrupted"),
    ({"kind": "eval"}, "kind 'eval' is not one of train, allreduce"),
    ({"ranks": []}, "status ok but no per-rank figures"),
    ({"status": "failed", "error": ""}, "status failed needs the error text"),
    ({"sweep_id": "other"}, "record of sweep 'other' does not belong in sweep"),
    ({"duration_s": float("nan")}, "not plain JSON"),
])
def test_invalid_records_are_refused_and_nothing_is_written(sweep, runs, change, message):
    train = next(r for r in runs if r.kind == "train")
    rec = {**record(train), **change}
    with pytest.raises(StoreError, match=message):
        append_run(sweep, rec)
    assert read_runs(sweep) == {}


def test_probe_records_carry_allreduce_results(sweep, runs):
    probe = next(r for r in runs if r.kind == "allreduce")
    rec = record(probe, allreduce=[{"size_bytes": 4096, "time_s": 0.001, "algbw_mb_s": 4.1,
                                    "busbw_mb_s": 4.1}])
    append_run(sweep, rec)
    assert read_runs(sweep)[probe.run_id]["allreduce"][0]["size_bytes"] == 4096
    del rec["allreduce"]
    with pytest.raises(StoreError, match="lacks allreduce"):
        append_run(sweep, rec)


def test_records_are_fsynced_and_the_new_file_dir_too(sweep, runs, monkeypatch):
    synced = []
    real = os.fsync

    def spy(fd):
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    append_run(sweep, record(runs[0]))
    assert synced == ["runs.jsonl", SID]  # the record, then the directory entry of the file
    synced.clear()
    append_run(sweep, record(runs[1]))
    assert synced == ["runs.jsonl"]


def test_torn_last_line_is_skipped_with_a_warning_then_cut_off(sweep, runs, caplog):
    append_run(sweep, record(runs[0]))
    whole = json.dumps(record(runs[1]))
    with open(sweep / "runs.jsonl", "a") as fh:
        fh.write(whole[: len(whole) // 2])  # a crash in the middle of a write
    with caplog.at_level(logging.WARNING, logger="scalelab.results.store"):
        got = read_runs(sweep)
    assert list(got) == [runs[0].run_id]
    assert "torn last line" in caplog.text
    append_run(sweep, record(runs[2]))  # resume appends: the torn bytes must not glue on
    assert list(read_runs(sweep)) == [runs[0].run_id, runs[2].run_id]
    assert len(lines(sweep)) == 2


def test_a_complete_last_record_without_newline_is_kept(sweep, runs):
    with open(sweep / "runs.jsonl", "w") as fh:
        fh.write(json.dumps(record(runs[0])))
    assert list(read_runs(sweep)) == [runs[0].run_id]
    append_run(sweep, record(runs[1]))
    assert list(read_runs(sweep)) == [runs[0].run_id, runs[1].run_id]


def test_trailing_zero_bytes_after_a_crash_are_a_torn_line(sweep, runs):
    append_run(sweep, record(runs[0]))
    with open(sweep / "runs.jsonl", "ab") as fh:
        fh.write(b"\0" * 512)  # size updated, data never reached the disk
    assert list(read_runs(sweep)) == [runs[0].run_id]
    append_run(sweep, record(runs[1]))
    assert len(read_runs(sweep)) == 2


def test_a_damaged_line_in_the_middle_is_an_error(sweep, runs):
    append_run(sweep, record(runs[0]))
    with open(sweep / "runs.jsonl", "a") as fh:
        fh.write('{"run_id": "x", "trunc\n')
    append_run(sweep, record(runs[1]))
    with pytest.raises(StoreError, match=r"runs.jsonl:2: not a run record"):
        read_runs(sweep)


def test_no_runs_yet_reads_empty(sweep):
    assert read_runs(sweep) == {}


# ------------------------------------------------------------------------------ full disk


def test_a_failed_fsync_leaves_no_partial_line(sweep, runs, monkeypatch):
    append_run(sweep, record(runs[0]))
    before = (sweep / "runs.jsonl").read_bytes()

    def full(fd):  # ext4 with delayed allocation reports ENOSPC at fsync, not write
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StoreError, match="no space left on the device; run .* was not recorded"):
        append_run(sweep, record(runs[1]))
    monkeypatch.undo()
    assert (sweep / "runs.jsonl").read_bytes() == before


@pytest.fixture
def small_fs(tmp_path):
    """A 64 KiB tmpfs (conftest.tiny_fs): root only."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    with tiny_fs(tmp_path / "tiny") as fs:
        yield fs


@pytest.mark.root
def test_enospc_on_a_full_disk_gives_store_error_and_no_partial_line(small_fs, runs):
    sweep = create_sweep(small_fs, SID, meta(runs))
    append_run(sweep, record(runs[0]))
    append_run(sweep, record(runs[1]))
    before = (sweep / "runs.jsonl").read_bytes()
    filler = fill(small_fs)
    big = record(runs[2], env={"pad": "x" * 9000})  # more than the slack of the last page
    with pytest.raises(StoreError, match="no space left on the device"):
        append_run(sweep, big)
    assert (sweep / "runs.jsonl").read_bytes() == before
    assert list(read_runs(sweep)) == [runs[0].run_id, runs[1].run_id]
    filler.unlink()
    append_run(sweep, big)  # once there is room again the same record goes in whole
    assert read_runs(sweep)[runs[2].run_id]["env"]["pad"] == "x" * 9000


# ------------------------------------------------------------------------------ resume


def test_missing_runs_redo_absent_and_interrupted_but_keep_failures(sweep, runs):
    train = [r for r in runs if r.kind == "train"]
    assert missing_runs(sweep, runs) == runs
    append_run(sweep, record(train[0]))
    append_run(sweep, record(train[1], "failed"))
    append_run(sweep, record(train[2], "timeout"))
    append_run(sweep, record(train[3], "interrupted"))
    todo = missing_runs(sweep, runs)
    assert train[3] in todo and train[0] not in todo
    assert train[1] not in todo and train[2] not in todo
    assert [r.run_id for r in todo] == [r.run_id for r in runs
                                        if r.run_id not in {t.run_id for t in train[:3]}]
    again = missing_runs(sweep, runs, retry_failed=True)
    assert train[1] in again and train[2] in again and train[0] not in again
    append_run(sweep, record(train[3]))  # finished on the resume
    assert train[3] not in missing_runs(sweep, runs)


def test_missing_runs_refuses_a_changed_plan(sweep, runs):
    append_run(sweep, record(runs[0]))
    other = plan(spec_from_options(nodes="1,2", batch_size="32", bandwidth="1gbit", repeats=2,
                                   model="resnet32"), NODES, can_shape=True)
    with pytest.raises(StoreError, match="stored with other parameters than planned"):
        missing_runs(sweep, other)


def test_compact_keeps_the_last_record_per_run(sweep, runs):
    a, b = runs[0], runs[1]
    append_run(sweep, record(a, "interrupted"))
    append_run(sweep, record(b, "interrupted"))
    append_run(sweep, record(a))
    append_run(sweep, record(b))
    before = read_runs(sweep)
    with open(sweep / "runs.jsonl", "a") as fh:
        fh.write('{"run_id": "torn')
    assert compact(sweep) == 3  # two superseded records and the torn line
    assert len(lines(sweep)) == 2
    assert read_runs(sweep) == before
    assert compact(sweep) == 0
    assert oct((sweep / "runs.jsonl").stat().st_mode & 0o777) == "0o644"


def test_compact_without_runs_is_a_no_op(sweep):
    assert compact(sweep) == 0 and not (sweep / "runs.jsonl").exists()


def test_one_writer_per_sweep(sweep):
    with hold_sweep(sweep):
        with pytest.raises(StoreError, match=rf"being run by another scalelab \(pid {os.getpid()}"):
            with hold_sweep(sweep):
                pass
    with hold_sweep(sweep):  # released when the first holder is done
        pass


# ------------------------------------------------------------------------------ latest / load


def test_latest_symlink_points_at_the_newest_sweep(tmp_path, runs):
    root = tmp_path / "reports"
    first = create_sweep(root, "20261121-150000-aaaa", meta(runs))
    second = create_sweep(root, "20261121-160000-bbbb", meta(runs))
    update_latest(root, first.name)
    update_latest(root, second.name)
    link = root / "latest"
    assert link.is_symlink() and os.readlink(link) == second.name  # relative
    assert link.resolve() == second.resolve()
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []  # no temp left
    loaded = load_sweep(root)
    assert loaded.sweep_id == second.name and loaded.meta["cluster"] == "demo"
    assert list_sweeps(root) == [first.name, second.name]


def test_latest_over_a_real_directory_is_refused(tmp_path, runs):
    root = tmp_path / "reports"
    create_sweep(root, SID, meta(runs))
    (root / "latest").mkdir()
    with pytest.raises(StoreError, match="is not a symlink"):
        update_latest(root, SID)
    with pytest.raises(StoreError, match="not found"):
        update_latest(root, "20990101-000000-zzzz")


def test_load_sweep_by_id_prefix_and_unknown_ids(tmp_path, runs):
    root = tmp_path / "reports"
    with pytest.raises(StoreError, match="no latest sweep .* known: none yet; run invoke bench"):
        load_sweep(root)
    create_sweep(root, "20261121-150000-aaaa", meta(runs))
    create_sweep(root, "20261122-090000-bbbb", meta(runs))
    assert load_sweep(root, "20261121-150000-aaaa").sweep_id == "20261121-150000-aaaa"
    assert load_sweep(root, "20261122").sweep_id == "20261122-090000-bbbb"
    with pytest.raises(StoreError) as err:
        load_sweep(root, "20250101-000000-cccc")
    assert str(err.value) == (f"sweep '20250101-000000-cccc' not found in {root}; known: "
                              "20261121-150000-aaaa, 20261122-090000-bbbb")
    with pytest.raises(StoreError, match="ambiguous"):
        load_sweep(root, "2026112")
    with pytest.raises(StoreError, match="not valid"):
        load_sweep(root, "../reports")


def test_load_sweep_reads_the_runs(sweep, runs):
    append_run(sweep, record(runs[0]))
    loaded = store.load_sweep(sweep.parent, SID)
    assert loaded.path == sweep and list(loaded.runs) == [runs[0].run_id]
