//! GPU readings as values: the exposition parser, the canonical signal table, GPU identity and
//! `GpuSeries` (one GPU's points from one source), which GPU belongs to which workspace, and the
//! per-workspace windows of samples the decisions read. The sources that fetch them live in the
//! service crate's `gpu` module.

pub mod expo;
pub mod samples;
pub mod scrape;
pub mod signals;
pub mod window;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::coder_id::CoderId;
use crate::ids::DigestMap;
use signals::{Field, Reading, Signal, SignalValues};

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
        self.add_field(Field::of(name), value);
    }

    /// `add`, the field's name looked up already.
    pub fn add_field(&mut self, field: Field, value: f64) {
        match field.read(value) {
            Some(Reading::Energy(energy)) => {
                self.energy_joules = match (self.energy_joules, energy) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
            }
            Some(Reading::Signal(signal, v)) => self.values.set(signal, self.values.get(signal).map_or(v, |old| old.max(v))),
            None => {}
        }
    }
}

/// Everything one source said about one GPU: whose it is, and its points in time order (one
/// per exporter scrape; one per step of Prometheus history). The labels are held once per GPU,
/// not once per point: a first Prometheus pass over 10,000 GPUs has 700,000 points.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSeries {
    pub key: GpuKey,
    /// The workspace the series belongs to, when its labels say so (inline: a fetch holds one
    /// per GPU).
    pub workspace_id: Option<CoderId>,
    pub namespace: Option<String>,
    pub model: Option<String>,
    /// The exporter URL or Prometheus base URL that reported it.
    pub source: Arc<str>,
    /// Whose utilization and memory the points carry (see `merge_device_level`).
    pub attribution: Attribution,
    /// Its per-process fields (`GPU_UTIL`, `FB_USED`) carried a real `pod_uid`: the exporter
    /// found the pod (reference dcgm NOTES §11.1-11.2).
    pub real_pod_uid: bool,
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
    /// device's readings (every sharer reads the whole GPU's work).
    Shared,
    /// A sharer whose utilization and memory are its own processes' (`hostPID`, a real
    /// `pod_uid` on every sharer, and their sums account for the device-level readings): the
    /// device-wide compute fields and power are dropped; its memory counts compute processes
    /// only, so an empty one proves nothing.
    OwnProcesses,
    /// A sharer's copies with no device-level series beside them (a relabeling or the selector
    /// left it out of the store): its utilization and memory are the pod's placeholders, zeros
    /// that prove nothing, so it cannot be judged.
    DeviceSeriesMissing,
}

impl GpuSeries {
    /// A GPU's series from its labels (`label` answers a label's value), with no points yet.
    pub fn from_labels<'a>(label: impl Fn(&str) -> Option<&'a str>, source: &Arc<str>, ownership: &Ownership) -> Option<GpuSeries> {
        let key = GpuKey::from_labels(&label, ownership)?;
        Some(Self::with_key(key, ownership.owner(&label), label, source))
    }

    /// `from_labels` with the key and the owner read already (`GpuKey::from_labels`,
    /// `Ownership::owner`): a fold that checked them first does not read them twice.
    pub fn with_key<'a>(
        key: GpuKey,
        (workspace_id, namespace): (Option<String>, Option<String>),
        label: impl Fn(&str) -> Option<&'a str>,
        source: &Arc<str>,
    ) -> GpuSeries {
        GpuSeries {
            key,
            workspace_id: workspace_id.as_deref().map(CoderId::new),
            namespace,
            model: label("modelName").map(str::to_string),
            source: source.clone(),
            attribution: if label("vgpu").is_some_and(|v| !v.is_empty()) { Attribution::Shared } else { Attribution::Exclusive },
            real_pod_uid: false,
            points: Vec::new(),
        }
    }

    /// Adds one field's values, in time order, to the points at their times (added where there
    /// are none yet): one walk through both, since both are sorted.
    pub fn add_values(&mut self, field: Field, values: impl Iterator<Item = (DateTime<Utc>, f64)>) {
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
                p.add_field(field, value);
            }
        }
    }
}

/// One GPU key reported by more than one scrape target (two exporter URLs, or two `instance`
/// labels behind Prometheus). A real GPU has one exporter; where a store lets others write, a
/// forged copy of an idle GPU looks exactly like this, so it is shown, never trusted quietly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Twin {
    pub uuid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The targets that reported it (the first few).
    pub reported_by: Vec<String>,
}

