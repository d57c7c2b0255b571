//! The stops the ledger tracks, keyed by workspace, through the states of `stop_lifecycle` (each
//! change one audit line): a stop build is followed until its job is final; a refused or failed
//! stop backs off and is abandoned after `MAX_STOP_ATTEMPTS`; a stop Coder's job reaper failed is
//! sent once more when a provisioner matching its tags answers; while a stop finds none, new
//! stops that need the same tags are held; a canceled one (a person's decision) is not sent again
//! in that idle episode; a stop whose reply was lost (a timeout, then 409, or the latest build
//! being our stop) counts as sent, once. Tracking starts afresh when the workspace gets a new
//! build. Observe mode reports each would-stop once per idle episode.

use crate::ids::{IdMap, IdSet};

use chrono::{DateTime, Duration, Utc};

use super::intent::{
    Acted, Call, Count, Fact, Failure, LedgerConfig, Level, Listed, MAX_STOP_ATTEMPTS, Note, Outcome, PassView, Plan, STOPPED_MEMORY,
    StopAnswer, StopCall, StopFailure, needs_at_least, stop_backoff,
};
use super::recovery::{OpenStop, Recovered, open_stops};
use super::serving::Serving;
use super::tracked::{Candidate, NoProvisioner, StuckStop, TrackedStop, expects_use, stop_event};
use crate::coder::types::{JobStatus, JobTags, Transition, WorkspaceBuild};
use crate::duration::human;
use crate::pass::audit::{AuditEvent, AuditKind, AuditRecord, gpu_seconds_given_back};
use crate::pass::stop_lifecycle::{JobChange, StopState, job_change, provisioners_answer};

/// The stops the ledger tracks, and what it remembers of stops done and reported.
#[derive(Debug)]
pub(super) struct Stops {
    pub(super) config: LedgerConfig,
    /// The token's user: stop builds it initiated are ours (a lost reply is recognised by it).
    pub(super) self_id: Option<String>,
    stops: IdMap<String, TrackedStop>,
    /// Workspaces this service stopped, until they run again (the `resumed` audit line). Boxed:
    /// a table of 10,000 held 16,384 slots of 660 bytes, most of them empty after it grew.
    stopped: IdMap<String, (Box<AuditEvent>, DateTime<Utc>)>,
    /// Observe mode: workspaces already reported as would-stop in this idle episode.
    reported: IdSet<String>,
    /// Stops whose `stop_sending` line a previous run left without an outcome.
    unconfirmed: IdMap<String, AuditEvent>,
    /// Stops sent that still serve a waiter of their pool (one waiter, one stop).
    serving: Serving,
    /// This pass, between `plan` and `observe`.
    pending: Pending,
    /// What this pass did to stops.
    pub(super) acted: Acted,
}

/// What `plan` leaves for `observe`.
#[derive(Debug, Default)]
struct Pending {
    now: DateTime<Utc>,
    coder_offset: Duration,
    /// Reaped stops' fallback when the provisioner listing fails: whether a build in their
    /// organization completed since the reap, by (organization, tags).
    provisioners_fallback: std::collections::HashMap<(String, JobTags), bool>,
    /// Stops planned, by workspace.
    stops: IdMap<String, Candidate>,
}

impl Stops {
    pub(super) fn new(config: LedgerConfig, self_id: Option<String>) -> Self {
        Stops {
            config,
            self_id,
            stops: IdMap::default(),
            stopped: IdMap::default(),
            reported: IdSet::default(),
            unconfirmed: IdMap::default(),
            serving: Serving::default(),
            pending: Pending::default(),
            acted: Acted::default(),
        }
    }

    pub(super) fn tracked_count(&self) -> usize {
        self.stops.len()
    }

    /// Stops that still serve a waiter, per pool.
    pub(super) fn serving(&self) -> Vec<usize> {
        self.serving.counts()
    }

    /// A pass begins: what the last one left for `observe` is dropped.
    pub(super) fn begin(&mut self, view: &PassView) {
        self.acted = Acted::default();
        self.pending = Pending { now: view.now, coder_offset: view.coder_offset, ..Pending::default() };
    }

    /// Enforce mode's plan for stops: `resumed` lines, stops of a previous run to settle, every
    /// stop in flight followed, tracking reconciled with the listing, provisioners asked for
    /// reaped stops, and (unless shutting down) the stops to send, less those Coder makes
    /// (`coders`: Coder's countdown).
    pub(super) fn plan(&mut self, view: &PassView, plan: &mut Plan, coders: &IdSet<String>) {
        self.serving.retire(view, self.config.start_allowance);
        self.resumed(view, plan);
        let mut settle: Vec<&String> = self.unconfirmed.keys().collect();
        settle.sort();
        plan.calls.extend(settle.into_iter().map(|id| Call::Settle { workspace_id: id.clone() }));
        self.follow(plan);
        self.reconcile(view);
        self.provisioners_for_reaped(view, plan);
        if !view.shutting_down {
            self.stops_to_send(view, plan, coders);
        }
    }

