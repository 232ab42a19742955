"""The parsers users type values into: golden examples, round trips, and only InputError."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT
from hypothesis import given
from hypothesis import strategies as st

from scalelab.core.errors import InputError
from scalelab.core.units import (
    format_rate,
    parse_cpus,
    parse_int_range,
    parse_rate_list,
    parse_rate_mbit,
    parse_size_bytes,
)

# ------------------------------------------------------------------------------ int ranges


@pytest.mark.parametrize("text, expected", [
    ("1-10", list(range(1, 11))),
    ("1,2,4,8", [1, 2, 4, 8]),
    ("1-16:2", [1, 3, 5, 7, 9, 11, 13, 15]),
    ("4", [4]),
    (4, [4]),
    (" 3 ", [3]),
    ("8,1-3,2", [1, 2, 3, 8]),
    ("5-5", [5]),
])
def test_parse_int_range_golden(text, expected):
    assert parse_int_range(text) == expected


@pytest.mark.parametrize("text", [
    "0", "-1", "abc", "10-1", "", " ", "1-2:0", "1,,2", "1 - 3", "1.5", "1-", "-", True,
    "0-3", "1-200000",
])
def test_parse_int_range_rejects(text):
    with pytest.raises(InputError):
        parse_int_range(text, "--nodes")


def test_parse_int_range_names_the_option_and_the_fix():
    with pytest.raises(InputError, match=r"^--nodes: '10-1' runs backwards; write it as 1-10$"):
        parse_int_range("10-1", "--nodes")
    with pytest.raises(InputError, match=r"--nodes: 0 in '0' is below the minimum of 1"):
        parse_int_range("0", "--nodes")


def test_parse_int_range_minimum_zero_allows_zero():
    assert parse_int_range("0-2", minimum=0) == [0, 1, 2]


@given(st.lists(st.integers(min_value=1, max_value=10_000), min_size=1, max_size=20))
def test_comma_lists_give_sorted_distinct_values(values):
    assert parse_int_range(",".join(map(str, values))) == sorted(set(values))


@given(st.integers(1, 500), st.integers(0, 500), st.integers(1, 50))
def test_stepped_range_matches_python_range(lo, span, step):
    hi = lo + span
    assert parse_int_range(f"{lo}-{hi}:{step}") == list(range(lo, hi + 1, step))


@given(st.text(max_size=30))
def test_parse_int_range_only_ever_raises_input_error(text):
    try:
        out = parse_int_range(text)
    except InputError:
        return
    assert out == sorted(set(out)) and all(v >= 1 for v in out)


# ------------------------------------------------------------------------------ rates


@pytest.mark.parametrize("text, mbit", [
    ("1gbit", 1000.0), ("10gbit", 10_000.0), ("100mbit", 100.0), ("1.5gbit", 1500.0),
    ("100kbit", 0.1), ("1000000bit", 1.0), ("1Gbit", 1000.0), (" 10GBIT ", 10_000.0),
    ("native", None), (" Native ", None),
])
def test_parse_rate_golden(text, mbit):
    assert parse_rate_mbit(text) == mbit


@pytest.mark.parametrize("text", [
    "fast", "0mbit", "0", "0.0gbit", "-1mbit", "", "1tbit", "50kbit", "500gbit", "1 gigabit",
])
def test_parse_rate_rejects(text):
    with pytest.raises(InputError, match="bandwidth"):
        parse_rate_mbit(text)


@pytest.mark.parametrize("mbit, text", [
    (1000.0, "1gbit"), (10_000.0, "10gbit"), (100.0, "100mbit"), (1500.0, "1500mbit"),
    (2.5, "2500kbit"), (None, "native"),
])
def test_format_rate_golden(mbit, text):
    assert format_rate(mbit) == text


@given(st.integers(min_value=100, max_value=400_000_000))
def test_format_then_parse_gives_the_same_rate(kbit):
    mbit = kbit / 1000  # every rate tc can be told, to the kbit
    assert parse_rate_mbit(format_rate(mbit)) == mbit


@given(st.sampled_from(["kbit", "mbit", "gbit"]), st.integers(1, 400))
def test_parse_then_format_is_canonical(unit, n):
    text = f"{n * 1000 if unit == 'kbit' else n}{unit}"
    assert parse_rate_mbit(format_rate(parse_rate_mbit(text))) == parse_rate_mbit(text)


@given(st.text(max_size=20))
def test_parse_rate_only_ever_raises_input_error(text):
    try:
        mbit = parse_rate_mbit(text)
    except InputError:
        return
    assert mbit is None or 0.1 <= mbit <= 400_000


@pytest.mark.parametrize("text, hint", [
    # tc reads "mbps" as megabytes per second: 8 times what a user writing 100Mbps means
    ("100Mbps", "'100Mbps' is ambiguous (tc reads mbps as MB/s, 8 times more); write 100mbit"),
    ("10gbps", "'10gbps' is ambiguous (tc reads gbps as GB/s, 8 times more); write 10gbit"),
    ("125MBps", "'125MBps' is bytes per second; tc and scalelab take bits: write 1gbit"),
    ("12.5MB/s", "'12.5MB/s' is bytes per second; tc and scalelab take bits: write 100mbit"),
    ("100", "'100' has no unit; write e.g. 100mbit or 100gbit"),
    ("1G", "'1G' has no unit; write 1gbit"),
    ("2.5 m", "'2.5 m' has no unit; write 2.5mbit"),
])
def test_parse_rate_refuses_what_tc_would_read_otherwise(text, hint):
    with pytest.raises(InputError) as e:
        parse_rate_mbit(text)
    assert str(e.value) == f"bandwidth: {hint}"


def test_bench_refuses_a_megabytes_rate_before_planning(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "invoke", "bench", "--cluster", "nosuch",
                           "--bandwidth", "1gbit,100Mbps", "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SCALELAB_HOME": str(tmp_path)})
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].endswith("write 100mbit")
    assert not any(tmp_path.iterdir())


def test_parse_rate_list_keeps_order_and_drops_repeats():
    assert parse_rate_list("10gbit,1gbit,10gbit,native") == [10_000.0, 1000.0, None]
    with pytest.raises(InputError):
        parse_rate_list("")
    with pytest.raises(InputError):
        parse_rate_list("1gbit,fast")


# ------------------------------------------------------------------------------ sizes and cpus


@pytest.mark.parametrize("text, nbytes", [
    ("64M", 64 << 20), ("1KiB", 1024), (512, 512), ("4096", 4096), ("1G", 1 << 30),
    ("1.5K", 1536), ("2t", 2 << 40), ("16mb", 16 << 20),
])
def test_parse_size_golden(text, nbytes):
    assert parse_size_bytes(text) == nbytes


@pytest.mark.parametrize("text", ["0", 0, -1, "abc", "-1K", "", "0.5", "9" * 400, "2000T"])
def test_parse_size_rejects(text):
    with pytest.raises(InputError, match="size"):
        parse_size_bytes(text)


@given(st.integers(1, 4096), st.sampled_from([("", 0), ("K", 10), ("M", 20), ("G", 30)]))
def test_parse_size_units_are_binary(n, unit):
    suffix, shift = unit
    assert parse_size_bytes(f"{n}{suffix}") == n << shift


@given(st.text(max_size=20))
def test_parse_size_only_ever_raises_input_error(text):
    try:
        assert parse_size_bytes(text) >= 1
    except InputError:
        pass


@pytest.mark.parametrize("text, cpus", [("0.5", 0.5), (2, 2.0), ("1", 1.0), (" 0.25 ", 0.25)])
def test_parse_cpus_golden(text, cpus):
    assert parse_cpus(text) == cpus


@pytest.mark.parametrize("text", ["0", 0, "-1", "abc", "nan", "inf", "0.001", None, ""])
def test_parse_cpus_rejects(text):
    with pytest.raises(InputError, match="cpus-per-node"):
        parse_cpus(text)


def test_docstring_examples_hold():
    import doctest

    import scalelab.core.units

    result = doctest.testmod(scalelab.core.units)
    assert result.attempted > 5 and result.failed == 0, result
