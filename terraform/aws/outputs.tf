# The outputs contract shared by every target; scalelab renders the inventory from these.
# Every node has a public IP (SSH only from operator_cidr), so there is no bastion.

output "nodes" {
  description = "The cluster's machines: name -> {public_ip (address the controller's SSH reaches, null when only through the bastion), private_ip (cluster-network address the ranks use), role (head or worker), gpus, ssh_user}."
  value = {
    for i, node in aws_instance.node : local.names[i] => {
      public_ip  = node.public_ip
      private_ip = node.private_ip
      role       = i == 0 ? "head" : "worker"
      gpus       = local.gpus
      ssh_user   = var.ssh_user
    }
  }
}

output "ssh_user" {
  description = "Default SSH user for the cluster's machines."
  value       = var.ssh_user
}

output "bastion_ip" {
  description = "Jump host for SSH to the machines, or null when they are reached directly (always null here)."
  value       = null
}
