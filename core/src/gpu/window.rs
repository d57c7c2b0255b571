//! Per-workspace, per-GPU windows of samples over time, and the figures the decisions need:
//! the latest value per signal, the sample count over a span, first and last sample, the longest gap,
//! since when a GPU has been continuously not compute-active, and since when its energy counter
//! has not risen (frozen data). Readings taken between passes (`--sample-interval`) are merged
//! into one sample per pass, each signal's highest value kept, so a burst seen by any reading
//! counts and memory stays one sample per pass. Memory is bounded: samples older than the
//! longest rule needs are dropped, and so are workspaces that are gone.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};

pub use super::samples::{GpuSample, Samples};
use super::signals::{Signal, SignalValues};
use super::{Attribution, GpuKey, GpuSeries, Point};
pub use super::{DEFAULT_MAX_GPUS_PER_WORKSPACE, MAX_GPUS_PER_WORKSPACE};
use crate::coder_id::CoderId;
use crate::ids::IdMap;

#[derive(Debug, Clone, PartialEq)]
pub struct GpuWindow {
    /// Shared with the status document's summary of this GPU (`Arc`: one copy of its strings).
    pub key: Arc<GpuKey>,
    pub model: Option<Arc<str>>,
    pub source: Arc<str>,
    /// The source that reported this GPU failed in the latest pass: its data is not current.
    pub source_failed: bool,
    /// Whose utilization and memory the samples carry (the latest series' word).
    pub attribution: Attribution,
    /// Oldest first, 40 bytes each (`Samples`).
    pub samples: Samples,
    /// Readings since the last pass, merged (each signal's highest value). Boxed: only exporter
    /// readings wait here between passes; behind Prometheus each step is a sample at once, and
    /// every window would hold 40 bytes more for nothing.
    pending: Option<Box<GpuSample>>,
    /// Frozen-data tracking over raw readings: the latest energy counter, and since when it has
    /// not risen. Without the counter there is no tracking: an idle GPU's other readings do not
    /// change either, so "nothing changed" cannot tell frozen from idle (reference dcgm NOTES §10).
    last_energy: Option<f64>,
    unchanged_since: Option<DateTime<Utc>>,
}

impl GpuWindow {
    pub fn new(key: GpuKey, source: Arc<str>) -> Self {
        GpuWindow {
            key: Arc::new(key),
            model: None,
            source,
            source_failed: false,
            attribution: Attribution::Exclusive,
            samples: Samples::default(),
            pending: None,
            last_energy: None,
            unchanged_since: None,
        }
    }

    /// One raw reading from a source: merged into the pass's pending sample, and tracked for
    /// frozen data. A powered GPU's energy counter always rises; when it has not, the exporter or
    /// the hostengine is serving cached values. A reading without the counter switches the
    /// tracking off until the counter comes back.
    pub fn add_reading(&mut self, at: DateTime<Utc>, values: SignalValues, energy: Option<f64>) {
        self.track_energy(at, energy);
        match &mut self.pending {
            Some(p) => **p = GpuSample { at: at.max(p.at), values: p.values.max(values) },
            None => self.pending = Some(Box::new(GpuSample { at, values })),
        }
    }

    /// One reading that is a sample of its own (a step of Prometheus history): `add_reading`
    /// then `flush`, without boxing a reading only to take it out again.
    pub fn add_step(&mut self, at: DateTime<Utc>, values: SignalValues, energy: Option<f64>) {
        if self.pending.is_some() {
            self.add_reading(at, values, energy);
            self.flush();
        } else {
            self.track_energy(at, energy);
            self.push(GpuSample { at, values });
        }
    }

    fn track_energy(&mut self, at: DateTime<Utc>, energy: Option<f64>) {
        match energy {
            Some(now) => {
                if self.last_energy.is_none_or(|before| now > before) || self.unchanged_since.is_none() {
                    self.unchanged_since = Some(at);
                }
                self.last_energy = Some(now);
            }
            None => {
                self.last_energy = None;
                self.unchanged_since = None;
            }
        }
    }

