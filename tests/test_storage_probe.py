"""The storage probe's window (scalelab.run.storageprobe): the first bytes and slow start left
out, and a probe whose nodes' first bytes came too late read once more, longer."""

from __future__ import annotations

from scalelab.run import storageprobe
from scalelab.run.storageprobe import StorageProbe


def test_a_probe_whose_first_bytes_came_too_late_is_read_again_three_times_as_long(
        monkeypatch):
    asked = []

    def measure(nodes, rt, source, streams, seconds, stop):
        asked.append(seconds)
        if len(asked) == 1:
            _, why = storageprobe.window_rates(
                [[[0.0, 0], [2.9, 0], [3.0, 1e5], [5.0, 2e7]], [[0.0, 0], [5.0, 2e7]]], seconds)
            return StorageProbe(source, 2, streams, None, error=f"the 2 nodes {why}")
        return StorageProbe(source, 2, streams, 100.0, (50.0, 50.0), seconds)

    monkeypatch.setattr(storageprobe, "_measure_read", measure)
    got = storageprobe.measure_read([], None, "http://x/s-{0..1}.tar", 2, seconds=5.0)
    assert asked == [5.0, 15.0] and got.mb_s == 100.0


def test_a_probe_that_failed_otherwise_is_not_read_again(monkeypatch):
    asked = []

    def measure(nodes, rt, source, streams, seconds, stop):
        asked.append(seconds)
        return StorageProbe(source, 2, streams, None, error="n1: curl: (7) Failed to connect")

    monkeypatch.setattr(storageprobe, "_measure_read", measure)
    got = storageprobe.measure_read([], None, "http://x/s-{0..1}.tar", 2, seconds=5.0)
    assert asked == [5.0] and "Failed to connect" in got.error
