"""Where scalelab keeps cluster state: a gitignored directory, 0700, one folder per cluster."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from scalelab.core.errors import ClusterError, InputError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


def check_cluster_name(name: str) -> str:
    """Cluster names become hostnames, file names and inventory names.

    >>> check_cluster_name("demo")
    'demo'
    """
    if not isinstance(name, str) or not _NAME.match(name) or name.endswith("-"):
        raise InputError(
            f"cluster: {name!r} is not a valid name; use 1-31 lowercase letters, digits and "
            "dashes, starting with a letter (e.g. demo, lab-a)"
        )
    return name


def state_root() -> Path:
    """The state directory: $SCALELAB_HOME, else .scalelab/ in the project."""
    return Path(os.environ.get("SCALELAB_HOME") or PROJECT_ROOT / ".scalelab")


def inventory_dir() -> Path:
    return Path(os.environ.get("SCALELAB_INVENTORIES") or PROJECT_ROOT / "inventories")


def reports_dir() -> Path:
    return Path(os.environ.get("SCALELAB_REPORTS") or PROJECT_ROOT / "reports")


def cluster_dir(name: str) -> Path:
    return state_root() / "clusters" / check_cluster_name(name)


def private_dir(path: Path) -> Path:
    """Create a directory readable by its owner only; so are the folders of the state directory
    above it (state_root and clusters/), whether this call made them or an older scalelab did."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    root = state_root().resolve()
    here = path.resolve()
    for folder in (here, *here.parents):
        if folder != root and root not in folder.parents:
            break
        os.chmod(folder, 0o700)
    return path


def write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    """Write a file whole or not at all (temp file, fsync, rename), with the given mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_cluster(name: str, record: dict[str, Any]) -> Path:
    """Persist a cluster record (target, parameters, nodes) as cluster.json."""
    path = private_dir(cluster_dir(name)) / "cluster.json"
    write_atomic(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def load_cluster(name: str) -> dict[str, Any]:
    path = cluster_dir(name) / "cluster.json"
    if not path.exists():
        known = ", ".join(list_clusters()) or "none"
        raise ClusterError(
            f"cluster {name!r} not found (known: {known}); "
            f"create it with: invoke provision --cluster {name}"
        )
    return json.loads(path.read_text())


def list_clusters() -> list[str]:
    root = state_root() / "clusters"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "cluster.json").exists())