    /// Ends a pass: the merged readings since the last pass become one sample.
    pub fn flush(&mut self) {
        if let Some(p) = self.pending.take() {
            self.push(*p);
        }
    }

    /// Since when the energy counter has not risen; `None` without the counter (frozen
    /// detection off for this GPU) or before any raw reading.
    pub fn unchanged_since(&self) -> Option<DateTime<Utc>> {
        self.unchanged_since
    }

    pub fn push(&mut self, sample: GpuSample) {
        self.samples.push(sample);
    }

    pub fn first_at(&self) -> Option<DateTime<Utc>> {
        self.samples.front().map(|s| s.at)
    }
    pub fn last_at(&self) -> Option<DateTime<Utc>> {
        self.samples.back().map(|s| s.at)
    }
    pub fn latest(&self) -> Option<GpuSample> {
        self.samples.back()
    }
    /// The latest sample's values.
    pub fn latest_values(&self) -> Option<&SignalValues> {
        self.samples.back_values()
    }

    /// The values of the samples at or after `t`, oldest first.
    pub fn values_since(&self, t: DateTime<Utc>) -> impl Iterator<Item = &SignalValues> + '_ {
        self.samples.values_since(t)
    }

    pub fn count_since(&self, t: DateTime<Utc>) -> usize {
        self.samples.count_since(t)
    }

    pub fn latest_value(&self, signal: Signal) -> Option<f64> {
        self.samples.values().rev().find_map(|v| v.get(signal))
    }

    /// The longest time between consecutive samples at or after `t`, counting from the last
    /// sample before `t` when there is one, and up to `now`.
    pub fn longest_gap(&self, t: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
        self.samples.longest_gap(t, now)
    }

    /// The time of the first sample after the last active one: since then the GPU has been
    /// continuously not active (`Samples::idle_since`).
    pub fn idle_since(&self, is_active: impl Fn(&SignalValues) -> bool, max_gap: Duration) -> Option<DateTime<Utc>> {
        self.samples.idle_since(is_active, max_gap)
    }
}

/// A workspace's GPU windows. A workspace has a handful of GPUs, so a `Vec` (a map's empty node
/// alone is ~2 KB) searched in order; past `INDEX_FROM` windows (a hostile or misconfigured
/// exporter can put thousands of series on one pod) a key index keeps each lookup constant-time.
#[derive(Debug, Default)]
struct WorkspaceWindows {
    windows: Vec<GpuWindow>,
    index: HashMap<Arc<GpuKey>, usize>,
    /// The latest time a series for this workspace was refused because it already had
    /// `max_per_workspace` windows: then it is judged on none of them (see `refused_at`).
    refused_at: Option<DateTime<Utc>>,
    /// When a GPU with another `UUID` first appeared on a pod that already had a GPU with
    /// samples, within this session: a pod cannot gain a device without a restart, so the new
    /// one is a copy (forged, where the store lets others write) and the workspace is judged on
    /// none of them until its next build (`changed_at`).
    changed_at: Option<DateTime<Utc>>,
    /// Every (pod, UUID) seen this session, the first `MAX_KNOWN` (a window pruned after a long
    /// gap comes back as a GPU the pod had, not a new one), as 8-byte fingerprints keyed by
    /// `Windows::fingerprints`, not two copies of the strings.
    known: Vec<u64>,
}

/// GPUs remembered per workspace session for `changed_at`.
const MAX_KNOWN: usize = 64;

const INDEX_FROM: usize = 8;

/// A GPU whose first point comes this long after another GPU of the same pod was first sampled
/// appeared mid-session (`changed_at`): the GPUs of one pod arrive in the same scrape or step, and
/// this leaves room for a missed one or two.
pub const NEW_GPU_AFTER: Duration = Duration::minutes(2);

impl WorkspaceWindows {
    fn position(&self, key: &GpuKey) -> Option<usize> {
        if self.windows.len() > INDEX_FROM { self.index.get(key).copied() } else { self.windows.iter().position(|w| *w.key == *key) }
    }

