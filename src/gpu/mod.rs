//! GPU readings: the exposition parser, the canonical signal table, the two sources
//! (dcgm-exporter scraped directly, or Prometheus), which GPU belongs to which workspace, and
//! the per-workspace windows of samples the decisions read.

pub mod expo;
pub mod exporter;
pub mod prometheus;
pub mod signals;
pub mod window;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;

use signals::{Signal, SignalValues};

/// One physical GPU or MIG instance, as one pod sees it. With time-slicing in virtual-GPU mode
/// dcgm-exporter repeats a device's series once per sharing pod, hence the pod in the key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct GpuKey {
    pub uuid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// Everything one source said about one GPU at one time.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReading {
    pub key: GpuKey,
    /// The workspace the series belongs to, when its labels say so.
    pub workspace_id: Option<String>,
    pub namespace: Option<String>,
    pub model: Option<String>,
    pub at: DateTime<Utc>,
    pub values: SignalValues,
    /// The exporter URL or Prometheus base URL that reported it.
    pub source: Arc<str>,
    /// A virtual-GPU series (time-slicing, `vgpu` label): one of several pods sharing the device.
    /// Its values are the device's (see `readings_from_exposition`), never the pod's own zeros.
    pub shared: bool,
    /// The device's energy counter, joules (frozen-data detection).
    pub energy_joules: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceFailure {
    /// The URL without credentials or query (for logs and `check`).
    pub source: String,
    /// `host:port` only (the metric label).
    #[serde(skip)]
    pub host: String,
    pub error: String,
}

impl SourceFailure {
    pub fn new(source: String, host: String, error: String) -> Self {
        SourceFailure { source, host, error }
    }
}

/// What one collection round returned.
#[derive(Debug, Default)]
pub struct Collection {
    pub readings: Vec<GpuReading>,
    pub failures: Vec<SourceFailure>,
    /// HTTP requests made (the benchmark checks this does not grow with the fleet).
    pub requests: usize,
    /// Set when each reading is a finished sample of its own step (Prometheus history: the
    /// highest raw sample in the step ending at its time), not one more reading to merge into
    /// the pass's sample (an exporter scrape).
    pub step: Option<std::time::Duration>,
}

/// A place GPU readings come from. Both sources yield the same readings, so the windows and
/// decisions never know which one is configured.
pub trait GpuSource: Send + Sync {
    fn collect(&self, now: DateTime<Utc>) -> impl Future<Output = Collection> + Send;
}

/// The configured source.
pub enum Sources {
    Exporters(exporter::ExporterSource),
    Prometheus(prometheus::PrometheusSource),
}

impl GpuSource for Sources {
    async fn collect(&self, now: DateTime<Utc>) -> Collection {
        match self {
            Sources::Exporters(s) => s.collect(now).await,
            Sources::Prometheus(s) => s.collect(now).await,
        }
    }
}

/// How series are tied to workspaces.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ownership {
    /// Only series whose namespace label equals this count.
    pub namespace: Option<String>,
    /// A label whose value is the workspace id (e.g. a pod label exported by
    /// `--kubernetes-enable-pod-labels`); otherwise the id is found in the pod name.
    pub workspace_id_label: Option<String>,
}

impl Ownership {
    /// The workspace id a series belongs to, or `None` (no pod, empty pod, other namespace).
    /// The workload's labels are `exported_pod`/`exported_namespace` when Prometheus renamed
    /// them (its own target labels carried `pod`); those win when present.
    pub fn owner(&self, label: impl Fn(&str) -> Option<String>) -> (Option<String>, Option<String>, Option<String>) {
        // Prometheus' `exported_` renames win; `-o` (use-old-namespace) spells them pod_name and
        // pod_namespace.
        let pick = |names: [&str; 3]| names.into_iter().find_map(|n| label(n).filter(|v| !v.is_empty()));
        let pod = pick(["exported_pod", "pod", "pod_name"]);
        let namespace = pick(["exported_namespace", "namespace", "pod_namespace"]);
        if let Some(want) = &self.namespace {
            if namespace.as_deref() != Some(want.as_str()) {
                return (None, pod, namespace);
            }
        }
        let id = match &self.workspace_id_label {
            Some(name) => label(name).filter(|v| !v.is_empty()).map(|v| v.to_ascii_lowercase()),
            None => None,
        }
        .or_else(|| pod.as_deref().and_then(find_uuid));
        (id, pod, namespace)
    }
}

/// The first UUID inside a pod name. The official Kubernetes template names the Deployment
/// `coder-<workspace id>`, so its pods are `coder-<workspace id>-<replicaset>-<pod>`.
pub fn find_uuid(text: &str) -> Option<String> {
    const DASHES: [usize; 4] = [8, 13, 18, 23];
    let b = text.as_bytes();
    if b.len() < 36 {
        return None;
    }
    (0..=b.len() - 36).find_map(|start| {
        let w = &b[start..start + 36];
        let ok = w.iter().enumerate().all(|(i, c)| if DASHES.contains(&i) { *c == b'-' } else { c.is_ascii_hexdigit() });
        let bounded = start == 0 || !b[start - 1].is_ascii_hexdigit();
        (ok && bounded).then(|| String::from_utf8_lossy(w).to_ascii_lowercase())
    })
}

