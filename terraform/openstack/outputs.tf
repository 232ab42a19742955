# The outputs contract shared by every target; scalelab renders the inventory from these.
# Only the head node has a floating IP, so every node (the head included) is reached at its
# private address through the head: public_ip is null and bastion_ip is the floating IP.

output "nodes" {
  description = "The cluster's machines: name -> {public_ip (address the controller's SSH reaches, null when only through the bastion), private_ip (cluster-network address the ranks use), role (head or worker), gpus, ssh_user}."
  value = {
    for i, port in openstack_networking_port_v2.node : local.names[i] => {
      public_ip  = null
      private_ip = port.all_fixed_ips[0]
      role       = i == 0 ? "head" : "worker"
      gpus       = var.gpus_per_node
      ssh_user   = var.ssh_user
    }
  }
  depends_on = [openstack_compute_instance_v2.node]
}

output "ssh_user" {
  description = "Default SSH user for the cluster's machines."
  value       = var.ssh_user
}

output "bastion_ip" {
  description = "Jump host for SSH to the machines (the head node's floating IP), or null when they are reached directly."
  value       = openstack_networking_floatingip_associate_v2.head.floating_ip
}
