"""Whether a sweep may run on a cluster, decided here before anything is written.

The static checks of a sweep (a value in range, a setting its engine has, an accelerator
profile for every batch) are the settings table's, run when the spec is built
(scalelab.sweep.settings). What a sweep needs of its cluster is CHECKS below: one row per need,
with when the sweep has it, whether the cluster meets it and the line that refuses it, as a
table to read rather than branches to follow (the rows a spec decides run before planning,
those the planned runs decide after it); the plan's own refusals (node count, memory, a
global batch that does not split, a precision without GPUs) are the planner's, and where the
ranks run is scalelab.cluster.gpu's. Then the deeper checks of a container runtime and of
Slurm, which look at the image and ask the scheduler. Nothing here changes the spec it is given.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scalelab.cluster import ckptstore, facts, slurmctl, storage, targets
from scalelab.cluster import image as images
from scalelab.cluster.nodes import Node, nodes_of
from scalelab.core.errors import InputError
from scalelab.core.state import load_cluster
from scalelab.core.units import format_rate
from scalelab.model import datapath
from scalelab.run import checkpoints, slurm
from scalelab.run.slurm import short_hostname
from scalelab.sweep import estimate, planner, starts, values
from scalelab.sweep.planner import RunPlan
from scalelab.sweep.values import NO_FAILURE, NODE_DISKS, SYNTHETIC

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """A validated sweep, ready to run or to print for --dry-run. Nothing written yet."""

    cluster: str
    spec: Any
    runs: list
    estimate_s: float


def _device(runs: list) -> str:
    """Which default step times estimate the runs: gpu where they train on GPUs (the device
    the plan resolved from the nodes' facts, not nvidia-smi's count)."""
    return "gpu" if any(r.params.get("device") == "cuda" for r in runs) else "cpu"


def layout_hint(runs: list) -> str | None:
    """One line for runs that train on GPUs with fp16 or bf16 in NCHW, the layout PyTorch
    gives by default: on tensor cores it leaves much of the GPU's speed unused, and with it
    how much communication a step can hide.

    >>> from types import SimpleNamespace as R
    >>> gpu = {"device": "cuda", "precision": "amp", "channels_last": False}
    >>> layout_hint([R(kind="train", params=gpu)])[:60]
    'amp on GPUs in NCHW (contiguous): channels_last trained ResN'
    >>> layout_hint([R(kind="train", params={**gpu, "channels_last": True})])
    >>> layout_hint([R(kind="train", params={**gpu, "device": "cpu"})])
    """
    slow = sorted({r.params.get("precision") for r in runs if r.kind == "train"
                   and r.params.get("device") == "cuda"
                   and r.params.get("precision") in ("amp", "bf16")
                   and not r.params.get("channels_last")})
    if not slow:
        return None
    return (f"{' and '.join(slow)} on GPUs in NCHW (contiguous): channels_last trained "
            "ResNet-50 amp 1.7x faster on an H100 (docs/figures.md), and a faster step "
            "hides less communication; add --memory-format channels_last (or both: "
            "--memory-format contiguous,channels_last)")


@dataclass(frozen=True)
class Cluster:
    """What the checks look at: the cluster's record, nodes, capabilities and launchers."""

    name: str
    rec: dict[str, Any]
    nodes: list[Node]
    caps: targets.Capabilities
    launchers: tuple[str, ...]


@dataclass(frozen=True)
class Check:
    """One thing a sweep may need of its cluster."""

    need: str  # what, in words
    asks: Callable[[Any, list[RunPlan]], bool]  # (spec, runs): does the sweep need it
    meets: Callable[[Cluster, Any, list[RunPlan]], bool]  # does the cluster give it
    refusal: Callable[[Cluster, Any, list[RunPlan]], str]  # the one line, with the fix
    planned: bool = False  # decided on the planned runs (else before planning, runs = [])


