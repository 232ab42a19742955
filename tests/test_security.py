"""Security review, as tests: secrets stay out of every output, keys and state are private,
the report shows results as text, and cloud security groups let in only the operator.

- Cloud credentials and tokens in the operator's environment (AWS_SECRET_ACCESS_KEY,
  OS_PASSWORD, GITHUB_TOKEN, ...) during provision, bench, report, status and check never
  appear in stdout/stderr (DEBUG logging on), reports, results, runs.jsonl, inventories or
  the cluster state, nor in the environment of a job on a node.
- The cluster's private key appears in exactly its two 0600 copies, nowhere else.
- Key files are 0600, cluster state files 0600, their directories 0700.
- The HTML report escapes every text it takes from results and the manifest.
- Terraform security groups: ingress only from the operator CIDR variable (SSH, Jupyter)
  and from inside the cluster; the operator CIDR cannot be the whole internet.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, needs_root, needs_sshd, unique_name
from faults.faultlib import FAKE_SECRETS

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node
from scalelab.run import reap

MODULES = ROOT / "terraform"
OPEN = ("0.0.0.0/0", "::/0")


def run(*args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def key_body(key: Path) -> list[str]:
    """The base64 lines of an OpenSSH private key that are this key's own (what must never
    leak); the first line is the format's header, the same in every ed25519 key."""
    lines = key.read_text().splitlines()
    body = [ln for ln in lines if ln and not ln.startswith("-----")][1:]
    assert len(body) >= 3 and len("".join(body)) > 150
    return body


def files_under(*roots: Path) -> list[Path]:
    out = []
    for root in roots:
        if root.is_file():
            out.append(root)
            continue
        for p in root.rglob("*"):
            if p.is_file() and not p.is_symlink():
                out.append(p)
    return out


def holders(needles: list[str], files: list[Path], max_bytes: int = 64 << 20) -> dict[str, list]:
    found: dict[str, list] = {}
    for f in files:
        if f.stat().st_size > max_bytes:
            continue
        data = f.read_bytes()
        for n in needles:
            if n.encode() in data:
                found.setdefault(n, []).append(str(f))
    return found


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


# ------------------------------------------------------------------ a real cluster and sweep

@pytest.fixture(scope="module")
def secret_run(tmp_path_factory):
    """Provision, check, status, bench (one 2-node run), report: all with fake secrets in
    the environment and DEBUG logging; yields what it made and everything it printed."""
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        pytest.skip("needs root and openssh-server")
    base = tmp_path_factory.mktemp("secure")
    env = {**os.environ, **FAKE_SECRETS, "SCALELAB_LOG": "DEBUG",
           "SCALELAB_HOME": str(base / "state"), "SCALELAB_INVENTORIES": str(base / "inv"),
           "SCALELAB_REPORTS": str(base / "reports")}
    name = unique_name("f")
    sweep = base / "one.yml"
    sweep.write_text("model: resnet20\nnodes: [2]\nbatch_size: 16\nbandwidth: [1gbit]\n"
                     "repeats: 1\nsteps: 3\nwarmup: 1\ntimeout_s: 120\nallreduce_probe: true\n"
                     "allreduce_sizes: [4K]\nallreduce_iters: 2\nnetprobe: true\n")
    outputs = []
    try:
        for args in (("provision", "--cluster", name, "--nodes", "2"),
                     ("check", "--cluster", name), ("status", "--cluster", name),
                     ("bench", "--cluster", name, "--sweep", str(sweep)),
                     ("report", "--sweep", "latest")):
            proc = run(*args, env=env)
            assert proc.returncode == 0, (args, proc.stderr[-2000:])
            outputs.append(proc.stdout + proc.stderr)
        rec = json.loads((base / "state" / "clusters" / name / "cluster.json").read_text())
        # what a job on a node sees: the environment of a session there
        node_env = {n["name"]: ssh.run(Node.from_dict(n), rec["known_hosts"], "env",
                                       timeout=30).stdout for n in rec["nodes"]}
        yield {"base": base, "name": name, "env": env, "outputs": outputs,
               "node_env": node_env, "rec": rec}
    finally:
        run("destroy", "--cluster", name, env=env)


