# Credentials come only from the provider's standard sources: OS_CLOUD with clouds.yaml, or
# the OS_* variables of an openrc file. scalelab never writes or logs them.
provider "openstack" {}

locals {
  prefix         = "${var.cluster_name}-scalelab"
  create_network = var.existing_network == null
  network_id     = local.create_network ? openstack_networking_network_v2.cluster[0].id : data.openstack_networking_network_v2.existing[0].id
  subnet_id      = local.create_network ? openstack_networking_subnet_v2.cluster[0].id : data.openstack_networking_subnet_v2.existing[0].id
  subnet_cidr    = local.create_network ? var.subnet_cidr : data.openstack_networking_subnet_v2.existing[0].cidr
  names          = [for i in range(var.nodes) : format("%s-n%d", var.cluster_name, i)]
}

data "openstack_networking_network_v2" "external" {
  name     = var.external_network_name
  external = true
}

data "openstack_images_image_v2" "node" {
  name        = var.image_name
  most_recent = true
}

resource "openstack_compute_keypair_v2" "cluster" {
  name       = local.prefix
  public_key = var.ssh_public_key
}

# ---------------------------------------------------------------- network

resource "openstack_networking_network_v2" "cluster" {
  count          = local.create_network ? 1 : 0
  name           = local.prefix
  admin_state_up = true
}

resource "openstack_networking_subnet_v2" "cluster" {
  count           = local.create_network ? 1 : 0
  name            = local.prefix
  network_id      = openstack_networking_network_v2.cluster[0].id
  cidr            = var.subnet_cidr
  ip_version      = 4
  dns_nameservers = var.dns_nameservers
}

resource "openstack_networking_router_v2" "cluster" {
  count               = local.create_network ? 1 : 0
  name                = local.prefix
  admin_state_up      = true
  external_network_id = data.openstack_networking_network_v2.external.id
}

resource "openstack_networking_router_interface_v2" "cluster" {
  count     = local.create_network ? 1 : 0
  router_id = openstack_networking_router_v2.cluster[0].id
  subnet_id = openstack_networking_subnet_v2.cluster[0].id
}

data "openstack_networking_network_v2" "existing" {
  count = local.create_network ? 0 : 1
  name  = var.existing_network.network_name
}

data "openstack_networking_subnet_v2" "existing" {
  count      = local.create_network ? 0 : 1
  name       = var.existing_network.subnet_name
  network_id = data.openstack_networking_network_v2.existing[0].id
}

# ---------------------------------------------------------------- security group

resource "openstack_networking_secgroup_v2" "cluster" {
  name                 = local.prefix
  description          = "scalelab ${var.cluster_name}: SSH from the operator, TCP between the cluster's own nodes"
  delete_default_rules = true
}

resource "openstack_networking_secgroup_rule_v2" "ssh_from_operator" {
  security_group_id = openstack_networking_secgroup_v2.cluster.id
  description       = "SSH from the operator only"
  direction         = "ingress"
  ethertype         = "IPv4"
  protocol          = "tcp"
  port_range_min    = 22
  port_range_max    = 22
  remote_ip_prefix  = var.operator_cidr
}

# Members of the cluster's own group only: with existing_network the subnet is shared, and
# other tenants must not reach the unauthenticated Gloo/torchrun ports. JupyterLab has no
# rule at all: it listens on the head node's loopback, reached through an SSH tunnel (README).
resource "openstack_networking_secgroup_rule_v2" "cluster_internal" {
  security_group_id = openstack_networking_secgroup_v2.cluster.id
  description       = "TCP between the cluster's own nodes (NCCL, Gloo, rendezvous, NFS, SSH)"
  direction         = "ingress"
  ethertype         = "IPv4"
  protocol          = "tcp"
  remote_group_id   = openstack_networking_secgroup_v2.cluster.id
}

resource "openstack_networking_secgroup_rule_v2" "egress" {
  security_group_id = openstack_networking_secgroup_v2.cluster.id
  description       = "Outbound, for package installs (the default egress rules were deleted)"
  direction         = "egress"
  ethertype         = "IPv4"
  remote_ip_prefix  = "0.0.0.0/0"
}

# ---------------------------------------------------------------- instances

resource "openstack_networking_port_v2" "node" {
  count              = var.nodes
  name               = local.names[count.index]
  network_id         = local.network_id
  admin_state_up     = true
  security_group_ids = [openstack_networking_secgroup_v2.cluster.id]

  fixed_ip {
    subnet_id = local.subnet_id
  }

  binding {
    vnic_type = var.baremetal ? "baremetal" : "normal"
  }
}

resource "openstack_compute_instance_v2" "node" {
  count             = var.nodes
  name              = local.names[count.index]
  flavor_name       = count.index == 0 ? coalesce(var.head_flavor_name, var.flavor_name) : var.flavor_name
  image_id          = var.boot_volume_size_gb == null ? data.openstack_images_image_v2.node.id : null
  key_pair          = openstack_compute_keypair_v2.cluster.name
  availability_zone = var.availability_zone
  config_drive      = var.baremetal ? true : null

  metadata = {
    scalelab_cluster = var.cluster_name
    scalelab_role    = count.index == 0 ? "head" : "worker"
  }

  network {
    port = openstack_networking_port_v2.node[count.index].id
  }

  dynamic "block_device" {
    for_each = var.boot_volume_size_gb == null ? [] : [var.boot_volume_size_gb]
    content {
      uuid                  = data.openstack_images_image_v2.node.id
      source_type           = "image"
      destination_type      = "volume"
      volume_size           = block_device.value
      boot_index            = 0
      delete_on_termination = true
    }
  }

  depends_on = [openstack_networking_router_interface_v2.cluster]
}

# ---------------------------------------------------------------- floating IP (head only)

resource "openstack_networking_floatingip_v2" "head" {
  pool        = var.external_network_name
  description = "scalelab ${var.cluster_name} head node"
}

resource "openstack_networking_floatingip_associate_v2" "head" {
  floating_ip = openstack_networking_floatingip_v2.head.address
  port_id     = openstack_networking_port_v2.node[0].id

  depends_on = [openstack_compute_instance_v2.node, openstack_networking_router_interface_v2.cluster]
}

# Terraform 1.0 has no lifecycle preconditions: the check fails the plan with its message
# (tobool of a sentence), as terraform/static does, before anything is created.
locals {
  check_boot_volume = !(var.baremetal && var.boot_volume_size_gb != null) ? true : tobool("Bare-metal instances boot from their local disk: leave boot_volume_size_gb null when baremetal is true.")
}
