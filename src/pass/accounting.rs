//! What the service gives back, counted while it runs: GPU-seconds observed idle, GPUs
//! reclaimed, GPU-seconds given back (from a stop until the workspace runs again), how long GPU
//! sessions waited for a GPU (from `waiting` to running with a GPU), the latest stops, and, when
//! GPU-hours have a price (`gpu_hour_price`), the same in money. Fed once per pass by the publish
//! step from the pass's own figures; no I/O, no clock of its own (`now` is the pass's).

use std::collections::{BTreeMap, HashMap, VecDeque};

use chrono::{DateTime, Duration, NaiveDate, Utc};
use serde::Serialize;

use crate::pass::audit::gpu_seconds_given_back;
use crate::pass::decide::Verdict;
use reclaimer_core::ledger::Listed;

/// How many of the latest completed stops the status document lists.
pub const RECENT_STOPS: usize = 10;

/// The figures the status document shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AccountingSummary {
    /// GPU-hours given back today (UTC) and over the last 7 days, while the service ran.
    pub gpu_hours_given_back_today: f64,
    pub gpu_hours_given_back_7d: f64,
    /// GPU-hours observed not computing today (UTC).
    pub gpu_hours_idle_today: f64,
    /// The same in money, when `gpu_hour_price` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostSummary>,
    /// Sessions waiting for a GPU now, and the longest wait so far.
    pub waiting: usize,
    pub longest_wait_seconds: i64,
    /// The latest completed stops, newest first (at most `RECENT_STOPS`).
    pub recent_stops: Vec<RecentStop>,
    /// Workspaces that ran past the autostop deadline Coder had set because their GPU computes
    /// (`extend_while_busy`), over the last 7 days.
    pub autostops_averted_7d: u64,
    /// Coder's countdowns (`countdown_in_coder`) someone came back within, over the last 7 days:
    /// warnings that saved someone's work.
    pub countdowns_averted_7d: u64,
}

/// Money: GPU-hours times the price of their GPU model (`gpu_hour_price`), rounded to cents.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CostSummary {
    pub currency: String,
    pub given_back_today: f64,
    pub given_back_7d: f64,
    pub idle_today: f64,
    pub idle_7d: f64,
}

/// One completed stop and what it gave back so far.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecentStop {
    pub workspace_id: String,
    pub workspace: String,
    pub owner: String,
    pub template: String,
    pub gpus: u64,
    pub stopped_at: DateTime<Utc>,
    /// When it ran again (giving back ended then).
    pub resumed_at: Option<DateTime<Utc>>,
    pub gpu_hours_given_back: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_given_back: Option<f64>,
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
    /// template -> money of the idle and given-back GPU time this pass (priced GPUs only).
    pub idle_cost: Vec<(String, f64)>,
    pub given_back_cost: Vec<(String, f64)>,
    /// Waits that ended this pass (a session got its GPU), seconds.
    pub waits_ended: Vec<f64>,
}

/// A running GPU workspace as last seen.
#[derive(Debug, Clone)]
struct Seen {
    template: String,
    workspace: String,
    owner: String,
    gpus: u64,
    /// Price of one of its GPU-hours.
    price: Option<f64>,
    /// The pass that last listed it running.
    at: DateTime<Utc>,
}

/// Records a running GPU workspace as seen now: a workspace seen last pass is updated in place
/// (its names copied again only where they changed), not copied anew every pass.
fn remember(
    seen: &mut HashMap<String, Seen>,
    w: &reclaimer_core::coder::types::Workspace,
    gpus: u64,
    price: Option<f64>,
    now: DateTime<Utc>,
) {
    let Some(s) = seen.get_mut(w.id.as_str()) else {
        let names =
            Seen { template: w.template_name.clone(), workspace: w.name.clone(), owner: w.owner_name.clone(), gpus, price, at: now };
        seen.insert(w.id.clone(), names);
        return;
    };
    for (mine, now_named) in [(&mut s.template, &w.template_name), (&mut s.workspace, &w.name), (&mut s.owner, &w.owner_name)] {
        if mine != now_named {
            mine.clone_from(now_named);
        }
    }
    (s.gpus, s.price, s.at) = (gpus, price, now);
}

