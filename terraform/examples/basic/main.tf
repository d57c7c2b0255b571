# Deploys coder-gpu-reclaimer beside Coder, in observe mode first. Switch enforce to true once
# `kubectl logs` and /api/v1/workspaces show the decisions you expect.
terraform {
  required_providers {
    kubernetes = {
      source = "hashicorp/kubernetes"
    }
  }
}

provider "kubernetes" {
  config_path = "~/.kube/config"
}

variable "coder_session_token" {
  type      = string
  sensitive = true
}

module "gpu_reclaimer" {
  source = "../.."

  image               = "registry.example.com/platform/coder-gpu-reclaimer:0.1.0"
  coder_url           = "https://coder.example.com"
  coder_session_token = var.coder_session_token
  dcgm_exporter_urls  = ["dns+http://nvidia-dcgm-exporter.gpu-operator.svc.cluster.local:9400/metrics"]
  workspace_namespace = "coder" # where Coder runs the workspace pods: no other pod speaks for one
  enforce             = false
  idle_after          = "45m"
  grace               = "10m"
  policy_toml         = file("${path.module}/../../../docs/examples/team-policy.toml")
  service_monitor     = true
  service_monitor_labels = {
    release = "kube-prometheus-stack"
  }
}

output "status_url" {
  value = module.gpu_reclaimer.status_url
}