    /// Coder's answer to a stop's call.
    pub(super) fn observe(&mut self, outcome: Outcome, notes: &mut Vec<Note>) {
        match outcome {
            Outcome::FollowStop { workspace_id, build_id, answer } => self.followed(&workspace_id, &build_id, answer, notes),
            Outcome::Settle { workspace_id, answer } => self.settled(workspace_id, answer, notes),
            Outcome::ListProvisioners { organization, tags, answer } => self.provisioners_listed(&organization, &tags, answer, notes),
            Outcome::Stop { workspace_id, answer } => self.stop_answered(&workspace_id, answer, notes),
            Outcome::Extend { .. } | Outcome::RestoreTtl { .. } | Outcome::FollowCountdown { .. } => {}
        }
    }

    /// Reads back the audit records of a previous run. Observe mode follows no stop: what an
    /// earlier enforce run left open stays for the next one.
    pub(super) fn recover(&mut self, now: DateTime<Utc>, records: impl IntoIterator<Item = AuditRecord>) -> Recovered {
        let mut found = Recovered::default();
        if !self.config.enforce {
            return found;
        }
        for (id, open) in open_stops(records) {
            match open {
                OpenStop::Done(done) if now - done.time < STOPPED_MEMORY => {
                    let at = done.time;
                    self.stopped.insert(id, (Box::new(done), at));
                    found.resumable += 1;
                }
                OpenStop::Done(_) => {}
                OpenStop::InFlight(sent) => {
                    let Some(build_id) = sent.build_id.clone() else { continue };
                    self.stops.insert(id, TrackedStop::recovered(sent, StopState::Sent { build_id }));
                    found.followed += 1;
                }
                OpenStop::Sending(sending) => {
                    self.unconfirmed.insert(id, sending);
                    found.unconfirmed += 1;
                }
            }
        }
        found
    }

    /// Warnings (grace) that began this pass: a log line and a webhook event each.
    pub(super) fn warnings(&mut self, view: &PassView, plan: &mut Plan) {
        let kind = if self.config.enforce { AuditKind::Warn } else { AuditKind::WouldWarn };
        for j in view.new_warnings.iter().filter_map(|&i| view.judged.get(i)) {
            let event = AuditEvent::new(kind, view.now, self.config.mode, j.workspace, j.decision);
            let stop_at = event.stop_at;
            let note = Note::new(Level::Info, kind.as_str(), event.text()).notify_only(event);
            plan.notes.push(match stop_at {
                Some(t) => note.fact(Fact::StopAt, t),
                None => note,
            });
        }
    }

    /// Observe mode: each would-stop once per idle episode (`coders`: would be Coder's countdown).
    pub(super) fn would_stop(&mut self, view: &PassView, plan: &mut Plan, coders: &IdSet<String>) {
        let order: Vec<&Listed> =
            view.fleet.stop_order.iter().filter_map(|&i| view.judged.get(i)).filter(|j| !coders.contains(&j.workspace.id)).collect();
        let current: IdSet<&str> = order.iter().map(|j| j.workspace.id.as_str()).collect();
        self.reported.retain(|id| current.contains(id.as_str()));
        for j in order {
            if !self.reported.insert(j.workspace.id.clone()) {
                continue;
            }
            let event = stop_event(AuditKind::WouldStop, view, self.config.mode, j);
            let count = Count::Stop { reason: event.reason, mode: self.config.mode };
            plan.notes.push(Note::new(Level::Info, "would_stop", event.message.clone()).announce(event).count(count));
            self.acted.would_stop.push(j.workspace.id.clone());
        }
    }

    /// A workspace Coder stopped at the end of its countdown: its `resumed` line comes as for a
    /// stop of the service's own.
    pub(super) fn stopped_by_coder(&mut self, done: AuditEvent) {
        let at = done.time;
        self.serving.done(&done.workspace_id, at);
        self.stopped.insert(done.workspace_id.clone(), (Box::new(done), at));
    }

