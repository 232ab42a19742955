"""One lock per cluster: the commands that change a cluster or measure on it hold it.

provision, configure, shape, bench (and --resume), check --links and destroy each hold their
cluster's lock while they run, so two of them never set each other's link rates, share iperf3
ports or record runs at a rate they did not run at. A second command is refused at once, in one
line naming the holder and since when. The lock is the kernel's (flock on a file under the state
directory): it goes with the process that held it, however that process ended (SIGKILL, OOM,
a closed laptop), so the next command takes it over without a stale lock to clear. The file
keeps the holder's pid, command and start time for the refusal to name.

Held again by the same process (demo provisions, benches and destroys), the lock nests.

The lock file lives where Linux keeps lock files (/run/lock, a tmpfs), named after the state
directory and the cluster, and is removed when its holder lets go: a command, refused or not,
writes nothing in the state directory and leaves nothing behind.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scalelab.core.errors import ClusterError
from scalelab.core.state import check_cluster_name, state_root

LOCK_DIRS = (Path("/run/lock"), Path(tempfile.gettempdir()))
_held: dict[str, list[Any]] = {}  # cluster -> [open lock file, depth], this process's


class ClusterBusy(ClusterError):
    """Another scalelab command holds the cluster."""


def lock_path(cluster: str) -> Path:
    """/run/lock/scalelab-<state directory's digest>-<cluster>.lock: one per cluster of one
    state directory (tests and users with their own SCALELAB_HOME never meet)."""
    home = hashlib.sha256(str(state_root().resolve()).encode()).hexdigest()[:12]
    where = next((d for d in LOCK_DIRS if d.is_dir() and os.access(d, os.W_OK)), LOCK_DIRS[-1])
    return where / f"scalelab-{home}-{check_cluster_name(cluster)}.lock"


def _command() -> str:
    """How this process was started, as a user would recognise it (invoke bench --cluster x)."""
    if not sys.argv or not sys.argv[0]:
        return "python"
    prog = Path(sys.argv[0])
    argv = [prog.parent.name if prog.name == "__main__.py" else prog.name, *sys.argv[1:]]
    text = " ".join(argv)
    return text if len(text) <= 100 else text[:97] + "..."


def holder(cluster: str) -> dict[str, Any] | None:
    """What the lock file says of its last holder (None when it says nothing readable)."""
    try:
        doc = json.loads(lock_path(cluster).read_text() or "null")
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def busy_message(cluster: str, who: dict[str, Any] | None) -> str:
    """The refusal's one line.

    >>> busy_message("lab", {"pid": 4242, "command": "invoke bench --cluster lab",
    ...                      "since": "2026-11-27T17:02:11Z"})
    'cluster lab is in use by `invoke bench --cluster lab` (pid 4242) since 2026-11-27T17:02:11Z; wait for it to finish, or stop it (kill -INT 4242) and run this again'
    >>> busy_message("lab", None)
    'cluster lab is in use by another scalelab command; wait for it to finish and run this again'
    """
    if not who or not isinstance(who.get("pid"), int):
        return (f"cluster {cluster} is in use by another scalelab command; wait for it to "
                "finish and run this again")
    pid = who["pid"]
    return (f"cluster {cluster} is in use by `{who.get('command', '?')}` (pid {pid}) since "
            f"{who.get('since', '?')}; wait for it to finish, or stop it (kill -INT {pid}) and "
            "run this again")


@contextmanager
def hold(cluster: str) -> Iterator[None]:
    """Hold the cluster's lock for the block; ClusterBusy if another process holds it."""
    mine = _held.get(cluster)
    if mine is not None:
        mine[1] += 1
        try:
            yield
        finally:
            mine[1] -= 1
        return
    path = lock_path(cluster)
    fh = _take(path, cluster)
    try:
        since = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "command": _command(), "since": since}) + "\n")
        fh.flush()
        _held[cluster] = [fh, 1]
        yield
    finally:
        _held.pop(cluster, None)
        try:
            path.unlink()  # while held: whoever opens the name next makes a new file
        except OSError:
            pass
        fh.close()  # releases the flock


def _take(path: Path, cluster: str) -> Any:
    """The locked, open lock file; ClusterBusy if another process holds it."""
    while True:
        # not truncated on open: the holder's note must stay for the refusal to read; never
        # through a link another user of this world-writable directory planted
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ClusterError(f"cannot open the lock file {path} ({exc.strerror}); remove it "
                               "if nothing of scalelab's runs, and run this again") from None
        fh = open(fd, "r+")  # noqa: SIM115
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise ClusterBusy(busy_message(cluster, holder(cluster))) from None
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fh
        fh.close()  # the last holder removed this file as it let go: take the new one
