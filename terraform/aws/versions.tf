terraform {
  # 1.3: lifecycle preconditions are used below (1.2 added them; 1.3 is the oldest tested).
  required_version = ">= 1.3.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0.0"
    }
  }
}
