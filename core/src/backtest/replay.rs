//! The replay: one policy judged pass by pass over a fetched history, through the same `Judge`
//! `run` uses (decide, then the fleet rules: stop cap, breaker, contention, pools), and its stops
//! planned through the same `Ledger` (stops in flight, the waiters they serve, provisioner holds,
//! back-off), answered as a Coder whose stops always succeed. A simulated stop changes the future: the workspace counts as stopped until its next real start build, and
//! the GPU time it really held until then is given back. A stop is regretted when, within the
//! regret window after it, the real history shows a connection, GPU compute, or a start by its
//! owner. With `countdown_in_coder`, a reclaim the ledger hands to Coder (its deadline moved to
//! now plus the countdown) is stopped at that deadline, as Coder's lifecycle executor would, unless
//! the history shows a use before it: then it is averted (`countdowns_averted`), not regretted.
//! Pure: time, history and readings come in as values.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::coder::types::{BuildReason, JobStatus, ProvisionerJob, Transition, Workspace, WorkspaceBuild, WorkspaceStatus};
use crate::gpu::{GpuSeries, Point};
use crate::ids::IdMap;
use crate::ledger::{Call, Ledger, LedgerConfig, Listed, Outcome, PassView, StopAnswer};
use crate::pass::audit::AuditKind;
use crate::pass::decide::{SampleContext, SampleState, Verdict, classify};
use crate::pass::judge::{Judge, PassContext};
use crate::pass::mode::Mode;
use crate::pass::policy::Policy;

use super::timeline::{ListingKey, WorkspaceTimeline};

/// The GPU history of one fetched chunk, as every replay reads it: the series (each GPU's points
/// in time order) and, per timeline, which of them are its workspace's.
pub struct Chunk<'a> {
    pub series: &'a [GpuSeries],
    /// The series' indices grouped by timeline (`of_timeline`), in series order within one:
    /// timeline `t`'s are `order[starts[t]..starts[t + 1]]`. A pass finds a workspace's series
    /// by its timeline index, not by hashing its id.
    order: Vec<usize>,
    starts: Vec<usize>,
    /// Set when (part of) this chunk could not be fetched.
    pub failed: Option<Failed<'a>>,
    /// The pass the chunk was last advanced to (`advance`: since, now), and each series' points
    /// in it: every replay's pass reads them, found once, by a walk from the pass before.
    advanced: Option<(Option<DateTime<Utc>>, DateTime<Utc>)>,
    in_pass: Vec<std::ops::Range<usize>>,
}

/// A chunk the source could fetch only up to `after` (`None`: none of it): the passes after it
/// see the source failed, as `run` would (GPU data unknown, nothing stopped on it).
#[derive(Debug, Clone, Copy)]
pub struct Failed<'a> {
    pub source: &'a str,
    pub after: Option<DateTime<Utc>>,
}

impl<'a> Chunk<'a> {
    /// A chunk's series, each given to the timeline of the workspace it names (none to a
    /// workspace no timeline holds).
    pub fn new(series: &'a [GpuSeries], timelines: &[WorkspaceTimeline], failed: Option<Failed<'a>>) -> Self {
        let by_id: IdMap<&str, usize> = timelines.iter().enumerate().map(|(t, tl)| (tl.record.id.as_str(), t)).collect();
        let owner: Vec<Option<usize>> = series.iter().map(|s| s.workspace_id.as_deref().and_then(|id| by_id.get(id).copied())).collect();
        // A counting sort: how many series each timeline has, where its run begins, then the indices.
        let mut starts = vec![0; timelines.len() + 1];
        for &t in owner.iter().flatten() {
            starts[t + 1] += 1;
        }
        for t in 1..starts.len() {
            starts[t] += starts[t - 1];
        }
        let mut next = starts.clone();
        let mut order = vec![0; starts[timelines.len()]];
        for (i, t) in owner.into_iter().enumerate() {
            if let Some(t) = t {
                order[next[t]] = i;
                next[t] += 1;
            }
        }
        Chunk { series, order, starts, failed, advanced: None, in_pass: Vec::new() }
    }

