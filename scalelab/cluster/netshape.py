"""Link shaping with tc: the same commands on the local target and on real clusters.

A token bucket (tbf) on a device's egress caps what that device sends. On the local target
both ends of each node's veth are shaped, so a node's uploads and downloads are both capped,
as on a full-duplex NIC. On real clusters SshLinks sets that tbf on each node's cluster
interface over SSH, after a snapshot of the interface's root qdisc, which is what the sweep's
Shaper (scalelab.run.shaping) restores.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from scalelab.cluster import ssh
from scalelab.cluster.nodes import Node
from scalelab.core.errors import ClusterError
from scalelab.core.units import format_rate

MIN_BURST_BYTES = 131072  # must exceed the largest GSO skb (64 KiB) or tbf drops it
QUEUE_S = 0.020  # a shaped link's queue: 20 ms of its rate
# a server's NIC queues 1000 packets (Linux's default txqueuelen) of 1514 bytes at least
SERVER_QUEUE_PACKETS = 1000
FRAME_BYTES = 1514


def tbf_params(mbit: float, burst_s: float = 0.004, min_burst_bytes: int = MIN_BURST_BYTES,
               queue_s: float = QUEUE_S, min_queue_bytes: int = 0) -> dict[str, int]:
    """Token-bucket parameters for a rate: 4 ms of traffic as burst, 20 ms of queue, or
    min_queue_bytes where that is more (a server's link: server_queue_bytes).

    The netshape role calls this too, with its own (documented) burst and queue settings.

    >>> tbf_params(1000.0)
    {'rate_bit': 1000000000, 'burst_bytes': 500000, 'limit_bytes': 2500000}
    >>> tbf_params(100.0)["burst_bytes"]
    131072
    >>> tbf_params(100.0, min_queue_bytes=server_queue_bytes(100.0))["limit_bytes"]
    1514000
    """
    rate_bit = int(mbit * 1e6)
    bytes_per_s = rate_bit / 8
    burst = max(int(bytes_per_s * burst_s), min_burst_bytes)
    limit = max(int(bytes_per_s * queue_s), 2 * burst, min_queue_bytes)
    return {"rate_bit": rate_bit, "burst_bytes": burst, "limit_bytes": limit}


def server_queue_bytes(device_mbit: float) -> int:
    """The queue of a server's link (a storage node's) at a rate in the emulated device's
    time: 20 ms of that rate, and never fewer than a NIC's 1000 full frames. Set on a
    dilated link (device_mbit / k), it holds what the device's link holds, so many readers'
    streams lose no more packets to it than on the link it emulates.

    >>> server_queue_bytes(1000.0), server_queue_bytes(10000.0)
    (2500000, 25000000)
    """
    return max(int(device_mbit * 1e6 / 8 * QUEUE_S), SERVER_QUEUE_PACKETS * FRAME_BYTES)


def tc_set_args(dev: str, mbit: float | None, delay_us: float = 0.0,
                min_queue_bytes: int = 0) -> list[list[str]]:
    """tc argument lists that put the rate on dev ("native" removes shaping); delay_us: a
    netem delay under the tbf, so every packet dev sends waits that long (a hop's latency;
    the first list, which removes what is there, may fail harmlessly).

    >>> tc_set_args("eth0", 100.0)
    [['qdisc', 'replace', 'dev', 'eth0', 'root', 'tbf', 'rate', '100000000bit', 'burst', '131072', 'limit', '262144']]
    >>> tc_set_args("eth0", None)
    [['qdisc', 'del', 'dev', 'eth0', 'root']]
    >>> [" ".join(a) for a in tc_set_args("eth0", 100.0, 40.0)]  # doctest: +NORMALIZE_WHITESPACE
    ['qdisc del dev eth0 root',
     'qdisc add dev eth0 root handle 1: tbf rate 100000000bit burst 131072 limit 262144',
     'qdisc add dev eth0 parent 1:1 handle 10: netem delay 40us limit 100000']
    """
    if mbit is None:
        return [["qdisc", "del", "dev", dev, "root"]]
    p = tbf_params(mbit, min_queue_bytes=min_queue_bytes)
    tbf = ["tbf", "rate", f"{p['rate_bit']}bit", "burst", str(p["burst_bytes"]), "limit",
           str(p["limit_bytes"])]
    if delay_us <= 0:
        return [["qdisc", "replace", "dev", dev, "root", *tbf]]
    return [["qdisc", "del", "dev", dev, "root"],
            ["qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf],
            ["qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem", "delay",
             f"{max(1, round(delay_us))}us", "limit", "100000"]]


def shell_command(dev: str, mbit: float | None, min_queue_bytes: int = 0) -> str:
    """One shell line for a remote node; clearing a rate that isn't set is not an error."""
    args = tc_set_args(dev, mbit, min_queue_bytes=min_queue_bytes)[0]
    line = "tc " + " ".join(args)
    return f"{line} 2>/dev/null || true" if mbit is None else line


