# invoke provision --target aws --nodes 2 --var-file terraform/aws/examples/minimal/scalelab.tfvars
# Credentials come from your AWS environment or config (AWS_PROFILE, ...), never from here.

region        = "us-east-1"
operator_cidr = "203.0.113.7/32" # replace with your own public address: curl -s https://checkip.amazonaws.com
instance_type = "g5.xlarge"      # 1 x A10G, about 1 USD/hour on demand in us-east-1 (2026)
max_nodes     = 4                # --nodes above this is refused before Terraform runs