    /// Coder's autostop build at a countdown's end failed: its pod keeps its GPU. The stop is
    /// the service's own from now on, a failed one due at once (the retries of workspaces no
    /// longer listed send it, under the guard of that failed build).
    pub(super) fn adopt_failed(&mut self, event: AuditEvent, build_id: String) {
        let retry_at = event.time;
        // No GPU is on its way; the service's own stop counts again once sent.
        self.serving.ended(&event.workspace_id);
        self.stops
            .entry(event.workspace_id.clone())
            .or_insert_with(|| TrackedStop::recovered(event, StopState::Failed { retry_at, build_id: Some(build_id) }));
    }

    /// Coder's stop at a countdown's end serves a waiter of the workspace's pool, as a stop of
    /// the service's own does from its POST.
    pub(super) fn serve_coders_stop(&mut self, workspace_id: &str, pool: usize) {
        self.serving.sent(workspace_id, pool);
    }

    /// A counted-down workspace was stopped or rebuilt otherwise: nothing serves a waiter.
    pub(super) fn coders_stop_ended(&mut self, workspace_id: &str) {
        self.serving.ended(workspace_id);
    }

    /// Workspaces this service stopped that run again: one `resumed` line each, with the
    /// GPU-seconds they gave back. Forgotten after `STOPPED_MEMORY`.
    fn resumed(&mut self, view: &PassView, plan: &mut Plan) {
        for j in view.judged {
            let ws = &j.workspace;
            let Some((done, at)) = self.stopped.remove(&ws.id) else { continue };
            // It runs again since its start build (on Coder's clock), not since this pass saw
            // it: after a restart that may be long ago.
            let started = ws.latest_build.created_at.map(|t| t - view.coder_offset).filter(|t| *t > at && *t < view.now);
            let time = started.unwrap_or(view.now);
            let given_back = gpu_seconds_given_back(done.gpus.unwrap_or(0), at, time).round() as i64;
            let event = AuditEvent { event: AuditKind::Resumed, time, gpu_seconds_given_back: Some(given_back), ..*done };
            let text = "a workspace this service stopped runs again";
            plan.notes.push(Note::new(Level::Info, "resumed", text).fact(Fact::GpuSecondsGivenBack, given_back).audit(event));
        }
        let now = view.now;
        self.stopped.retain(|_, (_, at)| now - *at < STOPPED_MEMORY);
    }

    /// Every stop build in flight is read this pass.
    fn follow(&self, plan: &mut Plan) {
        let mut in_flight: Vec<(&String, &str)> = self.stops.iter().filter_map(|(id, t)| Some((id, t.state.in_flight()?))).collect();
        in_flight.sort();
        for (id, build) in in_flight {
            plan.calls.push(Call::FollowStop { workspace_id: id.clone(), build_id: build.to_string() });
        }
    }

    /// Drops tracking of workspaces that got a new build (a new session: start afresh, once a
    /// stop in flight is final), of canceled stops whose workspace is active again (a new idle
    /// episode may stop it), and of any other stop not in flight whose workspace is not listed
    /// running and whose state has not changed for a day.
    fn reconcile(&mut self, view: &PassView) {
        if self.stops.is_empty() {
            return;
        }
        let listed: IdMap<&str, (&str, bool)> = view
            .judged
            .iter()
            .map(|j| (j.workspace.id.as_str(), (j.workspace.latest_build.id.as_str(), j.decision.is_stop_eligible())))
            .collect();
        let now = view.now;
        self.stops.retain(|id, t| match listed.get(id.as_str()) {
            Some((build, _)) if *build != t.session => t.state.in_flight().is_some(),
            Some((_, eligible)) => *eligible || t.state != StopState::Canceled,
            None => {
                t.state.in_flight().is_some()
                    || (t.no_provisioner_since.is_some() && matches!(t.state, StopState::Reaped { .. }))
                    || now - t.since < Duration::days(1)
            }
        });
    }

    /// For every reaped stop not yet sent again: one provisioner listing per organization and
    /// tag set. Without an answer, a build in the same organization that completed since the
    /// reap stands in (decided now, from the listing).
    fn provisioners_for_reaped(&mut self, view: &PassView, plan: &mut Plan) {
        let mut keys: Vec<(String, JobTags, DateTime<Utc>)> = self
            .stops
            .values()
            .filter_map(|t| match &t.state {
                StopState::Reaped { at, .. } if !t.resent_after_reap => Some((t.organization.clone(), t.tags.clone(), *at)),
                _ => None,
            })
            .collect();
        keys.sort_by(|a, b| (&a.0, &a.1, a.2).cmp(&(&b.0, &b.1, b.2)));
        for (organization, tags, reaped_at) in keys {
            let key = (organization.clone(), tags.clone());
            if self.pending.provisioners_fallback.contains_key(&key) {
                continue;
            }
            let completed = view
                .judged
                .iter()
                .map(|j| &j.workspace)
                .filter(|w| needs_at_least(&w.latest_build.job.tags, &tags))
                .map(|w| (w.organization_id.as_str(), w.latest_build.job.completed_at));
            self.pending.provisioners_fallback.insert(key, provisioners_answer(&organization, reaped_at, completed));
            plan.calls.push(Call::ListProvisioners { organization, tags });
        }
    }