@needs_root
@needs_sshd
@pytest.mark.root
@pytest.mark.slow
def test_secrets_never_reach_logs_reports_results_or_inventories(secret_run):
    base = secret_run["base"]
    secrets = list(FAKE_SECRETS.values())
    printed = "\n".join(secret_run["outputs"])
    assert "DEBUG" in printed  # the most talkative logging was on
    assert not [s for s in secrets if s in printed], "a secret was printed"
    reports = base / "reports"
    sweep_dir = reports / os.readlink(reports / "latest")
    for f in ("runs.jsonl", "results.csv", "sweep.json", "index.html"):
        assert (sweep_dir / f).is_file(), f
    leaked = holders(secrets, files_under(reports, base / "inv", base / "state"))
    assert not leaked, leaked
    # jobs on the nodes do not get the operator's environment
    for node, environ in secret_run["node_env"].items():
        assert "PATH=" in environ
        assert not [s for s in secrets if s in environ], f"a session on {node}"


@needs_root
@needs_sshd
@pytest.mark.root
@pytest.mark.slow
def test_private_key_is_only_in_its_two_private_copies(secret_run):
    base, name = secret_run["base"], secret_run["name"]
    cdir = base / "state" / "clusters" / name
    body = key_body(cdir / "id_ed25519")
    printed = "\n".join(secret_run["outputs"])
    assert not [ln for ln in body if ln in printed]
    found = holders(body, files_under(base / "reports", base / "inv", base / "state"))
    where = {f for files in found.values() for f in files}
    assert where == {str(cdir / "id_ed25519"), str(cdir / "node-shared" / "id_ed25519")}, where
    for f in where:
        assert mode(Path(f)) == 0o600, f
    # the inventory names the key file; it never holds the key
    inv = (base / "inv" / f"{name}.yml").read_text()
    assert str(cdir / "id_ed25519") in inv


@needs_root
@needs_sshd
@pytest.mark.root
@pytest.mark.slow
def test_key_and_state_files_are_private(secret_run):
    base, name = secret_run["base"], secret_run["name"]
    cdir = base / "state" / "clusters" / name
    assert mode(cdir) == 0o700
    for f in ("cluster.json", "id_ed25519", "known_hosts"):
        assert mode(cdir / f) == 0o600, f
    for d in ("nodes", "node-shared"):
        assert mode(cdir / d) == 0o700, d
    assert mode(cdir / "node-shared" / "id_ed25519") == 0o600
    for node in cdir.glob("nodes/*"):
        assert mode(node) == 0o700, node
        assert mode(node / "ssh_host_ed25519_key") == 0o600, node
        assert mode(node / "upper" / "etc" / "ssh" / "ssh_host_ed25519_key") == 0o600
        assert mode(node / "upper" / "root" / ".ssh") == 0o700
        assert mode(node / "upper" / "root" / ".ssh" / "authorized_keys") == 0o600
    # every private key in the state tree is 0600, and every directory above it is 0700
    # (public keys and logs may be 0644: nobody else can reach them through 0700)
    keys = [p for p in files_under(cdir) if p.stat().st_size < 10_000
            and p.read_bytes().startswith(b"-----BEGIN")]
    assert len(keys) >= 2 + 2 * len(list(cdir.glob("nodes/*")))
    for k in keys:
        assert mode(k) == 0o600, k
        for d in k.parents:
            if d == cdir.parent:
                break
            # a node's upper layer is its "/", 0755 as any root directory; the node's own
            # directory above it stays 0700
            assert mode(d) & 0o077 == 0 or "/upper/" in str(d) or d.name == "upper", d
    # the ranks' process groups in flight are noted privately too
    sweep_dir = base / "reports" / os.readlink(base / "reports" / "latest")
    assert not (sweep_dir / ".inflight.json").exists()


def test_inflight_note_is_private(tmp_path):

    path = tmp_path / ".inflight.json"
    reap.save_inflight(path, [{"node": {"name": "a"}, "pgid": 4242, "token": "ab"}])
    assert mode(path) == 0o600


# ------------------------------------------------------------------ the report escapes

HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>&amp;\"'"


