//! The answer fold: a `query_range` answer read as it streams in (`read_answer`: the envelope
//! checked, each series' labels borrowed from the bytes where they can be), and folded per GPU
//! and step into series (`Fold`), within a budget of points and remembered labels.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};

use crate::json_split::{OnElement, Splitter};
use reclaimer_core::gpu::signals::Field;
use reclaimer_core::gpu::{GpuKey, GpuSeries, Ownership, PerPod, Point};
use reclaimer_core::ids::{DigestMap, Digests, IdMap};
use reclaimer_core::json_read::{ReadError, Reader, malformed, read_at_start, read_whole};

use super::query::QuerySpec;

/// What one fetch's points of workspace series may hold besides `GPUS_PER_LISTED_WORKSPACE`
/// per listed workspace (the points of a GPU's series, before the windows take them): 10,000
/// GPUs over the default 34 steps take 22 MB.
pub const MAX_POINTS_BYTES: usize = 64 << 20;
/// Room for this many GPUs' points per listed workspace, over `MAX_POINTS_BYTES`.
pub(super) const GPUS_PER_LISTED_WORKSPACE: usize = 2;
/// What one fetch's points of series of no workspace pod may hold (device-level series).
pub(super) const DEVICE_POINTS_BYTES: usize = 16 << 20;
/// What one point costs (`Point`: its time, nine f32 readings, the energy counter).
pub const POINT_BYTES: usize = std::mem::size_of::<Point>();

/// Room for points reserved per GPU at most (more steps grow as they come).
pub(super) const MAX_STEPS_RESERVED: usize = 1024;

/// What one fetch may spend remembering label sets: 65,536 sets (10,000 GPUs take 640 KB).
pub(super) const MAX_REMEMBERED_BYTES: usize = 4 << 20;
/// What remembering a label set costs: its digest, what it names, the hash table's slot and
/// slack (so that no answer can grow the memo past its bound).
pub(super) const REMEMBERED_ENTRY_BYTES: usize = 64;

/// The label sets one fetch has read, by a digest of their bytes, and what each names: every
/// query of a fetch names a GPU with the same labels (`max_over_time` drops the metric name), so
/// a set is parsed (and its GPU looked up) once a fetch, not once per field.
///
/// A set is remembered by its 128-bit keyed digest (`reclaimer_core::ids::Digests`, which says
/// what a collision takes), not its bytes: they cost 250 bytes a GPU (2.5 MB a fetch at 10,000),
/// and a fetch's memory is its peak.
pub(super) struct LabelMemo {
    keys: Digests,
    known: IdMap<(u64, u64), Named>,
    /// Bytes left (each set charged `REMEMBERED_ENTRY_BYTES`); past them sets are parsed each time.
    budget: usize,
}

/// What a label set names, as a fetch remembers it.
#[derive(Debug, Clone)]
pub(super) enum Named {
    /// A GPU held: its place in `series`, a real `pod_uid`, its scrape target.
    Gpu(Known),
    /// A series of a workspace the listing does not name (its id): noted when a field has a
    /// point at the latest step (`Collection::unlisted`).
    Unlisted(Box<str>),
    /// Nothing held, whatever the field.
    Nothing,
    /// Nothing held for this field: a device's series, read for a field it is not held for (the
    /// fields of a fetch are folded in any order, and a per-process field judges it again).
    NotForThisField,
}

impl LabelMemo {
    pub(super) fn new(budget: usize) -> Self {
        LabelMemo { keys: Digests::default(), known: IdMap::default(), budget }
    }

    fn digest(&self, bytes: &[u8]) -> (u64, u64) {
        self.keys.of(bytes)
    }

    /// What the set names for a field (`per_process`), if it was remembered for it.
    fn get(&self, digest: (u64, u64), per_process: bool) -> Option<&Named> {
        self.known.get(&digest).filter(|named| !(per_process && matches!(named, Named::NotForThisField)))
    }

