"""scalelab.cluster.bundle: the parsers, check() refusing bad bundles with one line, the bundle's
contents read from the roles' defaults, a real (small) build, and the roles installing from a
bundle on a node that has no route off the cluster."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import needs_root, needs_sshd

from scalelab.cluster import bundle, packages
from scalelab.cluster.packages import BundleError
from scalelab.cluster.targets import Capabilities

ROOT = Path(__file__).resolve().parent.parent
ROLES = ROOT / "playbooks" / "roles"
BIN = Path(sys.executable).parent
WHEEL_CACHE = Path(os.environ.get("SCALELAB_WHEEL_CACHE") or Path.home() / ".cache/scalelab/wheels")
TIMINGS: dict[str, float] = {}

# what `apt-cache depends --recurse --no-recommends ... iperf3` printed on Debian bookworm (cut)
DEPENDS_IPERF3 = """\
iperf3
  PreDepends: init-system-helpers
  Depends: debconf
  Depends: adduser
  Depends: libc6
  Depends: libiperf0
 |Depends: debconf
  Depends: <debconf-2.0>
    cdebconf
    debconf
init-system-helpers
 |Depends: usrmerge
  Depends: usr-is-merged
    usrmerge
debconf
adduser
  Depends: passwd
libc6
  Depends: libgcc-s1
libiperf0
  Depends: libc6
  Depends: libsctp1
  Depends: libssl3
cdebconf
  Depends: libc6
usrmerge
  Depends: <perl:any>
    perl
