# A GPU workspace template that cooperates with coder-gpu-reclaimer. Same shape as Coder's
# official Kubernetes template (Deployment coder-<workspace id>, com.coder.* labels, home PVC,
# wait_for_rollout = false), plus: an nvidia.com/gpu limit, an explicit agent connection
# timeout, and agent metadata that shows the reclaimer's verdict in the dashboard.
terraform {
  required_providers {
    coder = {
      source = "coder/coder"
    }
    kubernetes = {
      source = "hashicorp/kubernetes"
    }
  }
}

provider "coder" {}

variable "use_kubeconfig" {
  type        = bool
  description = "Use the Coder host's ~/.kube/config (true), or the in-cluster ServiceAccount (false)."
  default     = false
}

variable "namespace" {
  type        = string
  description = "Namespace for workspaces (it must exist)."
}

variable "reclaimer_url" {
  type        = string
  description = "coder-gpu-reclaimer's status API as seen from workspace pods (the Terraform module's status_url output)."
  default     = "http://coder-gpu-reclaimer.coder-gpu-reclaimer.svc:9464"
}

variable "image" {
  type        = string
  description = "Workspace image with CUDA user space and curl."
  default     = "nvidia/cuda:12.4.1-base-ubuntu22.04"
}

provider "kubernetes" {
  config_path = var.use_kubeconfig ? "~/.kube/config" : null
}

data "coder_parameter" "gpus" {
  name         = "gpus"
  display_name = "GPUs"
  description  = "GPUs for this workspace. An idle GPU is given back after a while (see the GPU status line)."
  type         = "number"
  default      = "1"
  mutable      = true
  validation {
    min = 1
    max = 8
  }
}

data "coder_parameter" "cpu" {
  name         = "cpu"
  display_name = "CPU cores"
  type         = "number"
  default      = "4"
  mutable      = true
  validation {
    min = 1
    max = 32
  }
}

data "coder_parameter" "memory" {
  name         = "memory"
  display_name = "Memory (GiB)"
  type         = "number"
  default      = "16"
  mutable      = true
  validation {
    min = 2
    max = 256
  }
}

data "coder_parameter" "home_disk_size" {
  name         = "home_disk_size"
  display_name = "Home disk (GiB)"
  description  = "Home survives a stop; /tmp does not."
  type         = "number"
  default      = "50"
  mutable      = false
  validation {
    min = 1
    max = 2000
  }
}

data "coder_workspace" "me" {}
data "coder_workspace_owner" "me" {}

locals {
  labels = {
    "app.kubernetes.io/name"     = "coder-workspace"
    "app.kubernetes.io/instance" = "coder-workspace-${data.coder_workspace.me.id}"
    "app.kubernetes.io/part-of"  = "coder"
    "com.coder.resource"         = "true"
    "com.coder.workspace.id"     = data.coder_workspace.me.id
    "com.coder.workspace.name"   = data.coder_workspace.me.name
    "com.coder.user.id"          = data.coder_workspace_owner.me.id
    "com.coder.user.username"    = data.coder_workspace_owner.me.name
  }
}

resource "coder_agent" "main" {
  os   = "linux"
  arch = "amd64"
  # A pod that waits for a GPU never connects: after this the agent reads `timeout`, and the
  # reclaimer counts the workspace as waiting (contention).
  connection_timeout = 300
  startup_script     = <<-EOT
    set -e
    command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "no GPU visible"
  EOT

  metadata {
    display_name = "GPU status"
    key          = "0_gpu_reclaimer"
    # e.g. "warn (idle): GPU idle 22m, no connection for 20m; stops in 8m unless it becomes active",
    # or, with extend_while_busy, "keep (gpu-active): GPU is computing; kept running by GPU work until 2026-12-02 03:00 UTC"
    script   = "curl -fsS --max-time 3 '${var.reclaimer_url}/api/v1/workspaces/${data.coder_workspace.me.id}?format=text' || echo 'reclaimer not reachable'"
    interval = 60
    timeout  = 5
  }

  metadata {
    display_name = "GPU utilization"
    key          = "1_gpu_util"
    script       = "nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null | paste -sd ';' || echo n/a"
    interval     = 30
    timeout      = 5
  }

  metadata {
    display_name = "Home disk"
    key          = "2_home_disk"
    script       = "coder stat disk --path $${HOME}"
    interval     = 60
    timeout      = 1
  }
}

resource "kubernetes_persistent_volume_claim_v1" "home" {
  metadata {
    name      = "coder-${data.coder_workspace.me.id}-home"
    namespace = var.namespace
    labels    = merge(local.labels, { "app.kubernetes.io/name" = "coder-pvc", "app.kubernetes.io/instance" = "coder-pvc-${data.coder_workspace.me.id}" })
  }
  wait_until_bound = false
  spec {
    access_modes = ["ReadWriteOnce"]
    resources {
      requests = {
        storage = "${data.coder_parameter.home_disk_size.value}Gi"
      }
    }
  }
}

resource "kubernetes_deployment_v1" "main" {
  count = data.coder_workspace.me.start_count
  # The build succeeds even while the pod waits for a GPU (Pending): the reclaimer reads that
  # as "waiting" from the agent that never connects.
  wait_for_rollout = false
  depends_on       = [kubernetes_persistent_volume_claim_v1.home]
  metadata {
    name      = "coder-${data.coder_workspace.me.id}"
    namespace = var.namespace
    labels    = local.labels
    annotations = {
      "com.coder.user.email" = data.coder_workspace_owner.me.email
    }
  }
  spec {
    replicas = 1
    selector {
      match_labels = local.labels
    }
    strategy {
      type = "Recreate"
    }
    template {
      metadata {
        labels = local.labels
      }
      spec {
        security_context {
          run_as_user     = 1000
          fs_group        = 1000
          run_as_non_root = true
        }
        container {
          name    = "dev"
          image   = var.image
          command = ["sh", "-c", coder_agent.main.init_script]
          env {
            name  = "CODER_AGENT_TOKEN"
            value = coder_agent.main.token
          }
          resources {
            requests = {
              cpu    = "500m"
              memory = "1Gi"
            }
            # dcgm-exporter maps a GPU to this pod only when it is requested in limits.
            limits = {
              cpu              = data.coder_parameter.cpu.value
              memory           = "${data.coder_parameter.memory.value}Gi"
              "nvidia.com/gpu" = data.coder_parameter.gpus.value
            }
          }
          volume_mount {
            mount_path = "/home/coder"
            name       = "home"
          }
        }
        volume {
          name = "home"
          persistent_volume_claim {
            claim_name = kubernetes_persistent_volume_claim_v1.home.metadata[0].name
          }
        }
        toleration {
          key      = "nvidia.com/gpu"
          operator = "Exists"
          effect   = "NoSchedule"
        }
      }
    }
  }
}
