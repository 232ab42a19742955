#!/usr/bin/env python3
"""Distributed ResNet training benchmark (synthetic ImageNet or real JPEGs), DDP, Horovod or
synchronous parameter servers (--engine ps, psengine.py: DDP's buckets pushed to the last
--ps-servers-here processes of each node, summed there in host memory and pulled back before
every optimizer step; nothing asynchronous, no stale updates; a server holds no GPU).

    torchrun --nproc-per-node N [--nnodes ...] bench/workloads/resnet.py --model resnet50 \
        --batch-size 64 [--image-size 224] [--precision fp32|tf32|amp|bf16] [--channels-last] \
        [--warmup 5] [--steps 20] [--engine ddp] [--data synthetic|PATH] [--workers 4] \
        [--pin-memory auto|on|off] [--device auto|cpu|cuda] [--bucket-cap-mb 25] [--compression none|fp16] \
        [--fusion-threshold-mb 128] [--cycle-time-ms 1]   (Horovod: set as HOROVOD_* before hvd.init())
    horovodrun --gloo -np N -H host1:n,host2:n python bench/workloads/resnet.py --engine horovod ...
    python bench/workloads/resnet.py ...      (one rank, no launcher)

Every rank times its own steps; rank 0 gathers all ranks' figures (all_gather_object /
hvd.allgather_object) and prints one line `SCALELAB_RESULT {json}`. images_per_sec at the top
is the sum of the ranks' own rates; per-rank records are what each rank measured.

How the step time is split (step = data + compute + comm):

* ``data``: waiting for the next batch (≈0 for synthetic data, which is one pre-generated
  batch per rank, reused, as in Horovod's and NVIDIA's synthetic benchmarks).
* ``comm`` (comm_time_mean_s): *exposed* gradient communication, the time the rank spends
  after its last gradient is computed until all gradients are reduced.
  - DDP: a communication hook (``register_comm_hook``) does the bucket allreduce itself
    (the same pre-divide + allreduce as DDP's default hook) and timestamps each bucket's launch
    and the completion of its future. DDP launches buckets in order, so the last launch is
    the moment every gradient is ready; backward() returns only once every bucket future is
    done. exposed comm = end of backward - last bucket launch. This times the real overlapped
    allreduces of the real run, not a separate re-run of them, which is why it is honest: no
    extra traffic, no change to overlap.
  - Horovod: the optimizer's synchronize() is called explicitly after backward and timed, then
    step() runs under skip_synchronize(); exposed comm = the time in synchronize().
* ``compute``: the rest: forward, backward compute, optimizer step.

Also per rank: comm_inflight_mean_s, the total time gradient communication was in flight
(overlapped with backward or not): DDP = union of the bucket [launch, completion] intervals;
Horovod = first gradient ready (post-accumulate-grad hook) to end of synchronize() (an upper
bound: Horovod's background thread batches tensors on its own cycle).

Timestamps are host perf_counter on CPU and CUDA events on GPU (resolved after the
end-of-step synchronize), so on GPU they measure execution, not kernel launch.

Precision (fp32, tf32, amp, bf16): what each means on CPU and CUDA, and what it does to
the gradients communicated, is in precision.py.

Each rank's record says what it ran on: device ("cpu", "cuda:0"), device_name and
gpu_mem_peak_mb (torch.cuda.max_memory_allocated over the whole process; null on CPU). The
top-level "backend" is what reduced the gradients: nccl or gloo (DDP), horovod-nccl,
horovod-gloo or horovod-mpi (Horovod).

DDP does not sync buffers in forward (broadcast_buffers=False) so both engines communicate gradients only (Horovod does not
sync BatchNorm buffers per step either).

A run goes through named phases, each a function below: set_up (process group, device),
load_data, make_model, wrap (in DDP or Horovod, engines.py), timed_loop, gather (rank 0 prints
the result) and finish (the group is left).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# Wall-clock marks of this process's life (unix seconds), reported by rank 0 so that the
# controller can split a run's wall time: launch, import, rendezvous, setup, warm-up, timed
# steps, finish. The first is taken before torch is imported.
TIMELINE: dict[str, float] = {"process": time.time()}

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt  # noqa: E402
import common  # noqa: E402
import emulate  # noqa: E402
import engines  # noqa: E402
import models  # noqa: E402
import precision  # noqa: E402
import psengine  # noqa: E402
import runrecord  # noqa: E402
from engines import horovod_env  # noqa: E402
from resnet_cli import parse_args  # noqa: E402

# -- the phases of a run, in order ------------------------------------------------------------


@dataclass
class Rank:
    """Who this process is and what it runs on (set_up)."""

    hvd: Any  # horovod.torch under --engine horovod, else None (DDP)
    hvd_settings: dict  # the fusion threshold and cycle time Horovod uses ({} under DDP)
    rank: int
    world: int
    local_rank: int
    device: Any  # torch.device
    backend: str  # what reduces the gradients (the result's "backend")
    tf32: bool | None
    device_name: str
    host: str
    ps: Any = None  # psengine.Roles under --engine ps


@dataclass
class Data:
    """This rank's batches (load_data)."""

    batches: Callable[[], Iterator]  # a generator of the warm-up and timed steps' (x, y)
    num_classes: int
    layout: str  # the result's data_layout: emulated, synthetic or the dataset's
    real: Any  # the real-data loader, None for synthetic and emulated data
    pin_memory: bool
    mem_fmt: Any  # the inputs' and the model's torch.memory_format


