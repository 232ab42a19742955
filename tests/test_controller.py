"""The controller as found: a user's whole journey on the local target through invoke
(provision, check, shape, bench, destroy) leaves this machine as it was, apart from what
docs/safety.md lists as kept (the state directory, reports, inventories, caches).

What is compared: every file, link and directory under /etc (content, mode, owner), the
network namespaces, links, routes and rules of every table, the firewall's rules, the mounts,
root's ~/.ssh, the lock files and policy-rc.d, and scalelab's own names under /tmp.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import invoke, needs_root, needs_sshd, unique_name

pytestmark = [needs_root, needs_sshd, pytest.mark.root, pytest.mark.slow]


def _tree(root: Path) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                what: tuple = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                what = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
            else:
                what = ("dir" if stat.S_ISDIR(st.st_mode) else "other",)
            out[str(path)] = (*what, st.st_mode, st.st_uid, st.st_gid)
    return out


def _run(*argv: str) -> str:
    if not shutil.which(argv[0]):
        return f"{argv[0]}: not installed"
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60).stdout


def _controller() -> dict[str, object]:
    return {
        "etc": _tree(Path("/etc")),
        "root_ssh": _tree(Path("/root/.ssh")) if Path("/root/.ssh").is_dir() else {},
        "netns": _run("ip", "netns", "list"),
        "links": sorted(line.split(":")[1].strip() for line in
                        _run("ip", "-o", "link", "show").splitlines()),
        "routes": _run("ip", "route", "show", "table", "all"),
        "rules": _run("ip", "rule", "show"),
        # the packet counters move with any traffic: the rules and policies are what count
        "firewall": re.sub(r"\[\d+:\d+\]", "", _run("iptables-save")).splitlines()[1:-1],
        "mounts": sorted(Path("/proc/self/mounts").read_text().splitlines()),
        "locks": sorted(p.name for p in Path("/run/lock").glob("scalelab-*")),
        "policy_rc": Path("/usr/sbin/policy-rc.d").exists(),
        "tmp": sorted(p.name for p in Path("/tmp").glob("scalelab*")),
    }


def test_a_journey_on_the_local_target_leaves_the_controller_as_found():
    name = unique_name("ctl")
    before = _controller()
    try:
        for args, timeout in ((["provision", "--cluster", name, "--nodes", "2"], 300),
                              (["check", "--cluster", name], 120),
                              (["shape", "--cluster", name, "--bandwidth", "100mbit"], 120),
                              (["bench", "--cluster", name, "--nodes", "2", "--batch-size", "4",
                                "--model", "resnet20", "--steps", "2", "--repeats", "1",
                                "--no-report"], 600)):
            proc = invoke(*args, timeout=timeout)
            assert proc.returncode == 0, (args, proc.stderr[-2000:])
    finally:
        proc = invoke("destroy", "--cluster", name, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    after = _controller()
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    if "etc" in changed:  # name the paths, not two trees
        b, a = changed.pop("etc")
        changed["etc"] = sorted(p for p in set(a) | set(b) if a.get(p) != b.get(p))
    assert changed == {}
