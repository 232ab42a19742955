"""scalelab tasks: provision, configure, bench, report, destroy.

Thin layer: parse options, call scalelab, turn scalelab errors into one clear line.
Run `invoke --list` for the tasks and `invoke --help TASK` for each one's options.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import shlex
import sys

from invoke import Collection, Exit, task

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# the tasks bundle, configure and image have these modules' names
from scalelab.cluster import bundle as bundles
from scalelab.cluster import configure as cfg
from scalelab.cluster import image as images
from scalelab.cluster import imagebase, provisioning, storage, terraform
from scalelab.cluster.nodes import nodes_of
from scalelab.cluster.targets import DEFAULT_TARGET
from scalelab.cluster.targets.tf import accept_lost_state
from scalelab.core import lock
from scalelab.core.errors import ScalelabError
from scalelab.core.state import check_cluster_name, cluster_dir, list_clusters, load_cluster, reports_dir
from scalelab.model import accel
from scalelab.results import store
from scalelab.run import admission, lifecycle, linkprobe
from scalelab.run.progress import Bar
from scalelab.sweep import planner, sweepfile


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
    "target": "where the cluster lives: local (emulated on this machine), static, openstack, "
              "aws, slurm (a Slurm cluster through its login host)",
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
def provision(c, target=DEFAULT_TARGET, nodes="2", cluster="demo", cpus_per_node="1", bandwidth="native",
              subnet="", var_file="", keep_on_failure=False, dry_run=False):
    """Create or resize a cluster and write inventories/<cluster>.yml."""

    if dry_run:
        for line in provisioning.dry_run(target, nodes, cluster, var_file or None):
            print(line)
        return
    result = provisioning.provision(
        target=target, nodes=nodes, cluster=cluster, cpus_per_node=cpus_per_node,
        bandwidth=bandwidth, subnet=subnet or None, var_file=var_file or None,
        keep_on_failure=keep_on_failure, dry_run=dry_run)
    if result is None:
        return
    _print_nodes(result)
    print(f"inventory: {result.inventory}")


@task(help={"cluster": "name of the cluster to destroy",
            "all_clusters": "destroy every cluster scalelab knows",
            "state_lost": "terraform targets whose terraform.tfstate is lost for good: after "
                          "you deleted what the cluster made (cloud console), remove the rest "
                          "without Terraform; ignored while the state file is there",
            "keep_data": "hosts scalelab did not make (static, Slurm): leave the data sets "
                         "invoke stage wrote there (their web servers still end); refused where "
                         "scalelab made the hosts"})
@friendly
def destroy(c, cluster="demo", all_clusters=False, state_lost=False, keep_data=False):
    """Destroy a cluster: nodes, links, routes, cgroups, processes, state and inventory."""
    if state_lost and all_clusters:
        raise Exit("error: --state-lost is for one cluster: give --cluster NAME, not "
                   "--all-clusters", code=1)

    for name in list_clusters() if all_clusters else [cluster]:
        with lock.hold(name):
            if state_lost:
                accept_lost_state(name)
            done, kept = lifecycle.destroy(reports_dir(), name, keep_data)
        for line in done:
            print(f"{name}: {line}")
        print(f"destroyed {name}")
        for what in kept:
            print(f"  kept on its hosts, on purpose: {what}")


@task(help={"cluster": "show only this cluster"})
@friendly
def status(c, cluster=""):
    """List clusters with their nodes, link rate and whether each node answers."""

    rows = provisioning.status(cluster or None)
    if not rows:
        print("no clusters; create one with: invoke provision --target local --nodes 2")
        return
    for info in rows:
        extra = " ".join(f"{k}={v}" for k, v in info.summary.items())
        print(f"{info.name}: target={info.target} nodes={len(info.nodes)} {extra}".rstrip())
        for n, alive in zip(info.nodes, info.alive, strict=True):
            mark = "up" if alive else "DOWN"
            print(f"  {n.name:<16} {n.role:<6} {n.address:<15} {mark}")


@task(help={"cluster": "cluster to check",
            "links": "also measure every pair of nodes with iperf3 (one pair at a time) and "
                     "flag pairs far below the others: a slow cable or a misconfigured NIC",
            "seconds": "with --links: seconds per pair"})
@friendly
def check(c, cluster="demo", links=False, seconds="1"):
    """Connectivity check: SSH to every node, node-to-node; --links: all-pairs link rates."""

    secs = linkprobe.check_seconds(seconds)  # before anything connects
    if links and not provisioning.configurable(cluster):
        raise Exit(f"error: --links measures every pair over SSH; cluster {cluster} is reached "
                   "through its login host only (its sweeps measure the link inside an "
                   "allocation and record it with each run)", code=1)
    for line in provisioning.connectivity_check(cluster):
        print(line)
    if not links:
        return

    nodes = nodes_of(load_cluster(cluster))
    pairs = len(linkprobe.all_pairs(nodes))
    print(f"measuring {pairs} pairs, one at a time, {secs:g} s each")

    def show(k, total, m) -> None:
        rate = f"{m.mbit:8.1f} Mbit/s" if m.mbit is not None else f"failed: {m.error}"
        print(f"  [{k}/{total}] {m.client} -> {m.server}: {rate}", flush=True)

    with lock.hold(cluster):  # no sweep's rates or iperf3 ports beside these
        results = linkprobe.check_links(nodes, load_cluster(cluster)["known_hosts"],
                                        seconds=secs, progress=show)
    kept = linkprobe.keep(cluster, results, secs)
    print(f"pair rates kept in {kept}: the next sweep's report shows them")
    slow = linkprobe.slow_pairs(results)
    for _, why in slow:
        print(f"SLOW {why}")
    if slow:
        raise Exit(f"error: {len(slow)} of {len(results)} pairs are slow or failed; fix those "
                   "links before trusting a sweep", code=1)
    print(f"links: all {len(results)} pairs within 80 % of the median")


@task(help={"cluster": "cluster whose nodes get the data",
            "name": "the data set's name (a-z, 0-9, -), e.g. imagenet-like",
            "to": "http: one node's disk, served by a web server there (the ranks read it over "
                  "the cluster network); nodes: a copy on every node's own disk; nfs: the "
                  "cluster's NFS share (invoke configure --tags nfs sets it up)",
            "images": "synthetic images in all (default 2000)",
            "classes": "classes (default 1000, ImageNet's)",
            "shard_size": "images per tar shard (default 100)",
            "like": "imagenet: photo-sized JPEGs of about 112 KB each, as ImageNet's (default); "
                    "small: 96-pixel images",
            "node": "with --to http, the node that serves the set (default: the last node); "
                    "with --to nfs, a node that serves it from its own NFS server (NFS-Ganesha) "
                    "rather than the head's share, so that its link can be shaped apart",
            "port": "with --to http: the web server's port (default 8610)",
            "from_dir": "a directory of your own .tar shards on this machine, copied unchanged "
                        "instead of a synthetic set",
            "remove": "remove the set --name (and its web server if no other set needs it)",
            "format": "shards: tar shards (default); folders: class folders of JPEGs (with "
                      "--to nodes, or --to nfs where the nodes mount the share)"})
@friendly
def stage(c, cluster="demo", name="imagenet-like", to="http", images="2000", classes="1000",
          shard_size="100", like="imagenet", node="", port=str(storage.DEFAULT_PORT),
          from_dir="", remove=False, format="shards"):
    """Put a data set where the ranks read it (one node's web server, or every node's disk) and
    print the --data value that reads it."""
    if remove:
        for line in storage.remove_named(cluster, name):
            print(f"{cluster}: {line}")
        return
    req = storage.check_request(name, to, images, classes, shard_size,
                                "" if like == "small" else like, node, port, from_dir, format)
    entry = storage.stage(cluster, req)
    held = (f"{entry['num_shards']} shards" if entry["num_shards"] is not None
            else f"{entry['num_images']} images in class folders")
    print(f"{cluster}: data set {name}: {held} on {', '.join(entry['nodes'])}")
    print(f"read it with: invoke bench --cluster {cluster} --data {shlex.quote(entry['data'])}")


@task(help={"cluster": "cluster to change", "bandwidth": "new link rate, e.g. 1gbit or native"})
@friendly
def shape(c, cluster="demo", bandwidth="native"):
    """Change the link rate of every node without reprovisioning."""

    for line in lifecycle.reshape(reports_dir(), cluster, bandwidth):
        print(f"{cluster}: {line}")
    print(f"{cluster}: bandwidth {bandwidth}")


def _print_nodes(result) -> None:
    print(f"cluster {result.name} ({result.target}): {len(result.nodes)} nodes")
    for n in result.nodes:
        print(f"  {n.name:<16} {n.role:<6} {n.address:<15} cpus={n.cpus:g} gpus={n.gpus}")


# ---------------------------------------------------------------- bench / report / configure

# bench's own options; every other option is a sweep setting (scalelab.sweep.settings)
_BENCH_HELP = {
    "cluster": "cluster to run on (see invoke status)",
    "sweep": "sweep file: a path or a name under bench/sweeps/ (demo, slices, ci); options "
             "override it",
    "dry_run": "print every planned run, the count and an estimated duration; run nothing",
    "resume": "sweep id (or latest) to complete: runs only what its store lacks",
    "retry_failed": "with --resume: run failed and timed-out runs again too",
    "report": "write the HTML report when the sweep ends",
}


def with_setting_options(fn):
    """Give a task one option per sweep setting of the settings table (its help there):
    invoke reads a task's signature, so the signature is made from the table."""
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                               default=s.switch if s.switch is not None else "")
             for name, s in sweepfile.OPTIONS.items()]
    fn.__signature__ = sig.replace(parameters=own + extra)
    return fn


