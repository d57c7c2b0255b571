//! Canonical GPU signals. dcgm-exporter's metric names changed in 4.9 (DCGM 4.7 names) and some
//! units with them (utilization percent -> ratio, framebuffer MiB -> bytes). Every known name,
//! old and new, maps here to one signal in one unit: ratios 0..1, MiB, watts. Negative and
//! non-finite values are no reading. The energy counter (for frozen-data detection) is kept
//! apart, in f64: a counter since driver load outgrows an f32's precision.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// `DCGM_FI_DEV_GPU_UTIL`: any kernel running; reads 100% for a one-thread kernel.
    GpuUtil,
    /// `DCGM_FI_PROF_SM_ACTIVE`: share of SMs busy; the honest compute signal.
    SmActive,
    /// `DCGM_FI_PROF_GR_ENGINE_ACTIVE`: graphics/compute engine busy; like utilization.
    GrEngineActive,
    TensorActive,
    DramActive,
    /// Framebuffer memory in use, MiB.
    FbUsedMib,
    /// Board power, W. Decided on only through the optional `active_power_watts` veto.
    PowerWatts,
    /// Video encoder busy (ratio): work the compute engines do not show.
    EncUtil,
    /// Video decoder busy (ratio).
    DecUtil,
}

pub const SIGNAL_COUNT: usize = 9;

impl Signal {
    pub const ALL: [Signal; SIGNAL_COUNT] = [
        Signal::GpuUtil,
        Signal::SmActive,
        Signal::GrEngineActive,
        Signal::TensorActive,
        Signal::DramActive,
        Signal::FbUsedMib,
        Signal::PowerWatts,
        Signal::EncUtil,
        Signal::DecUtil,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::GpuUtil => "gpu_util",
            Signal::SmActive => "sm_active",
            Signal::GrEngineActive => "gr_engine_active",
            Signal::TensorActive => "tensor_active",
            Signal::DramActive => "dram_active",
            Signal::FbUsedMib => "fb_used_mib",
            Signal::PowerWatts => "power_watts",
            Signal::EncUtil => "enc_util",
            Signal::DecUtil => "dec_util",
        }
    }

    /// A per-process field in virtual-GPU mode (`process_metrics.go`: `GPU_UTIL` and `FB_USED`
    /// only): a pod's copy is the pod's processes', not the device's (reference dcgm NOTES §10).
    pub fn per_process(self) -> bool {
        matches!(self, Signal::GpuUtil | Signal::FbUsedMib)
    }

    /// Every exporter metric name that carries this signal (for Prometheus queries).
    pub fn metric_names(self) -> impl Iterator<Item = &'static str> {
        NAMES.iter().filter(move |m| m.signal == self).map(|m| m.name)
    }
}

/// One exporter metric name and how to turn its value into the canonical unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mapping {
    pub name: &'static str,
    pub signal: Signal,
    /// Multiply the raw value by this.
    pub scale: f64,
}

impl Mapping {
    /// The value in the canonical unit, or `None` for no reading (negative, NaN, infinite).
    /// `DCGM_FI_DEV_GPU_UTIL_RATIO` is an integer percent in DCGM 4.6 (field 203, an alias) and
    /// a 0..1 ratio in 4.7 (field 1613): a value above 1 is a percent (and an integer written
    /// bare is one too: see `read_as`). The same for the video engines' ratio names.
    pub fn normalise(&self, raw: f64) -> Option<f64> {
        if !raw.is_finite() || raw < 0.0 {
            return None;
        }
        let v = raw * self.scale;
        let ratio_name = self.name.ends_with("_UTIL_RATIO") && matches!(self.signal, Signal::GpuUtil | Signal::EncUtil | Signal::DecUtil);
        Some(if ratio_name && v > 1.0 { v / 100.0 } else { v })
    }
}

