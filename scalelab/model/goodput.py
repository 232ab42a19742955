"""What failures leave of a run's throughput: goodput from the checkpoint cost and recovery
time a sweep measured, for a failure rate the user states.

Failures come as a Poisson process while the job runs: a job on N nodes, each failing on
average once every node_mtbf_s, fails once every M = node_mtbf_s / N of its running time. The
job trains tau seconds between checkpoints, each of which blocks training C seconds; after a
failure it is training again R seconds later (scalelab measures R from the kill until every
rank is ready, the checkpoint loaded) and redoes the work since the last checkpoint. A
segment of tau + C seconds is then done after a geometric number of tries, e^((tau + C)/M) - 1
failed ones on average, each lost after the running time it had (M - (tau + C)/(e^((tau +
C)/M) - 1) on average) and R; so a segment takes (M + R)(e^((tau + C)/M) - 1) of wall time on
average, and the share of wall time spent on training is

    goodput(tau) = tau / ((M + R) (e^((tau + C)/M) - 1))

to first order (tau + C and R far below M) 1 - C/tau - (tau/2 + R)/M: the checkpoints' cost,
the work redone, and the restarts. Daly's model (J. T. Daly, "A higher order estimate of the
optimum checkpoint interval for restart dumps", FGCS 22(3), 2006) lets failures strike during
a restart as well, which puts M e^(R/M) in place of M + R: the same to first order, and
(R/M)^2 / 2 apart relatively after it (a 1-minute restart against a 3-hour MTBF: 0.0015
points); a difference only where R is not far below M. scalelab's injected failures strike only ranks that
train (scalelab.run.failures), so this form is the one a run with failures measures. Young's
interval (J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM
17(9), 1974) is sqrt(2 C M); Daly's refines it, sqrt(2 C M) (1 + sqrt(C/(2M))/3 + C/(18 M))
- C while C < 2M, else M.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The default failure rate a report assumes: Meta's Llama 3 405B pre-training saw 419
# unexpected interruptions in a 54-day snapshot on 16,384 H100s in 2,048 hosts of 8 ("The
# Llama 3 Herd of Models", 2024, section 3.3.4): one every 54 * 24 * 2048 / 419 hours per host.
LLAMA3_NODE_MTBF_H = 54 * 24 * 2048 / 419


def job_mtbf_s(node_mtbf_h: float, nodes: int) -> float:
    """The job's mean time between failures, in seconds, on `nodes` nodes.

    >>> round(job_mtbf_s(LLAMA3_NODE_MTBF_H, 2048) / 3600, 2)
    3.09
    """
    return node_mtbf_h * 3600.0 / nodes


def goodput(tau_s: float, c_s: float, r_s: float, m_s: float) -> float:
    """The share of wall time spent training (the module doc).

    >>> round(goodput(600, 10, 60, 3 * 3600), 4)  # to first order 1 - 1/60 - 360/10800 = 0.95
    0.9508
    >>> daly = 600 / (10800 * math.exp(60 / 10800) * math.expm1(610 / 10800))
    >>> round(100 * (goodput(600, 10, 60, 10800) - daly), 4)  # points
    0.0015
    >>> round(goodput(7.11, 1.368, 8.89, 20.0), 3)  # R not far below M: Daly's reads 0.432
    0.466
    >>> goodput(600, 10, 60, float("inf"))  # no failures: only the checkpoints' cost
    0.9836065573770492
    """
    if math.isinf(m_s):
        return tau_s / (tau_s + c_s)
    return tau_s / ((m_s + r_s) * math.expm1((tau_s + c_s) / m_s))


def young_s(c_s: float, m_s: float) -> float:
    """Young's interval, sqrt(2 C M).

    >>> young_s(10, 3600)
    268.32815729997475
    """
    return math.sqrt(2.0 * c_s * m_s)


def daly_s(c_s: float, m_s: float) -> float:
    """Daly's interval (the module doc).

    >>> round(daly_s(10, 3600), 2), daly_s(8000, 3600)
    (261.7, 3600)
    """
    if c_s >= 2.0 * m_s:
        return m_s
    x = math.sqrt(c_s / (2.0 * m_s))
    return math.sqrt(2.0 * c_s * m_s) * (1.0 + x / 3.0 + x * x / 9.0) - c_s


@dataclass(frozen=True)
class Terms:
    """Where the lost wall time goes at an interval, to first order (shares of wall time)."""

    checkpoints: float  # C / (tau + C)
    redone: float  # (tau + C) / 2 / M
    restarts: float  # R / M

    def dominant(self) -> str:
        """The largest term's name.

        >>> Terms(0.01, 0.03, 0.005).dominant()
        'the work redone after a failure'
        """
        named = {"the checkpoints": self.checkpoints,
                 "the work redone after a failure": self.redone,
                 "the restarts": self.restarts}
        return max(named, key=lambda k: named[k])


def terms(tau_s: float, c_s: float, r_s: float, m_s: float) -> Terms:
    """The first-order terms of goodput's loss (the module doc).

    >>> t = terms(600, 10, 60, 3 * 3600)
    >>> round(t.checkpoints, 4), round(t.redone, 4), round(t.restarts, 4)
    (0.0164, 0.0282, 0.0056)
    """
    return Terms(c_s / (tau_s + c_s), (tau_s + c_s) / 2.0 / m_s, r_s / m_s)