def parse_qdisc_rate(tc_json: str) -> float | None:
    """Read the tbf rate (Mbit/s) back from `tc -j qdisc show dev X`; None when unshaped.

    >>> parse_qdisc_rate('[{"kind":"tbf","handle":"8001:","root":true,"options":{"rate":12500000}}]')
    100.0
    >>> parse_qdisc_rate('[{"kind":"noqueue","handle":"0:","root":true}]') is None
    True
    """
    for q in json.loads(tc_json or "[]"):
        if q.get("kind") == "tbf" and q.get("root"):
            # tc -j reports the rate in bytes per second
            return q["options"]["rate"] * 8 / 1e6
    return None


def describe(mbit: float | None) -> str:
    return format_rate(mbit)


# Root qdiscs the kernel puts on an interface by itself (handle 0:): deleting whatever root
# qdisc is there brings them back, so they can always be restored.
DEFAULT_HANDLE = "0:"


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
    scalelab.core.errors.ClusterError: node n1: eth0 has an htb root qdisc that scalelab could not put back after shaping; remove it (tc qdisc del dev eth0 root) or sweep with --bandwidth native
    """
    if q.get("handle", DEFAULT_HANDLE) == DEFAULT_HANDLE or q.get("kind") == "tbf":
        return
    kind = q.get("kind", "?")
    article = "an" if kind[:1] in "aehiou" else "a"
    raise ClusterError(f"node {node}: {dev} has {article} {kind} root qdisc that scalelab "
                       f"could not put back after shaping; remove it (tc qdisc del dev {dev} "
                       "root) or sweep with --bandwidth native")


def only_links_scalelab_made(delay_us: float) -> None:
    """Refuse a per-hop delay on links scalelab did not make (netem goes only on its own)."""
    if delay_us:
        raise ClusterError("a per-hop delay is emulated only on links scalelab made")


def only_own_loopbacks(mbit: float | None) -> None:
    """Refuse a rate between the ranks of one node where the node's loopback is the host's."""
    if mbit is not None:
        raise ClusterError("the path between the ranks of one node is shaped only on nodes "
                           "with a loopback of their own (a local cluster)")


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

    def _set(self, n: Node, mbit: float | None, min_queue_bytes: int = 0) -> None:
        if mbit is None:
            line = (f"if tc qdisc show dev {n.iface} root | grep -q '^qdisc tbf '; then "
                    f"tc qdisc del dev {n.iface} root; fi")
        else:
            line = shell_command(n.iface, mbit, min_queue_bytes)
        self._run(n, line)
        got = parse_qdisc_rate(self._run(n, f"tc -j qdisc show dev {n.iface} root"))
        if got != mbit:
            raise ClusterError(f"{n.iface} reads {describe(got)} after setting "
                               f"{describe(mbit)}")

    def apply(self, mbit: float | None, delay_us: float = 0.0) -> None:
        only_links_scalelab_made(delay_us)
        self._each(lambda n: self._set(n, mbit))

    def apply_node(self, name: str, mbit: float | None, delay_us: float = 0.0,
                   min_queue_bytes: int = 0) -> None:
        """One node's link at its own rate (a storage node's), its queue at least
        min_queue_bytes; restore() puts it back too."""
        only_links_scalelab_made(delay_us)
        self._set(next(n for n in self.nodes if n.name == name), mbit, min_queue_bytes)

    def apply_intra(self, mbit: float | None) -> None:
        only_own_loopbacks(mbit)

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
