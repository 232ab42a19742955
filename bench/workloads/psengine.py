"""The parameter-server engine of resnet.py (--engine ps): synchronous push, sum, pull.

Every process of the run is in one torch.distributed group (Gloo), started by torchrun on every
node; the last --ps-servers-here processes of a node are servers, the others workers (roles).

* A worker trains under DDP over the workers' own group, with a communication hook (Pusher)
  in place of DDP's allreduce, so buckets form and become ready exactly as they do for DDP. A
  bucket's flat buffer is cut into K near-equal shards; shard k goes to server k (a header,
  then the shard: isend), and the summed shard comes back (irecv). The worker divides by the
  number of workers, as DDP averages, and DDP's backward returns once every bucket is back;
  then the optimizer steps, so every worker holds the same parameters after every step.
  --ps-overlap on: a bucket is pushed when DDP hands it over, during backward; off: every
  bucket is held until the last one, then all are pushed, after backward.
* A server (serve) takes its shard of each bucket from every worker, sums them and sends the
  sum back to every worker, bucket after bucket, until each worker says it is done.

Nothing is asynchronous: no stale updates, no server-side optimizer. The pushes and pulls are
Gloo point-to-point messages over host memory, as BytePS's CPU servers take them: on a GPU a
bucket is copied to the host first.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

HEADER = 4  # int64s: kind, shard elements, dtype code, last bucket of the step
BUCKET, DONE = 1, 2
TAG_HEADER, TAG_PUSH, TAG_PULL = 101, 102, 103
DTYPES = ("float32", "float16", "bfloat16")  # the dtype code is an index here


@dataclass
class Roles:
    """Who does what in a parameter-server run (every process computes the same)."""

    workers: list[int]  # global ranks, in order
    servers: list[int]
    server: bool  # this process is a server
    worker_group: Any  # the workers' own process group (DDP's, and their gather's)

    @property
    def rank(self) -> int:
        """This worker's rank among the workers."""
        import torch.distributed as dist

        return self.workers.index(dist.get_rank())


def serves(servers_here: int, environ=os.environ) -> bool:
    """Whether this process is a server: one of the last servers_here local ranks of its node
    (torchrun's LOCAL_RANK and LOCAL_WORLD_SIZE), known before any group is joined.

    >>> serves(1, {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3"}), serves(1, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "3"})
    (True, False)
    """
    local_world = int(environ.get("LOCAL_WORLD_SIZE", "1"))
    return int(environ.get("LOCAL_RANK", "0")) >= local_world - servers_here


def roles(servers_here: int) -> Roles:
    """Every process says whether it serves (serves); all learn the lists, and the workers'
    group is made (by every process, as torch asks)."""
    import torch.distributed as dist

    mine = serves(servers_here)
    said: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(said, (dist.get_rank(), mine))
    workers = sorted(r for r, s in said if not s)
    servers = sorted(r for r, s in said if s)
    if not workers or not servers:
        raise ValueError(f"--engine ps needs workers and servers; this run has {len(workers)} "
                         f"worker(s) and {len(servers)} server(s) (--ps-servers-here names the "
                         "last processes of a node as servers)")
    if workers[0] != 0:
        raise ValueError("--engine ps: rank 0 must be a worker (servers are the last local "
                         "ranks of a node, and a node of servers only comes after the workers')")
    return Roles(workers, servers, mine, dist.new_group(workers))


def shards(numel: int, k: int) -> list[tuple[int, int]]:
    """[start, end) of k near-equal contiguous pieces of numel elements.

    >>> shards(10, 3)
    [(0, 4), (4, 7), (7, 10)]
    """
    base, extra = divmod(numel, k)
    out, start = [], 0
    for i in range(k):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