    /// The indices of timeline `t`'s series, in series order.
    pub fn of_timeline(&self, t: usize) -> &[usize] {
        match (self.starts.get(t), self.starts.get(t + 1)) {
            (Some(&from), Some(&to)) => self.order.get(from..to).unwrap_or_default(),
            _ => &[],
        }
    }

    /// Finds each series' points in `(since, now]` (every point up to `now` when `since` is
    /// `None`) for the passes at `now`, walking on from the last pass's where it was `since`.
    pub fn advance(&mut self, since: Option<DateTime<Utc>>, now: DateTime<Utc>) {
        let walk_on = since.is_some() && self.advanced.map(|(_, at)| Some(at)) == Some(since) && since <= Some(now);
        self.in_pass.resize(self.series.len(), 0..0);
        for (s, range) in self.series.iter().zip(&mut self.in_pass) {
            let lo = if walk_on { range.end } else { since.map_or(0, |t| s.points.partition_point(|p| p.at <= t)) };
            let ahead = s.points.get(lo..).unwrap_or_default();
            let hi = lo + ahead.iter().take_while(|p| p.at <= now).count();
            *range = if since.is_none_or(|t| t <= now) { lo..hi } else { in_pass(s, since, now) };
        }
        self.advanced = Some((since, now));
    }

    /// Series `i`'s points in the pass `(since, now]`.
    fn points_in_pass(&self, i: usize, since: Option<DateTime<Utc>>, now: DateTime<Utc>) -> &'a [Point] {
        let Some(s) = self.series.get(i) else { return &[] };
        let range = match self.in_pass.get(i) {
            Some(r) if self.advanced == Some((since, now)) => r.clone(),
            _ => in_pass(s, since, now),
        };
        s.points.get(range).unwrap_or_default()
    }
}

/// A series' points in `(since, now]`, found by search.
fn in_pass(s: &GpuSeries, since: Option<DateTime<Utc>>, now: DateTime<Utc>) -> std::ops::Range<usize> {
    let lo = since.map_or(0, |t| s.points.partition_point(|p| p.at <= t));
    let hi = s.points.partition_point(|p| p.at <= now);
    lo.min(hi)..hi
}

/// What made a simulated stop regretted, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RegretKind {
    /// A connection (`last_used_at` moved) within the window.
    Connection,
    /// Its GPU computed within the window (a sample classified active).
    GpuCompute,
    /// Its owner started it again within the window.
    OwnerStart,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Regret {
    pub kind: RegretKind,
    pub at: DateTime<Utc>,
}

/// The workspace a simulated stop stopped: one per workspace, shared by all its stops (a week
/// of a large fleet is tens of thousands of stops, not as many copies of four names).
#[derive(Debug, Serialize)]
pub struct StoppedWorkspace {
    pub workspace_id: String,
    pub owner: String,
    pub workspace: String,
    pub template: String,
}

/// One stop the policy would have sent.
#[derive(Debug, Clone, Serialize)]
pub struct SimulatedStop {
    #[serde(flatten)]
    pub who: Arc<StoppedWorkspace>,
    pub at: DateTime<Utc>,
    /// The decision's reason code (`idle`, `memory-held-idle`, ...).
    pub reason: &'static str,
    pub gpus: u64,
    /// Its next real start build, which ends the simulated stop (`None`: not within the window).
    pub stopped_until: Option<DateTime<Utc>>,
    /// GPU-hours it really held between the stop and `stopped_until` (or the window's end).
    pub gpu_hours_given_back: f64,
    /// The first evidence within the regret window that someone wanted it, if any.
    pub regret: Option<Regret>,
    /// The regret window runs past the end of the history: judged on the part there is.
    pub window_cut: bool,
}

/// The simulated stops of one replay, in the order they were made, in blocks of `BLOCK`: the
/// list grows by a block and never copies what it holds (a `Vec` of 71,683 stops held the old
/// and the new allocation, 6 MB each, whenever it grew).
#[derive(Debug, Default)]
pub struct StopList {
    blocks: Vec<Vec<SimulatedStop>>,
    len: usize,
}