    /// Remembers what a set names, each charged `REMEMBERED_ENTRY_BYTES` and the id it holds.
    fn remember(&mut self, digest: (u64, u64), named: Named) {
        let cost = REMEMBERED_ENTRY_BYTES + if let Named::Unlisted(id) = &named { id.len() } else { 0 };
        if let Some(slot) = self.known.get_mut(&digest) {
            *slot = named;
        } else if let Some(left) = self.budget.checked_sub(cost) {
            self.budget = left;
            self.known.insert(digest, named);
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.known.len()
    }
}

/// One series of a `query_range` answer: its labels and its points (`None`: a value that is not
/// a number). The labels borrow from the answer's bytes where they have no escapes.
#[derive(Debug, Default)]
pub struct Series<'a> {
    pub metric: Labels<'a>,
    pub values: Vec<(f64, Option<f64>)>,
}

/// A series' labels, in the order sent (a dozen at most: a list is cheaper than a map).
#[derive(Debug, Default)]
pub struct Labels<'a>(pub Vec<(Text<'a>, Text<'a>)>);

impl Labels<'_> {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k.0 == name).map(|(_, v)| v.0.as_ref())
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Labels<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Labels<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of label names to values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Labels<'a>, A::Error> {
                let mut labels = Vec::new();
                while let Some(pair) = map.next_entry::<Text<'a>, Text<'a>>()? {
                    labels.push(pair);
                }
                Ok(Labels(labels))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// A string as the answer holds it: borrowed, or owned when it had escapes to undo.
#[derive(Debug)]
pub struct Text<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

/// Where a `query_range` answer's series are: split off one by one as they stream in.
pub(super) const RESULT: &[&str] = &["data", "result"];

/// An answer without its series.
#[derive(Deserialize)]
pub(super) struct Envelope {
    pub(super) status: String,
    #[serde(default)]
    pub(super) data: Option<ResultType>,
    #[serde(default, rename = "errorType")]
    pub(super) error_type: String,
    #[serde(default)]
    pub(super) error: String,
}

#[derive(Deserialize)]
pub(super) struct ResultType {
    #[serde(rename = "resultType")]
    pub(super) result_type: String,
}

pub(super) fn not_prometheus(status: u16) -> String {
    format!("HTTP {status}: not a Prometheus API response")
}

/// One series of an answer as the fold reads it: its labels' bytes, undecoded (a pass's queries
/// name the same GPUs with the same labels: they are read once per pass), and its points. The
/// checks serde_json makes on what it reads (a point is `[time, "value"]`; tested against it).
pub(super) fn read_series<'a>(status: u16, bytes: &'a [u8], points: &mut Vec<(f64, Option<f64>)>) -> Result<&'a [u8], String> {
    read_whole(bytes, |r| read_series_from(r, points)).map_err(|_| not_prometheus(status))
}

/// `read_series` from a reader, which may run out of bytes (`Incomplete`).
pub(super) fn read_series_from<'a>(r: &mut Reader<'a>, points: &mut Vec<(f64, Option<f64>)>) -> Result<&'a [u8], ReadError> {
    points.clear();
    let mut metric: Option<&[u8]> = None;
    let mut seen_values = false;
    r.object(|r, key| match key {
        b"metric" if metric.is_none() => r.raw().map(|raw| metric = Some(raw)),
        b"values" if !seen_values => {
            seen_values = true;
            r.array(|r| {
                let mut point = (None, None);
                r.array(|r| match point {
                    (None, _) => r.f64().map(|t| point.0 = Some(t)),
                    (Some(_), None) if r.null()? => malformed("a null sample value"),
                    (Some(_), None) => {
                        let value = match r.string() {
                            Ok(text) => sample_value(&text),
                            Err(ReadError::Incomplete) => return Err(ReadError::Incomplete),
                            Err(_) => Some(r.f64()?),
                        };
                        point.1 = Some(value);
                        Ok(())
                    }
                    _ => malformed("a point of more than two values"),
                })?;
                match point {
                    (Some(t), Some(v)) => {
                        points.push((t, v));
                        Ok(())
                    }
                    _ => malformed("a point of fewer than two values"),
                }
            })
        }
        b"metric" | b"values" => malformed("a duplicate field"),
        _ => r.skip(),
    })?;
    Ok(metric.unwrap_or(b"{}"))
}