/// Twins one collection lists at most (the count is kept beyond it).
pub const MAX_TWINS_LISTED: usize = 20;

/// Records one more target for `key` in `seen`: `true` the first time a second one shows.
pub fn note_target(seen: &mut HashMap<GpuKey, Vec<String>>, key: &GpuKey, target: &str) -> bool {
    let targets = seen.entry(key.clone()).or_default();
    if targets.iter().any(|t| t == target) {
        return false;
    }
    if targets.len() < 4 {
        targets.push(target.to_string());
    }
    targets.len() == 2
}

/// The twins among `seen` (keys with two or more targets), sorted, listed up to the bound.
pub fn twins_of(seen: HashMap<GpuKey, Vec<String>>) -> (Vec<Twin>, usize) {
    let mut twins: Vec<Twin> = seen
        .into_iter()
        .filter(|(_, t)| t.len() > 1)
        .map(|(k, reported_by)| Twin { uuid: k.uuid, gpu_instance: k.gpu_instance, pod: k.pod, reported_by })
        .collect();
    twins.sort_by(|a, b| (&a.uuid, &a.gpu_instance, &a.pod).cmp(&(&b.uuid, &b.gpu_instance, &b.pod)));
    let count = twins.len();
    twins.truncate(MAX_TWINS_LISTED);
    (twins, count)
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
            (names_workspace || uuid_in_pod_name(pod).is_some()).then(|| (pod, label(namespace_label).filter(|v| !v.is_empty())))
        })
    }
}

/// The labels that may name a series' workload pod, each with its namespace label, in the order
/// tried: Prometheus' `exported_` renames (its own target labels took `pod`), `-o`'s old names
/// (`pod` beside them is the exporter's), and the exporter's own spelling.
const WORKLOAD_LABELS: [(&str, &str); 3] = [("exported_pod", "exported_namespace"), ("pod_name", "pod_namespace"), ("pod", "namespace")];

/// The workspace id of a pod named as the official Kubernetes template names it: the
/// Deployment is `coder-<workspace id>`, so its pods are `coder-<workspace id>-<replicaset>-<pod>`
/// (a bare pod: `coder-<workspace id>`). Only there: a pod `batch-<id>-run7` that someone names
/// after a workspace is nobody's workspace.
pub fn find_uuid(text: &str) -> Option<String> {
    uuid_in_pod_name(text).map(str::to_ascii_lowercase)
}

/// `find_uuid`'s id as the pod name spells it (no copy: a pod is checked once per label set).
fn uuid_in_pod_name(text: &str) -> Option<&str> {
    const DASHES: [usize; 4] = [8, 13, 18, 23];
    let w = text.strip_prefix("coder-")?;
    // Only ASCII passes the check below, so the 36 bytes are whole characters when it does.
    let id = w.as_bytes().get(..36)?;
    let ok = id.iter().enumerate().all(|(i, c)| if DASHES.contains(&i) { *c == b'-' } else { c.is_ascii_hexdigit() });
    let ends = w.as_bytes().get(36).is_none_or(|c| *c == b'-');
    if ok && ends { w.get(..36) } else { None }
}

/// GPU series one pod may name in one answer: one more than a workspace may have, so that a pod
/// naming too many reaches the windows as too many (`too-many-gpu-series`) and costs no more.
/// A pod over it fails that pod's workspace, never the whole source.
pub const MAX_SERIES_PER_POD: usize = MAX_GPUS_PER_WORKSPACE + 1;

/// GPU windows one workspace may have by default (`max_gpus_per_workspace`): a pod gets at most
/// 8 GPUs of one node (16 leaves room for MIG instances). More series than this naming one
/// workspace are forged or misconfigured, and the workspace is judged on none of them.
pub const DEFAULT_MAX_GPUS_PER_WORKSPACE: usize = 16;

/// The most `max_gpus_per_workspace` may be: 8 GPUs of 7 MIG instances each, and some.
pub const MAX_GPUS_PER_WORKSPACE: usize = 64;

/// Counts the GPU series each workspace pod names in one answer (series of no workspace pod, a
/// device's own among them, count only against the source's cap: behind Prometheus they carry
/// the exporter's own pod, which names one node's GPUs). Nothing is counted until the answer
/// holds `MAX_SERIES_PER_POD` series (no pod can be over before): then the pods of those are.
#[derive(Debug)]
pub struct PerPod {
    /// Series per pod, by a digest of its name (not a copy of it).
    counts: Option<DigestMap<usize>>,
    /// Series one pod may name (`MAX_SERIES_PER_POD`, or the policy's `max_gpus_per_workspace`
    /// plus one: enough to reach the windows as too many, and no more).
    cap: usize,
}

