//! GPU readings: the exposition parser, the canonical signal table, the two sources
//! (dcgm-exporter scraped directly, or Prometheus), which GPU belongs to which workspace, and
//! the per-workspace windows of samples the decisions read.

pub mod expo;
pub mod exporter;
pub mod prometheus;
pub mod signals;
pub mod window;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
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

impl GpuKey {
    /// A GPU's identity from its series' labels (`label` answers a label's value); `None` without
    /// a UUID.
    pub fn from_labels<'a>(label: impl Fn(&str) -> Option<&'a str>) -> Option<GpuKey> {
        let uuid = label("UUID").or_else(|| label("uuid"))?;
        Some(GpuKey {
            uuid: uuid.to_string(),
            gpu_instance: label("GPU_I_ID").map(str::to_string),
            pod: pick(&label, POD_LABELS).map(str::to_string),
        })
    }
}

/// One moment of one GPU: its signals, and its energy counter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub at: DateTime<Utc>,
    pub values: SignalValues,
    /// The device's energy counter, joules (frozen-data detection).
    pub energy_joules: Option<f64>,
}

impl Point {
    pub fn new(at: DateTime<Utc>) -> Self {
        Point { at, values: SignalValues::default(), energy_joules: None }
    }

    /// Adds one exporter field (a signal or the energy counter) from its raw value. Two values
    /// for one signal (an old and a renamed field, two series of one GPU) keep the higher: a
    /// reading may show more work than was done, never less.
    pub fn add(&mut self, name: &str, value: f64) {
        if let Some(energy) = signals::energy_joules(name, value) {
            self.energy_joules = match (self.energy_joules, energy) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        } else if let Some((signal, v)) = signals::lookup(name).and_then(|m| m.normalise(value).map(|v| (m.signal, v))) {
            self.values.set(signal, self.values.get(signal).map_or(v, |old| old.max(v)));
        }
    }
}

/// Everything one source said about one GPU: whose it is, and its points in time order (one
/// per exporter scrape; one per step of Prometheus history). The labels are held once per GPU,
/// not once per point: a first Prometheus pass over 10,000 GPUs has 700,000 points.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSeries {
    pub key: GpuKey,
    /// The workspace the series belongs to, when its labels say so.
    pub workspace_id: Option<String>,
    pub namespace: Option<String>,
    pub model: Option<String>,
    /// The exporter URL or Prometheus base URL that reported it.
    pub source: Arc<str>,
    /// A virtual-GPU series (time-slicing, `vgpu` label): one of several pods sharing the device.
    /// Its values are the device's (see `series_from_exposition`), never the pod's own zeros.
    pub shared: bool,
    pub points: Vec<Point>,
}

impl GpuSeries {
    /// A GPU's series from its labels (`label` answers a label's value), with no points yet.
    pub fn from_labels<'a>(label: impl Fn(&str) -> Option<&'a str>, source: &Arc<str>, ownership: &Ownership) -> Option<GpuSeries> {
        let key = GpuKey::from_labels(&label)?;
        let (workspace_id, namespace) = ownership.owner(&label);
        Some(GpuSeries {
            key,
            workspace_id,
            namespace,
            model: label("modelName").map(str::to_string),
            source: source.clone(),
            shared: label("vgpu").is_some_and(|v| !v.is_empty()),
            points: Vec::new(),
        })
    }

    /// Adds one field's values, in time order, to the points at their times (added where there
    /// are none yet): one walk through both, since both are sorted.
    pub fn add_values(&mut self, name: &str, values: impl Iterator<Item = (DateTime<Utc>, f64)>) {
        let mut j = 0;
        for (at, value) in values {
            if j > 0 && self.points.get(j - 1).is_some_and(|p| p.at >= at) {
                j = self.points.partition_point(|p| p.at < at); // out of order: look it up
            }
            while self.points.get(j).is_some_and(|p| p.at < at) {
                j += 1;
            }
            if self.points.get(j).is_none_or(|p| p.at != at) {
                self.points.insert(j, Point::new(at));
            }
            if let Some(p) = self.points.get_mut(j) {
                p.add(name, value);
            }
        }
    }
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
    pub series: Vec<GpuSeries>,
    pub failures: Vec<SourceFailure>,
    /// HTTP requests made (the benchmark checks this does not grow with the fleet).
    pub requests: usize,
    /// Set when each point is a finished sample of its own step (Prometheus history: the
    /// highest raw sample in the step ending at its time), not one more reading to merge into
    /// the pass's sample (an exporter scrape).
    pub step: Option<std::time::Duration>,
}

