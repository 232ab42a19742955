"""resnet.py's command line: its options, the checks between them, and the device profile
an emulated run loads (parse_args)."""

from __future__ import annotations

import argparse

import emulate
import models
from precision import PRECISIONS, PROFILE_PRECISION


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _parser()
    a = p.parse_args(argv)
    _check_args(p, a)
    return a


def _parser() -> argparse.ArgumentParser:
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
    p.add_argument("--engine", choices=["ddp", "horovod", "ps"], default="ddp",
                   help="ps: synchronous parameter servers (psengine.py), under torchrun")
    p.add_argument(
        "--data", default="synthetic", help="'synthetic' or a dataset path (class folders or webdataset .tar shards)"
    )
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank (real data)")
    p.add_argument("--decode-cost-s", type=float, default=None,
                   help="with --profile and real data: read the images' bytes and charge this "
                        "many seconds of decode per image (times --dilation) instead of decoding")
    p.add_argument(
        "--pin-memory",
        choices=["auto", "on", "off"],
        default="auto",
        help="page-locked loader batches for faster host-to-GPU copies (real data; auto: on for cuda)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    _add_engine_args(p)
    _add_run_args(p)
    return p


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ps-servers-here", type=int, default=0,
                   help="--engine ps: the last this many processes of this node are servers")
    p.add_argument("--ps-overlap", choices=["on", "off"], default="on",
                   help="--engine ps: push buckets during backward (on) or after it (off)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="save the state every N timed steps (ckpt.py; 0: never)")
    p.add_argument("--checkpoint-dir", default="",
                   help="with --checkpoint-every: the run's own checkpoint directory (a path, or "
                        "nfs://ADDRESS/EXPORT/scalelab-checkpoints/...: an NFS server the ranks "
                        "write to through libnfs)")
    p.add_argument("--checkpoint-place", choices=["shared", "nodes"], default="nodes",
                   help="the directory is one place every node sees (shared: the ranks write "
                   "shares of the state) or on each node's own disk (nodes: its first rank "
                   "writes all of it)")
    p.add_argument("--report-steps", action="store_true",
                   help="print SCALELAB_STEP <restart> <rank> <step> <pid> <unix time> after every step "
                        "(what an injected failure waits for; the workload acts on none)")
    p.add_argument("--restartable", action="store_true",
                   help="torchrun's agents may restart the ranks: at start every rank agrees "
                        "with the others whether this is a restart and which checkpoint to go "
                        "on from (an agent that restarts its ranks for another node's failure "
                        "does not count it in TORCHELASTIC_RESTART_COUNT)")
    p.add_argument("--checkpoint-mode", choices=["sync", "async"], default="sync",
                   help="training waits for the files (sync) or only for the copy to host "
                   "memory (async: DCP's async_save)")
    p.add_argument("--ps-piece-kb", type=int, default=4000,
                   help="--engine ps: a bucket's shard travels in pieces of this many KB at most "
                   "(BytePS's BYTEPS_PARTITION_BYTES, 4,096,000 bytes, is its default)")
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


def _add_run_args(p: argparse.ArgumentParser) -> None:
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


def _check_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuse what the options cannot mean together (p.error: one line, exit code 2); fill the
    image size and load the device profile."""
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
    if a.engine != "ps" and (a.ps_servers_here or a.ps_overlap != "on" or a.ps_piece_kb != 4000):
        p.error("--ps-servers-here, --ps-overlap and --ps-piece-kb apply to --engine ps only")
    if a.checkpoint_every < 0 or (a.checkpoint_every and not a.checkpoint_dir.startswith(
            ("/", "nfs://"))):
        p.error("--checkpoint-every N (0 or more) needs --checkpoint-dir, an absolute path or "
                "an nfs:// place")
    if a.checkpoint_every and a.engine == "ps":
        p.error("--checkpoint-every: the parameter servers' state is not saved yet; use "
                "--engine ddp or horovod")
    if not 1 <= a.ps_piece_kb <= 1 << 20:
        p.error("--ps-piece-kb is 1 to 1048576 (KB)")
    if a.engine == "ps" and (a.backend not in ("auto", "gloo") or a.ps_servers_here < 0):
        p.error("--engine ps pushes over gloo (--backend auto or gloo) and --ps-servers-here "
                "is 0 or more")
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
        if a.data != "synthetic" and not (a.decode_cost_s or 0) > 0:
            p.error("--profile with real data needs --decode-cost-s (the decode it charges per "
                    "image), or leave --data synthetic")
    elif a.dilation != 1:
        p.error("--dilation applies to emulated accelerators only (--profile)")
