"""Checkpoints of a training run (resnet.py --checkpoint-every N --checkpoint-dir DIR).

Every N timed steps the run's state is saved with PyTorch Distributed Checkpoint
(torch.distributed.checkpoint): the model's weights and buffers and the optimizer's
per-parameter state (SGD's momentum; an emulated rank, which has no optimizer, saves a
momentum-sized stand-in, so its checkpoint is as large as a real one). Who writes:

* shared: DIR is one place every node sees (the cluster's NFS share, any shared path). Under
  DDP every rank calls DCP's save over a process group of its own (Gloo), and DCP gives each
  replicated tensor to one rank, so the ranks write the state once between them, in shares.
  Horovod's ranks are no torch.distributed group: rank 0 writes it all (DCP without a group),
  the same files.
* nodes: DIR is on each node's own disk. The first rank of every node writes the whole state
  there, so that each node could reload from its own disk.

--checkpoint-mode sync blocks training until the files are written; async (DCP's async_save)
blocks only while the state is copied to host memory, and writes in a thread while training
goes on; the next checkpoint waits for it. Per checkpoint a rank records the time it blocked
training, the time the write went on after that, and the bytes it wrote; the steps' own times
leave all of it out, so the run's images/s are those between checkpoints.

Only the last checkpoint is kept: once a newer one is complete, its writer removes the one
before. The last stays in DIR, and the controller removes the run's directory after the run
(unless asked to keep it).

DIR is a path the node mounts, or ``nfs://ADDRESS/...``: an NFS server the ranks write to
themselves through libnfs (nfsfs.py), as on an emulated node, which mounts no NFS. Such
writes cross the node's link, which an emulated cluster dilates by k: their seconds are
divided by k (--dilation), as the links' are.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from typing import Any

SUFFIX = ".distcp"  # DCP's FileSystemWriter names its data files __<rank>_<n>.distcp


class Disk:
    """A checkpoint place on a file system the node mounts."""

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def rmtree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def rmdir(self, path: str) -> bool:
        try:
            os.rmdir(path)
            return True
        except OSError:
            return False

    def storage(self, where: str, reading: bool) -> dict[str, Any]:
        """DCP's keyword for the checkpoint at where."""
        return {"checkpoint_id": where}


def place_of(root: str) -> Any:
    """Disk, or an NFS server's place (nfsfs.Place) for an nfs:// root."""
    if not root.startswith("nfs://"):
        return Disk()
    import nfsfs

    return nfsfs.Place(root)


def step_dir(root: str, step: int) -> str:
    """The directory of the checkpoint after this (1-based, warm-up included) step.

    >>> step_dir("/c/r1", 25)
    '/c/r1/step-000025'
    """
    return os.path.join(root, f"step-{step:06d}")


def writes(shared: bool, engine: str, rank: int, local_rank: int) -> str:
    """How this rank takes part in a checkpoint: 'share' (DCP over the ranks' group), 'all'
    (this rank writes the whole state, alone), or '' (it writes nothing).

    >>> writes(True, "ddp", 3, 1), writes(True, "horovod", 0, 0), writes(True, "horovod", 1, 1)
    ('share', 'all', '')
    >>> writes(False, "ddp", 2, 0), writes(False, "ddp", 3, 1)
    ('all', '')
    """
    if shared:
        return "share" if engine == "ddp" else ("all" if rank == 0 else "")
    return "all" if local_rank == 0 else ""


@dataclass
class Saved:
    """One checkpoint, as one rank saw it."""

    step: int
    blocked_s: float  # training stopped this long (waiting for the last one's write included)
    waited_s: float  # of which the previous asynchronous write (0 when it was done)
    bytes: int = 0  # what this rank wrote
    background_s: float | None = None  # async: the write after training went on

    def as_record(self) -> dict[str, Any]:
        return {"step": self.step, "blocked_s": round(self.blocked_s, 6),
                "waited_s": round(self.waited_s, 6), "bytes": self.bytes,
                "background_s": None if self.background_s is None
                else round(self.background_s, 6)}


