"""What a sweep's manifest (sweep.json) says of the sweep and its cluster, made to be shared:
how each node was reached stays in the cluster's private state."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

from scalelab.cluster import targets
from scalelab.core.state import cluster_dir, load_cluster
from scalelab.run import linkprobe
from scalelab.run.admission import Prepared
from scalelab.run.driver import scalelab_commit, utcnow
from scalelab.sweep import sweepfile


def sweep_meta(prep: Prepared, sweep_id: str) -> dict[str, Any]:
    """sweep.json of a prepared sweep: its plan, cluster, software and planned runs."""
    rec = load_cluster(prep.cluster)
    return {
        "sweep_id": sweep_id, "cluster": prep.cluster, "target": rec["target"],
        "created_at": utcnow(), "finished_at": None, "plan": sweepfile.spec_to_dict(prep.spec),
        "nodes": shareable_nodes(rec), "bandwidth_mbit_cluster": rec.get("bandwidth_mbit"),
        "emulated": targets.capabilities(rec).shares_host_cpus,
        "host_cpus": host_cpus() if targets.capabilities(rec).shares_host_cpus else None,
        "capabilities": targets.capabilities(rec).to_dict(),
        "software": {"scalelab": scalelab_commit(), "python": platform.python_version(),
                     **_terraform_used(rec)},
        "planned_runs": [r.run_id for r in prep.runs],
        # every pair's rate as the last `invoke check --links` measured it (optional)
        **_link_pairs(prep.cluster, rec),
    }


# what a sweep folder, made to be shared, says of each node: how it was reached (its public
# address, login user, key path, bastion) stays in the cluster's private state
SHAREABLE_NODE = ("name", "role", "target", "private_address", "cpus", "gpus", "iface", "facts")
PRIVATE_FACTS = ("user", "sudo")


def shareable_nodes(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The cluster's nodes as a report may show them.

    >>> shareable_nodes({"nodes": [{"name": "a", "role": "head", "address": "203.0.113.5",
    ...     "ssh_user": "alice", "ssh_key": "/home/alice/.ssh/lab", "bastion": "alice@gw",
    ...     "gpus": 1, "facts": {"cores": 8, "user": "alice", "sudo": "yes"}}]})
    [{'name': 'a', 'role': 'head', 'gpus': 1, 'facts': {'cores': 8}}]
    """
    out = []
    for n in rec.get("nodes") or []:
        keep = {k: n[k] for k in SHAREABLE_NODE if k in n}
        if isinstance(keep.get("facts"), dict):
            keep["facts"] = {k: v for k, v in keep["facts"].items() if k not in PRIVATE_FACTS}
        out.append(keep)
    return out


def _terraform_used(rec: dict[str, Any]) -> dict[str, Any]:
    """{"terraform": {"binary", "version"}} when the cluster was applied by Terraform (or
    OpenTofu) and its record says which; {} otherwise.

    >>> _terraform_used({"terraform": {"binary": "/usr/bin/tofu", "version": "1.8.0"}})
    {'terraform': {'binary': 'tofu', 'version': '1.8.0'}}
    >>> _terraform_used({"target": "local"}), _terraform_used({"terraform": {"version": ""}})
    ({}, {})
    """
    meta = rec.get("terraform")
    if not isinstance(meta, dict) or not meta.get("version"):
        return {}
    binary = Path(str(meta.get("binary") or "terraform")).name
    return {"terraform": {"binary": binary, "version": str(meta["version"])}}


def _link_pairs(cluster: str, rec: dict[str, Any]) -> dict[str, Any]:
    """{"link_pairs": doc} from the cluster's last check --links, if it measured these nodes."""
    path = cluster_dir(cluster) / linkprobe.LINKS_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    names = {n["name"] for n in rec.get("nodes", [])}
    pairs = linkprobe.measurements(doc) if isinstance(doc, dict) else []
    if not pairs or any({m.server, m.client} - names for m in pairs):
        return {}  # measured on nodes this cluster no longer has
    return {"link_pairs": doc}




def host_cpus() -> int:
    return os.cpu_count() or 1