impl StopList {
    const BLOCK: usize = 4096;

    pub fn push(&mut self, stop: SimulatedStop) {
        match self.blocks.last_mut() {
            Some(block) if block.len() < Self::BLOCK => block.push(stop),
            _ => {
                let mut block = Vec::with_capacity(Self::BLOCK);
                block.push(stop);
                self.blocks.push(block);
            }
        }
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn first(&self) -> Option<&SimulatedStop> {
        self.blocks.first().and_then(|b| b.first())
    }

    pub fn get_mut(&mut self, i: usize) -> Option<&mut SimulatedStop> {
        self.blocks.get_mut(i / Self::BLOCK).and_then(|b| b.get_mut(i % Self::BLOCK))
    }

    pub fn iter(&self) -> impl Iterator<Item = &SimulatedStop> {
        self.blocks.iter().flatten()
    }

    /// Every stop in one list (the report's), each block freed as it is moved.
    pub fn into_vec(self) -> Vec<SimulatedStop> {
        let mut all = Vec::with_capacity(self.len);
        for block in self.blocks {
            all.extend(block);
        }
        all
    }
}

/// One policy's replay.
pub struct Replay {
    pub label: String,
    judge: Judge,
    /// What `run`'s actuator remembers between passes; it plans the stops.
    ledger: Ledger,
    regret_window: chrono::Duration,
    /// Per timeline index (dense: every pass visits each): stopped by the simulation, and
    /// where it is listed.
    slots: Vec<Slot>,
    /// The running workspaces as this pass's listing (`owner[i]` is the timeline index of
    /// `listing[i]`, `slots[t].listed` its position and the state it was built from).
    listing: Vec<Workspace>,
    owner: Vec<usize>,
    pub stops: StopList,
    /// Stops whose regret window is still open (index into `stops`, timeline index).
    open: Vec<(usize, usize)>,
    pub passes: u64,
    /// Passes in which the breaker refused every stop, and reclaims the stop cap deferred.
    pub breaker_passes: u64,
    pub deferred: u64,
    /// Workspace-passes each verdict was given, by `Verdict as usize` (`verdicts()` names them).
    verdict_counts: [u64; Verdict::ALL.len()],
    /// Coder's countdowns running (`countdown_in_coder`), by timeline index.
    countdowns: IdMap<usize, PendingCountdown>,
    /// Countdowns the history shows a use within: nothing was stopped.
    pub countdowns_averted: u64,
    /// Each stopped timeline's names, made at its first stop.
    who: Vec<Option<Arc<StoppedWorkspace>>>,
}

/// A reclaim handed to Coder: stopped at `until` unless used since `since`.
#[derive(Debug, Clone, Copy)]
struct PendingCountdown {
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    reason: &'static str,
    gpus: u64,
}

/// The replay's own state of one timeline.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// Stopped by the simulation until this time (`Some(None)`: to the end).
    stopped: Option<Option<DateTime<Utc>>>,
    /// Its position in the listing and the state it was built from.
    listed: Option<(usize, ListingKey)>,
    /// Its listing state as last read, and the moments it holds over (`listing_state`): most
    /// passes read it here, not from the timeline. Forgotten when the history changes.
    state: Option<(Option<ListingKey>, DateTime<Utc>, DateTime<Utc>)>,
}

impl Replay {
    pub fn new(label: String, policy: Policy, interval: std::time::Duration, regret_window: std::time::Duration) -> Self {
        let config = LedgerConfig {
            mode: Mode::Enforce.as_str(),
            enforce: true,
            interval: crate::duration::chrono(interval),
            stop_timeout: crate::duration::chrono(policy.stop_timeout),
            start_allowance: crate::duration::chrono(policy.start_allowance),
        };
        Replay {
            label,
            ledger: Ledger::new(config, None),
            judge: Judge::new(policy, interval),
            regret_window: crate::duration::chrono(regret_window),
            listing: Vec::new(),
            owner: Vec::new(),
            slots: Vec::new(),
            stops: StopList::default(),
            open: Vec::new(),
            passes: 0,
            breaker_passes: 0,
            deferred: 0,
            verdict_counts: [0; Verdict::ALL.len()],
            countdowns: IdMap::default(),
            countdowns_averted: 0,
            who: Vec::new(),
        }
    }

