"""Link rates during a sweep: set one rate on every node, put the links back at the end.

Shaper is the same on every target; what it drives is the target's Links (scalelab.targets.
base). On real clusters that is SshLinks: the tbf of scalelab.netshape on each node's cluster
interface over SSH, after a snapshot of the interface's root qdisc, which is what gets
restored (at the end of the sweep, on Ctrl-C, on a failure, and on the next sweep or
--resume after a driver was killed outright, from the marker file).
"""

from __future__ import annotations

import json
import logging
import shlex
from contextlib import suppress
from pathlib import Path
from typing import Any

from scalelab import netshape, ssh
from scalelab.errors import ClusterError, ScalelabError
from scalelab.nodes import Node
from scalelab.state import write_atomic

log = logging.getLogger(__name__)

_UNSET = object()
# Root qdiscs the kernel puts on an interface by itself (handle 0:): deleting whatever root
# qdisc is there brings them back, so they can always be restored.
DEFAULT_HANDLE = "0:"


class Shaper:
    """Sets one rate on every link of a cluster; restores what was there before the first change.

    marker: a file holding the snapshot to go back to while the links are at another rate.
    It is written before the links change, so a driver killed with SIGKILL leaves it behind,
    and the next Shaper of the cluster restores from it, unless the rate was changed by hand
    since (Links.still_as_left).
    """

    def __init__(self, links: Any, marker: Path | None = None) -> None:
        self.links = links
        self.marker = marker
        self.original: Any = _UNSET
        self.current: Any = _UNSET
        note = self._read_marker()
        if note is not None and links.still_as_left(note["to"]):
            self.original, self.current = note["original"], note["to"]
            log.info("links were left at %s by an interrupted driver; they are restored at the "
                     "end", netshape.describe(self.current))
        elif note is not None and self.marker is not None:
            with suppress(OSError):
                self.marker.unlink()

    def _read_marker(self) -> dict[str, Any] | None:
        if self.marker is None:
            return None
        try:
            note = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return None
        return note if isinstance(note, dict) and "original" in note and "to" in note else None

    def set(self, mbit: float | None) -> None:
        if self.current is not _UNSET and mbit == self.current:
            return
        if self.original is _UNSET:
            self.original = self.links.snapshot()
        if self.marker is not None:
            try:
                write_atomic(self.marker, json.dumps({"original": self.original, "to": mbit})
                             + "\n")
            except OSError as exc:
                raise ClusterError(f"cannot write {self.marker} ({exc.strerror}); links not "
                                   "changed") from None
        self.current = mbit
        self.links.apply(mbit)

    def restore(self) -> None:
        """Put the links back as they were; a failure is logged, never raised (cleanup path)."""
        if self.original is _UNSET:
            return
        try:
            self.links.restore(self.original)
        except (ScalelabError, OSError) as exc:
            log.warning("could not restore the links: %s (the marker %s keeps what to restore;"
                        " the next sweep on this cluster tries again)", exc, self.marker)
            return
        self.original = self.current = _UNSET
        if self.marker is not None:
            with suppress(OSError):
                self.marker.unlink()


# ------------------------------------------------------------------ real clusters: tc over SSH


def root_qdisc(tc_json: str) -> dict[str, Any]:
    """The root qdisc from `tc -j qdisc show dev X root`.

    >>> root_qdisc('[{"kind":"noqueue","handle":"0:","root":true,"refcnt":2,"options":{}}]')
    {'kind': 'noqueue', 'handle': '0:', 'root': True, 'refcnt': 2, 'options': {}}
    """
    try:
        items = json.loads(tc_json or "[]")
    except ValueError:
        raise ClusterError(f"tc printed no JSON: {tc_json[:120]!r}; is iproute2 recent "
                           "enough (tc -j)?") from None
    for q in items:
        if q.get("root"):
            return q
    return {"kind": "none", "handle": DEFAULT_HANDLE, "root": True}


def comparable(q: dict[str, Any]) -> dict[str, Any]:
    """A qdisc as restore() promises it: kind, options, and the handle when the kernel chose it.

    >>> comparable({"kind": "tbf", "handle": "8003:", "root": True, "refcnt": 2,
    ...             "options": {"rate": 125000, "burst": 131072, "lat": 1}})
    {'kind': 'tbf', 'handle': 'set', 'options': {'rate': 125000, 'burst': 131072, 'lat': 1}}
    """
    handle = q.get("handle", "")
    return {"kind": q.get("kind"), "handle": handle if handle == DEFAULT_HANDLE else "set",
            "options": q.get("options", {})}


