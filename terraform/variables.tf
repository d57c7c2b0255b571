variable "namespace" {
  type        = string
  description = "Namespace to deploy coder-gpu-reclaimer into."
  default     = "coder-gpu-reclaimer"
}

variable "create_namespace" {
  type        = bool
  description = "Create the namespace (false when it already exists)."
  default     = true
}

variable "image" {
  type        = string
  description = "Container image built from this repository's Dockerfile and pushed to your registry."
}

variable "coder_url" {
  type        = string
  description = "Coder's URL as seen from the cluster, e.g. https://coder.example.com (https where you can: the owner token travels on it; add ca_pem for an internal CA)."
}

variable "coder_session_token" {
  type        = string
  description = "An owner's session token (`coder tokens create --lifetime 168h`). Leave null to use coder_session_token_secret."
  default     = null
  sensitive   = true
}

variable "coder_session_token_secret" {
  type        = string
  description = "Name of an existing Secret in the namespace with the token under the key `token` (instead of coder_session_token)."
  default     = null
}

variable "dcgm_exporter_urls" {
  type        = list(string)
  description = "dcgm-exporter /metrics URLs. dns+http://SERVICE:9400/metrics scrapes every address of a headless Service."
  default     = ["dns+http://nvidia-dcgm-exporter.gpu-operator.svc.cluster.local:9400/metrics"]
}

variable "prometheus_url" {
  type        = string
  description = "Read GPU history from this Prometheus instead of scraping the exporters (for large fleets)."
  default     = null
}

variable "prometheus_selector" {
  type        = string
  description = "With prometheus_url: extra label matchers added to every query, e.g. exported_namespace=\"coder\" (the exporter's job is prometheus_job; do not repeat it here)."
  default     = null
}

variable "prometheus_job" {
  type        = string
  description = "With prometheus_url: only series whose `job` label is this (the exporter's own scrape job, not a Pushgateway's or a remote writer's) speak for a workspace (--prometheus-job). Match your ServiceMonitor's job."
  default     = "nvidia-dcgm-exporter"
  nullable    = false
}

variable "workspace_namespace" {
  type        = string
  description = "The namespace of the workspace pods (--namespace): GPU series of pods in any other namespace never speak for a workspace. Null: any namespace, so any pod named after a workspace decides it."
  default     = "coder"
}

variable "proxy_url" {
  type        = string
  description = "An HTTP proxy for the service's connections (--proxy-url); proxies in the environment are ignored. Add its port to egress_ports. Null: no proxy."
  default     = null
}

variable "enforce" {
  type        = bool
  description = "Send stop builds. Off by default: the service observes and reports what it would stop."
  default     = false
}

variable "interval" {
  type        = string
  description = "Time between passes."
  default     = "60s"
}

variable "idle_after" {
  type        = string
  description = "A GPU idle this long, with no connection for as long, is reclaimed."
  default     = "30m"
}

variable "grace" {
  type        = string
  description = "Warn for this long before stopping; activity meanwhile cancels."
  default     = "0s"
}

variable "reclaim_when" {
  type        = string
  description = "always: reclaim every idle GPU; contended: only while someone waits for a GPU."
  default     = "always"
  validation {
    condition     = contains(["always", "contended"], var.reclaim_when)
    error_message = "reclaim_when must be \"always\" or \"contended\"."
  }
}

variable "gpu_templates" {
  type        = list(string)
  description = "The templates whose workspaces have GPUs (globs, e.g. [\"gpu-*\", \"ml-training\"]): only they wait for a GPU or lack GPU data, and no GPU series makes another template's workspace a GPU workspace. Written into the policy file (do not also set gpu_templates in policy_toml). Empty: learned from GPU series, which a store others can write to can forge."
  default     = ["gpu-*"]
}

variable "policy_toml" {
  type        = string
  description = "The policy file (TOML, see docs/policy.md). Empty: the defaults."
  default     = ""
}

variable "notify_webhook" {
  type        = string
  description = "POST a JSON event (Slack-compatible `text`) on each warning and stop. A secret (Slack's URL is its key): kept in a Secret and mounted as a file."
  default     = null
  sensitive   = true
}

variable "status_token" {
  type        = string
  description = "/ and /api/v1/workspaces (everyone's workspaces) require `Authorization: Bearer <this>`; the per-workspace route the template calls stays open. Null: a random one is generated (output status_token)."
  default     = null
  sensitive   = true
}

variable "ca_pem" {
  type        = string
  description = "PEM of extra CAs to trust (an internal CA in front of Coder or Prometheus), mounted and passed as --ca-file."
  default     = null
}

variable "network_policy" {
  type        = bool
  description = "Create a NetworkPolicy: ingress only to the HTTP port; egress only to DNS and egress_ports."
  default     = true
}

variable "egress_ports" {
  type        = list(number)
  description = "TCP ports the service may connect to: Coder (80/443 or its own), dcgm-exporter (9400), Prometheus (9090), the webhook (443)."
  default     = [80, 443, 3000, 8080, 9090, 9400]
}

variable "audit_log" {
  type        = bool
  description = "Keep an audit trail (one JSON line per change of a stop's state, would-stop, TTL restore, resumed workspace and deadline extension), on a PersistentVolumeClaim unless audit_log_persistent is false."
  default     = true
}

