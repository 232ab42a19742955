"""Helpers shared by the workloads: result line, size parsing, statistics, env fingerprint,
torch.distributed setup and step clocks. Imports torch lazily so netprobe runs without it."""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

RESULT_PREFIX = "SCALELAB_RESULT"

_SIZE_RE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def log(msg: str, *args: Any) -> None:
    """Progress/diagnostics go to stderr; stdout carries only the result line."""
    print(f"[{os.path.basename(sys.argv[0])}] " + (msg % args if args else msg), file=sys.stderr, flush=True)


def emit_result(payload: dict[str, Any]) -> None:
    """Print the one `SCALELAB_RESULT {json}` line (compact JSON, no NaN)."""
    line = json.dumps(payload, separators=(",", ":"), sort_keys=False, allow_nan=False)
    sys.stdout.write(f"{RESULT_PREFIX} {line}\n")
    sys.stdout.flush()


def parse_size(text: str | int) -> int:
    """Parse a byte count with binary suffix, nccl-tests style.

    >>> [parse_size(s) for s in ("4K", "64M", "1G", "512", "8KiB", "1.5K")]
    [4096, 67108864, 1073741824, 512, 8192, 1536]
    """
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"bad size {text!r}: expected e.g. 4096, 4K, 64M, 1G")
    return int(float(m["num"]) * _SIZE_UNITS[m["unit"].upper()])


def percentile(values: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) with linear interpolation between order statistics
    (numpy's default method).

    >>> percentile([1, 2, 3, 4], 50)
    2.5
    >>> round(percentile(range(1, 11), 95), 2)
    9.55
    """
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("percentile of an empty sequence")
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float:
    xs = list(values)
    if not xs:
        raise ValueError("mean of an empty sequence")
    return sum(xs) / len(xs)


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def nvidia_driver_version() -> str | None:
    """Kernel driver version (e.g. '550.54.15') from procfs; no nvidia-smi subprocess."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+(?:\.\d+)+)", f.read())
            return m.group(1) if m else None
    except OSError:
        return None


def env_fingerprint(hostnames: Sequence[str], horovod_version: str | None = None) -> dict[str, Any]:
    """Software/hardware fingerprint of this rank, plus the hostnames of all ranks (rank order,
    de-duplicated)."""
    import torch
    import torch.distributed as dist

    nccl = None
    gpu = None
    cuda_runtime = None
    if torch.cuda.is_available():
        try:
            v = torch.cuda.nccl.version()  # a tuple in torch >= 1.13, an int before
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 - built without NCCL
            nccl = None
        gpu = torch.cuda.get_device_name()
        cuda_runtime = torch.version.cuda
    if horovod_version is None:
        try:
            import horovod

            horovod_version = horovod.__version__
        except ImportError:
            horovod_version = None
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        # torch bundles Gloo without exposing a version; record its availability instead.
        "gloo": "bundled-with-torch" if dist.is_available() and dist.is_gloo_available() else None,
        "nccl": nccl,
        "horovod": horovod_version,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu_model": gpu,
        "cuda_runtime": cuda_runtime,
        "cuda_driver": nvidia_driver_version() if gpu else None,
        "cudnn": torch.backends.cudnn.version() if gpu else None,
        "hostnames": list(dict.fromkeys(hostnames)),
    }


def hostname() -> str:
    return socket.gethostname()


def resolve_device(requested: str, local_rank: int):
    """'auto' -> cuda when torch has a usable GPU, else cpu. A CUDA rank gets cuda:<local_rank>.

    Ranks sharing a GPU would measure each other rather than the GPU, so a local rank with no GPU
    of its own ends the process (SystemExit: one line on stderr, exit status 1) instead of
    wrapping around; so does --device cuda where torch cannot use CUDA.
    """
    import torch

    script = os.path.basename(sys.argv[0]) or "python"
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = "CUDA_VISIBLE_DEVICES unset" if visible is None else f"CUDA_VISIBLE_DEVICES={visible}"
        if not torch.cuda.is_available():
            if torch.version.cuda is None:
                raise SystemExit(
                    f"{script}: --device cuda but this node's torch has no CUDA "
                    "(torch.cuda.is_available() is False); install a CUDA build of torch or use --device cpu"
                )
            raise SystemExit(
                f"{script}: --device cuda but torch (CUDA {torch.version.cuda}) sees no GPU "
                f"(torch.cuda.is_available() is False, {shown}); check the NVIDIA driver or use --device cpu"
            )
        count = torch.cuda.device_count()
        if not 0 <= local_rank < count:
            gpus = f"{count} GPU" + ("" if count == 1 else "s")
            raise SystemExit(
                f"{script}: local rank {local_rank} but torch sees {gpus} ({shown}); "
                f"run at most {count} process{'' if count == 1 else 'es'} per node"
            )
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if requested != "cpu":
        raise ValueError(f"unknown device {requested!r} (auto|cpu|cuda)")
    return torch.device("cpu")