def restore_command(dev: str, original: dict[str, Any]) -> str:
    """The shell line that puts back an interface's original root qdisc.

    >>> restore_command("eth0", {"kind": "noqueue", "handle": "0:"})
    'tc qdisc del dev eth0 root 2>/dev/null || true'
    >>> restore_command("eth0", {"kind": "tbf", "handle": "8001:",
    ...     "options": {"rate": 12500000, "burst": 131072, "limit": 262144}})
    'tc qdisc replace dev eth0 root tbf rate 100000000bit burst 131072 limit 262144'
    """
    if original.get("handle", DEFAULT_HANDLE) == DEFAULT_HANDLE:
        return f"tc qdisc del dev {dev} root 2>/dev/null || true"
    if original.get("kind") == "tbf":
        o = original.get("options", {})
        return (f"tc qdisc replace dev {dev} root tbf rate {int(o['rate']) * 8}bit burst "
                f"{int(o['burst'])} limit {int(o['limit'])}")
    raise ClusterError(f"{dev} has a {original.get('kind')} root qdisc that scalelab cannot "
                       "restore")


def check_restorable(node: str, dev: str, q: dict[str, Any]) -> None:
    """Refuse to shape an interface whose root qdisc could not be put back.

    >>> check_restorable("n1", "eth0", {"kind": "htb", "handle": "1:"})
    Traceback (most recent call last):
    ...
    scalelab.errors.ClusterError: node n1: eth0 has an htb root qdisc that scalelab could not put back after shaping; remove it (tc qdisc del dev eth0 root) or sweep with --bandwidth native
    """
    if q.get("handle", DEFAULT_HANDLE) == DEFAULT_HANDLE or q.get("kind") == "tbf":
        return
    kind = q.get("kind", "?")
    article = "an" if kind[:1] in "aehiou" else "a"
    raise ClusterError(f"node {node}: {dev} has {article} {kind} root qdisc that scalelab "
                       f"could not put back after shaping; remove it (tc qdisc del dev {dev} "
                       "root) or sweep with --bandwidth native")


class SshLinks:
    """tbf on each node's recorded cluster interface, over SSH (sudo -n when not root)."""

    def __init__(self, nodes: list[Node], known_hosts: str) -> None:
        for n in nodes:
            if not n.iface:
                raise ClusterError(f"node {n.name} has no cluster interface recorded; run "
                                   "invoke configure on the cluster first")
        self.nodes = nodes
        self.known_hosts = known_hosts

    def _run(self, node: Node, line: str) -> str:
        if node.ssh_user != "root":
            line = f"sudo -n sh -c {shlex.quote(line)}"
        return ssh.run(node, self.known_hosts, line, timeout=30).stdout

    def _each(self, fn: Any) -> dict[str, Any]:
        results, errors = ssh.on_each(self.nodes, fn, timeout_s=60)
        bad = ssh.first_error(self.nodes, errors)
        if bad:
            raise ClusterError(f"links: {bad[0]}: {bad[1]}")
        return results

    def read(self) -> dict[str, dict[str, Any]]:
        """Each node's root qdisc on its cluster interface."""
        return self._each(lambda n: root_qdisc(self._run(
            n, f"tc -j qdisc show dev {n.iface} root")))

    def snapshot(self) -> dict[str, Any]:
        qdiscs = self.read()
        for n in self.nodes:
            check_restorable(n.name, n.iface, qdiscs[n.name])
        return {n.name: {"iface": n.iface, "qdisc": qdiscs[n.name]} for n in self.nodes}

    def apply(self, mbit: float | None) -> None:
        def one(n: Node) -> None:
            if mbit is None:
                line = (f"if tc qdisc show dev {n.iface} root | grep -q '^qdisc tbf '; then "
                        f"tc qdisc del dev {n.iface} root; fi")
            else:
                line = netshape.shell_command(n.iface, mbit)
            self._run(n, line)
            got = netshape.parse_qdisc_rate(self._run(n, f"tc -j qdisc show dev {n.iface} root"))
            if got != mbit:
                raise ClusterError(f"{n.iface} reads {netshape.describe(got)} after setting "
                                   f"{netshape.describe(mbit)}")
        self._each(one)

    def restore(self, snapshot: dict[str, Any]) -> None:
        def one(n: Node) -> None:
            saved = snapshot.get(n.name)
            if not saved:
                return
            self._run(n, restore_command(saved["iface"], saved["qdisc"]))
            now = root_qdisc(self._run(n, f"tc -j qdisc show dev {saved['iface']} root"))
            if comparable(now) != comparable(saved["qdisc"]):
                raise ClusterError(f"{saved['iface']} is {now.get('kind')} after restoring "
                                   f"{saved['qdisc'].get('kind')}")
        self._each(one)

    def still_as_left(self, mbit: float | None) -> bool:
        return True
