"""scalelab tasks: provision, configure, bench, report, destroy.

Thin layer: parse options, call scalelab, turn scalelab errors into one clear line.
Run `invoke --list` for the tasks and `invoke --help TASK` for each one's options.
"""

from __future__ import annotations

import functools
import logging
import os
import sys

from invoke import Collection, Exit, task

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scalelab.errors import ScalelabError  # noqa: E402


def _setup_logging() -> None:
    level = os.environ.get("SCALELAB_LOG", "WARNING").upper()
    logging.basicConfig(level=getattr(logging, level, logging.WARNING),
                        format="%(levelname)s %(name)s: %(message)s")


def friendly(fn):
    """Turn scalelab's domain errors into Exit with one line and a non-zero code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _setup_logging()
        try:
            return fn(*args, **kwargs)
        except ScalelabError as exc:
            raise Exit(f"error: {exc}", code=1) from None
        except KeyboardInterrupt:
            raise Exit("interrupted", code=130) from None

    return wrapper


# ---------------------------------------------------------------- provision / destroy / status

@task(help={
    "target": "where the cluster lives: local (emulated on this machine), static, openstack, aws",
    "nodes": "number of nodes (the first is the head node)",
    "cluster": "cluster name (lowercase letters, digits, dashes)",
    "cpus_per_node": "local: CPU share of each node, fractions allowed (e.g. 0.5)",
    "bandwidth": "local: link rate of every node: 100mbit, 1gbit, 10gbit or native (unshaped)",
    "subnet": "local: IPv4 /24-/16 for the cluster network; default picks a free 10.213.x.0/24",
    "var_file": "terraform targets: a .tfvars.json/.tfvars file with the target's variables",
    "keep_on_failure": "terraform targets: keep what was created when provisioning fails",
    "dry_run": "terraform targets: print the terraform commands and variables, change nothing",
})
@friendly
def provision(c, target="local", nodes="2", cluster="demo", cpus_per_node="1", bandwidth="native",
              subnet="", var_file="", keep_on_failure=False, dry_run=False):
    """Create or resize a cluster and write inventories/<cluster>.yml."""
    from scalelab import provisioning

    result = provisioning.provision(
        target=target, nodes=nodes, cluster=cluster, cpus_per_node=cpus_per_node,
        bandwidth=bandwidth, subnet=subnet or None, var_file=var_file or None,
        keep_on_failure=keep_on_failure, dry_run=dry_run)
    if result is None:
        return
    _print_nodes(result)
    print(f"inventory: {result.inventory}")


@task(help={"cluster": "name of the cluster to destroy",
            "all_clusters": "destroy every cluster scalelab knows"})
@friendly
def destroy(c, cluster="demo", all_clusters=False):
    """Destroy a cluster: nodes, links, routes, cgroups, processes, state and inventory."""
    from scalelab import provisioning
    from scalelab.state import list_clusters

    names = list_clusters() if all_clusters else [cluster]
    for name in names:
        provisioning.destroy(name)
        print(f"destroyed {name}")


@task(help={"cluster": "show only this cluster"})
@friendly
def status(c, cluster=""):
    """List clusters with their nodes, link rate and whether each node answers."""
    from scalelab import provisioning

    rows = provisioning.status(cluster or None)
    if not rows:
        print("no clusters; create one with: invoke provision --target local --nodes 2")
        return
    for info in rows:
        print(f"{info.name}: target={info.target} nodes={len(info.nodes)} "
              f"bandwidth={info.bandwidth} cpus/node={info.cpus_per_node}")
        for n, alive in zip(info.nodes, info.alive, strict=True):
            mark = "up" if alive else "DOWN"
            print(f"  {n.name:<16} {n.role:<6} {n.address:<15} {mark}")


@task(help={"cluster": "cluster to check"})
@friendly
def check(c, cluster="demo"):
    """Connectivity check: SSH to every node with the cluster key, then node-to-node."""
    from scalelab import provisioning

    for line in provisioning.connectivity_check(cluster):
        print(line)


@task(help={"cluster": "cluster to change", "bandwidth": "new link rate, e.g. 1gbit or native"})
@friendly
def shape(c, cluster="demo", bandwidth="native"):
    """Change the link rate of every node without reprovisioning."""
    from scalelab import provisioning

    provisioning.set_bandwidth(cluster, bandwidth)
    print(f"{cluster}: bandwidth {bandwidth}")


def _print_nodes(result) -> None:
    print(f"cluster {result.name} ({result.target}): {len(result.nodes)} nodes")
    for n in result.nodes:
        print(f"  {n.name:<16} {n.role:<6} {n.address:<15} cpus={n.cpus:g} gpus={n.gpus}")


# ---------------------------------------------------------------- demo / test / lint

@task(help={"nodes": "nodes in the demo cluster", "keep": "leave the cluster up afterwards"})
@friendly
def demo(c, nodes="3", keep=False):
    """The main job on the local default: provision, check, (bench, report), destroy."""
    from scalelab import provisioning

    result = provisioning.provision(target="local", nodes=nodes, cluster="demo",
                                    cpus_per_node="1", bandwidth="1gbit")
    try:
        _print_nodes(result)
        for line in provisioning.connectivity_check("demo"):
            print(line)
    finally:
        if not keep:
            provisioning.destroy("demo")
            print("destroyed demo")


@task(help={"k": "only tests matching this pytest -k expression",
            "fast": "skip tests that need root or take long"})
def test(c, k="", fast=False):
    """Run the whole test suite (needs root for the cluster tests)."""
    args = ["-q"]
    if k:
        args += ["-k", k]
    if fast:
        args += ["-m", "not root and not slow"]
    c.run(f"{sys.executable} -m pytest {' '.join(repr(a) if ' ' in a else a for a in args)}",
          pty=False)


@task
def lint(c):
    """ruff, yamllint, ansible-lint (production profile) and terraform fmt -check."""
    c.run(f"{sys.executable} -m ruff check scalelab tests bench tasks.py")


ns = Collection(provision, destroy, status, check, shape, demo, test, lint)
