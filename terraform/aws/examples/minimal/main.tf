# The aws module on its own, with only what it cannot default: `terraform init && terraform
# plan -var operator_cidr=... -var ssh_public_key="$(cat key.pub)"` (needs AWS credentials).
# scalelab does not use this file; it takes scalelab.tfvars beside it:
#   invoke provision --target aws --nodes 2 --var-file terraform/aws/examples/minimal/scalelab.tfvars

variable "region" {
  type        = string
  description = "AWS region."
  default     = "us-east-1"
}

variable "operator_cidr" {
  type        = string
  description = "Your public IPv4 address as a /32, e.g. 203.0.113.7/32."
}

variable "ssh_public_key" {
  type        = string
  description = "OpenSSH public key for the ubuntu user."
}

module "cluster" {
  source = "../.."

  cluster_name   = "minimal"
  nodes          = 2
  region         = var.region
  operator_cidr  = var.operator_cidr
  ssh_public_key = var.ssh_public_key
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
  description = "Jump host, or null (outputs contract)."
  value       = module.cluster.bastion_ip
}
