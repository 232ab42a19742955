# Set by scalelab on every run (-var); do not put these in the var-file.

variable "cluster_name" {
  type        = string
  description = "Name of the cluster (set by scalelab from --cluster); prefixes every resource name."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}$", var.cluster_name))
    error_message = "The cluster_name must be 1-31 lowercase letters, digits and dashes, starting with a letter."
  }
}

variable "nodes" {
  type        = number
  description = "Number of instances (set by scalelab from --nodes); the first (index 0) is the head node."

  validation {
    condition     = tonumber(var.nodes) >= 1 && floor(tonumber(var.nodes)) == tonumber(var.nodes)
    error_message = "The nodes count must be a whole number of at least 1."
  }
}

variable "ssh_public_key" {
  type        = string
  description = "OpenSSH public key installed for ssh_user on every instance (set by scalelab: the public half of the cluster's generated ed25519 key)."
}

# Set in the var-file.

variable "operator_cidr" {
  type        = string
  description = "IPv4 range the operator works from, e.g. 203.0.113.7/32: the only source allowed to reach SSH on the head node (JupyterLab is reached through an SSH tunnel)."

  validation {
    condition     = can(cidrhost(var.operator_cidr, 0)) && can(regex("^[0-9.]+/(1[6-9]|2[0-9]|3[0-2])$", var.operator_cidr))
    error_message = "The operator_cidr must be an IPv4 CIDR with a prefix of /16 to /32 (your own address or your site's range, never a large part of the internet), e.g. 203.0.113.7/32."
  }
}

variable "external_network_name" {
  type        = string
  description = "Name of the external (provider) network: the router's gateway and the pool of the head node's floating IP."
}

variable "image_name" {
  type        = string
  description = "Glance image to boot, e.g. an Ubuntu 22.04 image (with the NVIDIA driver, or let invoke configure install it)."
}

variable "flavor_name" {
  type        = string
  description = "Nova flavor of every node: a GPU VM flavor (PCI passthrough or vGPU) or a bare-metal (Ironic) flavor."
}

variable "head_flavor_name" {
  type        = string
  description = "Flavor of the head node when it differs from flavor_name; null uses flavor_name."
  default     = null
}

variable "gpus_per_node" {
  type        = number
  description = "GPUs each instance of the flavor has. OpenStack does not report it in a portable way, so say it here."

  validation {
    condition     = tonumber(var.gpus_per_node) >= 0 && floor(tonumber(var.gpus_per_node)) == tonumber(var.gpus_per_node)
    error_message = "The gpus_per_node must be a whole number of at least 0."
  }
}

variable "baremetal" {
  type        = bool
  description = "True when flavor_name is an Ironic bare-metal flavor: ports get vnic_type baremetal and instances a config drive (Ironic nodes often cannot reach the metadata service)."
  default     = false
}

variable "ssh_user" {
  type        = string
  description = "Login user of the image (ubuntu for Ubuntu cloud images)."
  default     = "ubuntu"
}

variable "subnet_cidr" {
  type        = string
  description = "IPv4 range of the cluster subnet created for the cluster; cluster traffic is allowed only within it."
  default     = "10.42.0.0/24"

  validation {
    condition     = can(cidrhost(var.subnet_cidr, 0))
    error_message = "The subnet_cidr must be an IPv4 CIDR such as 10.42.0.0/24."
  }
}

variable "dns_nameservers" {
  type        = list(string)
  description = "DNS servers handed out on the cluster subnet; empty keeps the cloud's default."
  default     = []
}

variable "existing_network" {
  type = object({
    network_name = string
    subnet_name  = string
  })
  description = "Use this existing network and subnet instead of creating one (e.g. the provisioning network a bare-metal cloud requires); null creates network, subnet and router."
  default     = null
}

variable "boot_volume_size_gb" {
  type        = number
  description = "Boot from a Cinder volume of this many GB (for GPU VM flavors with a small root disk); null boots from the flavor's local disk, as bare metal must."
  default     = null
}

variable "availability_zone" {
  type        = string
  description = "Nova availability zone for the instances; null lets the scheduler choose."
  default     = null
}

variable "max_nodes" {
  type        = number
  description = "Quota: scalelab refuses --nodes above this before Terraform runs (a guard against a typo costing GPU hours)."
  default     = 4

  validation {
    condition     = var.max_nodes >= 1
    error_message = "The max_nodes quota must be at least 1."
  }
}
