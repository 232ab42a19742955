"""Filters of the netshape role: the wanted token bucket for a rate, and whether tc shows it.

The arithmetic is the bench driver's (scalelab.netshape.tbf_params); tests/test_roles_meta.py
holds the two to the same numbers, so either side reads the other's qdisc as unchanged.
"""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

_RATE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)(?P<unit>[kmg])bit$")
_MBIT_PER_UNIT = {"k": 0.001, "m": 1.0, "g": 1000.0}


def netshape_want(rate, burst_s=0.004, min_burst_bytes=131072, queue_s=0.020):
    """The tbf wanted for a rate such as 1gbit; {'shaped': False} for native.

    >>> netshape_want("1gbit")
    {'shaped': True, 'mbit': 1000.0, 'rate_bit': 1000000000, 'burst': 500000, 'limit': 2500000}
    """
    raw = str(rate).strip().lower()
    if raw == "native":
        return {"shaped": False}
    m = _RATE.match(raw)
    if not m:
        raise AnsibleFilterError(f"netshape: {rate!r} is not a rate such as 100mbit or 1gbit")
    mbit = float(m["num"]) * _MBIT_PER_UNIT[m["unit"]]
    if not 0.1 <= mbit <= 400_000:
        raise AnsibleFilterError(f"netshape: {rate!r} is outside 100kbit-400gbit")
    rate_bit = int(mbit * 1e6)
    bytes_per_s = rate_bit / 8
    burst = max(int(bytes_per_s * float(burst_s)), int(min_burst_bytes))
    limit = max(int(bytes_per_s * float(queue_s)), 2 * burst)
    return {"shaped": True, "mbit": mbit, "rate_bit": rate_bit, "burst": burst, "limit": limit}


def netshape_matches(qdiscs, want, tolerance=0.02):
    """Whether `tc -j qdisc show dev X root` (parsed) shows the wanted tbf, or none for native.

    tc reports the rate in bytes/s, the burst rounded to its clock ticks and the queue as a
    latency, (limit - burst) / rate; the rate must match exactly, the others within tolerance.
    """
    tbf = [q for q in qdiscs or [] if q.get("root") and q.get("kind") == "tbf"]
    if not want.get("shaped"):
        return not tbf
    if len(tbf) != 1:
        return False
    opt = tbf[0].get("options", {})
    tol = float(tolerance)
    lat_us = (want["limit"] - want["burst"]) / (want["rate_bit"] / 8) * 1e6
    return (int(opt.get("rate", 0)) * 8 == want["rate_bit"]
            and abs(int(opt.get("burst", 0)) - want["burst"]) <= tol * want["burst"]
            and abs(int(opt.get("lat", 0)) - lat_us) <= tol * lat_us + 1)


class FilterModule:
    """netshape_want, netshape_matches."""

    def filters(self):
        return {"netshape_want": netshape_want, "netshape_matches": netshape_matches}