@dataclass
class Trainee:
    """The model before an engine wraps it, and what trains it (make_model)."""

    model: Any
    pacer: Any  # emulate.Pacer of an emulated accelerator, else None
    real_model: Any  # an emulated accelerator's real model (its parameters), else None
    param_names: list[str]
    num_params: int
    grad_bytes: int
    criterion: Any
    optimizer: Any  # None for an emulated DDP rank
    scaler: Any  # torch.amp.GradScaler for amp on CUDA, else None


@dataclass
class Engine:
    """The model and optimizer as DDP or Horovod wrapped them, and their timing (wrap)."""

    model: Any
    optimizer: Any
    grad_bytes: int  # what one step communicates (halved by fp16 compression)
    clock: common.StepClock
    timer: engines.CommTimer
    grad_ready: list[Any]  # Horovod: the step's first gradient-ready mark
    timing_method: str
    comm_dtype_name: str
    pusher: Any = None  # psengine.Pusher under --engine ps
    ckpt: Any = None  # ckpt.Checkpointer under --checkpoint-every
    attempt: Any = None  # after a restart: ckpt.resume's record (restart, from_step, load_s)
    commit: Any = None  # Horovod's elastic runs: commits the state after a step (hvdelastic)
    begin: int | None = None  # and the step they go on from (else attempt's, or 0)


@dataclass
class Timed:
    """What the timed steps measured (timed_loop)."""

    steps: list[dict[str, float]]  # per step: step_s, data_s, comm_s, inflight_s, loss
    t_first: float  # perf_counter at the first timed step
    t_last: float  # perf_counter after the last
    window: dict  # common.sample_delta over the timed steps (the fidelity guard's figures)
    data_bytes: int | None  # bytes the loader read from storage for the timed steps (real data)
    blocked_s: float = 0.0  # of the timed window, training blocked by checkpoints
    read: tuple[int, float] | None = None  # bytes the loader read from storage in the timed
    # window, and the seconds it read them in (None: too few samples read in it to tell)


