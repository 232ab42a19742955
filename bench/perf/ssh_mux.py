"""What multiplexing SSH saves: scalelab's own per-run overhead with one connection per node
against one connection per command (SCALELAB_SSH_MUX=0).

Two measurements, each alternating the two settings:
  1. commands: `--commands` short commands (`true`) to one node, directly and through a
     bastion (another emulated machine), one after the other; prints the median time of one;
  2. sweeps on a static cluster as tests/test_real_hosts.py makes one: three emulated machines
     handed over with an account `alice` (passwordless sudo, the user's key), one of them the
     bastion, the two others configured from the offline bundle (`--bundle`); then
     `invoke bench --sweep ci --steps 10` (resnet20, 2 nodes, native and 1gbit, 6 runs),
     `--rounds` times each way; prints per training run the launch and reap phases (median),
     the time outside runs per run, the wall time, and the connections each run opened and
     rode (runs.jsonl "ssh").
Needs root and sshd; `invoke bundle --out BUNDLE` first.

Usage: .venv/bin/python bench/perf/ssh_mux.py [--rounds 2] [--commands 30]
           [--bundle test-artifacts/bundle]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from _state import private_state  # noqa: E402

from scalelab.cluster import ssh  # noqa: E402
from scalelab.cluster.targets.local import LocalCluster  # noqa: E402


def _set_mux(on: bool) -> None:
    os.environ[ssh.MUX_ENV] = "1" if on else "0"


def commands(n: int) -> None:
    lc = LocalCluster("perfmx")
    lc.provision(2)
    try:
        nodes = lc.nodes()
        kh = str(lc.known_hosts)
        behind = dataclasses.replace(nodes[1], bastion=f"{nodes[0].ssh_user}@{nodes[0].address}")
        times: dict[tuple[str, bool], list[float]] = {}
        for i in range(n):
            for route, node in (("direct", nodes[1]), ("through a bastion", behind)):
                for on in (True, False) if i % 2 == 0 else (False, True):
                    _set_mux(on)
                    t0 = time.perf_counter()
                    ssh.run(node, kh, "true", timeout=30)
                    times.setdefault((route, on), []).append(time.perf_counter() - t0)
        _set_mux(True)
        print(f"one short command to a node (median of {n}, ms):")
        for route in ("direct", "through a bastion"):
            on = statistics.median(times[(route, True)]) * 1e3
            off = statistics.median(times[(route, False)]) * 1e3
            print(f"  {route:<18} multiplexed {on:6.1f}   a connection each {off:6.1f}   "
                  f"saved {off - on:6.1f}")
    finally:
        lc.destroy()


def _invoke(*args: str, env: dict | None = None, timeout: float = 1800) -> float:
    import subprocess

    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        sys.exit(f"invoke {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def static_behind_a_bastion(hosts: LocalCluster, name: str, tmp: Path, bundle: str) -> None:
    """Hand the machines over as a testbed with a bastion and a login user with sudo, as
    tests/test_real_hosts.py does (without the rule that turns direct SSH away), provision
    them as a static cluster, pin the keys and configure from the bundle."""
    import subprocess

    key = tmp / "testbed_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True,
                   timeout=30)
    pub = Path(f"{key}.pub").read_text().strip()
    machines = hosts.nodes()
    kh = str(hosts.known_hosts)
    for m in machines:
        ssh.run(m, kh, "useradd -m -d /home/alice -s /bin/sh -p '*' alice && "
                       f"mkdir -p /home/alice/.ssh && echo '{pub}' > /home/alice/.ssh/"
                       "authorized_keys && chown -R alice: /home/alice/.ssh && "
                       "echo 'alice ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/alice", timeout=30)
    bastion, behind = machines[0], machines[1:]
    var_file = tmp / "lab.tfvars.json"
    var_file.write_text(json.dumps({
        "hosts": [{"name": m.name, "address": m.address, **({"role": "head"} if i == 0 else {})}
                  for i, m in enumerate(behind)],
        "ssh_user": "alice", "ssh_private_key_file": str(key), "bastion_ip": bastion.address}))
    _invoke("provision", "--target", "static", "--cluster", name, "--nodes", str(len(behind)),
            "--var-file", str(var_file), timeout=300)
    known = Path(os.environ["SCALELAB_HOME"]) / "clusters" / name / "known_hosts"
    for m in machines:
        with open(known, "a") as fh:
            fh.write(ssh.run(bastion, kh, f"ssh-keyscan -t ed25519 {m.address}",
                             timeout=30).stdout)
    took = _invoke("configure", "--cluster", name, "--tags", "common,pytorch,horovod,workloads",
                   "--bundle", bundle)
    print(f"\nstatic cluster of 2 hosts behind a bastion, as alice with sudo: configured from "
          f"the bundle in {took:.0f} s")


def sweeps(rounds: int, bundle: str, tmp: Path) -> None:
    import subprocess

    hosts = LocalCluster("perfmxh")
    hosts.provision(3)
    lab = "perfmxlab"
    reports = Path(os.environ["SCALELAB_REPORTS"])
    got: dict[bool, list[dict]] = {True: [], False: []}
    try:
        static_behind_a_bastion(hosts, lab, tmp, bundle)
        for i in range(rounds):
            for on in (True, False) if i % 2 == 0 else (False, True):
                wall = _invoke("bench", "--cluster", lab, "--sweep", "ci", "--steps", "10",
                               "--no-report", env={ssh.MUX_ENV: "1" if on else "0"})
                runs_file = reports / os.readlink(reports / "latest") / "runs.jsonl"
                got[on].append({"wall": wall, "runs": [json.loads(x) for x in
                                                       runs_file.read_text().splitlines()]})
    finally:
        if (Path(os.environ["SCALELAB_HOME"]) / "clusters" / lab / "cluster.json").exists():
            subprocess.run([sys.executable, "-m", "invoke", "destroy", "--cluster", lab],
                           cwd=ROOT, capture_output=True, timeout=300)
        hosts.destroy()
    print(f"sweep ci (2 static hosts behind a bastion, 6 runs, 10 timed steps), {rounds} each "
          "way, medians:")
    print(f"  {'':<22}{'launch s':>9}{'reap s':>8}{'outside/run s':>15}{'wall s':>8}"
          f"{'opened/run':>12}{'shared/run':>12}")
    for on in (True, False):
        train = [r for s in got[on] for r in s["runs"] if r["kind"] == "train"
                 and r["status"] == "ok"]
        every = [r for s in got[on] for r in s["runs"]]
        outside = [(s["wall"] - sum(r["duration_s"] for r in s["runs"])) / len(s["runs"])
                   for s in got[on]]
        med = statistics.median
        print(f"  {'multiplexed' if on else 'a connection each':<22}"
              f"{med(r['timeline']['launch_s'] for r in train):9.2f}"
              f"{med(r['timeline']['reap_s'] for r in train):8.2f}{med(outside):15.2f}"
              f"{med(s['wall'] for s in got[on]):8.1f}"
              f"{statistics.mean(r['ssh']['opened'] for r in every):12.1f}"
              f"{statistics.mean(r['ssh']['shared'] for r in every):12.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="sweeps each way")
    ap.add_argument("--commands", type=int, default=30, help="short commands each way")
    ap.add_argument("--bundle", default=str(ROOT / "test-artifacts" / "bundle"))
    a = ap.parse_args()
    tmp = private_state()
    commands(a.commands)
    sweeps(a.rounds, a.bundle, tmp)


if __name__ == "__main__":
    main()