/// A place GPU readings come from. Both sources yield the same series, so the windows and
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
    pub fn owner<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> (Option<String>, Option<String>) {
        let pod = pick(&label, POD_LABELS);
        let namespace = pick(&label, NAMESPACE_LABELS);
        let namespace_owned = namespace.map(str::to_string);
        if self.namespace.as_deref().is_some_and(|want| namespace != Some(want)) {
            return (None, namespace_owned);
        }
        let id = match &self.workspace_id_label {
            Some(name) => label(name).filter(|v| !v.is_empty()).map(|v| v.to_ascii_lowercase()),
            None => None,
        }
        .or_else(|| pod.and_then(find_uuid));
        (id, namespace_owned)
    }
}

/// The labels that name a series' pod and namespace, first present wins: Prometheus' `exported_`
/// renames of the workload's labels (its own target labels carried `pod`), the exporter's own
/// spelling, and `-o` (use-old-namespace).
const POD_LABELS: [&str; 3] = ["exported_pod", "pod", "pod_name"];
const NAMESPACE_LABELS: [&str; 3] = ["exported_namespace", "namespace", "pod_namespace"];

/// The first of `names` that has a non-empty value.
fn pick<'a>(label: &impl Fn(&str) -> Option<&'a str>, names: [&str; 3]) -> Option<&'a str> {
    names.into_iter().find_map(|n| label(n).filter(|v| !v.is_empty()))
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

/// Groups parsed exposition samples into one series per GPU (per pod, for shared GPUs), each
/// with one point at `at`.
///
/// In dcgm-exporter's virtual-GPU mode (`--kubernetes-virtual-gpus`, time-slicing) each sharing
/// pod gets its own series, marked by a `vgpu` label: its `GPU_UTIL` and `FB_USED` are that pod's
/// processes' (`0` when the exporter cannot map processes to pods, as with the Helm chart's
/// defaults), its profiling fields the whole device's. The device-level series (no pod labels)
/// stays beside them with the real values. A shared reading therefore takes the device's
/// utilization, memory, power and video engines, and keeps a pod's own utilization only when it
/// is higher (per-pod values can show work; their zeros prove nothing).
pub fn series_from_exposition(
    text: &str,
    at: DateTime<Utc>,
    source: &Arc<str>,
    ownership: &Ownership,
) -> (Vec<GpuSeries>, Vec<expo::ParseError>) {
    let mut by_gpu: HashMap<GpuKey, GpuSeries> = HashMap::new();
    let errors = expo::parse_filtered(
        text,
        |name| signals::lookup(name).is_some() || signals::energy_joules(name, 0.0).is_some(),
        |sample| {
            let Some(key) = GpuKey::from_labels(|k| sample.label(k)) else { return };
            let gpu = match by_gpu.entry(key) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => {
                    let Some(series) = GpuSeries::from_labels(|k| sample.label(k), source, ownership) else { return };
                    e.insert(series)
                }
            };
            gpu.add_values(sample.name, std::iter::once((at, sample.value)));
        },
    );
    let mut series: Vec<GpuSeries> = by_gpu.into_values().collect();
    merge_shared(&mut series);
    (series, errors)
}

