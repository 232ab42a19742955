"""Meta-tests that keep the Ansible side honest: lint, documented defaults, prefixed variables,
secrets under no_log, and the netshape role's arithmetic equal to the bench driver's."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalelab.cluster import netshape
from scalelab.cluster.configure import known_tags

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOKS = ROOT / "playbooks"
ROLES = sorted(p for p in (PLAYBOOKS / "roles").iterdir() if (p / "tasks" / "main.yml").exists())
ROLE_NAMES = [r.name for r in ROLES]
BIN = Path(sys.executable).parent


def _tool_env() -> dict[str, str]:
    # the venv's tools first, as if it were activated (ansible-lint looks for ansible there)
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def _yaml(path: Path):
    return yaml.safe_load(path.read_text()) or []


def _tasks(role: Path) -> list[dict]:
    """Every task of a role's tasks/ and handlers/, blocks flattened."""
    out: list[dict] = []

    def walk(items):
        for t in items or []:
            if not isinstance(t, dict):
                continue
            out.append(t)
            for key in ("block", "rescue", "always"):
                walk(t.get(key))

    for sub in ("tasks", "handlers"):
        for f in sorted((role / sub).glob("*.yml")):
            walk(_yaml(f))
    return out


def test_configure_s_help_names_every_role_tag_and_only_those():
    """`invoke --help configure` lists the tags --tags takes: each role's first tag in
    site.yml (nfs for both NFS roles), no more and no fewer."""
    text = subprocess.run([sys.executable, "-m", "invoke", "--help", "configure"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    named = set(re.findall(r"[a-z_]+", " ".join(text.split("--tags=STRING")[1].split("--")[0]
                                                .split(":", 1)[1].split())))
    tags = {r["tags"][0] for p in _yaml(PLAYBOOKS / "site.yml") for r in p["roles"]}
    assert tags <= named, tags - named
    assert named - tags <= {"and", "installed", "is", "named", "only", "when"}


def test_slurm_is_applied_only_when_asked_for():
    """A cluster that already runs Slurm must not get a second one from a plain configure."""
    tags = {r["role"]: r.get("tags", []) for p in _yaml(PLAYBOOKS / "site.yml") for r in p["roles"]}
    assert "never" in tags["slurm"]
    assert all("never" not in t for name, t in tags.items() if name != "slurm")
    assert "slurm" in known_tags() and "never" not in known_tags()


def test_site_yml_applies_every_role_tagged_with_its_own_name():
    applied: dict[str, list[str]] = {}
    for play in _yaml(PLAYBOOKS / "site.yml"):
        for role in play.get("roles", []):
            applied[role["role"]] = role.get("tags", [])
    assert sorted(applied) == ROLE_NAMES
    for name, tags in applied.items():
        assert name in tags, f"{name} is applied without the tag {name}"
    assert set(known_tags()) >= set(ROLE_NAMES)


@pytest.mark.parametrize("role", ROLES, ids=ROLE_NAMES)
def test_every_role_default_appears_in_its_readme(role):
    defaults = _yaml(role / "defaults" / "main.yml") or {}
    readme = (role / "README.md").read_text()
    missing = [k for k in defaults if f"`{k}`" not in readme]
    assert not missing, f"{role.name}/README.md does not document {missing}"


@pytest.mark.parametrize("role", ROLES, ids=ROLE_NAMES)
def test_role_variables_carry_the_role_prefix(role):
    prefix = f"{role.name}_"
    names: list[str] = []
    for f in ("defaults/main.yml", "vars/main.yml"):
        if (role / f).exists():
            names += list((_yaml(role / f) or {}).keys())
    for t in _tasks(role):
        if "register" in t:
            names.append(t["register"])
        if "/tasks/" in str(t.get("ansible.builtin.include_tasks", "")):
            # the interface of a task file the roles share (playbooks/tasks/): scalelab_ names,
            # held to that below
            continue
        names += list((t.get("vars") or {}).keys())
        names += [k for k in (t.get("ansible.builtin.set_fact") or {}) if k != "cacheable"]
        if "loop_control" in t and "loop_var" in t["loop_control"]:
            names.append(t["loop_control"]["loop_var"])
    bad = sorted({n for n in names if not n.startswith(prefix)})
    assert not bad, f"{role.name}: variables without the {prefix} prefix: {bad}"


def test_shared_task_files_use_scalelab_names_and_every_one_is_included():
    """playbooks/tasks/ holds what several roles include; its variables are scalelab_ ones,
    and each file is included by at least one role with exactly the variables it reads."""
    for path in sorted((PLAYBOOKS / "tasks").glob("*.yml")):
        tasks = _yaml(path)
        text = path.read_text()
        # what the file defines itself: registered results, and a block's own vars
        names = [t["register"] for t in tasks if "register" in t] + \
            [k for t in tasks for k in (t.get("vars") or {})]
        used = set(re.findall(r"\bscalelab_\w+", text))
        assert all(n.startswith("scalelab_") for n in names), (path.name, names)
        includes = [t for role in ROLES for t in _tasks(role)
                    if str(t.get("ansible.builtin.include_tasks", "")).endswith(
                        f"../tasks/{path.name}")]
        assert includes, f"{path.name} is included by no role"
        # what every host has without being given: the inventory's and group_vars' names
        everywhere = {n for n in used if n.startswith("scalelab_cap_")} | {"scalelab_cluster"} \
            | set(_yaml(PLAYBOOKS / "group_vars" / "all.yml"))
        for t in includes:
            given = set(t.get("vars") or {})
            assert given and given <= used, (path.name, given, used)
            assert used - set(names) - everywhere <= given, \
                (path.name, used - set(names) - everywhere - given)


@pytest.mark.parametrize("role", ROLES, ids=ROLE_NAMES)
def test_every_role_starts_with_an_assert_and_has_meta_and_readme(role):
    first = _yaml(role / "tasks" / "main.yml")[0]
    assert "ansible.builtin.assert" in first and first["ansible.builtin.assert"].get("fail_msg")
    meta = _yaml(role / "meta" / "main.yml")
    assert meta["galaxy_info"]["role_name"] == role.name
    assert (role / "README.md").read_text().startswith(f"# {role.name}\n")


def test_no_ignore_errors_no_blind_host_keys_and_no_results_through_debug():
    for path in PLAYBOOKS.rglob("*"):
        if path.suffix not in (".yml", ".j2", ".cfg", ".py") or not path.is_file():
            continue
        text = path.read_text()
        assert "ignore_errors" not in text, path
        assert not re.search(r"StrictHostKeyChecking\s*[= ]\s*no", text, re.I), path
        assert "host_key_checking = False" not in text, path
    for role in ROLES:
        for t in _tasks(role):
            if "ansible.builtin.debug" in t:
                assert "msg" in t["ansible.builtin.debug"], f"{role.name}: debug of a variable"


def test_tasks_that_touch_keys_or_tokens_hide_their_output():
    """A task that copies the private key or renders the token must have no_log."""
    for role in ROLES:
        for t in _tasks(role):
            body = yaml.safe_dump({k: v for k, v in t.items() if k != "name"})
            private_key = ("common_ssh_key_src" in body and ".pub" not in body
                           and "ansible.builtin.copy" in t)
            token = re.search(r"\bjupyterlab_token\b(?!_)", body) is not None
            templated_token = (role.name == "jupyterlab" and "ansible.builtin.template" in t
                               and "jupyter_server_config" in body)
            if private_key or token or templated_token:
                assert t.get("no_log") is True, f"{role.name}: {t.get('name')} lacks no_log"


def _netshape_filters():
    path = PLAYBOOKS / "roles" / "netshape" / "filter_plugins" / "netshape_filters.py"
    spec = importlib.util.spec_from_file_location("netshape_filters", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("rate", ["100kbit", "2500kbit", "100mbit", "250mbit", "1gbit", "10gbit",
                                  "25gbit", "0.5gbit"])
def test_netshape_role_writes_the_bench_drivers_token_bucket(rate):
    from scalelab.core.units import parse_rate_mbit

    defaults = _yaml(PLAYBOOKS / "roles" / "netshape" / "defaults" / "main.yml")
    want = _netshape_filters().netshape_want(rate, defaults["netshape_burst_s"],
                                             defaults["netshape_min_burst_bytes"],
                                             defaults["netshape_queue_s"])
    driver = netshape.tbf_params(parse_rate_mbit(rate))
    assert (want["rate_bit"], want["burst"], want["limit"]) == (
        driver["rate_bit"], driver["burst_bytes"], driver["limit_bytes"])


def test_netshape_reads_tc_output_as_tc_prints_it():
    f = _netshape_filters()
    want = f.netshape_want("100mbit")
    # what `tc -j qdisc show` printed for the bench driver's 100mbit tbf (burst rounded by tc)
    shown = [{"kind": "tbf", "handle": "80b5:", "root": True,
              "options": {"rate": 12500000, "burst": 131062, "lat": 10486}}]
    assert f.netshape_matches(shown, want)
    assert not f.netshape_matches(shown, f.netshape_want("1gbit"))
    assert not f.netshape_matches(shown, f.netshape_want("native"))
    assert f.netshape_matches([{"kind": "noqueue", "root": True}], f.netshape_want("native"))
    with pytest.raises(Exception, match="not a rate"):
        f.netshape_want("fast")
    # the role refuses what the bench driver refuses, with the same hint
    with pytest.raises(Exception, match=r"^netshape: netshape_rate '100Mbps' is ambiguous .*"
                                        r"write 100mbit$"):
        f.netshape_want("100Mbps")


def test_yamllint_passes():
    proc = subprocess.run([str(BIN / "yamllint"), "-s", "-c", ".yamllint", "playbooks",
                           "bench/sweeps", ".yamllint", ".ansible-lint"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=_tool_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_ansible_lint_production_profile_passes():
    proc = subprocess.run([str(BIN / "ansible-lint"), "--nocolor", "playbooks"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=_tool_env())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "production" in proc.stdout + proc.stderr


@pytest.mark.parametrize(("probe", "gpus", "runner", "fails_with"), [
    (["0.28.1", "gloo"], 0, True, None),
    (["0.28.1", "mpi nccl"], 1, True, None),
    (["0.28.1"], 0, True, "it needs Gloo or MPI"),  # no controller: Ansible drops the line
    (["0.28.1", "gloo"], 1, True, "and NCCL on a GPU node"),
    (["0.27.0", "gloo"], 0, True, "not 0.28.1"),
    (["0.28.1", "gloo"], 0, False, "horovodrun is missing"),
])
def test_horovod_verification_wants_a_controller_and_nccl_on_gpu_nodes(tmp_path, probe, gpus,
                                                                      runner, fails_with):
    """The horovod role's verify tasks, run on the controller itself against a probe's output:
    a wrong release, a build without Gloo or MPI, one without NCCL on a node with GPUs, and a
    missing horovodrun each fail."""
    env_bin = tmp_path / "venv" / "bin"
    env_bin.mkdir(parents=True)
    if runner:
        (env_bin / "horovodrun").write_text("#!/bin/sh\n")
        (env_bin / "horovodrun").chmod(0o755)
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "vars": {"horovod_python": str(env_bin / "python"), "horovod_version": "0.28.1",
                 "ansible_python_interpreter": sys.executable, "scalelab_gpus": gpus,
                 "horovod_probe": {"stdout_lines": probe}},
        "tasks": [{"ansible.builtin.include_tasks":
                   str(PLAYBOOKS / "roles/horovod/tasks/verify.yml")}]}]))
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(play)], capture_output=True, text=True, timeout=120,
                          env={**_tool_env(), "ANSIBLE_NOCOLOR": "1"})
    out = proc.stdout + proc.stderr
    if fails_with is None:
        assert proc.returncode == 0, out[-3000:]
    else:
        assert proc.returncode != 0 and fails_with in out, out[-3000:]


def test_the_horovod_probe_prints_the_release_then_the_controllers(tmp_path):
    """The probe check.yml runs, against a stand-in horovod package: the release on the first
    line, the controllers it was built with on the second, as verify.yml reads them."""
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("__version__ = '0.28.1'\n")
    (tmp_path / "horovod" / "torch.py").write_text(
        "def gloo_built(): return True\ndef mpi_built(): return False\n"
        "def nccl_built(): return 2708\n")  # an NCCL version code, as Horovod returns it
    task = next(t for t in _yaml(PLAYBOOKS / "roles/horovod/tasks/check.yml")
                if t.get("register") == "horovod_probe")
    argv = task["ansible.builtin.command"]["argv"]
    proc = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["0.28.1", "gloo nccl"]
