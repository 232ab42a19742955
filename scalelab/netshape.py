"""Link shaping with tc: the same commands on the local target and on real clusters.

A token bucket (tbf) on a device's egress caps what that device sends. On the local target
both ends of each node's veth are shaped, so a node's uploads and downloads are both capped,
as on a full-duplex NIC.
"""

from __future__ import annotations

import json

from scalelab.units import format_rate

MIN_BURST_BYTES = 131072  # must exceed the largest GSO skb (64 KiB) or tbf drops it


def tbf_params(mbit: float, burst_s: float = 0.004, min_burst_bytes: int = MIN_BURST_BYTES,
               queue_s: float = 0.020) -> dict[str, int]:
    """Token-bucket parameters for a rate: 4 ms of traffic as burst, 20 ms of queue.

    The netshape role calls this too, with its own (documented) burst and queue settings.

    >>> tbf_params(1000.0)
    {'rate_bit': 1000000000, 'burst_bytes': 500000, 'limit_bytes': 2500000}
    >>> tbf_params(100.0)["burst_bytes"]
    131072
    """
    rate_bit = int(mbit * 1e6)
    bytes_per_s = rate_bit / 8
    burst = max(int(bytes_per_s * burst_s), min_burst_bytes)
    limit = max(int(bytes_per_s * queue_s), 2 * burst)
    return {"rate_bit": rate_bit, "burst_bytes": burst, "limit_bytes": limit}


def tc_set_args(dev: str, mbit: float | None) -> list[list[str]]:
    """tc argument lists that put the rate on dev ("native" removes shaping).

    >>> tc_set_args("eth0", 100.0)
    [['qdisc', 'replace', 'dev', 'eth0', 'root', 'tbf', 'rate', '100000000bit', 'burst', '131072', 'limit', '262144']]
    >>> tc_set_args("eth0", None)
    [['qdisc', 'del', 'dev', 'eth0', 'root']]
    """
    if mbit is None:
        return [["qdisc", "del", "dev", dev, "root"]]
    p = tbf_params(mbit)
    return [["qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{p['rate_bit']}bit",
             "burst", str(p["burst_bytes"]), "limit", str(p["limit_bytes"])]]


def shell_command(dev: str, mbit: float | None) -> str:
    """One shell line for a remote node; clearing a rate that isn't set is not an error."""
    args = tc_set_args(dev, mbit)[0]
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
