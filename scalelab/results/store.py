"""The store of record: reports/<sweep_id>/sweep.json and runs.jsonl (docs/dev/CONTRACTS.md).

sweep.json is the manifest, written once, whole or not at all (write_atomic), and rewritten
the same way when the sweep finishes. runs.jsonl holds one JSON object per finished run,
appended, flushed and fsync'ed before the next run starts; the last record of a run id wins.

Why JSON lines and not SQLite in WAL mode:
- Each stage reads files the previous one wrote (sweep -> store -> results -> report), and
  anything that reads a text file can read this store: jq, pandas, a person with less, an
  archive years from now. A database would need scalelab (or sqlite3) to be looked at, and
  its WAL and -shm side files make "copy the folder" unsafe while a sweep runs.
- Records are written once and never updated in place; an append-only log is exactly that
  shape, and "last record per run id wins" gives re-runs without UPDATE.
- The failure a long sweep meets is a crash or a full disk halfway through a write. With
  one write() per record and an fsync after it, a crash can only leave a torn *last* line,
  which is detectable (it does not parse) and harmless (it is skipped, and the next append
  cuts it off). A full disk is undone by truncating back to the size before the write.
  Anything torn elsewhere means outside damage and is reported, not guessed around.
- One writer per sweep, a few thousand records at most: no need for a database's
  concurrency or indexes. hold_sweep() keeps it to one writer.

Resume: a run is redone when its last record is missing or "interrupted" (the operator or
the controller stopped it, so it says nothing about the configuration). "failed" and
"timeout" records are results and are kept: an out-of-memory at batch 96 or a run that
cannot finish over a 10 Mbit/s link is what that configuration does, will do it again, and
belongs in the report as such; re-running them by default would spend hours to learn the
same thing. retry_failed=True redoes them too (after fixing a node, say).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.core.errors import ScalelabError
from scalelab.core.state import write_atomic
from scalelab.results.records import RunRecord
from scalelab.sweep.planner import RunPlan
from scalelab.sweep.settings import (
    KINDS,
    PARAM_KEYS,
    RECORD,
    STORE_VERSION,
    Planned,
    store_version_of,
)

log = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"
RUNS_FILE = "runs.jsonl"
LATEST = "latest"
STATUSES = ("ok", "failed", "timeout", "interrupted")
RETRIED = ("interrupted",)
RETRIED_WITH_FAILED = ("interrupted", "failed", "timeout")

# runs.jsonl record keys (CONTRACTS.md), in contract order; "allreduce" for probes only
RECORD_KEYS = ("sweep_id", "run_id", "kind", "status", "params", "target", "node_names",
               "ranks", "gradient_bytes", "link_mbit_measured", "link_error", "env",
               "started_at", "duration_s", "error")
MEASURED_KEYS = ("ranks", "allreduce", "gradient_bytes", "link_mbit_measured", "link_error",
                 "env", "timeline", "accelerator", "slurm", "placement",
                 "link_mbit_single_stream", "comm", "ssh", "storage", "ps",
                 "checkpoint", "failure")
# what each measured field holds: docs/dev/CONTRACTS.md (the one place it is written)
# a training run's "timeline" (optional): where its wall time went, in this order, adding up to
# duration_s (scalelab.run.driver.timeline works them out)
TIMELINE_KEYS = ("launch_s", "import_s", "rendezvous_s", "setup_s", "warmup_s", "timed_s",
                 "finish_s", "reap_s")
# sweep.json keys the caller must give; sweep_id, finished_at and software are filled in
SWEEP_KEYS = ("cluster", "target", "created_at", "plan", "nodes", "planned_runs")

_SWEEP_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]{0,63}$")
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class StoreError(ScalelabError):
    """The store of record cannot be written or read as asked."""


@dataclass(frozen=True)
class Sweep:
    """A sweep as stored: its manifest and the last record of each run."""

    sweep_id: str
    path: Path
    meta: dict[str, Any]
    runs: dict[str, dict[str, Any]]


# ------------------------------------------------------------------------------ sweeps

def check_sweep_id(sweep_id: str) -> str:
    """Sweep ids become directory names: no slashes, no dot-files, not 'latest'."""
    if not isinstance(sweep_id, str) or not _SWEEP_ID.match(sweep_id) or sweep_id == LATEST:
        raise StoreError(f"sweep id {sweep_id!r} is not valid; use letters, digits, '.', '-' "
                         "and '_' (e.g. 20261121-153000-ab12)")
    return sweep_id


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _dump(obj: Any, what: str, **kw: Any) -> str:
    try:
        return json.dumps(obj, allow_nan=False, **kw)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not plain JSON ({exc}); NaN, inf and objects are refused "
                         "so that every reader can parse the store") from None


def create_sweep(reports_root: Path, sweep_id: str, meta: dict[str, Any]) -> Path:
    """Make reports/<sweep_id>/ with sweep.json; an id that exists is refused, never reused.

    meta holds the sweep.json keys of CONTRACTS.md: cluster, target, created_at, plan, nodes,
    planned_runs (software and finished_at default to {} and null).
    """
    check_sweep_id(sweep_id)
    missing = [k for k in SWEEP_KEYS if k not in meta]
    if missing:
        raise StoreError(f"sweep {sweep_id}: manifest lacks {', '.join(missing)}")
    if meta.get("sweep_id", sweep_id) != sweep_id:
        raise StoreError(f"sweep {sweep_id}: manifest says sweep_id {meta['sweep_id']!r}")
    record = {"sweep_id": sweep_id, "schema_version": STORE_VERSION, **meta}
    record.setdefault("finished_at", None)
    record.setdefault("software", {})
    text = _dump(record, f"sweep {sweep_id} manifest", indent=2) + "\n"
    root = Path(reports_root)
    root.mkdir(parents=True, exist_ok=True)
    sweep_dir = root / sweep_id
    try:
        sweep_dir.mkdir()
    except FileExistsError:
        raise StoreError(f"sweep {sweep_id} already exists in {root}; resume it with "
                         f"--resume {sweep_id} or start a new sweep") from None
    try:
        write_atomic(sweep_dir / SWEEP_FILE, text, mode=0o644)
        _fsync_dir(sweep_dir)
        _fsync_dir(root)
    except OSError as exc:
        with suppress(OSError):
            (sweep_dir / SWEEP_FILE).unlink(missing_ok=True)
            sweep_dir.rmdir()
        raise StoreError(f"cannot create sweep {sweep_id} in {root}: {exc.strerror}") from None
    return sweep_dir


def finish_sweep(sweep_dir: Path, finished_at: str) -> None:
    """Set sweep.json's finished_at (ISO 8601 UTC), atomically."""
    meta = read_meta(Path(sweep_dir))
    meta["finished_at"] = finished_at
    write_atomic(Path(sweep_dir) / SWEEP_FILE, _dump(meta, "manifest", indent=2) + "\n",
                 mode=0o644)


