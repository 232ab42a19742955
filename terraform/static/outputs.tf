# The outputs contract shared by every target; scalelab renders the inventory from these.

output "nodes" {
  description = "The cluster's machines: name -> {public_ip (address the controller's SSH reaches, null when only through the bastion), private_ip (cluster-network address the ranks use), role (head or worker), gpus, ssh_user; static only: named, false where the var-file gave no name and scalelab labels the host until configure reads its hostname}."
  value = {
    for h in local.selected : h.name => {
      public_ip  = h.address
      private_ip = h.private_address
      role       = h.role
      gpus       = h.gpus
      ssh_user   = h.ssh_user
      named      = h.named
    }
  }
}

output "ssh_user" {
  description = "Default SSH user for the cluster's machines."
  value       = var.ssh_user
}

output "bastion_ip" {
  description = "Jump host for SSH to the machines, or null when they are reached directly."
  value       = var.bastion_ip
}