    fn push(&mut self, window: GpuWindow) -> usize {
        // Most workspaces have one GPU: no room for four up front (a window is ~300 bytes).
        if self.windows.is_empty() {
            self.windows.reserve_exact(1);
        }
        self.windows.push(window);
        let n = self.windows.len();
        if n == INDEX_FROM + 1 {
            self.index = self.windows.iter().enumerate().map(|(i, w)| (w.key.clone(), i)).collect();
        } else if n > INDEX_FROM + 1 {
            self.index.insert(self.windows[n - 1].key.clone(), n - 1);
        }
        n - 1
    }

    fn retain(&mut self, keep: impl FnMut(&mut GpuWindow) -> bool) {
        let before = self.windows.len();
        self.windows.retain_mut(keep);
        if self.windows.len() != before {
            self.index = if self.windows.len() > INDEX_FROM {
                self.windows.iter().enumerate().map(|(i, w)| (w.key.clone(), i)).collect()
            } else {
                HashMap::new()
            };
        }
    }
}

/// What `Windows` holds of one workspace (`Windows::of`).
#[derive(Debug, Clone, Copy, Default)]
pub struct WindowsOf<'a> {
    /// Its windows (`None`: none was ever recorded this session, or all were pruned with it).
    pub windows: Option<&'a [GpuWindow]>,
    pub refused_at: Option<DateTime<Utc>>,
    pub changed_at: Option<DateTime<Utc>>,
}

/// All windows, keyed by workspace id.
#[derive(Debug, Default)]
pub struct Windows {
    retain: Duration,
    /// Samples a window holds at most (the look-back over the interval): reserved up front,
    /// so a full window costs no more than its samples.
    capacity: usize,
    by_workspace: IdMap<CoderId, WorkspaceWindows>,
    max_per_workspace: usize,
    /// Keys of the (pod, UUID) fingerprints, random per process: nobody who writes series can
    /// make a new GPU's fingerprint match a known one.
    fingerprints: std::collections::hash_map::RandomState,
    /// The GPU models named so far, each held once and shared by its windows (a fleet has a
    /// handful; a copy per window was 48 bytes a GPU). Past `MAX_MODELS` a window holds its own.
    models: Vec<Arc<str>>,
}

/// Models `Windows` shares at most: a label is what a peer writes, and a search of this list is
/// made for each new window.
const MAX_MODELS: usize = 32;

/// `name` as one of `models`, shared (added while there are fewer than `MAX_MODELS`).
fn shared_model(models: &mut Vec<Arc<str>>, name: &str) -> Arc<str> {
    if let Some(known) = models.iter().find(|m| m.as_ref() == name) {
        return known.clone();
    }
    let model: Arc<str> = Arc::from(name);
    if models.len() < MAX_MODELS {
        models.push(model.clone());
    }
    model
}

impl Windows {
    /// `retain`: the longest span any rule looks back (plus a margin); `interval`: between samples.
    pub fn new(retain: Duration, interval: std::time::Duration) -> Self {
        let per_window = retain.to_std().map_or(64, |r| (r.as_secs_f64() / interval.as_secs_f64().max(0.001)).ceil() as usize + 2);
        Windows {
            retain,
            capacity: per_window.clamp(4, 4096),
            by_workspace: IdMap::default(),
            max_per_workspace: DEFAULT_MAX_GPUS_PER_WORKSPACE,
            fingerprints: Default::default(),
            models: Vec::new(),
        }
    }

    /// At most `n` windows per workspace (`max_gpus_per_workspace`, up to `MAX_GPUS_PER_WORKSPACE`).
    pub fn with_max_per_workspace(mut self, n: usize) -> Self {
        self.max_per_workspace = n.clamp(1, MAX_GPUS_PER_WORKSPACE);
        self
    }

    /// Adds a series' points from `from` on to its workspace's window: merged into one sample
    /// until the pass flushes (exporter readings), or, with `steps`, each its own sample (the
    /// steps of Prometheus history). A series with no workspace, or no point from `from` on,
    /// is ignored.
    pub fn record(&mut self, series: &GpuSeries, from: Option<DateTime<Utc>>, steps: bool) {
        self.record_points(series, &series.points, from, steps);
    }