/// A sample value as Prometheus writes it (`"0"`, `"24.3"`, `"NaN"`): what `f64::from_str`
/// reads, the common small integers without it.
pub(super) fn sample_value(text: &str) -> Option<f64> {
    match text.as_bytes() {
        [d] if d.is_ascii_digit() => Some(f64::from(d - b'0')),
        _ => text.parse().ok(),
    }
}

/// An answer's series folded as they are split off: most read where they begin in a chunk.
pub(super) struct SeriesInto<'f> {
    pub(super) status: u16,
    pub(super) spec: QuerySpec,
    pub(super) fold: &'f Mutex<Fold>,
    pub(super) points: Vec<(f64, Option<f64>)>,
}

impl SeriesInto<'_> {
    pub(super) fn fold(&mut self, metric: &[u8]) -> Result<(), String> {
        let mut fold = self.fold.lock().unwrap_or_else(|p| p.into_inner());
        fold.add_read(self.spec, metric, &self.points)?;
        // Past the cap: stop reading this answer (the pass fails for this source anyway).
        if fold.over { Err(format!("more than {} distinct GPU series", fold.max_series)) } else { Ok(()) }
    }
}

impl OnElement for SeriesInto<'_> {
    fn element(&mut self, bytes: &[u8]) -> Result<(), String> {
        let metric = read_series(self.status, bytes, &mut self.points)?;
        self.fold(metric)
    }

    fn element_at_start(&mut self, bytes: &[u8]) -> Result<Option<usize>, String> {
        match read_at_start(bytes, |r| read_series_from(r, &mut self.points)) {
            Ok(Some((metric, used))) => self.fold(metric).map(|()| Some(used)),
            Ok(None) => Ok(None),
            Err(_) => Err(not_prometheus(self.status)),
        }
    }
}

/// Hands each series of an answer to a function, labels decoded (`PrometheusSource::query_each`).
pub(super) struct EachSeries<'f> {
    pub(super) status: u16,
    pub(super) on_series: &'f mut (dyn FnMut(Series<'_>) + Send),
    pub(super) values: Vec<(f64, Option<f64>)>,
}

impl OnElement for EachSeries<'_> {
    fn element(&mut self, bytes: &[u8]) -> Result<(), String> {
        let metric = read_series(self.status, bytes, &mut self.values)?;
        let metric = serde_json::from_slice(metric).map_err(|_| not_prometheus(self.status))?;
        (self.on_series)(Series { metric, values: std::mem::take(&mut self.values) });
        Ok(())
    }
}

/// Judges an answer by its envelope (the document without its series): a `matrix`, or what
/// went wrong.
pub(super) fn check_envelope(status: u16, rest: &[u8]) -> Result<(), String> {
    let envelope: Envelope = serde_json::from_slice(rest).map_err(|_| not_prometheus(status))?;
    if envelope.status != "success" || !(200..300).contains(&status) {
        let why = format!("{} {}", envelope.error_type, envelope.error);
        return Err(format!("HTTP {status}: {}", why.trim()).trim_end_matches([':', ' ']).to_string());
    }
    match envelope.data.map(|d| d.result_type).as_deref() {
        Some("matrix") => Ok(()),
        Some(other) => Err(format!("expected a matrix, got {other}")),
        None => Err("success without data".into()),
    }
}

