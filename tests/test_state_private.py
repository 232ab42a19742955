"""What scalelab keeps on the controller stays its user's: the state directory and every folder
under it are 0700, and a sweep's folder, made to be shared, names no way into the cluster."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from scalelab.core import state
from scalelab.run import admission, sweepmeta
from scalelab.sweep import sweepfile


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_state_directory_and_its_folders_are_private(tmp_path, monkeypatch):
    home = tmp_path / "fresh" / ".scalelab"
    monkeypatch.setenv("SCALELAB_HOME", str(home))
    state.save_cluster("lab", {"target": "local", "nodes": []})
    assert [_mode(p) for p in (home, home / "clusters", home / "clusters" / "lab")] == [0o700] * 3
    assert _mode(home / "clusters" / "lab" / "cluster.json") == 0o600
    assert _mode(tmp_path / "fresh") != 0o700  # above the state directory: not scalelab's


def test_folders_an_older_scalelab_made_open_are_closed(tmp_path, monkeypatch):
    home = tmp_path / ".scalelab"
    (home / "clusters").mkdir(parents=True, mode=0o755)
    os.chmod(home, 0o755)
    os.chmod(home / "clusters", 0o755)
    monkeypatch.setenv("SCALELAB_HOME", str(home))
    state.save_cluster("lab", {"target": "local", "nodes": []})
    assert _mode(home) == _mode(home / "clusters") == 0o700


def test_a_sweep_folder_names_no_address_user_key_or_bastion(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "state"))
    node = {"name": "h1", "role": "head", "target": "static", "address": "203.0.113.7",
            "private_address": "10.1.0.7", "ssh_user": "alice", "ssh_port": 2222,
            "ssh_key": "/home/alice/.ssh/testbed_key", "bastion": "alice@198.51.100.9",
            "gpus": 2, "cpus": 32, "iface": "eth1",
            "facts": {"cores": 32, "user": "alice", "sudo": "yes", "gpu_model": "A100"}}
    state.save_cluster("lab", {"target": "static", "nodes": [node], "known_hosts": "/kh"})
    spec = sweepfile.spec_from_options(nodes="1", batch_size="8")
    prep = admission.Prepared("lab", spec, [], 0.0)
    text = json.dumps(sweepmeta.sweep_meta(prep, "s1"))
    for secret in ("203.0.113.7", "alice", "testbed_key", "198.51.100.9", "2222"):
        assert secret not in text, secret
    shown = json.loads(text)["nodes"][0]
    # what the report's node table and the models read is all there
    assert (shown["name"], shown["private_address"], shown["gpus"], shown["iface"]) == \
        ("h1", "10.1.0.7", 2, "eth1")
    assert shown["facts"] == {"cores": 32, "gpu_model": "A100"}
