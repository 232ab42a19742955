"""Parsers for the values users type: node ranges, integer lists, link rates, sizes.

All pure; each raises InputError with a message that names the value and the fix.
"""

from __future__ import annotations

import re

from scalelab.core.errors import InputError

_RANGE_ITEM = re.compile(r"^(?P<lo>-?\d+)(?:-(?P<hi>-?\d+)(?::(?P<step>-?\d+))?)?$")
_RATE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)(?P<unit>[kmg]?)bit$")
# what people write that tc reads differently: tc's "mbps" is megaBYTES per second, 8 times
# what most mean by it, and a bare number is bits per second; both are refused with the fix
_PER_SECOND = re.compile(r"^(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[kKmMgG]?)(?P<b>[bB])(?:ps|/s)$")
_BARE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[kKmMgG]?)$")
_SIZE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[kmgt]?)(?:i?b)?$", re.IGNORECASE)

# powers of ten to Mbit/s; dividing by 10**3 (not multiplying by 1e-3, which is inexact) makes
# 1001kbit exactly the float 1.001, so format_rate and parse_rate_mbit round-trip
_RATE_EXP = {"": -6, "k": -3, "m": 0, "g": 3}
_SIZE_MULT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

NATIVE = "native"


def parse_int_range(text: str | int, what: str = "value", minimum: int = 1) -> list[int]:
    """Expand a range expression into a sorted list of distinct integers.

    Accepts a single number, comma lists, ``lo-hi`` and ``lo-hi:step``.

    >>> parse_int_range("1-10")
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    >>> parse_int_range("1,2,4,8")
    [1, 2, 4, 8]
    >>> parse_int_range("1-16:2")
    [1, 3, 5, 7, 9, 11, 13, 15]
    """
    if isinstance(text, bool):
        raise InputError(f"{what}: {text!r} is not a number; give e.g. 4, 1-10, 1,2,4 or 1-16:2")
    if isinstance(text, int):
        text = str(text)
    raw = str(text).strip()
    if not raw:
        raise InputError(f"{what}: empty; give e.g. 4, 1-10, 1,2,4 or 1-16:2")
    values: set[int] = set()
    for item in raw.split(","):
        item = item.strip()
        m = _RANGE_ITEM.match(item)
        if not m:
            raise InputError(
                f"{what}: {item!r} is not a number or range; give e.g. 4, 1-10, 1,2,4 or 1-16:2"
            )
        lo = int(m["lo"])
        hi = int(m["hi"]) if m["hi"] is not None else lo
        step = int(m["step"]) if m["step"] is not None else 1
        if step < 1:
            raise InputError(f"{what}: step in {item!r} must be 1 or more")
        if hi < lo:
            raise InputError(f"{what}: {item!r} runs backwards; write it as {hi}-{lo}")
        if lo < minimum:
            raise InputError(f"{what}: {lo} in {item!r} is below the minimum of {minimum}")
        if (hi - lo) // step > 100_000:
            raise InputError(f"{what}: {item!r} expands to too many values")
        values.update(range(lo, hi + 1, step))
    return sorted(values)


def parse_rate_mbit(text: str) -> float | None:
    """Parse a link rate into Mbit/s; ``native`` (unshaped) gives None.

    >>> parse_rate_mbit("1gbit")
    1000.0
    >>> parse_rate_mbit("100mbit")
    100.0
    >>> parse_rate_mbit("native") is None
    True
    """
    given = str(text).strip()
    raw = given.lower()
    if raw == NATIVE:
        return None
    m = _RATE.match(raw)
    if not m:
        raise InputError(_rate_hint(text, given))
    mbit = _mbit(m["num"], m["unit"])
    if mbit <= 0:
        raise InputError(f"bandwidth: {text!r} is zero; give a positive rate or native")
    if mbit < 0.1:
        raise InputError(f"bandwidth: {text!r} is below 100kbit, too slow to train over")
    if mbit > 400_000:
        raise InputError(f"bandwidth: {text!r} is above 400gbit; give a realistic link rate")
    return mbit


