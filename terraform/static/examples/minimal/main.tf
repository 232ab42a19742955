# The static module on its own: `terraform init && terraform apply` here prints the outputs
# contract for three documentation-range hosts (192.0.2.x and 198.51.100.x are never routed).
# scalelab does not use this file; it takes scalelab.tfvars.json beside it:
#   invoke provision --target static --nodes 3 --var-file terraform/static/examples/minimal/scalelab.tfvars.json

module "cluster" {
  source = "../.."

  cluster_name         = "minimal"
  nodes                = 3
  ssh_user             = "ubuntu"
  ssh_private_key_file = "~/.ssh/id_ed25519"

  hosts = [
    { address = "192.0.2.10", role = "head", gpus = "1" },
    { address = "192.0.2.11", gpus = "1" },
    { address = "198.51.100.12", private_address = "10.0.0.12", gpus = "1", ssh_user = "lab" },
  ]
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