@dataclass
class Checkpointer:
    """Saves a rank's state every `every` timed steps (see the module doc)."""

    every: int
    root: str
    mode: str  # sync | async
    role: str  # writes()
    state: Any  # () -> the state dict to save
    group: Any = None  # the checkpoints' own Gloo group ('share')
    scale: float = 1.0  # 1/k: an emulated cluster's seconds over its dilated links (nfs://)
    saved: list[Saved] = field(default_factory=list)
    _pending: Any = None  # async: (future, Saved, when training went on, where)
    _last: str = ""  # the last complete checkpoint this rank wrote (or, 'share', took part in)
    _before: str = ""  # 'all': the one before it, kept until the run's end (see _complete)

    def __post_init__(self) -> None:
        self.fs = place_of(self.root)

    def due(self, timed_step: int) -> bool:
        return self.every > 0 and timed_step > 0 and timed_step % self.every == 0

    def add_blocked(self, seconds: float) -> float:
        """More blocking by the last checkpoint: Horovod's in-memory commit beside it, a copy
        in host memory (not scaled: it crosses no link). The seconds."""
        if self.saved:
            self.saved[-1].blocked_s += seconds
        return seconds

    def save(self, step: int) -> float:
        """Save after this step; returns the seconds training was blocked."""
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        waited = self._wait()
        if not self.role:  # the other ranks of a node, or Horovod's ranks but 0
            rec = Saved(step, (time.perf_counter() - t0) * self.scale, waited)
            self.saved.append(rec)
            return rec.blocked_s
        where = step_dir(self.root, step)
        if self.role == "all":
            where = os.path.join(where, socket.gethostname())
        kw: dict[str, Any] = ({"process_group": self.group} if self.role == "share"
                              else {"no_dist": True})
        state = self.state()
        kw.update(self.fs.storage(where, False))
        if self.mode == "async":
            fut = dcp.async_save(state, **kw)
            rec = Saved(step, 0.0, waited)
            went_on = time.perf_counter()
            rec.blocked_s = (went_on - t0) * self.scale
            self._pending = (fut, rec, went_on, where)
        else:
            dcp.save(state, **kw)
            rec = Saved(step, (time.perf_counter() - t0) * self.scale, waited,
                        self._bytes(where))
            self._complete(where)
        self.saved.append(rec)
        return rec.blocked_s

    def _wait(self) -> float:
        """Wait for the asynchronous write before; the seconds that took."""
        if self._pending is None:
            return 0.0
        fut, rec, went_on, where = self._pending
        t0 = time.perf_counter()
        fut.result()
        done = time.perf_counter()
        rec.background_s = (done - went_on) * self.scale
        rec.bytes = self._bytes(where)
        self._pending = None
        self._complete(where)
        return (done - t0) * self.scale

    def _complete(self, where: str) -> None:
        """A checkpoint is complete: the one before it goes (by its writer; under 'share', by
        the group's first rank, once every rank's save has returned there). On each node's own
        disk ('all') the nodes save without waiting for each other, so a node killed while
        saving may hold only the checkpoint before the one the others completed: there the
        last two are kept while the run trains, and every node can reload the older one."""
        import torch.distributed as dist

        prev, self._last = self._last, where
        if self.role == "all":
            prev, self._before = self._before, prev
        if not prev or (self.role == "share" and dist.get_rank(self.group) != 0):
            return
        self._remove(prev)

    def _remove(self, where: str) -> None:
        self.fs.rmtree(where)
        if self.role == "all":  # the step's directory, once no node's copy is left in it
            self.fs.rmdir(os.path.dirname(where))

    def finish(self) -> float:
        """After the last step: the last asynchronous write waited for; its seconds. Only the
        last checkpoint stays (on each node's disk, the one before it goes now)."""
        waited = self._wait()
        if self._before:
            self._remove(self._before)
            self._before = ""
        return waited

    def _bytes(self, where: str) -> int:
        """What this rank wrote there: its own data files (DCP names them by rank)."""
        import torch.distributed as dist

        rank = dist.get_rank(self.group) if self.role == "share" else 0
        try:
            names = self.fs.listdir(where)
        except OSError:
            return 0
        return sum(self.fs.size(os.path.join(where, n)) for n in names
                   if n.startswith(f"__{rank}_") and n.endswith(SUFFIX))

    def as_record(self) -> dict[str, Any]:
        return {"every": self.every, "mode": self.mode, "role": self.role or "none",
                "saved": [s.as_record() for s in self.saved]}


