"""A sweep from start to finish: prepared (checked against the cluster, nothing written),
started with its record and the cluster's links recorded, resumed after a crash or a stop,
and finished; what a killed driver left behind is ended first."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import platform
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.cluster import facts, netshape, provisioning, ssh
from scalelab.cluster.nodes import Node, nodes_of
from scalelab.cluster.targets import base as targets
from scalelab.core import lock
from scalelab.core.errors import ClusterError, InputError, ScalelabError
from scalelab.core.state import cluster_dir, list_clusters, load_cluster
from scalelab.core.units import format_rate, parse_rate_mbit
from scalelab.results import store
from scalelab.run import reap
from scalelab.run.driver import INFLIGHT, SHAPED, Progress, execute, scalelab_commit, utcnow
from scalelab.run.shaping import UNSET, Shaper
from scalelab.run.warmstart import WARM
from scalelab.sweep import planner, starts

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


def reference_fill(cluster: str, given: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """What a command line that names nodes but no batch takes from the reference experiment
    (bench/sweeps/slices.yml): every axis it does not give, as the cluster can run it: links
    at their own rate where the target cannot shape them, fp32 where no GPU computes (amp needs
    one). Returns the options to add (over the reference file) and the one line that says so.
    """
    from scalelab.sweep import sweepfile

    rec = load_cluster(cluster)
    caps = targets.capabilities(rec)
    ref = sweepfile.spec_from_options(sweep_file=sweepfile.REFERENCE)
    fill: dict[str, Any] = {}
    notes = []
    if not given.get("bandwidth") and not caps.shape_links:
        fill["bandwidth"] = "native"
        notes.append("links at their own rate (this cluster cannot shape them)")
    on_gpus = given.get("device") != "cpu" and (
        given.get("accelerator") or any(n.gpus > 0 for n in nodes_of(rec)))
    if not given.get("precision") and not on_gpus and set(ref.precisions) & {"amp", "bf16"}:
        fill["precision"] = "fp32"
        notes.append("fp32 (its amp needs GPUs; these nodes have none)")
    taken = [f"{k.replace('_', '-')} {v}" for k, v in (
        ("batch_size", ",".join(map(str, ref.batch_sizes))), ("model", ref.model),
        ("engine", ref.engine), ("precision", ",".join(ref.precisions)),
        ("bandwidth", ",".join(format_rate(b) for b in ref.bandwidths)),
        ("repeats", ref.repeats), ("steps", ref.steps)) if not given.get(k) and k not in fill]
    line = (f"axes not given come from the reference experiment (bench/sweeps/"
            f"{sweepfile.REFERENCE}.yml): {', '.join(taken)}"
            + (f"; {'; '.join(notes)}" if notes else "") + "; give any of them to override")
    return fill, line


def prepare(cluster: str, spec) -> Prepared:
    """Validate the sweep against the cluster and expand it; writes nothing."""
    from scalelab.sweep import estimate

    rec = load_cluster(cluster)
    facts.require_configured(rec)
    nodes = nodes_of(rec)
    target = targets.of(rec)
    caps = targets.capabilities(rec)
    allowed = target.launchers(rec)
    if spec.launcher is None:
        spec = dataclasses.replace(spec, launcher=allowed[0])
    elif spec.launcher not in allowed:
        raise InputError(f"cluster {cluster} can only start runs with --launcher "
                         f"{' or '.join(allowed)}; it has no SSH to its compute nodes")
    if spec.partition and spec.launcher != "slurm":
        raise InputError("partition: only Slurm has partitions; add --launcher slurm (or "
                         "launcher: slurm in the sweep file)")
    check_intra_link(cluster, spec, caps, len(nodes))
    runs = planner.plan(spec, nodes, caps.shape_links, cluster=cluster)
    shaped = sorted({r.params["bandwidth_mbit"] for r in runs} - {None})
    profile = spec.fabric_profile
    if profile != "ideal" and not caps.shares_host_cpus:
        raise InputError(f"--fabric-profile {profile}: a fabric profile stands for a network "
                         f"on emulated links; cluster {cluster}'s nodes are real hosts whose "
                         "NICs already are the fabric, so use --fabric-profile ideal")
    check_intra_link(cluster, spec, caps, len(nodes), runs)
    no_sudo = [n for n in nodes[:max((r.params["nodes"] for r in runs), default=0)]
               if (n.facts or {}).get("sudo") == "no"]
    if shaped and no_sudo:
        n = no_sudo[0]
        raise InputError(f"--bandwidth {format_rate(shaped[0])}: node {n.name}'s user "
                         f"{(n.facts or {}).get('user') or n.ssh_user} may not sudo without a "
                         "password, which tc needs to set the rate; use --bandwidth native, or "
                         "ask the host's admins for passwordless sudo")
    hint = layout_hint(runs)
    if hint:
        log.info("%s", hint)
    if spec.runtime == "container" and runs:
        check_container_runtime(cluster, rec, spec, runs, nodes)
    if spec.launcher == "slurm" and runs:
        from scalelab.cluster import slurmctl

        # before anything is written or submitted: Slurm answers, the partition holds the nodes
        most = max(r.params["nodes"] for r in runs)
        fix = "" if caps.configurable else slurmctl.ADMIN_FIX
        slurmctl.check(cluster, target.login(rec), rec["known_hosts"],
                       spec.partition or target.default_partition(rec),
                       [n.name for n in nodes[:most]], fix=fix)
    return Prepared(cluster, spec, runs, estimate.estimate_duration_s(
        runs, device=_device(runs), shared_host=caps.shares_host_cpus, warm=_warm(caps, spec)))


def check_intra_link(cluster: str, spec, caps, size: int, runs: list | None = None) -> None:
    """--intra-link shapes the path between emulated GPUs of one node, on nodes whose loopback
    is their own: one line otherwise (the ranks per node once runs are planned)."""
    link = spec.intra_link
    if not link:
        return
    if not spec.accelerator:
        raise InputError(f"--intra-link {link}: the path between the GPUs of a node is "
                         "emulated for emulated GPUs only; add --accelerator (a real node's "
                         "GPUs already are the path), or leave --intra-link out")
    if not caps.own_loopback:
        raise InputError(f"--intra-link {link}: cluster {cluster}'s nodes share a loopback "
                         "with their host, which scalelab does not shape; run on a local "
                         "cluster (invoke provision --target local), or leave --intra-link out")
    if size < 2:  # the dilation that carries it needs the host's rate, measured over a link
        raise InputError(f"--intra-link {link}: the host's copy rate, which sets the dilation "
                         f"that carries the path, is measured between two nodes and cluster "
                         f"{cluster} has one; provision two or more (invoke provision --cluster "
                         f"{cluster} --nodes 2)")
    if runs is not None and max((r.params["procs_per_node"] for r in runs), default=1) < 2:
        raise InputError(f"--intra-link {link}: with one rank per node no two ranks share a "
                         "node; add --procs-per-node 2 or more, or leave --intra-link out")


def check_container_runtime(cluster: str, rec: dict[str, Any], spec, runs: list,
                            nodes: list[Node]) -> None:
    """--runtime container: the nodes run Docker and hold the cluster's training image, which
    has what the runs need; InputError naming the first gap and its fix, before any run."""
    from scalelab.cluster import image as images

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
    from scalelab.cluster import image as images
    from scalelab.run.slurm import short_hostname

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


def sweep_meta(prep: Prepared, sweep_id: str) -> dict[str, Any]:
    from scalelab.sweep import sweepfile

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
    import json

    from scalelab.run import linkprobe

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


def start(prep: Prepared, reports_root: Path,
          on_progress: Callable[[Progress], None] | None = None,
          stop: threading.Event | None = None) -> tuple[Path, dict[str, int]]:
    """Create the sweep in the store, run every planned run, write results.csv."""
    stop = stop if stop is not None else threading.Event()
    with interrupts_stop(stop), lock.hold(prep.cluster):
        ended = end_abandoned(reports_root, prep.cluster)
        if ended:
            log.warning("ended %d process groups that a killed driver left on cluster %s",
                        ended, prep.cluster)
        if prep.spec.launcher != "slurm":  # a Slurm sweep's nodes were asked of sinfo
            preflight(prep.cluster, max(r.params["nodes"] for r in prep.runs))
        if stop.is_set():
            raise KeyboardInterrupt  # before anything is written
        sweep_id = planner.new_sweep_id(dt.datetime.now(dt.UTC))
        sweep_dir = store.create_sweep(reports_root, sweep_id, sweep_meta(prep, sweep_id))
        store.update_latest(reports_root, sweep_id)
        return sweep_dir, _run_and_finish(prep.cluster, sweep_dir, prep.runs, prep.spec,
                                          on_progress, stop)


def end_abandoned(reports_root: Path, cluster: str) -> int:
    """End what killed drivers left running on this cluster's nodes (ranks, their containers,
    warm-start servers), in every sweep of it that no driver holds now, as --resume would:
    a new sweep never starts beside a dead one's ranks. Returns how many groups were listed."""
    rec = load_cluster(cluster)
    ended = 0
    for marker in sorted([*Path(reports_root).glob(f"*/{INFLIGHT}"),
                          *Path(reports_root).glob(f"*/{WARM}")]):
        sweep_dir = marker.parent
        try:
            meta = store.read_meta(sweep_dir)
        except (ScalelabError, OSError):
            continue
        if meta.get("cluster") != cluster:
            continue
        try:
            with store.hold_sweep(sweep_dir):  # a live driver holds its own: left alone
                ended += reap.reap_inflight(marker, rec["known_hosts"], retry_s=5.0)
        except store.StoreError:
            continue
    return ended