def _used(c: Cluster, runs: list[RunPlan]) -> list[Node]:
    """The nodes the runs take: their own and their dedicated parameter servers'."""
    return c.nodes[:max((r.params["nodes"] + planner.server_nodes(r.params) for r in runs),
                        default=0)]


def _no_sudo(c: Cluster, runs: list[RunPlan]) -> list[Node]:
    return [n for n in _used(c, runs) if (n.facts or {}).get("sudo") == "no"]


def slurm_tasks(c: Cluster, runs: list[RunPlan]) -> dict[str, tuple[int, str]]:
    """The most tasks any run's job step starts on each node (its ranks, and a colocated
    parameter server; a dedicated server's node one; Horovod's one, horovodrun starting the
    ranks), and the run that does: what Slurm must have CPUs for.

    >>> from types import SimpleNamespace as N
    >>> ns = [N(name=f"n{i}") for i in range(3)]
    >>> c = Cluster("lab", {}, ns, None, ("ssh", "slurm"))
    >>> runs = [N(run_id="col", params={"nodes": 2, "procs_per_node": 2, "engine": "ps",
    ...                                  "ps_placement": "colocated"}),
    ...         N(run_id="ded", params={"nodes": 2, "procs_per_node": 1, "engine": "ps",
    ...                                  "ps_placement": "dedicated", "ps_servers": 1})]
    >>> slurm_tasks(c, runs)
    {'n0': (3, 'run col (2 rank(s) and a colocated server)'), 'n1': (3, 'run col (2 rank(s) and a colocated server)'), 'n2': (1, 'run ded (a parameter server)')}
    """
    out: dict[str, tuple[int, str]] = {}
    for r in runs:
        p = r.params
        ppn = 1 if p.get("engine") == "horovod" else p["procs_per_node"]
        colocated = p.get("engine") == "ps" and p.get("ps_placement") == "colocated"
        why = f"run {r.run_id} ({ppn} rank(s){' and a colocated server' if colocated else ''})"
        places = [(n, ppn + colocated, why) for n in c.nodes[: p["nodes"]]]
        places += [(n, 1, f"run {r.run_id} (a parameter server)")
                   for n in c.nodes[p["nodes"]: p["nodes"] + planner.server_nodes(p)]]
        for n, tasks, said in places:
            if tasks > out.get(n.name, (0, ""))[0]:
                out[n.name] = (tasks, said)
    return out


def _shaped(runs: list[RunPlan]) -> list[float]:
    return sorted({r.params["bandwidth_mbit"] for r in runs} - {None})


def _sudo_refusal(c: Cluster, spec: Any, runs: list[RunPlan]) -> str:
    n = _no_sudo(c, runs)[0]
    return (f"--bandwidth {format_rate(_shaped(runs)[0])}: node {n.name}'s user "
            f"{(n.facts or {}).get('user') or n.ssh_user} may not sudo without a password, "
            "which tc needs to set the rate; use --bandwidth native, or ask the host's admins "
            "for passwordless sudo")


def _node_places(spec: Any) -> list[str]:
    """The checkpoint places a login host cannot reach: each node's disk, a node's server."""
    return [p for p in spec.checkpoint_to or [NODE_DISKS]
            if p == NODE_DISKS or values.served_by(p)]


def _injects(spec: Any) -> bool:
    return any(f != NO_FAILURE for f in spec.inject_failure or [])


