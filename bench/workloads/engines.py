"""The engines resnet.py reduces gradients with, and how it times them (the parameter servers'
push and pull, a DDP comm hook too, are psengine.py's).

* DDP: the model is wrapped with a communication hook (_timed_allreduce_hook) that does the
  bucket allreduce itself, as DDP's default hook does, and timestamps each bucket's launch and
  completion in a CommTimer.
* Horovod: hvd.DistributedOptimizer (compression as asked), a post-accumulate-grad hook that
  marks the first gradient ready, and contiguous copies wherever Horovod meets a channels_last
  tensor (it reduces and broadcasts contiguous tensors only).

Imported by resnet.py (and so by warm.py's server); imports torch lazily, like its siblings.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

import common


class CommTimer:
    """State of the timing DDP comm hook: bucket launch marks and [launch, done] intervals."""

    def __init__(self, clock: common.StepClock, comm_dtype, average: bool = True) -> None:
        self.clock = clock
        self.comm_dtype = comm_dtype
        self.average = average
        self.lock = threading.Lock()
        self.launches: list[Any] = []
        self.intervals: list[tuple[Any, Any]] = []

    def reset(self) -> None:
        with self.lock:
            self.launches, self.intervals = [], []


def _timed_allreduce_hook(state: CommTimer, bucket):
    """Average the bucket by allreduce (optionally in 16 bits), timing launch and completion."""
    import torch.distributed as dist

    buf = bucket.buffer()
    start = state.clock.mark()
    with state.lock:
        state.launches.append(start)
    world = dist.get_world_size()
    if state.comm_dtype is not None and buf.dtype != state.comm_dtype:
        t = buf.to(state.comm_dtype).div_(world)  # divide first: avoids fp16 overflow
    else:
        # an emulated accelerator's gradients are zeros: the averaging (microseconds on a GPU)
        # would only cost the emulation host a pass over every byte
        t = buf.div_(world) if state.average else buf
    fut = dist.all_reduce(t, async_op=True).get_future()

    def done(f):
        out = f.value()[0]
        end = state.clock.mark()
        with state.lock:
            state.intervals.append((start, end))
        if out.data_ptr() != buf.data_ptr():
            buf.copy_(out)
        return buf

    return fut.then(done)


def wrap_ddp(model, device, timer: CommTimer, emulated, bucket_cap_mb: float,
             process_group=None, hook=None):
    """The model under DistributedDataParallel, its gradients reduced by the timing hook (or
    by hook, a (state, hook) pair: the parameter servers' push and pull), over process_group
    (None: every process)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp_kw: dict[str, Any] = {"device_ids": [device.index]} if device.type == "cuda" else {}
    if process_group is not None:
        ddp_kw["process_group"] = process_group
    if emulated:
        ddp_kw["gradient_as_bucket_view"] = True  # see emulate.build: no copies into buckets
        if "init_sync" in inspect.signature(DDP.__init__).parameters:
            ddp_kw["init_sync"] = False  # every rank's parameters are zeros already
    # torch >= 2.13 renames broadcast_buffers (deprecated) to forward_sync_buffers.
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        ddp_kw["forward_sync_buffers"] = False
    else:
        ddp_kw["broadcast_buffers"] = False
    ddp_kw["bucket_cap_mb"] = bucket_cap_mb
    model = DDP(model, **ddp_kw)
    model.register_comm_hook(*(hook or (timer, _timed_allreduce_hook)))
    return model


# Horovod's defaults since 0.21 (horovodrun --help): fusion threshold 128 MB, cycle time 1 ms
HOROVOD_FUSION_MB = 128.0
HOROVOD_CYCLE_MS = 1.0


def horovod_env(fusion_threshold_mb, cycle_time_ms, environ) -> dict:
    """Apply Horovod's settings to environ (read by hvd.init()) and return what Horovod will
    use: a setting given here wins, else the environment's (horovodrun's own flags), else
    Horovod's default.

    >>> env = {}
    >>> horovod_env(64.0, None, env), env
    ({'fusion_threshold_mb': 64.0, 'cycle_time_ms': 1.0}, {'HOROVOD_FUSION_THRESHOLD': '67108864'})
    >>> horovod_env(None, 5.0, {"HOROVOD_FUSION_THRESHOLD": "33554432"})
    {'fusion_threshold_mb': 32.0, 'cycle_time_ms': 5.0}
    """
    if fusion_threshold_mb is not None:
        environ["HOROVOD_FUSION_THRESHOLD"] = str(int(fusion_threshold_mb * 1024 * 1024))
    if cycle_time_ms is not None:
        environ["HOROVOD_CYCLE_TIME"] = f"{cycle_time_ms:g}"
    fusion = environ.get("HOROVOD_FUSION_THRESHOLD")
    cycle = environ.get("HOROVOD_CYCLE_TIME")
    return {"fusion_threshold_mb": int(fusion) / (1024 * 1024) if fusion else HOROVOD_FUSION_MB,
            "cycle_time_ms": float(cycle) if cycle else HOROVOD_CYCLE_MS}


def horovod_backend(hvd, device) -> str:
    """What reduces Horovod's gradients: NCCL for CUDA tensors where Horovod was built with it,
    else its controller's CPU path (Gloo or MPI)."""
    if device.type == "cuda" and hvd.nccl_built():
        return "horovod-nccl"
    return "horovod-gloo" if hvd.gloo_enabled() else "horovod-mpi"


def wrap_horovod(hvd, model, optimizer, param_names: list[str], comm_dtype, channels_last: bool,
                 emulated, clock: common.StepClock, grad_ready: list[Any], broadcast: bool = True):
    """Rank 0's weights and optimizer state on every rank (broadcast), and the optimizer under
    hvd.DistributedOptimizer; the first gradient ready each step is marked in grad_ready."""
    compression = hvd.Compression.fp16 if comm_dtype is not None else hvd.Compression.none
    if channels_last:
        compression = contiguous(compression)
    if broadcast:
        broadcast_parameters(hvd, model)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=list(zip(param_names, model.parameters(), strict=True)),
        compression=compression,
        op=hvd.Sum if emulated else hvd.Average,  # zeros: no scaling pass (see CommTimer)
    )

    def on_grad(_p):
        if not grad_ready:
            grad_ready.append(clock.mark())

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(on_grad)
    return optimizer