def complete_steps(root: str, role_all: bool, host: str) -> list[int]:
    """The steps whose checkpoint in root is complete (DCP writes .metadata last) and this rank
    can read: the shared one, or (role_all: the nodes' place) this host's own copy.

    >>> import tempfile
    >>> r = tempfile.mkdtemp()
    >>> for d in ("step-000010/h1", "step-000015/h1", "step-000015/h2", "step-000020/h1"):
    ...     os.makedirs(os.path.join(r, d))
    >>> for d in ("step-000010/h1", "step-000015/h1", "step-000015/h2"):
    ...     open(os.path.join(r, d, ".metadata"), "w").close()
    >>> complete_steps(r, True, "h1"), complete_steps(r, True, "h2"), complete_steps(r, False, "h1")
    ([10, 15], [15], [])
    """
    out, fs = [], place_of(root)
    for name in _step_names(root):
        where = os.path.join(root, name, host) if role_all else os.path.join(root, name)
        if fs.exists(os.path.join(where, ".metadata")):
            out.append(int(name[5:]))
    return out


def _step_names(root: str) -> list[str]:
    """The step directories in root (step_dir's names), in step order."""
    try:
        names = sorted(place_of(root).listdir(root))
    except OSError:
        return []
    return [n for n in names if n.startswith("step-") and n[5:].isdigit()]


def common_step(per_rank: list[list[int]]) -> int:
    """The last step every rank has a complete checkpoint of; 0 (start again) where none.

    >>> common_step([[10, 15], [15]]), common_step([[10], [15]]), common_step([[], [5]])
    (15, 0, 0)
    """
    shared = set(per_rank[0]).intersection(*per_rank[1:]) if per_rank else set()
    return max(shared, default=0)


def _clear(root: str, host: str) -> None:
    """Remove the checkpoints in root (host: only that host's copies, on each node's disk)."""
    fs = place_of(root)
    for name in _step_names(root):
        where = os.path.join(root, name)
        fs.rmtree(os.path.join(where, host) if host else where)
        fs.rmdir(where)