CHECKS: tuple[Check, ...] = (
    Check("a launcher the cluster has",
          lambda s, runs: True, lambda c, s, runs: s.launcher in c.launchers,
          lambda c, s, runs: f"cluster {c.name} can only start runs with --launcher "
                             f"{' or '.join(c.launchers)}; it has no SSH to its compute nodes"),
    Check("one worker a node beside server nodes, under Slurm",
          lambda s, runs: s.engine == "ps" and s.launcher == "slurm",
          lambda c, s, runs: all(r.params["procs_per_node"] == 1 for r in runs
                                 if planner.server_nodes(r.params)),
          lambda c, s, runs: "--engine ps --launcher slurm: a job step starts as many tasks "
                             "on every node, and a server node runs one server, so runs with "
                             "dedicated servers take --procs-per-node 1; use it, or "
                             "--ps-placement colocated, or --launcher ssh", planned=True),
    Check("a shared place for checkpoints, where only the login host is reached",
          lambda s, runs: bool(s.checkpoint_every and any(s.checkpoint_every)),
          lambda c, s, runs: c.caps.ssh_nodes or not _node_places(s),
          lambda c, s, runs: f"--checkpoint-to {_node_places(s)[0]}: cluster {c.name} is "
                             "reached only through its Slurm login host, which removes a run's "
                             "checkpoints and reaches no node's own disk or server; give "
                             "--checkpoint-to a directory of the shared file system the login "
                             "host and the nodes see (e.g. your scratch directory)"),
    Check("ranks on the hosts, to kill and restart",
          lambda s, runs: _injects(s), lambda c, s, runs: s.runtime != "container",
          lambda c, s, runs: "--inject-failure: scalelab kills a node's ranks by their pids "
                             "on the host, and ranks in containers are not restarted yet; use "
                             "--runtime host, or leave --inject-failure out"),
    Check("Slurm, for a partition",
          lambda s, runs: bool(s.partition), lambda c, s, runs: s.launcher == "slurm",
          lambda c, s, runs: "partition: only Slurm has partitions; add --launcher slurm (or "
                             "launcher: slurm in the sweep file)"),
    Check("nodes of their own loopback, for an intra-node path",
          lambda s, runs: bool(s.intra_link), lambda c, s, runs: c.caps.own_loopback,
          lambda c, s, runs: f"--intra-link {s.intra_link}: cluster {c.name}'s nodes share a "
                             "loopback with their host, which scalelab does not shape; run on a "
                             "local cluster (invoke provision --target local), or leave "
                             "--intra-link out"),
    # the dilation that carries the path needs the host's rate, measured over a link
    Check("two nodes, to measure the rate an intra-node path is dilated by",
          lambda s, runs: bool(s.intra_link), lambda c, s, runs: len(c.nodes) >= 2,
          lambda c, s, runs: f"--intra-link {s.intra_link}: the host's copy rate, which sets "
                             "the dilation that carries the path, is measured between two nodes "
                             f"and cluster {c.name} has one; provision two or more (invoke "
                             f"provision --cluster {c.name} --nodes 2)"),
    Check("emulated links, for a fabric profile",
          lambda s, runs: s.fabric_profile != "ideal",
          lambda c, s, runs: c.caps.shares_host_cpus,
          lambda c, s, runs: f"--fabric-profile {s.fabric_profile}: a fabric profile stands for "
                             f"a network on emulated links; cluster {c.name}'s nodes are real "
                             "hosts whose NICs already are the fabric, so use --fabric-profile "
                             "ideal", planned=True),
    Check("two ranks on a node, for an intra-node path",
          lambda s, runs: bool(s.intra_link),
          lambda c, s, runs: max((r.params["procs_per_node"] for r in runs), default=1) >= 2,
          lambda c, s, runs: f"--intra-link {s.intra_link}: with one rank per node no two ranks "
                             "share a node; add --procs-per-node 2 or more, or leave "
                             "--intra-link out", planned=True),
    Check("a storage node outside the runs, for a storage rate",
          lambda s, runs: bool(s.storage_bandwidths),
          lambda c, s, runs: c.caps.shape_links and all(
              (node := storage.serving_node(c.nodes, d)) is not None and node not in _used(c, runs)
              for d in s.data if d != SYNTHETIC),
          lambda c, s, runs: "--storage-bandwidth: the rate is a link of a node that serves the "
                             "data and trains no rank; stage the set on a node past the runs' "
                             f"(invoke stage --cluster {c.name} --to http, on the last node by "
                             "default) and sweep fewer nodes than the cluster has, with --data "
                             "the URL it prints", planned=True),
    Check("passwordless sudo, for tc to set a rate",
          lambda s, runs: bool(_shaped(runs)), lambda c, s, runs: not _no_sudo(c, runs),
          _sudo_refusal, planned=True),
)


