//! GPU readings: the exposition parser, the canonical signal table, the two sources
//! (dcgm-exporter scraped directly, or Prometheus), which GPU belongs to which workspace, and
//! the per-workspace windows of samples the decisions read.

pub mod expo;
pub mod exporter;
pub mod prometheus;
pub mod signals;
pub mod window;

use std::collections::{HashMap, HashSet};
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
    /// a UUID. The pod is the workload's, as `ownership` finds it: `None` for the device-level
    /// series (no workload pod of a Coder workspace, whatever the exporter's own `pod` label).
    pub fn from_labels<'a>(label: impl Fn(&str) -> Option<&'a str>, ownership: &Ownership) -> Option<GpuKey> {
        let uuid = label("UUID").or_else(|| label("uuid"))?;
        Some(GpuKey {
            uuid: uuid.to_string(),
            gpu_instance: label("GPU_I_ID").map(str::to_string),
            pod: ownership.workload(&label).map(|(pod, _)| pod.to_string()),
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
    /// Whose utilization and memory the points carry (see `merge_device_level`).
    pub attribution: Attribution,
    pub points: Vec<Point>,
}

/// Whose `GPU_UTIL` and `FB_USED` a workload series carries (reference dcgm NOTES §10-11,
/// LAYOUTS §1-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Attribution {
    /// The GPU is the pod's alone (the default layout relabels the device's own series; in
    /// virtual-GPU mode the device-level values are merged in).
    #[default]
    Exclusive,
    /// One of several pods time-slicing the device (`vgpu` label): each point carries the
    /// device's readings, or where the exporter maps processes to pods (`hostPID` and a real
    /// `pod_uid`), the pod's own utilization and memory without the device-wide compute fields.
    Shared,
    /// A sharer's copies with no device-level series beside them (a relabeling or the selector
    /// left it out of the store): its utilization and memory are the pod's placeholders, zeros
    /// that prove nothing, so it cannot be judged.
    DeviceSeriesMissing,
}

impl GpuSeries {
    /// A GPU's series from its labels (`label` answers a label's value), with no points yet.
    pub fn from_labels<'a>(label: impl Fn(&str) -> Option<&'a str>, source: &Arc<str>, ownership: &Ownership) -> Option<GpuSeries> {
        let key = GpuKey::from_labels(&label, ownership)?;
        let (workspace_id, namespace) = ownership.owner(&label);
        Some(GpuSeries {
            key,
            workspace_id,
            namespace,
            model: label("modelName").map(str::to_string),
            source: source.clone(),
            attribution: if label("vgpu").is_some_and(|v| !v.is_empty()) { Attribution::Shared } else { Attribution::Exclusive },
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
    /// `--kubernetes-enable-pod-labels`); where a series lacks it, or it is unset, the id is
    /// found in the pod name.
    pub workspace_id_label: Option<String>,
}

impl Ownership {
    /// The workspace id a series belongs to, or `None` (no workload pod of a Coder workspace,
    /// other namespace), and the workload's namespace.
    pub fn owner<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> (Option<String>, Option<String>) {
        let Some((pod, namespace)) = self.workload(&label) else { return (None, None) };
        let namespace_owned = namespace.map(str::to_string);
        if self.namespace.as_deref().is_some_and(|want| namespace != Some(want)) {
            return (None, namespace_owned);
        }
        // The label where it is set, else the pod name: virtual-GPU, per-process and DRA copies
        // never carry pod labels, nor MIG instances before exporter 4.6.0-4.8.3 (NOTES §11.1).
        let id = match &self.workspace_id_label {
            Some(name) => label(name).filter(|v| !v.is_empty()).map(|v| v.to_ascii_lowercase()).or_else(|| find_uuid(pod)),
            None => find_uuid(pod),
        };
        (id, namespace_owned)
    }

    /// The workload's pod and namespace labels: the first pod label that names a Coder workspace
    /// (its id in the pod name, or the `workspace_id_label` set), with the namespace label of the
    /// same spelling. Behind Prometheus the exporter's own `pod` sits beside the workload's
    /// `exported_pod` (`honorLabels: false`) or `pod_name` (`-o`), and alone on the device-level
    /// series (reference dcgm NOTES §6, §10): that one names no workspace, so it is no workload.
    pub fn workload<'a>(&self, label: &impl Fn(&str) -> Option<&'a str>) -> Option<(&'a str, Option<&'a str>)> {
        let names_workspace = match &self.workspace_id_label {
            Some(name) => label(name).is_some_and(|v| !v.is_empty()),
            None => false,
        };
        WORKLOAD_LABELS.into_iter().find_map(|(pod_label, namespace_label)| {
            let pod = label(pod_label).filter(|v| !v.is_empty())?;
            (names_workspace || find_uuid(pod).is_some()).then(|| (pod, label(namespace_label).filter(|v| !v.is_empty())))
        })
    }
}

/// The labels that may name a series' workload pod, each with its namespace label, in the order
/// tried: Prometheus' `exported_` renames (its own target labels took `pod`), `-o`'s old names
/// (`pod` beside them is the exporter's), and the exporter's own spelling.
const WORKLOAD_LABELS: [(&str, &str); 3] = [("exported_pod", "exported_namespace"), ("pod_name", "pod_namespace"), ("pod", "namespace")];

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
/// In dcgm-exporter's virtual-GPU mode (`--kubernetes-virtual-gpus`) every GPU with pods gets,
/// for `GPU_UTIL` and `FB_USED`, one series per pod beside the device-level one, and every other
/// field once per pod with the device's value (reference dcgm NOTES §10). A per-pod
/// `GPU_UTIL`/`FB_USED` with an empty `pod_uid` beside a device-level series of its GPU is not
/// that pod's reading (no process could be mapped to the pod; the Helm chart's defaults): it is
/// dropped, and `merge_device_level` gives the pod the device's. Without a device-level series
/// (the default layout with `--kubernetes-enable-pod-uid` and no pod read access, NOTES §11.1)
/// the same empty `pod_uid` marks the device's own series, relabelled in place: its values are
/// kept.
pub fn series_from_exposition(
    text: &str,
    at: DateTime<Utc>,
    source: &Arc<str>,
    ownership: &Ownership,
) -> (Vec<GpuSeries>, Vec<expo::ParseError>) {
    let (series, errors, _) = series_from_exposition_capped(text, at, source, ownership, usize::MAX);
    (series, errors)
}

/// `series_from_exposition`, holding at most `max_gpus` distinct GPU series: a body that names
/// more stops growing there (its other samples are read and dropped) and the third value is
/// `true`, so one answer can never hold more than the cap, whatever it sends.
pub fn series_from_exposition_capped(
    text: &str,
    at: DateTime<Utc>,
    source: &Arc<str>,
    ownership: &Ownership,
    max_gpus: usize,
) -> (Vec<GpuSeries>, Vec<expo::ParseError>, bool) {
    let mut by_gpu: HashMap<GpuKey, usize> = HashMap::new();
    let mut series: Vec<GpuSeries> = Vec::new();
    // Each label set read, by its text: the GPU it names (in `series`) and whether its `pod_uid`
    // is empty; `None` when it names none. Every family repeats a GPU's set, so each is parsed
    // once per scrape. Bounded: past the bound, sets are parsed line by line.
    let mut by_text: HashMap<&str, Option<(usize, bool)>> = HashMap::new();
    let mut by_place: Vec<(&str, Option<(usize, bool)>)> = Vec::new();
    let mut family = ("", 0usize);
    let max_texts = max_gpus.saturating_mul(8).min(1 << 16);
    let mut labels = Vec::with_capacity(16);
    let mut label_errors = Vec::new();
    let mut over = false;
    // Per-pod `GPU_UTIL`/`FB_USED` with an empty `pod_uid`: kept only where their GPU has no
    // device-level series (see above), known once the whole scrape is read.
    // One value per GPU and field name, so bounded by the series cap.
    let mut maybe_placeholders: HashMap<(usize, &'static str), f64> = HashMap::new();
    let mut errors = expo::parse_lines(
        text,
        |name| signals::lookup(name).is_some() || signals::energy_joules(name, 0.0).is_some(),
        |line| {
            // The families list the GPUs in one order: a line's set is most often the one at
            // its place in the first family, checked before any hashing.
            if line.name != family.0 {
                family = (line.name, 0);
            }
            let place = family.1;
            family.1 += 1;
            let known = match by_place.get(place) {
                Some((text, slot)) if *text == line.labels_text => Some(*slot),
                _ => by_text.get(line.labels_text).copied(),
            };
            let slot = match known {
                Some(slot) => slot,
                None => {
                    if let Err(message) = expo::parse_label_set(line.labels_text, &mut labels) {
                        label_errors.push(expo::ParseError { line: line.number, message });
                        return;
                    }
                    let label = |k: &str| expo::label(&labels, k);
                    let gpu = GpuKey::from_labels(label, ownership).and_then(|key| match by_gpu.get(&key) {
                        Some(&i) => Some(i),
                        None if by_gpu.len() >= max_gpus => {
                            over = true;
                            None
                        }
                        None => {
                            let new = GpuSeries::from_labels(label, source, ownership)?;
                            by_gpu.insert(key, series.len());
                            series.push(new);
                            Some(series.len() - 1)
                        }
                    });
                    let slot = gpu.map(|i| (i, label("pod_uid") == Some("")));
                    if by_text.len() < max_texts {
                        by_text.insert(line.labels_text, slot);
                        if by_place.len() == place {
                            by_place.push((line.labels_text, slot));
                        }
                    }
                    slot
                }
            };
            let Some((i, empty_pod_uid)) = slot else { return };
            let name = signals::read_as(line.name, line.integer);
            if empty_pod_uid && signals::lookup(name).is_some_and(|m| m.signal.per_process()) {
                if let Some(name) = signals::NAMES.iter().map(|m| m.name).find(|n| *n == name) {
                    let v = maybe_placeholders.entry((i, name)).or_insert(line.value);
                    *v = v.max(line.value);
                }
                return;
            }
            if let Some(gpu) = series.get_mut(i) {
                gpu.add_values(name, std::iter::once((at, line.value)));
            }
        },
    );
    expo::merge_errors(&mut errors, label_errors);
    let device_level: HashSet<(&str, Option<&str>)> =
        series.iter().filter(|s| s.key.pod.is_none()).map(|s| (s.key.uuid.as_str(), s.key.gpu_instance.as_deref())).collect();
    let own: Vec<bool> = series.iter().map(|s| !device_level.contains(&(s.key.uuid.as_str(), s.key.gpu_instance.as_deref()))).collect();
    for ((i, name), value) in maybe_placeholders {
        if let Some(gpu) = series.get_mut(i).filter(|_| own[i]) {
            gpu.add_values(name, std::iter::once((at, value)));
        }
    }
    merge_device_level(&mut series);
    (series, errors, over)
}

/// Gives each workload series of a GPU that also has a device-level series (virtual-GPU mode)
/// the device's readings, point by point (same time). An exclusive pod gets the device's
/// `GPU_UTIL` and `FB_USED` where higher than its own (per-pod values can show work; their
/// zeros prove nothing) and any field its series lacks; its copies of the other fields (power,
/// video engines, energy, profiling) are the device's values already.
///
/// The sharers of a time-sliced GPU read the same, except where the exporter maps processes to
/// pods (`hostPID` and real `pod_uid`s: some sharer's own utilization or memory reads above
/// zero, reference dcgm NOTES §11.2): there each keeps its own utilization and memory and loses
/// the device-wide compute fields (GR, SM, tensor, power; DRAM too where a sharer's kernels
/// explain it), which are every sharer's, so a busy sharer no longer keeps an idle one. The
/// video engines stay (no per-process field says whose), and so does DRAM with no kernel on the
/// GPU (copy-only work, someone's). A sharer with no device-level series beside it cannot be
/// read at all: `Attribution::DeviceSeriesMissing`.
pub fn merge_device_level(series: &mut [GpuSeries]) {
    type Gpu = (String, Option<String>);
    let mut gpus: HashMap<Gpu, (Option<usize>, Vec<usize>)> = HashMap::new();
    for (i, s) in series.iter().enumerate() {
        let entry = gpus.entry((s.key.uuid.clone(), s.key.gpu_instance.clone())).or_default();
        match s.key.pod {
            None => entry.0 = Some(i),
            Some(_) => entry.1.push(i),
        }
    }
    for (device, pods) in gpus.into_values() {
        let Some(dev) = device else {
            for &i in &pods {
                if series[i].attribution == Attribution::Shared {
                    series[i].attribution = Attribution::DeviceSeriesMissing;
                }
            }
            continue;
        };
        let dev_points = series[dev].points.clone();
        // The times at which the sharers' own readings show the exporter maps processes to
        // pods, and those at which one of them runs kernels.
        let (mut mapped, mut kernels) = (HashSet::new(), HashSet::new());
        for &i in pods.iter().filter(|&&i| series[i].attribution == Attribution::Shared) {
            for p in &series[i].points {
                let above = |s: Signal| p.values.get(s).is_some_and(|v| v > 0.0);
                if above(Signal::GpuUtil) || above(Signal::FbUsedMib) {
                    mapped.insert(p.at);
                }
                if above(Signal::GpuUtil) {
                    kernels.insert(p.at);
                }
            }
        }
        for &i in &pods {
            let shared = series[i].attribution == Attribution::Shared;
            for p in &mut series[i].points {
                if shared && mapped.contains(&p.at) {
                    for signal in [Signal::GrEngineActive, Signal::SmActive, Signal::TensorActive, Signal::PowerWatts] {
                        p.values.clear(signal);
                    }
                    if kernels.contains(&p.at) {
                        p.values.clear(Signal::DramActive);
                    }
                    continue;
                }
                let Ok(j) = dev_points.binary_search_by(|q| q.at.cmp(&p.at)) else { continue };
                let d = dev_points[j];
                for signal in Signal::ALL {
                    let Some(dv) = d.values.get(signal) else { continue };
                    let own = p.values.get(signal);
                    if own.is_none() || (signal.per_process() && own.is_some_and(|o| dv > o)) {
                        p.values.set(signal, dv);
                    }
                }
                p.energy_joules = p.energy_joules.or(d.energy_joules);
            }
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
        let pod = GpuKey::from_labels(|k| both.iter().find(|(n, _)| *n == k).map(|(_, v)| *v), &own).and_then(|key| key.pod);
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