/// Totals of one UTC day.
#[derive(Debug, Clone, Copy, Default)]
struct Day {
    given_back_seconds: f64,
    given_back_cost: f64,
    idle_seconds: f64,
    idle_cost: f64,
    autostops_averted: u64,
    countdowns_averted: u64,
}

#[derive(Debug, Default)]
pub struct Accounting {
    /// Set when GPU time has a price: the currency it is in.
    currency: Option<String>,
    last_pass: Option<DateTime<Utc>>,
    seen: HashMap<String, Seen>,
    /// Stopped workspaces, until they run again.
    given_back: HashMap<String, Seen>,
    waiting_since: HashMap<String, DateTime<Utc>>,
    /// Per UTC day (the last 8 days).
    days: BTreeMap<NaiveDate, Day>,
    recent: VecDeque<RecentStop>,
}

/// Passes further apart than this count for this long at most (the service was down or hung:
/// nobody knows what happened in between).
const MAX_PASS_GAP: Duration = Duration::minutes(5);

/// How long a workspace that is no longer listed running is remembered, so that a stop that
/// completes later is still counted (Coder's job reaper ends a pending job after 30 minutes).
const SEEN_FOR: Duration = Duration::hours(1);

impl Accounting {
    /// Counts money too, in `currency` (GPU-hours priced by `gpu_hour_price`).
    pub fn priced(currency: &str) -> Self {
        Accounting { currency: Some(currency.to_string()), ..Accounting::default() }
    }