def refuse(c: Cluster, spec: Any, runs: list[RunPlan], planned: bool) -> None:
    """The first check (of those decided before the plan, or on it) that the sweep needs and
    the cluster does not meet: InputError, its line."""
    for check in CHECKS:
        if check.planned == planned and check.asks(spec, runs) \
                and not check.meets(c, spec, runs):
            raise InputError(check.refusal(c, spec, runs))


def prepare(cluster: str, spec: Any, dry_run: bool = False) -> Prepared:
    """Validate the sweep against the cluster and expand it; writes nothing. The spec given
    is not changed: the one prepared carries the launcher the cluster's default resolves to.
    dry_run: submit no job (a login host's cluster checks a checkpoint place by one)."""
    rec = load_cluster(cluster)
    facts.require_configured(rec)
    target = targets.of(rec)
    c = Cluster(cluster, rec, nodes_of(rec), targets.capabilities(rec),
                tuple(target.launchers(rec)))
    if spec.launcher is None:
        spec = dataclasses.replace(spec, launcher=c.launchers[0])
    refuse(c, spec, [], planned=False)
    runs = planner.plan(spec, c.nodes, c.caps.shape_links, cluster=cluster)
    refuse(c, spec, runs, planned=True)
    hint = layout_hint(runs)
    if hint:
        log.info("%s", hint)
    partition = spec.partition or target.default_partition(rec)
    if runs:
        check_data_sources(c, spec, runs)
    if spec.runtime == "container" and runs:
        check_container_runtime(cluster, rec, spec, runs, c.nodes)
    if spec.launcher == "slurm" and runs:
        # before anything is written or submitted: Slurm answers, the partition holds the nodes
        fix = "" if c.caps.configurable else slurmctl.ADMIN_FIX
        slurmctl.check(cluster, target.login(rec), rec["known_hosts"], partition,
                       [n.name for n in _used(c, runs)], fix=fix, tasks=slurm_tasks(c, runs))
    if runs:  # after Slurm's check: on a login host's cluster this is a job of the nodes
        check_checkpoint_places(c, runs, None if c.caps.ssh_nodes else target.login(rec),
                                partition, by_job=not dry_run)
    return prepared(cluster, spec, runs)


def prepared(cluster: str, spec: Any, runs: list[RunPlan]) -> Prepared:
    """The runs with their estimated duration on this cluster."""
    caps = targets.capabilities(load_cluster(cluster))
    return Prepared(cluster, spec, runs, estimate.estimate_duration_s(
        runs, device=_device(runs), shared_host=caps.shares_host_cpus, warm=_warm(caps, spec)))


