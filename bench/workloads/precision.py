"""What each --precision of resnet.py means.

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
"""

from __future__ import annotations

import contextlib

PRECISIONS = ("fp32", "tf32", "amp", "bf16")
# Device profiles are measured as fp32 or amp only (emulate.check): a tf32 run emulates with an
# fp32 profile and a bf16 run with an amp one; the gradient they communicate is the same size.
PROFILE_PRECISION = {"fp32": "fp32", "tf32": "fp32", "amp": "amp", "bf16": "amp"}


def half_dtype(device, precision: str):
    """The 16-bit type autocast computes in and gradients travel in; None for fp32 and tf32."""
    import torch

    if precision == "bf16":
        return torch.bfloat16
    if precision == "amp":
        return torch.float16 if device.type == "cuda" else torch.bfloat16
    return None


def autocast(device, precision: str):
    import torch

    dtype = half_dtype(device, precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def set_tf32(device, precision: str) -> bool | None:
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