/// Decodes a whole `query_range` answer, handing each series of its `matrix` to `on_series`; or
/// says what went wrong (then the series handed on are to be discarded). The service reads
/// answers as they stream in (`read_split` into the fold), with the same `read_series`; this
/// reads one slice, and decodes each series' labels too. Never panics, whatever the bytes.
pub fn read_answer(status: u16, body: &[u8], on_series: &mut dyn FnMut(Series<'_>)) -> Result<(), String> {
    let mut splitter = Splitter::new(RESULT, crate::http::MAX_PIECE);
    let mut values = Vec::new();
    splitter.feed(body, &mut |bytes: &[u8]| {
        let metric = read_series(status, bytes, &mut values)?;
        let metric = serde_json::from_slice(metric).map_err(|_| not_prometheus(status))?;
        on_series(Series { metric, values: std::mem::take(&mut values) });
        Ok(())
    })?;
    let rest = splitter.finish().map_err(|_| not_prometheus(status))?;
    check_envelope(status, &rest)
}

/// One pass's answers, folded per GPU and step as they stream in.
/// What a label set says once parsed: its series (its place in `series`), whether it carries a
/// real `pod_uid`, and its scrape target (`instance`).
pub(super) type Known = (usize, bool, Arc<str>);

/// The listed workspaces whose series a fetch holds (`PrometheusSource::want`), by digest.
pub(super) type Wanted = DigestMap<()>;

pub(super) struct Fold {
    pub(super) source: Arc<str>,
    pub(super) ownership: Ownership,
    /// Steps fetched: each GPU's room for points, reserved once.
    pub(super) steps: usize,
    /// Each GPU's place in `series`, by a digest of its key (not a second copy of it).
    pub(super) index: DigestMap<usize>,
    pub(super) series: Vec<GpuSeries>,
    /// At most this many series; `over` once an answer named more (nothing more is created).
    pub(super) max_series: usize,
    pub(super) over: bool,
    /// Each pod's series (at most `MAX_SERIES_PER_POD`: one pod never fails the source).
    pub(super) per_pod: PerPod,
    /// The step, seconds: points are kept only on the grid `span.0 + k * step_secs`.
    pub(super) step_secs: i64,
    /// The slice being fetched (unix seconds): its answers' points must lie in it.
    pub(super) slice: (i64, i64),
    /// The time of each step of the slice (`set_slice`), made once, not once per point.
    pub(super) slice_times: Vec<DateTime<Utc>>,
    /// Points this fetch may still create for workspace series: `MAX_POINTS_BYTES`, and room for
    /// `POINTS_PER_LISTED_WORKSPACE` GPUs of each listed workspace over the fetch's steps (memory
    /// follows the fleet, whatever the series).
    pub(super) points_left: usize,
    /// Points left for series of no workspace pod (`DEVICE_POINTS_BYTES`), and how many of
    /// them are held (at most `max_series`).
    pub(super) device_points_left: usize,
    pub(super) device_series: usize,
    /// Per workspace series (its place in `series`): each scrape target (`instance`) that
    /// reported it, with its first and last step (at most four targets).
    pub(super) instances: IdMap<usize, Vec<(Arc<str>, i64, i64)>>,
    /// The workspaces whose series are held (the pass's listing); `None`: every one.
    pub(super) wanted: Option<Arc<Wanted>>,
    /// Workspaces the listing does not name whose series have a point at the latest step.
    pub(super) unlisted: Vec<String>,
    /// The steps asked for (unix seconds): points outside are dropped, so no answer can grow a
    /// series past the steps of the pass.
    pub(super) span: (i64, i64),
    /// The label sets read this fetch, and the GPU each names.
    pub(super) memo: LabelMemo,
}

/// The most bytes of an `instance` or `job` label kept (a scrape target is `host:port`; a forged
/// one of a megabyte must not reach the status document and the page a megabyte at a time).
pub(super) const MAX_INSTANCE_BYTES: usize = 128;

/// `label` cut to `MAX_INSTANCE_BYTES` at a character boundary, marked when cut.
pub(super) fn bounded(label: &str) -> std::borrow::Cow<'_, str> {
    if label.len() <= MAX_INSTANCE_BYTES {
        return std::borrow::Cow::Borrowed(label);
    }
    let mut end = MAX_INSTANCE_BYTES;
    while !label.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}… ({} bytes)", &label[..end], label.len()))
}

