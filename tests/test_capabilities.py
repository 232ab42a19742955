"""Targets say what their nodes can do; nothing outside scalelab/cluster/targets/ asks which target it is on.

A target declares capability flags (scalelab.cluster.targets.interface.Capabilities) in the
cluster record and the inventory; the roles, the driver, launch and the analysis read the
flags. These tests fail when a target's name (or the inventory's scalelab_target) is used to
decide something anywhere else.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from scalelab.cluster import inventory, targets
from scalelab.cluster.nodes import Node
from scalelab.cluster.targets import localhost

# "slurm" is also the name of a launcher, of a role and of the scheduler itself, so it is not
# searched for as a string; a comparison with a record's target is caught below whatever the name.
TARGET_NAMES = {t for t in targets.TARGETS if t != "slurm"}


def _python_outside_targets() -> list[Path]:
    files = [p for p in (ROOT / "scalelab").rglob("*.py") if "targets" not in p.parts]
    return [*files, ROOT / "tasks.py", *(ROOT / "bench" / "workloads").rglob("*.py")]


def _names_the_target(node: ast.AST) -> bool:
    """rec["target"], rec.get("target"), node.target or x.name where x is a target."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value == "target"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "get" and node.args \
            and isinstance(node.args[0], ast.Constant):
        return node.args[0].value == "target"
    return isinstance(node, ast.Attribute) and node.attr == "target"


def python_target_switches(path: Path) -> list[str]:
    """Every place in a Python file that names a target or compares a record's target."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and node.value in TARGET_NAMES:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
        if isinstance(node, ast.Compare) and any(
                _names_the_target(x) for x in (node.left, *node.comparators)):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: compares a target")
    return found


_QUOTED = "|".join(sorted(TARGET_NAMES))
YAML_SWITCH = re.compile(rf"scalelab_target|['\"](?:{_QUOTED})['\"]")


def yaml_target_switches(root: Path) -> list[str]:
    found = []
    for path in sorted([*root.rglob("*.yml"), *root.rglob("*.j2")]):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if YAML_SWITCH.search(line.split("#", 1)[0]):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    return found


def test_no_python_outside_the_targets_package_asks_which_target():
    found = [f for p in _python_outside_targets() for f in python_target_switches(p)]
    assert found == [], "ask the cluster's capabilities instead:\n" + "\n".join(found)


def test_no_role_or_playbook_asks_which_target():
    found = yaml_target_switches(ROOT / "playbooks")
    assert found == [], "key the default on a scalelab_cap_* flag instead:\n" + "\n".join(found)


def test_the_checks_find_a_switch_when_there_is_one(tmp_path, monkeypatch):
    """The two searches above would fail on the kind of line they exist to keep out."""
    monkeypatch.setattr("test_capabilities.ROOT", tmp_path)
    py = tmp_path / "mod.py"
    py.write_text('def f(rec, n):\n    if rec["target"] == x:\n        pass\n'
                  '    return n.target != y or "aws"\n')
    assert len(python_target_switches(py)) == 3
    (tmp_path / "roles").mkdir()
    (tmp_path / "roles" / "main.yml").write_text(
        "a: \"{{ (scalelab_target | default('')) == 'local' }}\"\n# scalelab_target in a comment\n")
    assert len(yaml_target_switches(tmp_path)) == 1


@pytest.mark.parametrize("name", targets.TARGETS)
def test_every_capability_the_roles_read_is_declared_and_reaches_the_inventory(name):
    """Each scalelab_cap_* a role reads is a Capabilities field, and every target's inventory
    carries all of them, so no role falls back to a default that belongs to another target."""
    read = set()
    for path in (ROOT / "playbooks").rglob("*.yml"):
        read |= set(re.findall(r"scalelab_cap_(\w+)", path.read_text()))
    declared = set(targets.Capabilities().to_dict())
    assert read and read <= declared, f"undeclared: {sorted(read - declared)}"
    caps = targets.get(name).capabilities({"name": "lab", "nodes": []})
    n = Node("lab-n0", "192.0.2.10", "10.0.0.10", "head", name)
    inv = inventory.render("lab", [n], capabilities=caps.as_vars())
    got = {k[len("scalelab_cap_"):]: v for k, v in inv["all"]["vars"].items()
           if k.startswith("scalelab_cap_")}
    assert got == caps.to_dict()
    assert yaml.safe_load(yaml.safe_dump(inv)) == inv


def test_the_local_target_and_real_hosts_differ_only_in_declared_flags():
    local = targets.get(targets.DEFAULT_TARGET).capabilities({})
    real = targets.Capabilities(shape_links=True)
    differ = {k for k, v in local.to_dict().items() if real.to_dict()[k] != v}
    # what a namespace node over the host's root cannot do or need (it runs a Docker engine,
    # on a data root of the host's own file system: containers is no longer among them)
    # (and a per-hop delay where this machine's kernel has tc's netem)
    assert differ == {"stack_from_host", "packages_from_host", "package_index", "systemd",
                      "own_clock", "kernel_nfs", "exportable_root", "ephemeral",
                      "shares_host_cpus", "own_loopback"} | (
        {"hop_delay"} if localhost.netem_available() else set())
