# Set by scalelab on every run (-var); do not put these in the var-file.

variable "cluster_name" {
  type        = string
  description = "Name of the cluster (set by scalelab from --cluster). Hosts without a name are called <cluster_name>-n<index>."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}$", var.cluster_name))
    error_message = "The cluster_name must be 1-31 lowercase letters, digits and dashes, starting with a letter."
  }
}

variable "nodes" {
  type        = number
  description = "How many of the listed hosts make up the cluster (set by scalelab from --nodes): the head plus the first nodes - 1 workers in list order."

  validation {
    # tonumber: Terraform 1.0 validates a -var value before converting it to the declared type.
    condition     = tonumber(var.nodes) >= 1 && floor(tonumber(var.nodes)) == tonumber(var.nodes)
    error_message = "The nodes count must be a whole number of at least 1."
  }
}

# Set in the var-file.

variable "hosts" {
  type        = list(map(string))
  description = "Already-allocated machines, one map each: address (required: where the controller's SSH goes), role (head or worker; default worker, exactly one head), name (default <cluster_name>-n<index>, until scalelab configure names the node after its hostname), private_address (cluster-network address the ranks use; default address), gpus (whole number; default 0), ssh_user (default var.ssh_user)."

  validation {
    condition     = length(var.hosts) >= 1
    error_message = "List at least one host in hosts."
  }

  validation {
    condition = alltrue([
      for h in var.hosts : length(setsubtract(keys(h), ["name", "address", "private_address", "role", "gpus", "ssh_user"])) == 0
    ])
    error_message = "A host takes only the keys name, address, private_address, role, gpus and ssh_user."
  }

  validation {
    condition     = alltrue([for h in var.hosts : length(trimspace(lookup(h, "address", ""))) > 0])
    error_message = "Every host needs an address: where the controller reaches it over SSH."
  }

  validation {
    condition     = length(distinct([for h in var.hosts : lookup(h, "address", "")])) == length(var.hosts)
    error_message = "Host addresses must be unique: two hosts in hosts share an address."
  }

  validation {
    condition = length(distinct([
      for h in var.hosts : lookup(h, "private_address", lookup(h, "address", ""))
    ])) == length(var.hosts)
    error_message = "Private addresses must be unique: two hosts in hosts share a private_address."
  }

  validation {
    condition     = alltrue([for h in var.hosts : contains(["head", "worker"], lookup(h, "role", "worker"))])
    error_message = "A host's role must be head or worker."
  }

  validation {
    condition     = length([for h in var.hosts : h if lookup(h, "role", "worker") == "head"]) == 1
    error_message = "Exactly one host in hosts must have role head."
  }

  validation {
    condition     = alltrue([for h in var.hosts : can(regex("^[0-9]+$", lookup(h, "gpus", "0")))])
    error_message = "A host's gpus must be a whole number of at least 0."
  }

  validation {
    condition     = alltrue([for h in var.hosts : can(regex("^[a-z][a-z0-9-]{0,62}$", lookup(h, "name", "n")))])
    error_message = "A host's name must be a hostname: lowercase letters, digits and dashes, starting with a letter."
  }

  validation {
    condition = length(distinct([
      for i, h in var.hosts : lookup(h, "name", "#${i}")
    ])) == length(var.hosts)
    error_message = "Host names must be unique: two hosts in hosts share a name."
  }
}

variable "ssh_user" {
  type        = string
  description = "SSH user on every host that does not set its own ssh_user."

  validation {
    condition     = can(regex("^[a-z_][a-z0-9_.-]{0,31}$", var.ssh_user))
    error_message = "The ssh_user must be a valid login name."
  }
}

variable "ssh_private_key_file" {
  type        = string
  description = "Read by scalelab, not by Terraform: path of the private key (on the controller) whose public half every host already trusts. Relative paths are relative to the var-file; it must not be readable by others (chmod 600)."
}

variable "bastion_ip" {
  type        = string
  description = "Address of a jump host the controller's SSH goes through (as ssh_user) to reach the hosts, or null to reach them directly."
  default     = null
}

variable "max_nodes" {
  type        = number
  description = "Quota: scalelab refuses --nodes above this before Terraform runs. Null means the host list is the only limit."
  default     = null

  validation {
    condition     = tonumber(coalesce(var.max_nodes, 1)) >= 1
    error_message = "The max_nodes quota must be null or at least 1."
  }
}