variable "history_journal" {
  type        = bool
  description = "Journal each change of a running workspace (first seen, used, agent, gone) for `coder-gpu-reclaimer backtest`: one JSON line per change in history.jsonl beside the audit log (on its volume), rotated at 64 MiB to history.jsonl.1 (history_journal_max_mib in policy_toml changes the bound)."
  default     = false
}

variable "audit_log_persistent" {
  type        = bool
  description = "Keep the audit log on a PersistentVolumeClaim (ReadWriteOnce) that outlives rollouts; false: an emptyDir, deleted at every rollout."
  default     = true
}

variable "audit_log_storage_size" {
  type        = string
  description = "Size of the audit log's PersistentVolumeClaim."
  default     = "1Gi"
  nullable    = false
}

variable "audit_log_storage_class" {
  type        = string
  description = "StorageClass of the audit log's PersistentVolumeClaim. Null: the cluster's default class."
  default     = null
}

variable "log_format" {
  type        = string
  description = "json or text."
  default     = "json"
}

variable "listen_port" {
  type        = number
  description = "Port of /metrics, /healthz, /readyz and the status API."
  default     = 9464
}

variable "health_port" {
  type        = number
  description = "A port of its own for /healthz, /readyz and /metrics (--health-listen): the kubelet's probes and Prometheus use it, so no crowd of clients on listen_port can starve them."
  default     = 9465
}

variable "workspace_namespaces" {
  type        = list(string)
  description = "Namespaces whose pods may reach listen_port (the NetworkPolicy's ingress): where Coder runs workspaces (their agents read their own status line). Null: any namespace."
  default     = ["coder"]
  validation {
    condition     = var.workspace_namespaces == null ? true : length(var.workspace_namespaces) > 0
    error_message = "workspace_namespaces must not be empty (an ingress rule with no `from` admits every pod): list the namespaces where Coder runs workspaces, e.g. [\"coder\"], or set null to admit any namespace."
  }
}

variable "metrics_namespaces" {
  type        = list(string)
  description = "Namespaces whose pods may reach health_port (/metrics): where Prometheus runs. The kubelet's probes come from the node, which a NetworkPolicy always lets in."
  default     = ["monitoring"]
  validation {
    condition     = var.metrics_namespaces == null ? false : length(var.metrics_namespaces) > 0
    error_message = "metrics_namespaces must list at least one namespace (an ingress rule with no `from` admits every pod): the namespace where Prometheus runs, e.g. [\"monitoring\"]."
  }
}

variable "resources" {
  type = object({
    requests = map(string)
    limits   = map(string)
  })
  description = "Container resources. A pass over 10,000 workspaces peaks under 100 MiB (README, Speed and size)."
  default = {
    requests = { cpu = "50m", memory = "64Mi" }
    limits   = { cpu = "1", memory = "256Mi" }
  }
}

variable "service_monitor" {
  type        = bool
  description = "Create a prometheus-operator ServiceMonitor for /metrics."
  default     = false
}

variable "service_monitor_labels" {
  type        = map(string)
  description = "Extra labels on the ServiceMonitor (e.g. the release label your Prometheus selects)."
  default     = {}
}

variable "dcgm_counters_configmap" {
  type        = bool
  description = "Create a ConfigMap with dcgm-exporter's default counters plus DCGM_FI_PROF_SM_ACTIVE (see README)."
  default     = true
}

variable "dcgm_namespace" {
  type        = string
  description = "Namespace of dcgm-exporter (where the counters ConfigMap goes)."
  default     = "gpu-operator"
}

variable "labels" {
  type        = map(string)
  description = "Extra labels on every object."
  default     = {}
}

variable "grafana_dashboard" {
  type        = bool
  description = "Create a ConfigMap with the Grafana dashboard (deploy/grafana/coder-gpu-reclaimer.json) for the Grafana sidecar."
  default     = false
}

variable "grafana_dashboard_namespace" {
  type        = string
  description = "Namespace the Grafana sidecar watches (null: this module's namespace)."
  default     = null
}

variable "grafana_dashboard_labels" {
  type        = map(string)
  description = "Labels the Grafana sidecar selects dashboards by."
  default     = { grafana_dashboard = "1" }
}

variable "prometheus_rule" {
  type        = bool
  description = "Create a PrometheusRule with the service's alerts (deploy/prometheus/coder-gpu-reclaimer.rules.yaml); needs the Prometheus Operator's CRDs in the cluster."
  default     = false
}

variable "runbook_base_url" {
  description = "Where docs/runbooks.md is published (e.g. https://git.example.com/platform/coder-gpu-reclaimer/blob/main/docs/runbooks.md): each alert's runbook_url becomes this plus its section. Empty: the relative docs/runbooks.md#section."
  type        = string
  default     = ""
}

variable "prometheus_rule_labels" {
  type        = map(string)
  description = "Labels of the PrometheusRule; they must match your Prometheus' ruleSelector (kube-prometheus-stack: release = <its Helm release name>)."
  default     = { release = "kube-prometheus-stack" }
}
