# invoke provision --target openstack --nodes 2 --var-file terraform/openstack/examples/minimal/scalelab.tfvars
# Credentials come from OS_CLOUD (clouds.yaml) or your openrc, never from here.
# Names below are placeholders: list yours with `openstack network list --external`,
# `openstack image list` and `openstack flavor list`.

operator_cidr         = "203.0.113.7/32" # replace with your own public address
external_network_name = "public"
image_name            = "ubuntu-22.04"
flavor_name           = "g1.a100-1" # a GPU VM flavor; or a bare-metal flavor with baremetal = true
gpus_per_node         = 1
max_nodes             = 4