/// The energy counter, by each name dcgm-exporter gives it, with the factor to joules:
/// `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (field 156, mJ since driver load; the default CSV) and
/// its DCGM 4.7 name `DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL` (field 1611, J; go-dcgm 4.6.1
/// `dcgm_fields.h`, exporter 4.9; reference dcgm NOTES §10 "Energy").
pub const ENERGY_NAMES: [(&str, f64); 2] = [("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0.001), ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1.0)];

/// The energy counter in joules when `name` is one of its names (`Some(None)` for a broken value).
pub fn energy_joules(name: &str, raw: f64) -> Option<Option<f64>> {
    match Field::of(name) {
        Field::Energy { to_joules } => Some(Field::joules(raw, to_joules)),
        _ => None,
    }
}

/// An exporter field as a point takes its values, its name looked up once: a fetch's answer or
/// a scrape's family names one field for many values, and a name is compared with every known
/// one only here, not once per value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Field {
    /// A signal, and how its values become the canonical unit.
    Signal(Mapping),
    /// The energy counter, and the factor from its unit to joules.
    Energy { to_joules: f64 },
    /// A field no decision reads.
    Unread,
}

impl Field {
    pub fn of(name: &str) -> Field {
        if let Some((_, to_joules)) = ENERGY_NAMES.iter().find(|(n, _)| *n == name) {
            return Field::Energy { to_joules: *to_joules };
        }
        lookup(name).map_or(Field::Unread, Field::Signal)
    }

    /// Whether a pod's copy of this field is its processes' only (`Signal::per_process`).
    pub fn per_process(self) -> bool {
        matches!(self, Field::Signal(m) if m.signal.per_process())
    }

    /// The counter in joules, or `None` for no reading (negative, NaN, infinite).
    fn joules(raw: f64, to_joules: f64) -> Option<f64> {
        (raw.is_finite() && raw >= 0.0).then_some(raw * to_joules)
    }

    /// A raw value as a point keeps it: the signal's, normalised, or the energy counter's in joules.
    pub fn read(self, raw: f64) -> Option<Reading> {
        match self {
            Field::Signal(m) => m.normalise(raw).map(|v| Reading::Signal(m.signal, v)),
            Field::Energy { to_joules } => Some(Reading::Energy(Field::joules(raw, to_joules))),
            Field::Unread => None,
        }
    }
}

/// One value of a `Field`, in its canonical unit (`Energy(None)`: the counter read no number).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reading {
    Signal(Signal, f64),
    Energy(Option<f64>),
}

const MIB: f64 = 1024.0 * 1024.0;

