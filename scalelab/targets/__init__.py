"""Targets: where clusters come from. Each returns the same Node records."""

TARGETS = ("local", "static", "openstack", "aws")
TERRAFORM_TARGETS = ("static", "openstack", "aws")
