"""The one place that picks a target (the interface itself: scalelab.cluster.targets.interface).

The rest of scalelab never asks which target a cluster is on: it asks the cluster's Target.
A target that cannot do something (shape links before configure has found the interfaces,
change a rate outside a sweep) says so through this interface, in one line with the fix.

Lifecycle: provision -> (configure records node facts) -> bench (runtime, links) -> destroy.
"""

from __future__ import annotations

import importlib
from typing import Any

# the interface lives in scalelab.cluster.targets.interface; its names are part of this module's API
from scalelab.cluster.targets.interface import (  # noqa: F401
    DEFAULT_TARGET,
    TARGETS,
    TERRAFORM_TARGETS,
    Capabilities,
    Links,
    Runtime,
    SshReachable,
    Target,
    runtime_from_facts,
)
from scalelab.cluster.targets.local import LocalCluster
from scalelab.cluster.targets.localhost import leftovers
from scalelab.core.errors import ClusterError, InputError


def get(name: str) -> Target:
    """The Target object of a target name; InputError for an unknown one.

    >>> get("static").name, get("local").capabilities({}).shares_host_cpus
    ('static', True)
    """
    if name not in TARGETS:
        raise InputError(f"target: {name!r} is unknown; choose one of {', '.join(TARGETS)}")
    module = importlib.import_module(
        f"scalelab.cluster.targets.{name if name in ('local', 'slurm') else 'tf'}")
    return module.target(name)


def of(rec: dict[str, Any]) -> Target:
    """The Target of a cluster record (cluster.json)."""
    try:
        return get(rec["target"])
    except KeyError:
        raise ClusterError(f"cluster record {rec.get('name', '?')} names no target; destroy and "
                           "provision it again") from None


def capabilities(rec: dict[str, Any]) -> Capabilities:
    """The capabilities of a cluster record's nodes, as its target declares them."""
    return of(rec).capabilities(rec)


def destroy_unrecorded(cluster: str) -> bool:
    """Remove what a provision that crashed before writing cluster.json left on this machine;
    whether there was any. Only targets that build on this machine can leave such pieces."""

    left = leftovers(cluster)
    # a provision records the cluster before it makes anything, in a directory of this state
    # directory: without that directory or links carrying this cluster's alias, namespaces or
    # cgroups of the same name are another state directory's (or someone's), not to remove
    if left["state"] or left["links"]:
        LocalCluster(cluster).destroy()
        return True
    if any(left.values()):
        found = ", ".join(left["netns"] + left["cgroups"])
        raise ClusterError(f"cluster {cluster} is not recorded in this state directory, but "
                           f"{found} exist; destroy it from the SCALELAB_HOME that made it")
    return False