def contiguous(compression):
    """Horovod reduces contiguous tensors only, and a channels_last model's 4-D gradients are
    not: a compressor that hands Horovod a contiguous copy (after `compression`'s own work) and
    gives the reduced copy back as the gradient, whose values are the same in either layout."""

    def compress(tensor):
        out, ctx = compression.compress(tensor)
        return out.contiguous(), ctx

    return type("Contiguous", (), {"compress": staticmethod(compress),
                                   "decompress": staticmethod(compression.decompress)})


def broadcast_parameters(hvd, model) -> None:
    """hvd.broadcast_parameters, for any memory format: channels_last weights are sent as
    contiguous copies (Horovod needs those) and copied back in place."""
    state = model.state_dict()
    sent = {name: t.contiguous() for name, t in state.items()}
    hvd.broadcast_parameters(sent, root_rank=0)
    for name, t in state.items():
        if sent[name] is not t:
            t.copy_(sent[name])


def step_record(a, hvd, eng, start, t_data, t_bwd, t_sync, t_end,
                 loss) -> dict[str, float]:
    """One timed step's figures from its clock marks (after the end-of-step sync)."""
    clock, timer, grad_ready = eng.clock, eng.timer, eng.grad_ready

    def rel(m, start=start):
        return clock.seconds(start, m) / a.dilation  # the emulated device's time

    if hvd is None:
        if not timer.launches:
            raise RuntimeError("DDP comm hook never ran: no gradients were reduced")
        exposed = max(0.0, rel(t_bwd) - max(rel(m) for m in timer.launches))
        inflight = common.union_length([(rel(s), rel(e)) for s, e in timer.intervals])
    else:
        exposed = rel(t_sync) - rel(t_bwd)
        inflight = rel(t_sync) - rel(grad_ready[0]) if grad_ready else exposed
    return {
        "step_s": rel(t_end),
        "data_s": rel(t_data),
        "comm_s": exposed,
        "inflight_s": inflight,
        "loss": float(loss.detach()),
    }