impl Default for PerPod {
    fn default() -> Self {
        PerPod { counts: None, cap: MAX_SERIES_PER_POD }
    }
}

impl PerPod {
    /// At most `cap` series per pod (at least one, at most `MAX_SERIES_PER_POD`).
    pub fn with_cap(cap: usize) -> Self {
        PerPod { counts: None, cap: cap.clamp(1, MAX_SERIES_PER_POD) }
    }

    /// Whether one more series of `pod` is kept; `held` are the series kept so far.
    pub fn admit(&mut self, pod: Option<&str>, held: &[GpuSeries]) -> bool {
        let Some(pod) = pod else { return true };
        if self.counts.is_none() && held.len() < self.cap {
            return true;
        }
        let counts = self.counts.get_or_insert_with(|| {
            let mut counts = DigestMap::default();
            for p in held.iter().filter_map(|s| s.key.pod.as_deref()) {
                *counts.get_or_insert_with(p, || 0) += 1;
            }
            counts
        });
        let n = counts.get_or_insert_with(pod, || 0);
        *n += 1;
        *n <= self.cap
    }
}

/// Gives each workload series of a GPU that also has a device-level series (virtual-GPU mode)
/// the device's readings, point by point (same time). An exclusive pod gets the device's
/// `GPU_UTIL` and `FB_USED` where higher than its own (per-pod values can show work; their
/// zeros prove nothing), and nothing else: its copies of the other fields (power, video
/// engines, energy, profiling) are the device's values already.
///
/// The sharers of a time-sliced GPU read the same (`Shared`), unless their own readings can be
/// trusted (`OwnProcesses`, reference dcgm NOTES §11.2): every sharer's per-process fields carry
/// a real `pod_uid`, and at every time the sharers' own utilization and memory add up to the
/// device-level readings (an unmapped process, a `GetProcessUtilization` that is not supported,
/// a graphics process whose memory is not a compute process's: they do not, and the device's
/// are read). Then each sharer keeps its own utilization and memory and loses the device-wide
/// compute fields (GR, SM, tensor, power), which are every sharer's, so a busy sharer no longer
/// keeps an idle one. The video engines stay (no per-process field says whose), and so does DRAM
/// for a sharer that holds memory (its copies cannot be told from another sharer's kernels);
/// a sharer that holds none copies nothing. A sharer with per-process fields but no
/// device-level series beside it cannot be read: `DeviceSeriesMissing`.
pub fn merge_device_level(series: &mut [GpuSeries]) {
    let per_process = |p: &Point| p.values.get(Signal::GpuUtil).is_some() || p.values.get(Signal::FbUsedMib).is_some();
    // The common case, every GPU held by one pod in the default layout: nothing to merge.
    if series.iter().all(|s| s.key.pod.is_some() && s.attribution != Attribution::Shared) {
        return;
    }
    // Per GPU (UUID and instance): its device-level series, and its workload series.
    type Group = (Option<usize>, Vec<usize>);
    let groups: Vec<Group> = {
        let mut gpus: HashMap<(&str, Option<&str>), Group> = HashMap::new();
        for (i, s) in series.iter().enumerate() {
            let entry = gpus.entry((s.key.uuid.as_str(), s.key.gpu_instance.as_deref())).or_default();
            match s.key.pod {
                None => entry.0 = Some(i),
                Some(_) => entry.1.push(i),
            }
        }
        gpus.into_values().collect()
    };
    for (device, pods) in groups {
        let sharers: Vec<usize> = pods.iter().copied().filter(|&i| series[i].attribution == Attribution::Shared).collect();
        let Some(dev) = device else {
            for &i in &sharers {
                if series[i].points.iter().any(per_process) {
                    series[i].attribution = Attribution::DeviceSeriesMissing;
                }
            }
            continue;
        };
        let dev_points = series[dev].points.clone();
        let own = !sharers.is_empty() && sharers.iter().all(|&i| series[i].real_pod_uid) && accounts_for(series, &sharers, &dev_points);
        for &i in &pods {
            if own && series[i].attribution == Attribution::Shared {
                series[i].attribution = Attribution::OwnProcesses;
                for p in &mut series[i].points {
                    for signal in [Signal::GrEngineActive, Signal::SmActive, Signal::TensorActive, Signal::PowerWatts] {
                        p.values.clear(signal);
                    }
                    if p.values.get(Signal::FbUsedMib).is_none_or(|fb| fb <= 0.0) {
                        p.values.clear(Signal::DramActive);
                    }
                }
                continue;
            }
            for p in &mut series[i].points {
                let Ok(j) = dev_points.binary_search_by(|q| q.at.cmp(&p.at)) else { continue };
                let d = dev_points[j];
                // Only the per-process fields: the pod's copies hold every other one, and a
                // series without a workspace pod is anybody's (a forged SM_ACTIVE of 0 must not
                // turn a busy GPU's readings phantom).
                for signal in Signal::ALL.into_iter().filter(|s| s.per_process()) {
                    let Some(dv) = d.values.get(signal) else { continue };
                    if p.values.get(signal).is_none_or(|o| dv > o) {
                        p.values.set(signal, dv);
                    }
                }
            }
        }
    }
}

