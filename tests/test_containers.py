"""Training in containers, for real: the training image built offline (invoke image), Docker
started on two emulated nodes and the image loaded there (invoke configure --image), DDP and
Horovod sweeps with --runtime container on a shaped link, a rank killed mid-run, a driver
killed mid-sweep, Slurm starting its tasks in containers, and destroy leaving the host as it
was."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, have, invoke, needs_root, needs_sshd, unique_name
from faults import faultlib as fl

from scalelab.cluster import image as images
from scalelab.cluster import ssh
from scalelab.cluster.targets import localhost
from scalelab.cluster.targets.local import LocalCluster
from scalelab.cluster.targets.localhost import CpuCgroup

pytestmark = [needs_root, needs_sshd, pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(not (have("dockerd") and have("mmdebstrap")),
                                 reason="docker.io and mmdebstrap not installed "
                                        "(./bootstrap.sh installs them)")]


@pytest.fixture(scope="module")
def built():
    """The training image, from the cache when its inputs are unchanged."""
    proc = invoke("image", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    archive = Path(proc.stdout.strip().splitlines()[-1].split()[1])
    return archive, images.read_meta(archive)


@pytest.fixture(scope="module")
def dcluster(built):
    """Two emulated nodes with Slurm, Docker and the training image; destroyed at the end."""
    lc = LocalCluster(unique_name("d"))
    lc.provision(2)
    try:
        # Slurm first, with its OCI support (oci.conf): loading the image then also unpacks
        # it into the bundle srun --container runs
        proc = invoke("configure", "--cluster", lc.name, "--tags", "slurm", timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        _configure(lc, built[0])
        yield lc
    finally:
        lc.destroy()


def _configure(lc: LocalCluster, archive: Path) -> None:
    """invoke configure --tags docker_nvidia --image, as a user loads the image."""
    proc = invoke("configure", "--cluster", lc.name, "--tags", "docker_nvidia", "--image",
                  str(archive), timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-2000:])


def _docker_ps(lc: LocalCluster) -> dict[str, list[str]]:
    """Every container on each node, running or not (names)."""
    rec = lc.load()
    out = {}
    for n in lc.nodes():
        proc = ssh.run(n, rec["known_hosts"], "docker ps -a --format '{{.Names}}'", timeout=30)
        out[n.name] = proc.stdout.split()
    return out


def _rows(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "results.csv") as fh:
        return list(csv.DictReader(fh))


def _sweep(tmp_path: Path, name: str, **values) -> Path:
    return fl.write_sweep(tmp_path / f"{name}.yml", **values)


def test_the_role_converges_twice_and_every_node_holds_the_image(dcluster, built):
    from scalelab.cluster import configure

    archive, meta = built
    again = configure.run(dcluster.name, tags="docker_nvidia", image=archive)
    assert again.changed == 0, again.stats
    rec = dcluster.load()
    assert rec["image"]["id"] == meta["id"]
    for n in rec["nodes"]:
        assert n["facts"]["docker"], n["name"]
        assert n["facts"]["images"][meta["tag"]] == meta["id"]
    # the engine stays off the host's network set-up: no bridge, no iptables, containers under
    # the node's own CPU share
    settings = json.loads((dcluster.dir / "nodes" / rec["nodes"][0]["name"] / "upper" / "etc"
                           / "docker" / "daemon.json").read_text())
    assert settings["bridge"] == "none" and settings["iptables"] is False
    assert settings["cgroup-parent"] == f"/scalelab/{dcluster.name}/{rec['nodes'][0]['name']}"
    # the image's bytecode is compiled unchecked (README): torch's .pyc is hash-based with
    # check_source off (flags 1, PEP 552), so no rank compiles torch again whatever file times
    # the image's tarball has
    read = ("import importlib.util as u, pathlib, torch; print(int.from_bytes(pathlib.Path("
            "u.cache_from_source(torch.__file__)).read_bytes()[4:8], 'little'))")
    flags = ssh.run(dcluster.nodes()[0], rec["known_hosts"],
                    f"docker run --rm --network host {meta['tag']} python -c \"{read}\"",
                    timeout=120).stdout.strip()
    assert flags == "1", flags


@pytest.mark.parametrize("engine", ["ddp", "horovod"])
def test_ranks_run_in_the_image_on_the_shaped_link(dcluster, built, tmp_path, engine):
    _archive, meta = built
    reports = tmp_path / "reports"
    # the probe stops at 16 MB (the default goes on to 256 MB, 25 s more at 1 Gbit/s): enough
    # to show the collective on the shaped link
    sweep = _sweep(tmp_path, engine, engine=engine, nodes=[2], bandwidth="1gbit", steps=10,
                   allreduce_probe=engine == "ddp", allreduce_sizes=["1M", "16M"],
                   allreduce_iters=5, netprobe=True, timeout_s=300)
    proc = fl.run_bench(dcluster.name, reports, "--sweep", str(sweep), "--runtime", "container",
                        "--no-report", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sweep_dir = fl.latest(reports)
    rows = _rows(sweep_dir)
    train = [r for r in rows if r["run_id"].startswith("train-")]
    assert [r["status"] for r in train] == ["ok"], [r["error"] for r in train]
    for r in rows:
        assert r["runtime"] == "container" and r["image_id"] == meta["id"], r
        # the link the containers used is the shaped one (host networking): the probe saw it
        assert 800 <= float(r["link_mbit_measured"]) <= 1000, r["link_mbit_measured"]
    if engine == "ddp":
        # and so did the collective (the allreduce probe, in containers too): bus bandwidth
        # below 1 Gbit/s, but most of it
        assert 60 <= float(train[0]["busbw_mb_s"]) <= 125, train[0]["busbw_mb_s"]
    recs = fl.records(sweep_dir)
    for rec in recs:
        assert rec["env"]["image"]["id"] == meta["id"]
        if rec["kind"] == "train":
            # the ranks' own interpreter is the image's Debian Python, not the host's
            assert rec["env"]["python"] != ".".join(map(str, sys.version_info[:3])), rec["env"]
    assert recs[-1]["env"]["launcher"] == ("hvdrank" if engine == "horovod" else "direct")
    assert all(not names for names in _docker_ps(dcluster).values())


def _container_rank(lc: LocalCluster, index: int) -> int | None:
    """The rank on a node that runs in a container: in a cgroup below the node's own."""
    cg = CpuCgroup.for_node(lc.name, localhost.node_name(lc.name, index))
    inside = set(cg.subtree_pids()) - set(cg.pids())
    for pid in sorted(inside):
        argv = fl.cmdline(pid).split()
        if len(argv) > 1 and "python" in argv[0] and argv[1].endswith("resnet.py"):
            return pid
    return None