    /// Since when stops needing `tags` in this organization wait for a provisioner, if they do.
    fn waiting_for_provisioner(&self, organization: &str, tags: &JobTags) -> Option<DateTime<Utc>> {
        self.stops
            .values()
            .filter(|t| t.state.in_flight().is_some() || matches!(t.state, StopState::Reaped { .. }))
            .filter(|t| t.organization == organization && needs_at_least(tags, &t.tags))
            .filter_map(|t| t.no_provisioner_since)
            .min()
    }

    /// The stops to send this pass, in the fleet rules' stop slots (none while the breaker
    /// holds): first the stop order, less workspaces with a stop in flight, backing off,
    /// canceled or abandoned; then, in the slots left, due retries of stops of workspaces no
    /// longer listed as running (their latest build is our failed or reaped stop). A stop that
    /// needs tags no provisioner answers for is held.
    fn stops_to_send(&mut self, view: &PassView, plan: &mut Plan, coders: &IdSet<String>) {
        let mut candidates = Vec::new();
        for j in view.fleet.stop_order.iter().filter_map(|&i| view.judged.get(i)).filter(|j| !coders.contains(&j.workspace.id)) {
            let ws = &j.workspace;
            let due = match self.stops.get(&ws.id).map(|t| &t.state) {
                None => true,
                Some(StopState::Failed { retry_at, .. }) => *retry_at <= view.now,
                Some(_) => false,
            };
            if due {
                let event = stop_event(AuditKind::StopSent, view, self.config.mode, j);
                let c = Candidate {
                    event,
                    pool: j.decision.pool,
                    session: ws.latest_build.id.to_string(),
                    organization: ws.organization_id.to_string(),
                    last_used_at: ws.last_used_at,
                    tags: ws.latest_build.job.tags.clone(),
                };
                candidates.push((c, ws.latest_build.id.to_string()));
            }
        }
        let slots_left = view.fleet.stop_slots.saturating_sub(candidates.len());
        // Tracked stops of workspaces not listed: only when some stop is tracked.
        let listed: IdSet<&str> =
            if self.stops.is_empty() { IdSet::default() } else { view.judged.iter().map(|j| j.workspace.id.as_str()).collect() };
        let mut retries: Vec<(&String, &TrackedStop, String)> = self
            .stops
            .iter()
            .filter(|(id, _)| !listed.contains(id.as_str()))
            .filter_map(|(id, t)| match &t.state {
                StopState::Failed { retry_at, build_id: Some(b) } if *retry_at <= view.now => Some((id, t, b.clone())),
                StopState::Reaped { build_id, .. } if !t.resent_after_reap && t.provisioner_answered => Some((id, t, build_id.clone())),
                _ => None,
            })
            .collect();
        retries.sort_by(|a, b| a.0.cmp(b.0));
        for (_, t, build) in retries.into_iter().take(slots_left) {
            let c = Candidate {
                event: AuditEvent { time: view.now, ..t.event.clone() },
                pool: t.pool,
                session: t.session.clone(),
                organization: t.organization.clone(),
                last_used_at: t.last_used_at,
                tags: t.tags.clone(),
            };
            candidates.push((c, build));
        }
        for (c, expect_build) in candidates {
            let own = self.stops.get(&c.event.workspace_id).and_then(|t| t.no_provisioner_since);
            if let Some(since) = self.waiting_for_provisioner(&c.organization, &c.tags).filter(|_| own.is_none()) {
                let text = "no provisioner for these tags: the stop waits until one answers";
                let note = Note::new(Level::Info, "stop_held", text).about(&c.event).fact(Fact::Tags, &c.tags).fact(Fact::Since, since);
                plan.notes.push(note);
                continue;
            }
            let last_used_at = (!expects_use(c.event.reason)).then_some(c.last_used_at);
            let (organization, tags) = (c.organization.clone(), c.tags.clone());
            plan.calls.push(Call::Stop(Box::new(StopCall { event: c.event.clone(), expect_build, last_used_at, organization, tags })));
            self.pending.stops.insert(c.event.workspace_id.clone(), c);
        }
    }

