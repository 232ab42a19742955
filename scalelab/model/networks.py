"""The networks `--model` names and what scalelab knows of each (parameters, FLOPs,
activations), read from the one registry, bench/workloads/models.json, which the workloads
read too.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from scalelab.core.state import PROJECT_ROOT

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ModelInfo:
    """What planning needs to know about a model: input size, gradient size, work, memory."""

    image_size: int  # default input side in pixels
    params: int  # trainable parameters (fp32 gradient = 4 bytes each)
    gflops_fwd: float  # forward pass, GFLOP per image at image_size
    activation_bytes: int  # fp32 bytes saved for backward per image at image_size


# The one model registry, shared with the workloads that build the models (torchvision's
# ImageNet ResNets and He et al. (2016) CIFAR ResNets); see its "_about".
MODELS_FILE = PROJECT_ROOT / "bench" / "workloads" / "models.json"
MODELS: dict[str, ModelInfo] = {
    name: ModelInfo(r["image_size"], r["params"], r["gflops_fwd"], r["activation_bytes_per_image"])
    for name, r in json.loads(MODELS_FILE.read_text()).items() if not name.startswith("_")
}


def gradient_bytes(model: str) -> int:
    """fp32 gradient of a model, what every step all-reduces.

    >>> gradient_bytes("resnet20")
    1078888
    """
    return MODELS[model].params * 4
