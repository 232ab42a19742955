"""The controller as found: bootstrap's package step never stops, disables or restarts a
service of a package the machine already had, and keeps only what it installed from starting.

apt and systemd cannot run for real here (no package index for a fresh install of these
packages in a test, no systemd as PID 1), so dpkg-query, apt-get and systemctl are stand-ins on
PATH that keep the machine's package list in a file and log what they were asked; the script
under test, scripts/install_packages.sh, is the one bootstrap.sh runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "install_packages.sh"

DPKG_QUERY = """#!/bin/sh
# dpkg-query -W -f=... PACKAGE
for p; do :; done
grep -qx "$p" "$FAKE/installed" && printf 'install ok installed' && exit 0
exit 1
"""
APT_GET = """#!/bin/sh
[ "$1" = update ] && exit 0
shift 4  # install -y -qq --no-install-recommends
echo "policy during install: $(cat "$SCALELAB_POLICY_RC" 2>/dev/null | sed -n 2p)" >> "$FAKE/log"
for p; do echo "$p" >> "$FAKE/installed"; done
# docker.io brings containerd along where it was not here
case " $* " in *" docker.io "*) grep -qx containerd "$FAKE/installed" \\
  || echo containerd >> "$FAKE/installed";; esac
[ -n "$KILL_BOOTSTRAP" ] && kill -KILL "$PPID"
exit 0
"""
SYSTEMCTL = """#!/bin/sh
echo "systemctl $*" >> "$FAKE/log"
"""

EVERYTHING = ["openssh-server", "openssh-client", "iproute2", "iperf3", "procps", "chromium",
              "nfs-ganesha", "nfs-ganesha-vfs", "libnfs-utils", "rsync", "g++", "make",
              "dpkg-dev", "munge", "slurm-client", "slurmctld", "slurmd", "slurmdbd",
              "mariadb-server", "docker.io", "mmdebstrap", "sudo"]


def _machine(tmp_path: Path, installed: list[str]) -> dict[str, str]:
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    for name, body in (("dpkg-query", DPKG_QUERY), ("apt-get", APT_GET),
                       ("systemctl", SYSTEMCTL)):
        path = fake / "bin" / name
        path.write_text(body)
        path.chmod(0o755)
    (fake / "installed").write_text("".join(f"{p}\n" for p in installed))
    (fake / "log").write_text("")
    return {**os.environ, "FAKE": str(fake), "PATH": f"{fake / 'bin'}:{os.environ['PATH']}",
            "SCALELAB_POLICY_RC": str(tmp_path / "policy-rc.d")}


def _run(env: dict[str, str], **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], env={**env, **extra}, capture_output=True,
                          text=True, timeout=60)


def _log(env: dict[str, str]) -> list[str]:
    return Path(env["FAKE"], "log").read_text().splitlines()


def test_a_machine_that_has_everything_is_left_as_it_is(tmp_path):
    env = _machine(tmp_path, [*EVERYTHING, "containerd"])
    proc = _run(env)
    assert proc.returncode == 0, proc.stderr
    assert _log(env) == []  # no systemctl at all: its sshd, Docker, MariaDB keep running
    assert not Path(env["SCALELAB_POLICY_RC"]).exists()


def test_only_the_services_of_packages_this_run_installed_are_kept_from_starting(tmp_path):
    # the machine has its own sshd and containerd (someone's containers run on it)
    have = [p for p in EVERYTHING if p not in ("docker.io", "munge")] + ["containerd"]
    env = _machine(tmp_path, have)
    proc = _run(env)
    assert proc.returncode == 0, proc.stderr
    log = _log(env)
    # no service started while installing, and the policy says which packages it covers
    assert log[0].startswith("policy during install: # scalelab install_packages:")
    assert "docker.io" in log[0] and "munge" in log[0]
    disabled = [line.split()[3:] for line in log if line.startswith("systemctl disable --now")]
    assert disabled == [["munge.service", "docker.socket", "docker.service"]]
    assert "kept from starting (installed by scalelab): munge.service docker.socket " \
           "docker.service" in proc.stdout
    assert not Path(env["SCALELAB_POLICY_RC"]).exists()


def test_a_policy_the_machine_had_is_left_alone(tmp_path):
    env = _machine(tmp_path, [p for p in EVERYTHING if p != "iperf3"] + ["containerd"])
    policy = Path(env["SCALELAB_POLICY_RC"])
    policy.write_text("#!/bin/sh\n# the admin's own\nexit 101\n")
    proc = _run(env)
    assert proc.returncode == 0, proc.stderr
    assert policy.read_text() == "#!/bin/sh\n# the admin's own\nexit 101\n"
    assert [x for x in _log(env) if x.startswith("systemctl")] == []


def test_an_install_killed_midway_is_finished_by_the_next_run(tmp_path):
    env = _machine(tmp_path, [p for p in EVERYTHING if p != "mariadb-server"] + ["containerd"])
    proc = _run(env, KILL_BOOTSTRAP="1")
    assert proc.returncode == -signal.SIGKILL
    policy = Path(env["SCALELAB_POLICY_RC"])
    assert policy.exists()  # SIGKILL runs no trap: the policy is the record of what was under way
    proc = _run(env)
    assert proc.returncode == 0, proc.stderr
    assert not policy.exists()
    assert "removed" in proc.stdout and "interrupted" in proc.stdout
    assert [x for x in _log(env) if x.startswith("systemctl")] == [
        "systemctl disable --now mariadb.service"]


def test_bootstrap_runs_the_package_step_and_disables_nothing_itself():
    text = (ROOT / "bootstrap.sh").read_text()
    assert "scripts/install_packages.sh" in text
    assert "systemctl" not in text
