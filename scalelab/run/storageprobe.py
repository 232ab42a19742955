"""What a data source delivers to the nodes that read it: the storage probe and the decode probe.

The storage probe reads the source's shards from N nodes at once (bench/workloads/dataprobe.py
read), each node with as many streams as a rank has loader workers, each stream whole shards,
for a fixed time, all from one instant (the controller's): the sum of the nodes' rates, each
over its own window and its own clock, is the aggregate rate the storage gives N readers,
measured in the data's own access pattern and over the links the
training uses (shaped as the run's are). The decode probe times the model's input pipeline on
one core of one node over the source's own images (dataprobe.py decode).

Both run through scalelab.run.launch like the workloads (process groups reaped by pid), bounded
in time by the probe itself and by launch's timeout; a failure comes back as a reason, never as
an exception, and the run goes on without the figure.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from scalelab.cluster.nodes import Node
from scalelab.core.errors import ScalelabError
from scalelab.run import commands, launch

log = logging.getLogger(__name__)

# each storage probe point: long enough for TCP to reach a shaped rate and for every stream to
# open several shards (an NFS reader's reopen of a 1.1 MB shard stalls a second or two behind
# a full queue: at 20 Mbit/s a 5 s probe gave 82 % and 50 % of the link, 15 s 92 % and 87 %)
READ_SECONDS = 15.0
DECODE_SECONDS = 3.0
SLACK_S = 60.0  # ssh, interpreter start (decode imports torch) and reaping
# the readers start together this long after launch (ssh and interpreter start, more nodes
# more time), so that every reader is up at the instant and the span is one window
START_SLACK_S = 2.0
START_SLACK_PER_NODE_S = 0.5  # each node's ssh and interpreter start, on busy hosts
# the share of the reading time all nodes must have read in together, or the probe failed
OVERLAP = 0.5
# the first second all nodes read in is left out (as iperf3's --omit leaves out TCP's slow
# start): loaders read all through a run, so what counts is the rate streams settle at; the
# readers' counts trail what they received by one small read (dataprobe.CHUNK), so the bytes
# counted from that instant are bytes that crossed the link after it
OMIT_S = 1.0
# the share of the reading time that must be left once that is left out, or the probe failed
MIN_WINDOW = 0.4
FIRST_BYTES = "every node had its first bytes"  # a probe whose window that left too short
LATE_RETRY = 3.0  # is read once more, this many times as long


@dataclass(frozen=True)
class StorageProbe:
    """N nodes reading a source at once: MB/s in all (None: not measured, and why)."""

    source: str
    nodes: int
    streams: int  # per node
    mb_s: float | None
    per_node_mb_s: tuple[float, ...] = ()
    seconds: float = 0.0
    error: str = ""

    def as_record(self) -> dict[str, Any]:
        return {"read_mb_s": self.mb_s, "read_nodes": self.nodes, "read_streams": self.streams,
                "read_per_node_mb_s": list(self.per_node_mb_s), "read_seconds": self.seconds,
                "read_error": self.error}


@dataclass(frozen=True)
class DecodeProbe:
    """One core's input pipeline on one node, over the source's images."""

    source: str
    img_s_per_core: float | None
    jpeg_bytes_mean: float | None = None  # the images it decoded (no tar headers)
    error: str = ""

    def as_record(self) -> dict[str, Any]:
        return {"decode_img_s_per_core": self.img_s_per_core,
                "jpeg_bytes_mean": self.jpeg_bytes_mean, "decode_error": self.error}


def _script(rt: launch.Runtime) -> str:
    return f"{rt.workdir}/{commands.WORKLOADS}/dataprobe.py"


def read_commands(nodes: list[Node], rt: launch.Runtime, source: str, streams: int,
                  seconds: float, start_at: float) -> list[commands.RankCommand]:
    """Every node's reader, node i reading slot i of len(nodes), all from start_at.

    >>> rt = launch.Runtime("/v/bin/python", "/w", "/kh")
    >>> ns = [Node("c-n0", "10.0.0.10", "10.0.0.10", "head", "local")]
    >>> " ".join(read_commands(ns, rt, "/d/in", 2, 4.0, 1e9)[0].argv)
    '/v/bin/python /w/bench/workloads/dataprobe.py read --data /d/in --slot 0 --slots 1 --streams 2 --seconds 4 --start-at 1000000000.000'
    """
    return [commands.RankCommand(n, [rt.python, _script(rt), "read", "--data", source,
                                     "--slot", str(i), "--slots", str(len(nodes)),
                                     "--streams", str(streams), "--seconds", f"{seconds:g}",
                                     "--start-at", f"{start_at:.3f}"])
            for i, n in enumerate(nodes)]


def _why(res: launch.LaunchResult) -> str:
    for o in res.outcomes:
        if o.returncode not in (0, None):
            last = [x for x in o.stderr.strip().splitlines() if x.strip()]
            return f"{o.node}: {last[-1][:300] if last else f'exit {o.returncode}'}"
    return res.error.splitlines()[0][:300] if res.error else res.status


def measure_read(nodes: list[Node], rt: launch.Runtime, source: str, streams: int,
                 seconds: float = READ_SECONDS,
                 stop: threading.Event | None = None) -> StorageProbe:
    """The aggregate rate these nodes read the source at, all at once. Where a node's first
    bytes came too late to leave a window (an NFS client's handshakes behind a full queue, many
    nodes at once), the probe is read once more, LATE_RETRY times as long."""
    got = _measure_read(nodes, rt, source, streams, seconds, stop)
    if got.mb_s is None and FIRST_BYTES in got.error and not (stop and stop.is_set()):
        log.info("storage probe of %s: %s; reading again for %g s", source, got.error,
                 seconds * LATE_RETRY)
        got = _measure_read(nodes, rt, source, streams, seconds * LATE_RETRY, stop)
    return got


def _measure_read(nodes: list[Node], rt: launch.Runtime, source: str, streams: int,
                  seconds: float, stop: threading.Event | None) -> StorageProbe:
    slack = START_SLACK_S + START_SLACK_PER_NODE_S * len(nodes)
    start_at = time.time() + slack
    try:
        res = launch.run(read_commands(nodes, rt, source, streams, seconds, start_at), rt,
                         timeout_s=seconds + slack + SLACK_S, stop=stop, fail_grace_s=1.0)
    except (ScalelabError, OSError) as exc:
        return StorageProbe(source, len(nodes), streams, None, error=f"could not start: {exc}")
    got = [launch.parse_result(o.stdout) for o in res.outcomes]
    if any(g is None for g in got) or any(o.returncode != 0 for o in res.outcomes):
        why = _why(res)
        log.warning("storage probe of %s from %d node(s) failed: %s", source, len(nodes), why)
        return StorageProbe(source, len(nodes), streams, None, error=why)
    longest = max(float(g["seconds"]) for g in got)
    per_node, why = window_rates([g["samples"] for g in got], seconds)
    if why:
        why = f"the {len(nodes)} nodes {why}"
        log.warning("storage probe of %s: %s", source, why)
        return StorageProbe(source, len(nodes), streams, None, error=why)
    total = round(sum(per_node), 2)
    log.info("storage %s: %.1f MB/s to %d node(s) at once", source, total, len(nodes))
    return StorageProbe(source, len(nodes), streams, total, per_node, round(longest, 3))


def window_rates(samples: list[list[list[float]]], seconds: float
                 ) -> tuple[tuple[float, ...], str]:
    """Each node's MB/s over the window every node was reading in, less its first OMIT_S
    (slow start), from their samples of (wall clock, bytes so far); or why there is none.

    A node whose first second crawls and which then reads 10 MB/s gives 10 MB/s; so does one
    whose first bytes come after a second, counted from then:

    >>> window_rates([[[0.0, 0], [1.0, 1e6], [2.0, 11e6], [4.0, 31e6]]], 4.0)
    ((10.0,), '')
    >>> window_rates([[[0.0, 0], [0.9, 0], [1.9, 1e6], [5.0, 32e6]]], 5.0)
    ((10.0,), '')
    >>> window_rates([[[0.0, 0], [4.0, 8e6]], [[3.0, 0], [7.0, 8e6]]], 4.0)[1]
    'read at once for 1.00 s of 4 s (they did not start together: the hosts were too busy)'
    """
    lo, hi = common_window(samples)
    if hi - lo < OVERLAP * seconds:
        return (), (f"read at once for {max(hi - lo, 0):.2f} s of {seconds:g} s (they did not "
                    "start together: the hosts were too busy)")
    # from the instant every node has its first bytes (a stream's start is a handshake, an
    # NFS client's several, each behind the queue of the streams already flowing), less slow start
    flowing = max(first_byte(s, hi) for s in samples)
    lo = max(lo, flowing) + OMIT_S
    if hi - lo < MIN_WINDOW * seconds:
        return (), (f"read at once for {max(hi - lo, 0):.2f} s of {seconds:g} s once "
                    f"{FIRST_BYTES} ({flowing - common_window(samples)[0]:.2f} s in) and "
                    f"{OMIT_S:g} s of slow start was left out")
    return tuple(round((bytes_at(s, hi) - bytes_at(s, lo)) / (hi - lo) / 1e6, 2)
                 for s in samples), ""


def first_byte(samples: list[list[float]], otherwise: float) -> float:
    """When a node's count first rose (otherwise, if it never did).

    >>> first_byte([[0.0, 0], [0.5, 0], [1.0, 64], [2.0, 128]], 9.0)
    0.5
    """
    for prev, cur in zip(samples, samples[1:], strict=False):
        if cur[1] > 0:
            return prev[0]
    return otherwise


def common_window(samples: list[list[list[float]]]) -> tuple[float, float]:
    """The wall-clock window every node's samples cover: (latest start, earliest end).

    >>> common_window([[[0.0, 0], [4.0, 8]], [[1.0, 0], [5.0, 8]]])
    (1.0, 4.0)
    """
    return max(s[0][0] for s in samples), min(s[-1][0] for s in samples)


def bytes_at(samples: list[list[float]], t: float) -> float:
    """A node's bytes read by wall-clock time t, between its samples linearly.

    >>> bytes_at([[0.0, 0], [1.0, 100], [2.0, 300]], 1.5)
    200.0
    """
    prev = samples[0]
    for cur in samples[1:]:
        if cur[0] >= t:
            span = cur[0] - prev[0]
            return prev[1] + (cur[1] - prev[1]) * ((t - prev[0]) / span if span > 0 else 1.0)
        prev = cur
    return float(samples[-1][1])


def measure_decode(node: Node, rt: launch.Runtime, source: str, image_size: int,
                   seconds: float = DECODE_SECONDS,
                   stop: threading.Event | None = None) -> DecodeProbe:
    """Images/s one core of this node decodes and crops the source's images at."""
    cmd = commands.RankCommand(node, [rt.python, _script(rt), "decode", "--data", source,
                                      "--seconds", f"{seconds:g}", "--image-size",
                                      str(image_size)])
    try:
        res = launch.run([cmd], rt, timeout_s=seconds + SLACK_S, stop=stop)
    except (ScalelabError, OSError) as exc:
        return DecodeProbe(source, None, error=f"could not start: {exc}")
    got = launch.parse_result(res.outcomes[0].stdout) if res.outcomes else None
    if got is None or res.outcomes[0].returncode != 0:
        return DecodeProbe(source, None, error=_why(res))
    return DecodeProbe(source, float(got["img_s_per_core"]), float(got["jpeg_bytes_mean"]))