def run(a: argparse.Namespace) -> int:
    """One benchmark run, phase by phase; rank 0 prints the result. Leaves the process itself."""
    me = set_up(a)
    if me.ps is not None and me.ps.server:
        TIMELINE["ready"] = time.time()
        psengine.serve(me.ps, me.host)  # a parameter server: no data, no model
        finish(me)
        common.exit_now(0)
    data = load_data(a, me)
    trainee = make_model(a, me, data)
    eng = wrap(a, me, trainee)
    eng.ckpt = ckpt.make(a, me, trainee, eng)
    if a.restartable and me.hvd is not None:  # Horovod's elastic driver brings ranks back
        import hvdelastic

        def attempt() -> Timed:
            # the ranks Horovod gave this attempt (the returning node's are the last)
            me.rank, me.world, me.local_rank = me.hvd.rank(), me.hvd.size(), me.hvd.local_rank()
            if eng.ckpt is not None:
                eng.ckpt.role = ckpt.writes(a.checkpoint_place == "shared", "horovod", me.rank,
                                            me.local_rank)
            timed = timed_loop(a, me, data, trainee, eng)
            gather(a, me, data, trainee, eng, timed)  # a failure in it comes back too
            return timed

        hvdelastic.train(me.hvd, eng.model, eng.optimizer, eng, TIMELINE, bool(a.emulated),
                         attempt)
    else:
        # restarted by torchrun's agent after a failure: on from the last checkpoint all read
        eng.attempt = ckpt.resume(a, me, trainee, eng) if a.restartable else None
        TIMELINE["ready"] = time.time()
        if eng.attempt is not None:
            eng.attempt.update(process_at=TIMELINE["process"],
                               rendezvous_at=TIMELINE["rendezvous"], ready_at=TIMELINE["ready"])
        timed = timed_loop(a, me, data, trainee, eng)
        gather(a, me, data, trainee, eng, timed)
    finish(me)
    # Leave from here, before run's locals are released. DDP's reducer (eng.model) holds the last
    # reference to the gloo process group and is freed with the GIL held; ~ProcessGroupGloo then
    # takes its work lock, which a gloo worker may hold while it waits for the GIL to free the
    # tensors of the last collective: a deadlock (the class of pytorch/pytorch#56297), seen here
    # as a rank that never exits after its result, about one run in 30 of the demo sweep.
    common.exit_now(0)
    return 0  # not reached


def set_up(a: argparse.Namespace) -> Rank:
    """Import torch, join the process group (DDP) or Horovod, and pick and set up the device."""
    import torch
    import torch.distributed  # noqa: F401  (loaded before the "imported" mark, as it always was)

    TIMELINE["imported"] = time.time()

    hvd = None
    hvd_settings: dict = {}
    if a.engine == "horovod":
        try:
            import horovod.torch as hvd
        except ImportError as e:
            raise SystemExit(
                f"resnet.py: --engine horovod but horovod is not importable: {e} "
                "(build it with scripts/build_horovod.sh)"
            ) from None
        hvd_settings = horovod_env(a.fusion_threshold_mb, a.cycle_time_ms, os.environ)
        hvd.init()
        rank, world, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        device = common.resolve_device("cpu" if a.emulated else a.device, local_rank)
        backend = engines.horovod_backend(hvd, device)
    else:
        # an emulated accelerator's rank lives on the host: its compute is the profile's waits;
        # so does a parameter server, which sums host-memory shards: known before the group is
        # joined, so that it never takes a GPU (it comes after its node's one worker per GPU)
        serves = a.engine == "ps" and psengine.serves(a.ps_servers_here, os.environ)
        device = common.resolve_device("cpu" if a.emulated or serves else a.device,
                                       int(os.environ.get("LOCAL_RANK", "0")))
        backend = a.backend if a.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        if a.engine == "ps":
            backend = "gloo"  # pushes and pulls are host-memory messages
        rank, world, local_rank = common.init_torch_distributed(backend, a.timeout_s)
    ps = None
    if a.engine == "ps":
        ps = psengine.roles(a.ps_servers_here)
        backend = "ps-gloo"
        if not ps.server:  # a worker's rank and world are the workers'
            rank, world = ps.rank, len(ps.workers)
    TIMELINE["rendezvous"] = time.time()
    if a.threads:
        torch.set_num_threads(a.threads)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    tf32 = precision.set_tf32(device, a.precision)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    host = socket.gethostname()
    common.log(
        "rank %d/%d on %s device %s (%s) backend %s precision %s tf32 %s threads %d",
        rank, world, host, device, device_name, backend, a.precision, tf32, torch.get_num_threads(),
    )
    return Rank(hvd, hvd_settings, rank, world, local_rank, device, backend, tf32, device_name, host,
                ps)


