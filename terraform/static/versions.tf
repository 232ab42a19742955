# No provider on purpose: the hosts already exist, so this module only validates and
# normalises the host list. It goes through the same wrapper, state handling and outputs
# contract as the cloud targets. It is tested with Terraform 1.0.3 and uses nothing newer.
terraform {
  required_version = ">= 1.0.0"
}