/// Legacy names come from dcgm-exporter's `etc/default-counters.csv` (pre-4.9). The renamed ones
/// come from go-dcgm's `dcgm_fields.h` (DCGM 4.6.1 "Deprecated: renamed" block) and the 4.9.0
/// release notes; `DCGM_FI_DEV_FB_USED_BYTES` follows the notes' "GPU memory from MiB to bytes"
/// and is not verified against a real 4.9 exporter.
pub const NAMES: &[Mapping] = &[
    Mapping { name: "DCGM_FI_DEV_GPU_UTIL", signal: Signal::GpuUtil, scale: 0.01 },
    Mapping { name: "DCGM_FI_DEV_GPU_UTIL_RATIO", signal: Signal::GpuUtil, scale: 1.0 },
    Mapping { name: "DCGM_FI_PROF_SM_ACTIVE", signal: Signal::SmActive, scale: 1.0 },
    Mapping { name: "DCGM_FI_PROF_SM_UTIL_RATIO", signal: Signal::SmActive, scale: 1.0 },
    Mapping { name: "DCGM_FI_PROF_GR_ENGINE_ACTIVE", signal: Signal::GrEngineActive, scale: 1.0 },
    Mapping { name: "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", signal: Signal::GrEngineActive, scale: 1.0 },
    Mapping { name: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", signal: Signal::TensorActive, scale: 1.0 },
    Mapping { name: "DCGM_FI_PROF_TENSOR_UTIL_RATIO", signal: Signal::TensorActive, scale: 1.0 },
    Mapping { name: "DCGM_FI_PROF_DRAM_ACTIVE", signal: Signal::DramActive, scale: 1.0 },
    Mapping { name: "DCGM_FI_PROF_DRAM_UTIL_RATIO", signal: Signal::DramActive, scale: 1.0 },
    Mapping { name: "DCGM_FI_DEV_FB_USED", signal: Signal::FbUsedMib, scale: 1.0 },
    Mapping { name: "DCGM_FI_DEV_FB_USED_BYTES", signal: Signal::FbUsedMib, scale: 1.0 / MIB },
    Mapping { name: "DCGM_FI_DEV_POWER_USAGE", signal: Signal::PowerWatts, scale: 1.0 },
    Mapping { name: "DCGM_FI_DEV_BOARD_POWER_WATTS", signal: Signal::PowerWatts, scale: 1.0 },
    // In the default counters file (percent); DCGM 4.6.1 keeps these names (not in its
    // deprecated block). Their exporter 4.9 names are not known (reference dcgm NOTES §11.5):
    // the `_RATIO` spellings follow the 4.9 release notes' move of default fields to 0-1 ratios
    // and the other renames, are not verified, and a value above 1 is read as a percent.
    Mapping { name: "DCGM_FI_DEV_ENC_UTIL", signal: Signal::EncUtil, scale: 0.01 },
    Mapping { name: "DCGM_FI_DEV_DEC_UTIL", signal: Signal::DecUtil, scale: 0.01 },
    Mapping { name: "DCGM_FI_DEV_ENC_UTIL_RATIO", signal: Signal::EncUtil, scale: 1.0 },
    Mapping { name: "DCGM_FI_DEV_DEC_UTIL_RATIO", signal: Signal::DecUtil, scale: 1.0 },
];

/// The name an exposition value is read under: `DCGM_FI_DEV_GPU_UTIL_RATIO` written as an
/// integer is DCGM 4.6's field 203, the integer percent under its new name (go-dcgm
/// `dcgm_fields.h`: `#define DCGM_FI_DEV_GPU_UTIL DCGM_FI_DEV_GPU_UTIL_RATIO // 203`; reference
/// dcgm NOTES §11.5), so a `1` there is 1 %, read as the legacy percent field. A 4.7 ratio is a
/// double, written with six decimals. (Behind Prometheus the text is gone: a `1` there is read
/// as the ratio, 100 %, the side that keeps a workspace.)
pub fn read_as(name: &str, integer: bool) -> &str {
    match name {
        "DCGM_FI_DEV_GPU_UTIL_RATIO" if integer => "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_ENC_UTIL_RATIO" if integer => "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL_RATIO" if integer => "DCGM_FI_DEV_DEC_UTIL",
        _ => name,
    }
}

pub fn lookup(name: &str) -> Option<Mapping> {
    // All names share the prefix; a cheap first check keeps non-DCGM lines fast.
    if !name.starts_with("DCGM_FI_") {
        return None;
    }
    NAMES.iter().find(|m| m.name == name).copied()
}

/// One reading of every signal of one GPU, in the canonical units; absent signals are `None`.
/// Stored as `f32` with NaN for "absent" (36 bytes, not 144): windows hold tens of samples per
/// GPU, and f32 is exact enough for ratios, MiB and watts.
#[derive(Debug, Clone, Copy)]
pub struct SignalValues([f32; SIGNAL_COUNT]);

impl Default for SignalValues {
    fn default() -> Self {
        SignalValues([f32::NAN; SIGNAL_COUNT])
    }
}

impl PartialEq for SignalValues {
    fn eq(&self, other: &Self) -> bool {
        self.0.iter().zip(&other.0).all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

impl SignalValues {
    pub fn get(&self, s: Signal) -> Option<f64> {
        let v = self.0[s.index()];
        (!v.is_nan()).then_some(f64::from(v))
    }

    /// The best compute signal the sample has, and its value: SM_ACTIVE, else GR_ENGINE_ACTIVE,
    /// else utilization. The one statement of that rule (decisions, contradictions, sparklines).
    pub fn compute(&self) -> Option<(Signal, f64)> {
        [Signal::SmActive, Signal::GrEngineActive, Signal::GpuUtil].into_iter().find_map(|s| self.get(s).map(|v| (s, v)))
    }
    /// Records a finite, non-negative value (anything else is no reading).
    pub fn set(&mut self, s: Signal, v: f64) {
        if v.is_finite() && v >= 0.0 {
            self.0[s.index()] = v as f32;
        }
    }

    /// The larger of the two readings of each signal (a burst in either is kept).
    pub fn max(self, other: SignalValues) -> SignalValues {
        let mut out = self;
        for s in Signal::ALL {
            if let Some(v) = other.get(s) {
                if self.get(s).is_none_or(|mine| v > mine) {
                    out.set(s, v);
                }
            }
        }
        out
    }
    /// Forgets a signal (no reading).
    pub fn clear(&mut self, s: Signal) {
        self.0[s.index()] = f32::NAN;
    }

    pub fn with(mut self, s: Signal, v: f64) -> Self {
        self.set(s, v);
        self
    }
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|v| v.is_nan())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_and_renamed_names_normalise_to_one_unit() {
        let pct = lookup("DCGM_FI_DEV_GPU_UTIL").unwrap();
        let ratio = lookup("DCGM_FI_DEV_GPU_UTIL_RATIO").unwrap();
        assert_eq!(pct.signal, ratio.signal);
        assert_eq!(100.0 * pct.scale, 1.0 * ratio.scale);
        let mib = lookup("DCGM_FI_DEV_FB_USED").unwrap();
        let bytes = lookup("DCGM_FI_DEV_FB_USED_BYTES").unwrap();
        assert_eq!(19376.0 * mib.scale, 19376.0 * MIB * bytes.scale);
        assert_eq!(lookup("DCGM_FI_PROF_SM_UTIL_RATIO").unwrap().signal, Signal::SmActive);
        assert_eq!(lookup("DCGM_FI_DEV_SM_CLOCK"), None);
        assert_eq!(lookup("up"), None);
    }

    #[test]
    fn values_round_trip_and_absent_is_none() {
        let v = SignalValues::default().with(Signal::SmActive, 0.012).with(Signal::FbUsedMib, 19376.0).with(Signal::PowerWatts, f64::NAN);
        assert_eq!(v.get(Signal::FbUsedMib), Some(19376.0));
        assert!((v.get(Signal::SmActive).unwrap() - 0.012).abs() < 1e-7);
        assert_eq!(v.get(Signal::PowerWatts), None);
        assert_eq!(v.get(Signal::GpuUtil), None);
        assert!(SignalValues::default().is_empty() && !v.is_empty());
        assert_eq!(std::mem::size_of::<SignalValues>(), 36);
    }

    #[test]
    fn every_signal_has_a_name() {
        for s in Signal::ALL {
            let want = if matches!(s, Signal::EncUtil | Signal::DecUtil) { 1 } else { 2 };
            assert!(s.metric_names().count() >= want, "{s:?} needs legacy and renamed names");
        }
    }

    #[test]
    fn broken_values_are_no_reading_and_a_ratio_above_one_is_a_percent() {
        let ratio = lookup("DCGM_FI_DEV_GPU_UTIL_RATIO").unwrap();
        assert_eq!(ratio.normalise(0.42), Some(0.42), "DCGM 4.7: a ratio");
        assert_eq!(ratio.normalise(42.0), Some(0.42), "DCGM 4.6: the alias of field 203, a percent");
        let util = lookup("DCGM_FI_DEV_GPU_UTIL").unwrap();
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(util.normalise(bad), None, "{bad}");
        }
        assert_eq!(SignalValues::default().with(Signal::SmActive, -0.5).get(Signal::SmActive), None);
        assert_eq!(energy_joules("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 5_000.0), Some(Some(5.0)));
        assert_eq!(energy_joules("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", f64::NAN), Some(None));
        assert_eq!(energy_joules("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 5.0), Some(Some(5.0)), "DCGM 4.7: joules");
        assert_eq!(energy_joules("DCGM_FI_DEV_POWER_USAGE", 1.0), None);
        let a = SignalValues::default().with(Signal::SmActive, 0.9);
        let b = SignalValues::default().with(Signal::SmActive, 0.1).with(Signal::FbUsedMib, 300.0);
        let m = a.max(b);
        assert_eq!((m.get(Signal::FbUsedMib), m.get(Signal::SmActive).map(|v| (v * 10.0).round())), (Some(300.0), Some(9.0)));
    }
}
