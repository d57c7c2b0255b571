locals {
  name = "coder-gpu-reclaimer"
  labels = merge({
    "app.kubernetes.io/name"       = local.name
    "app.kubernetes.io/managed-by" = "terraform"
  }, var.labels)
  token_secret = var.coder_session_token_secret != null ? var.coder_session_token_secret : "${local.name}-token"
  audit_path   = "/var/log/${local.name}/audit.jsonl"
  journal_path = "/var/log/${local.name}/history.jsonl"
  audit_pvc    = var.audit_log && var.audit_log_persistent
  secrets_dir  = "/var/run/secrets/${local.name}"
  # Secrets are files, never arguments or env vars: a mounted Secret is updated in place when it
  # is rotated (the service re-reads the token file), and the pod spec shows no value.
  has_webhook      = var.notify_webhook != null
  # The fleet routes always want a status token: the one given, or a generated one.
  status_token = coalesce(var.status_token, one(random_password.status_token[*].result))
  has_ca           = var.ca_pem != null
  # The optional files, by volume name: where each is mounted and the Secret or ConfigMap behind it.
  optional_files = {
    for name, f in {
      notify         = { enabled = local.has_webhook, path = "${local.secrets_dir}/notify", secret = "${local.name}-notify", config_map = null }
      "status-token" = { enabled = true, path = "${local.secrets_dir}/status", secret = "${local.name}-status-token", config_map = null }
      ca             = { enabled = local.has_ca, path = "/etc/${local.name}-ca", secret = null, config_map = "${local.name}-ca" }
    } : name => f if f.enabled
  }

  # The config file: the policy, with the Prometheus selector and gpu_templates first (top-level
  # keys precede tables).
  selector_toml      = var.prometheus_url != null && var.prometheus_selector != null ? format("prometheus_selector = %q\n", var.prometheus_selector) : ""
  gpu_templates_toml = length(var.gpu_templates) > 0 ? format("gpu_templates = [%s]\n", join(", ", [for t in var.gpu_templates : format("%q", t)])) : ""
  config_toml        = "${local.selector_toml}${local.gpu_templates_toml}${var.policy_toml}"

  # One to one onto the CLI of `coder-gpu-reclaimer run` (tests check every flag against it).
  args = concat(
    ["run",
      "--coder-url", var.coder_url,
      "--interval", var.interval,
      "--idle-after", var.idle_after,
      "--grace", var.grace,
      "--reclaim-when", var.reclaim_when,
      "--listen", "0.0.0.0:${var.listen_port}",
      "--health-listen", "0.0.0.0:${var.health_port}",
      "--log-format", var.log_format,
    "--config", "/etc/${local.name}/policy.toml"],
    var.prometheus_url != null ? ["--prometheus-url", var.prometheus_url, "--prometheus-job", var.prometheus_job] : flatten([for u in var.dcgm_exporter_urls : ["--dcgm-exporter", u]]),
    # Only pods in this namespace speak for a workspace.
    var.workspace_namespace != null ? ["--namespace", var.workspace_namespace] : [],
    var.proxy_url != null ? ["--proxy-url", var.proxy_url] : [],
    var.enforce ? ["--enforce"] : [],
    ["--token-file", "${local.secrets_dir}/token/token"],
    var.audit_log ? ["--audit-log", local.audit_path] : [],
    var.history_journal ? ["--history-journal", local.journal_path] : [],
    local.has_webhook ? ["--notify-webhook-file", "${local.secrets_dir}/notify/webhook"] : [],
    ["--status-token-file", "${local.secrets_dir}/status/token"],
    local.has_ca ? ["--ca-file", "/etc/${local.name}-ca/ca.pem"] : [],
  )
}

resource "kubernetes_namespace_v1" "this" {
  count = var.create_namespace ? 1 : 0
  metadata {
    name   = var.namespace
    labels = local.labels
  }
}

resource "kubernetes_secret_v1" "token" {
  count = var.coder_session_token != null ? 1 : 0
  metadata {
    name      = local.token_secret
    namespace = var.namespace
    labels    = local.labels
  }
  data       = { token = var.coder_session_token }
  depends_on = [kubernetes_namespace_v1.this]
}

resource "kubernetes_secret_v1" "notify" {
  count = local.has_webhook ? 1 : 0
  metadata {
    name      = "${local.name}-notify"
    namespace = var.namespace
    labels    = local.labels
  }
  data       = { webhook = var.notify_webhook }
  depends_on = [kubernetes_namespace_v1.this]
}

# The status token when none is given: the fleet routes are never open by default.
resource "random_password" "status_token" {
  count   = var.status_token == null ? 1 : 0
  length  = 40
  special = false
}

resource "kubernetes_secret_v1" "status_token" {
  metadata {
    name      = "${local.name}-status-token"
    namespace = var.namespace
    labels    = local.labels
  }
  data       = { token = local.status_token }
  depends_on = [kubernetes_namespace_v1.this]
}

