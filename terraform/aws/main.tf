# Credentials come only from the provider's standard sources (AWS_PROFILE, AWS_ACCESS_KEY_ID
# and friends, ~/.aws/config, instance roles). scalelab never writes or logs them.
provider "aws" {
  region = var.region

  default_tags {
    tags = merge(var.tags, { scalelab_cluster = var.cluster_name })
  }
}

locals {
  prefix = "${var.cluster_name}-scalelab"
  names  = [for i in range(var.nodes) : format("%s-n%d", var.cluster_name, i)]
  gpus   = sum(concat([0], [for g in data.aws_ec2_instance_type.node.gpus : g.count]))
  zones  = sort(data.aws_ec2_instance_type_offerings.node.locations)
  zone   = var.availability_zone != null ? var.availability_zone : try(local.zones[0], null)
}

data "aws_ec2_instance_type" "node" {
  instance_type = var.instance_type
}

data "aws_ec2_instance_type_offerings" "node" {
  location_type = "availability-zone"

  filter {
    name   = "instance-type"
    values = [var.instance_type]
  }
}

data "aws_ami" "node" {
  most_recent = true
  owners      = [var.ami_owner]

  filter {
    name   = var.ami_id == null ? "name" : "image-id"
    values = [var.ami_id == null ? var.ami_name : var.ami_id]
  }

  filter {
    name   = "architecture"
    values = data.aws_ec2_instance_type.node.supported_architectures
  }
}

# ---------------------------------------------------------------- network

resource "aws_vpc" "cluster" {
  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = { Name = local.prefix }
}

resource "aws_internet_gateway" "cluster" {
  vpc_id = aws_vpc.cluster.id
  tags   = { Name = local.prefix }
}

resource "aws_subnet" "cluster" {
  vpc_id            = aws_vpc.cluster.id
  cidr_block        = var.subnet_cidr
  availability_zone = local.zone
  tags              = { Name = local.prefix }
}

resource "aws_route_table" "cluster" {
  vpc_id = aws_vpc.cluster.id
  tags   = { Name = local.prefix }

  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.cluster.id
  }
}

resource "aws_route_table_association" "cluster" {
  subnet_id      = aws_subnet.cluster.id
  route_table_id = aws_route_table.cluster.id
}

# ---------------------------------------------------------------- security group

# No JupyterLab port is open to anyone: it listens on the head node's loopback and is reached
# through an SSH tunnel (README). The description still names it because AWS cannot change a
# group's description in place: a new one would replace the group under running instances.
resource "aws_security_group" "cluster" {
  name        = local.prefix
  description = "scalelab ${var.cluster_name}: SSH and JupyterLab from the operator, everything within the cluster subnet"
  vpc_id      = aws_vpc.cluster.id
  tags        = { Name = local.prefix }
}

resource "aws_vpc_security_group_ingress_rule" "ssh_from_operator" {
  security_group_id = aws_security_group.cluster.id
  description       = "SSH from the operator only"
  cidr_ipv4         = var.operator_cidr
  ip_protocol       = "tcp"
  from_port         = 22
  to_port           = 22
}

# TCP between the cluster's own nodes: SSH, the torchrun and Horovod rendezvous, and the ports
# NCCL's and Gloo's sockets, NFS, Slurm and iperf3 listen on (NCCL and Gloo take theirs from
# the OS); members of this group only, whatever else is launched into the subnet. EFA's own
# all-protocol rule is below.
resource "aws_vpc_security_group_ingress_rule" "cluster_internal" {
  security_group_id            = aws_security_group.cluster.id
  description                  = "TCP between the cluster's own nodes (NCCL, Gloo, rendezvous, NFS, SSH)"
  referenced_security_group_id = aws_security_group.cluster.id
  ip_protocol                  = "tcp"
  from_port                    = 0
  to_port                      = 65535
}

# EFA's OS-bypass traffic needs a group that allows all traffic to and from itself.
resource "aws_vpc_security_group_ingress_rule" "efa_self" {
  count                        = var.enable_efa ? 1 : 0
  security_group_id            = aws_security_group.cluster.id
  description                  = "EFA: all traffic from members of this group"
  referenced_security_group_id = aws_security_group.cluster.id
  ip_protocol                  = "-1"
}

resource "aws_vpc_security_group_egress_rule" "efa_self" {
  count                        = var.enable_efa ? 1 : 0
  security_group_id            = aws_security_group.cluster.id
  description                  = "EFA: all traffic to members of this group"
  referenced_security_group_id = aws_security_group.cluster.id
  ip_protocol                  = "-1"
}

resource "aws_vpc_security_group_egress_rule" "all" {
  security_group_id = aws_security_group.cluster.id
  description       = "Outbound, for package installs"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"
}

# ---------------------------------------------------------------- instances

resource "aws_key_pair" "cluster" {
  key_name   = local.prefix
  public_key = var.ssh_public_key
}

resource "aws_placement_group" "cluster" {
  name     = local.prefix
  strategy = "cluster"
}

resource "aws_launch_template" "node" {
  name_prefix   = "${local.prefix}-"
  image_id      = data.aws_ami.node.id
  instance_type = var.instance_type
  key_name      = aws_key_pair.cluster.key_name

  network_interfaces {
    device_index                = 0
    network_card_index          = 0
    associate_public_ip_address = true
    delete_on_termination       = true
    interface_type              = var.enable_efa ? "efa" : null
    subnet_id                   = aws_subnet.cluster.id
    security_groups             = [aws_security_group.cluster.id]
  }

  placement {
    group_name = aws_placement_group.cluster.name
  }

  block_device_mappings {
    device_name = data.aws_ami.node.root_device_name

    ebs {
      volume_size           = var.root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  metadata_options {
    http_endpoint = "enabled"
    http_tokens   = "required"
  }
}

resource "aws_instance" "node" {
  count = var.nodes

  launch_template {
    id      = aws_launch_template.node.id
    version = aws_launch_template.node.latest_version
  }

  tags = {
    Name          = local.names[count.index]
    scalelab_role = count.index == 0 ? "head" : "worker"
  }

  lifecycle {
    # A newer AMI or template must never replace running nodes when the cluster is resized.
    ignore_changes = [launch_template]

  }

  depends_on = [
    aws_route_table_association.cluster,
    aws_vpc_security_group_ingress_rule.cluster_internal,
    aws_vpc_security_group_egress_rule.all,
  ]
}

# Terraform 1.0 has no lifecycle preconditions: each check fails the plan with its message
# (tobool of a sentence), as terraform/static does, before anything is created.
locals {
  check_zone = local.zone != null ? true : tobool("The instance_type is not offered in any availability zone of this region; pick another region or instance type.")
  check_gpu  = local.gpus > 0 ? true : tobool("The instance_type has no GPU; pick a GPU type such as g5.xlarge, p3.2xlarge, p4d.24xlarge or p5.48xlarge.")
  check_efa  = !var.enable_efa || data.aws_ec2_instance_type.node.efa_supported ? true : tobool("The instance_type does not support EFA; set enable_efa = false or pick an EFA type such as p4d.24xlarge or p5.48xlarge.")
}
