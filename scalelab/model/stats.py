"""Statistics the report rests on: Student's t from first principles (no scipy), confidence
intervals of a mean, and the half-width of a series' interval."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from scalelab.core.errors import InputError


def _two_sided_coverage(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer df (Abramowitz & Stegun 26.7.3, exact series)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    s = math.sin(theta)
    if df % 2 == 0:
        term = total = 1.0
        for k in range(1, (df - 2) // 2 + 1):
            term *= (2 * k - 1) / (2 * k) * c2
            total += term
        return s * total
    if df == 1:
        return 2 * theta / math.pi
    term = total = math.cos(theta)
    for k in range(1, (df - 3) // 2 + 1):
        term *= (2 * k) / (2 * k + 1) * c2
        total += term
    return 2 / math.pi * (theta + s * total)


@lru_cache(maxsize=256)
def t_critical(df: int, confidence: float = 0.95) -> float:
    """Two-sided Student t critical value: P(|T| < value) = confidence.

    Solved by bisection on the exact series for integer df (no SciPy needed).

    >>> round(t_critical(1), 3), round(t_critical(2), 3), round(t_critical(4), 3)
    (12.706, 4.303, 2.776)
    >>> round(t_critical(30), 3)
    2.042
    """
    if df < 1 or int(df) != df:
        raise InputError(f"t_critical: degrees of freedom {df!r} must be a positive integer")
    if not 0 < confidence < 1:
        raise InputError(f"t_critical: confidence {confidence!r} must be between 0 and 1")
    lo, hi = 0.0, 1.0
    while _two_sided_coverage(hi, int(df)) < confidence:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if _two_sided_coverage(mid, int(df)) < confidence:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Interval:
    """A mean with its 95 % confidence interval over n repeats (lo/hi NaN when n < 2)."""

    mean: float
    lo: float
    hi: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2


def mean_ci(values: Any, confidence: float = 0.95) -> Interval:
    """Mean and Student t confidence interval of repeated measurements (NaNs dropped).

    Worked example, values 10, 12, 14: mean 12, sample sd 2, n 3, t(0.975, df=2) = 4.303,
    half width = 4.303 x 2 / sqrt(3) = 4.969.

    >>> ci = mean_ci([10, 12, 14])
    >>> ci.mean, round(ci.lo, 3), round(ci.hi, 3), ci.n
    (12.0, 7.032, 16.968, 3)
    >>> mean_ci([5.0])
    Interval(mean=5.0, lo=nan, hi=nan, n=1)
    """
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    n = int(arr.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(arr.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n)
    half = t_critical(n - 1, confidence) * float(arr.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def ci_half(std: pd.Series, count: pd.Series) -> pd.Series:
    """Vectorised t half-widths: NaN where fewer than two repeats."""
    tvals = count.map(lambda n: t_critical(int(n) - 1) if n >= 2 else math.nan)
    return tvals.astype(float) * std / np.sqrt(count.astype(float))