def settle(reports_root: Path, cluster: str) -> list[str]:
    """Put back what a killed driver left on the cluster: end its ranks, containers and
    warm-start servers (from the sweeps' inflight notes) and restore the links from the
    snapshot the driver wrote before it shaped them (shaped.json). destroy runs it before the
    cluster's state goes, so nothing a crash left outlives the records that say how to undo it.
    Lines saying what it did; ClusterError if links of hosts scalelab did not make could not be
    restored (the records stay, so it can be tried again)."""
    rec = load_cluster(cluster)
    done = []
    ended = end_abandoned(reports_root, cluster)
    if ended:
        done.append(f"ended {ended} process groups a killed sweep left on the nodes")
    marker = cluster_dir(cluster) / SHAPED
    if not marker.exists():
        return done
    target = targets.of(rec)
    shaper = Shaper(target.links(cluster, rec, nodes_of(rec)), marker=marker)
    left_at = shaper.current
    shaper.restore()
    if marker.exists():
        if targets.capabilities(rec).owns_hosts:
            done.append("links left shaped by a killed sweep could not be restored; the nodes "
                        "go with the cluster")
            return done
        raise ClusterError(f"cluster {cluster}: a killed sweep left the links shaped and they "
                           "could not be put back (a host does not answer?); the records stay: "
                           f"run invoke destroy --cluster {cluster} again once every host answers")
    if left_at is not UNSET:
        done.append(f"links restored from {netshape.describe(left_at)}, as a killed sweep left "
                    "them")
    return done