@task(help={**_BENCH_HELP, **{name: s.help for name, s in sweepfile.OPTIONS.items()}},
      auto_shortflags=False)  # 35 options outrun the letters: invoke would print --=STRING
@friendly
@with_setting_options
def bench(c, cluster="demo", sweep="", dry_run=False, resume="", retry_failed=False,
          report=True, **settings):
    """Sweep nodes x batch size x bandwidth x procs per node over ResNet training."""
    asked = {"cluster": cluster, "sweep": sweep, **settings}
    import datetime as dt
    import threading

    root = reports_dir()
    if resume:
        sweep_dir, prep = lifecycle.prepare_resume(root, resume, retry_failed=retry_failed)
        print(f"resuming {sweep_dir.name}: {len(prep.runs)} runs missing")
    else:
        prep = admission.prepare(cluster, _bench_spec(cluster, asked), dry_run=dry_run)
    if dry_run:
        for r in prep.runs:
            print(f"  {r.run_id:<34} {planner.describe(r)}")
        eta = dt.timedelta(seconds=int(prep.estimate_s))
        print(f"{len(prep.runs)} runs on cluster {prep.cluster}, estimated {eta}")
        return
    stop = threading.Event()
    if resume:
        _run_with_bar(prep, lambda update: (sweep_dir, lifecycle.resume(sweep_dir, prep, update,
                                                                         stop)))
    else:
        sweep_dir, _ = _run_with_bar(prep, lambda update: lifecycle.start(prep, root, update,
                                                                          stop))
    if report:
        from scalelab import report as reports  # here: drawing costs every command 0.35 s

        for path in reports.build([sweep_dir]):
            print(f"report: {path}")
    # every result is kept; a script running the sweep must still see that runs failed, this
    # time or in an earlier part of a resumed sweep (the last record of each run counts)

    kept = store.read_records(sweep_dir)
    bad = sum(r.status in ("failed", "timeout") for r in kept)
    if bad:
        raise Exit(f"error: {bad} of {len(kept)} runs failed or timed out (their "
                   f"reasons: the error column of {sweep_dir / 'results.csv'}); invoke bench "
                   f"--resume {sweep_dir.name} --retry-failed runs them again", code=1)


