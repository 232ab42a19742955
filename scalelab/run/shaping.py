"""Link rates during a sweep: set one rate on every node, put the links back at the end.

Shaper is the same on every target; what it drives is the target's Links
(scalelab.cluster.targets.interface). On real clusters that is netshape.SshLinks: the tbf on
each node's cluster interface over SSH, after a snapshot of the interface's root qdisc, which
is what gets restored (at the end of the sweep, on Ctrl-C, on a failure, and on the next sweep or
--resume after a driver was killed outright, from the marker file).
"""

from __future__ import annotations

import json
import logging
from contextlib import suppress
from pathlib import Path
from typing import Any

from scalelab.cluster import netshape
from scalelab.core.errors import ClusterError, ScalelabError
from scalelab.core.state import write_atomic

log = logging.getLogger(__name__)

UNSET = object()
class Shaper:
    """Sets one rate on every link of a cluster; restores what was there before the first change.

    marker: a file holding the snapshot to go back to while the links are at another rate.
    It is written before the links change, so a driver killed with SIGKILL leaves it behind,
    and the next Shaper of the cluster restores from it, unless the rate was changed by hand
    since (Links.still_as_left).
    """

    def __init__(self, links: Any, marker: Path | None = None) -> None:
        self.links = links
        self.marker = marker
        self.original: Any = UNSET
        self.current: Any = UNSET
        self.intra: Any = UNSET  # the rate on the path between a node's ranks
        self.delay_us = 0.0  # the per-hop delay under the current rate
        note = self._read_marker()
        if note is not None and links.still_as_left(note["to"]):
            self.original, self.current = note["original"], note["to"]
            log.info("links were left at %s by an interrupted driver; they are restored at the "
                     "end", netshape.describe(self.current))
        elif note is not None and self.marker is not None:
            with suppress(OSError):
                self.marker.unlink()

    def _read_marker(self) -> dict[str, Any] | None:
        if self.marker is None:
            return None
        try:
            note = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return None
        return note if isinstance(note, dict) and "original" in note and "to" in note else None

    def set(self, mbit: float | None, delay_us: float = 0.0) -> None:
        """One rate on every link; delay_us: a per-hop delay under it (links that can)."""
        if self.current is not UNSET and (mbit, delay_us) == (self.current, self.delay_us):
            return
        if self.original is UNSET:
            self.original = self.links.snapshot()
        if self.marker is not None:
            try:
                write_atomic(self.marker, json.dumps({"original": self.original, "to": mbit})
                             + "\n")
            except OSError as exc:
                raise ClusterError(f"cannot write {self.marker} ({exc.strerror}); links not "
                                   "changed") from None
        self.current, self.delay_us = mbit, delay_us
        self.links.apply(mbit, delay_us)

    def set_intra(self, mbit: float | None) -> None:
        """The rate between the ranks of each node (None: unshaped); the first call of a
        sweep always applies, so a rate a killed driver left is not measured again."""
        if self.intra is not UNSET and mbit == self.intra:
            return
        if self.original is UNSET:
            self.original = self.links.snapshot()  # restore() then unshapes this path too
        self.links.apply_intra(mbit)
        self.intra = mbit

    def set_node(self, name: str, mbit: float | None, min_queue_bytes: int = 0) -> None:
        """One node's link at its own rate after set(): a storage node's, its queue at least
        min_queue_bytes (restore() puts it back with the others)."""
        if self.original is UNSET:
            self.set(None if self.current is UNSET else self.current, self.delay_us)
        self.links.apply_node(name, mbit, self.delay_us, min_queue_bytes)

    def set_server(self, name: str, device_mbit: float, dilation: float = 1.0) -> None:
        """A server's link (a storage node's) at a rate in the emulated device's time: tc at
        device_mbit / dilation, its queue what a server NIC's holds at device_mbit
        (netshape.server_queue_bytes), so many readers' streams fare as on that link."""
        self.set_node(name, device_mbit / dilation, netshape.server_queue_bytes(device_mbit))

    def restore(self) -> None:
        """Put the links back as they were; a failure is logged, never raised (cleanup path)."""
        if self.original is UNSET:
            return
        try:
            self.links.restore(self.original)
        except (ScalelabError, OSError) as exc:
            log.warning("could not restore the links: %s (the marker %s keeps what to restore;"
                        " the next sweep on this cluster tries again)", exc, self.marker)
            return
        self.original = self.current = self.intra = UNSET
        if self.marker is not None:
            with suppress(OSError):
                self.marker.unlink()