    /// `record`, with some of the series' points (`points`) instead of all: a backtest hands a
    /// pass the steps up to its time out of a longer fetch, without copying the series.
    pub fn record_points(&mut self, series: &GpuSeries, points: &[Point], from: Option<DateTime<Utc>>, steps: bool) {
        let Some(ws) = &series.workspace_id else { return };
        let all = points;
        let mut points = all.iter().filter(|p| from.is_none_or(|f| p.at >= f)).peekable();
        if points.peek().is_none() {
            return;
        }
        // Looked up before inserting: most passes find it, and need no copy of the id.
        let gpus = match self.by_workspace.get_mut(ws.as_str()) {
            Some(gpus) => gpus,
            None => self.by_workspace.entry(ws.clone()).or_default(),
        };
        let index = match gpus.position(&series.key) {
            Some(i) => i,
            // No pod has this many GPUs: a source naming more for one workspace gets no more
            // windows, whatever it sends, and the workspace is judged on none (no known key
            // is evicted, and no subset decides).
            None if gpus.windows.len() >= self.max_per_workspace => {
                let latest = all.iter().map(|p| p.at).max();
                gpus.refused_at = gpus.refused_at.max(latest);
                return;
            }
            None => {
                // Another GPU of the same pod sampled before this one's first point: it appeared
                // mid-session (the GPUs of one pod arrive in the same scrape, or the same steps).
                let (pod, first) = (series.key.pod.as_deref(), all.iter().map(|p| p.at).min());
                let fingerprint = std::hash::BuildHasher::hash_one(&self.fingerprints, (pod, series.key.uuid.as_str()));
                let seen = gpus.known.contains(&fingerprint);
                if !seen && gpus.known.len() < MAX_KNOWN {
                    gpus.known.push(fingerprint);
                }
                let appeared = !seen
                    && gpus.windows.iter().any(|w| {
                        pod.is_some()
                            && w.key.pod.as_deref() == pod
                            && w.key.uuid != series.key.uuid
                            && w.first_at().zip(first).is_some_and(|(oldest, first)| first - oldest > NEW_GPU_AFTER)
                    });
                if appeared {
                    gpus.changed_at = gpus.changed_at.or(first);
                }
                let mut w = GpuWindow::new(series.key.clone(), series.source.clone());
                w.samples.reserve_exact(self.capacity);
                gpus.push(w)
            }
        };
        let window = &mut gpus.windows[index];
        window.source = series.source.clone();
        window.attribution = series.attribution;
        if window.model.is_none() {
            window.model = series.model.as_deref().map(|name| shared_model(&mut self.models, name));
        }
        for p in points {
            if steps {
                window.add_step(p.at, p.values, p.energy_joules);
            } else {
                window.add_reading(p.at, p.values, p.energy_joules);
            }
        }
    }

    /// Ends a pass: every window's readings since the last pass become one sample.
    pub fn flush(&mut self) {
        for window in self.by_workspace.values_mut().flat_map(|g| g.windows.iter_mut()) {
            window.flush();
        }
    }

    /// Flags every GPU last reported by a source that failed this pass (and clears the rest).
    pub fn mark_failed_sources(&mut self, failed: &HashSet<&str>) {
        for window in self.by_workspace.values_mut().flat_map(|g| g.windows.iter_mut()) {
            window.source_failed = failed.contains(window.source.as_ref());
        }
    }

    /// Drops samples older than the retention and workspaces that are no longer running
    /// (`live` answers whether a workspace is listed).
    pub fn prune(&mut self, now: DateTime<Utc>, live: impl Fn(&str) -> bool) {
        let cutoff = now - self.retain;
        self.by_workspace.retain(|ws, gpus| {
            if !live(ws.as_str()) {
                return false;
            }
            gpus.retain(|w| {
                w.samples.drop_before(cutoff);
                !w.samples.is_empty()
            });
            gpus.refused_at = gpus.refused_at.filter(|t| *t >= cutoff);
            !gpus.windows.is_empty() || gpus.refused_at.is_some() || gpus.changed_at.is_some()
        });
    }

    /// Drops a workspace's history (a new build is a new session: new pod, fresh idle clock).
    pub fn forget(&mut self, workspace_id: &str) {
        self.by_workspace.remove(workspace_id);
    }

