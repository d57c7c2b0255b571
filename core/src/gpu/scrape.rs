//! One exporter body read into one series per GPU as it arrives, chunk by chunk (`ScrapeFold`):
//! no body is held whole or copied, each label set is parsed once per scrape, and what one
//! body may make is bounded whatever it sends (the GPU series cap, the per-pod cap, the label
//! sets remembered).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::expo::{self, Line, LineReader};
use super::signals::{self, Field};
use super::{GpuKey, GpuSeries, Ownership, PerPod, merge_device_level};
use crate::ids::DigestMap;

/// A label set's GPU (its place in the series) and its `pod_uid`: absent, empty
/// (`Some(false)`) or a real UID (`Some(true)`); `None` when it names no GPU.
type Slot = Option<(usize, Option<bool>)>;

/// The bytes of label sets one scrape remembers (each kept twice: by its text and by its place
/// in the first family). A node's 8 GPUs have sets of about 300 bytes; 512 series of MIG or
/// virtual-GPU mode about 150 KB. Past it, sets are parsed line by line.
const MAX_REMEMBERED_SET_BYTES: usize = 1 << 20;

/// Groups exposition samples into one series per GPU (per pod, for shared GPUs), each with one
/// point at `at`, as the body arrives (`feed`, then `finish`).
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
///
/// At most `max_gpus` distinct GPU series are held: a body that names more stops growing there
/// (its other samples are read and dropped) and `finish` says so, so one answer can never hold
/// more than the cap, whatever it sends.
pub struct ScrapeFold<'o> {
    lines: LineReader,
    fold: Fold<'o>,
}