    /// The tracked stop of a planned one, created when this is the episode's first attempt.
    fn track(&mut self, id: &str) -> Option<&mut TrackedStop> {
        let c = self.pending.stops.get(id)?.clone();
        let now = self.pending.now;
        let t = self.stops.entry(id.to_string()).or_insert_with(|| TrackedStop {
            event: c.event.clone(),
            since: now,
            session: c.session.clone(),
            organization: c.organization.clone(),
            pool: c.pool,
            last_used_at: c.last_used_at,
            attempts: 0,
            stuck_reported: false,
            resent_after_reap: false,
            provisioner_answered: false,
            tags: c.tags.clone(),
            no_provisioner_since: None,
            state: StopState::Failed { retry_at: now, build_id: None },
        });
        t.event = c.event;
        Some(t)
    }

    /// What became of a planned stop.
    fn stop_answered(&mut self, id: &str, answer: StopAnswer, notes: &mut Vec<Note>) {
        let Some(c) = self.pending.stops.get(id).cloned() else { return };
        let now = self.pending.now;
        match answer {
            StopAnswer::Moved { latest_build, last_used_at } => {
                let text = "the workspace was used or built since it was judged: no stop is sent; deciding afresh next pass";
                let note = Note::new(Level::Info, "stop_not_sent_used", text).about(&c.event);
                notes.push(note.fact(Fact::LatestBuild, latest_build).fact(Fact::LastUsedAt, last_used_at));
                self.stops.remove(id);
                self.acted.not_sent_used.push(id.to_string());
            }
            StopAnswer::Unread(f) => {
                let text = "cannot read the workspace just before stopping it: no stop is sent; deciding again next pass";
                notes.push(Note::new(Level::Warn, "stop_deferred_unread", text).about(&c.event).error(f.text));
            }
            StopAnswer::Held => {
                let text = "another stop needing these tags found no provisioner this pass: the stop waits until one answers";
                notes.push(Note::new(Level::Info, "stop_held", text).about(&c.event).fact(Fact::Tags, &c.tags));
            }
            StopAnswer::AuditFailed => {
                let text =
                    "the audit log cannot be written: the stop is not sent (no stop without its audit line); fix the audit log's volume";
                notes.push(Note::new(Level::Error, "stop_not_sent", text).about(&c.event).count(Count::StopFailure(StopFailure::Audit)));
            }
            StopAnswer::Queued(build) => {
                self.sent(id, &build.id, false, notes);
                self.note_provisioners(id, &build, notes);
            }
            StopAnswer::Unclear { reply, latest } => {
                let ours = latest.filter(|b| b.id != c.session && self.is_our_stop(b));
                match (ours, reply) {
                    (Some(build), _) => self.sent(id, &build.id, true, notes),
                    (None, Ok(message)) => {
                        let text = "another build is active; deciding again next pass";
                        let event = AuditEvent { event: AuditKind::StopNotSent, time: now, ..c.event.clone() };
                        notes.push(Note::new(Level::Info, "stop_deferred", text).fact(Fact::Detail, message).audit(event));
                        self.stops.remove(id);
                        self.acted.build_active.push(id.to_string());
                    }
                    (None, Err(f)) => self.refused(id, &f, notes),
                }
            }
            StopAnswer::Refused(f) => self.refused(id, &f, notes),
        }
    }

    /// A stop build by this service's user (without a known user, any stop build).
    fn is_our_stop(&self, b: &WorkspaceBuild) -> bool {
        let by_us = match (&self.self_id, &b.initiator_id) {
            (Some(me), Some(initiator)) => me == initiator,
            _ => true,
        };
        b.transition == Transition::Stop && by_us
    }

    fn refused(&mut self, id: &str, f: &Failure, notes: &mut Vec<Note>) {
        let Some(t) = self.track(id) else { return };
        t.attempts += 1;
        let event = t.event.clone();
        let note = Note::new(Level::Warn, "stop_failed", "the stop build was refused").about(&event).error(f.text.clone());
        notes.push(note.count(Count::StopFailure(StopFailure::Rejected)));
        self.fail(id, None, &f.text, notes);
    }

    /// Records a stop build Coder created: exactly once per build id.
    fn sent(&mut self, id: &str, build_id: &str, lost_reply: bool, notes: &mut Vec<Note>) {
        if self.stops.get(id).and_then(|t| t.state.in_flight()) == Some(build_id) {
            return;
        }
        let now = self.pending.now;
        let Some(t) = self.track(id) else { return };
        if matches!(t.state, StopState::Reaped { .. }) {
            t.resent_after_reap = true;
        }
        t.attempts += 1;
        t.since = now;
        t.state = StopState::Sent { build_id: build_id.to_string() };
        t.event = AuditEvent { event: AuditKind::StopSent, time: now, build_id: Some(build_id.to_string()), ..t.event.clone() };
        let (event, attempts, pool) = (t.event.clone(), t.attempts, t.pool);
        self.serving.sent(id, pool);
        let count = Count::Stop { reason: event.reason, mode: self.config.mode };
        let note = Note::new(Level::Info, "stop_sent", event.message.clone()).build(build_id).fact(Fact::Attempt, attempts);
        notes.push(note.fact(Fact::ReplyLost, lost_reply).announce(event).count(count));
        self.acted.stops_sent.push(id.to_string());
    }

