output "service" {
  description = "The in-cluster Service of /metrics and the status API."
  value       = "${kubernetes_service_v1.this.metadata[0].name}.${var.namespace}.svc"
}

output "status_url" {
  description = "The status API; the workspace template's metadata reads /api/v1/workspaces/{id} from it."
  value       = "http://${kubernetes_service_v1.this.metadata[0].name}.${var.namespace}.svc:${var.listen_port}"
}

output "mode" {
  description = "observe or enforce."
  value       = var.enforce ? "enforce" : "observe"
}

output "dcgm_counters_configmap" {
  description = "ConfigMap to mount as dcgm-exporter's counters file (null when not created)."
  value       = var.dcgm_counters_configmap ? kubernetes_config_map_v1.dcgm_counters[0].metadata[0].name : null
}

output "status_token" {
  description = "The bearer token of / and /api/v1/workspaces (the one given, or the generated one)."
  value       = local.status_token
  sensitive   = true
}