def load_data(a: argparse.Namespace, me: Rank) -> Data:
    """This rank's batches: the emulation's stand-in, one synthetic batch reused, or real data
    (which decides the number of classes, so it comes before the model)."""
    import torch

    device, rank, world = me.device, me.rank, me.world
    mem_fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    real = None
    pin_memory = _pin_memory(a.pin_memory, device)
    if a.data != "synthetic":
        # real data (which decides the classes): a real device's batches are decoded; an
        # emulated one's are read for real and their decode charged at the measured cost per
        # image, in the device's time
        import imagedata

        real = imagedata.make_loader(
            a.data, image_size=a.image_size, batch_size=a.batch_size, workers=a.workers,
            rank=rank, world=world, seed=a.seed, timeout_s=a.timeout_s,
            num_classes=a.num_classes or (models.spec(a.model).default_num_classes
                                          if a.emulated else None),
            pin_memory=pin_memory and not a.emulated,
            charge_s=a.decode_cost_s * a.dilation if a.emulated else None)
        x_emu = torch.zeros(1)

        def convert(x, y):
            if a.emulated:
                return x_emu, None
            return (x.to(device, non_blocking=True).contiguous(memory_format=mem_fmt),
                    y.to(device, non_blocking=True))

        batches = real.take(a.warmup + a.steps, convert)
        num_classes = real.num_classes
        data_layout = ("emulated, " if a.emulated else "") + real.layout
    elif a.emulated:
        num_classes = a.num_classes or models.spec(a.model).default_num_classes
        x_emu = torch.zeros(1)

        def batches():
            for _ in range(a.warmup + a.steps):
                yield x_emu, None

        data_layout = "emulated"
    else:
        num_classes = a.num_classes or models.spec(a.model).default_num_classes
        g = torch.Generator().manual_seed(a.seed * 7919 + rank)
        x_syn = torch.randn(a.batch_size, 3, a.image_size, a.image_size, generator=g)
        y_syn = torch.randint(0, num_classes, (a.batch_size,), generator=g)
        x_syn = x_syn.to(device).contiguous(memory_format=mem_fmt)
        y_syn = y_syn.to(device)

        def batches():
            for _ in range(a.warmup + a.steps):
                yield x_syn, y_syn

        data_layout = "synthetic"
    return Data(batches, num_classes, data_layout, real, pin_memory, mem_fmt)


def _pin_memory(choice: str, device) -> bool:
    return device.type == "cuda" if choice == "auto" else choice == "on"


def make_model(a: argparse.Namespace, me: Rank, data: Data) -> Trainee:
    """The model on the device (an emulated accelerator's: the profile's waits over the real
    model's parameters), its loss, optimizer and gradient scaler."""
    import torch
    from torch import nn

    device, world, num_classes, mem_fmt = me.device, me.world, data.num_classes, data.mem_fmt
    torch.manual_seed(a.seed)  # identical init on every rank (DDP/Horovod broadcast anyway)
    pacer = None
    real_model = None
    if a.emulated:
        # with peers, the profile's GPU-side cost of communication (gpu_side_stretch)
        a.emulated = emulate.for_world(a.emulated, world)
        # the real parameters, shapes and names (built as usual: on the meta device it would
        # be cheaper in principle, but its first use costs torch 1.5 s of set-up per process)
        real_model = models.build_model(a.model, num_classes).to(device)
        param_names = [n for n, _ in real_model.named_parameters()]
        try:
            model, pacer = emulate.build(a.emulated, list(real_model.named_parameters()), a.dilation)
        except emulate.ProfileError as e:
            raise ValueError(str(e)) from None
        num_params = sum(p.numel() for p in model.parameters())
        grad_bytes = models.gradient_bytes(model, a.precision)
    else:
        model = models.build_model(a.model, num_classes).to(device, memory_format=mem_fmt)
        param_names = [n for n, _ in model.named_parameters()]
        num_params = sum(p.numel() for p in model.parameters())
        grad_bytes = models.gradient_bytes(model, a.precision)
    criterion = nn.CrossEntropyLoss()
    # an emulated DDP rank's optimizer step is a wait: no optimizer (creating SGD imports
    # torch._dynamo, seconds per run); Horovod wraps one to hook the gradients
    optimizer = (None if a.emulated and me.hvd is None else
                 torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=1e-4))
    scaler = None
    if a.precision == "amp" and device.type == "cuda":  # fp16's range needs it; bf16's does not
        scaler = torch.amp.GradScaler("cuda")
    return Trainee(model, pacer, real_model, param_names, num_params, grad_bytes, criterion,
                   optimizer, scaler)


