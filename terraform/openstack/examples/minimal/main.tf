# The openstack module on its own, with only what it cannot default: `terraform init &&
# terraform plan` with the variables below set (TF_VAR_... or -var) and OpenStack credentials
# in the environment (OS_CLOUD or an openrc).
# scalelab does not use this file; it takes scalelab.tfvars beside it:
#   invoke provision --target openstack --nodes 2 --var-file terraform/openstack/examples/minimal/scalelab.tfvars

variable "operator_cidr" {
  type        = string
  description = "Your public IPv4 address as a /32, e.g. 203.0.113.7/32."
}

variable "ssh_public_key" {
  type        = string
  description = "OpenSSH public key for the image's login user."
}

variable "external_network_name" {
  type        = string
  description = "The cloud's external network (floating IP pool)."
}

variable "image_name" {
  type        = string
  description = "Glance image, e.g. Ubuntu 22.04."
}

variable "flavor_name" {
  type        = string
  description = "A GPU flavor of the cloud."
}

variable "gpus_per_node" {
  type        = number
  description = "GPUs per instance of that flavor."
  default     = 1
}

module "cluster" {
  source = "../.."

  cluster_name          = "minimal"
  nodes                 = 2
  ssh_public_key        = var.ssh_public_key
  operator_cidr         = var.operator_cidr
  external_network_name = var.external_network_name
  image_name            = var.image_name
  flavor_name           = var.flavor_name
  gpus_per_node         = var.gpus_per_node
}

output "nodes" {
  description = "The cluster's machines (outputs contract)."
  value       = module.cluster.nodes
}

output "ssh_user" {
  description = "Default SSH user (outputs contract)."
  value       = module.cluster.ssh_user
}

output "bastion_ip" {
  description = "Jump host (the head node's floating IP) (outputs contract)."
  value       = module.cluster.bastion_ip
}