    /// A refused POST or a failed stop build: back off, or abandon after the last attempt.
    fn fail(&mut self, id: &str, failed_build: Option<String>, error: &str, notes: &mut Vec<Note>) {
        let now = self.pending.now;
        let interval = self.config.interval;
        let Some(t) = self.stops.get_mut(id) else { return };
        if t.attempts >= MAX_STOP_ATTEMPTS {
            self.abandon(id, notes);
            return;
        }
        let delay = stop_backoff(interval, t.attempts);
        // A refused POST for a workspace whose stop build had failed (or was reaped) keeps that
        // build: the retry's guard checks that nobody built or used the workspace since.
        let previous = match &t.state {
            StopState::Failed { build_id, .. } => build_id.clone(),
            StopState::Reaped { build_id, .. } => Some(build_id.clone()),
            _ => None,
        };
        t.state = StopState::Failed { retry_at: now + delay, build_id: failed_build.or(previous) };
        t.since = now;
        let text = "the stop did not happen; trying again later";
        let (attempt, retry_in) = (t.attempts, human(delay));
        notes.push(
            Note::new(Level::Info, "stop_retry_scheduled", text)
                .fact(Fact::Attempt, attempt)
                .fact(Fact::RetryIn, retry_in)
                .error(error)
                .audit(t.change(AuditKind::StopFailed, now)),
        );
        self.acted.failed.push(id.to_string());
    }

    fn abandon(&mut self, id: &str, notes: &mut Vec<Note>) {
        let now = self.pending.now;
        let Some(t) = self.stops.get_mut(id) else { return };
        t.state = StopState::Abandoned;
        t.no_provisioner_since = None;
        t.since = now;
        let text = "giving up on stopping this workspace until its next build; look at its build log, the provisioners and the token's permissions in Coder";
        let note = Note::new(Level::Error, "stop_abandoned", text).fact(Fact::Attempts, t.attempts);
        notes.push(note.announce(t.change(AuditKind::StopAbandoned, now)).count(Count::StopFailure(StopFailure::Abandoned)));
        self.acted.abandoned.push(id.to_string());
    }

    /// What Coder says of the provisioners for a stop build: its tags, and while it is pending,
    /// `matched_provisioners` (filled only then; `available` counts daemons seen since 90 s
    /// before the job was created, reference NOTES §16). A reaped stop is left to the listing.
    fn note_provisioners(&mut self, id: &str, build: &WorkspaceBuild, notes: &mut Vec<Note>) {
        let now = self.pending.now;
        let Some(t) = self.stops.get_mut(id) else { return };
        if !build.job.tags.is_empty() {
            t.tags.clone_from(&build.job.tags);
        }
        match (build.job.status, build.matched_provisioners) {
            (JobStatus::Pending, Some(m)) if m.available == 0 => {
                if t.no_provisioner_since.is_none() {
                    t.no_provisioner_since = Some(now);
                    let text = format!(
                        "no provisioner for tags {} is available: the stop waits, and so does every new stop that needs the same tags; check the provisioner daemons in Coder",
                        t.tags
                    );
                    notes.push(
                        Note::new(Level::Error, "no_provisioner", text)
                            .about(&t.event)
                            .build(&build.id)
                            .fact(Fact::Tags, &t.tags)
                            .fact(Fact::Matched, m.count),
                    );
                }
            }
            (JobStatus::Failed, _) => {}
            _ => t.no_provisioner_since = None,
        }
    }