    /// Workspace-passes each verdict was given (those given at least once), for the report.
    pub fn verdicts(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Verdict::ALL.iter().map(|&v| (v.as_str(), self.verdict_counts[v as usize])).filter(|&(_, n)| n > 0)
    }

    pub fn policy(&self) -> &Policy {
        self.judge.policy()
    }

    /// One pass at `now`, given the points of `chunk` in `(since, now]` (every point up to `now`
    /// when `since` is `None`: the first pass reads the look-back, as `run`'s first does).
    /// `end` is the end of the history (given back and regret stop there).
    pub fn pass(
        &mut self,
        now: DateTime<Utc>,
        since: Option<DateTime<Utc>>,
        timelines: &[WorkspaceTimeline],
        chunk: &Chunk<'_>,
        step: std::time::Duration,
        end: DateTime<Utc>,
    ) {
        self.passes += 1;
        for slot in &mut self.slots {
            if slot.stopped.is_some_and(|until| until.is_some_and(|u| u <= now)) {
                slot.stopped = None;
            }
        }
        self.count_down(now, timelines, end);
        self.relist(now, timelines);
        self.check_regret(now, since, timelines, chunk);
        let failed_now = chunk.failed.filter(|f| f.after.is_none_or(|after| now > after));
        let failed: HashSet<&str> = failed_now.map(|f| f.source).into_iter().collect();
        self.judge.set_serving(self.ledger.serving());
        let mut pass = self.judge.begin(&self.listing, PassContext { coder_offset: chrono::Duration::zero(), step: Some(step) });
        if failed_now.is_none() {
            for &t in &self.owner {
                for &i in chunk.of_timeline(t) {
                    if let Some(s) = chunk.series.get(i) {
                        pass.merge(s, chunk.points_in_pass(i, since, now));
                    }
                }
            }
        }
        // The build parameters `run` would read this pass (a start that may wait), as read from
        // Coder when the history was fetched.
        let wanted = pass.parameters_wanted(now);
        if !wanted.is_empty() {
            let by_build: IdMap<&str, usize> =
                self.listing.iter().zip(&self.owner).map(|(ws, &t)| (ws.latest_build.id.as_str(), t)).collect();
            for build in wanted {
                let read = by_build.get(build.as_str()).and_then(|&t| timelines.get(t)?.parameters.get(&build));
                if let Some(parameters) = read {
                    pass.know_build_parameters(&build, parameters);
                }
            }
        }
        // The simulation may always stop (no permission is missing in a replay).
        let judgement = pass.decide(now, &failed, |_| Some(true));
        for d in &judgement.decisions {
            self.verdict_counts[d.verdict as usize] += 1;
        }
        if judgement.fleet.breaker.is_some() {
            self.breaker_passes += 1;
        }
        self.deferred += judgement.fleet.deferred as u64;
        // A countdown whose workspace is no longer judged idle (or that the breaker holds) ends,
        // as `run`'s ledger withdraws it: Coder stops nothing; ended by a use, it was averted.
        if !self.countdowns.is_empty() {
            for (t, d) in self.owner.iter().zip(&judgement.decisions) {
                if d.verdict != Verdict::Reclaim || judgement.fleet.breaker.is_some() {
                    if let Some(c) = self.countdowns.remove(t) {
                        let used = timelines.get(*t).is_some_and(|tl| tl.used_within(c.since, now).is_some());
                        self.countdowns_averted += u64::from(used);
                    }
                }
            }
        }
        // The stops, as `run`'s ledger plans them, and Coder's answers: every stop is queued and
        // succeeds by the next pass.
        let windows = self.judge.windows();
        let listed: Vec<Listed> = self
            .listing
            .iter()
            .zip(&judgement.decisions)
            .map(|(workspace, decision)| {
                let gpus = windows.get(&workspace.id).map_or(0, |g| g.len() as u64);
                Listed { workspace, decision, gpus, price: None }
            })
            .collect();
        let view = PassView {
            now,
            coder_offset: chrono::Duration::zero(),
            judged: &listed,
            fleet: &judgement.fleet,
            new_warnings: &judgement.new_warnings,
            currency: None,
            shutting_down: false,
        };
        let plan = self.ledger.plan(&view);
        let mut outcomes = Vec::new();
        let mut stopped = Vec::new();
        for call in plan.calls {
            match call {
                Call::Stop(stop) => {
                    let id = stop.event.workspace_id.clone();
                    let pos = self.listing.iter().position(|w| w.id == id);
                    if let Some(t) = pos.and_then(|p| self.owner.get(p)).copied() {
                        stopped.push((t, stop.event.reason, stop.event.gpus.unwrap_or(0)));
                    }
                    let build = simulated_stop_build(&id, now);
                    outcomes.push(Outcome::Stop { workspace_id: id, answer: StopAnswer::Queued(Box::new(build)) });
                }
                Call::FollowStop { workspace_id, build_id } => {
                    let answer = Ok(WorkspaceBuild { id: build_id.as_str().into(), ..simulated_stop_build(&workspace_id, now) });
                    outcomes.push(Outcome::FollowStop { workspace_id, build_id, answer });
                }
                Call::ListProvisioners { organization, tags } => {
                    outcomes.push(Outcome::ListProvisioners { organization, tags, answer: Ok(true) })
                }
                Call::Extend { workspace_id, to, event } => {
                    // Coder's countdown: its lifecycle executor stops the workspace at `to`.
                    let pos = self.listing.iter().position(|w| w.id == workspace_id);
                    match (pos.and_then(|p| self.owner.get(p)).copied(), event.event) {
                        (Some(t), AuditKind::CountdownSet) => {
                            let c = PendingCountdown { since: now, until: to, reason: event.reason, gpus: event.gpus.unwrap_or(0) };
                            self.countdowns.insert(t, c);
                        }
                        // Withdrawn (no longer idle): the deadline is put back, Coder stops nothing.
                        (Some(t), AuditKind::CountdownRestored) => {
                            self.countdowns.remove(&t);
                        }
                        _ => {}
                    }
                    outcomes.push(Outcome::Extend { workspace_id, answer: Ok(()) });
                }
                Call::RestoreTtl { workspace_id, .. } => outcomes.push(Outcome::RestoreTtl { workspace_id, answer: Ok(()) }),
                Call::Settle { workspace_id } => outcomes.push(Outcome::Settle { workspace_id, answer: Ok(None) }),
                Call::FollowCountdown { workspace_id } => outcomes.push(Outcome::FollowCountdown { workspace_id, answer: Ok(None) }),
            }
        }
        self.ledger.observe(outcomes);
        for (t, reason, gpus) in stopped {
            let Some(timeline) = timelines.get(t) else { continue };
            let stop = self.simulate_stop(t, timeline, now, reason, gpus, end);
            self.mark_stopped(t, stop.stopped_until);
            self.open.push((self.stops.len(), t));
            self.record_stop(stop);
        }
    }

