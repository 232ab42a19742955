"""Targets: where clusters come from. Each implements scalelab.cluster.targets.base.Target."""

from scalelab.cluster.targets.interface import TARGETS, TERRAFORM_TARGETS

__all__ = ["TARGETS", "TERRAFORM_TARGETS"]