/// Whether the sharers' own utilization and memory add up to the device-level readings at every
/// time the device has them (within 5 points of utilization, and 80 % of the memory less 256 MiB
/// of the driver's own): only then are their own readings the whole story.
fn accounts_for(series: &[GpuSeries], sharers: &[usize], device: &[Point]) -> bool {
    device.iter().all(|d| {
        let mut sums = (0.0, 0.0, false);
        for &i in sharers {
            if let Ok(j) = series[i].points.binary_search_by(|q| q.at.cmp(&d.at)) {
                let v = &series[i].points[j].values;
                sums.0 += v.get(Signal::GpuUtil).unwrap_or(0.0);
                sums.1 += v.get(Signal::FbUsedMib).unwrap_or(0.0);
                sums.2 = true;
            }
        }
        let util_ok = d.values.get(Signal::GpuUtil).is_none_or(|u| sums.0 >= u - 0.05);
        let fb_ok = d.values.get(Signal::FbUsedMib).is_none_or(|fb| sums.1 >= 0.8 * fb - 256.0);
        sums.2 && util_ok && fb_ok
    })
}

/// The workspace GPU keys that two scrape targets reported over at least two common steps,
/// counted across fetches (`co_reported`: a steady pass fetches one step). An exporter restart
/// (a new pod, a new `instance`) overlaps the old one by a step at most; a copy of a GPU forged
/// into the store overlaps it throughout.
pub fn twins_in(
    series: &[GpuSeries],
    instances: impl IntoIterator<Item = (usize, Vec<(Arc<str>, i64, i64)>)>,
    step: i64,
    co_reported: &mut HashMap<GpuKey, (Vec<String>, i64)>,
) -> (Vec<Twin>, usize) {
    let mut now: HashMap<GpuKey, (Vec<String>, i64)> = HashMap::new();
    for (i, targets) in instances {
        let Some(s) = series.get(i) else { continue };
        let mut steps = 0;
        for (a, (_, a0, a1)) in targets.iter().enumerate() {
            for (_, b0, b1) in targets.iter().skip(a + 1) {
                let common = (*a1).min(*b1).saturating_sub((*a0).max(*b0));
                if common >= 0 {
                    steps = steps.max((common / step.max(1)).saturating_add(1));
                }
            }
        }
        if steps > 0 {
            now.insert(s.key.clone(), (targets.iter().map(|(t, _, _)| t.to_string()).collect(), steps));
        }
    }
    // Keys no longer reported by two targets are forgotten; the others add this fetch's steps.
    co_reported.retain(|k, _| now.contains_key(k));
    for (key, (targets, steps)) in now {
        let entry = co_reported.entry(key).or_insert((Vec::new(), 0));
        entry.0 = targets;
        entry.1 = entry.1.saturating_add(steps);
    }
    let mut seen: HashMap<GpuKey, Vec<String>> = HashMap::new();
    for (key, (targets, steps)) in co_reported.iter() {
        if *steps >= 2 {
            for t in targets {
                note_target(&mut seen, key, t);
            }
        }
    }
    twins_of(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pod_holds_at_most_its_cap_of_series_and_a_device_any() {
        let source: Arc<str> = Arc::from("test");
        let gpu = |n: usize, pod: Option<&str>| {
            let key = GpuKey { uuid: format!("GPU-{n}"), gpu_instance: None, pod: pod.map(str::to_string) };
            GpuSeries::with_key(key, (None, None), |_| None, &source)
        };
        let mut per_pod = PerPod::with_cap(2);
        let mut held = Vec::new();
        let tries = [Some("a"), Some("a"), Some("a"), Some("b"), None, Some("b"), Some("b"), None, Some("a"), Some("c")];
        let admitted: Vec<bool> = tries
            .iter()
            .enumerate()
            .map(|(n, pod)| {
                let ok = per_pod.admit(*pod, &held);
                if ok {
                    held.push(gpu(n, *pod));
                }
                ok
            })
            .collect();
        assert_eq!(admitted, [true, true, false, true, true, true, false, true, false, true]);
    }

    #[test]
    fn values_land_on_their_points_in_time_order_whatever_order_they_come_in() {
        let t = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap();
        let mut gpu = GpuSeries::from_labels(|k| (k == "UUID").then_some("GPU-1"), &Arc::from("x"), &Ownership::default()).unwrap();
        gpu.add_values(Field::of("DCGM_FI_PROF_SM_ACTIVE"), [(t(60), 0.5), (t(180), 0.0)].into_iter());
        gpu.add_values(Field::of("DCGM_FI_DEV_GPU_UTIL"), [(t(0), 10.0), (t(60), 100.0), (t(120), 0.0), (t(180), 7.0)].into_iter());
        gpu.add_values(Field::of("DCGM_FI_PROF_SM_ACTIVE"), [(t(180), 0.25), (t(60), 0.1), (t(240), 0.0)].into_iter());
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
        // Only the template's naming: a pod named after a workspace elsewhere is nobody's.
        assert_eq!(find_uuid(&format!("batch-{id}-run7")), None);
        assert_eq!(find_uuid(&format!("xcoder-{id}-abc")), None);
        assert_eq!(find_uuid(&format!("coder-{id}0-abc")), None);
        assert_eq!(find_uuid(&format!("coder-{id}")).as_deref(), Some(id));
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

    /// Twins are counted across fetches: a steady pass fetches one step, and a forged copy
    /// reported beside the real GPU at every step is a twin from its second step on; an exporter
    /// restart (old and new target at one common step, then the old one gone) never is.
    #[test]
    fn twins_are_two_targets_over_two_steps_across_fetches() {
        let series = one_gpu();
        let at = |t: i64, targets: &[&str]| HashMap::from([(0usize, targets.iter().map(|n| (Arc::from(*n), t, t)).collect::<Vec<_>>())]);
        let mut co = HashMap::new();
        assert_eq!(twins_in(&series, at(60, &["a", "forged"]), 60, &mut co).1, 0, "one common step: maybe a restart");
        assert_eq!(twins_in(&series, at(120, &["a", "forged"]), 60, &mut co).1, 1, "two: a twin");
        assert_eq!(twins_in(&series, at(180, &["a"]), 60, &mut co).1, 0, "gone with the copy");
        let mut restart = HashMap::new();
        assert_eq!(twins_in(&series, at(60, &["old", "new"]), 60, &mut restart).1, 0);
        assert_eq!(twins_in(&series, at(120, &["new"]), 60, &mut restart).1, 0, "an exporter restart is no twin");
        assert!(restart.is_empty(), "nothing remembered once one target reports it");
    }

    /// Times from a peer's answer cannot overflow the overlap count.
    #[test]
    fn twins_at_absurd_times_do_not_overflow() {
        let targets = vec![(Arc::from("a"), i64::MIN, i64::MAX), (Arc::from("b"), i64::MIN, i64::MAX)];
        let mut co = HashMap::new();
        assert_eq!(twins_in(&one_gpu(), HashMap::from([(0usize, targets)]), 1, &mut co).1, 1, "a twin, counted without overflow");
    }

    /// One workspace GPU's series, without points.
    fn one_gpu() -> Vec<GpuSeries> {
        let key = GpuKey { uuid: "GPU-1".into(), gpu_instance: None, pod: Some("coder-x".into()) };
        vec![GpuSeries {
            key,
            workspace_id: Some("w".into()),
            namespace: None,
            model: None,
            source: Arc::from("p"),
            attribution: Attribution::Exclusive,
            real_pod_uid: false,
            points: Vec::new(),
        }]
    }
}