resource "kubernetes_config_map_v1" "ca" {
  count = local.has_ca ? 1 : 0
  metadata {
    name      = "${local.name}-ca"
    namespace = var.namespace
    labels    = local.labels
  }
  data       = { "ca.pem" = var.ca_pem }
  depends_on = [kubernetes_namespace_v1.this]
}

resource "kubernetes_config_map_v1" "policy" {
  metadata {
    name      = "${local.name}-policy"
    namespace = var.namespace
    labels    = local.labels
  }
  data       = { "policy.toml" = local.config_toml }
  depends_on = [kubernetes_namespace_v1.this]
}

# The audit trail outlives rollouts (an emptyDir is deleted at each). ReadWriteOnce is enough: one
# replica, and Recreate never runs two pods at once.
resource "kubernetes_persistent_volume_claim_v1" "audit" {
  count = local.audit_pvc ? 1 : 0
  metadata {
    name      = "${local.name}-audit"
    namespace = var.namespace
    labels    = local.labels
  }
  spec {
    access_modes       = ["ReadWriteOnce"]
    storage_class_name = var.audit_log_storage_class
    resources {
      requests = { storage = var.audit_log_storage_size }
    }
  }
  # A WaitForFirstConsumer class binds only once the pod is scheduled: waiting here would deadlock.
  wait_until_bound = false
  depends_on       = [kubernetes_namespace_v1.this]
}

resource "kubernetes_deployment_v1" "this" {
  metadata {
    name      = local.name
    namespace = var.namespace
    labels    = local.labels
  }
  spec {
    # One replica: two would each send stops. Recreate: never two at once during a rollout.
    replicas = 1
    strategy {
      type = "Recreate"
    }
    selector {
      match_labels = { "app.kubernetes.io/name" = local.name }
    }
    template {
      metadata {
        labels = local.labels
        annotations = {
          "checksum/policy" = sha256(local.config_toml)
          # How Coder's observability chart (and any annotation-based scrape config) finds /metrics.
          "prometheus.io/scrape" = "true"
          "prometheus.io/port"   = tostring(var.health_port)
          "prometheus.io/path"   = "/metrics"
        }
      }
      spec {
        automount_service_account_token = false
        security_context {
          run_as_non_root = true
          run_as_user     = 65532
          run_as_group    = 65532
          # The volumes' group: the audit claim is writable, the 0400 Secret files readable (0440).
          fs_group = 65532
          seccomp_profile {
            type = "RuntimeDefault"
          }
        }
        container {
          name  = local.name
          image = var.image
          args  = local.args
          port {
            name           = "http"
            container_port = var.listen_port
          }
          port {
            name           = "health"
            container_port = var.health_port
          }
          liveness_probe {
            http_get {
              path = "/healthz"
              port = "health"
            }
            period_seconds = 20
          }
          readiness_probe {
            http_get {
              path = "/readyz"
              port = "health"
            }
            period_seconds = 15
          }
          resources {
            requests = var.resources.requests
            limits   = var.resources.limits
          }
          security_context {
            read_only_root_filesystem  = true
            allow_privilege_escalation = false
            capabilities {
              drop = ["ALL"]
            }
          }
          volume_mount {
            name       = "policy"
            mount_path = "/etc/${local.name}"
            read_only  = true
          }
          volume_mount {
            name       = "audit"
            mount_path = "/var/log/${local.name}"
          }
          volume_mount {
            name       = "token"
            mount_path = "${local.secrets_dir}/token"
            read_only  = true
          }
          dynamic "volume_mount" {
            for_each = local.optional_files
            content {
              name       = volume_mount.key
              mount_path = volume_mount.value.path
              read_only  = true
            }
          }
        }
        volume {
          name = "policy"
          config_map {
            name = kubernetes_config_map_v1.policy.metadata[0].name
          }
        }
        volume {
          name = "audit"
          dynamic "persistent_volume_claim" {
            for_each = local.audit_pvc ? [1] : []
            content {
              claim_name = kubernetes_persistent_volume_claim_v1.audit[0].metadata[0].name
            }
          }
          dynamic "empty_dir" {
            for_each = local.audit_pvc ? [] : [1]
            content {}
          }
        }
        # Secret files 0400 (the binary warns when a token file is readable by others).
        volume {
          name = "token"
          secret {
            secret_name  = local.token_secret
            default_mode = "0400"
          }
        }
        dynamic "volume" {
          for_each = local.optional_files
          content {
            name = volume.key
            dynamic "secret" {
              for_each = volume.value.secret != null ? [volume.value.secret] : []
              content {
                secret_name  = secret.value
                default_mode = "0400"
              }
            }
            dynamic "config_map" {
              for_each = volume.value.config_map != null ? [volume.value.config_map] : []
              content {
                name = config_map.value
              }
            }
          }
        }
      }
    }
  }
  depends_on = [kubernetes_secret_v1.token, kubernetes_secret_v1.notify, kubernetes_secret_v1.status_token, kubernetes_config_map_v1.ca]
}