    /// One simulated stop, kept for the report.
    fn record_stop(&mut self, stop: SimulatedStop) {
        self.stops.push(stop);
    }

    /// Coder's countdowns at `now`: one the history shows a use within is averted; one whose
    /// deadline passed is Coder's stop at that deadline; one whose workspace stopped in the real
    /// history meanwhile ends there.
    fn count_down(&mut self, now: DateTime<Utc>, timelines: &[WorkspaceTimeline], end: DateTime<Utc>) {
        let mut due: Vec<(usize, PendingCountdown)> = Vec::new();
        let mut averted = 0;
        self.countdowns.retain(|&t, c| {
            let Some(timeline) = timelines.get(t) else { return false };
            if timeline.used_within(c.since, c.until.min(now)).is_some() {
                averted += 1;
                return false;
            }
            if timeline.running_at(c.until.min(now)).is_none() {
                return false;
            }
            if c.until <= now {
                due.push((t, *c));
                return false;
            }
            true
        });
        self.countdowns_averted += averted;
        due.sort_by_key(|(t, _)| *t);
        for (t, c) in due {
            let Some(timeline) = timelines.get(t) else { continue };
            let stop = self.simulate_stop(t, timeline, c.until, c.reason, c.gpus, end);
            self.mark_stopped(t, stop.stopped_until);
            self.open.push((self.stops.len(), t));
            self.record_stop(stop);
        }
    }

