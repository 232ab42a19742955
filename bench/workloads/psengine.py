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

HEADER = 5  # int64s: kind, shard elements, dtype code, last bucket of the step, piece elements
BUCKET, DONE = 1, 2
TAG_HEADER, TAG_PUSH, TAG_PULL = 101, 102, 103
DTYPES = ("float32", "float16", "bfloat16")  # the dtype code is an index here
# a server's shard of a bucket travels in pieces of at most this many bytes, so that a server
# sends one piece back while the next comes in (BytePS cuts its tensors at 4,096,000 bytes,
# BYTEPS_PARTITION_BYTES, for the same reason): a whole 25 MB shard would go out and come back
# one after the other
PIECE_BYTES = 4_096_000  # resnet_cli --ps-piece-kb 4000 is this


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


def pieces(lo: int, hi: int, most: int) -> list[tuple[int, int]]:
    """[start, end) of the pieces elements lo..hi travel in, most elements at most each; a
    worker and its server cut a shard the same way (the header says most).

    >>> pieces(0, 2_500_000, 1_024_000)
    [(0, 1024000), (1024000, 2048000), (2048000, 2500000)]
    """
    return [(start, min(start + most, hi)) for start in range(lo, hi, most)]


class Pusher:
    """A worker's side: DDP's comm hook state. One thread posts each bucket's pushes and pulls
    in the order DDP made the buckets ready (Gloo matches messages between two processes in the
    order they are posted) and goes straight on to the next bucket; a second thread waits for
    each bucket's pull, averages it into the bucket and completes its future. So the push of
    one bucket rides beside the pull of the one before, as on a full-duplex NIC."""

    def __init__(self, roles: Roles, timer: Any, comm_dtype: Any, overlap: bool,
                 piece_bytes: int = PIECE_BYTES) -> None:
        self.roles = roles
        self.piece_bytes = piece_bytes
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
        # the shard comes back into the buffer it went out of: a worker's server answers only
        # once it has the whole push, so no byte is overwritten before it is sent (on a GPU,
        # or in another dtype, that buffer is the host copy; on a CPU it is DDP's own bucket,
        # and nothing is copied at all)
        t = buf.detach().to("cpu")
        if self.comm_dtype is not None and t.dtype != self.comm_dtype:
            t = t.to(self.comm_dtype)
        code = DTYPES.index(str(t.dtype).replace("torch.", ""))
        works, kept = [], []
        most = max(1, self.piece_bytes // t.element_size())
        for server, (lo, hi) in zip(servers, shards(t.numel(), len(servers)), strict=True):
            # one header a bucket, then its pieces back to back: the server knows the pieces
            # from the header (pieces()), takes them all at once and answers piece by piece
            header = torch.tensor([BUCKET, hi - lo, code, int(last), most], dtype=torch.int64)
            works.append(dist.isend(header, server, tag=TAG_HEADER))
            kept.append(header)  # alive until the sends are done
            for start, end in pieces(lo, hi, most):
                piece = t[start:end]
                works += [dist.isend(piece, server, tag=TAG_PUSH),
                          dist.irecv(piece, server, tag=TAG_PULL)]
        return start, works, [t, kept]

    def _pull_loop(self) -> None:
        while True:
            item = self.posted.get()
            if item is None:
                return
            buf, fut, start, works, (back, _kept) = item
            try:
                for w in works:
                    w.wait()
                workers = len(self.roles.workers)
                if self.timer.average and workers > 1:  # one pass, as DDP's own hook divides
                    back.div_(workers)
                if back.data_ptr() != buf.data_ptr() or back.device != buf.device:
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
        done = torch.tensor([DONE, 0, 0, 1, 1], dtype=torch.int64)
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
    pieces: int = 0  # pieces of buckets (PIECE_BYTES at most)
    bytes_in: int = 0
    bytes_out: int = 0
    sum_s: float = 0.0  # adding the workers' shards up
    wall_s: float = 0.0

    def as_record(self) -> dict[str, Any]:
        per = max(self.steps, 1)
        return {"rank": self.rank, "host": self.host, "steps": self.steps,
                "pieces_per_step": self.pieces / per,
                "bytes_in_per_step": self.bytes_in / per,
                "bytes_out_per_step": self.bytes_out / per,
                "sum_s_per_step": self.sum_s / per, "wall_s": self.wall_s}


def same_bucket(me: int, headers: dict[int, Any]) -> None:
    """Every worker's header of a bucket says the same size, dtype, last bucket of the step
    and pieces (RuntimeError if not: the workers ran different steps or models).

    >>> import torch
    >>> same_bucket(0, {1: torch.tensor([1, 10, 0, 0, 5]), 2: torch.tensor([1, 10, 0, 0, 5])})
    >>> same_bucket(0, {1: torch.tensor([1, 10, 0, 0, 5]), 2: torch.tensor([1, 10, 1, 0, 5])})
    Traceback (most recent call last):
    ...
    RuntimeError: server 0: workers [2] pushed another bucket than worker 1 ([1, 10, 1, 0, 5] against [1, 10, 0, 0, 5]): the workers ran different steps or models
    """
    first, h0 = next(iter(headers.items()))
    odd = [src for src, h in headers.items() if h[1:].tolist() != h0[1:].tolist()]
    if odd:
        raise RuntimeError(f"server {me}: workers {odd} pushed another bucket than worker "
                           f"{first} ({headers[odd[0]].tolist()} against {h0.tolist()}): the "
                           "workers ran different steps or models")


def serve(roles: Roles, host: str) -> ServerStats:
    """Sum this server's shard of every bucket from every worker and send it back, until every
    worker says it is done; then its figures go to the workers' rank 0 (server_records).

    A thread per worker (receive) takes that worker's buckets as they come: its header, then
    the receives of all its pieces posted at once, then the next header, whatever the other
    workers are at. A worker whose pushes run ahead so never waits for the others at a
    bucket's end (a receive not yet posted holds its pieces back on their way, and every
    bucket's end was such a wait: 100 ms of a 1.2 s step at 2 workers and 2 servers);
    the summing loop here takes the buckets in order, a piece as soon as every worker's has
    come."""
    import torch
    import torch.distributed as dist

    me = dist.get_rank()
    stats = ServerStats(me, host)
    t0 = time.perf_counter()
    sending: list[Any] = []
    arrived: dict[int, queue.Queue] = {src: queue.Queue() for src in roles.workers}
    failed: list[BaseException] = []

    def receive(src: int) -> None:
        try:
            while True:
                h = torch.empty(HEADER, dtype=torch.int64)
                dist.irecv(h, src, tag=TAG_HEADER).wait()
                if int(h[0]) == DONE:  # the worker sends nothing more
                    arrived[src].put(None)
                    return
                shard = torch.empty(int(h[1]), dtype=getattr(torch, DTYPES[int(h[2])]))
                cuts = pieces(0, int(h[1]), int(h[4]))
                works = [dist.irecv(shard[lo:hi], src, tag=TAG_PUSH) for lo, hi in cuts]
                arrived[src].put((h, shard, cuts, works))
        except BaseException as e:  # noqa: BLE001 - raised again by the summing loop
            failed.append(e)
            for q in arrived.values():  # the loop may be waiting on another worker's
                q.put(None)

    threads = [threading.Thread(target=receive, args=(src,), name=f"ps-from-{src}",
                                daemon=True) for src in roles.workers]
    for t in threads:
        t.start()
    while True:
        got = {src: arrived[src].get() for src in roles.workers}
        if failed:
            raise failed[0]
        pushing = [src for src, g in got.items() if g is not None]
        if not pushing:
            break
        if len(pushing) != len(roles.workers):
            done = sorted(src for src, g in got.items() if g is None)
            raise RuntimeError(f"server {me}: workers {done} finished while {pushing} still "
                               "push: the workers ran different steps")
        h0, first_shard, cuts, _ = got[pushing[0]]
        same_bucket(me, {src: got[src][0] for src in pushing})
        dtype = first_shard.dtype
        # each piece is summed and sent back as soon as every worker's has come, while the
        # next ones come in
        answers = []
        for i, (lo, hi) in enumerate(cuts):
            for src in pushing:
                got[src][3][i].wait()
            s0 = time.perf_counter()
            first, *rest = (got[src][1][lo:hi] for src in pushing)
            total = first.float() if dtype != torch.float32 else first  # half: summed in fp32
            for p in rest:
                total.add_(p)
            total = total.to(dtype)
            stats.sum_s += time.perf_counter() - s0
            answers += [dist.isend(total, dst, tag=TAG_PULL) for dst in pushing]
            stats.pieces += 1
        # the bucket before's answers are waited for before more pile up (and freed)
        for w in sending:
            w.wait()
        sending = answers
        nbytes = first_shard.numel() * first_shard.element_size()
        stats.bytes_in += nbytes * len(pushing)
        stats.bytes_out += nbytes * len(pushing)
        if int(h0[3]):
            stats.steps += 1
    for w in sending:
        w.wait()
    for t in threads:
        t.join()
    stats.wall_s = time.perf_counter() - t0
    server_records(stats.as_record())  # to the workers' rank 0
    return stats


def server_records(mine: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every server's figures, to every process (a worker gives None)."""
    import torch.distributed as dist

    said: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(said, mine)
    return sorted((s for s in said if s is not None), key=lambda s: s["rank"])