impl Fold {
    /// The slice of steps the next answers are for (unix seconds, on the step grid).
    pub(super) fn set_slice(&mut self, from: i64, to: i64) {
        self.slice = (from, to);
        let step = self.step_secs.max(1);
        let steps = usize::try_from((to - from) / step + 1).unwrap_or(0).min(MAX_STEPS_RESERVED);
        self.slice_times.clear();
        self.slice_times.extend((0..steps as i64).map_while(|k| DateTime::from_timestamp(from + k * step, 0)));
    }

    /// One series of an answer (`read_series`'s labels and points).
    pub(super) fn add_read(&mut self, spec: QuerySpec, metric: &[u8], points: &[(f64, Option<f64>)]) -> Result<(), String> {
        let field = Field::of(spec.name);
        let per_process = field.per_process();
        let digest = self.memo.digest(metric);
        let named = match self.memo.get(digest, per_process) {
            Some(named) => named.clone(),
            None => {
                // Not serde's message: it quotes the peer's text (up to a whole piece of it).
                let labels: Labels<'_> =
                    serde_json::from_slice(metric).map_err(|_| "a series' labels are not a map of strings".to_string())?;
                let named = match self.gpu_of(&labels, per_process) {
                    Some(i) => {
                        let real_pod_uid = labels.get("pod_uid").is_some_and(|u| !u.is_empty());
                        // A copy without a target label is a target of its own (a remote write).
                        Named::Gpu((i, real_pod_uid, Arc::from(bounded(labels.get("instance").unwrap_or("(no instance)")))))
                    }
                    None => match self.unlisted_workspace(&labels) {
                        Some(id) => Named::Unlisted(id.into_boxed_str()),
                        None if per_process => Named::Nothing,
                        None => Named::NotForThisField,
                    },
                };
                self.memo.remember(digest, named.clone());
                named
            }
        };
        let (i, real_pod_uid, instance) = match named {
            Named::Gpu(known) => known,
            Named::Unlisted(id) => {
                self.note_unlisted(&id, points);
                return Ok(());
            }
            Named::Nothing | Named::NotForThisField => return Ok(()),
        };
        let Some(gpu) = self.series.get_mut(i) else { return Ok(()) };
        // A device's series is held for the per-process fields only (`gpu_of`), also when its
        // set was remembered from one of them: the fields come in any order.
        if gpu.key.pod.is_none() && !per_process {
            return Ok(());
        }
        if real_pod_uid && per_process {
            gpu.real_pod_uid = true;
        }
        // Only the steps of the slice asked for: a point off the step grid, or outside the
        // slice, is no answer to this query (Prometheus writes every point at start + k * step),
        // and is dropped, so no answer can grow a series past the steps asked for.
        let (start, end) = self.slice;
        let grid = self.span.0;
        let step = self.step_secs.max(1);
        let on_grid = |t: f64| t.fract() == 0.0 && (start as f64..=end as f64).contains(&t) && (t as i64 - grid) % step == 0;
        let times = &self.slice_times;
        let time_of = |t: i64| times.get(usize::try_from((t - start) / step).ok()?).copied().or_else(|| DateTime::from_timestamp(t, 0));
        let values = points.iter().filter(|(t, _)| on_grid(*t)).filter_map(|(t, v)| Some((time_of(*t as i64)?, (*v)?)));
        // Charged by the room the points take (a series' room was charged when it was made).
        let before = gpu.points.capacity();
        if gpu.workspace_id.is_some() {
            let times = points.iter().map(|(t, _)| *t).filter(|t| on_grid(*t)).map(|t| t as i64);
            if let (Some(first), Some(last)) = (times.clone().min(), times.max()) {
                let targets = self.instances.entry(i).or_default();
                if let Some((_, a, b)) = targets.iter_mut().find(|(t, _, _)| *t == instance) {
                    (*a, *b) = ((*a).min(first), (*b).max(last));
                } else if targets.len() < 4 {
                    targets.push((instance, first, last));
                }
            }
        }
        gpu.add_values(field, values);
        let added = gpu.points.capacity().saturating_sub(before);
        let device = gpu.key.pod.is_none();
        let left = if device { &mut self.device_points_left } else { &mut self.points_left };
        match left.checked_sub(added) {
            Some(l) => *left = l,
            // A device's series over its budget loses its points (its workspaces read their
            // own copies, and a sharer without it is unknown); a workspace's fails the fetch.
            None if device => {
                *left = 0;
                gpu.points.clear();
                gpu.points.shrink_to_fit();
            }
            None => {
                return Err(format!(
                    "the answers hold more points of listed workspaces than {} MiB at {POINT_BYTES} bytes each: shorten the look-back, or narrow the queries with prometheus_selector",
                    MAX_POINTS_BYTES >> 20
                ));
            }
        }
        Ok(())
    }

