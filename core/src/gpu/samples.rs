//! One GPU window's samples, oldest first, stored compactly: a sample's time is kept as
//! milliseconds after the ring's base (4 bytes) instead of chrono's 12, so a sample is 40 bytes,
//! not 48. At 10,000 GPUs with a 30-minute look-back that is about 3 MB less held for as long as
//! the service runs. Times are read back exactly to the millisecond (Prometheus's own
//! precision); a time finer than that is rounded up, later, which never makes a GPU look idle
//! for longer than it was. The figures the rules need (counts, gaps, the idle clock) are worked
//! out on the stored milliseconds, without turning each sample back into a date.

use std::collections::VecDeque;

use chrono::{DateTime, Duration, Utc};

use super::signals::SignalValues;

/// One sample of a GPU: when, and every signal's value then.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuSample {
    pub at: DateTime<Utc>,
    pub values: SignalValues,
}

/// A sample as the ring stores it: its time as milliseconds after the ring's base.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stored {
    after_base_ms: u32,
    values: SignalValues,
}

/// The longest span one ring holds: a `u32` of milliseconds, about 49 days. No rule looks back
/// a fraction of that; a sample that far after the oldest held drops the older ones.
const SPAN_MS: i64 = u32::MAX as i64;

/// A window's samples, strictly increasing in time.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// The time offsets count from (the first sample kept, until a rebase).
    base: DateTime<Utc>,
    ring: VecDeque<Stored>,
}

/// Equal when they hold the same samples, whatever base each counts from.
impl PartialEq for Samples {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

/// `d` in whole milliseconds, rounded up (toward later times).
fn ceil_ms(d: Duration) -> i64 {
    let ms = d.num_milliseconds();
    if d > Duration::milliseconds(ms) { ms + 1 } else { ms }
}

/// `ms` milliseconds after `base`; at chrono's last time when that is past it (a time rounded up
/// to the millisecond can be, by less than one).
fn after(base: DateTime<Utc>, ms: u32) -> DateTime<Utc> {
    base.checked_add_signed(Duration::milliseconds(i64::from(ms))).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

impl Samples {
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Room for `n` samples in all, reserved once (a full window costs no more than its samples).
    pub fn reserve_exact(&mut self, n: usize) {
        self.ring.reserve_exact(n.saturating_sub(self.ring.len()));
    }

    fn at(&self, s: &Stored) -> DateTime<Utc> {
        after(self.base, s.after_base_ms)
    }

    fn sample(&self, s: &Stored) -> GpuSample {
        GpuSample { at: self.at(s), values: s.values }
    }

    pub fn front(&self) -> Option<GpuSample> {
        self.ring.front().map(|s| self.sample(s))
    }

    pub fn back(&self) -> Option<GpuSample> {
        self.ring.back().map(|s| self.sample(s))
    }

    /// The `i`th sample's values, without its time.
    pub fn values_at(&self, i: usize) -> Option<&SignalValues> {
        self.ring.get(i).map(|s| &s.values)
    }

    /// The latest sample's values, without its time.
    pub fn back_values(&self) -> Option<&SignalValues> {
        self.ring.back().map(|s| &s.values)
    }

    /// The latest sample's values, to change in place (tests that bend one reading).
    pub fn back_values_mut(&mut self) -> Option<&mut SignalValues> {
        self.ring.back_mut().map(|s| &mut s.values)
    }

    /// Every sample, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = GpuSample> + '_ {
        self.ring.iter().map(|s| self.sample(s))
    }

    /// Every sample's values, oldest first.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &SignalValues> + '_ {
        self.ring.iter().map(|s| &s.values)
    }

    /// The offset a time `t` is at or before, as a bound on stored offsets: a sample is at or
    /// after `t` exactly when its offset is at least this.
    fn first_offset_from(&self, t: DateTime<Utc>) -> i64 {
        ceil_ms(t - self.base)
    }