def check_container_runtime(cluster: str, rec: dict[str, Any], spec, runs: list,
                            nodes: list[Node]) -> None:
    """--runtime container: the nodes run Docker and hold the cluster's training image, which
    has what the runs need; InputError naming the first gap and its fix, before any run."""
    fix = (f"build one with invoke image and load it with invoke configure --cluster {cluster} "
           "--image ARCHIVE")
    if spec.launcher == "slurm" and not targets.capabilities(rec).configurable:
        # before the image: its fix, invoke configure, is what such a cluster refuses
        raise InputError(f"--runtime container --launcher slurm needs the image unpacked into "
                         f"an OCI bundle on every node, which invoke configure --image makes, "
                         f"and cluster {cluster} is not configured by scalelab; use --runtime "
                         "host")
    img = rec.get("image")
    if not isinstance(img, dict) or not img.get("id"):
        raise InputError(f"--runtime container: cluster {cluster} has no training image; {fix}")
    lacking = images.missing_for(img.get("contents") or {}, sorted({
        r.params["engine"] for r in runs if r.kind == "train"}))
    if lacking:
        raise InputError(f"--runtime container: image {img['tag']} lacks {', '.join(lacking)}, "
                         f"which these runs need; {fix} (an image invoke image built has both)")
    if img.get("workloads") is not None and img["workloads"] != images.workloads_now():
        raise InputError(f"--runtime container: image {img['tag']} holds other workloads than "
                         f"this checkout's bench/workloads; {fix}")
    used = nodes[:max(r.params["nodes"] for r in runs)]
    cuda = any(r.params.get("device") == "cuda" for r in runs)
    if spec.launcher == "slurm":
        check_slurm_containers(cluster, img, runs, used, cuda)
        return
    for n in used:
        f = n.facts or {}
        if not f.get("docker"):
            raise InputError(f"--runtime container: node {n.name} has no Docker engine that "
                             f"{f.get('user') or n.ssh_user} can use; {fix}")
        if (f.get("images") or {}).get(img["tag"]) != img["id"]:
            raise InputError(f"--runtime container: node {n.name} does not hold image "
                             f"{img['tag']} ({img['id'][:19]}); load it with invoke configure "
                             f"--cluster {cluster} --image {img.get('archive') or 'ARCHIVE'}")
        if cuda and "nvidia" not in (f.get("docker_runtimes") or []):
            raise InputError(f"--runtime container: node {n.name}'s Docker has no nvidia runtime, "
                             "so a container cannot see its GPUs; configure it again (the "
                             "docker_nvidia role installs the NVIDIA container toolkit on GPU "
                             "nodes), or run with --runtime host")


def check_slurm_containers(cluster: str, img: dict[str, Any], runs: list, used: list[Node],
                           cuda: bool) -> None:
    """--runtime container --launcher slurm: what Slurm's OCI support (srun --container, with
    runc) can run, and every node's Slurm set up for it with a bundle of the cluster's image;
    InputError naming the first gap."""
    train = [r for r in runs if r.kind == "train"]
    if any(r.params["engine"] == "horovod" for r in train):
        raise InputError("--runtime container --launcher slurm runs DDP only: Horovod's ranks "
                         "in containers are started per node by scalelab over SSH, not by srun; "
                         "use --engine ddp, or --launcher ssh for Horovod in containers")
    if any(r.params["procs_per_node"] > 1 for r in runs):
        raise InputError("--runtime container --launcher slurm: Slurm's OCI support starts one "
                         "task a node in each step (22.05), so use --procs-per-node 1, or "
                         "--launcher ssh for several ranks a node in containers")
    if cuda:
        raise InputError("--runtime container --launcher slurm on GPUs: scalelab's OCI bundle "
                         "carries no NVIDIA hook yet, so its containers would not see the GPUs; "
                         "use --launcher ssh (Docker with the NVIDIA runtime) or --runtime host")
    if any(r.params.get("data", "synthetic") != "synthetic" for r in train):
        raise InputError("--runtime container --launcher slurm reads synthetic data only (the "
                         "bundle binds no data directory); use --launcher ssh for real data")
    bundle = images.bundle_path(img["id"])
    names = [short_hostname(n) for n in used]
    if len(set(names)) < len(names):
        raise InputError("--runtime container --launcher slurm: two nodes share the hostname "
                         f"{next(x for x in names if names.count(x) > 1)} (up to its first dot), "
                         "by which a rank in a container finds its place; use --launcher ssh")
    for n in used:
        f = n.facts or {}
        if (f.get("user") or n.ssh_user) != "root":
            raise InputError(f"--runtime container --launcher slurm: Slurm starts runc as the "
                             f"job's user, {f.get('user') or n.ssh_user} on node {n.name}, and "
                             "scalelab's bundle and oci.conf are for root (rootless runc is not "
                             "set up); use --launcher ssh (Docker) or --runtime host")
        if not f.get("slurm_oci"):
            raise InputError(f"--runtime container --launcher slurm: node {n.name}'s Slurm has "
                             "no container support (no oci.conf beside slurm.conf); invoke "
                             f"configure --cluster {cluster} --tags slurm sets it up (slurm_oci)"
                             ", or ask the cluster's admins")
        if bundle not in (f.get("oci_bundles") or []):
            raise InputError(f"--runtime container --launcher slurm: node {n.name} has no OCI "
                             f"bundle of image {img['tag']} ({bundle}); make it with invoke "
                             f"configure --cluster {cluster} --image "
                             f"{img.get('archive') or 'ARCHIVE'} (after --tags slurm)")