/// Gives each shared (virtual-GPU) series the device's utilization, memory, power and video
/// engines from the device-level series of the same GPU, point by point (same time), keeping a
/// pod's own utilization only when it is higher (per-pod values can show work; their zeros
/// prove nothing).
pub fn merge_shared(series: &mut [GpuSeries]) {
    if !series.iter().any(|s| s.shared) {
        return;
    }
    let device: HashMap<(String, Option<String>), Vec<Point>> = series
        .iter()
        .filter(|s| s.key.pod.is_none())
        .map(|s| ((s.key.uuid.clone(), s.key.gpu_instance.clone()), s.points.clone()))
        .collect();
    for s in series.iter_mut().filter(|s| s.shared) {
        let dev_points = device.get(&(s.key.uuid.clone(), s.key.gpu_instance.clone()));
        for p in &mut s.points {
            let dev = dev_points.and_then(|d| d.binary_search_by(|q| q.at.cmp(&p.at)).ok().map(|i| d[i]));
            let own_util = p.values.get(Signal::GpuUtil);
            let dev_values = dev.map(|d| d.values).unwrap_or_default();
            for signal in [Signal::GpuUtil, Signal::FbUsedMib, Signal::PowerWatts, Signal::EncUtil, Signal::DecUtil] {
                p.values.clear(signal);
                if let Some(v) = dev_values.get(signal) {
                    p.values.set(signal, v);
                }
            }
            if let Some(u) = own_util.filter(|u| *u > 0.0 && p.values.get(Signal::GpuUtil).is_none_or(|d| *u > d)) {
                p.values.set(Signal::GpuUtil, u);
            }
            p.energy_joules = p.energy_joules.or(dev.and_then(|d| d.energy_joules));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_on_their_points_in_time_order_whatever_order_they_come_in() {
        let t = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap();
        let mut gpu = GpuSeries::from_labels(|k| (k == "UUID").then_some("GPU-1"), &Arc::from("x"), &Ownership::default()).unwrap();
        gpu.add_values("DCGM_FI_PROF_SM_ACTIVE", [(t(60), 0.5), (t(180), 0.0)].into_iter());
        gpu.add_values("DCGM_FI_DEV_GPU_UTIL", [(t(0), 10.0), (t(60), 100.0), (t(120), 0.0), (t(180), 7.0)].into_iter());
        gpu.add_values("DCGM_FI_PROF_SM_ACTIVE", [(t(180), 0.25), (t(60), 0.1), (t(240), 0.0)].into_iter());
        let at: Vec<i64> = gpu.points.iter().map(|p| p.at.timestamp() - 1_800_000_000).collect();
        assert_eq!(at, [0, 60, 120, 180, 240]);
        let sm: Vec<Option<f64>> = gpu.points.iter().map(|p| p.values.get(Signal::SmActive)).collect();
        assert_eq!(sm, [None, Some(0.5), None, Some(0.25), Some(0.0)], "two values for one time: the higher");
        assert_eq!(gpu.points[1].values.get(Signal::GpuUtil), Some(1.0));
    }

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
        let owner = |own: &Ownership, pairs: &[(&str, &str)]| own.owner(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v));
        let own = Ownership::default();
        let both = [("UUID", "GPU-1"), ("pod", "dcgm-exporter-abcde"), ("exported_pod", exported.as_str())];
        let (ws, _) = owner(&own, &both);
        let pod = GpuKey::from_labels(|k| both.iter().find(|(n, _)| *n == k).map(|(_, v)| *v)).and_then(|key| key.pod);
        assert_eq!((ws.as_deref(), pod.as_deref()), (Some(id), Some(exported.as_str())));
        assert_eq!(owner(&own, &[("pod", "")]).0, None);
        assert_eq!(owner(&own, &[]).0, None);
        let ns = Ownership { namespace: Some("coder".into()), workspace_id_label: None };
        assert_eq!(owner(&ns, &[("pod", &exported), ("namespace", "other")]).0, None);
        assert_eq!(owner(&ns, &[("pod", &exported), ("namespace", "coder")]).0.as_deref(), Some(id));
        let by_label = Ownership { namespace: None, workspace_id_label: Some("label_com_coder_workspace_id".into()) };
        assert_eq!(owner(&by_label, &[("pod", "x"), ("label_com_coder_workspace_id", id)]).0.as_deref(), Some(id));
    }
}