def destroy(reports_root: Path, cluster: str) -> tuple[list[str], list[str]]:
    """Destroy a cluster under its lock, after putting back what a killed sweep left while its
    records last (settle); what settle did, and what stays on the hosts on purpose."""
    with lock.hold(cluster):
        done = settle(reports_root, cluster) if cluster in list_clusters() else []
        return done, provisioning.destroy(cluster)


def reshape(reports_root: Path, cluster: str, bandwidth: str) -> list[str]:
    """invoke shape: one rate on every link, after what a killed sweep left is put back."""
    parse_rate_mbit(bandwidth)  # a bad rate is refused before anything is touched
    with lock.hold(cluster):
        done = settle(reports_root, cluster)
        provisioning.set_bandwidth(cluster, bandwidth)
    return done


def prepare_resume(reports_root: Path, sweep_id: str,
                   retry_failed: bool = False) -> tuple[Path, Prepared]:
    """The runs of an earlier sweep that its store lacks (or that were interrupted; with
    retry_failed, also those that failed or timed out)."""
    from scalelab.sweep import estimate, sweepfile

    stored = store.load_sweep(reports_root, sweep_id)
    sweep_dir, meta = stored.path, stored.meta
    spec = sweepfile.spec_from_mapping(meta["plan"], f"{sweep_dir}/sweep.json")
    prep = prepare(meta["cluster"], spec)
    todo = store.missing_runs(sweep_dir, prep.runs, retry_failed=retry_failed)
    rec = load_cluster(meta["cluster"])
    caps = targets.capabilities(rec)
    return sweep_dir, Prepared(meta["cluster"], spec, todo, estimate.estimate_duration_s(
        todo, device=_device(todo), shared_host=caps.shares_host_cpus, warm=_warm(caps, spec)))


