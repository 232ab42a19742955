terraform {
  # 1.3: lifecycle preconditions are used below (1.2 added them; 1.3 is the oldest tested).
  required_version = ">= 1.3.0"

  required_providers {
    openstack = {
      source  = "terraform-provider-openstack/openstack"
      version = ">= 1.54.0"
    }
  }
}