    /// The listing at `now`: every workspace running in the real history and not stopped by
    /// the simulation, rebuilt only where its state changed.
    fn relist(&mut self, now: DateTime<Utc>, timelines: &[WorkspaceTimeline]) {
        if self.slots.len() < timelines.len() {
            self.slots.resize(timelines.len(), Slot::default());
        }
        for (t, timeline) in timelines.iter().enumerate() {
            let slot = &mut self.slots[t];
            let key = match slot.state {
                _ if slot.stopped.is_some() => None,
                Some((key, from, until)) if from <= now && now < until => key,
                _ => {
                    let (key, until) = timeline.listing_state(now);
                    slot.state = Some((key, now, until));
                    key
                }
            };
            match (self.slots[t].listed, key) {
                (None, None) => {}
                (Some((pos, _)), None) => {
                    self.listing.swap_remove(pos);
                    self.owner.swap_remove(pos);
                    self.slots[t].listed = None;
                    if let Some(&moved) = self.owner.get(pos) {
                        if let Some(entry) = self.slots.get_mut(moved).and_then(|s| s.listed.as_mut()) {
                            entry.0 = pos;
                        }
                    }
                }
                (Some((_, old)), Some(new)) if old == new => {}
                (at, Some(new)) => {
                    let Some(ws) = timeline.listed_at(now) else { continue };
                    match at {
                        Some((pos, _)) => self.listing[pos] = ws,
                        None => {
                            self.listing.push(ws);
                            self.owner.push(t);
                        }
                    }
                    let pos = at.map_or(self.listing.len() - 1, |(p, _)| p);
                    self.slots[t].listed = Some((pos, new));
                }
            }
        }
    }

    /// The timelines changed since the last pass (moments of use added, builds or uses
    /// forgotten): every listing state is read afresh at the next pass.
    pub fn history_changed(&mut self) {
        for slot in &mut self.slots {
            slot.state = None;
        }
    }

    fn mark_stopped(&mut self, t: usize, until: Option<DateTime<Utc>>) {
        if self.slots.len() <= t {
            self.slots.resize(t + 1, Slot::default());
        }
        self.slots[t].stopped = Some(until);
    }

    fn simulate_stop(
        &mut self,
        t: usize,
        timeline: &WorkspaceTimeline,
        now: DateTime<Utc>,
        reason: &'static str,
        gpus: u64,
        end: DateTime<Utc>,
    ) -> SimulatedStop {
        let record = &timeline.record;
        let stopped_until = timeline.next_start_after(now).and_then(|b| b.created_at).filter(|t| *t <= end);
        let held = timeline.running_seconds(now, stopped_until.unwrap_or(end));
        let window_end = now + self.regret_window;
        if self.who.len() <= t {
            self.who.resize(t + 1, None);
        }
        let who = self.who[t]
            .get_or_insert_with(|| {
                Arc::new(StoppedWorkspace {
                    workspace_id: record.id.clone(),
                    owner: record.owner_name.clone(),
                    workspace: record.name.clone(),
                    template: record.template_name.clone(),
                })
            })
            .clone();
        SimulatedStop {
            who,
            at: now,
            reason,
            gpus,
            stopped_until,
            gpu_hours_given_back: gpus as f64 * held / 3600.0,
            regret: None,
            window_cut: window_end > end,
        }
    }

