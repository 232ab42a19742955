"""A sweep's progress on the terminal: run k of n, what it runs, and the time left."""

from __future__ import annotations

import datetime as dt
import time

from tqdm import tqdm

from scalelab.run.driver import Progress


class Bar:
    """tqdm bar over runs: run k of n, the current configuration, and the time left: the
    sweep's estimate for the runs to go, scaled by how the finished ones kept to theirs."""

    def __init__(self, total: int, estimate_s: float) -> None:
        self.total, self.estimate_s, self.t0 = total, estimate_s, time.monotonic()
        self.bar = None  # drawn when the first run starts, so a preflight error stands alone
        self.done = 0

    def left(self) -> str:
        per_run = self.estimate_s / max(self.total, 1)
        pace = (time.monotonic() - self.t0) / (per_run * self.done) if self.done and per_run else 1
        return str(dt.timedelta(seconds=int(per_run * (self.total - self.done) * pace)))

    def update(self, p: Progress) -> None:
        if self.bar is None:
            self.bar = tqdm(total=self.total, unit="run", dynamic_ncols=True,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}] {postfix}")
        if p.record is None:
            self.bar.set_description_str(f"run {p.index + 1}/{p.total}")
            self.bar.set_postfix_str(f"{p.description.strip()}, about {self.left()} left")
            return
        if p.record["status"] != "ok":
            self.bar.write(f"{p.run_id}: {p.record['status']}: {p.record['error']}")
        self.done += 1
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
