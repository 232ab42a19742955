"""Filters of the netshape role: the wanted token bucket for a rate, and whether tc shows it.

The rate is read by scalelab's own parser and the bucket worked out by the bench driver's
arithmetic (scalelab.core.units, scalelab.cluster.netshape), so the role and `invoke bench` accept the same
rates, refuse the same ones with the same hint, and read each other's qdisc as unchanged.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

try:
    from scalelab.core.errors import InputError
except ImportError:  # ansible's interpreter without scalelab installed: the checkout's copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
    from scalelab.core.errors import InputError
from scalelab.cluster.netshape import tbf_params
from scalelab.core.units import parse_rate_mbit


def _parse(rate):
    """(Mbit/s or None for native, "") for a rate the bench driver accepts, else (None, why)."""
    try:
        return parse_rate_mbit(str(rate)), ""
    except InputError as e:  # the driver's own line, named as the role's variable
        return None, f"netshape: {e}".replace("bandwidth: ", "netshape_rate ", 1)


def netshape_rate_error(rate):
    """"" for a rate the bench driver accepts (or "" for leave-alone), else the one-line reason.

    >>> netshape_rate_error("1gbit"), netshape_rate_error("")
    ('', '')
    >>> netshape_rate_error("100Mbps")
    "netshape: netshape_rate '100Mbps' is ambiguous (tc reads mbps as MB/s, 8 times more); write 100mbit"
    """
    return "" if str(rate).strip() == "" else _parse(rate)[1]


def netshape_want(rate, burst_s=0.004, min_burst_bytes=131072, queue_s=0.020):
    """The tbf wanted for a rate such as 1gbit; {'shaped': False} for native.

    >>> netshape_want("1gbit")
    {'shaped': True, 'mbit': 1000.0, 'rate_bit': 1000000000, 'burst': 500000, 'limit': 2500000}
    """
    mbit, error = _parse(rate)
    if error:
        raise AnsibleFilterError(error)
    if mbit is None:
        return {"shaped": False}
    p = tbf_params(mbit, float(burst_s), int(min_burst_bytes), float(queue_s))
    return {"shaped": True, "mbit": mbit, "rate_bit": p["rate_bit"], "burst": p["burst_bytes"],
            "limit": p["limit_bytes"]}


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
    """netshape_rate_error, netshape_want, netshape_matches."""

    def filters(self):
        return {"netshape_want": netshape_want, "netshape_matches": netshape_matches,
                "netshape_rate_error": netshape_rate_error}