# what the reference experiment may fill in when a command line names nodes but no batch
_REFERENCE_FILLS = ("bandwidth", "precision", "device", "accelerator", "batch_size", "model",
                    "engine", "repeats", "steps")


def _bench_spec(cluster: str, asked: dict):
    """The sweep bench's options ask for: an option not given is None (the sweep file's or
    the default); no options at all is the demo sweep; nodes without a batch is the reference
    experiment, as this cluster can run it (invoke bench --nodes 1-10 is the reference sweep)."""
    opts = {s.key: (asked[name] or None) for name, s in sweepfile.OPTIONS.items()}
    # a switch left at its default is not given (the sweep file's value or the default holds)
    opts.update({s.key: None if asked[name] == s.switch else asked[name]
                 for name, s in sweepfile.OPTIONS.items() if s.switch is not None})
    opts["sweep_file"] = asked["sweep"] or None
    if not (asked["sweep"] or asked["nodes"]):
        opts["sweep_file"] = "demo"
    elif not (asked["sweep"] or asked["batch_size"] or asked["global_batch_size"]):
        fill, line = sweepfile.reference_fill(load_cluster(cluster),
                                              {k: asked[k] for k in _REFERENCE_FILLS})
        opts["bandwidth"] = opts["bandwidth"] or fill.get("bandwidth") or None
        opts["precision"] = opts["precision"] or fill.get("precision") or None
        opts["sweep_file"] = sweepfile.REFERENCE
        print(line, flush=True)
    return sweepfile.spec_from_options(**opts)