def wrap(a: argparse.Namespace, me: Rank, t: Trainee) -> Engine:
    """The model in DDP (timing comm hook) or the optimizer in Horovod's, gradients travelling
    in 16 bits for amp, bf16 and fp16 compression; the model in training mode."""
    import torch

    hvd, device, model, optimizer, grad_bytes = me.hvd, me.device, t.model, t.optimizer, t.grad_bytes
    clock = common.StepClock(device)

    comm_dtype = precision.half_dtype(device, a.precision)
    if a.compression == "fp16" and comm_dtype is None:
        # fp16 gradient compression. DDP takes one comm hook, and the timing hook below is it,
        # so it does what default_hooks.fp16_compress_hook does (cast to fp16, divide by the
        # world, allreduce, copy back into the fp32 bucket) rather than being replaced by it
        comm_dtype = torch.float16
        grad_bytes //= 2
    timer = engines.CommTimer(clock, comm_dtype, average=not a.emulated)
    grad_ready: list[Any] = []
    pusher = None
    if me.ps is not None:
        pusher = psengine.Pusher(me.ps, timer, comm_dtype, a.ps_overlap == "on",
                                 a.ps_piece_kb * 1024)
        model = engines.wrap_ddp(model, device, timer, a.emulated, a.bucket_cap_mb,
                                 process_group=me.ps.worker_group,
                                 hook=(pusher, psengine.ps_hook))
        timing_method = "ps-comm-hook"
        comm_dtype_name = str(comm_dtype or torch.float32).replace("torch.", "")
    elif hvd is None:
        model = engines.wrap_ddp(model, device, timer, a.emulated, a.bucket_cap_mb)
        timing_method = "ddp-comm-hook"
        comm_dtype_name = str(comm_dtype or torch.float32).replace("torch.", "")
    else:
        # an elastic run's first state broadcast is hvdelastic's: a rank brought back must
        # make no collective of its own before it
        optimizer = engines.wrap_horovod(hvd, model, optimizer, t.param_names, comm_dtype,
                                         a.channels_last, a.emulated, clock, grad_ready,
                                         broadcast=not a.restartable)
        timing_method = "horovod-synchronize"
        comm_dtype_name = "float16" if comm_dtype is not None else "float32"

    model.train()
    return Engine(model, optimizer, grad_bytes, clock, timer, grad_ready, timing_method, comm_dtype_name,
                  pusher)