    /// Evidence within each open regret window, up to `now`: a moment of use (as known by now:
    /// coderd's gauges arrive chunk by chunk), a start by the owner, or one of the stopped
    /// workspace's real GPU samples in this pass that the policy reads as active; the earliest
    /// found is kept. A window is closed once it has passed.
    fn check_regret(&mut self, now: DateTime<Utc>, since: Option<DateTime<Utc>>, timelines: &[WorkspaceTimeline], chunk: &Chunk<'_>) {
        let policy = self.judge.policy();
        let window = self.regret_window;
        let stops = &mut self.stops;
        self.open.retain(|&(i, t)| {
            let (Some(stop), Some(timeline)) = (stops.get_mut(i), timelines.get(t)) else { return false };
            let until = (stop.at + window).min(now);
            let computed = chunk
                .of_timeline(t)
                .iter()
                .filter_map(|&i| Some((chunk.series.get(i)?, chunk.points_in_pass(i, since, now))))
                .flat_map(|(s, points)| {
                    let ctx = SampleContext::of_series(s, policy);
                    points.iter().filter(move |p| classify(&p.values, policy, ctx) == SampleState::Active)
                })
                .map(|p| p.at)
                .find(|&at| at > stop.at && at <= until);
            let found = [
                timeline.used_within(stop.at, until).map(|at| Regret { kind: RegretKind::Connection, at }),
                timeline.owner_started_within(stop.at, until).map(|at| Regret { kind: RegretKind::OwnerStart, at }),
                computed.map(|at| Regret { kind: RegretKind::GpuCompute, at }),
            ]
            .into_iter()
            .flatten()
            .min_by_key(|r| r.at);
            if found.is_some() {
                stop.regret = found;
                return false;
            }
            now < stop.at + window
        });
    }
}

/// The stop build a simulated Coder answers with: queued, and done at once.
fn simulated_stop_build(workspace_id: &str, now: DateTime<Utc>) -> WorkspaceBuild {
    WorkspaceBuild {
        id: format!("simulated-stop-{workspace_id}-{}", now.timestamp()).into(),
        created_at: Some(now),
        transition: Transition::Stop,
        status: WorkspaceStatus::Stopped,
        job: ProvisionerJob { status: JobStatus::Succeeded, completed_at: Some(now), ..ProvisionerJob::default() },
        reason: BuildReason::Initiator,
        ..WorkspaceBuild::default()
    }
}

/// What the stops of one replay add up to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Simulated stops.
    pub stop_count: usize,
    pub gpu_hours_given_back: f64,
    pub regretted: usize,
    /// Regretted stops over all stops (0 when there are none).
    pub regretted_share: f64,
    /// Stops whose regret window runs past the end of the history.
    pub window_cut: usize,
}

