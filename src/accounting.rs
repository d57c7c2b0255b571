//! What the service gives back, counted while it runs: GPU-seconds observed idle, GPUs
//! reclaimed, GPU-seconds given back (from a stop until the workspace runs again), and how long
//! GPU sessions waited for a GPU (from `waiting` to running with a GPU). Fed once per pass by the
//! report step from the pass's own figures; no I/O, no clock of its own (`now` is the pass's).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Duration, NaiveDate, Utc};
use serde::Serialize;

use crate::coder::types::Workspace;
use crate::decide::{Decision, Verdict};

/// The figures the status document shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AccountingSummary {
    /// GPU-hours given back today (UTC) and over the last 7 days, while the service ran.
    pub gpu_hours_given_back_today: f64,
    pub gpu_hours_given_back_7d: f64,
    /// Sessions waiting for a GPU now, and the longest wait so far.
    pub waiting: usize,
    pub longest_wait_seconds: i64,
}

/// One pass's increments, for the metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Increments {
    /// template -> GPU-seconds observed idle this pass.
    pub idle_gpu_seconds: Vec<(String, f64)>,
    /// template -> GPUs whose stop completed this pass.
    pub gpus_reclaimed: Vec<(String, u64)>,
    /// template -> GPU-seconds given back this pass.
    pub given_back_gpu_seconds: Vec<(String, f64)>,
    /// Waits that ended this pass (a session got its GPU), seconds.
    pub waits_ended: Vec<f64>,
}

#[derive(Debug, Clone)]
struct GivenBack {
    template: String,
    gpus: u64,
}

#[derive(Debug, Default)]
pub struct Accounting {
    last_pass: Option<DateTime<Utc>>,
    /// The template and GPU count of each running GPU workspace, as last seen.
    seen: HashMap<String, (String, u64)>,
    given_back: HashMap<String, GivenBack>,
    waiting_since: HashMap<String, DateTime<Utc>>,
    /// GPU-seconds given back per UTC day (the last 8 days).
    days: BTreeMap<NaiveDate, f64>,
}

/// Passes further apart than this count for this long at most (the service was down or hung:
/// nobody knows what happened in between).
const MAX_PASS_GAP: Duration = Duration::minutes(5);

impl Accounting {
    /// Accounts one pass. `gpus[i]` is how many GPUs `workspaces[i]` holds (series seen);
    /// `stops_done` are the workspaces whose stop build completed this pass.
    pub fn pass(
        &mut self,
        now: DateTime<Utc>,
        workspaces: &[Workspace],
        decisions: &[Decision],
        gpus: &[u64],
        stops_done: &[String],
    ) -> Increments {
        let dt = self.last_pass.map_or(Duration::zero(), |t| (now - t).clamp(Duration::zero(), MAX_PASS_GAP));
        let secs = dt.num_milliseconds() as f64 / 1000.0;
        self.last_pass = Some(now);
        let mut inc = Increments::default();
        let listed: HashMap<&str, usize> = workspaces.iter().enumerate().map(|(i, w)| (w.id.as_str(), i)).collect();

        // Given back until the workspace runs again.
        let mut back_again = Vec::new();
        for (id, g) in &self.given_back {
            if listed.contains_key(id.as_str()) {
                back_again.push(id.clone());
            } else if secs > 0.0 {
                let s = secs * g.gpus as f64;
                inc.given_back_gpu_seconds.push((g.template.clone(), s));
                *self.days.entry(now.date_naive()).or_default() += s;
            }
        }
        for id in back_again {
            self.given_back.remove(&id);
        }
        for id in stops_done {
            if let Some((template, n)) = self.seen.get(id).cloned().filter(|(_, n)| *n > 0) {
                inc.gpus_reclaimed.push((template.clone(), n));
                self.given_back.insert(id.clone(), GivenBack { template, gpus: n });
            }
        }

        // Idle GPU time, and who waits.
        for ((w, d), &n) in workspaces.iter().zip(decisions).zip(gpus) {
            if n > 0 {
                self.seen.insert(w.id.clone(), (w.template_name.clone(), n));
            }
            if let Some(idle) = d.gpu_idle.filter(|g| *g > Duration::zero()).filter(|_| n > 0) {
                let idle_secs = idle.num_milliseconds() as f64 / 1000.0;
                if secs > 0.0 {
                    inc.idle_gpu_seconds.push((w.template_name.clone(), secs.min(idle_secs) * n as f64));
                }
            }
            if d.verdict == Verdict::Waiting {
                self.waiting_since.entry(w.id.clone()).or_insert(now);
            }
        }
        let mut ended = Vec::new();
        for (id, since) in &self.waiting_since {
            match listed.get(id.as_str()) {
                Some(&i) if decisions[i].verdict != Verdict::Waiting && gpus[i] > 0 => {
                    inc.waits_ended.push((now - *since).num_milliseconds() as f64 / 1000.0);
                    ended.push(id.clone());
                }
                Some(_) => {}
                None => ended.push(id.clone()),
            }
        }
        for id in ended {
            self.waiting_since.remove(&id);
        }
        self.seen.retain(|id, _| listed.contains_key(id.as_str()) || self.given_back.contains_key(id) || stops_done.contains(id));
        let oldest = now.date_naive() - Duration::days(8);
        self.days.retain(|d, _| *d > oldest);
        inc
    }

    pub fn summary(&self, now: DateTime<Utc>) -> AccountingSummary {
        let today = now.date_naive();
        let week_start = today - Duration::days(6);
        // A float sum of nothing is -0.0: start from +0.0.
        let hours = |from: NaiveDate| self.days.range(from..).map(|(_, s)| s).fold(0.0, |a, b| a + b) / 3600.0;
        AccountingSummary {
            gpu_hours_given_back_today: round2(hours(today)),
            gpu_hours_given_back_7d: round2(hours(week_start)),
            waiting: self.waiting_since.len(),
            longest_wait_seconds: self.waiting_since.values().map(|t| (now - *t).num_seconds()).max().unwrap_or(0),
        }
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