def update_latest(reports_root: Path, sweep_id: str) -> Path:
    """Point reports/latest at the sweep: a relative symlink, swapped in by rename."""
    root = Path(reports_root)
    check_sweep_id(sweep_id)
    if not (root / sweep_id / SWEEP_FILE).is_file():
        raise StoreError(f"sweep {sweep_id} not found in {root}; nothing to mark latest")
    link = root / LATEST
    tmp = root / f".{LATEST}.{os.getpid()}.tmp"
    with suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(sweep_id, tmp)  # relative, so the reports folder can be moved or copied
    try:
        os.replace(tmp, link)
    except OSError:
        tmp.unlink()
        raise StoreError(f"{link} exists and is not a symlink; move it away so it can point "
                         f"at the newest sweep") from None
    _fsync_dir(root)
    return link


def list_sweeps(reports_root: Path) -> list[str]:
    """Ids of the sweeps under reports_root, oldest first (ids sort by time)."""
    root = Path(reports_root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if p.name != LATEST and not p.is_symlink() and is_sweep_dir(p))


def is_sweep_dir(path: Path) -> bool:
    """A directory holding a sweep's manifest or its runs (a lost manifest is still a sweep)."""
    return path.is_dir() and ((path / SWEEP_FILE).is_file() or (path / RUNS_FILE).is_file())


def read_meta(sweep_dir: Path) -> dict[str, Any]:
    """A sweep's manifest (sweep.json); StoreError when it cannot be read."""
    path = Path(sweep_dir) / SWEEP_FILE
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise StoreError(f"{sweep_dir} is not a sweep (no {SWEEP_FILE})") from None
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: cannot read the manifest ({exc})") from None
    if not isinstance(meta, dict):
        raise StoreError(f"{path}: the manifest is not a JSON object")
    return meta


def _known(root: Path) -> str:
    ids = list_sweeps(root)
    if not ids:
        return "none yet; run invoke bench"
    shown = ", ".join(ids[-10:])
    return f"{shown} (and {len(ids) - 10} older)" if len(ids) > 10 else shown