def _rate_hint(text: str, given: str) -> str:
    """The one line that says why a rate was refused and what to write instead."""
    ps = _PER_SECOND.match(given)
    if ps:
        unit = ps["unit"].lower()
        if ps["b"] == "B":  # bytes per second, e.g. 125MBps: say it in bits
            return (f"bandwidth: {text!r} is bytes per second; tc and scalelab take bits: "
                    f"write {format_rate(_mbit(ps['num'], unit) * 8)}")
        return (f"bandwidth: {text!r} is ambiguous (tc reads {unit}bps as {unit.upper()}B/s, "
                f"8 times more); write {ps['num']}{unit}bit")
    bare = _BARE.match(given)
    if bare:
        unit = bare["unit"].lower()
        if unit:
            return f"bandwidth: {text!r} has no unit; write {bare['num']}{unit}bit"
        return (f"bandwidth: {text!r} has no unit; write e.g. {bare['num']}mbit or "
                f"{bare['num']}gbit")
    return f"bandwidth: {text!r} is not a rate; give e.g. 100mbit, 1gbit, 10gbit or native"


def _mbit(num: str, unit: str) -> float:
    exp = _RATE_EXP[unit]
    return float(num) * 10**exp if exp >= 0 else float(num) / 10**-exp


def format_rate(mbit: float | None) -> str:
    """Format a rate in Mbit/s the way tc and users write it.

    >>> format_rate(1000.0), format_rate(100.0), format_rate(None), format_rate(2.5)
    ('1gbit', '100mbit', 'native', '2500kbit')
    """
    if mbit is None:
        return NATIVE
    if mbit >= 1000 and float(mbit / 1000).is_integer():
        return f"{int(mbit // 1000)}gbit"
    if float(mbit).is_integer():
        return f"{int(mbit)}mbit"
    return f"{int(round(mbit * 1000))}kbit"


def parse_rate_list(text: str) -> list[float | None]:
    """Parse a comma list of rates, keeping order and dropping repeats.

    >>> parse_rate_list("1gbit,10gbit")
    [1000.0, 10000.0]
    """
    out: list[float | None] = []
    parts = [p for p in str(text).split(",")]
    if not any(p.strip() for p in parts):
        raise InputError("bandwidth: empty; give e.g. 1gbit,10gbit or native")
    for part in parts:
        rate = parse_rate_mbit(part)
        if rate not in out:
            out.append(rate)
    return out


def parse_size_bytes(text: str | int) -> int:
    """Parse a byte size with binary units.

    >>> parse_size_bytes("64M"), parse_size_bytes("1KiB"), parse_size_bytes(512)
    (67108864, 1024, 512)
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 1:
            raise InputError(f"size: {text} must be 1 byte or more")
        return text
    m = _SIZE.match(str(text).strip())
    if not m:
        raise InputError(f"size: {text!r} is not a size; give e.g. 4096, 64K, 256M or 1G")
    scaled = float(m["num"]) * _SIZE_MULT[m["unit"].lower()]
    if scaled > 1 << 50:
        raise InputError(f"size: {text!r} is above 1P; give e.g. 4096, 64K, 256M or 1G")
    value = int(scaled)
    if value < 1:
        raise InputError(f"size: {text!r} must be 1 byte or more")
    return value


def parse_cpus(text: str | float) -> float:
    """Parse a CPU share per node (fractions allowed).

    >>> parse_cpus("0.5"), parse_cpus(2)
    (0.5, 2.0)
    """
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise InputError(f"cpus-per-node: {text!r} is not a number; give e.g. 0.5 or 2") from None
    if not value > 0 or value != value or value == float("inf"):
        raise InputError(f"cpus-per-node: {text!r} must be above 0; give e.g. 0.5 or 2")
    if value < 0.01:
        raise InputError(f"cpus-per-node: {text!r} is below 0.01 CPU, the smallest quota")
    return value
