"""ResNet models for the training benchmark, written from the papers (no torchvision on nodes).

ImageNet ResNets (He et al. 2015, "Deep Residual Learning for Image Recognition") follow
torchvision's layout exactly, including its "v1.5" Bottleneck (stride on the 3x3 conv, not the
first 1x1) and its weight init, so parameter counts match torchvision with 1000 classes:

    >>> sum(p.numel() for p in build_model("resnet50", 1000).parameters())
    25557032

CIFAR ResNets (same paper, section 4.2): a 3x3 16-channel stem, three stages of n basic blocks
with 16/32/64 channels on 32x32/16x16/8x8 maps, global average pooling and a linear layer,
depth = 6n + 2. The shortcut is **option A** (as in the paper's CIFAR experiments): identity,
and where the shape changes, spatial subsampling by 2 plus zero-padding of the new channels, so
shortcuts add no parameters. With 10 classes resnet20 has 269,722 parameters (paper: 0.27M),
resnet32 464,154 (0.46M), resnet44 658,586 (0.66M), resnet56 853,018 (0.85M).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MODELS", "ModelSpec", "build_model", "gradient_bytes", "model_names", "spec"]


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv3x3(cin, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv1x1(cin, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        # v1.5: the stride sits on the 3x3 conv (torchvision, NVIDIA DeepLearningExamples).
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ImageNet ResNet: 7x7/2 stem, 3x3/2 max-pool, four stages (64..512 planes), avg-pool, fc."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        _init_weights(self)

    def _make_layer(
        self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int, stride: int = 1
    ) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                _conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class _ShortcutA(nn.Module):
    """Option A shortcut: subsample by 2 and zero-pad the extra channels (no parameters)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        extra = cout - cin
        self.pad = (0, 0, 0, 0, extra // 2, extra - extra // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x[:, :, ::2, ::2], self.pad)


class CifarBasicBlock(nn.Module):
    def __init__(self, cin: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(cin, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != planes:
            self.shortcut = _ShortcutA(cin, planes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """CIFAR ResNet of depth 6n+2 (He et al. 2015, section 4.2), option A shortcuts."""

    def __init__(self, depth: int, num_classes: int = 10) -> None:
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
        n = (depth - 2) // 6
        self.conv1 = _conv3x3(3, 16)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        cin = 16
        stages = []
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = []
            for i in range(n):
                blocks.append(CifarBasicBlock(cin, planes, stride if i == 0 else 1))
                cin = planes
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(64, num_classes)
        _init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _init_weights(model: nn.Module) -> None:
    # torchvision's init: He-normal (fan_out) convs, BN gamma 1 / beta 0, default Linear init.
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


@dataclass(frozen=True)
class ModelSpec:
    """How to build one model and what it expects by default."""

    name: str
    family: str  # "imagenet" | "cifar"
    factory: Callable[[int], nn.Module]
    default_num_classes: int
    default_image_size: int


# The one registry (models.json, beside this file, read by the controller's planner too): what
# each model is; here only how to build it.
REGISTRY: dict[str, dict] = {k: v for k, v in json.loads(
    (Path(__file__).with_name("models.json")).read_text()).items() if not k.startswith("_")}
_LAYOUTS: dict[str, Callable[[int], nn.Module]] = {
    "resnet20": lambda k: CifarResNet(20, k),
    "resnet32": lambda k: CifarResNet(32, k),
    "resnet44": lambda k: CifarResNet(44, k),
    "resnet56": lambda k: CifarResNet(56, k),
    "resnet18": lambda k: ResNet(BasicBlock, [2, 2, 2, 2], k),
    "resnet34": lambda k: ResNet(BasicBlock, [3, 4, 6, 3], k),
    "resnet50": lambda k: ResNet(Bottleneck, [3, 4, 6, 3], k),
    "resnet101": lambda k: ResNet(Bottleneck, [3, 4, 23, 3], k),
    "resnet152": lambda k: ResNet(Bottleneck, [3, 8, 36, 3], k),
}
MODELS: dict[str, ModelSpec] = {
    name: ModelSpec(name, r["family"], _LAYOUTS[name], r["num_classes"], r["image_size"])
    for name, r in REGISTRY.items()
}

# Bytes per gradient element on the wire. tf32 changes only how matmuls and convolutions
# compute: parameters, gradients and their allreduce stay 4-byte fp32.
PRECISION_BYTES = {"fp32": 4, "tf32": 4, "amp": 2, "bf16": 2}


def model_names() -> list[str]:
    """Known model names, ImageNet ones first, each family by depth."""
    return list(MODELS)


def spec(name: str) -> ModelSpec:
    """The registry entry for `name`; ValueError naming the known models otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(model_names())}") from None


def build_model(name: str, num_classes: int | None = None) -> nn.Module:
    """Build model `name` with `num_classes` outputs (default: 1000 ImageNet, 10 CIFAR)."""
    s = spec(name)
    k = s.default_num_classes if num_classes is None else num_classes
    if k < 1:
        raise ValueError(f"num_classes must be >= 1, got {k}")
    return s.factory(k)


def gradient_bytes(model: nn.Module, precision: str) -> int:
    """Bytes of gradient one rank allreduces per step.

    fp32 and tf32 communicate 4-byte gradients; amp and bf16 communicate 16-bit ones (the
    benchmark compresses gradients to fp16/bf16 for the allreduce in those modes, for both DDP
    and Horovod), so 2 bytes.

        >>> gradient_bytes(build_model("resnet20", 10), "fp32")
        1078888
        >>> gradient_bytes(build_model("resnet20", 10), "bf16")
        539444
    """
    try:
        width = PRECISION_BYTES[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISION_BYTES)}") from None
    return width * sum(p.numel() for p in model.parameters() if p.requires_grad)