struct Fold<'o> {
    at: DateTime<Utc>,
    source: Arc<str>,
    ownership: &'o Ownership,
    max_gpus: usize,
    /// Each GPU's place in `series`, by a digest of its key (not a second copy of it).
    by_gpu: DigestMap<usize>,
    series: Vec<GpuSeries>,
    /// Each label set read, by its bytes: the GPU it names and whether its `pod_uid` is empty.
    /// Every family repeats a GPU's set, so each is parsed once per scrape. Bounded: past
    /// `max_sets` sets or `MAX_REMEMBERED_SET_BYTES`, sets are parsed line by line.
    by_text: HashMap<Box<[u8]>, Slot>,
    /// The sets of the first family in their order: the families list the GPUs in one order, so
    /// a line's set is most often the one at its place, checked before any hashing.
    by_place: Vec<(Box<[u8]>, Slot)>,
    remembered_bytes: usize,
    max_sets: usize,
    /// The line's place in its family.
    place: usize,
    /// The field the last line's name is read as (an integer value may read a `_RATIO` name as
    /// another field, `signals::read_as`), with that name as the signal table spells it, looked
    /// up once a family.
    as_read: Option<(bool, Option<&'static str>, Field)>,
    label_errors: expo::ParseErrors,
    over: bool,
    per_pod: PerPod,
    /// Per-pod `GPU_UTIL`/`FB_USED` with an empty `pod_uid`: kept only where their GPU has no
    /// device-level series (see above), known once the whole scrape is read. One value per GPU
    /// and field name, so bounded by the series cap.
    maybe_placeholders: HashMap<(usize, &'static str), f64>,
}

/// The exposition names the fold reads (the signals, the energy counter).
fn wanted(name: &str) -> bool {
    signals::lookup(name).is_some() || signals::energy_joules(name, 0.0).is_some()
}

impl<'o> ScrapeFold<'o> {
    pub fn new(at: DateTime<Utc>, source: &Arc<str>, ownership: &'o Ownership, max_gpus: usize) -> Self {
        let fold = Fold {
            at,
            source: source.clone(),
            ownership,
            max_gpus,
            by_gpu: DigestMap::default(),
            series: Vec::new(),
            by_text: HashMap::new(),
            by_place: Vec::new(),
            remembered_bytes: 0,
            max_sets: max_gpus.saturating_mul(8).min(1 << 16),
            place: 0,
            as_read: None,
            label_errors: expo::ParseErrors::default(),
            over: false,
            per_pod: PerPod::default(),
            maybe_placeholders: HashMap::new(),
        };
        ScrapeFold { lines: LineReader::default(), fold }
    }

    /// Reads the lines `chunk` completes.
    pub fn feed(&mut self, chunk: &[u8]) {
        let fold = &mut self.fold;
        self.lines.feed(chunk, &mut wanted, &mut |line| fold.line(line));
    }

    /// Whether the body so far held more than blanks (an exporter reloading sends none).
    pub fn any_text(&self) -> bool {
        self.lines.any_text()
    }

    /// The series, the bad lines, and whether the body named more than `max_gpus` GPUs.
    pub fn finish(self) -> (Vec<GpuSeries>, expo::ParseErrors, bool) {
        let ScrapeFold { lines, mut fold } = self;
        let mut errors = lines.finish(&mut wanted, &mut |line| fold.line(line));
        errors.merge(std::mem::take(&mut fold.label_errors));
        let (series, over) = fold.end();
        (series, errors, over)
    }
}

impl Fold<'_> {
    fn line(&mut self, line: &Line<'_>) {
        if line.new_name {
            self.place = 0;
        }
        let (name, field) = match self.as_read {
            Some((integer, name, field)) if !line.new_name && integer == line.integer => (name, field),
            _ => {
                let read = signals::read_as(line.name(), line.integer);
                let name = signals::NAMES.iter().map(|m| m.name).find(|n| *n == read);
                let field = Field::of(read);
                self.as_read = Some((line.integer, name, field));
                (name, field)
            }
        };
        let place = self.place;
        self.place += 1;
        let known = match self.by_place.get(place) {
            Some((text, slot)) if **text == *line.labels_text => Some(*slot),
            _ => self.by_text.get(line.labels_text).copied(),
        };
        let slot = match known {
            Some(slot) => slot,
            None => match self.read_set(line, place) {
                Some(slot) => slot,
                None => return,
            },
        };
        let Some((i, pod_uid)) = slot else { return };
        // Only a series with a `pod_uid` label needs to know (most have none).
        let per_process = pod_uid.is_some() && field.per_process();
        if per_process && pod_uid == Some(true) {
            if let Some(gpu) = self.series.get_mut(i) {
                gpu.real_pod_uid = true;
            }
        }
        if per_process && pod_uid == Some(false) {
            if let Some(name) = name {
                let v = self.maybe_placeholders.entry((i, name)).or_insert(line.value);
                *v = v.max(line.value);
            }
            return;
        }
        if let Some(gpu) = self.series.get_mut(i) {
            gpu.add_values(field, std::iter::once((self.at, line.value)));
        }
    }

    /// Parses a label set not seen yet: the GPU it names (a new series where the caps allow),
    /// remembered by its bytes; `None` when the set does not parse (a bad line).
    fn read_set(&mut self, line: &Line<'_>, place: usize) -> Option<Slot> {
        let mut labels = Vec::with_capacity(16);
        if let Err(message) = expo::parse_label_set(line.labels_text, &mut labels) {
            self.label_errors.push(expo::ParseError { line: line.number, message });
            return None;
        }
        // dcgm-exporter never writes `exported_*` labels itself (only a Prometheus scrape
        // renames colliding ones): on a scraped body they are a forgery.
        let label = |k: &str| if k.starts_with("exported_") { None } else { expo::label(&labels, k) };
        let ownership = self.ownership;
        let gpu = GpuKey::from_labels(label, ownership).and_then(|key| match self.by_gpu.get(&key) {
            Some(&i) => Some(i),
            None if self.by_gpu.len() >= self.max_gpus => {
                self.over = true;
                None
            }
            None if !self.per_pod.admit(key.pod.as_deref(), &self.series) => None,
            None => {
                self.by_gpu.insert(&key, self.series.len());
                self.series.push(GpuSeries::with_key(key, ownership.owner(label), label, &self.source));
                Some(self.series.len() - 1)
            }
        });
        // `pod_uid`: absent, empty (`Some(false)`) or a real UID (`Some(true)`).
        let slot = gpu.map(|i| (i, label("pod_uid").map(|u| !u.is_empty())));
        let size = line.labels_text.len();
        if self.by_text.len() < self.max_sets && self.remembered_bytes + 2 * size <= MAX_REMEMBERED_SET_BYTES {
            self.remembered_bytes += size;
            self.by_text.insert(line.labels_text.into(), slot);
            if self.by_place.len() == place {
                self.remembered_bytes += size;
                self.by_place.push((line.labels_text.into(), slot));
            }
        }
        Some(slot)
    }

    /// The placeholders kept where their GPU has no device-level series, then the device-level
    /// readings merged into the workload series of their GPU.
    fn end(self) -> (Vec<GpuSeries>, bool) {
        let Fold { mut series, maybe_placeholders, at, over, .. } = self;
        if !maybe_placeholders.is_empty() {
            let device_level: HashSet<(&str, Option<&str>)> =
                series.iter().filter(|s| s.key.pod.is_none()).map(|s| (s.key.uuid.as_str(), s.key.gpu_instance.as_deref())).collect();
            let own: Vec<bool> =
                series.iter().map(|s| !device_level.contains(&(s.key.uuid.as_str(), s.key.gpu_instance.as_deref()))).collect();
            for ((i, name), value) in maybe_placeholders {
                if let Some(gpu) = series.get_mut(i).filter(|_| own.get(i) == Some(&true)) {
                    gpu.add_values(Field::of(name), std::iter::once((at, value)));
                }
            }
        }
        merge_device_level(&mut series);
        (series, over)
    }
}

/// `ScrapeFold` over a whole body, with no cap on the GPU series (the fakes, the tests, the
/// parse bench).
pub fn series_from_exposition(
    text: &str,
    at: DateTime<Utc>,
    source: &Arc<str>,
    ownership: &Ownership,
) -> (Vec<GpuSeries>, expo::ParseErrors) {
    let (series, errors, _) = series_from_exposition_capped(text, at, source, ownership, usize::MAX);
    (series, errors)
}

/// `ScrapeFold` over a whole body, holding at most `max_gpus` distinct GPU series.
pub fn series_from_exposition_capped(
    text: &str,
    at: DateTime<Utc>,
    source: &Arc<str>,
    ownership: &Ownership,
    max_gpus: usize,
) -> (Vec<GpuSeries>, expo::ParseErrors, bool) {
    let mut fold = ScrapeFold::new(at, source, ownership, max_gpus);
    fold.feed(text.as_bytes());
    fold.finish()
}
