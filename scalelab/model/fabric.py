"""Fabric profiles: what an allreduce achieves on a kind of network, not only its line rate.

A tc rate on a veth gives Gloo 90-96 % of the rate; NCCL over TCP on a real 25-100 Gbit/s
Ethernet with several GPUs per node reaches far less, and every hop of a ring pays a latency
however small the message. A profile (bench/fabrics/<name>.yml) states, per line rate, the
allreduce bus bandwidth as a share of the line rate (one GPU per node, and several) and the
per-hop latency, each with its source. `--fabric-profile NAME` makes a sweep's emulated links
carry that share (tc set to line x share, corrected for the framing tc does not count) and the
model use the same share and latency. ``ideal`` (the default) is the line rate as tc gives it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import yaml

from scalelab.core.errors import InputError, suggest
from scalelab.core.state import PROJECT_ROOT
from scalelab.core.units import format_rate, parse_rate_mbit

ROOT = PROJECT_ROOT
FABRICS_DIR = ROOT / "bench" / "fabrics"
IDEAL = "ideal"
# tc's tbf counts a frame's Ethernet header but not its preamble, FCS and gap: at MTU 1500 a
# TCP stream carries 1448 payload bytes per 1514 tc counts (per 1538 on a real wire)
TBF_PAYLOAD = 1448 / 1514


@dataclass(frozen=True)
class Line:
    line_gbit: float
    one_gpu_per_node: float
    several_gpus_per_node: float
    source: str


@dataclass(frozen=True)
class Fabric:
    name: str
    description: str
    per_hop_latency_s: float
    latency_source: str
    lines: tuple[Line, ...]

    def share(self, line_mbit: float, gpus_per_node: int = 1) -> float:
        """The allreduce bus bandwidth as a share of a line rate, for nodes of one GPU or
        several: interpolated on the log of the rate between the profile's lines, the nearest
        line's outside them.

        >>> f = load("ethernet-tcp")
        >>> f.share(1000.0), f.share(32000.0, 8), f.share(400000.0, 8)
        (0.941, 0.58, 0.4)
        >>> round(f.share(25000.0, 8), 3)   # between the 10 and 32 Gbit/s lines
        0.627
        """
        key = "one_gpu_per_node" if gpus_per_node <= 1 else "several_gpus_per_node"
        pts = [(math.log(ln.line_gbit * 1000.0), getattr(ln, key)) for ln in self.lines]
        x = math.log(line_mbit)
        if x <= pts[0][0]:
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
            if x <= x1:
                return round(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 6)
        return pts[-1][1]

    def collective_mbit(self, line_mbit: float, gpus_per_node: int = 1) -> float:
        """The rate an allreduce's ring achieves on a line (what the model takes as the link)."""
        return line_mbit * self.share(line_mbit, gpus_per_node)

    def tc_mbit(self, line_mbit: float, gpus_per_node: int = 1) -> float:
        """The rate tc is set to so that a TCP stream through it carries the collective rate.

        >>> round(load("ethernet-tcp").tc_mbit(1000.0), 1)    # the wire's framing, on a veth
        983.9
        """
        return min(line_mbit, self.collective_mbit(line_mbit, gpus_per_node) / TBF_PAYLOAD)

    def source_for(self, line_mbit: float) -> str:
        """Where a rate's share comes from, one line of text: its line's source, or which two
        lines it was interpolated between.

        >>> load("ethernet-tcp").source_for(25000.0)
        'interpolated between the 10 and 32 Gbit/s lines of bench/fabrics/ethernet-tcp.yml'
        """
        gbit = line_mbit / 1000.0
        for ln in self.lines:
            if abs(ln.line_gbit - gbit) <= 0.01 * ln.line_gbit:
                return " ".join(ln.source.split())
        below = [ln for ln in self.lines if ln.line_gbit < gbit]
        above = [ln for ln in self.lines if ln.line_gbit > gbit]
        if below and above:
            return (f"interpolated between the {below[-1].line_gbit:g} and "
                    f"{above[0].line_gbit:g} Gbit/s lines of bench/fabrics/{self.name}.yml")
        near = below[-1] if below else above[0]
        return f"the {near.line_gbit:g} Gbit/s line's: " + " ".join(near.source.split())

    def summary(self) -> str:
        return (f"{self.name}: {self.description}; per-hop latency "
                f"{self.per_hop_latency_s * 1e6:g} us")


# The path between the GPUs of one node, as what an allreduce among them achieves (Mbit/s of
# bus bandwidth). `--intra-link NAME` (or a rate) shapes each emulated node's loopback, which
# its ranks reach each other over, at this rate per ring edge, and the model takes the same.
# Unset, the loopback runs as fast as the host copies it and the model takes the path as free.
@dataclass(frozen=True)
class IntraLink:
    name: str
    mbit: float
    source: str