def resume(sweep_dir: Path, prep: Prepared,
           on_progress: Callable[[Progress], None] | None = None,
           stop: threading.Event | None = None) -> dict[str, int]:
    stop = stop if stop is not None else threading.Event()
    with interrupts_stop(stop), lock.hold(prep.cluster):
        with store.hold_sweep(sweep_dir):  # a second resume of the same sweep fails here
            store.compact(sweep_dir)
            rec = load_cluster(prep.cluster)
            reaped = (reap.reap_inflight(sweep_dir / INFLIGHT, rec["known_hosts"])
                      + reap.reap_inflight(sweep_dir / WARM, rec["known_hosts"]))
        if reaped:
            log.warning("ended %d process groups left by the interrupted driver", reaped)
        if prep.runs and prep.spec.launcher != "slurm":
            preflight(prep.cluster, max(r.params["nodes"] for r in prep.runs))
        if stop.is_set():
            raise KeyboardInterrupt
        return _run_and_finish(prep.cluster, sweep_dir, prep.runs, prep.spec, on_progress,
                               stop)


def _run_and_finish(cluster: str, sweep_dir: Path, runs: list, spec: Any,
                    on_progress, stop) -> dict[str, int]:
    from scalelab.results import frames as results

    ended = False
    try:
        with store.hold_sweep(sweep_dir):
            counts = execute(cluster, sweep_dir, runs, spec.timeout_s, on_progress, stop,
                             netprobe=spec.netprobe,
                             launcher=spec.launcher or "ssh",
                             partition=spec.partition,
                             runtime=spec.runtime,
                             warm_start=spec.warm_start)
            store.finish_sweep(sweep_dir, utcnow())
        ended = True
        return counts
    except OSError as exc:
        # a full disk (ENOSPC) or the like, where the store itself has no word for it
        where = f" ({exc.filename})" if exc.filename else ""
        raise store.StoreError(f"sweep {sweep_dir.name} stopped: {exc.strerror}{where}; every "
                               f"run recorded so far is kept; fix it (free space?), then "
                               f"resume with invoke bench --resume {sweep_dir.name}") from None
    finally:
        try:
            results.write_csv(sweep_dir)
        except (ScalelabError, OSError) as exc:
            # e.g. a full disk: when the sweep itself failed, its error is the one to show
            log.log(logging.WARNING if ended else logging.INFO, "results.csv not written: %s",
                    exc)


def _warm(caps: targets.Capabilities, spec) -> bool:
    """Whether runs that start without a launcher are forked from warm-start servers."""
    return starts.forks_warm(caps.shares_host_cpus, spec.launcher, spec.runtime,
                              spec.warm_start)


@contextmanager
def interrupts_stop(stop: threading.Event) -> Iterator[threading.Event]:
    """While the block runs, SIGINT and SIGTERM set stop instead of raising at once.

    Cleanup (ending process groups over SSH, restoring link rates, committing the record)
    then runs whole: a KeyboardInterrupt in the middle of it would leave ranks running and
    links shaped. Only the main thread can own signal handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    seen = {"n": 0}

    def handler(signum: int, frame: Any) -> None:
        seen["n"] += 1
        stop.set()

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
    if seen["n"] and stop.is_set():
        log.info("stopped by a signal (%d received)", seen["n"])


def preflight(cluster: str, nodes_needed: int) -> None:
    """Before any run: every node the sweep uses must answer SSH; name the first that doesn't."""
    rec = load_cluster(cluster)
    nodes = nodes_of(rec)[:nodes_needed]
    _, errors = ssh.on_each(nodes, lambda n: ssh.run(n, rec["known_hosts"], "true", timeout=15))
    bad = ssh.first_error(nodes, errors)
    if bad:
        raise ClusterError(f"node {bad[0]} does not answer SSH ({bad[1]}); check it with "
                           f"invoke status --cluster {cluster}, or reprovision")


def host_cpus() -> int:
    return os.cpu_count() or 1