# Workspaces reach the main port (the template's agent reads its own status line), Prometheus
# the health port; nothing else gets in (the kubelet's probes come from the node, which a
# NetworkPolicy always admits), and the service talks only to DNS and the ports it needs.
resource "kubernetes_network_policy_v1" "this" {
  count = var.network_policy ? 1 : 0
  metadata {
    name      = local.name
    namespace = var.namespace
    labels    = local.labels
  }
  spec {
    pod_selector {
      match_labels = { "app.kubernetes.io/name" = local.name }
    }
    policy_types = ["Ingress", "Egress"]
    ingress {
      ports {
        port     = var.listen_port
        protocol = "TCP"
      }
      dynamic "from" {
        for_each = var.workspace_namespaces == null ? [] : var.workspace_namespaces
        content {
          namespace_selector {
            match_labels = { "kubernetes.io/metadata.name" = from.value }
          }
        }
      }
    }
    ingress {
      ports {
        port     = var.health_port
        protocol = "TCP"
      }
      dynamic "from" {
        for_each = var.metrics_namespaces
        content {
          namespace_selector {
            match_labels = { "kubernetes.io/metadata.name" = from.value }
          }
        }
      }
    }
    egress {
      ports {
        port     = 53
        protocol = "UDP"
      }
      ports {
        port     = 53
        protocol = "TCP"
      }
    }
    egress {
      dynamic "ports" {
        for_each = var.egress_ports
        content {
          port     = ports.value
          protocol = "TCP"
        }
      }
    }
  }
  depends_on = [kubernetes_namespace_v1.this]
}

resource "kubernetes_service_v1" "this" {
  metadata {
    name      = local.name
    namespace = var.namespace
    labels    = local.labels
  }
  spec {
    selector = { "app.kubernetes.io/name" = local.name }
    port {
      name        = "http"
      port        = var.listen_port
      target_port = "http"
    }
    port {
      name        = "health"
      port        = var.health_port
      target_port = "health"
    }
  }
  depends_on = [kubernetes_namespace_v1.this]
}

resource "kubernetes_manifest" "service_monitor" {
  count = var.service_monitor ? 1 : 0
  manifest = {
    apiVersion = "monitoring.coreos.com/v1"
    kind       = "ServiceMonitor"
    metadata = {
      name      = local.name
      namespace = var.namespace
      labels    = merge(local.labels, var.service_monitor_labels)
    }
    spec = {
      selector  = { matchLabels = { "app.kubernetes.io/name" = local.name } }
      endpoints = [{ port = "health", path = "/metrics", interval = "30s" }]
    }
  }
}

resource "kubernetes_config_map_v1" "dcgm_counters" {
  count = var.dcgm_counters_configmap ? 1 : 0
  metadata {
    name      = "dcgm-exporter-counters-with-sm-active"
    namespace = var.dcgm_namespace
    labels    = local.labels
  }
  data = { "default-counters.csv" = file("${path.module}/dcgm-counters.csv") }
}

# The Grafana dashboard, picked up by the Grafana sidecar (kube-prometheus-stack's default label).
resource "kubernetes_config_map_v1" "grafana_dashboard" {
  count = var.grafana_dashboard ? 1 : 0
  metadata {
    name      = "${local.name}-dashboard"
    namespace = coalesce(var.grafana_dashboard_namespace, var.namespace)
    labels    = merge(local.labels, var.grafana_dashboard_labels)
  }
  data       = { "coder-gpu-reclaimer.json" = file("${path.module}/../deploy/grafana/coder-gpu-reclaimer.json") }
  depends_on = [kubernetes_namespace_v1.this]
}

# The service's alerts, for the Prometheus Operator: the spec is the rules file that promtool
# tests (deploy/prometheus/coder-gpu-reclaimer.rules.yaml).
locals {
  rules = file("${path.module}/../deploy/prometheus/coder-gpu-reclaimer.rules.yaml")
}

resource "kubernetes_manifest" "prometheus_rule" {
  count = var.prometheus_rule ? 1 : 0
  manifest = {
    apiVersion = "monitoring.coreos.com/v1"
    kind       = "PrometheusRule"
    metadata = {
      name      = local.name
      namespace = var.namespace
      labels    = merge(local.labels, var.prometheus_rule_labels)
    }
    # Each alert's runbook_url names a section of docs/runbooks.md; runbook_base_url makes it a full URL.
    spec = yamldecode(var.runbook_base_url == "" ? local.rules : replace(local.rules, "runbook_url: docs/runbooks.md", "runbook_url: ${var.runbook_base_url}"))
  }
  depends_on = [kubernetes_namespace_v1.this]
}