<debconf-2.0>
<perl:any>
perl
"""


# ------------------------------------------------------------------ pure helpers

def test_closure_keeps_real_packages_once_and_drops_virtual_ones():
    assert packages.parse_depends_closure(DEPENDS_IPERF3) == [
        "iperf3", "init-system-helpers", "debconf", "adduser", "libc6", "libiperf0",
        "cdebconf", "usrmerge", "perl"]


def test_apt_paragraphs_keep_continuation_lines():
    text = ("Package: automake\nVersion: 1:1.16.5-1.3\nArchitecture: all\n"
            "Description: Tool for generating GNU Standards-compliant Makefiles\n"
            " Automake is a tool.\n .\n More.\n\n"
            "Package: hello\nVersion: 2.10-3\n")
    first, second = packages.parse_stanzas(text)
    assert first["Version"] == "1:1.16.5-1.3"
    assert first["Description"].splitlines()[1:] == [" Automake is a tool.", " .", " More."]
    assert second == {"Package": "hello", "Version": "2.10-3"}


@pytest.mark.parametrize("filename, expected", [
    ("horovod-0.28.1-cp311-cp311-linux_x86_64.whl", ("horovod", "0.28.1")),
    ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", ("torch", "2.13.0+cpu")),
    ("PyYAML-6.0.3-cp311-cp311-manylinux2014_x86_64.whl", ("pyyaml", "6.0.3")),
    ("six-1.17.0-py2.py3-none-any.whl", ("six", "1.17.0")),
    ("foo_bar-1.0-1build-py3-none-any.whl", ("foo-bar", "1.0")),
])
def test_wheel_file_names_give_name_and_version(filename, expected):
    assert packages.parse_wheel_filename(filename) == expected


def test_a_file_that_is_no_wheel_is_refused():
    with pytest.raises(BundleError, match="not a wheel file name"):
        packages.parse_wheel_filename("horovod-0.28.1.tar.gz")


def test_requirements_and_pins():
    assert packages.parse_requirement("torch==2.13.0") == ("torch", "==2.13.0")
    assert packages.parse_requirement("Pillow") == ("pillow", "")
    with pytest.raises(BundleError, match="give a name"):
        packages.parse_requirement("horovod[pytorch]==0.28.1")
    assert packages.satisfies("2.13.0+cpu", "==2.13.0")
    assert not packages.satisfies("2.13.1", "==2.13.0")
    assert packages.torch_pin(["numpy"], ROOT / "constraints.txt") == "2.13.0"


def test_packages_index_and_release_carry_what_apt_checks():
    stanza = packages.packages_stanza("Package: hello\nVersion: 2.10-3\nArchitecture: amd64\n",
                                    "hello_2.10-3_amd64.deb", 53104, "m" * 32, "s" * 64)
    fields = packages.parse_stanzas(stanza)[0]
    assert fields["Filename"] == "./hello_2.10-3_amd64.deb" and fields["Size"] == "53104"
    release = packages.parse_stanzas(packages.release_file(stanza.encode(), "Mon, 1 Jan 2026 00:00:00 GMT"))[0]
    assert hashlib.sha256(stanza.encode()).hexdigest() in release["SHA256"]


def test_horovod_wheel_built_for_the_pinned_torch_wins(tmp_path):
    name = "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    for key in ("horovod-0.28.1_torch-2.12.0_cp311", "horovod-0.28.1_torch-2.13.0+cpu_cp311"):
        (tmp_path / key).mkdir()
        (tmp_path / key / name).write_bytes(b"x")
    picked = packages.pick_local_wheels([tmp_path], "2.13.0")
    assert [p.parent.name for p in picked] == ["horovod-0.28.1_torch-2.13.0+cpu_cp311"]
    with pytest.raises(BundleError, match="is in 2 places"):
        packages.pick_local_wheels([tmp_path], None)


# ------------------------------------------------------------------ contents = role defaults

def _defaults(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())


def test_default_contents_are_what_the_roles_install():
    apt, requirements = bundle.default_contents()
    common, pytorch, horovod = _defaults("common"), _defaults("pytorch"), _defaults("horovod")
    slurm = _defaults("slurm")
    assert set(apt) == (set(common["common_packages"]) | set(common["common_chrony_packages"])
                        | set(pytorch["pytorch_packages"])
                        | set(slurm["slurm_controller_packages"])
                        | set(slurm["slurm_compute_packages"])
                        | set(slurm["slurm_oci_packages"]))
    assert len(apt) == len(set(apt))
    assert requirements == [f"torch=={pytorch['pytorch_torch_version']}",
                            *pytorch["pytorch_extra_packages"],
                            f"horovod=={horovod['horovod_version']}"]
    # with a bundle the nodes install the prebuilt wheel: no compile toolchain goes in
    assert not set(apt) & {"g++", "make", "python3-dev", "libopenmpi-dev"}


def test_default_contents_follow_the_defaults_files(tmp_path):
    for role in ("common", "pytorch", "horovod"):
        (tmp_path / role / "defaults").mkdir(parents=True)
        data = _defaults(role)
        if role == "common":
            data["common_packages"] = ["hello"]
        if role == "pytorch":
            data["pytorch_extra_packages"] = ["six"]
        (tmp_path / role / "defaults" / "main.yml").write_text(yaml.safe_dump(data))
    apt, requirements = bundle.default_contents(tmp_path)
    assert apt == ["hello", "chrony", "python3-venv"]
    assert requirements[1:] == ["six", "horovod==0.28.1"]


# ------------------------------------------------------------------ check

def _fake_bundle(path: Path) -> Path:
    """A bundle as build() lays it out, with stand-in files."""
    (path / "debs").mkdir(parents=True)
    (path / "wheels").mkdir()
    debs = [("hello", "2.10-3", "hello_2.10-3_amd64.deb"), ("libc6", "2.36-9", "libc6_2.36-9_amd64.deb")]
    wheels = [("torch", "2.13.0+cpu", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"),
              ("horovod", "0.28.1", "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"),
              ("six", "1.17.0", "six-1.17.0-py2.py3-none-any.whl")]
    for _, _, f in debs:
        (path / "debs" / f).write_bytes(b"deb")
    for _, _, f in wheels:
        (path / "wheels" / f).write_bytes(b"wheel")
    (path / "debs" / "Packages").write_text("Package: hello\n")
    manifest = {"format": 1, "created_at": "2026-11-23T00:00:00Z", "python_tag": "cp311",
                "debs": [{"name": n, "version": v, "file": f, "size": 3} for n, v, f in debs],
                "wheels": [{"name": n, "version": v, "file": f, "size": 5} for n, v, f in wheels]}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


def test_check_accepts_a_complete_bundle(tmp_path):
    b = _fake_bundle(tmp_path / "b")
    manifest = bundle.check(b, ["hello"], ["torch==2.13.0", "horovod==0.28.1", "six"])
    assert manifest["python_tag"] == "cp311"


def test_check_names_a_missing_deb_and_the_fix(tmp_path):
    b = _fake_bundle(tmp_path / "b")
    with pytest.raises(BundleError) as exc:
        bundle.check(b, ["hello", "iperf3"], [])
    assert _one_line(exc) == f"bundle {b} lacks a deb for iperf3; rebuild it with invoke bundle"
    (b / "debs" / "hello_2.10-3_amd64.deb").unlink()  # in the manifest, gone from the disk
    with pytest.raises(BundleError, match="lacks a deb for hello;"):
        bundle.check(b, ["hello"], [])


def test_check_names_a_missing_wheel_and_how_to_get_it(tmp_path):
    b = _fake_bundle(tmp_path / "b")
    with pytest.raises(BundleError) as exc:
        bundle.check(b, [], ["torch==2.12.0"])
    assert _one_line(exc) == f"bundle {b} lacks a wheel for torch==2.12.0; rebuild it with invoke bundle"
    (b / "wheels" / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_bytes(b"cut short")
    with pytest.raises(BundleError) as exc:
        bundle.check(b, [], ["torch==2.13.0", "horovod==0.28.1"])
    assert _one_line(exc) == (f"bundle {b} lacks a wheel for horovod==0.28.1; rebuild it with "
                              "invoke bundle (after scripts/build_horovod.sh has built its wheel)")


def test_check_refuses_a_bundle_without_or_with_a_garbled_manifest(tmp_path):
    b = _fake_bundle(tmp_path / "b")
    (b / "manifest.json").unlink()
    with pytest.raises(BundleError) as exc:
        bundle.check(b, ["hello"], [])
    assert _one_line(exc) == f"bundle {b} has no manifest.json; build it with invoke bundle"
    (b / "manifest.json").write_text('{"format": 1, "debs": [')
    with pytest.raises(BundleError) as exc:
        bundle.check(b, ["hello"], [])
    assert "manifest.json is unreadable" in _one_line(exc) and "invoke bundle" in str(exc.value)
    (b / "manifest.json").write_text('{"format": 1, "debs": {}, "wheels": []}')
    with pytest.raises(BundleError, match="not a bundle manifest"):
        bundle.check(b, ["hello"], [])
    with pytest.raises(BundleError, match="is not a directory"):
        bundle.check(tmp_path / "nowhere", ["hello"], [])


def test_check_refuses_a_bundle_without_its_apt_index(tmp_path):
    b = _fake_bundle(tmp_path / "b")
    (b / "debs" / "Packages").unlink()
    with pytest.raises(BundleError, match=r"lacks its apt index debs/Packages; rebuild"):
        bundle.check(b, ["hello"], [])


# ------------------------------------------------------------------ build: refusals (no network)

def test_build_never_replaces_a_directory_that_is_not_a_bundle(tmp_path):
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(BundleError, match="not empty and holds no bundle"):
        bundle.build(precious, apt_packages=["hello"], requirements=[], constraints=None)
    assert [p.name for p in precious.iterdir()] == ["notes.txt"]


@pytest.mark.skipif(shutil.which("apt-cache") is None, reason="needs apt (Debian or Ubuntu)")
def test_a_failed_build_leaves_nothing_behind(tmp_path):
    out = tmp_path / "bundle"
    with pytest.raises(BundleError) as exc:
        bundle.build(out, apt_packages=["no-such-package-scalelab"], requirements=[],
                     constraints=None)
    assert _one_line(exc).startswith("apt has no installable package no-such-package-scalelab")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ build for real (slow)

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt (Debian or Ubuntu)")
def test_build_makes_a_flat_repo_wheels_and_manifest_and_a_second_build_is_a_no_op(tmp_path):
    out = tmp_path / "bundle"
    said: list[str] = []
    started = time.monotonic()
    manifest = bundle.build(out, apt_packages=["iperf3"], requirements=["six"],
                            constraints=ROOT / "constraints.txt", progress=said.append)
    TIMINGS["build iperf3 + six"] = time.monotonic() - started

    debs = {d["name"]: d for d in manifest["debs"]}
    assert {"iperf3", "libiperf0", "libc6"} <= set(debs)
    for d in manifest["debs"]:
        assert (out / "debs" / d["file"]).stat().st_size == d["size"]
    index = packages.parse_stanzas((out / "debs" / "Packages").read_text())
    assert {p["Package"] for p in index} == set(debs)
    assert all(p["Filename"] == f"./{debs[p['Package']]['file']}" for p in index)
    assert "Packages" in (out / "debs" / "Release").read_text()
    assert [(w["name"], w["file"]) for w in manifest["wheels"]] == [
        ("six", sorted(p.name for p in (out / "wheels").iterdir())[0])]
    assert len(manifest["wheels"][0]["sha256"]) == 64
    assert manifest["python_tag"] == f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert bundle.check(out, ["iperf3"], ["six"]) == manifest
    assert not [p for p in tmp_path.iterdir() if p.name != "bundle"]  # no staging left

    inodes = {p: p.stat().st_ino for p in out.rglob("*")}
    said.clear()
    started = time.monotonic()
    again = bundle.build(out, apt_packages=["iperf3"], requirements=["six"],
                         constraints=ROOT / "constraints.txt", progress=said.append)
    TIMINGS["build iperf3 + six again"] = time.monotonic() - started
    assert again == manifest  # created_at included: nothing was rewritten
    assert {p: p.stat().st_ino for p in out.rglob("*")} == inodes
    assert any(f"{len(debs)} kept from the previous bundle, 0 to download" in s for s in said), said
    assert "wheels: 0 downloaded" in said, said

    # a build that fails keeps the bundle that was there
    with pytest.raises(BundleError):
        bundle.build(out, apt_packages=["iperf3", "no-such-package-scalelab"],
                     requirements=["six"], constraints=ROOT / "constraints.txt")
    assert bundle.read_manifest(out) == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]
    print(f"timing: {TIMINGS}")


# ------------------------------------------------------------------ the roles, from a bundle

def _playbook(path: Path, roles: list[str]) -> Path:
    path.write_text(yaml.safe_dump([{
        "name": "Install from the offline bundle", "hosts": "all",
        "roles": [{"role": r} for r in roles]}], sort_keys=False))
    return path


def _ansible(playbook: Path, inventory: Path, extravars: dict,
             check: bool = False) -> dict[str, dict[str, int]]:
    """ansible-playbook as the controller runs it; the counts of its recap, per host."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "playbooks" / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(ROLES), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), "-e",
                           json.dumps(extravars), *(["--check"] if check else []),
                           str(playbook)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    recap = proc.stdout[proc.stdout.rindex("PLAY RECAP"):]
    return {m[1]: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m[2])}
            for m in re.finditer(r"^(\S+)\s+:\s+(.*)$", recap, re.M)}


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(2400)
@needs_root
@needs_sshd
@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt (Debian or Ubuntu)")
def test_roles_install_from_the_bundle_on_a_node_with_no_route_out(tmp_path, local_cluster):
    """A real host's path (a real host's capabilities) on a local node, which has no route off
    the cluster: common installs a package the host lacks from a bundle of just that; check mode
    changes nothing, the second run changes nothing, the node's apt configuration is as it
    was, the host untouched. (The venv from the bundle's wheels, torch and Horovod, is
    installed for real, twice, by tests/test_real_hosts.py; not again here.)"""
    from scalelab.cluster import inventory, ssh

    extra_pkg = "hello"  # tiny, not installed on the host
    if subprocess.run(["dpkg-query", "-W", extra_pkg], capture_output=True).returncode == 0:
        pytest.skip(f"{extra_pkg} is installed on this host; the test needs a package it lacks")
    assert not Path("/opt/scalelab").exists(), "/opt/scalelab exists on the host already"
    roles = ["common"]
    started = time.monotonic()
    b = tmp_path / "bundle"
    # only what the node lacks: the role installs the missing packages alone (the whole default
    # bundle is built, and installed from, by tests/test_real_hosts.py)
    bundle.build(b, apt_packages=[extra_pkg], requirements=["six"],
                 constraints=ROOT / "constraints.txt")
    bundle.check(b, [extra_pkg], ["six"])
    TIMINGS["bundle build"] = time.monotonic() - started

    lc = local_cluster(1)
    node = lc.nodes()[0]
    inv = tmp_path / "inventory.yml"
    inv.write_text(yaml.safe_dump(inventory.render(
        lc.name, lc.nodes(), known_hosts=str(lc.known_hosts),
        capabilities=Capabilities().as_vars())))
    playbook = _playbook(tmp_path / "play.yml", roles)
    common_packages = [*_defaults("common")["common_packages"], extra_pkg]
    extravars = {"scalelab_bundle_dir": str(b), "common_packages": common_packages,
                 # what a namespace node cannot do; the packages are what this test is about
                 "common_set_hostname": False, "common_ssh_trust": False,
                 "common_time_sync": False}

    def on(cmd: str, check: bool = True):
        return ssh.run(node, str(lc.known_hosts), cmd, timeout=120, check=check)

    assert "default" not in on("ip -4 route show").stdout  # nowhere to download from
    apt_before = on("find /etc/apt -type f | sort | xargs sha256sum").stdout

    started = time.monotonic()
    dry = _ansible(playbook, inv, extravars, check=True)
    TIMINGS["roles from the bundle, check mode"] = time.monotonic() - started
    assert dry[node.name]["changed"] > 0
    assert on("test -e /opt/scalelab", check=False).returncode != 0  # check mode changed nothing
    started = time.monotonic()
    first = _ansible(playbook, inv, extravars)
    TIMINGS["roles from the bundle, first run"] = time.monotonic() - started
    assert first[node.name]["changed"] > 0
    started = time.monotonic()
    second = _ansible(playbook, inv, extravars)
    TIMINGS["roles from the bundle, second run"] = time.monotonic() - started
    assert second[node.name]["changed"] == 0, second

    assert on(f"dpkg-query -W -f '${{db:Status-Status}}' {extra_pkg}").stdout == "installed"
    # apt on the node: configuration as it was, no list or working directory of the bundle
    assert on("find /etc/apt -type f | sort | xargs sha256sum").stdout == apt_before
    assert on("ls /var/lib/apt/lists").stdout.count("scalelab") == 0
    assert on("test -e /opt/scalelab/bundle/apt", check=False).returncode != 0
    # the node's own install, not the controller's: nothing of it on the host
    assert not Path("/opt/scalelab").exists()
    assert subprocess.run(["dpkg-query", "-W", extra_pkg], capture_output=True).returncode != 0
    print(f"timing: {TIMINGS}")