def _warm(caps: targets.Capabilities, spec) -> bool:
    """Whether runs that start without a launcher are forked from warm-start servers."""
    return starts.forks_warm(caps.shares_host_cpus, spec.launcher, spec.runtime,
                              spec.warm_start)


def check_checkpoint_places(c: Cluster, runs: list[RunPlan], login: Node | None = None,
                            partition: str | None = None, by_job: bool = True) -> None:
    """Every node of the runs may write in every shared checkpoint place, and sees what the
    others wrote there: InputError naming the place, the node and the fix, before any run
    (each node's own disk is under the workdir). login: the Slurm login host of a cluster
    whose nodes scalelab does not reach over SSH (the nodes then write in a job of theirs,
    in partition; by_job False, for a dry run: only the login host's side)."""
    places = dict.fromkeys(r.params.get("checkpoint_to") for r in runs
                           if r.kind == "train" and r.params.get("checkpoint_every"))
    for place in places:
        if place in (None, NODE_DISKS):
            continue
        served = values.served_by(place)
        if served:  # a node's own NFS server, started for the sweep
            server = ckptstore.check(c.rec, c.name, served)
            bad = ckptstore.preflight(c.rec, server, _used(c, runs),
                                      storage.workdir_of(server))
            if bad:
                raise InputError(f"--checkpoint-to {place}: {bad[0]}: {bad[1]}; or give nodes "
                                 "(each node's own disk)")
            continue
        if login is None:
            bad = checkpoints.place_problem(_used(c, runs), c.rec["known_hosts"], place)
            if bad:
                raise InputError(f"--checkpoint-to {place}: node {bad[0]} cannot use it "
                                 f"({bad[1]}); give a directory every node mounts and may "
                                 "write (e.g. the cluster's NFS share), or nodes (each node's "
                                 "own disk)")
            continue
        bad = slurm.place_problem_by_job(login, _used(c, runs), c.rec["known_hosts"], place,
                                         partition, secrets.token_hex(8), by_job)
        if bad:
            raise InputError(f"--checkpoint-to {place}: {bad[0]} cannot use it ({bad[1]}); "
                             "give a directory of the shared file system that the login host "
                             "and the nodes see and may write")


def check_data_sources(c: Cluster, spec: Any, runs: list[RunPlan]) -> None:
    """Every real data source is a data set the first node reads, with a shard for every loader
    worker of the largest run: InputError naming the source and the fix, before any run."""
    train = [r for r in runs if r.kind == "train"]
    for source in dict.fromkeys(r.params.get("data") for r in train):
        if source in (None, SYNTHETIC):
            continue
        mine = [r for r in train if r.params.get("data") == source]
        slots = int(max(datapath.loader_slots(r.params.get("loader_workers") or 1,
                                              r.params["nodes"] * r.params["procs_per_node"])
                        for r in mine))
        node = c.nodes[0]
        found = storage.shards_seen(node, c.rec["known_hosts"], source)
        if found.error:
            raise InputError(f"--data {source}: {node.name} cannot read it ({found.error}); "
                             f"{found.fix or 'give a source the nodes reach'}")
        if found.shards is None and spec.accelerator:
            raise InputError(f"--data {source}: an emulated device reads tar shards, and this "
                             "is a set of class folders; stage it as shards (invoke stage "
                             "--from-dir DIR, or make_dataset.py --layout shards)")
        if found.shards is not None and found.shards < slots:
            raise InputError(f"--data {source}: {found.shards} shard(s) for {slots} loader "
                             "workers (ranks x --loader-workers) in the largest run; every "
                             "worker reads whole shards, so stage more shards (invoke stage "
                             "--shard-size smaller) or give fewer --loader-workers")