    /// What a provisioner listing for reaped stops said.
    fn provisioners_listed(&mut self, organization: &str, tags: &JobTags, answer: Result<bool, Failure>, notes: &mut Vec<Note>) {
        let key = (organization.to_string(), tags.clone());
        let available = match answer {
            Ok(available) => available,
            Err(f) => {
                let text = "cannot list the provisioner daemons for a reaped stop; a build with its tags completed in its organization since stands in";
                notes.push(Note::new(Level::Warn, "provisioners_unknown", text).error(f.text).fact(Fact::Tags, tags));
                self.pending.provisioners_fallback.get(&key).copied().unwrap_or(false)
            }
        };
        let now = self.pending.now;
        for t in self.stops.values_mut() {
            let reaped = matches!(t.state, StopState::Reaped { .. }) && !t.resent_after_reap;
            if !reaped || t.organization != organization || &t.tags != tags {
                continue;
            }
            t.provisioner_answered = available;
            if available {
                t.no_provisioner_since = None;
            } else if t.no_provisioner_since.is_none() {
                t.no_provisioner_since = Some(now);
                let text = format!(
                    "no provisioner for tags {tags}: the reaped stop is sent again once one answers; stops that need the same tags wait"
                );
                notes.push(Note::new(Level::Error, "no_provisioner", text).about(&t.event));
            }
        }
    }

    /// A stop build in flight, read: its job moves the tracked stop (`stop_lifecycle::job_change`).
    fn followed(&mut self, id: &str, build_id: &str, answer: Result<WorkspaceBuild, Failure>, notes: &mut Vec<Note>) {
        let now = self.pending.now;
        let build = match answer {
            Ok(b) => b,
            Err(f) => {
                let event = self.stops.get(id).map(|t| t.event.clone());
                let mut note = Note::new(Level::Warn, "stop_follow_failed", "cannot read the stop build; trying again next pass")
                    .build(build_id)
                    .error(f.text);
                if let Some(e) = &event {
                    note = note.about(e);
                }
                notes.push(note);
                return;
            }
        };
        self.note_provisioners(id, &build, notes);
        let stop_timeout = self.config.stop_timeout;
        let Some(t) = self.stops.get_mut(id) else { return };
        let Some(change) = job_change(&t.state, &build.job, now - t.since, stop_timeout, t.stuck_reported) else { return };
        // A stop that ends without stopping frees no GPU: it serves no waiter.
        if matches!(change, JobChange::Canceled | JobChange::Reaped | JobChange::Failed) {
            self.serving.ended(id);
        }
        let Some(t) = self.stops.get_mut(id) else { return };
        let error = build.job.error.clone().unwrap_or_default();
        match change {
            JobChange::Running => {
                t.state = StopState::Running { build_id: build_id.to_string() };
                let note = Note::new(Level::Info, "stop_running", "a provisioner took the stop build").build(build_id);
                notes.push(note.audit(t.change(AuditKind::StopRunning, now)));
            }
            JobChange::Stuck => {
                t.stuck_reported = true;
                t.state = StopState::Stuck { build_id: build_id.to_string() };
                let text = "the stop build is still pending: no provisioner has taken it; check the provisioner daemons in Coder (it is not sent again while pending; Coder's job reaper fails it after 30 minutes)";
                let note = Note::new(Level::Error, "stop_stuck", text).build(build_id).fact(Fact::PendingFor, human(now - t.since));
                notes.push(note.audit(t.change(AuditKind::StopStuck, now)).count(Count::StopFailure(StopFailure::Stuck)));
                self.acted.stuck.push(id.to_string());
            }
            JobChange::Succeeded => {
                let Some(t) = self.stops.remove(id) else { return };
                // When Coder finished it (on this machine's clock), not when a pass saw it:
                // after a restart that may be long before.
                let offset = self.pending.coder_offset;
                let at = build.job.completed_at.map(|c| c - offset).filter(|c| *c <= now && *c >= t.since).unwrap_or(now);
                let done = AuditEvent { event: AuditKind::StopDone, time: at, ..t.event };
                let text = "the workspace is stopped; its GPU is free";
                notes.push(Note::new(Level::Info, "stop_done", text).build(build_id).audit(done.clone()));
                self.stopped.insert(id.to_string(), (Box::new(done), at));
                self.acted.stops_done.push(id.to_string());
                self.serving.done(id, now);
            }
            JobChange::Canceled => {
                t.state = StopState::Canceled;
                t.since = now;
                let text = "a person canceled the stop build; it is not sent again while the workspace stays idle";
                notes.push(Note::new(Level::Warn, "stop_canceled", text).build(build_id).audit(t.change(AuditKind::StopCanceled, now)));
            }
            JobChange::Reaped if t.resent_after_reap => {
                let text = "Coder's job reaper failed the stop build again";
                let note = Note::new(Level::Error, "stop_reaped", text).build(build_id).error(error);
                notes.push(note.audit(t.change(AuditKind::StopReaped, now)).count(Count::StopFailure(StopFailure::Reaped)));
                self.abandon(id, notes);
            }
            JobChange::Reaped => {
                let at = build.job.completed_at.unwrap_or(now);
                t.state = StopState::Reaped { build_id: build_id.to_string(), at };
                t.since = now;
                t.provisioner_answered = false;
                let text = "Coder's job reaper failed the stop build: no provisioner took it; the workspace keeps its GPU and is stopped once more when a provisioner for its tags answers again";
                let note = Note::new(Level::Error, "stop_reaped", text).build(build_id).error(error);
                notes.push(note.audit(t.change(AuditKind::StopReaped, now)).count(Count::StopFailure(StopFailure::Reaped)));
            }
            JobChange::Failed => {
                let text = "the stop build did not succeed; retrying later";
                let note = Note::new(Level::Warn, "stop_failed", text).build(build_id).fact(Fact::JobStatus, build.job.status.as_str());
                let note = note.error(error.clone());
                notes.push(note.count(Count::StopFailure(StopFailure::BuildFailed)));
                let acted_failed = self.acted.failed.len();
                self.fail(id, Some(build_id.to_string()), &error, notes);
                // A failed build is not a refused stop this pass.
                self.acted.failed.truncate(acted_failed);
            }
        }
    }

