"""A sweep from start to finish: started with its record (scalelab.run.sweepmeta) once
scalelab.run.admission has prepared it, resumed after a crash or a stop, and finished; what a
killed driver left behind is ended first, and SIGINT/SIGTERM stop it between runs."""

from __future__ import annotations

import datetime as dt
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scalelab.cluster import netshape, provisioning, ssh, targets
from scalelab.cluster.nodes import nodes_of
from scalelab.core import lock
from scalelab.core.errors import ClusterError, ScalelabError
from scalelab.core.state import cluster_dir, list_clusters, load_cluster
from scalelab.core.units import parse_rate_mbit
from scalelab.results import store
from scalelab.run import admission, reap, sweepmeta
from scalelab.run.admission import Prepared
from scalelab.run.driver import INFLIGHT, SHAPED, Progress, execute, utcnow
from scalelab.run.shaping import UNSET, Shaper
from scalelab.run.warmstart import WARM
from scalelab.sweep import planner, sweepfile

log = logging.getLogger(__name__)


def start(prep: Prepared, reports_root: Path,
          on_progress: Callable[[Progress], None] | None = None,
          stop: threading.Event | None = None) -> tuple[Path, dict[str, int]]:
    """Create the sweep in the store, run every planned run, write results.csv."""
    stop = stop if stop is not None else threading.Event()
    with interrupts_stop(stop), lock.hold(prep.cluster):
        ended, left = end_abandoned(reports_root, prep.cluster)
        if left:  # a new sweep never starts beside a dead one's ranks
            raise ClusterError(f"cluster {prep.cluster}: {left} of the {ended} process groups "
                               "a killed sweep left on the nodes could not be ended (a node "
                               "does not answer?); nothing was started: run the sweep again "
                               "once every node answers, or invoke destroy")
        if ended:
            log.warning("ended %d process groups that a killed driver left on cluster %s",
                        ended, prep.cluster)
        if prep.spec.launcher != "slurm":  # a Slurm sweep's nodes were asked of sinfo
            preflight(prep.cluster, max(r.params["nodes"] for r in prep.runs))
        if stop.is_set():
            raise KeyboardInterrupt  # before anything is written
        sweep_id = planner.new_sweep_id(dt.datetime.now(dt.UTC))
        sweep_dir = store.create_sweep(reports_root, sweep_id, sweepmeta.sweep_meta(prep, sweep_id))
        store.update_latest(reports_root, sweep_id)
        return sweep_dir, _run_and_finish(prep.cluster, sweep_dir, prep.runs, prep.spec,
                                          on_progress, stop)


def end_abandoned(reports_root: Path, cluster: str, retry_s: float = 5.0) -> tuple[int, int]:
    """End what killed drivers left running on this cluster's nodes (ranks, their containers,
    warm-start servers), in every sweep of it that no driver holds now, as --resume would:
    a new sweep never starts beside a dead one's ranks. Returns how many groups were listed
    and how many of them could not be ended (a node that did not answer within retry_s)."""
    rec = load_cluster(cluster)
    ended = left = 0
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
                listed, unended = reap.reap_inflight(marker, rec["known_hosts"], retry_s)
        except store.StoreError:
            continue
        ended, left = ended + listed, left + unended
    return ended, left


def settle(reports_root: Path, cluster: str) -> list[str]:
    """Put back what a killed driver left on the cluster: end its ranks, containers and
    warm-start servers (from the sweeps' inflight notes) and restore the links from the
    snapshot the driver wrote before it shaped them (shaped.json). destroy runs it before the
    cluster's state goes, so nothing a crash left outlives the records that say how to undo it.
    Lines saying what it did; ClusterError if links of hosts scalelab did not make could not be
    restored (the records stay, so it can be tried again)."""
    rec = load_cluster(cluster)
    done = []
    ended, left = end_abandoned(reports_root, cluster, retry_s=20.0)
    if left and not targets.capabilities(rec).owns_hosts:
        raise ClusterError(f"cluster {cluster}: {left} of the {ended} process groups a killed "
                           "sweep left on the nodes could not be ended (a host does not "
                           "answer?); the records stay: run invoke destroy --cluster "
                           f"{cluster} again once every host answers (a host gone for good: "
                           f"delete the {INFLIGHT} and {WARM} files that name it, in the "
                           f"sweeps of {reports_root}, first)")
    if ended:
        done.append(f"ended {ended - left} process groups a killed sweep left on the nodes"
                    + (f" ({left} on nodes that go with the cluster)" if left else ""))
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


def destroy(reports_root: Path, cluster: str,
            keep_data: bool = False) -> tuple[list[str], list[str]]:
    """Destroy a cluster under its lock, after putting back what a killed sweep left while its
    records last (settle); what settle did, and what stays on the hosts on purpose. keep_data
    on a cluster whose hosts scalelab made is refused before anything is touched."""
    with lock.hold(cluster):
        if keep_data and cluster in list_clusters():
            provisioning.check_keep_data(cluster)
        done = settle(reports_root, cluster) if cluster in list_clusters() else []
        return done, provisioning.destroy(cluster, keep_data)


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
    stored = store.load_sweep(reports_root, sweep_id)
    sweep_dir, meta = stored.path, stored.meta
    spec = sweepfile.spec_from_mapping(meta["plan"], f"{sweep_dir}/sweep.json")
    prep = admission.prepare(meta["cluster"], spec)
    todo = store.missing_runs(sweep_dir, prep.runs, retry_failed=retry_failed)
    return sweep_dir, admission.prepared(meta["cluster"], prep.spec, todo)


def resume(sweep_dir: Path, prep: Prepared,
           on_progress: Callable[[Progress], None] | None = None,
           stop: threading.Event | None = None) -> dict[str, int]:
    stop = stop if stop is not None else threading.Event()
    with interrupts_stop(stop), lock.hold(prep.cluster):
        with store.hold_sweep(sweep_dir):  # a second resume of the same sweep fails here
            store.compact(sweep_dir)
            rec = load_cluster(prep.cluster)
            reaped = (reap.reap_inflight(sweep_dir / INFLIGHT, rec["known_hosts"])[0]
                      + reap.reap_inflight(sweep_dir / WARM, rec["known_hosts"])[0])
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
        from scalelab.results import frames  # pandas: at a sweep's end, not on every start

        try:
            frames.write_csv(sweep_dir)
        except (ScalelabError, OSError) as exc:
            # e.g. a full disk: when the sweep itself failed, its error is the one to show
            log.log(logging.WARNING if ended else logging.INFO, "results.csv not written: %s",
                    exc)


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