def test_report_shows_hostile_result_text_as_text(tmp_path):
    from scalelab.results import synthetic

    reports = tmp_path / "reports"
    sweep_dir = synthetic.synthetic_sweep(reports, "hostile", nodes=(1, 2), repeats=1,
                                        batch_sizes=(16,), bandwidths=(1000.0,),
                                        failed=[f"rank 0 exit 1: RuntimeError: {HOSTILE}"])
    meta = json.loads((sweep_dir / "sweep.json").read_text())
    meta["cluster"] = f"lab{HOSTILE}"
    meta["plan"]["description"] = HOSTILE
    meta["software"] = {"torch": HOSTILE}
    meta["nodes"][0]["name"] = f"n0{HOSTILE}"
    meta["planned_runs"].append(f"train-missing{HOSTILE}")
    (sweep_dir / "sweep.json").write_text(json.dumps(meta))
    proc = subprocess.run([sys.executable, "-m", "invoke", "report", "--sweep", "hostile"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SCALELAB_REPORTS": str(reports)})
    assert proc.returncode == 0, proc.stderr
    page = (sweep_dir / "index.html").read_text()
    lower = page.lower()
    # no markup from the results: no script element at all, no injected image or handler
    assert "<script" not in lower
    assert "<img src=x" not in lower and "onerror=alert" not in lower.replace("onerror=alert(1)&gt;", "")
    escaped = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"
    assert escaped in page, "the failed run's error is not shown as text"
    assert page.count(escaped) >= 4  # error, cluster, description, software, node, missing
    assert "&amp;amp;" in page  # '&' escaped once more, not passed through
    # and the page forbids scripts anyway
    assert re.search(r'http-equiv="Content-Security-Policy" content="default-src \'none\'', page)


# ------------------------------------------------------------------ terraform least privilege

def _norm(obj):
    """python-hcl2 (v7+) keeps the quotes of block labels; drop them and its markers."""
    if isinstance(obj, dict):
        return {k.strip('"'): _norm(v) for k, v in obj.items() if k != "__is_block__"}
    if isinstance(obj, list):
        return [_norm(v) for v in obj]
    return obj


def _tf(path: Path) -> dict:
    import hcl2

    with open(path) as fh:
        return _norm(hcl2.load(fh))


def _resources(doc: dict) -> list[tuple[str, str, dict]]:
    out = []
    for block in doc.get("resource", []):
        for rtype, named in block.items():
            for rname, body in named.items():
                out.append((rtype, rname, body))
    return out


def _unquote(v):
    if isinstance(v, str):
        return v.strip('"').removeprefix("${").removesuffix("}")
    return v


def ingress_rules(main_tf: Path) -> list[dict]:
    """Every ingress rule of a module: resource, source, protocol, ports."""
    rules = []
    for rtype, rname, body in _resources(_tf(main_tf)):
        src = None
        if rtype == "aws_vpc_security_group_ingress_rule":
            src = body.get("cidr_ipv4") or body.get("cidr_ipv6") or body.get(
                "referenced_security_group_id") or body.get("prefix_list_id")
        elif rtype == "openstack_networking_secgroup_rule_v2":
            if _unquote(body.get("direction")) != "ingress":
                continue
            src = body.get("remote_ip_prefix") or body.get("remote_group_id")
        elif rtype in ("aws_security_group", "openstack_compute_secgroup_v2"):
            for rule in body.get("ingress", []) + body.get("rule", []):
                for cidr in rule.get("cidr_blocks", []) + rule.get("ipv6_cidr_blocks", []) + \
                        [rule.get("cidr")]:
                    if cidr:
                        rules.append({"resource": f"{rtype}.{rname}", "source": _unquote(cidr),
                                      "protocol": _unquote(rule.get("protocol")),
                                      "from": rule.get("from_port"), "to": rule.get("to_port")})
            continue
        elif rtype == "aws_security_group_rule":
            if _unquote(body.get("type")) != "ingress":
                continue
            src = (body.get("cidr_blocks") or [None])[0] or body.get("source_security_group_id")
        else:
            continue
        rules.append({"resource": f"{rtype}.{rname}", "source": _unquote(src),
                      "protocol": _unquote(body.get("ip_protocol") or body.get("protocol")),
                      "from": body.get("from_port") or body.get("port_range_min"),
                      "to": body.get("to_port") or body.get("port_range_max")})
    return rules


CLOUD_MODULES = ["aws", "openstack"]  # a module that goes missing fails here, never skips


@pytest.mark.parametrize("module", CLOUD_MODULES)
def test_security_groups_admit_only_the_operator_and_the_cluster(module):
    rules = ingress_rules(MODULES / module / "main.tf")
    assert rules, f"terraform/{module} has no ingress rules to check"
    internal = {"var.subnet_cidr", "local.subnet_cidr", "var.vpc_cidr"}
    for r in rules:
        src = str(r["source"])
        assert src not in OPEN and "0.0.0.0/0" not in src and "::/0" not in src, r
        if src == "var.operator_cidr":
            # from outside: named ports only (SSH, Jupyter), never every protocol or port
            assert str(r["protocol"]).lower() == "tcp", r
            assert r["from"] is not None and r["from"] == r["to"], r
        else:
            assert src in internal or "security_group" in src or "secgroup" in src, r
    assert any(r["source"] == "var.operator_cidr" and r["from"] == 22 for r in rules)
    # between nodes: the cluster's own group only (a subnet may hold other machines, and on
    # OpenStack other tenants), and TCP only, except AWS's EFA rule, which EFA needs
    internal_rules = [r for r in rules if r["source"] != "var.operator_cidr"]
    assert internal_rules
    for r in internal_rules:
        assert "secgroup" in str(r["source"]) or "security_group" in str(r["source"]), r
        if not r["resource"].endswith(".efa_self"):
            assert str(r["protocol"]).lower() == "tcp", r


@pytest.mark.parametrize("module", CLOUD_MODULES)
def test_operator_cidr_cannot_be_a_large_part_of_the_internet(module):
    doc = _tf(MODULES / module / "variables.tf")
    var = next(v["operator_cidr"] for v in doc["variable"] if "operator_cidr" in v)
    assert "default" not in var, "operator_cidr must be given, not defaulted"
    conditions = " ".join(str(v.get("condition", "")) for v in var.get("validation", []))
    regexes = re.findall(r'regex\(\s*\\?"(.+?)\\?"\s*,\s*var\.operator_cidr', conditions)
    assert regexes, f"terraform/{module}: operator_cidr has no regex validation: {conditions}"
    pattern = regexes[0].replace("\\\\", "\\")
    for ok in ("203.0.113.7/32", "198.51.100.0/24", "172.16.0.0/16"):
        assert re.search(pattern, ok), (pattern, ok)
    # its message promises "never a large part of the internet": /1 is half of it
    for bad in ("0.0.0.0/0", "10.0.0.0/0", "0.0.0.0/1", "10.0.0.0/8", "172.16.0.0/12"):
        assert not re.search(pattern, bad), (pattern, bad)


# ------------------------------------------------------------------ no input becomes an option

def test_a_var_file_or_record_value_that_would_be_an_ssh_option_runs_nothing(tmp_path):
    """ssh_user '-oProxyCommand=touch MARKER' in a static var-file: provision refuses it in one
    line, creates no cluster, and the command never runs. The same user in a node record
    edited on disk: check and status, which SSH and probe the nodes, refuse it the same way.
    (Every node is 127.0.0.1 on a closed port: nothing leaves the machine.)"""
    from test_targets import configured_record

    marker = tmp_path / "marker"
    marker.mkdir()
    evil = f"-oProxyCommand=touch {marker}/pwned"
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    state = tmp_path / "state"
    state.mkdir()
    env = {**os.environ, "SCALELAB_HOME": str(state), "SCALELAB_INVENTORIES": str(tmp_path / "inv"),
           "SCALELAB_REPORTS": str(tmp_path / "reports"), "SCALELAB_LOG": "WARNING"}
    name = unique_name("ev")
    for host_user, top_user in ((evil, "root"), (None, evil)):
        var_file = tmp_path / "lab.tfvars.json"
        second = {"address": "127.0.0.2", **({"ssh_user": host_user} if host_user else {})}
        var_file.write_text(json.dumps({
            "ssh_user": top_user, "ssh_private_key_file": str(key),
            "hosts": [{"address": "127.0.0.1", "role": "head"}, second]}))
        proc = run("provision", "--target", "static", "--cluster", name, "--nodes", "2",
                   "--var-file", str(var_file), env=env, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-2000:]
        assert f"ssh_user '{evil}' is not a user name (it starts with '-', so ssh would " \
               "read it as an option); give the login user" in lines[0]
        assert str(var_file) in lines[0]
        assert ("hosts entry 2" in lines[0]) == bool(host_user)
        assert not (state / "clusters" / name).exists()
        assert list(marker.iterdir()) == []

    cdir = state / "clusters" / name
    cdir.mkdir(parents=True, mode=0o700)
    rec = configured_record(name, "static", n=2)
    rec["known_hosts"] = str(cdir / "known_hosts")
    for n in rec["nodes"]:
        n.update({"address": "127.0.0.1", "private_address": "127.0.0.1", "ssh_port": 9,
                  "ssh_key": str(key), "ssh_user": "root"})
    rec["nodes"][0]["ssh_user"] = evil  # the record, edited on disk
    (cdir / "cluster.json").write_text(json.dumps(rec))
    for args in (["check", "--cluster", name], ["status", "--cluster", name]):
        proc = run(*args, env=env, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, (args, proc.stderr[-2000:])
        assert lines[0] == (
            f"error: {cdir}/cluster.json: node '{name}-n0': ssh_user '{evil}' is not a user name "
            "(it starts with '-', so ssh would read it as an option); scalelab did not write "
            "that value: put back what the var-file or the target gave")
        assert list(marker.iterdir()) == []