    /// The workspace a workload series names when the listing does not name it.
    fn unlisted_workspace(&self, labels: &Labels<'_>) -> Option<String> {
        let wanted = self.wanted.as_ref()?;
        let key = GpuKey::from_labels(|k| labels.get(k), &self.ownership)?;
        let (Some(_), (Some(id), _)) = (key.pod, self.ownership.owner(|k| labels.get(k))) else { return None };
        (!wanted.contains(id.as_str())).then_some(id)
    }

    /// A series of a workspace the listing does not name, with a point at the latest step: its
    /// pod reports a GPU now (`Collection::unlisted`, the first `outside::MAX_FOLLOWED`).
    fn note_unlisted(&mut self, id: &str, points: &[(f64, Option<f64>)]) {
        let latest = points.iter().any(|(t, v)| v.is_some() && *t == self.span.1 as f64);
        if latest && self.unlisted.len() < crate::pass::outside::MAX_FOLLOWED && !self.unlisted.iter().any(|u| u == id) {
            self.unlisted.push(id.to_string());
        }
    }

    /// The GPU a label set names (its place in `series`, made when new), if any. A series of no
    /// workspace pod (a device's own) is held only for the per-process fields, the only ones
    /// read from it, and never fails the fetch: past its own budget it is not held.
    pub(super) fn gpu_of(&mut self, labels: &Labels<'_>, per_process: bool) -> Option<usize> {
        let key = GpuKey::from_labels(|k| labels.get(k), &self.ownership)?;
        let owner = self.ownership.owner(|k| labels.get(k));
        if key.pod.is_some() {
            // A workload series of a workspace the listing does not name is nobody's: not held.
            if let Some(wanted) = &self.wanted {
                if owner.0.as_deref().is_none_or(|id| !wanted.contains(id)) {
                    return None;
                }
            }
        } else if !per_process {
            return None;
        }
        match self.index.get(&key) {
            Some(&i) => Some(i),
            None if key.pod.is_none() && (self.device_series >= self.max_series || self.device_points_left == 0) => None,
            None if key.pod.is_some() && self.series.len() - self.device_series >= self.max_series => {
                self.over = true;
                None
            }
            None if !self.per_pod.admit(key.pod.as_deref(), &self.series) => None,
            None => {
                let mut new = GpuSeries::with_key(key, owner, |k| labels.get(k), &self.source);
                let left = if new.key.pod.is_none() { &mut self.device_points_left } else { &mut self.points_left };
                let room = self.steps.min(*left);
                *left -= room;
                new.points.reserve_exact(room);
                if new.key.pod.is_none() {
                    self.device_series += 1;
                }
                self.index.insert(&new.key, self.series.len());
                self.series.push(new);
                Some(self.series.len() - 1)
            }
        }
    }
}
