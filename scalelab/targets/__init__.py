"""Targets: where clusters come from. Each implements scalelab.targets.base.Target."""

from scalelab.targets.interface import TARGETS, TERRAFORM_TARGETS

__all__ = ["TARGETS", "TERRAFORM_TARGETS"]