def resume(a: Any, me: Any, t: Any, eng: Any) -> dict[str, Any] | None:
    """Every rank of a run torchrun's agents may restart calls this at start, so that all
    agree: whether this attempt is a restart (any rank's TORCHELASTIC_RESTART_COUNT above 0:
    an agent that restarts its ranks because another node's failed counts no failure of its
    own; under Slurm, the job step's SCALELAB_ATTEMPT) and, if it is, the last checkpoint
    every rank can read, loaded into each rank's state (weights, buffers, momentum). None on a
    first attempt; else its record: restart, from_step (0: none to load, the run starts
    again), load_s."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    t0 = time.perf_counter()
    ck: Checkpointer | None = eng.ckpt
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT")
                  or os.environ.get("SCALELAB_ATTEMPT") or 0)
    mine = complete_steps(a.checkpoint_dir, a.checkpoint_place == "nodes",
                          socket.gethostname()) if ck is not None else []
    every: list[Any] = [None] * me.world
    dist.all_gather_object(every, (restart, mine))
    restart = max(r for r, _ in every)
    if not restart:  # a first attempt: what an earlier attempt of the run left is no base
        if ck is not None and ck.role in ("all", "share") and (ck.role == "all" or me.rank == 0):
            _clear(a.checkpoint_dir, socket.gethostname() if ck.role == "all" else "")
        dist.barrier()
        return None
    step = common_step([steps for _, steps in every])
    if step and ck is not None:
        optimizer = t.optimizer if t.real_model is None else None
        if optimizer is not None:  # SGD makes its momentum at the first step: made to load into
            for group in optimizer.param_groups:
                for p in group["params"]:
                    optimizer.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
        where = step_dir(a.checkpoint_dir, step)
        if a.checkpoint_place == "nodes":
            where = os.path.join(where, socket.gethostname())
            dcp.load(ck.state(), no_dist=True, **ck.fs.storage(where, True))
        else:
            dcp.load(ck.state(), process_group=ck.group, **ck.fs.storage(where, True))
        ck._last = where if ck.role else ""  # removed once a newer one is complete
    dist.barrier()
    return {"restart": restart, "from_step": step,
            "load_s": round(time.perf_counter() - t0, 6)}


def state_of(model: Any, optimizer: Any, named_params: list[tuple[str, Any]]) -> Any:
    """A function giving the state to save: the model's weights and buffers, and the
    optimizer's per-parameter tensors by parameter name (an emulated rank without an
    optimizer: a zero momentum buffer per parameter, made once)."""
    import torch

    inner = getattr(model, "module", model)
    stand_in = None if optimizer is not None else {
        f"{n}.momentum_buffer": torch.zeros_like(p) for n, p in named_params}

    def state() -> dict[str, Any]:
        if stand_in is not None:
            optim = stand_in
        else:
            optim = {f"{n}.{k}": v for n, p in named_params
                     for k, v in optimizer.state.get(p, {}).items() if torch.is_tensor(v)}
        return {"model": inner.state_dict(), "optim": optim}

    return state


def make(a: Any, me: Any, t: Any, eng: Any) -> Checkpointer | None:
    """The run's checkpointer (resnet.py --checkpoint-every), or None; every rank calls it
    (a shared place under DDP makes the checkpoints' own group, which all ranks join)."""
    if not a.checkpoint_every:
        return None
    import torch.distributed as dist

    shared = a.checkpoint_place == "shared"
    engine = "ddp" if me.hvd is None else "horovod"
    role = writes(shared, engine, me.rank, me.local_rank)
    group = dist.new_group(backend="gloo") if engine == "ddp" and shared else None
    if t.real_model is not None:  # emulated: the real model's weights, a stand-in momentum
        model, optimizer = t.real_model, None
    else:
        model, optimizer = getattr(eng.model, "module", eng.model), t.optimizer
    scale = 1.0 / a.dilation if a.checkpoint_dir.startswith("nfs://") else 1.0
    return Checkpointer(a.checkpoint_every, a.checkpoint_dir, a.checkpoint_mode, role,
                        state_of(model, optimizer, list(model.named_parameters())), group,
                        scale)


def summary(a: Any, ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's checkpoints from every rank's (rank 0's result "checkpoint"): per checkpoint
    the slowest rank's blocking and background time and all writers' bytes, and their means.

    >>> class A: checkpoint_every, checkpoint_mode, checkpoint_place = 2, "sync", "shared"
    >>> r = lambda b, n: {"checkpoint": {"saved": [{"step": 7, "blocked_s": b, "waited_s": 0.0,
    ...                                             "bytes": n, "background_s": None}]}}
    >>> s = summary(A, [r(0.5, 10**8), r(1.0, 10**8)])
    >>> s["saved"][0]["blocked_s"], s["bytes_per_checkpoint"], s["write_mb_s"]
    (1.0, 200000000.0, 200.0)
    """
    if not a.checkpoint_every:
        return None
    per = [r["checkpoint"]["saved"] for r in ranks]
    saved = []
    for items in zip(*per, strict=False):
        bg = [s["background_s"] for s in items if s["background_s"] is not None]
        saved.append({"step": items[0]["step"],
                      "blocked_s": max(s["blocked_s"] for s in items),
                      "waited_s": max(s["waited_s"] for s in items),
                      "background_s": max(bg) if bg else None,
                      "bytes": sum(s["bytes"] for s in items)})

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    size = mean([s["bytes"] for s in saved])
    blocked = mean([s["blocked_s"] for s in saved])
    background = mean([s["background_s"] for s in saved if s["background_s"] is not None])
    took = background if a.checkpoint_mode == "async" else blocked
    return {"every": a.checkpoint_every, "mode": a.checkpoint_mode,
            "place": a.checkpoint_place, "saved": saved, "bytes_per_checkpoint": size,
            "blocked_s_mean": blocked, "background_s_mean": background,
            "write_mb_s": None if not size or not took else round(size / took / 1e6, 2)}