    /// A stop whose `stop_sending` line a previous run left without an outcome, settled by the
    /// workspace's latest build: a stop build by this service's user created around the POST is
    /// the stop (written as sent, found, and followed); anything else means it was not sent.
    fn settled(&mut self, id: String, answer: Result<Option<WorkspaceBuild>, Failure>, notes: &mut Vec<Note>) {
        let Some(sending) = self.unconfirmed.remove(&id) else { return };
        let latest = match answer {
            Ok(Some(b)) => b,
            Ok(None) => return,
            Err(f) => {
                let text = "cannot read the workspace to settle a stop of the previous run; asking again next pass";
                notes.push(Note::new(Level::Warn, "stop_check_deferred", text).about(&sending).error(f.text));
                self.unconfirmed.insert(id, sending);
                return;
            }
        };
        let by_us = matches!((&self.self_id, &latest.initiator_id), (Some(me), Some(initiator)) if me == initiator);
        // Created around the POST (its time on this machine's clock, within the request's
        // timeout and some skew), by this service's user, and a stop.
        let offset = self.pending.coder_offset;
        let around = latest.created_at.is_some_and(|c| {
            let c = c - offset;
            c >= sending.time - Duration::minutes(2) && c <= sending.time + Duration::minutes(2)
        });
        if latest.transition == Transition::Stop && by_us && around {
            let event = AuditEvent {
                event: AuditKind::StopSent,
                build_id: Some(latest.id.to_string()),
                message: format!("{} (found after a restart: sent before the previous run ended)", sending.message),
                ..sending
            };
            let text = "a stop sent before the previous run ended was found in Coder's builds";
            notes.push(Note::new(Level::Info, "stop_found", text).build(&latest.id).audit(event.clone()));
            self.stops.insert(id.clone(), TrackedStop::recovered(event, StopState::Sent { build_id: latest.id.to_string() }));
            self.acted.stops_sent.push(id);
        } else {
            let text = "a stop about to be sent when the previous run ended was not sent";
            notes.push(Note::new(Level::Info, "stop_not_found", text).audit(AuditEvent { event: AuditKind::StopNotSent, ..sending }));
        }
    }

    /// Stop builds reported stuck and still pending (for the status document).
    pub(super) fn stuck_stops(&self) -> Vec<StuckStop> {
        let mut out: Vec<StuckStop> = self
            .stops
            .values()
            .filter_map(|t| match &t.state {
                StopState::Stuck { build_id } => Some(StuckStop {
                    workspace_id: t.event.workspace_id.clone(),
                    workspace: t.event.workspace.clone(),
                    owner: t.event.owner.clone(),
                    build_id: build_id.clone(),
                    pending_since: t.since,
                }),
                _ => None,
            })
            .collect();
        out.sort_by(|a, b| a.workspace_id.cmp(&b.workspace_id));
        out
    }

    /// Stops that wait for a provisioner, by organization and tags (for the status document).
    pub(super) fn without_provisioner(&self) -> Vec<NoProvisioner> {
        let mut out: Vec<NoProvisioner> = Vec::new();
        for t in self.stops.values() {
            let Some(since) = t.no_provisioner_since else { continue };
            match out.iter_mut().find(|n| n.organization_id == t.organization && n.tags == t.tags) {
                Some(n) => {
                    n.since = n.since.min(since);
                    n.stops += 1;
                }
                None => out.push(NoProvisioner { organization_id: t.organization.clone(), tags: t.tags.clone(), since, stops: 1 }),
            }
        }
        out.sort_by(|a, b| (&a.organization_id, &a.tags).cmp(&(&b.organization_id, &b.tags)));
        out
    }
}