    /// The values of the samples at or after `t`, oldest first.
    pub fn values_since(&self, t: DateTime<Utc>) -> impl Iterator<Item = &SignalValues> + '_ {
        let from = self.first_offset_from(t);
        self.ring.iter().filter(move |s| i64::from(s.after_base_ms) >= from).map(|s| &s.values)
    }

    /// Appends a sample later than every one held; an earlier or equal one is ignored (already
    /// held: Prometheus returns overlapping ranges). Returns whether it was kept.
    pub fn push(&mut self, sample: GpuSample) -> bool {
        let Some(last) = self.ring.back() else {
            self.base = sample.at;
            self.ring.push_back(Stored { after_base_ms: 0, values: sample.values });
            return true;
        };
        let mut offset = ceil_ms(sample.at - self.base);
        if offset <= i64::from(last.after_base_ms) {
            return false;
        }
        if offset > SPAN_MS {
            offset = self.rebase(sample.at);
        }
        self.ring.push_back(Stored { after_base_ms: offset as u32, values: sample.values });
        true
    }

    /// Moves the base to the oldest sample still within `SPAN_MS` of `at` (dropping any older)
    /// and returns `at`'s offset from the new base.
    fn rebase(&mut self, at: DateTime<Utc>) -> i64 {
        let oldest_kept = ceil_ms(at - self.base) - SPAN_MS;
        while self.ring.front().is_some_and(|s| i64::from(s.after_base_ms) < oldest_kept) {
            self.ring.pop_front();
        }
        let Some(shift) = self.ring.front().map(|s| s.after_base_ms) else {
            self.base = at;
            return 0;
        };
        self.base = after(self.base, shift);
        for s in &mut self.ring {
            s.after_base_ms -= shift;
        }
        ceil_ms(at - self.base)
    }

    /// Drops the samples before `cutoff`.
    pub fn drop_before(&mut self, cutoff: DateTime<Utc>) {
        let from = self.first_offset_from(cutoff);
        while self.ring.front().is_some_and(|s| i64::from(s.after_base_ms) < from) {
            self.ring.pop_front();
        }
    }

    /// How many samples are at or after `t`.
    pub fn count_since(&self, t: DateTime<Utc>) -> usize {
        let from = self.first_offset_from(t);
        self.ring.iter().rev().take_while(|s| i64::from(s.after_base_ms) >= from).count()
    }

    /// The longest time between consecutive samples at or after `t`, counting from the last
    /// sample before `t` when there is one, and up to `now`.
    pub fn longest_gap(&self, t: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
        let from = self.first_offset_from(t);
        let mut prev: Option<u32> = None;
        let mut longest_ms = 0u32;
        for s in &self.ring {
            if i64::from(s.after_base_ms) >= from {
                if let Some(p) = prev {
                    longest_ms = longest_ms.max(s.after_base_ms - p);
                }
            }
            prev = Some(s.after_base_ms);
        }
        let longest = Duration::milliseconds(i64::from(longest_ms));
        match self.ring.back() {
            Some(last) => longest.max(now - self.at(last)),
            None => longest,
        }
    }

    /// The time of the first sample after the last active one: since then the GPU has been
    /// continuously not active. `None` when the latest sample is active or there are none.
    /// With no active sample at all, the first sample's time (idle for at least that long).
    /// A hole longer than `max_gap` between two samples restarts the clock: nobody knows what
    /// ran in it.
    pub fn idle_since(&self, is_active: impl Fn(&SignalValues) -> bool, max_gap: Duration) -> Option<DateTime<Utc>> {
        let mut idle_from: Option<&Stored> = None;
        let mut prev: Option<u32> = None;
        for s in &self.ring {
            if prev.is_some_and(|p| Duration::milliseconds(i64::from(s.after_base_ms - p)) > max_gap) {
                idle_from = None;
            }
            prev = Some(s.after_base_ms);
            if is_active(&s.values) {
                idle_from = None;
            } else if idle_from.is_none() {
                idle_from = Some(s);
            }
        }
        idle_from.map(|s| self.at(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::signals::Signal;

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    fn sample(at: DateTime<Utc>, util: f64) -> GpuSample {
        GpuSample { at, values: SignalValues::default().with(Signal::GpuUtil, util) }
    }

    /// The README's memory bound counts samples at this size.
    #[test]
    fn a_stored_sample_is_40_bytes() {
        assert_eq!(std::mem::size_of::<Stored>(), 40);
    }

    #[test]
    fn times_read_back_to_the_millisecond_and_finer_ones_round_later() {
        let mut s = Samples::default();
        let fine = t(1_500) + Duration::nanoseconds(1);
        for at in [t(0), t(1_000), fine, t(15_000) + Duration::microseconds(999_001)] {
            assert!(s.push(sample(at, 0.0)));
        }
        let times: Vec<DateTime<Utc>> = s.iter().map(|x| x.at).collect();
        assert_eq!(times, [t(0), t(1_000), t(1_501), t(16_000)]);
        assert!(!s.push(sample(t(1_501), 0.0)), "the same time again is held already");
        assert!(!s.push(sample(t(16_000) - Duration::nanoseconds(1), 0.0)), "a time that rounds to the last one too");
        assert_eq!(s.len(), 4);
    }

    #[test]
    fn counts_gaps_and_cutoffs_use_the_exact_bounds() {
        let mut s = Samples::default();
        for ms in [0, 60_000, 300_000, 360_000] {
            s.push(sample(t(ms), 0.0));
        }
        // A bound a nanosecond after a sample leaves that sample out; one on it keeps it.
        assert_eq!(s.count_since(t(300_000)), 2);
        assert_eq!(s.count_since(t(300_000) + Duration::nanoseconds(1)), 1);
        assert_eq!(s.values_since(t(60_000)).count(), 3);
        assert_eq!(s.longest_gap(t(300_000), t(360_000)).num_seconds(), 240, "the gap into the span counts");
        assert_eq!(s.longest_gap(t(300_001), t(360_000)).num_seconds(), 60);
        assert_eq!(s.longest_gap(t(0), t(900_000) + Duration::nanoseconds(7)), Duration::seconds(540) + Duration::nanoseconds(7));
        s.drop_before(t(60_000) + Duration::nanoseconds(1));
        assert_eq!(s.front().map(|x| x.at), Some(t(300_000)));
        s.drop_before(t(360_000));
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn the_idle_clock_restarts_after_a_hole_longer_than_the_gap_allowed() {
        let mut s = Samples::default();
        for (ms, u) in [(0, 0.0), (60_000, 0.9), (120_000, 0.0), (300_000, 0.0), (480_001, 0.0)] {
            s.push(sample(t(ms), u));
        }
        let active = |v: &SignalValues| v.get(Signal::GpuUtil).unwrap_or(0.0) >= 0.05;
        assert_eq!(
            s.idle_since(active, Duration::seconds(180)),
            Some(t(480_001)),
            "a hole of 180.001 s restarts it, one of 180 s does not"
        );
        assert_eq!(s.idle_since(active, Duration::milliseconds(180_001)), Some(t(120_000)));
    }

    #[test]
    fn a_sample_past_the_span_moves_the_base_and_drops_only_what_is_too_old() {
        let mut s = Samples::default();
        let day = 86_400_000;
        for d in [0, 10, 40] {
            s.push(sample(t(d * day), 0.0));
        }
        // 55 days after the first: beyond 4,294,967,295 ms of it, within that of the others.
        assert!(s.push(sample(t(55 * day + 1), 0.5)));
        let times: Vec<DateTime<Utc>> = s.iter().map(|x| x.at).collect();
        assert_eq!(times, [t(10 * day), t(40 * day), t(55 * day + 1)]);
        // Far beyond every sample held: only the new one stays.
        assert!(s.push(sample(t(200 * day), 0.0)));
        assert_eq!(s.iter().map(|x| x.at).collect::<Vec<_>>(), [t(200 * day)]);
        assert!(s.push(sample(t(200 * day + 1), 0.0)));
        assert_eq!(s.back().map(|x| x.at), Some(t(200 * day + 1)));
        // The same samples counted from another base are the same samples.
        let mut other = Samples::default();
        for at in [t(199 * day), t(200 * day), t(200 * day + 1)] {
            other.push(sample(at, 0.0));
        }
        other.drop_before(t(200 * day));
        assert_eq!(s, other);
        other.back_values_mut().unwrap().set(Signal::GpuUtil, 0.5);
        assert_ne!(s, other);
    }
}