def resolve_sweep(reports_root: Path, sweep_id: str | Path = LATEST,
                  paths: bool = False) -> Path:
    """The directory of a sweep: its id, a unique prefix of one, 'latest', or (paths=True, as
    the report allows; resume writes only under the reports root) a sweep directory's path.

    The one sweep lookup: bench --resume and report both use it.
    """
    root = Path(reports_root)
    text = str(sweep_id).strip()
    if text in ("", LATEST):
        link = root / LATEST
        if not link.is_symlink():
            raise StoreError(f"no latest sweep in {root}; known: {_known(root)}")
        target = Path(os.readlink(link)).name
        if not is_sweep_dir(root / target):
            raise StoreError(f"{link} points at {target}, which is gone; known: {_known(root)}")
        return root / target
    if "/" in text and paths:
        if is_sweep_dir(Path(text)):
            return Path(text)
        raise StoreError(f"{text} is not a sweep directory (it has no {SWEEP_FILE} or "
                         f"{RUNS_FILE}); known in {root}: {_known(root)}")
    if "/" in text or text.startswith("."):
        raise StoreError(f"sweep id {text!r} is not valid; known: {_known(root)}")
    if is_sweep_dir(root / text):
        return root / text
    matches = [s for s in list_sweeps(root) if s.startswith(text)]
    if len(matches) == 1:
        return root / matches[0]
    if len(matches) > 1:
        raise StoreError(f"sweep {text!r} is ambiguous: {', '.join(matches)}")
    raise StoreError(f"sweep {text!r} not found in {root}; known: {_known(root)}")


def load_sweep(reports_root: Path, sweep_id: str = LATEST) -> Sweep:
    """Read a sweep's manifest and runs; sweep_id may be 'latest' or a unique prefix."""
    sweep_dir = resolve_sweep(reports_root, sweep_id)
    return Sweep(sweep_dir.name, sweep_dir, read_meta(sweep_dir), read_runs(sweep_dir))