/// Groups parsed exposition samples into one reading per GPU (per pod, for shared GPUs).
///
/// In dcgm-exporter's virtual-GPU mode (`--kubernetes-virtual-gpus`, time-slicing) each sharing
/// pod gets its own series, marked by a `vgpu` label: its `GPU_UTIL` and `FB_USED` are that pod's
/// processes' (`0` when the exporter cannot map processes to pods, as with the Helm chart's
/// defaults), its profiling fields the whole device's. The device-level series (no pod labels)
/// stays beside them with the real values. A shared reading therefore takes the device's
/// utilization, memory, power and video engines, and keeps a pod's own utilization only when it
/// is higher (per-pod values can show work; their zeros prove nothing).
pub fn readings_from_exposition(
    text: &str,
    at: DateTime<Utc>,
    source: &Arc<str>,
    ownership: &Ownership,
) -> (Vec<GpuReading>, Vec<expo::ParseError>) {
    let mut by_gpu: HashMap<GpuKey, GpuReading> = HashMap::new();
    let errors = expo::parse_filtered(
        text,
        |name| signals::lookup(name).is_some() || signals::energy_joules(name, 0.0).is_some(),
        |sample| {
            let Some(uuid) = sample.label("UUID").or_else(|| sample.label("uuid")) else { return };
            let (workspace_id, pod, namespace) = ownership.owner(|k| sample.label(k).map(str::to_string));
            let shared = sample.label("vgpu").is_some_and(|v| !v.is_empty());
            let key = GpuKey { uuid: uuid.to_string(), gpu_instance: sample.label("GPU_I_ID").map(str::to_string), pod };
            let reading = by_gpu.entry(key.clone()).or_insert_with(|| GpuReading {
                key,
                workspace_id,
                namespace,
                model: sample.label("modelName").map(str::to_string),
                at,
                values: SignalValues::default(),
                source: source.clone(),
                shared,
                energy_joules: None,
            });
            if let Some(energy) = signals::energy_joules(sample.name, sample.value) {
                reading.energy_joules = energy;
            } else if let Some(v) = signals::lookup(sample.name).and_then(|m| m.normalise(sample.value).map(|v| (m.signal, v))) {
                reading.values.set(v.0, v.1);
            }
        },
    );
    let mut readings: Vec<GpuReading> = by_gpu.into_values().collect();
    merge_shared(&mut readings);
    (readings, errors)
}

/// Gives each shared (virtual-GPU) reading the device's utilization, memory, power and video
/// engines from the device-level reading of the same GPU and time, keeping a pod's own
/// utilization only when it is higher (per-pod values can show work; their zeros prove nothing).
pub fn merge_shared(readings: &mut [GpuReading]) {
    type Device = (String, Option<String>, DateTime<Utc>);
    let device: HashMap<Device, (SignalValues, Option<f64>)> = readings
        .iter()
        .filter(|r| r.key.pod.is_none())
        .map(|r| ((r.key.uuid.clone(), r.key.gpu_instance.clone(), r.at), (r.values, r.energy_joules)))
        .collect();
    for r in readings.iter_mut().filter(|r| r.shared) {
        let own_util = r.values.get(Signal::GpuUtil);
        let (dev, energy) = device.get(&(r.key.uuid.clone(), r.key.gpu_instance.clone(), r.at)).copied().unwrap_or_default();
        for s in [Signal::GpuUtil, Signal::FbUsedMib, Signal::PowerWatts, Signal::EncUtil, Signal::DecUtil] {
            r.values.clear(s);
            if let Some(v) = dev.get(s) {
                r.values.set(s, v);
            }
        }
        if let Some(u) = own_util.filter(|u| *u > 0.0 && r.values.get(Signal::GpuUtil).is_none_or(|d| *u > d)) {
            r.values.set(Signal::GpuUtil, u);
        }
        r.energy_joules = r.energy_joules.or(energy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_workspace_id_in_official_pod_names() {
        let id = "0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70";
        assert_eq!(find_uuid(&format!("coder-{id}-7d9f8b6c5d-x2x9k")).as_deref(), Some(id));
        assert_eq!(find_uuid(&format!("coder-{}-abc", id.to_uppercase())).as_deref(), Some(id));
        assert_eq!(find_uuid("coder-alice-main-7d9f8b6c5d-x2x9k"), None);
        assert_eq!(find_uuid(""), None);
        assert_eq!(find_uuid("tensorflow-0"), None);
    }

    #[test]
    fn exported_pod_wins_and_empty_pod_means_nobody() {
        let id = "0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70";
        let exported = format!("coder-{id}-7d9f8b6c5d-x2x9k");
        let labels = |pairs: Vec<(&'static str, String)>| move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        let own = Ownership::default();
        let (ws, pod, _) = own.owner(labels(vec![("pod", "dcgm-exporter-abcde".into()), ("exported_pod", exported.clone())]));
        assert_eq!((ws.as_deref(), pod.as_deref()), (Some(id), Some(exported.as_str())));
        assert_eq!(own.owner(labels(vec![("pod", String::new())])).0, None);
        assert_eq!(own.owner(labels(vec![])).0, None);
        let ns = Ownership { namespace: Some("coder".into()), workspace_id_label: None };
        assert_eq!(ns.owner(labels(vec![("pod", exported.clone()), ("namespace", "other".into())])).0, None);
        assert_eq!(ns.owner(labels(vec![("pod", exported.clone()), ("namespace", "coder".into())])).0.as_deref(), Some(id));
        let by_label = Ownership { namespace: None, workspace_id_label: Some("label_com_coder_workspace_id".into()) };
        assert_eq!(by_label.owner(labels(vec![("pod", "x".into()), ("label_com_coder_workspace_id", id.into())])).0.as_deref(), Some(id));
    }
}