impl Totals {
    pub fn of(stops: &[SimulatedStop]) -> Self {
        let regretted = stops.iter().filter(|s| s.regret.is_some()).count();
        Totals {
            stop_count: stops.len(),
            gpu_hours_given_back: stops.iter().map(|s| s.gpu_hours_given_back).sum(),
            regretted,
            regretted_share: if stops.is_empty() { 0.0 } else { regretted as f64 / stops.len() as f64 },
            window_cut: stops.iter().filter(|s| s.window_cut).count(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stops come back in the order they were made, across blocks, and each one can be
    /// changed in place by its index (a regret found later).
    #[test]
    fn a_stop_list_keeps_order_and_index_across_its_blocks() {
        let who = Arc::new(StoppedWorkspace { workspace_id: "w".into(), owner: "o".into(), workspace: "n".into(), template: "t".into() });
        let at = |i: usize| DateTime::from_timestamp(1_800_000_000 + i as i64 * 60, 0).unwrap();
        let stop = |i: usize| SimulatedStop {
            who: who.clone(),
            at: at(i),
            reason: "idle",
            gpus: 1,
            stopped_until: None,
            gpu_hours_given_back: 0.0,
            regret: None,
            window_cut: false,
        };
        let mut list = StopList::default();
        assert!(list.is_empty() && list.first().is_none());
        let n = StopList::BLOCK * 2 + 5;
        for i in 0..n {
            list.push(stop(i));
        }
        for i in [0, StopList::BLOCK - 1, StopList::BLOCK, n - 1] {
            list.get_mut(i).unwrap().gpus = 7;
        }
        assert!(list.get_mut(n).is_none());
        assert_eq!((list.len(), list.first().map(|s| s.at)), (n, Some(at(0))));
        let all = list.into_vec();
        assert_eq!(all.len(), n);
        assert!(all.iter().enumerate().all(|(i, s)| s.at == at(i)), "in the order pushed");
        let changed: Vec<usize> = all.iter().enumerate().filter(|(_, s)| s.gpus == 7).map(|(i, _)| i).collect();
        assert_eq!(changed, vec![0, StopList::BLOCK - 1, StopList::BLOCK, n - 1]);
    }

    /// Each timeline gets its workspace's series, in series order, found by its index; a series
    /// of a workspace no timeline holds, or of none, goes to no timeline.
    #[test]
    fn a_chunk_gives_each_timeline_its_workspaces_series_in_order() {
        let timeline = |id: &str| {
            let record: Workspace = serde_json::from_value(serde_json::json!({
                "id": id, "name": "n", "owner_name": "alice", "owner_id": "owner", "created_at": "2026-11-01T00:00:00Z",
                "last_used_at": "2026-11-01T00:00:00Z", "latest_build": WorkspaceBuild::default()
            }))
            .unwrap();
            WorkspaceTimeline::new(record, Vec::new())
        };
        let timelines = [timeline("ws-a"), timeline("ws-b"), timeline("ws-c")];
        let series = |uuid: &str, ws: Option<&str>| {
            let mut s = GpuSeries::from_labels(|k| (k == "UUID").then_some(uuid), &Arc::from("p"), &Default::default()).unwrap();
            s.workspace_id = ws.map(crate::coder::types::CoderId::new);
            s
        };
        let all = [
            series("GPU-0", Some("ws-c")),
            series("GPU-1", Some("ws-a")),
            series("GPU-2", Some("ws-unknown")),
            series("GPU-3", None),
            series("GPU-4", Some("ws-c")),
            series("GPU-5", Some("ws-a")),
        ];
        let chunk = Chunk::new(&all, &timelines, None);
        let of = |t: usize| chunk.of_timeline(t).to_vec();
        assert_eq!((of(0), of(1), of(2), of(3)), (vec![1, 5], vec![], vec![0, 4], vec![]), "by timeline: a, b, c, none past the end");
        assert!(Chunk::new(&all, &[], None).of_timeline(0).is_empty(), "no timelines: no series is anyone's");
    }

    /// The points a pass reads, found by walking on from the pass before, are the ones a search
    /// finds: passes a step apart, a first pass over the look-back, a pass that skips steps, a
    /// series with gaps and one with no points.
    #[test]
    fn a_chunk_advanced_pass_by_pass_reads_what_a_search_reads() {
        let at = |m: i64| DateTime::from_timestamp(1_800_000_000 + m * 60, 0).unwrap();
        let series = |minutes: &[i64]| {
            let mut s = GpuSeries::from_labels(|k| (k == "UUID").then_some("GPU-1"), &Arc::from("p"), &Default::default()).unwrap();
            s.points = minutes.iter().map(|&m| Point::new(at(m))).collect();
            s
        };
        let all = [series(&(0..30).collect::<Vec<_>>()), series(&[3, 4, 9, 20, 21, 29]), series(&[])];
        let mut chunk = Chunk::new(&all, &[], None);
        let passes =
            [(None, 5), (Some(5), 6), (Some(6), 10), (Some(10), 10), (Some(10), 25), (Some(3), 12), (Some(12), 29), (Some(29), 40)];
        for (since, now) in passes {
            let (since, now) = (since.map(at), at(now));
            chunk.advance(since, now);
            for (i, s) in all.iter().enumerate() {
                let searched = &s.points[in_pass(s, since, now)];
                assert_eq!(chunk.points_in_pass(i, since, now), searched, "series {i}, pass {since:?} to {now}");
                assert!(searched.iter().all(|p| since.is_none_or(|t| p.at > t) && p.at <= now));
            }
        }
        assert_eq!(chunk.points_in_pass(0, Some(at(0)), at(2)).len(), 2, "a pass it was not advanced to is searched");
    }
}
