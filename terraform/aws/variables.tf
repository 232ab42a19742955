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

variable "region" {
  type        = string
  description = "AWS region to create the cluster in, e.g. us-east-1. Credentials come from the standard AWS environment or config, never from here."
}

variable "operator_cidr" {
  type        = string
  description = "IPv4 range the operator works from, e.g. 203.0.113.7/32: the only source allowed to reach SSH (JupyterLab is reached through an SSH tunnel)."

  validation {
    condition     = can(cidrhost(var.operator_cidr, 0)) && can(regex("^[0-9.]+/(1[6-9]|2[0-9]|3[0-2])$", var.operator_cidr))
    error_message = "The operator_cidr must be an IPv4 CIDR with a prefix of /16 to /32 (your own address or your site's range, never a large part of the internet), e.g. 203.0.113.7/32."
  }
}

variable "instance_type" {
  type        = string
  description = "GPU instance type of every node, e.g. g5.xlarge (1 A10G), p3.2xlarge (1 V100), p4d.24xlarge (8 A100, EFA), p5.48xlarge (8 H100, EFA)."
  default     = "g5.xlarge"
}

variable "availability_zone" {
  type        = string
  description = "Availability zone of the subnet and the placement group; null picks the first zone (in name order) that offers instance_type. GPU capacity differs by zone: set it when launches fail for lack of capacity."
  default     = null
}

variable "ami_id" {
  type        = string
  description = "AMI to boot; null picks the newest AMI owned by ami_owner whose name matches ami_name. Pin it for sweeps that must be repeatable."
  default     = null
}

variable "ami_name" {
  type        = string
  description = "Name pattern of the AMI looked up when ami_id is null (the AWS Deep Learning Base AMI has the NVIDIA driver, CUDA and the EFA software)."
  default     = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"
}

variable "ami_owner" {
  type        = string
  description = "Owner of the AMI: an account ID, self, or an alias such as amazon."
  default     = "amazon"
}

variable "ssh_user" {
  type        = string
  description = "Login user of the AMI (ubuntu for Ubuntu-based AMIs)."
  default     = "ubuntu"
}

variable "root_volume_gb" {
  type        = number
  description = "Size of each node's gp3 root volume in GiB (the Deep Learning AMIs need at least 100)."
  default     = 200

  validation {
    condition     = var.root_volume_gb >= 8
    error_message = "The root_volume_gb must be at least 8."
  }
}

variable "enable_efa" {
  type        = bool
  description = "Give each node an Elastic Fabric Adapter (EFA with ENA) as its network interface, for instance types that support it (p4d, p5, ...). One interface per node: the extra network cards of p4d/p5 are left unused."
  default     = false
}

variable "vpc_cidr" {
  type        = string
  description = "IPv4 range of the VPC created for the cluster."
  default     = "10.43.0.0/16"

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0))
    error_message = "The vpc_cidr must be an IPv4 CIDR such as 10.43.0.0/16."
  }
}

variable "subnet_cidr" {
  type        = string
  description = "IPv4 range of the cluster subnet, inside vpc_cidr; cluster traffic is allowed only within it."
  default     = "10.43.1.0/24"

  validation {
    condition     = can(cidrhost(var.subnet_cidr, 0))
    error_message = "The subnet_cidr must be an IPv4 CIDR such as 10.43.1.0/24."
  }
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for every resource (e.g. owner, cost centre); scalelab_cluster is always added."
  default     = {}
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