    pub fn get(&self, workspace_id: &str) -> Option<&[GpuWindow]> {
        self.of(workspace_id).windows
    }

    /// `get`, `refused_at` and `changed_at` in one lookup (a pass reads all three of every
    /// listed workspace).
    pub fn of(&self, workspace_id: &str) -> WindowsOf<'_> {
        self.by_workspace.get(workspace_id).map_or_else(WindowsOf::default, |g| WindowsOf {
            windows: Some(g.windows.as_slice()),
            refused_at: g.refused_at,
            changed_at: g.changed_at,
        })
    }

    /// The latest time a GPU series naming this workspace was refused for being one too many
    /// (within the retention).
    pub fn refused_at(&self, workspace_id: &str) -> Option<DateTime<Utc>> {
        self.of(workspace_id).refused_at
    }

    /// When a GPU with a new `UUID` appeared on a pod that had others with samples, within this
    /// session (`forget` at a new build clears it).
    pub fn changed_at(&self, workspace_id: &str) -> Option<DateTime<Utc>> {
        self.of(workspace_id).changed_at
    }

    pub fn workspace_count(&self) -> usize {
        self.by_workspace.len()
    }

    pub fn sample_count(&self) -> usize {
        self.by_workspace.values().flat_map(|g| g.windows.iter()).map(|w| w.samples.len()).sum()
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn util(v: f64) -> SignalValues {
        SignalValues::default().with(Signal::GpuUtil, v)
    }

    #[test]
    fn a_step_is_a_reading_flushed_at_once() {
        // (seconds, utilization, energy counter): a rise, a frozen counter, none, a rise again.
        let steps = [(0, 0.5, Some(10.0)), (60, 0.0, Some(10.0)), (120, 0.9, None), (180, 0.2, Some(11.0))];
        for waiting in [false, true] {
            let (mut stepped, mut flushed) = (window(&[]), window(&[]));
            if waiting {
                // An exporter reading taken before the steps: merged into the first.
                for w in [&mut stepped, &mut flushed] {
                    w.add_reading(t(-30), util(0.75), Some(9.0));
                }
            }
            for (s, u, energy) in steps {
                stepped.add_step(t(s), util(u), energy);
                flushed.add_reading(t(s), util(u), energy);
                flushed.flush();
            }
            assert_eq!(stepped, flushed, "waiting: {waiting}");
            assert_eq!(stepped.samples.len(), 4);
            assert_eq!(stepped.samples.front().map(|s| s.values.get(Signal::GpuUtil)), Some(Some(if waiting { 0.75 } else { 0.5 })));
            assert_eq!(stepped.unchanged_since(), Some(t(180)));
        }
    }

    fn window(points: &[(i64, f64)]) -> GpuWindow {
        let mut w = GpuWindow::new(GpuKey { uuid: "GPU-1".into(), gpu_instance: None, pod: None }, Arc::from("x"));
        for (s, v) in points {
            w.push(GpuSample { at: t(*s), values: util(*v) });
        }
        w
    }

    #[test]
    fn gap_detection_includes_the_time_since_the_last_sample() {
        let w = window(&[(0, 0.0), (60, 0.0), (300, 0.0), (360, 0.0)]);
        assert_eq!(w.longest_gap(t(0), t(360)).num_seconds(), 240);
        assert_eq!(w.longest_gap(t(300), t(360)).num_seconds(), 240, "the gap into the span counts");
        assert_eq!(w.longest_gap(t(330), t(360)).num_seconds(), 60);
        assert_eq!(w.longest_gap(t(0), t(900)).num_seconds(), 540, "silence up to now is a gap");
    }

    #[test]
    fn continuous_idle_clock_restarts_on_activity() {
        let active = |v: &SignalValues| v.get(Signal::GpuUtil).unwrap_or(0.0) >= 0.05;
        let gap = Duration::seconds(180);
        assert_eq!(window(&[(0, 0.0), (60, 0.0)]).idle_since(active, gap), Some(t(0)));
        assert_eq!(window(&[(0, 0.0), (60, 0.9), (120, 0.0), (180, 0.0)]).idle_since(active, gap), Some(t(120)));
        assert_eq!(window(&[(0, 0.0), (60, 0.9)]).idle_since(active, gap), None);
        assert_eq!(window(&[]).idle_since(active, gap), None);
        assert_eq!(
            window(&[(0, 0.0), (60, 0.0), (600, 0.0), (660, 0.0)]).idle_since(active, gap),
            Some(t(600)),
            "a hole restarts the clock"
        );
    }

    #[test]
    fn readings_between_passes_merge_into_one_sample_that_keeps_every_burst() {
        let mut w = GpuWindow::new(GpuKey { uuid: "GPU-1".into(), gpu_instance: None, pod: None }, Arc::from("x"));
        for (s, v) in [(0, 0.0), (15, 0.9), (30, 0.0), (45, 0.0)] {
            w.add_reading(t(s), util(v), None);
        }
        w.flush();
        w.flush();
        assert_eq!(w.samples.len(), 1, "one sample per pass");
        let first = w.samples.front().unwrap();
        assert_eq!(first.at, t(45));
        assert!((first.values.get(Signal::GpuUtil).unwrap() - 0.9).abs() < 1e-6, "the burst at 15 s is kept");
    }

    #[test]
    fn frozen_readings_are_noticed_by_the_energy_counter_alone() {
        let mut w = GpuWindow::new(GpuKey { uuid: "GPU-1".into(), gpu_instance: None, pod: None }, Arc::from("x"));
        assert_eq!(w.unchanged_since(), None);
        // An idle GPU with a live hostengine: same utilization, energy rising.
        for s in 0..5 {
            w.add_reading(t(s * 60), util(0.0), Some(1_000.0 + s as f64 * 1_458.0));
        }
        assert_eq!(w.unchanged_since(), Some(t(240)));
        // Frozen: the counter stops.
        for s in 5..9 {
            w.add_reading(t(s * 60), util(0.0), Some(1_000.0 + 4.0 * 1_458.0));
        }
        assert_eq!(w.unchanged_since(), Some(t(240)), "unchanged since the counter last rose");
        // Without the counter an idle GPU's readings stand still too: no tracking at all.
        let mut w = GpuWindow::new(GpuKey { uuid: "GPU-2".into(), gpu_instance: None, pod: None }, Arc::from("x"));
        for s in 0..5 {
            w.add_reading(t(s * 60), util(0.0).with(Signal::PowerWatts, 24.3), None);
        }
        assert_eq!(w.unchanged_since(), None);
        // The counter dropped (a trimmed counters file after a reload): tracking stops.
        let mut w = GpuWindow::new(GpuKey { uuid: "GPU-3".into(), gpu_instance: None, pod: None }, Arc::from("x"));
        w.add_reading(t(0), util(0.0), Some(1_000.0));
        w.add_reading(t(60), util(0.0), None);
        assert_eq!(w.unchanged_since(), None);
    }

    #[test]
    fn duplicate_and_older_samples_are_ignored() {
        let w = window(&[(0, 0.0), (60, 0.5), (60, 0.9), (30, 0.9)]);
        assert_eq!(w.samples.len(), 2);
        assert_eq!(w.latest_value(Signal::GpuUtil), Some(0.5));
    }

    /// One GPU's series with one idle point at `at`.
    fn series(uuid: &str, workspace: &str, at: i64) -> GpuSeries {
        GpuSeries {
            key: GpuKey { uuid: uuid.into(), gpu_instance: None, pod: None },
            workspace_id: Some(workspace.into()),
            namespace: None,
            model: None,
            source: Arc::from("x"),
            attribution: Attribution::Exclusive,
            real_pod_uid: false,
            points: vec![crate::gpu::Point { at: t(at), values: util(0.0), energy_joules: None }],
        }
    }

    #[test]
    fn windows_of_one_model_share_its_name_and_past_the_cap_each_holds_its_own() {
        let mut ws = Windows::new(Duration::seconds(600), std::time::Duration::from_secs(10));
        let of_model = |i: usize, model: &str| GpuSeries { model: Some(model.into()), ..series(&format!("GPU-{i}"), &format!("w{i}"), 0) };
        ws.record(&of_model(0, "NVIDIA A10G"), None, true);
        ws.record(&of_model(1, "NVIDIA A10G"), None, true);
        for i in 0..MAX_MODELS + 1 {
            ws.record(&of_model(2 + i, &format!("model {i}")), None, true);
        }
        let model = |i: usize| ws.get(&format!("w{i}")).and_then(|w| w[0].model.clone()).unwrap();
        assert!(Arc::ptr_eq(&model(0), &model(1)), "one name for both");
        assert_eq!(ws.models.len(), MAX_MODELS);
        let last = model(2 + MAX_MODELS);
        assert_eq!(&*last, format!("model {MAX_MODELS}"), "past the cap, still its own name");
        assert!(!ws.models.iter().any(|m| Arc::ptr_eq(m, &last)));
    }

    #[test]
    fn many_series_on_one_workspace_are_found_by_key_and_capped() {
        let mut ws =
            Windows::new(Duration::seconds(600), std::time::Duration::from_secs(10)).with_max_per_workspace(MAX_GPUS_PER_WORKSPACE);
        let reading = |i: usize, at: i64| series(&format!("GPU-{i}"), "a", at);
        for at in [0, 10] {
            for i in 0..20_000 {
                ws.record(&reading(i, at), None, false);
            }
            ws.flush();
        }
        let gpus = ws.get("a").unwrap();
        assert_eq!(gpus.len(), MAX_GPUS_PER_WORKSPACE, "a source naming 20,000 GPUs for one pod gets 64 windows");
        assert!(gpus.iter().all(|w| w.samples.len() == 2), "each series kept its own window");
        assert!(gpus.iter().enumerate().all(|(i, w)| w.key.uuid == format!("GPU-{i}")), "the first ones, found again by key");
        ws.prune(t(605), |id| id == "a");
        assert_eq!(ws.sample_count(), MAX_GPUS_PER_WORKSPACE, "the first samples aged out");
        ws.record(&reading(7, 20), None, false);
        ws.flush();
        assert_eq!(ws.get("a").unwrap()[7].samples.len(), 2, "the index still finds keys after pruning");
        assert_eq!(ws.refused_at("a"), Some(t(10)), "the series refused are remembered, so nothing judges a subset");
        ws.prune(t(611), |id| id == "a");
        assert_eq!(ws.refused_at("a"), None, "until they age out like samples");
    }

    #[test]
    fn a_workspace_with_one_series_too_many_keeps_its_known_ones_and_says_so() {
        let mut ws = Windows::new(Duration::seconds(600), std::time::Duration::from_secs(10));
        for i in 0..DEFAULT_MAX_GPUS_PER_WORKSPACE {
            ws.record(&series(&format!("GPU-{i:02}"), "a", 0), None, false);
        }
        assert_eq!(ws.refused_at("a"), None);
        // A forged key that sorts first evicts nobody.
        ws.record(&series("GPU-00-forged", "a", 10), None, false);
        ws.flush();
        let keys: Vec<&str> = ws.get("a").unwrap().iter().map(|w| w.key.uuid.as_str()).collect();
        assert_eq!(keys.len(), DEFAULT_MAX_GPUS_PER_WORKSPACE);
        assert!(!keys.contains(&"GPU-00-forged"));
        assert_eq!(ws.refused_at("a"), Some(t(10)));
    }

    #[test]
    fn memory_stays_bounded_and_gone_workspaces_are_dropped() {
        let mut ws = Windows::new(Duration::seconds(600), std::time::Duration::from_secs(10));
        for i in 0..10_000 {
            for id in ["a", "b"] {
                ws.record(&series("GPU-1", id, i * 10), None, false);
            }
            ws.flush();
            ws.prune(t(i * 10), |id| ["a", "b"].contains(&id));
        }
        assert_eq!(ws.sample_count(), 2 * 61, "600 s of 10 s samples per GPU, inclusive");
        ws.prune(t(100_000), |id| id == "a");
        assert_eq!(ws.workspace_count(), 1);
        assert!(ws.get("b").is_none());
    }
}