@contextmanager
def hold_sweep(sweep_dir: Path) -> Iterator[None]:
    """Be the only writer of a sweep while the block runs; a second one fails at once."""
    path = Path(sweep_dir) / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise StoreError(f"sweep {Path(sweep_dir).name} is being run by another scalelab "
                             f"(pid {holder}); wait for it to end or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def _dir_lock(sweep_dir: Path) -> Iterator[None]:
    # the directory is never replaced, unlike runs.jsonl (compact renames over it)
    fd = os.open(sweep_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------ run records

def new_record(sweep_id: str, run: RunPlan, *, target: str, status: str, started_at: str,
               duration_s: float = 0.0, error: str = "", **measured: Any) -> dict[str, Any]:
    """A complete runs.jsonl record for a planned run; measured fields default to empty.

    measured: ranks, allreduce, gradient_bytes, link_mbit_measured, link_error (why the link
    could not be measured, "" when it was or was not asked), env.
    """
    unknown = sorted(set(measured) - set(MEASURED_KEYS))
    if unknown:
        raise StoreError(f"run {run.run_id}: unknown record fields {', '.join(unknown)}")
    record: dict[str, Any] = {
        "sweep_id": sweep_id, "run_id": run.run_id, "kind": run.kind, "status": status,
        "params": dict(run.params), "target": target, "node_names": list(run.node_names),
        "ranks": [], "gradient_bytes": None, "link_mbit_measured": None, "link_error": "",
        "env": {}, "started_at": started_at, "duration_s": duration_s, "error": error,
    }
    if run.kind == "allreduce":
        record["allreduce"] = []
    record.update(measured)
    check_record(record)
    return record


def check_record(record: Any) -> None:
    """Refuse a record that breaks the runs.jsonl contract, naming what is wrong."""
    if not isinstance(record, dict):
        raise StoreError(f"a run record must be a JSON object, not {type(record).__name__}")
    rid = record.get("run_id", "?")
    required = RECORD_KEYS + (("allreduce",) if record.get("kind") == "allreduce" else ())
    missing = [k for k in required if k not in record]
    if missing:
        raise StoreError(f"run {rid}: record lacks {', '.join(missing)}")
    if not isinstance(record["run_id"], str) or not record["run_id"]:
        raise StoreError(f"run record has run_id {record['run_id']!r}; it must be a name")
    if record["kind"] not in KINDS:
        raise StoreError(f"run {rid}: kind {record['kind']!r} is not one of {', '.join(KINDS)}")
    if record["status"] not in STATUSES:
        raise StoreError(f"run {rid}: status {record['status']!r} is not one of "
                         f"{', '.join(STATUSES)}")
    params = record["params"]
    if not isinstance(params, dict):
        raise StoreError(f"run {rid}: params must be an object")
    missing = [k for k in PARAM_KEYS if k not in params]
    if missing:
        raise StoreError(f"run {rid}: params lack {', '.join(missing)}")
    if record["status"] == "ok" and record["kind"] == "train" and not record["ranks"]:
        raise StoreError(f"run {rid}: status ok but no per-rank figures")
    if record["status"] in ("failed", "timeout") and not record["error"]:
        raise StoreError(f"run {rid}: status {record['status']} needs the error text")


def _parse_line(raw: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("run_id"), str):
        return None
    return rec


def _last_newline(fd: int, size: int) -> int:
    """Offset just past the last newline in the file (0 if none)."""
    end = size
    while end > 0:
        start = max(0, end - 65536)
        chunk = os.pread(fd, end - start, start)
        i = chunk.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        end = start
    return 0


def _repair_tail(fd: int, path: Path) -> int:
    """Make the file end in a newline before appending; return its size afterwards.

    A complete record that only lacks its newline gets one; a torn record (a crash cut the
    write) is cut off, or the next record would glue onto it and damage both.
    """
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    keep = _last_newline(fd, size)
    if _parse_line(os.pread(fd, size - keep, keep)) is not None:
        _write_all(fd, b"\n")
        return size + 1
    log.warning("%s: cutting off a torn last line (%d bytes) left by an interrupted write",
                path, size - keep)
    os.ftruncate(fd, keep)
    return keep


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def append_run(sweep_dir: Path, record: dict[str, Any]) -> None:
    """Append one run record to runs.jsonl and make it durable before returning.

    All or nothing: if the write or fsync fails (a full disk, ENOSPC), the file is cut back
    to its size before the write and StoreError says so.
    """
    sweep_dir = Path(sweep_dir)
    check_record(record)
    if not (sweep_dir / SWEEP_FILE).is_file():
        raise StoreError(f"{sweep_dir} is not a sweep (no {SWEEP_FILE}); create it first")
    own_id = sweep_dir.resolve().name
    if record["sweep_id"] != own_id:
        raise StoreError(f"run {record['run_id']}: record of sweep {record['sweep_id']!r} "
                         f"does not belong in sweep {own_id}")
    line = (_dump(record, f"run {record['run_id']}", separators=(",", ":")) + "\n").encode()
    path = sweep_dir / RUNS_FILE
    with _dir_lock(sweep_dir):
        created = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                size = _repair_tail(fd, path)
                _write_all(fd, line)
                os.fsync(fd)
            except OSError as exc:
                _roll_back(fd, size, path)
                if exc.errno in _FULL:
                    raise StoreError(
                        f"{path}: no space left on the device; run {record['run_id']} was not "
                        "recorded and the file is as it was; free space, then resume the "
                        "sweep") from None
                raise StoreError(f"{path}: cannot record run {record['run_id']}: "
                                 f"{exc.strerror}") from None
        finally:
            os.close(fd)
        if created:
            _fsync_dir(sweep_dir)


def _roll_back(fd: int, size: int, path: Path) -> None:
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    except OSError as exc:  # the caller's error is the one to report; leave a trace of this
        log.error("%s: could not cut back to %d bytes after a failed write: %s", path, size,
                  exc.strerror)


def read_runs(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    """The last record of each run id, in the order those records were written.

    A torn last line (a write cut off by a crash) is skipped with a warning; a line that
    does not parse anywhere else is damage from outside and raises StoreError.
    """
    path = Path(sweep_dir) / RUNS_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise StoreError(f"{path}: cannot read ({exc.strerror})") from None
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends in a newline, as it should
    runs: dict[str, dict[str, Any]] = {}
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        rec = _parse_line(raw)
        if rec is None:
            raise StoreError(f"{path}:{lineno}: not a run record; the store was damaged "
                             "outside scalelab (repair or delete that line)")
        runs.pop(rec["run_id"], None)
        runs[rec["run_id"]] = rec
    if tail:
        rec = _parse_line(tail)
        if rec is None:
            log.warning("%s:%d: skipping a torn last line left by an interrupted write",
                        path, len(lines) + 1)
        else:
            runs.pop(rec["run_id"], None)
            runs[rec["run_id"]] = rec
    return runs


def store_version(sweep_dir: Path) -> int:
    """The schema version of a sweep's store: sweep.json's "schema_version", or for a store
    written before versions were (1-8) the oldest its records' params say
    (settings.store_version_of). A store newer than this scalelab is refused."""
    path = Path(sweep_dir) / SWEEP_FILE
    meta: Any = {}
    with suppress(OSError, ValueError):
        meta = json.loads(path.read_text())
    version = meta.get("schema_version") if isinstance(meta, dict) else None
    if version is None:
        params = [r.get("params") for r in read_runs(Path(sweep_dir)).values()]
        return min((store_version_of(p) for p in params if isinstance(p, dict)), default=1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise StoreError(f"{path}: schema_version {version!r} is not a store version")
    if version > STORE_VERSION:
        raise StoreError(f"{path}: the store is of version {version}, newer than this "
                         f"scalelab reads ({STORE_VERSION}); update scalelab to report it")
    return version


def read_records(sweep_dir: Path) -> list[RunRecord]:
    """The last record of each run, typed and upgraded to this store version: what readers
    see (RunRecord.of)."""
    store_version(sweep_dir)  # refuses a store newer than this scalelab
    return [RunRecord.of(r) for r in read_runs(sweep_dir).values()]


def same_params(stored: Any, planned: dict[str, Any]) -> bool:
    """Whether a stored run's params are the planned ones: a key the store's version did not
    record is what that version ran at (settings.Setting.before; for some, the plan's), and a
    dilation the plan left to the driver (None) is recorded as the k it chose.

    >>> same_params({"nodes": 2}, {"nodes": 2, "accelerator": None, "dilation": None})
    True
    >>> same_params({"nodes": 2, "accelerator": "v100", "dilation": 4.0},
    ...             {"nodes": 2, "accelerator": "v100", "dilation": None})
    True
    >>> same_params({"nodes": 2, "dilation": 4.0}, {"nodes": 2, "dilation": 2.0})
    False
    >>> old = {"nodes": 2, "engine": "ddp", "accelerator": None, "dilation": None}
    >>> same_params(old, {**old, "bucket_cap_mb": 25.0, "fusion_threshold_mb": None})
    True
    >>> same_params(old, {**old, "bucket_cap_mb": 50.0})
    False
    """
    if not isinstance(stored, dict):
        return False
    for r in RECORD:
        if r.key in stored or r.key not in planned:
            continue
        as_planned = isinstance(r.before, Planned)
        stored = {**stored, r.key: planned[r.key] if as_planned else r.old_value(stored)}
    if planned.get("dilation") is None:
        stored = {**stored, "dilation": None}
    return stored == planned


def missing_runs(sweep_dir: Path, plan: Sequence[RunPlan],
                 retry_failed: bool = False) -> list[RunPlan]:
    """The planned runs to (re)do on resume, in plan order (see the module doc for why).

    A stored record whose params differ from the plan's means the plan changed under the
    sweep; that is refused rather than mixed into one report.
    """
    runs = read_runs(sweep_dir)
    redo = RETRIED_WITH_FAILED if retry_failed else RETRIED
    todo = []
    for run in plan:
        rec = runs.get(run.run_id)
        if rec is not None and not same_params(rec.get("params"), run.params):
            raise StoreError(f"run {run.run_id} is stored with other parameters than planned; "
                             "resume with the sweep's own plan (sweep.json) or start a new "
                             "sweep")
        if rec is None or rec.get("status") in redo:
            todo.append(run)
    return todo


def compact(sweep_dir: Path) -> int:
    """Rewrite runs.jsonl with only the last record per run id (atomically); return the
    number of records dropped. Run at the start of a resume, so no run appears twice."""
    sweep_dir = Path(sweep_dir)
    path = sweep_dir / RUNS_FILE
    with _dir_lock(sweep_dir):
        if not path.exists():
            return 0
        lines = sum(1 for raw in path.read_bytes().split(b"\n") if raw.strip())
        runs = read_runs(sweep_dir)
        text = "".join(_dump(r, f"run {r['run_id']}", separators=(",", ":")) + "\n"
                       for r in runs.values())
        try:
            write_atomic(path, text, mode=0o644)
            _fsync_dir(sweep_dir)
        except OSError as exc:
            raise StoreError(f"{path}: cannot compact ({exc.strerror}); the file is as it "
                             "was") from None
    dropped = lines - len(runs)
    if dropped:
        log.info("%s: dropped %d superseded or torn records", path, dropped)
    return dropped
