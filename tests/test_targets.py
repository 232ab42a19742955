"""The Target contract: every target behind one interface, held to the same checks."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
from conftest import ROOT, invoke, unique_name

from scalelab.cluster import facts, targets
from scalelab.cluster.targets import TARGETS, TERRAFORM_TARGETS
from scalelab.core.errors import ClusterError, InputError

METHODS = ("provision", "destroy", "alive", "summary", "adjust_facts", "runtime", "capabilities",
           "dry_run",
           "links", "set_rate", "login", "launchers", "default_partition")
LINK_METHODS = ("snapshot", "apply", "restore", "still_as_left")


def configured_record(name: str, target: str, n: int = 2, gpus: int = 0,
                      iface: str = "ens5") -> dict:
    """A cluster record as configure leaves it (facts on every node)."""
    nodes = []
    for i in range(n):
        f = {"cores": 32, "memory_mb": 256000, "iface": iface, "gpus": gpus,
             "gpu_model": "NVIDIA A100-SXM4-40GB" if gpus else "", "gpu_memory_mb": 40960,
             "python": facts.DEFAULT_PYTHON, "workdir": facts.DEFAULT_WORKDIR, "torch": "2.13.0"}
        nodes.append({"name": f"{name}-n{i}", "address": f"192.0.2.{10 + i}",
                      "private_address": f"198.51.100.{10 + i}",
                      "role": "head" if i == 0 else "worker", "target": target,
                      "ssh_user": "ubuntu", "ssh_port": 22, "ssh_key": "/k", "cpus": 32.0,
                      "gpus": gpus, "iface": iface, "extra": {}, "facts": f})
    return {"name": name, "target": target, "nodes": nodes, "known_hosts": "/kh",
            "configured_at": "2026-11-23T00:00:00Z"}


@pytest.mark.parametrize("name", TARGETS)
def test_every_target_implements_the_interface(name):
    t = targets.get(name)
    assert isinstance(t, targets.Target)
    caps = t.capabilities(configured_record("lab", name))
    assert t.name == name and isinstance(caps, targets.Capabilities)
    assert all(isinstance(v, bool) for v in caps.to_dict().values())
    for m in METHODS:
        assert callable(getattr(t, m)), f"{name} lacks {m}"


@pytest.mark.parametrize("name", TERRAFORM_TARGETS)
def test_real_host_targets_run_what_configure_installed(name):
    t = targets.get(name)
    rec = configured_record("lab", name)
    rt = t.runtime(rec)
    assert (rt.python, rt.workdir, rt.known_hosts) == (facts.DEFAULT_PYTHON,
                                                        facts.DEFAULT_WORKDIR, "/kh")
    caps = t.capabilities(rec)
    assert caps.shape_links and not caps.shares_host_cpus and not caps.stack_from_host
    links = t.links("lab", rec, [])
    assert all(callable(getattr(links, m)) for m in LINK_METHODS)
    with pytest.raises(InputError, match="shaped per run by invoke bench"):
        t.set_rate("lab", 1000.0)
    assert "configured" in t.summary(rec)


@pytest.mark.parametrize("name", TERRAFORM_TARGETS)
def test_an_unconfigured_real_cluster_is_refused_with_the_command_that_fixes_it(name):
    t = targets.get(name)
    rec = configured_record("lab", name)
    for n in rec["nodes"]:
        n.pop("facts")
    with pytest.raises(ClusterError, match="run invoke configure --cluster lab"):
        t.runtime(rec)
    assert not t.capabilities(rec).shape_links
    with pytest.raises(ClusterError, match="run invoke configure --cluster lab"):
        facts.require_configured(rec)


def test_the_local_target_knows_its_nodes_without_configure():
    t = targets.get("local")
    rec = {"name": "demo", "target": "local", "known_hosts": "/kh", "bandwidth_mbit": None,
           "cpus_per_node": 0.5, "nodes": [{"name": "demo-n0", "cpus": 0.5}]}
    rt = t.runtime(rec)
    assert Path(rt.python).name == "python" and Path(rt.workdir) == ROOT
    caps = t.capabilities(rec)
    assert caps.shares_host_cpus and caps.shape_links and caps.stack_from_host
    # nproc inside a node shows the host's cores; the node's share is its quota
    adjusted = t.adjust_facts(rec, rec["nodes"][0], {"cores": 2, "iface": "eth0", "gpus": 0})
    assert adjusted["cores"] == 0.5


def test_unknown_target_is_one_line():
    with pytest.raises(InputError, match="target: 'gcp' is unknown; choose one of local, "
                                         "static, openstack, aws, slurm"):
        targets.get("gcp")


def test_nothing_outside_targets_asks_which_target_it_is_on():
    """No `target == "local"` branches outside scalelab/cluster/targets/ (the interface says it)."""
    pattern = re.compile(r"""(target["'\]]*\s*[!=]=\s*["'](local|static|aws|openstack|slurm)["'])""")
    offenders = []
    for path in sorted((ROOT / "scalelab").rglob("*.py")):
        if "targets" in path.parts:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert offenders == []


def test_facts_probe_parses_a_real_probe_of_this_machine():
    """The probe script is plain sh: run it here and read it back."""
    import subprocess

    script = facts.probe_script("127.0.0.1", "/nonexistent/bin/python", str(ROOT))
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    f = facts.parse_probe(out, "/nonexistent/bin/python", str(ROOT))
    assert f["iface"] == "lo" and f["cores"] >= 1 and f["memory_mb"] > 0
    assert f["workdir"] == str(ROOT) and f["python"] == ""  # no torch there: not recorded


def test_slices_dry_run_on_ten_gpu_hosts_plans_everything_with_a_gpu_estimate(tmp_path):
    """The reference experiment on a static cluster of 10 GPU hosts, facts as configure records
    them: every run planned, nothing refused, the ETA from GPU step times."""
    from scalelab.cluster.nodes import Node
    from scalelab.sweep import estimate, planner, sweepfile

    name = unique_name("g")
    state = tmp_path / "state"
    cdir = state / "clusters" / name
    cdir.mkdir(parents=True, mode=0o700)
    rec = configured_record(name, "static", n=10, gpus=1)
    (cdir / "cluster.json").write_text(json.dumps(rec))
    env = {"SCALELAB_HOME": str(state), "SCALELAB_REPORTS": str(tmp_path / "reports"),
           "SCALELAB_INVENTORIES": str(tmp_path / "inv")}
    proc = invoke("bench", "--cluster", name, "--sweep", "slices", "--dry-run", env=env)
    assert proc.returncode == 0, proc.stderr
    spec = sweepfile.load_sweep_file(ROOT / "bench/sweeps/slices.yml")
    runs = planner.plan(spec, [Node.from_dict(n) for n in rec["nodes"]], True, cluster=name)
    gpu = dt.timedelta(seconds=int(estimate.estimate_duration_s(runs, device="gpu")))
    cpu = dt.timedelta(seconds=int(estimate.estimate_duration_s(runs, device="cpu")))
    assert f"{len(runs)} runs on cluster {name}, estimated {gpu}" in proc.stdout
    assert gpu < cpu / 10
    assert len([r for r in runs if r.kind == "train"]) == 180
    assert not (tmp_path / "reports").exists()  # a dry run writes nothing


@pytest.mark.parametrize("name", [t for t in TARGETS if t != "slurm"])
def test_targets_whose_nodes_scalelab_reaches_start_runs_over_ssh_or_slurm(name):
    """The head node is the login host; SSH is the default launcher, Slurm one to ask for."""
    rec = configured_record("lab", name)
    t = targets.get(name)
    assert t.capabilities(rec).configurable and t.launchers(rec) == ("ssh", "slurm")
    assert t.login(rec).name == "lab-n0" and t.default_partition(rec) is None


def test_a_slurm_cluster_behind_a_login_host_runs_jobs_only_and_never_shapes():
    t = targets.get("slurm")
    rec = configured_record("hpc", "slurm")
    rec["login"] = {**rec["nodes"][0], "name": "hpc-login", "address": "203.0.113.5"}
    rec["partition"] = "gpu"
    assert not t.capabilities(rec).configurable and t.launchers(rec) == ("slurm",)
    assert t.login(rec).address == "203.0.113.5" and t.default_partition(rec) == "gpu"
    caps = t.capabilities(rec)
    assert not caps.shape_links and not caps.shares_host_cpus and not caps.ssh_nodes
    links = t.links("hpc", rec, [])
    links.apply(None)
    with pytest.raises(ClusterError):
        links.apply(1000.0)
    with pytest.raises(InputError, match="cannot shape its links"):
        t.set_rate("hpc", 1000.0)
    assert t.runtime(rec).python == facts.DEFAULT_PYTHON


def test_links_scalelab_did_not_make_refuse_a_hop_delay_and_a_loopback_rate_in_one_line():
    """A Slurm cluster's links (NoLinks) and a static cluster's (SshLinks, tc over SSH) take
    neither a per-hop delay nor a rate between one node's ranks: both say so before touching a
    node (a regression would meet loopback only), and leave an unshaped path alone."""
    from scalelab.cluster.netshape import SshLinks
    from scalelab.cluster.nodes import Node
    from scalelab.cluster.targets.slurm import NoLinks
    from scalelab.core.errors import ClusterError

    node = Node("s0", "127.0.0.1", "127.0.0.1", "head", "static", iface="eth0")
    for links in (NoLinks(), SshLinks([node], "/nonexistent/known_hosts")):
        with pytest.raises(ClusterError, match=r"^a per-hop delay is emulated only on links "
                                               r"scalelab made$"):
            links.apply(1000.0, delay_us=40.0)
        with pytest.raises(ClusterError, match=r"loopback of their own \(a local cluster\)$"):
            links.apply_intra(2000.0)
        links.apply_intra(None)