def _cpu_s(pid: int) -> float:
    """CPU seconds a process has used (user + system), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rank_in_its_steps(lc: LocalCluster) -> tuple[int, set[str]]:
    """The containerised rank a background 2-node bench runs on node 1, once it is into its
    steps (it has burnt a second of CPU: importing torch and building the model take less on
    this machine's one-core nodes only when it is training), and the run's containers."""
    pid = fl.wait_for(lambda: _container_rank(lc, 1), 120, "the rank in a container")
    fl.wait_for(lambda: _cpu_s(pid) >= 1.0, 60, "the rank in a container to compute")
    of_run = {c for names in _docker_ps(lc).values() for c in names}
    assert len(of_run) == 2, of_run  # one per node
    return pid, of_run


def test_a_killed_rank_leaves_no_container(dcluster, tmp_path):
    reports = tmp_path / "reports"
    sweep = _sweep(tmp_path, "kill", nodes=[2], repeats=2, steps=80, timeout_s=240)
    proc = fl.start_bench(dcluster.name, reports, "--sweep", str(sweep), "--runtime",
                          "container", "--no-report")
    try:
        pid, of_run = _rank_in_its_steps(dcluster)
        fl.kill_pid(pid)  # the resnet.py rank this sweep started on node 1, in its container
        sweep_dir = fl.wait_for(lambda: fl.latest(reports), 10, "the sweep directory")
        fl.wait_for(lambda: fl.records(sweep_dir), 240, "the failed run's record")
        # once the failed run is recorded, its containers are gone from both nodes (the
        # next run's may have started)
        left = {c for names in _docker_ps(dcluster).values() for c in names}
        assert not left & of_run, left
        out, err = fl.finish(proc, 400)
    finally:
        if proc.poll() is None:
            fl.kill_pid(proc.pid)
            proc.wait(timeout=30)
    assert proc.returncode == 1 and "1 of 2 runs failed" in err, err[-2000:]  # and went on
    failed, ok = fl.records(sweep_dir)
    # the node and the signal, as for host ranks (docker run exits 128 + 9 for its rank)
    assert failed["status"] == "failed", failed
    assert f"{dcluster.name}-n1: exit 137: killed by SIGKILL" in failed["error"], failed["error"]
    assert ok["status"] == "ok", ok["error"]
    assert not any(_docker_ps(dcluster).values())


def test_a_frozen_rank_times_out_and_leaves_no_container(dcluster, tmp_path):
    """A rank stopped mid-run (SIGSTOP: alive, holding its peers, never finishing): the run
    times out, its containers on both nodes are removed by its launch token, and the sweep
    exits 1 for it."""
    reports = tmp_path / "reports"
    # a run's ranks train within seconds of its start here (a 3-step Horovod run on the vendor
    # image takes 5 s from start to record): 30 s leave room to find the rank and freeze it
    sweep = _sweep(tmp_path, "frozen", nodes=[2], steps=400, timeout_s=30)
    proc = fl.start_bench(dcluster.name, reports, "--sweep", str(sweep), "--runtime",
                          "container", "--no-report")
    try:
        pid, _ = _rank_in_its_steps(dcluster)
        os.kill(pid, signal.SIGSTOP)  # the rank this sweep started on node 1: frozen, not gone
        out, err = fl.finish(proc, 300)
    finally:
        if proc.poll() is None:
            fl.kill_pid(proc.pid)
            proc.wait(timeout=30)
    assert proc.returncode == 1 and "1 of 1 runs failed or timed out" in err, err[-2000:]
    (rec,) = fl.records(fl.latest(reports))
    assert rec["status"] == "timeout", (rec["status"], rec["error"])
    assert not any(_docker_ps(dcluster).values()), _docker_ps(dcluster)
    assert _cpu_s(pid) == 0.0 or not Path(f"/proc/{pid}").exists()  # the frozen rank is gone


def test_containers_a_killed_driver_left_are_ended_by_the_next_bench(dcluster, tmp_path):
    reports = tmp_path / "reports"
    sweep = _sweep(tmp_path, "long", nodes=[2], steps=400, timeout_s=600)
    proc = fl.start_bench(dcluster.name, reports, "--sweep", str(sweep), "--runtime",
                          "container", "--no-report")
    try:
        fl.wait_for(lambda: _container_rank(dcluster, 1), 120, "the rank in a container")
        proc.send_signal(signal.SIGKILL)  # the driver this test started, no cleanup
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            fl.kill_pid(proc.pid)
            proc.wait(timeout=30)
    running = _docker_ps(dcluster)
    assert all(running.values()), running  # the dead driver's ranks go on in their containers
    short = _sweep(tmp_path, "short", nodes=[1], steps=2, timeout_s=120)
    done = fl.run_bench(dcluster.name, reports, "--sweep", str(short), "--runtime",
                        "container", "--no-report", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not any(_docker_ps(dcluster).values()), _docker_ps(dcluster)


def _vendor_bases(archive: Path, vendor: Path, bare: Path) -> tuple[Path, Path]:
    """Stand-ins for a vendor's image (no registry here), written in one pass over the
    training image: vendor, its Debian with its venv's packages moved into the system Python's
    dist-packages, where vendor images keep torch, and neither Horovod nor anything of
    scalelab's; bare, Debian only."""
    import tarfile

    site = "opt/scalelab/venv/lib/python3.11/site-packages/"
    dist = "usr/local/lib/python3.11/dist-packages/"
    layers = {out: out.with_suffix(".layer.tar") for out in (vendor, bare)}
    with tarfile.open(archive) as outer:
        name = next(m.name for m in outer if m.name.endswith("/layer.tar"))
        with tarfile.open(fileobj=outer.extractfile(name), mode="r|") as src, \
                tarfile.open(layers[vendor], "w", format=tarfile.PAX_FORMAT) as dv, \
                tarfile.open(layers[bare], "w", format=tarfile.PAX_FORMAT) as db:
            for m in src:
                path = m.name.removeprefix("./")
                if path.startswith(("opt/scalelab", ".scalelab")) and not path.startswith(site):
                    continue
                # a long name lives in the member's pax header, which would win over .name
                m.pax_headers = {k: v for k, v in m.pax_headers.items()
                                 if k not in ("path", "linkpath")}
                data = src.extractfile(m).read() if m.isreg() else None
                if not path.startswith(site):
                    for dst in (dv, db):
                        dst.addfile(m, io.BytesIO(data) if data is not None else None)
                    continue
                rest = path[len(site):]
                if rest.startswith(("horovod", "Horovod")):
                    continue
                m.name = dist + rest
                if m.islnk():
                    m.linkname = dist + m.linkname.removeprefix("./")[len(site):]
                dv.addfile(m, io.BytesIO(data) if data is not None else None)
    for out, layer in layers.items():
        images.write_archive(layer, out, "vendor/pytorch:stand-in", {}, "2026-01-01T00:00:00Z")
        layer.unlink()
    return vendor, bare


def test_slurm_starts_its_tasks_in_containers_of_the_image(dcluster, built, tmp_path):
    """--launcher slurm --runtime container: the slurm role gives Slurm its OCI support (runc,
    oci.conf), configure --image then unpacks the image into a bundle on every node, and a
    2-node DDP sweep at a shaped rate runs as Slurm jobs whose tasks are containers of the
    image: each rank is pid 1 of its own pid namespace, runs the image's Python, and used the
    shaped link. What Slurm's containers cannot run is refused in one line."""
    _archive, meta = built
    rec, bundle = dcluster.load(), images.bundle_path(meta["id"])
    for n in dcluster.nodes():
        check = ssh.run(n, rec["known_hosts"], f"test -x {bundle}/rootfs{images.PYTHON} && "
                        f"cat {bundle}/config.json", timeout=30).stdout
        cfg = json.loads(check)
        # the host's network (shaped), the image's root read-only and its own environment, a
        # cgroup below the node's own (its CPU share), and the staged profiles bound in
        assert {x["type"] for x in cfg["linux"]["namespaces"]} == {"pid", "mount"}, cfg["linux"]
        assert cfg["root"] == {"path": "rootfs", "readonly": True}
        assert f"PATH={images.PREFIX}/venv/bin" in " ".join(cfg["process"]["env"])
        node_cg = n.extra["cgroup"].split("/sys/fs/cgroup/cpu", 1)[1]
        assert cfg["linux"]["cgroupsPath"] == f"{node_cg}/scalelab-oci", cfg["linux"]
        assert any(m["destination"].endswith("/bench/workloads/profiles") for m in cfg["mounts"])
    reports = tmp_path / "reports"
    refused = fl.run_bench(dcluster.name, reports, "--nodes", "2", "--batch-size", "8",
                           "--engine", "horovod", "--launcher", "slurm", "--runtime",
                           "container", "--dry-run")
    err = refused.stderr.strip().splitlines()
    assert refused.returncode != 0 and len(err) == 1 and "runs DDP only" in err[0], err
    sweep = _sweep(tmp_path, "slurm", engine="ddp", nodes=[2], bandwidth="1gbit", steps=5,
                   allreduce_probe=True, allreduce_sizes=["1M", "16M"], allreduce_iters=5,
                   netprobe=True, timeout_s=300)
    proc = fl.run_bench(dcluster.name, reports, "--sweep", str(sweep), "--launcher", "slurm",
                        "--runtime", "container", "--no-report", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sweep_dir = fl.latest(reports)
    (row,) = _rows(sweep_dir)
    assert row["status"] == "ok", row["error"]
    assert row["runtime"] == "container" and row["image_id"] == meta["id"], row
    assert row["launcher"] == "slurm" and row["slurm_job_id"], row
    assert 800 <= float(row["link_mbit_measured"]) <= 1000, row["link_mbit_measured"]
    # the collective in Slurm's containers (the allreduce probe, a job of its own) saw it too
    assert 60 <= float(row["busbw_mb_s"]) <= 125, row["busbw_mb_s"]
    recs = fl.records(sweep_dir)
    assert sorted((r["kind"], r["status"]) for r in recs) == [("allreduce", "ok"), ("train", "ok")]
    train = next(x for x in recs if x["kind"] == "train")
    assert [rank["pid"] for rank in train["ranks"]] == [1, 1], train["ranks"]
    assert train["env"]["python"] != ".".join(map(str, sys.version_info[:3])), train["env"]
    assert train["env"]["image"]["id"] == meta["id"]
    # Slurm took its containers down with its jobs: runc holds none on any node
    for n in dcluster.nodes():
        left = ssh.run(n, rec["known_hosts"], "runc --root /run/slurm/runc list -q 2>/dev/null",
                       timeout=30).stdout
        assert left.strip() == "", (n.name, left)


def test_an_image_on_a_vendor_base_keeps_its_layers_and_trains(dcluster, built, tmp_path):
    """invoke image --base docker-archive:PATH: the base's layer unchanged and one of
    scalelab's on top; its torch is the base's own, Horovod went in from the wheelhouse, the
    image loads on the head node (configure verifies it in a container) and a rank trains in
    it there. A base without torch is refused in one line."""
    from scalelab.cluster import configure, imagebase

    cache = tmp_path / "cache"
    env = {"SCALELAB_IMAGE_CACHE": str(cache)}
    # the cache keeps the two newest images (README): two older ones built before, and a
    # directory that holds no image, which is not the cache's to remove
    for age, name in ((300, "older"), (200, "newer")):
        (cache / name).mkdir(parents=True)
        (cache / name / images.META).write_text("{}")
        os.utime(cache / name, (time.time() - age, time.time() - age))
    (cache / "notes").mkdir()
    base, bare = _vendor_bases(built[0], tmp_path / "vendor.tar", tmp_path / "bare.tar")
    proc = invoke("image", "--base", f"docker-archive:{base}", env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    archive = Path(proc.stdout.strip().splitlines()[-1].split()[1])
    assert sorted(d.name for d in cache.iterdir()) == sorted(
        [archive.parent.name, "newer", "notes"])
    meta = images.read_meta(archive)
    assert meta["contents"]["torch"] == built[1]["contents"]["torch"]
    assert meta["contents"]["horovod"] and meta["contents"]["horovod_gloo"], meta
    assert meta["base"]["ref"] == f"docker-archive:{base}" and meta["base"]["python"] == "3.11"
    base_entry, base_conf = imagebase.archive_parts(base)
    entry, conf = imagebase.archive_parts(archive)
    assert entry["Layers"][:-1] == base_entry["Layers"] and len(entry["Layers"]) == 2
    assert conf["rootfs"]["diff_ids"][:-1] == base_conf["rootfs"]["diff_ids"]
    assert meta["id"] != built[1]["id"]
    # loaded on the head only (the runs below use no other node), where configure imports torch
    # and Horovod from it in a container
    head = dcluster.nodes()[0].name
    configure.run(dcluster.name, tags="docker_nvidia", image=archive, limit=head)
    assert dcluster.load()["image"]["id"] == meta["id"]
    # one training image per node (README): the one loaded before was removed from the head
    held = ssh.run(dcluster.nodes()[0], dcluster.load()["known_hosts"],
                   "docker image ls --format '{{.Repository}}:{{.Tag}}' " + images.REPO,
                   timeout=30).stdout.split()
    assert held == [meta["tag"]], held
    reports = tmp_path / "reports"
    sweep = _sweep(tmp_path, "onbase", engine="horovod", nodes=[1], steps=3,
                   allreduce_probe=False, netprobe=False, timeout_s=300)
    run = fl.run_bench(dcluster.name, reports, "--sweep", str(sweep), "--runtime", "container",
                       "--no-report", timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    recs = [r for r in fl.records(fl.latest(reports)) if r["kind"] == "train"]
    assert [r["status"] for r in recs] == ["ok"], [r["error"] for r in recs]
    assert recs[0]["env"]["image"]["id"] == meta["id"]

    refused = invoke("image", "--base", f"docker-archive:{bare}", env=env, timeout=600)
    assert refused.returncode != 0
    err = refused.stderr.strip()
    assert len(err.splitlines()) == 1 and "cannot import torch" in err, err


def test_destroy_leaves_no_engine_mount_or_namespace(dcluster):
    """The last test of the module: destroy of the cluster every test above used (its engine
    ran them all) leaves no engine, mount, data-root or namespace."""
    lc = dcluster
    name = localhost.node_name(lc.name, 0)
    engine = [p for p in CpuCgroup.for_node(lc.name, name).subtree_pids()
              if fl.cmdline(p).startswith(("dockerd", "/usr/sbin/dockerd", "containerd"))]
    assert engine, "no engine ran on the node"
    data_root = lc.dir / "nodes" / name / "docker"
    assert (data_root / "overlay2").is_dir()
    proc = subprocess.run([sys.executable, "-m", "invoke", "destroy", "--cluster", lc.name],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert localhost.leftovers(lc.name) == {"netns": [], "links": [], "cgroups": [], "mounts": [],
                                        "state": []}
    assert not [p for p in engine if localhost._state(p) not in ("X", "Z")]
    assert not data_root.exists()
    assert str(lc.dir) not in Path("/proc/mounts").read_text()
