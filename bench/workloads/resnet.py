#!/usr/bin/env python3
"""Distributed ResNet training benchmark (synthetic ImageNet or real JPEGs), DDP or Horovod.

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

Precision:

* fp32: true FP32. On CUDA, TF32 is switched off for matmuls and cuDNN convolutions (cuDNN
  would otherwise use it for convolutions on Ampere and later, unasked).
* tf32: fp32 parameters and gradients, TF32 switched on for matmuls and convolutions on CUDA
  (the same as fp32 on CPU).
* amp: autocast (bf16 on CPU; fp16 + GradScaler on CUDA); TF32 left at torch's defaults.
* bf16: bfloat16 autocast on CUDA and CPU, no GradScaler (bf16 has fp32's range).

In amp and bf16 mode the gradients are also communicated in 16 bits (DDP hook casts to the
autocast dtype; Horovod uses Compression.fp16, its only 16-bit type), which is what
gradient_bytes reports. The result's "tf32" says whether TF32 was enabled for matmuls or
convolutions (null on CPU, where there is none).

Each rank's record says what it ran on: device ("cpu", "cuda:0"), device_name and
gpu_mem_peak_mb (torch.cuda.max_memory_allocated over the whole process; null on CPU). The
top-level "backend" is what reduced the gradients: nccl or gloo (DDP), horovod-nccl,
horovod-gloo or horovod-mpi (Horovod).

DDP does not sync buffers in forward (broadcast_buffers=False) so both engines communicate gradients only (Horovod does not
sync BatchNorm buffers per step either).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import socket
import sys
import threading
import time
from typing import Any

# Wall-clock marks of this process's life (unix seconds), reported by rank 0 so that the
# controller can split a run's wall time: launch, import, rendezvous, setup, warm-up, timed
# steps, finish. The first is taken before torch is imported.
TIMELINE: dict[str, float] = {"process": time.time()}

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import emulate  # noqa: E402
import models  # noqa: E402

PRECISIONS = ("fp32", "tf32", "amp", "bf16")
# Device profiles are measured as fp32 or amp only (emulate.check): a tf32 run emulates with an
# fp32 profile and a bf16 run with an amp one; the gradient they communicate is the same size.
PROFILE_PRECISION = {"fp32": "fp32", "tf32": "fp32", "amp": "amp", "bf16": "amp"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Distributed ResNet training benchmark.")
    p.add_argument("--model", default="resnet50", help=f"one of: {', '.join(models.model_names())}")
    p.add_argument("--batch-size", type=int, default=32, help="images per step per worker")
    p.add_argument(
        "--image-size", type=int, default=None, help="square input side (default 224 ImageNet models, 32 CIFAR ones)"
    )
    p.add_argument(
        "--num-classes",
        type=int,
        default=None,
        help="classifier outputs (default 1000/10, or the dataset's class count)",
    )
    p.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        default="fp32",
        help="fp32 (no TF32 on CUDA), tf32, amp (fp16 + GradScaler on CUDA, bf16 on CPU) or bf16",
    )
    p.add_argument(
        "--channels-last", action="store_true", help="NHWC memory format (a GPU optimisation; allowed on CPU)"
    )
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--engine", choices=["ddp", "horovod"], default="ddp")
    p.add_argument(
        "--data", default="synthetic", help="'synthetic' or a dataset path (class folders or webdataset .tar shards)"
    )
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank (real data)")
    p.add_argument(
        "--pin-memory",
        choices=["auto", "on", "off"],
        default="auto",
        help="page-locked loader batches for faster host-to-GPU copies (real data; auto: on for cuda)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument(
        "--backend",
        choices=["auto", "gloo", "nccl"],
        default="auto",
        help="DDP backend (auto: nccl on CUDA, gloo on CPU)",
    )
    p.add_argument(
        "--bucket-cap-mb",
        type=float,
        default=25.0,
        help="DDP's bucket_cap_mb: gradient bucket size in MB (default 25, torch's own)",
    )
    p.add_argument(
        "--compression",
        choices=["none", "fp16"],
        default="none",
        help="gradient compression: fp16 (DDP: the fp16_compress_hook's cast, done by the timing "
        "hook; Horovod: hvd.Compression.fp16)",
    )
    p.add_argument(
        "--fusion-threshold-mb",
        type=float,
        default=None,
        help="Horovod: HOROVOD_FUSION_THRESHOLD in MB (MB x 1024 x 1024 bytes, as horovodrun "
        "converts it); default: the environment's, else Horovod's 128",
    )
    p.add_argument(
        "--cycle-time-ms",
        type=float,
        default=None,
        help="Horovod: HOROVOD_CYCLE_TIME in ms; default: the environment's, else Horovod's 1",
    )
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads per rank (0: leave torch's default)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--timeout-s", type=float, default=600.0, help="collective/dataloader timeout (a hung peer fails the run)"
    )
    p.add_argument(
        "--profile",
        default=None,
        help="emulate an accelerator from this device profile (JSON): real parameters and real "
        "gradient communication; forward, backward and the optimizer step are the profile's waits",
    )
    p.add_argument(
        "--dilation",
        type=float,
        default=1.0,
        help="time dilation k (with --profile): waits are k times the profile's, the controller "
        "shapes links to rate/k, and reported times are divided by k",
    )
    a = p.parse_args(argv)
    try:
        s = models.spec(a.model)
    except ValueError as e:
        p.error(str(e))
    if a.image_size is None:
        a.image_size = s.default_image_size
    for name in ("batch_size", "steps", "image_size"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.warmup < 0 or a.workers < 0 or a.threads < 0:
        p.error("--warmup, --workers and --threads must be >= 0")
    if a.engine == "horovod" and a.backend != "auto":
        p.error("--backend applies to --engine ddp only")
    for name in ("bucket_cap_mb", "fusion_threshold_mb", "cycle_time_ms"):
        value = getattr(a, name)
        if value is not None and not value > 0:
            p.error(f"--{name.replace('_', '-')} must be above 0, got {value}")
    if a.engine == "horovod" and a.bucket_cap_mb != 25.0:
        p.error("--bucket-cap-mb applies to --engine ddp only (Horovod: --fusion-threshold-mb)")
    if a.engine == "ddp" and (a.fusion_threshold_mb is not None or a.cycle_time_ms is not None):
        p.error("--fusion-threshold-mb and --cycle-time-ms apply to --engine horovod only")
    if a.dilation < 1 or a.dilation != a.dilation:
        p.error(f"--dilation must be >= 1 (a factor that slows the emulation down), got {a.dilation}")
    a.emulated = None
    if a.profile is not None:
        try:
            a.emulated = emulate.load(a.profile)
        except emulate.ProfileError as e:
            p.error(str(e))
        for key, want in (("model", a.model), ("precision", PROFILE_PRECISION[a.precision]),
                          ("batch_size", a.batch_size), ("image_size", a.image_size)):
            if a.emulated[key] != want:
                run_is = want if want == getattr(a, key) else f"{a.precision} (emulated with {want} profiles)"
                p.error(f"the profile {a.profile} is for {key} {a.emulated[key]}, this run's is {run_is}")
        if a.data != "synthetic":
            p.error("--profile emulates compute, so it takes no data: leave --data synthetic")
    elif a.dilation != 1:
        p.error("--dilation applies to emulated accelerators only (--profile)")
    return a


class _CommTimer:
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


def _timed_allreduce_hook(state: _CommTimer, bucket):
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


def _half_dtype(device, precision: str):
    """The 16-bit type autocast computes in and gradients travel in; None for fp32 and tf32."""
    import torch

    if precision == "bf16":
        return torch.bfloat16
    if precision == "amp":
        return torch.float16 if device.type == "cuda" else torch.bfloat16
    return None


def _autocast(device, precision: str):
    import torch

    dtype = _half_dtype(device, precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _set_tf32(device, precision: str) -> bool | None:
    """Apply the precision's TF32 choice on CUDA; return whether TF32 is now enabled for matmuls
    or convolutions (None on CPU). amp and bf16 leave torch's defaults: under autocast the
    matmuls and convolutions run in 16 bits, but the record still says what the flags were."""
    import torch

    if device.type != "cuda":
        return None
    if precision in ("fp32", "tf32"):
        on = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on
    return bool(torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32)


def _horovod_backend(hvd, device) -> str:
    """What reduces Horovod's gradients: NCCL for CUDA tensors where Horovod was built with it,
    else its controller's CPU path (Gloo or MPI)."""
    if device.type == "cuda" and hvd.nccl_built():
        return "horovod-nccl"
    return "horovod-gloo" if hvd.gloo_enabled() else "horovod-mpi"