def timed_loop(a: argparse.Namespace, me: Rank, data: Data, t: Trainee, eng: Engine) -> Timed:
    """The warm-up steps, then the timed ones, each split into data, compute and exposed comm."""
    hvd, device, pacer, criterion, scaler = me.hvd, me.device, t.pacer, t.criterion, t.scaler
    model, optimizer, clock, timer, grad_ready = eng.model, eng.optimizer, eng.clock, eng.timer, eng.grad_ready
    steps_rec: list[dict[str, float]] = []
    t_first = None
    real, bytes_first, blocked = data.real, 0, 0.0
    it = data.batches()
    # after a restart, on from the checkpoint's step (its timed steps are those left)
    begin = eng.begin if eng.begin is not None else (eng.attempt["from_step"] if eng.attempt
                                                      else 0)
    # the rank's host, where one command prints every node's lines: horovodrun's name for it,
    # or the Slurm node's
    host = os.environ.get("HOROVOD_HOSTNAME") or os.environ.get("SLURMD_NODENAME")
    host_field = f" {host}" if host else ""
    first = max(begin, a.warmup)
    for i in range(begin, a.warmup + a.steps):
        if i == first:
            clock.sync()
            sample_start = common.host_sample()  # before the clock starts: not in the window
            t_first = time.perf_counter()
            TIMELINE["timed_start"] = time.time()
            bytes_first = real.start_window() if real is not None else 0
        timer.reset()
        grad_ready.clear()
        start = clock.mark()
        x, y = next(it)
        t_data = clock.mark()
        if not a.emulated:  # emulated gradients are added in place, never cleared (emulate.build)
            optimizer.zero_grad()  # set_to_none by default; Horovod's override takes no args
        if a.emulated:
            loss = model(x)  # the profile's forward waits; the loss is a stand-in scalar
        else:
            with precision.autocast(device, a.precision):
                loss = criterion(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        t_bwd = clock.mark()
        t_sync = t_bwd
        if hvd is not None:
            optimizer.synchronize()
            t_sync = clock.mark()
        if pacer is not None:
            pacer.start()
            pacer.wait(a.emulated["optimizer_s"])  # the device's optimizer step
        else:
            with optimizer.skip_synchronize() if hvd is not None else contextlib.nullcontext():
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
        t_end = clock.mark()
        clock.sync()
        if a.report_steps:  # one write: the node's ranks share the pipe (horovodrun's: the
            # host it was given, which says whose line it is)
            sys.stdout.write(f"SCALELAB_STEP {eng.attempt['restart'] if eng.attempt else 0} "
                             f"{me.rank} {i + 1} {os.getpid()} {time.time():.6f}{host_field}\n")
            sys.stdout.flush()
        if i < a.warmup:
            continue
        if eng.ckpt is not None and eng.ckpt.due(i + 1 - a.warmup):
            blocked += eng.ckpt.save(i + 1)  # between steps: in no step's time
            # and the state Horovod's elastic driver rolls back to (none after the last step:
            # a run that went back to it would have no step left to time)
            if eng.commit is not None and i + 1 < a.warmup + a.steps:
                blocked += eng.ckpt.add_blocked(eng.commit(i + 1))
        steps_rec.append(engines.step_record(a, hvd, eng, start, t_data, t_bwd, t_sync, t_end, loss))
    t_last = time.perf_counter()
    TIMELINE["timed_end"] = time.time()
    if eng.ckpt is not None:
        eng.ckpt.finish()  # the last asynchronous write: after the timed window
    window = common.sample_delta(sample_start, common.host_sample())
    it.close()
    if t_first is None or len(steps_rec) != a.warmup + a.steps - first:
        raise RuntimeError(f"ran {len(steps_rec)} timed steps, expected "
                           f"{a.warmup + a.steps - first}")
    data_bytes, read = (real.bytes_read - bytes_first, real.read_between(t_first, t_last)) if real else (None, None)
    return Timed(steps_rec, t_first, t_last, window, data_bytes, blocked, read)


def gather(a: argparse.Namespace, me: Rank, data: Data, t: Trainee, eng: Engine, timed: Timed) -> None:
    """Every rank's own record to rank 0, which prints the one SCALELAB_RESULT line."""
    import torch.distributed as dist

    mine = runrecord.rank_record(a, me, eng, timed)
    servers = None
    if me.ps is not None:
        eng.pusher.finish()  # the servers stop serving once every worker is done
        servers = psengine.server_records(None)
    if me.hvd is not None:
        gathered = me.hvd.allgather_object(mine)
    else:
        gathered = [None] * me.world
        dist.all_gather_object(gathered, mine, group=me.ps.worker_group if me.ps else None)
    if me.rank == 0:
        ranks = sorted(gathered, key=lambda r: r["rank"])
        env = dict(ranks[0]["env"])
        env["hostnames"] = list(dict.fromkeys(r["host"] for r in ranks))
        for rec in ranks:
            rec.pop("env")
        result = runrecord.result(a, me, data, t, eng, ranks, env, TIMELINE)
        if servers is not None:
            result["ps"] = {"servers": servers, "overlap": a.ps_overlap == "on",
                            "colocated": bool({s["host"] for s in servers}
                                              & {r["host"] for r in ranks})}
        common.emit_result(result)


def finish(me: Rank) -> None:
    """Leave the process group (DDP) or Horovod."""
    import torch.distributed as dist

    if me.hvd is None:
        # every rank reaches here with its own sends finished before the group is torn down;
        # without it gloo sometimes aborts at exit ("terminate called without an active
        # exception") and a good run is reported as failed
        dist.barrier()
        dist.destroy_process_group()
    else:
        me.hvd.shutdown()


@common.recorded
def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        return run(a)
    except (ValueError, FileNotFoundError) as e:
        print(f"resnet.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    common.exit_now(main())
