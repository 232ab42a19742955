"""Emulated accelerators during a sweep: the dilation factor of each link rate, and the device
profiles staged on the nodes.

k (time dilation) is the sweep's when it gives one. Otherwise, on a target whose nodes share one
host, the first emulated run calibrates the host: what it can move (one TCP stream between two
nodes, links unshaped) and how fast one core makes a pass over memory (an in-place add). Each
(link rate, node count) then gets the smallest whole k at which
  * the links: N nodes sending at rate / k together stay within half of what the host moved
    (accel.auto_dilation), and
  * the host's own work: every rank's passes over its gradient in the backward pass (autograd
    adding it in, the engine summing it; on the device these take microseconds) fit in half of
    the host's cores during the dilated backward, k x the profile's backward time;
on a real cluster every node has its own NIC and cores, so k is 1.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shlex
import time
from collections.abc import Callable
from typing import Any

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node
from scalelab.core.errors import ClusterError
from scalelab.model import accel
from scalelab.sweep import planner

log = logging.getLogger(__name__)




def memory_pass_s_per_byte(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """Seconds one core takes per byte of an in-place add (a += b over float32), the best of a
    few tries."""
    import numpy as np

    a = np.zeros(nbytes // 4, dtype=np.float32)
    b = np.zeros_like(a)
    a += b  # fault the pages in
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        a += b
        best = min(best, time.perf_counter() - t)
    return best / nbytes


class Emulation:
    def __init__(self, runs: list, nodes: list[Node], known_hosts: str, workdir: str,
                 shared_host: bool, calibrate: Callable[[], float | None],
                 host_cpus: int | None = None) -> None:
        self.nodes = nodes
        self.known_hosts = known_hosts
        self.workdir = workdir
        self.shared_host = shared_host
        self._calibrate = calibrate
        self.host_mbit: float | None = None
        self._calibrated = False
        self._k: dict[Any, float] = {}
        self._staged: set[str] = set()
        self.host_cpus = host_cpus or os.cpu_count() or 1
        self.pass_s_per_byte: float | None = None
        # per (rate, nodes): the tightest train run's (ranks, gradient bytes, backward seconds)
        self._load: dict[Any, tuple[int, int, float, int]] = {}
        # the stated path between a node's ranks (one per sweep; None: unshaped)
        self.intra_mbit: float | None = next(
            (r.params.get("intra_mbit") for r in runs if r.params.get("intra_mbit")), None)
        for r in runs:
            p = r.params
            if r.kind != "train" or not p.get("accelerator"):
                continue
            doc = accel.resolve(p["accelerator"], p["model"], p["precision"], p["batch_size"],
                                p["image_size"])
            bwd = max(sum(layer["bwd_s"] for layer in doc["layers"]), 1e-6)
            grad = sum(int(layer.get("numel") or 0) for layer in doc["layers"]) * (
                2 if p["precision"] in ("amp", "bf16") else 4)
            key = (p.get("bandwidth_mbit"), p["nodes"])
            # a parameter-server run's servers share the host's cores too: on the workers'
            # nodes (colocated, whose pushes and pulls are loopback copies as a ring's between
            # ranks of a node are) or on nodes of their own
            ranks = p["nodes"] * p["procs_per_node"] + planner.ps_servers(p)
            hosts = p["nodes"] + planner.server_nodes(p)
            old = self._load.get(key)
            if old is None or ranks * grad / bwd > old[0] * old[1] / old[2]:
                self._load[key] = (ranks, grad, bwd, hosts)

    def keep(self, records) -> None:
        """Reuse the k each (rate, node count) ran at before (a resumed sweep): runs of one
        sweep at one point are measured at one k."""
        for rec in records:
            p = rec.get("params") or {}
            if p.get("accelerator") and p.get("dilation"):
                self._k.setdefault((p.get("bandwidth_mbit"), p.get("nodes")), float(p["dilation"]))

    def dilation(self, run) -> float:
        """k for this run: 1 when it computes for real."""
        p = run.params
        if not p.get("accelerator"):
            return 1.0
        if p.get("dilation"):
            return float(p["dilation"])
        key = (p.get("bandwidth_mbit"), p["nodes"])
        if key not in self._k:
            if not self.shared_host:
                self._k[key] = 1.0
                return 1.0
            if not self._calibrated:
                self.host_mbit = (self._calibrate() if self.intra_mbit
                                  or any(r for r, _ in self._load) else None)
                self.pass_s_per_byte = memory_pass_s_per_byte()
                self._calibrated = True
                log.info("host calibration: one stream moves %s Mbit/s; a memory pass %.2f ms/MB",
                         f"{self.host_mbit:.0f}" if self.host_mbit else "(not measured)",
                         self.pass_s_per_byte * 1e9)
            ranks, grad, bwd, hosts = self._load.get(key, (p["nodes"], 0, 1.0, p["nodes"]))
            self._k[key] = accel.emulation_dilation(
                ranks, hosts, key[0], self.host_mbit, grad, bwd,
                p.get("precision", "fp32"), self.pass_s_per_byte or 0.0, self.host_cpus,
                self.node_cpus(hosts), self.intra_mbit)
        return self._k[key]

    def node_cpus(self, nodes: int) -> float:
        """The CPUs one of the first `nodes` nodes may use (the least; its cgroup share on the
        local target), the host's where the nodes do not say."""
        shares = [n.cpus for n in self.nodes[:nodes] if n.cpus and n.cpus > 0]
        return min([*shares, float(self.host_cpus)])

    def with_dilation(self, run, k: float):
        """The run as recorded: params carry the k it ran at."""
        if not run.params.get("accelerator"):
            return run
        return dataclasses.replace(run, params={**run.params, "dilation": k})

    def stage(self, run) -> str | None:
        """Put the run's profile on every node (once per content); its path there."""
        p = run.params
        if not p.get("accelerator") or run.kind != "train":
            return None
        doc = accel.resolve(p["accelerator"], p["model"], p["precision"], p["batch_size"],
                            p["image_size"])
        rel = accel.staged_path(doc)
        path = f"{self.workdir}/bench/workloads/{rel}"
        if rel not in self._staged:
            text = accel.canonical(doc)
            line = (f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && printf %s "
                    f"{shlex.quote(text)} > {shlex.quote(path)}.tmp && mv {shlex.quote(path)}.tmp "
                    f"{shlex.quote(path)}")
            _, errors = ssh.on_each(self.nodes, lambda n: ssh.run(n, self.known_hosts, line))
            bad = ssh.first_error(self.nodes, errors)
            if bad:
                raise ClusterError(f"cannot stage the {p['accelerator']} profile on node {bad[0]}: "
                                   f"{bad[1]}")
            self._staged.add(rel)
        return path