def _pin_memory(choice: str, device) -> bool:
    return device.type == "cuda" if choice == "auto" else choice == "on"


def run(a: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn

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
        backend = _horovod_backend(hvd, device)
    else:
        # an emulated accelerator's rank lives on the host: its compute is the profile's waits
        device = common.resolve_device("cpu" if a.emulated else a.device, int(os.environ.get("LOCAL_RANK", "0")))
        backend = a.backend if a.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        rank, world, local_rank = common.init_torch_distributed(backend, a.timeout_s)
    TIMELINE["rendezvous"] = time.time()
    if a.threads:
        torch.set_num_threads(a.threads)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    tf32 = _set_tf32(device, a.precision)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    host = socket.gethostname()
    common.log(
        "rank %d/%d on %s device %s (%s) backend %s precision %s tf32 %s threads %d",
        rank, world, host, device, device_name, backend, a.precision, tf32, torch.get_num_threads(),
    )

    # Data first: real data decides the number of classes.
    mem_fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    real = None
    pin_memory = _pin_memory(a.pin_memory, device)
    if a.emulated:
        num_classes = a.num_classes or models.spec(a.model).default_num_classes
        x_emu = torch.zeros(1)

        def batches():
            for _ in range(a.warmup + a.steps):
                yield x_emu, None

        data_layout = "emulated"
    elif a.data == "synthetic":
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
    else:
        import imagedata

        real = imagedata.make_loader(
            a.data,
            image_size=a.image_size,
            batch_size=a.batch_size,
            workers=a.workers,
            rank=rank,
            world=world,
            num_classes=a.num_classes,
            pin_memory=pin_memory,
            seed=a.seed,
            timeout_s=a.timeout_s,
        )
        num_classes = real.num_classes
        data_layout = real.layout

        def batches():
            src = real.batches()
            try:
                for _ in range(a.warmup + a.steps):
                    x, y = next(src)
                    yield (
                        x.to(device, non_blocking=True).contiguous(memory_format=mem_fmt),
                        y.to(device, non_blocking=True),
                    )
            finally:
                src.close()

    torch.manual_seed(a.seed)  # identical init on every rank (DDP/Horovod broadcast anyway)
    pacer = None
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
    optimizer = (None if a.emulated and hvd is None else
                 torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=1e-4))
    scaler = None
    if a.precision == "amp" and device.type == "cuda":  # fp16's range needs it; bf16's does not
        scaler = torch.amp.GradScaler("cuda")
    clock = common.StepClock(device)

    comm_dtype = _half_dtype(device, a.precision)
    if a.compression == "fp16" and comm_dtype is None:
        # fp16 gradient compression. DDP takes one comm hook, and the timing hook below is it,
        # so it does what default_hooks.fp16_compress_hook does (cast to fp16, divide by the
        # world, allreduce, copy back into the fp32 bucket) rather than being replaced by it
        comm_dtype = torch.float16
        grad_bytes //= 2
    timer = _CommTimer(clock, comm_dtype, average=not a.emulated)
    grad_ready: list[Any] = []
    if hvd is None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp_kw: dict[str, Any] = {"device_ids": [device.index]} if device.type == "cuda" else {}
        if a.emulated:
            ddp_kw["gradient_as_bucket_view"] = True  # see emulate.build: no copies into buckets
            if "init_sync" in inspect.signature(DDP.__init__).parameters:
                ddp_kw["init_sync"] = False  # every rank's parameters are zeros already
        # torch >= 2.13 renames broadcast_buffers (deprecated) to forward_sync_buffers.
        if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
            ddp_kw["forward_sync_buffers"] = False
        else:
            ddp_kw["broadcast_buffers"] = False
        ddp_kw["bucket_cap_mb"] = a.bucket_cap_mb
        model = DDP(model, **ddp_kw)
        model.register_comm_hook(timer, _timed_allreduce_hook)
        timing_method = "ddp-comm-hook"
        comm_dtype_name = str(comm_dtype or torch.float32).replace("torch.", "")
    else:
        compression = hvd.Compression.fp16 if comm_dtype is not None else hvd.Compression.none
        if a.channels_last:
            compression = _contiguous(compression)
        _broadcast_parameters(hvd, model)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=list(zip(param_names, model.parameters(), strict=True)),
            compression=compression,
            op=hvd.Sum if a.emulated else hvd.Average,  # zeros: no scaling pass (see _CommTimer)
        )

        def on_grad(_p):
            if not grad_ready:
                grad_ready.append(clock.mark())

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(on_grad)
        timing_method = "horovod-synchronize"
        comm_dtype_name = "float16" if comm_dtype is not None else "float32"

    model.train()
    TIMELINE["ready"] = time.time()
    steps_rec: list[dict[str, float]] = []
    t_first = None
    it = batches()
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            clock.sync()
            sample_start = common.host_sample()  # before the clock starts: not in the window
            t_first = time.perf_counter()
            TIMELINE["timed_start"] = time.time()
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
            with _autocast(device, a.precision):
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
        if i < a.warmup:
            continue

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
        steps_rec.append(
            {
                "step_s": rel(t_end),
                "data_s": rel(t_data),
                "comm_s": exposed,
                "inflight_s": inflight,
                "loss": float(loss.detach()),
            }
        )
    t_last = time.perf_counter()
    TIMELINE["timed_end"] = time.time()
    window = common.sample_delta(sample_start, common.host_sample())
    it.close()
    if t_first is None or len(steps_rec) != a.steps:
        raise RuntimeError(f"ran {len(steps_rec)} timed steps, expected {a.steps}")

    step_times = [s["step_s"] for s in steps_rec]
    mine = {
        "rank": rank,
        "local_rank": local_rank,
        "host": host,
        "pid": os.getpid(),
        # emulated: the device's time is the steps' (host bookkeeping between steps is not the
        # device's, and would not be dilated like the steps); otherwise the timed window's
        "images_per_sec": a.batch_size * a.steps / (sum(step_times) if a.emulated else (t_last - t_first)),
        "step_time_mean_s": common.mean(step_times),
        "step_time_p95_s": common.percentile(step_times, 95),
        "compute_time_mean_s": common.mean([s["step_s"] - s["data_s"] - s["comm_s"] for s in steps_rec]),
        "comm_time_mean_s": common.mean([s["comm_s"] for s in steps_rec]),
        "comm_inflight_mean_s": common.mean([s["inflight_s"] for s in steps_rec]),
        "data_time_mean_s": common.mean([s["data_s"] for s in steps_rec]),
        "step_times_s": step_times,
        "final_loss": steps_rec[-1]["loss"],
        # the fidelity guard's figures over the timed steps (wall time, not dilated)
        "host_cpu_idle": window["host_cpu_idle"],
        "nic_tx_bytes": window["tx_bytes"],
        "nic_rx_bytes": window["rx_bytes"],
        "timed_wall_s": window["seconds"],
        "device": str(device),
        "device_name": device_name,
        # as the weights are laid out (an emulated rank has none: as asked)
        "memory_format": ("channels_last" if a.channels_last else "contiguous") if a.emulated
        else common.memory_layout(model),
        "gpu_mem_peak_mb": round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        if device.type == "cuda"
        else None,
        "env": common.env_fingerprint([host]),
    }
    if hvd is not None:
        gathered = hvd.allgather_object(mine)
    else:
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
    if rank == 0:
        ranks = sorted(gathered, key=lambda r: r["rank"])
        env = dict(ranks[0]["env"])
        env["hostnames"] = list(dict.fromkeys(r["host"] for r in ranks))
        for r in ranks:
            r.pop("env")
        common.emit_result(
            {
                "world_size": world,
                "model": a.model,
                "engine": a.engine,
                "precision": a.precision,
                "batch_size": a.batch_size,
                "image_size": a.image_size,
                "steps": a.steps,
                "warmup": a.warmup,
                "gradient_bytes": grad_bytes,
                "images_per_sec": sum(r["images_per_sec"] for r in ranks),
                "ranks": ranks,
                "env": env,
                "num_classes": num_classes,
                "num_params": num_params,
                "data": a.data,
                "data_layout": data_layout,
                "workers": a.workers if real is not None else 0,
                "loader_workers": a.workers if real is not None else None,
                "pin_memory": pin_memory if real is not None else None,
                "channels_last": a.channels_last,
                # what every rank's weights held: one format, or "mixed"
                "memory_format": (ranks[0]["memory_format"] if len(
                    {r["memory_format"] for r in ranks}) == 1 else "mixed"),
                "device": device.type,
                "tf32": tf32,
                "backend": backend,
                "comm_dtype": comm_dtype_name,
                # the communication settings this run used (the record's "comm")
                "comm": {
                    "bucket_cap_mb": a.bucket_cap_mb if hvd is None else None,
                    **(hvd_settings if hvd is not None
                       else {"fusion_threshold_mb": None, "cycle_time_ms": None}),
                    "compression": a.compression,
                    "comm_dtype": comm_dtype_name,
                },
                "timing_method": timing_method,
                "timeline": {**TIMELINE, "done": time.time()},
                "dilation": a.dilation,
                "accelerator": None
                if not a.emulated
                else {
                    "device": a.emulated["device"],
                    "source": a.emulated["source"],
                    "provenance": a.emulated["provenance"],
                    "precision": a.emulated["precision"],  # a tf32/bf16 run uses an fp32/amp profile
                    **{f"profile_{k}": v for k, v in emulate.totals(a.emulated).items()},
                },
            }
        )
    if hvd is None:
        # every rank reaches here with its own sends finished before the group is torn down;
        # without it gloo sometimes aborts at exit ("terminate called without an active
        # exception") and a good run is reported as failed
        dist.barrier()
        dist.destroy_process_group()
    else:
        hvd.shutdown()
    # Leave from here, before this function's locals are released. DDP's reducer holds the last
    # reference to the gloo process group and is freed with the GIL held; ~ProcessGroupGloo then
    # takes its work lock, which a gloo worker may hold while it waits for the GIL to free the
    # tensors of the last collective: a deadlock (the class of pytorch/pytorch#56297), seen here
    # as a rank that never exits after its result, about one run in 30 of the demo sweep.
    common.exit_now(0)
    return 0  # not reached


def _contiguous(compression):
    """Horovod reduces contiguous tensors only, and a channels_last model's 4-D gradients are
    not: a compressor that hands Horovod a contiguous copy (after `compression`'s own work) and
    gives the reduced copy back as the gradient, whose values are the same in either layout."""

    def compress(tensor):
        out, ctx = compression.compress(tensor)
        return out.contiguous(), ctx

    return type("Contiguous", (), {"compress": staticmethod(compress),
                                   "decompress": staticmethod(compression.decompress)})


def _broadcast_parameters(hvd, model) -> None:
    """hvd.broadcast_parameters, for any memory format: channels_last weights are sent as
    contiguous copies (Horovod needs those) and copied back in place."""
    state = model.state_dict()
    sent = {name: t.contiguous() for name, t in state.items()}
    hvd.broadcast_parameters(sent, root_rank=0)
    for name, t in state.items():
        if sent[name] is not t:
            t.copy_(sent[name])


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