def init_torch_distributed(backend: str, timeout_s: float) -> tuple[int, int, int]:
    """Init the default process group from torchrun's env (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    Without torchrun (no WORLD_SIZE in env) this is a 1-rank group on an in-process store, so the
    workloads also run as plain scripts. Returns (rank, world_size, local_rank).
    """
    from datetime import timedelta

    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    else:
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        local_rank = 0
    return dist.get_rank(), dist.get_world_size(), local_rank


class StepClock:
    """Timestamps inside a step: host perf_counter on CPU, CUDA events on GPU.

    On CUDA, host timestamps would measure kernel *launch*, not execution, so every mark is an
    event recorded on the current stream, resolved after the end-of-step synchronize.
    """

    def __init__(self, device) -> None:
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        if self.cuda:
            import torch

            self._torch = torch

    def mark(self):
        if self.cuda:
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def sync(self) -> None:
        if self.cuda:
            self._torch.cuda.synchronize()

    def seconds(self, start, end) -> float:
        """Seconds from mark `start` to mark `end` (call after sync())."""
        if self.cuda:
            return start.elapsed_time(end) / 1000.0
        return end - start


def union_length(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping [start, end] intervals.

    >>> union_length([(0, 2), (1, 3), (5, 6)])
    4.0
    """
    total = 0.0
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return float(total)


def host_sample(iface: str | None = None) -> dict[str, float]:
    """Counters for the fidelity guard, read at the start and the end of the timed steps: the
    host's CPU time (/proc/stat: all and idle jiffies; inside a network namespace this is still
    the machine's) and the node's NIC byte counters (the interface the collectives use)."""
    out: dict[str, float] = {"t": time.time()}
    try:
        with open("/proc/stat", encoding="ascii") as f:
            cols = [int(v) for v in f.readline().split()[1:]]
        out["cpu_all"] = float(sum(cols[:8]))  # user..steal; guest time is inside user
        out["cpu_idle"] = float(cols[3] + (cols[4] if len(cols) > 4 else 0))  # idle + iowait
    except (OSError, ValueError, IndexError):
        pass
    iface = iface or os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME")
    if iface:
        for key in ("tx_bytes", "rx_bytes"):
            try:
                with open(f"/sys/class/net/{iface}/statistics/{key}", encoding="ascii") as f:
                    out[key] = float(f.read())
            except (OSError, ValueError):
                pass
    return out


def sample_delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float | None]:
    """What happened between two host_sample()s: seconds, host CPU idle share, NIC bytes.

    >>> sample_delta({"t": 0, "cpu_all": 100, "cpu_idle": 50, "tx_bytes": 0},
    ...              {"t": 2, "cpu_all": 300, "cpu_idle": 70, "tx_bytes": 10})
    {'seconds': 2.0, 'host_cpu_idle': 0.1, 'tx_bytes': 10.0, 'rx_bytes': None}
    """
    def diff(k: str) -> float | None:
        return float(b[k] - a[k]) if k in a and k in b else None

    all_ = diff("cpu_all")
    idle = diff("cpu_idle")
    return {"seconds": float(b["t"] - a["t"]),
            "host_cpu_idle": round(idle / all_, 4) if all_ and idle is not None else None,
            "tx_bytes": diff("tx_bytes"), "rx_bytes": diff("rx_bytes")}


# set by warm.py in a rank it forked: tells the rank's client its exit code, then leaves
exit_hook = None


def recorded(main):
    """main under torch.distributed.elastic's @record: an exception that ends the rank is
    written, as structured JSON, to the file TORCHELASTIC_ERROR_FILE names (torchrun names one
    per worker and copies the failed one's up into its own; scalelab names it for ranks it
    starts itself and reads it back). torch is imported when main runs, not before: the
    timeline's first mark is taken before it."""

    @functools.wraps(main)
    def run(*args, **kwargs):
        from torch.distributed.elastic.multiprocessing.errors import record

        code = record(main)(*args, **kwargs)
        return 0 if code is None else code  # record turns SystemExit(0) (--help) into None

    return run


def exit_now(code: int) -> None:
    """Leave the process once its result is printed and its process group left.

    What remains is the interpreter tearing down torch's modules and threads: over a second
    per run on a small host, which the launcher (torchrun, horovodrun) waits for before the
    next run can start. Flush and leave at once; an exception before this point still ends
    the process the normal way, with its traceback.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if exit_hook is not None:  # a rank forked by warm.py: its client hears how it ended
        exit_hook(code)
    os._exit(code)


def memory_layout(model) -> str:
    """The memory format the model's convolutions really hold: whether the first 4-D weight
    with a kernel wider than 1 is strided NHWC (channels_last) or not."""
    import torch

    for p in model.parameters():
        if p.dim() == 4 and p.shape[-1] > 1:
            nhwc = p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
            return "channels_last" if nhwc else "contiguous"
    return "contiguous"