    /// Accounts one pass: the running workspaces as judged (each with how many GPUs it holds and
    /// what one of its GPU-hours costs), and the workspaces whose stop build completed this pass.
    pub fn pass(&mut self, now: DateTime<Utc>, judged: &[Listed<'_>], stops_done: &[String]) -> Increments {
        let dt = self.last_pass.map_or(Duration::zero(), |t| (now - t).clamp(Duration::zero(), MAX_PASS_GAP));
        let secs = dt.num_milliseconds() as f64 / 1000.0;
        self.last_pass = Some(now);
        let mut inc = Increments::default();
        let listed: HashMap<&str, &Listed<'_>> = judged.iter().map(|j| (j.workspace.id.as_str(), j)).collect();
        let day = self.days.entry(now.date_naive()).or_default();

        // Given back until the workspace runs again.
        let mut back_again = Vec::new();
        for (id, g) in &self.given_back {
            if listed.contains_key(id.as_str()) {
                back_again.push(id.clone());
            } else if secs > 0.0 {
                let s = gpu_seconds_given_back(g.gpus, now - dt, now);
                inc.given_back_gpu_seconds.push((g.template.clone(), s));
                day.given_back_seconds += s;
                let cost = g.price.map(|p| p * s / 3600.0);
                if let Some(c) = cost {
                    inc.given_back_cost.push((g.template.clone(), c));
                    day.given_back_cost += c;
                }
                if let Some(r) = self.recent.iter_mut().find(|r| r.workspace_id == *id && r.resumed_at.is_none()) {
                    r.gpu_hours_given_back += s / 3600.0;
                    r.cost_given_back = r.cost_given_back.map(|a| a + cost.unwrap_or(0.0));
                }
            }
        }
        for id in back_again {
            self.given_back.remove(&id);
            if let Some(r) = self.recent.iter_mut().find(|r| r.workspace_id == id && r.resumed_at.is_none()) {
                r.resumed_at = Some(now);
            }
        }
        for id in stops_done {
            if let Some(seen) = self.seen.get(id).cloned().filter(|s| s.gpus > 0) {
                inc.gpus_reclaimed.push((seen.template.clone(), seen.gpus));
                self.recent.push_front(RecentStop {
                    workspace_id: id.clone(),
                    workspace: seen.workspace.clone(),
                    owner: seen.owner.clone(),
                    template: seen.template.clone(),
                    gpus: seen.gpus,
                    stopped_at: now,
                    resumed_at: None,
                    gpu_hours_given_back: 0.0,
                    cost_given_back: seen.price.map(|_| 0.0),
                });
                self.recent.truncate(RECENT_STOPS);
                self.given_back.insert(id.clone(), seen);
            }
        }

        // Idle GPU time, and who waits.
        for &Listed { workspace: w, decision: d, gpus: n, price } in judged {
            if n > 0 {
                remember(&mut self.seen, w, n, price, now);
            }
            if let Some(idle) = d.gpu_idle.filter(|g| *g > Duration::zero()).filter(|_| n > 0) {
                let idle_secs = idle.num_milliseconds() as f64 / 1000.0;
                if secs > 0.0 {
                    let s = secs.min(idle_secs) * n as f64;
                    inc.idle_gpu_seconds.push((w.template_name.clone(), s));
                    day.idle_seconds += s;
                    if let Some(p) = price {
                        inc.idle_cost.push((w.template_name.clone(), p * s / 3600.0));
                        day.idle_cost += p * s / 3600.0;
                    }
                }
            }
            if d.verdict == Verdict::Waiting {
                self.waiting_since.entry(w.id.clone()).or_insert(now);
            }
        }
        let mut ended = Vec::new();
        for (id, since) in &self.waiting_since {
            match listed.get(id.as_str()) {
                Some(j) if j.decision.verdict != Verdict::Waiting && j.gpus > 0 => {
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
        // A stop takes a few passes to complete, and the workspace is not listed running meanwhile:
        // what it held is kept for as long as a stop may take.
        self.seen.retain(|_, s| now - s.at <= SEEN_FOR);
        let oldest = now.date_naive() - Duration::days(8);
        self.days.retain(|d, _| *d > oldest);
        inc
    }

    /// Counts autostops averted (`Acted::autostops_averted`) and Coder's countdowns someone came
    /// back within (`Acted::countdowns_averted`) this pass.
    pub fn averted(&mut self, now: DateTime<Utc>, autostops: usize, countdowns: usize) {
        let day = self.days.entry(now.date_naive()).or_default();
        day.autostops_averted += autostops as u64;
        day.countdowns_averted += countdowns as u64;
    }

    pub fn summary(&self, now: DateTime<Utc>) -> AccountingSummary {
        let today = now.date_naive();
        let week_start = today - Duration::days(6);
        // A float sum of nothing is -0.0: start from +0.0.
        let sum = |from: NaiveDate, f: fn(&Day) -> f64| self.days.range(from..).map(|(_, d)| f(d)).fold(0.0, |a, b| a + b);
        AccountingSummary {
            gpu_hours_given_back_today: round2(sum(today, |d| d.given_back_seconds) / 3600.0),
            gpu_hours_given_back_7d: round2(sum(week_start, |d| d.given_back_seconds) / 3600.0),
            gpu_hours_idle_today: round2(sum(today, |d| d.idle_seconds) / 3600.0),
            cost: self.currency.as_ref().map(|currency| CostSummary {
                currency: currency.clone(),
                given_back_today: round2(sum(today, |d| d.given_back_cost)),
                given_back_7d: round2(sum(week_start, |d| d.given_back_cost)),
                idle_today: round2(sum(today, |d| d.idle_cost)),
                idle_7d: round2(sum(week_start, |d| d.idle_cost)),
            }),
            waiting: self.waiting_since.len(),
            longest_wait_seconds: self.waiting_since.values().map(|t| (now - *t).num_seconds()).max().unwrap_or(0),
            recent_stops: self
                .recent
                .iter()
                .map(|r| RecentStop {
                    gpu_hours_given_back: round2(r.gpu_hours_given_back),
                    cost_given_back: r.cost_given_back.map(round2),
                    ..r.clone()
                })
                .collect(),
            autostops_averted_7d: self.days.range(week_start..).map(|(_, d)| d.autostops_averted).sum(),
            countdowns_averted_7d: self.days.range(week_start..).map(|(_, d)| d.countdowns_averted).sum(),
        }
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
