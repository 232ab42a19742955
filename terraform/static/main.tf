locals {
  # Every host with its defaults filled in, in list order.
  hosts = [
    for i, h in var.hosts : {
      name            = lookup(h, "name", format("%s-n%d", var.cluster_name, i))
      named           = lookup(h, "name", "") != ""
      address         = trimspace(h.address)
      private_address = trimspace(lookup(h, "private_address", h.address))
      role            = lookup(h, "role", "worker")
      gpus            = tonumber(lookup(h, "gpus", "0"))
      ssh_user        = lookup(h, "ssh_user", var.ssh_user)
    }
  ]

  head    = [for h in local.hosts : h if h.role == "head"]
  workers = [for h in local.hosts : h if h.role == "worker"]

  # Terraform 1.0 cannot compare two variables in a validation block, so these checks fail
  # the plan with their message instead. scalelab checks the same before Terraform runs.
  check_enough_hosts = var.nodes <= length(var.hosts) ? true : tobool(
    "nodes is larger than the number of hosts listed; list more hosts or ask for fewer nodes"
  )
  check_quota = var.nodes <= coalesce(var.max_nodes, var.nodes) ? true : tobool(
    "nodes is beyond the max_nodes quota; ask for fewer nodes or raise max_nodes"
  )
  check_unique_names = length(distinct([for h in local.hosts : h.name])) == length(local.hosts) ? true : tobool(
    "a generated host name clashes with a given one; name every host explicitly"
  )

  # The head first, then the first nodes - 1 workers.
  selected = concat(local.head, slice(local.workers, 0, min(length(local.workers), var.nodes - 1)))
}