def _run_with_bar(prep, go):
    """Run a prepared sweep (go: the progress callback to (sweep directory, counts)) under a
    progress bar; say what it did and where its results are."""

    bar = Bar(len(prep.runs), prep.estimate_s)
    try:
        sweep_dir, counts = go(bar.update)
    finally:
        bar.close()  # before the error line, which must come last and alone
    print(f"sweep {sweep_dir.name}: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
    print(f"results: {sweep_dir / 'results.csv'}")
    return sweep_dir, counts


@task(help={
    "cluster": "cluster to configure (its inventory is inventories/<cluster>.yml)",
    "tags": "only these roles, comma-separated: common, docker_nvidia, nfs, pytorch, horovod, "
            "workloads, jupyterlab, netshape; slurm is installed only when named",
    "check": "check mode: report what would change, change nothing",
    "verify": "afterwards, run playbooks/verify.yml (observable state of every role)",
    "bundle": "install from this offline bundle (made by invoke bundle): for hosts that "
              "cannot reach a package index",
    "image": "load this training image archive (made by invoke image) on every node, with "
             "Docker, for invoke bench --runtime container",
}, auto_shortflags=False)
@friendly
def configure(c, cluster="demo", tags="", check=False, verify=False, bundle="", image=""):
    """Run playbooks/site.yml on a cluster through ansible-runner, record the node facts."""

    def show(p) -> None:
        if line := cfg.format_progress(p):
            print(line, flush=True)

    with lock.hold(cluster):
        result = cfg.run(cluster, tags=tags or None, check=check, progress=show,
                         bundle=bundle or None, image=image or None)
    print(f"{cluster}: configured in {result.duration_s:.0f} s, {result.changed} changes")
    if (cluster_dir(cluster) / "jupyter_token").exists():  # it listens on the head's loopback
        print(f"JupyterLab: {cfg.jupyter_tunnel(cluster)}, then http://127.0.0.1:8888/lab with "
              f"the token in {cluster_dir(cluster) / 'jupyter_token'}")
    if not check:
        for n in load_cluster(cluster)["nodes"]:
            f = n.get("facts") or {}
            gpu = f", {f['gpus']} x {f['gpu_model']}" if f.get("gpus") else ""
            stack = f.get("python") or "no training stack yet"
            print(f"  {n['name']:<16} {f.get('iface') or '?'}  {f.get('cores', '?')} cores, "
                  f"{f.get('memory_mb', 0) // 1024} GiB{gpu}; {stack}")
    if verify:
        cfg.verify(cluster, tags=tags or None, progress=show)
        print(f"{cluster}: verified")


@task(help={
    "wheel_dir": "directories with wheels scalelab built (comma-separated); default: the "
                 "Horovod wheel cache of scripts/build_horovod.sh",
    "force": "build again even when the cache holds an image made of the same inputs",
    "dry_run": "print what the image would be made of and where it would go; build nothing",
    "base": "build on a vendor's image instead of Debian: docker-archive:PATH (what docker save "
            "wrote, e.g. of nvcr.io/nvidia/pytorch) or a tag a Docker engine here holds",
})
@friendly
def image(c, wheel_dir="", force=False, dry_run=False, base=""):
    """Build the training image (Debian + the bundle's wheelhouse + workloads) as an archive."""
    from pathlib import Path

    dirs = [Path(d).expanduser() for d in wheel_dir.split(",") if d.strip()] if wheel_dir else \
        [Path(os.environ.get("SCALELAB_WHEEL_CACHE") or
              Path.home() / ".cache" / "scalelab" / "wheels")]
    constraints = Path(__file__).resolve().parent / "constraints.txt"
    if base:
        if dry_run:
            print(f"image on {base}: its layers as they are, then /opt/scalelab (a venv over its "
                  "Python, Horovod where it lacks one and the wheel fits, bench/workloads)")
            return
        meta = imagebase.build_on_base(base, wheel_dirs=dirs, constraints=constraints,
                                       force=force, progress=lambda line: print(line, flush=True))
    elif dry_run:
        print("\n".join(images.plan(dirs, constraints).describe()))
        return
    else:
        meta = images.build(wheel_dirs=dirs, constraints=constraints, force=force,
                            progress=lambda line: print(line, flush=True))
    print(f"image: {meta['archive']} ({meta['tag']}, {meta['id']}); load it with "
          f"invoke configure --cluster NAME --image {meta['archive']}")


@task(help={
    "out": "directory to write the bundle into (made whole or not at all)",
    "wheel_dir": "more directories with wheels to include (comma-separated); default: the "
                 "Horovod wheel cache of scripts/build_horovod.sh",
})
@friendly
def bundle(c, out="bundle", wheel_dir=""):
    """Build an offline bundle (Debian packages + wheelhouse) for hosts without internet."""
    from pathlib import Path

    dirs = [Path(d).expanduser() for d in wheel_dir.split(",") if d.strip()] if wheel_dir else \
        [Path(os.environ.get("SCALELAB_WHEEL_CACHE") or
              Path.home() / ".cache" / "scalelab" / "wheels")]
    apt, reqs = bundles.default_contents()
    manifest = bundles.build(Path(out), apt_packages=apt, requirements=reqs,
                             constraints=Path(__file__).resolve().parent / "constraints.txt",
                             wheel_dirs=dirs, progress=lambda line: print(line, flush=True))
    print(f"bundle: {Path(out).resolve()} ({len(manifest.get('debs', []))} Debian packages, "
          f"{len(manifest.get('wheels', []))} wheels); use it with "
          f"invoke configure --cluster NAME --bundle {out}")


@task(help={
    "model": "resnet18/34/50/101/152 or resnet20/32/44/56",
    "batch_size": "per-device batch size the profile is for",
    "precision": "fp32 or amp",
    "device": "cuda (a GPU: CUDA events per layer), cpu, or auto",
    "steps": "measured steps; each layer's time is their median",
    "output": "profile file to write (default bench/profiles/measured-MODEL-PRECISION-bBATCH.json)",
    "channels_last": "NHWC memory format, as training with channels_last runs (the fast layout "
                     "for amp on tensor cores; the profile records which it used)",
})
@friendly
def profile(c, model="resnet50", batch_size="64", precision="fp32", device="auto", steps="10",
            output="", channels_last=False):
    """Measure a device profile on this machine (per-layer forward/backward times) for --accelerator."""
    import subprocess

    cmd, tmp, out, what = accel.profile_command(model, batch_size, precision, device, steps,
                                                output, channels_last)
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise Exit(f"error: the profiler failed (exit {proc.returncode}); see above", code=1)
    tmp.replace(out)
    print(f"profile of {what}: {out}; use it with invoke bench --accelerator {out}")


@task(help={
    "sweep": "sweep id, or latest",
    "compare": "several sweep ids, comma-separated, drawn on shared axes",
    "out": "directory to write index.html into (default reports/<id>/)",
    "example": "regenerate the README's example report (reports/example/, from the demo sweep "
               "stored there) and its picture",
    "node_mtbf_hours": "the Failures table's failure rate: each node fails once every this "
                       "many hours on average (default: Llama 3's, 6,335)",
})
@friendly
def report(c, sweep="latest", compare="", out="", example=False, node_mtbf_hours=""):
    """Write a self-contained HTML report of a sweep and print its path."""
    from scalelab import report as reports  # here: drawing costs every command 0.35 s

    mtbf = None
    if node_mtbf_hours:
        try:
            mtbf = float(node_mtbf_hours)
        except ValueError:
            mtbf = float("nan")
        if not 0 < mtbf < 1e9:  # NaN fails this too
            raise Exit(f"error: --node-mtbf-hours {node_mtbf_hours!r} must be a number of hours "
                       "above 0, e.g. 5000", code=1)
    if example:
        print(f"report: {reports.build_example()}")
        return
    ids = [s.strip() for s in compare.split(",") if s.strip()] if compare else [sweep]
    for path in reports.build(ids, out_dir=out or None, compare=bool(compare),
                              node_mtbf_h=mtbf):
        print(f"report: {path}")


# ---------------------------------------------------------------- demo / test / lint

@task(help={"nodes": "nodes in the demo cluster",
            "sweep": "sweep file to run (a name under bench/sweeps/ or a path)",
            "keep": "leave the cluster up afterwards (invoke destroy --cluster NAME removes it)",
            "cluster": "name of the cluster the demo creates; refused if one of that name exists"})
@friendly
def demo(c, nodes="8", sweep="demo", keep=False, cluster="demo"):
    """The main job on the local default: provision, check, bench, report, destroy."""
    from scalelab import report as reports  # here: drawing costs every command 0.35 s

    with lock.hold(check_cluster_name(cluster)):  # held from the check to the destroy
        sweep_dir = _demo(cluster, nodes, sweep, keep)
    for path in reports.build([sweep_dir]):
        print(f"report: {path}")


def _demo(cluster: str, nodes: str, sweep: str, keep: bool):

    # the demo destroys its cluster at the end: never one it did not create
    if cluster in list_clusters():
        raise Exit(f"error: cluster {cluster} already exists and the demo destroys the cluster it "
                   f"runs on; remove it first (invoke destroy --cluster {cluster}) or give the "
                   "demo another name (invoke demo --cluster NAME)", code=1)
    spec = sweepfile.spec_from_options(sweep_file=sweep)  # a bad sweep file fails before provisioning
    result = provisioning.provision(target=DEFAULT_TARGET, nodes=nodes, cluster=cluster,
                                    cpus_per_node="1", bandwidth="native")
    try:
        _print_nodes(result)
        for line in provisioning.connectivity_check(cluster):
            print(line)
        prep = admission.prepare(cluster, spec)
        print(f"sweep {sweep}: {len(prep.runs)} runs, estimated {int(prep.estimate_s // 60)} min "
              f"{int(prep.estimate_s % 60)} s")
        sweep_dir, _ = _run_with_bar(prep, lambda update: lifecycle.start(prep, reports_dir(),
                                                                          update))
    finally:
        if not keep:
            provisioning.destroy(cluster)
            print(f"destroyed {cluster}")
    return sweep_dir


@task(help={"k": "only tests matching this pytest -k expression (lint is skipped)",
            "fast": "skip tests that need root or take long",
            "no_lint": "skip ruff, which runs first otherwise",
            "gpu": "only the GPU tests (tests/test_gpu.py), on a machine with an NVIDIA GPU and "
                   "a CUDA build of torch; refused where torch sees no GPU"})
@friendly
def test(c, k="", fast=False, no_lint=False, gpu=False):
    """Run ruff, then the whole test suite (root for the cluster tests), which lints the rest."""
    if gpu:
        import torch

        if not torch.cuda.is_available():
            raise Exit(f"error: --gpu but this machine's torch {torch.__version__} sees no GPU; "
                       "run it where nvidia-smi lists one, with a CUDA build of torch", code=1)
        c.run(f"{sys.executable} -m pytest -q -rs tests/test_gpu.py", pty=False)
        return
    if not k and not no_lint:  # the quick part first; the suite holds the rest of lint
        c.run(f"{os.path.dirname(sys.executable)}/ruff check scalelab tests bench tasks.py playbooks")
    # where CI's time goes: printed, and per test in junit.xml (bench/perf/suite_time.py)
    args = ["-q", "--durations=40", "--junitxml=test-artifacts/junit.xml"]
    if k:
        args += ["-k", k]
    if fast:
        args += ["-m", "not root and not slow"]
    c.run(f"{sys.executable} -m pytest {' '.join(repr(a) if ' ' in a else a for a in args)}",
          pty=False)


@task
@friendly
def lint(c):
    """ruff, yamllint, ansible-lint (production profile) and terraform fmt -check."""
    from pathlib import Path

    bindir = Path(sys.executable).parent
    c.run(f"{bindir}/ruff check scalelab tests bench tasks.py playbooks")
    # inventories/ holds only generated files, and none on a fresh clone
    yaml_dirs = " ".join(d for d in ("playbooks", "bench/sweeps", "inventories") if Path(d).is_dir())
    c.run(f"{bindir}/yamllint -s {yaml_dirs}")
    c.run(f"{bindir}/ansible-lint --profile production playbooks")
    unformatted = terraform.fmt_check(["terraform"])
    if unformatted:
        raise Exit(f"terraform fmt would change: {', '.join(unformatted)}", code=1)
    print("lint: all clean")


ns = Collection(provision, destroy, status, check, shape, configure, bundle, image, stage, bench, profile,
                report, demo, test, lint)