class Pusher:
    """A worker's side: DDP's comm hook state. One thread posts each bucket's pushes and pulls
    in the order DDP made the buckets ready (Gloo matches messages between two processes in the
    order they are posted) and goes straight on to the next bucket; a second thread waits for
    each bucket's pull, averages it into the bucket and completes its future. So the push of
    one bucket rides beside the pull of the one before, as on a full-duplex NIC."""

    def __init__(self, roles: Roles, timer: Any, comm_dtype: Any, overlap: bool) -> None:
        self.roles = roles
        self.timer = timer  # engines.CommTimer: launches and [launch, done] intervals
        self.comm_dtype = comm_dtype
        self.overlap = overlap
        self.held: list[tuple[Any, Any, bool]] = []
        self.work: queue.Queue = queue.Queue()
        self.posted: queue.Queue = queue.Queue()
        self.threads = [threading.Thread(target=self._post_loop, name="ps-push", daemon=True),
                        threading.Thread(target=self._pull_loop, name="ps-pull", daemon=True)]
        for t in self.threads:
            t.start()

    def submit(self, buf, fut, last: bool) -> None:
        if self.overlap:
            self.work.put((buf, fut, last))
            return
        self.held.append((buf, fut, last))  # off: all of the step's buckets after backward
        if last:
            for item in self.held:
                self.work.put(item)
            self.held = []

    def _post_loop(self) -> None:
        while True:
            item = self.work.get()
            if item is None:
                self.posted.put(None)
                return
            buf, fut, last = item
            try:
                self.posted.put((buf, fut, *self._post(buf, last)))
            except BaseException as e:  # noqa: BLE001 - handed to DDP's wait, which raises it
                fut.set_exception(e)

    def _post(self, buf, last: bool) -> tuple[Any, list, list]:
        import torch
        import torch.distributed as dist

        timer, servers = self.timer, self.roles.servers
        start = timer.clock.mark()
        with timer.lock:
            timer.launches.append(start)
        t = buf.detach().to("cpu")
        if self.comm_dtype is not None and t.dtype != self.comm_dtype:
            t = t.to(self.comm_dtype)
        code = DTYPES.index(str(t.dtype).replace("torch.", ""))
        works, kept = [], []
        back = torch.empty_like(t)
        for server, (lo, hi) in zip(servers, shards(t.numel(), len(servers)), strict=True):
            header = torch.tensor([BUCKET, hi - lo, code, int(last)], dtype=torch.int64)
            piece = t[lo:hi]
            works += [dist.isend(header, server, tag=TAG_HEADER),
                      dist.isend(piece, server, tag=TAG_PUSH),
                      dist.irecv(back[lo:hi], server, tag=TAG_PULL)]
            kept += [header, piece]  # alive until the sends are done
        return start, works, [back, kept]

    def _pull_loop(self) -> None:
        while True:
            item = self.posted.get()
            if item is None:
                return
            buf, fut, start, works, (back, _kept) = item
            try:
                for w in works:
                    w.wait()
                if self.timer.average:
                    back.div_(len(self.roles.workers))
                buf.copy_(back.view_as(buf))
                end = self.timer.clock.mark()
                with self.timer.lock:
                    self.timer.intervals.append((start, end))
                fut.set_result(buf)
            except BaseException as e:  # noqa: BLE001 - handed to DDP's wait, which raises it
                fut.set_exception(e)

    def finish(self) -> None:
        """Tell every server this worker is done, and end the threads."""
        import torch
        import torch.distributed as dist

        self.work.put(None)
        for t in self.threads:
            t.join()
        done = torch.tensor([DONE, 0, 0, 1], dtype=torch.int64)
        for w in [dist.isend(done, s, tag=TAG_HEADER) for s in self.roles.servers]:
            w.wait()


def ps_hook(state: Pusher, bucket):
    """DDP's comm hook: the bucket goes to the servers; its future completes when it is back."""
    import torch

    fut: torch.futures.Future = torch.futures.Future()
    state.submit(bucket.buffer(), fut, bucket.is_last())
    return fut


@dataclass
class ServerStats:
    """What one server did, per step of the run (warm-up steps included)."""

    rank: int
    host: str
    steps: int = 0
    buckets: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    sum_s: float = 0.0  # adding the workers' shards up
    wall_s: float = 0.0

    def as_record(self) -> dict[str, Any]:
        per = max(self.steps, 1)
        return {"rank": self.rank, "host": self.host, "steps": self.steps,
                "buckets_per_step": self.buckets / per,
                "bytes_in_per_step": self.bytes_in / per,
                "bytes_out_per_step": self.bytes_out / per,
                "sum_s_per_step": self.sum_s / per, "wall_s": self.wall_s}


def serve(roles: Roles, host: str) -> ServerStats:
    """Sum this server's shard of every bucket from every worker and send it back, until every
    worker says it is done; then its figures go to the workers' rank 0 (server_records)."""
    import torch
    import torch.distributed as dist

    me = dist.get_rank()
    stats = ServerStats(me, host)
    t0 = time.perf_counter()
    sending: list[Any] = []
    done: set[int] = set()
    while len(done) < len(roles.workers):
        live = [w for w in roles.workers if w not in done]
        headers = {w: torch.empty(HEADER, dtype=torch.int64) for w in live}
        for w in [dist.irecv(h, src, tag=TAG_HEADER) for src, h in headers.items()]:
            w.wait()
        kinds = {src: int(h[0]) for src, h in headers.items()}
        done |= {src for src, k in kinds.items() if k == DONE}
        pushing = [src for src, k in kinds.items() if k == BUCKET]
        if not pushing:
            continue
        if len(pushing) != len(roles.workers):
            raise RuntimeError(f"server {me}: workers {sorted(done)} finished while "
                               f"{pushing} still push: the workers ran different steps")
        h0 = headers[pushing[0]]
        numel, dtype = int(h0[1]), getattr(torch, DTYPES[int(h0[2])])
        pieces = {src: torch.empty(numel, dtype=dtype) for src in pushing}
        for w in [dist.irecv(p, src, tag=TAG_PUSH) for src, p in pieces.items()]:
            w.wait()
        s0 = time.perf_counter()
        first, *rest = pieces.values()
        total = first.float() if dtype != torch.float32 else first  # half: summed in fp32
        for p in rest:
            total.add_(p)
        total = total.to(dtype)
        stats.sum_s += time.perf_counter() - s0
        # earlier answers are waited for before more pile up (and their tensors freed)
        for w in sending:
            w.wait()
        sending = [dist.isend(total, dst, tag=TAG_PULL) for dst in pushing]
        stats.buckets += 1
        nbytes = numel * total.element_size()
        stats.bytes_in += nbytes * len(pushing)
        stats.bytes_out += nbytes * len(pushing)
        if int(h0[3]):
            stats.steps += 1
    for w in sending:
        w.wait()
    stats.wall_s = time.perf_counter() - t0
    server_records(stats.as_record())  # to the workers' rank 0
    return stats


def server_records(mine: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every server's figures, to every process (a worker gives None)."""
    import torch.distributed as dist

    said: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(said, mine)
    return sorted((s for s in said if s is not None), key=lambda s: s["rank"])