INTRA_LINKS = {link.name: link for link in (
    IntraLink("pcie3", 10 * 8000.0,
              "PCIe gen3 x16 moves 15.75 GB/s a direction; an allreduce ring among GPUs on it "
              "reaches about 10 GB/s of bus bandwidth (Pascal nodes of Horovod's own tables)"),
    IntraLink("pcie4", 20 * 8000.0,
              "PCIe gen4 x16 doubles gen3's lane rate (31.5 GB/s a direction); 20 GB/s is "
              "gen3's 10 GB/s doubled, an estimate, not a measurement"),
    IntraLink("nvlink-v100", 100 * 8000.0,
              "V100 SXM2 with NVLink (p3.16xlarge, DGX-1): NCCL's allreduce bus bandwidth in "
              "one node is above 100 GB/s; 100 GB/s is taken as its floor"),
)}


def intra_link(value: Any, what: str = "intra_link") -> tuple[str, float] | None:
    """A stated intra-node path: (its name as written back, its Mbit/s), from a name of
    INTRA_LINKS or a rate; None for unset ("host" or "native": the loopback as fast as the
    host copies).

    >>> intra_link("pcie3"), intra_link("40gbit"), intra_link(None), intra_link("host")
    (('pcie3', 80000.0), ('40gbit', 40000.0), None, None)
    >>> intra_link("pcie5")
    Traceback (most recent call last):
    ...
    scalelab.core.errors.InputError: intra_link: 'pcie5' is neither a path scalelab knows (pcie3, pcie4, nvlink-v100) nor a rate such as 64gbit
    """
    if value is None or str(value).strip().lower() in ("", "host", "native"):
        return None
    text = str(value).strip().lower()
    if text in INTRA_LINKS:
        return text, INTRA_LINKS[text].mbit

    try:
        mbit = parse_rate_mbit(text)
    except InputError:
        mbit = None
    if mbit is None:
        raise InputError(f"{what}: {value!r} is neither a path scalelab knows "
                         f"({', '.join(INTRA_LINKS)}) nor a rate such as 64gbit")
    return format_rate(mbit), mbit


def loopback_mbit(intra_mbit: float | None, nodes: int, ppn: int) -> float | None:
    """The rate a node's loopback is shaped to (before dilation) so that each edge of the
    allreduce ring among its ranks moves intra_mbit at once: the ring's edges inside a node
    share its loopback, ppn of them on one node (the ring closes there), ppn - 1 where the
    ring goes on to the next node. None where nothing is stated or no two ranks share a node.

    >>> loopback_mbit(80000.0, 1, 4), loopback_mbit(80000.0, 2, 4), loopback_mbit(None, 1, 4)
    (320000.0, 240000.0, None)
    >>> loopback_mbit(80000.0, 4, 1) is None
    True
    """
    if not intra_mbit or ppn < 2:
        return None
    return intra_mbit * (ppn if nodes <= 1 else ppn - 1)


def intra_source(name: str) -> str:
    """Where a stated intra-node path's rate comes from, one line.

    >>> intra_source("64gbit")
    'stated by the user'
    """
    link = INTRA_LINKS.get(name)
    return link.source if link else "stated by the user"


def names() -> list[str]:
    return list(_names())


@functools.lru_cache(maxsize=1)
def _names() -> tuple[str, ...]:
    return (IDEAL, *sorted(p.stem for p in FABRICS_DIR.glob("*.yml")))


def check_name(name: str) -> str:
    """A profile's name as given, or one line naming the known ones."""
    if name in names():
        return name

    raise InputError(f"fabric profile {name!r}{suggest(name, names())} is not known; give one "
                     f"of {', '.join(names())} (files in bench/fabrics/)")


@functools.lru_cache(maxsize=16)
def load(name: str) -> Fabric:
    """A shipped profile by name (its lines sorted by rate); ``ideal`` is not a file."""
    check_name(name)
    if name == IDEAL:
        raise InputError("the ideal fabric has no profile: it is the line rate as tc sets it")
    path = FABRICS_DIR / f"{name}.yml"
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    try:
        lines = tuple(sorted((Line(float(ln["line_gbit"]), float(ln["one_gpu_per_node"]),
                                   float(ln["several_gpus_per_node"]), str(ln["source"]))
                              for ln in doc["lines"]), key=lambda ln: ln.line_gbit))
        return Fabric(str(doc["name"]), str(doc["description"]),
                      float(doc["per_hop_latency_us"]) * 1e-6, str(doc["latency_source"]), lines)
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{path}: {e} is missing or malformed; see bench/fabrics/"
                         "ethernet-tcp.yml for the form") from None


def maybe(name: Any) -> Fabric | None:
    """A run's profile, or None for the ideal fabric (and for runs from before profiles)."""
    if not isinstance(name, str) or name in ("", IDEAL) or name not in names():
        return None
    return load(name)


def tc_line_mbit(line_mbit: float | None, profile: Any, gpus_per_node: int = 1) -> float | None:
    """The rate tc gives a run's links (before dilation): the line rate on the ideal fabric,
    the profile's collective share of it otherwise; None (native) stays None.

    >>> tc_line_mbit(1000.0, "ideal"), tc_line_mbit(None, "ethernet-tcp")
    (1000.0, None)
    >>> round(tc_line_mbit(10000.0, "ethernet-tcp", 4))
    8365
    """
    fab = maybe(profile)
    if line_mbit is None or fab is None:
        return line_mbit
    return round(fab.tc_mbit(line_mbit, gpus_per_node), 3)
