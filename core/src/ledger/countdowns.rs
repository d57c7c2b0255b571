//! Coder's countdown in the ledger (`countdown_in_coder`; the rules are `pass::countdown`'s): a
//! reclaim the fleet rules chose moves Coder's deadline (`Call::Extend`, a `countdown_set` line)
//! and the stop path leaves it to Coder; while it runs the service sends nothing; once its
//! workspace is no longer listed running, what Coder did is read (`Call::FollowCountdown`): a
//! stop build with reason `autostop` that succeeded is a reclaim (`countdown_done`, GPU-hours
//! given back as for a stop of the service's own). A use before the deadline averts it
//! (`countdown_averted`), a workspace judged no longer idle withdraws it, and either puts back a
//! deadline Coder did not move; a deadline passed without Coder's stop is the service's own stop
//! again (`countdown_expired`). Refusals are remembered per build; a failed move is tried again
//! next pass, at most `MAX_COUNTDOWN_FAILURES` times per build, then the service stops it itself.

use crate::ids::{IdMap, IdSet};

use chrono::{DateTime, Duration, Utc};

use super::intent::{Acted, Call, Count, CountingDown, Fact, Failure, LedgerConfig, Level, Listed, Note, PassView, Plan, SaidOnce, Who};
use super::tracked::stop_event;
use crate::coder::types::{BuildReason, JobStatus, Transition, WorkspaceBuild};
use crate::pass::audit::{AuditEvent, AuditKind, AuditRecord, Extension};
use crate::pass::countdown::{self, Countdown, Start};
use crate::pass::decide::Verdict;

/// Failed moves (no answer, 5xx) of one build's countdown before the service stops it itself.
pub const MAX_COUNTDOWN_FAILURES: u32 = 3;

/// What `countdown_in_coder` puts in an audit line's `limited_by`.
const COUNTDOWN: &str = "countdown_in_coder";

/// A countdown in progress.
#[derive(Debug, Clone)]
struct Running {
    countdown: Countdown,
    /// Its `countdown_set` event: who, why, how many GPUs.
    event: AuditEvent,
    expired_said: bool,
    ended_said: bool,
    /// Its GPU pool (`Policy::pools`), and whether Coder's stop at its end already counts as
    /// serving a waiter of that pool (`ledger::serving`).
    pool: usize,
    serving: bool,
}

/// A move planned this pass.
#[derive(Debug, Clone)]
enum Planned {
    Set { countdown: Countdown, event: AuditEvent, pool: usize },
    Restore { event: AuditEvent },
}

/// What the ledger remembers of Coder's countdowns.
#[derive(Debug)]
pub(super) struct Countdowns {
    config: LedgerConfig,
    running: IdMap<String, Running>,
    /// Per workspace, the build whose countdown Coder refused or that failed, how often
    /// (`MAX_COUNTDOWN_FAILURES` for a refusal), and, after a move whose answer was lost, the
    /// deadline before it (the move may have been applied: a later pass that finds the
    /// countdown's deadline there knows it was this service's).
    failed: IdMap<String, (String, u32, Option<DateTime<Utc>>)>,
    /// Per workspace, the build for which a once-per-build line was already said.
    said_once: SaidOnce,
    planned: IdMap<String, Planned>,
    /// Coder's stops at countdowns' ends that began serving a waiter this pass: (workspace, pool).
    serving_new: Vec<(String, usize)>,
    now: DateTime<Utc>,
    coder_offset: Duration,
    pub(super) acted: Acted,
}

/// The audit event of a countdown's move of Coder's deadline from `from` to `to`.
fn move_event(kind: AuditKind, view: &PassView, mode: &'static str, j: &Listed, from: DateTime<Utc>, to: DateTime<Utc>) -> AuditEvent {
    AuditEvent {
        build_id: Some(j.workspace.latest_build.id.to_string()),
        extension: Some(Extension {
            deadline_from: from,
            deadline_to: to,
            deadline_limit: to,
            limited_by: COUNTDOWN,
            sm_active_peak: None,
            gr_engine_active_peak: None,
        }),
        ..stop_event(kind, view, mode, j)
    }
}

impl Countdowns {
    pub(super) fn new(config: LedgerConfig) -> Self {
        Countdowns {
            config,
            running: IdMap::default(),
            failed: IdMap::default(),
            said_once: SaidOnce::default(),
            planned: IdMap::default(),
            serving_new: Vec::new(),
            now: DateTime::<Utc>::MIN_UTC,
            coder_offset: Duration::zero(),
            acted: Acted::default(),
        }
    }

    /// A pass begins: what the last one planned is dropped; what is remembered of workspaces no
    /// longer listed is forgotten (but countdowns, which are followed until Coder says).
    pub(super) fn begin(&mut self, view: &PassView) {
        self.acted = Acted::default();
        self.planned.clear();
        (self.now, self.coder_offset) = (view.now, view.coder_offset);
        if self.failed.is_empty() && self.said_once.is_empty() && self.running.is_empty() {
            return;
        }
        let builds: IdMap<&str, &str> =
            view.judged.iter().map(|j| (j.workspace.id.as_str(), j.workspace.latest_build.id.as_str())).collect();
        self.failed.retain(|id, (b, _, _)| builds.get(id.as_str()) == Some(&b.as_str()));
        self.said_once.retain(|id, b| builds.get(id) == Some(&b));
        self.running.retain(|id, r| builds.get(id.as_str()).is_none_or(|b| *b == r.countdown.build_id));
    }

    /// Enforce mode: the countdowns to start, the ones running, ended and expired, and the ones to
    /// follow. Returns the workspaces whose stop Coder makes this pass (the stop path skips them).
    pub(super) fn plan(&mut self, view: &PassView, plan: &mut Plan) -> IdSet<String> {
        let mut coders = IdSet::default();
        let coder_now = view.coder_now();
        let interval = self.config.interval.to_std().unwrap_or_default();
        // The countdowns running (none, most passes: the listing is not walked), then new ones,
        // from the stop order only.
        let mut seen: IdSet<&str> = IdSet::default();
        if !self.running.is_empty() {
            for j in view.judged {
                if self.running.contains_key(&j.workspace.id) {
                    seen.insert(j.workspace.id.as_str());
                    self.running_one(view, plan, j, interval, &mut coders);
                }
            }
        }
        for j in view.fleet.stop_order.iter().filter_map(|&i| view.judged.get(i)) {
            let (ws, d) = (j.workspace, j.decision);
            if seen.contains(ws.id.as_str()) {
                continue;
            }
            let Some(length) = d.countdown.filter(|_| d.verdict == Verdict::Reclaim) else { continue };
            let failed = self.failed.get(&ws.id).filter(|(b, _, _)| *b == ws.latest_build.id);
            if failed.is_some_and(|(_, n, _)| *n >= MAX_COUNTDOWN_FAILURES) {
                continue;
            }
            let lost_move = failed.and_then(|(_, _, original)| *original);
            match countdown::start(coder_now, ws, length, d.reason) {
                Start::OwnStop(why) => {
                    if self.said_once.first_time("countdown_not_set", &ws.id, &ws.latest_build.id) {
                        let text = format!("Coder's countdown cannot be used: {why}; the reclaimer stops it itself");
                        let mut note = Note::new(Level::Info, "countdown_not_set", text);
                        note.who = Some(Who::of_workspace(ws));
                        plan.notes.push(note);
                    }
                }
                Start::Sooner { deadline } => {
                    // After a move whose answer was lost, a deadline this soon is that move's.
                    let countdown = Countdown {
                        build_id: ws.latest_build.id.to_string(),
                        last_used_at: ws.last_used_at,
                        original_deadline: lost_move.unwrap_or(deadline),
                        deadline,
                        moved: lost_move.is_some(),
                    };
                    let event = move_event(AuditKind::CountdownSet, view, self.config.mode, j, deadline, deadline);
                    let text = "idle, and Coder's own autostop deadline is sooner than the countdown: Coder stops it then";
                    plan.notes.push(Note::new(Level::Info, "countdown_sooner", text).about(&event).fact(Fact::Deadline, deadline));
                    let pool = d.pool;
                    self.running
                        .insert(ws.id.clone(), Running { countdown, event, expired_said: false, ended_said: false, pool, serving: false });
                    self.acted.counting_down.push(CountingDown { workspace_id: ws.id.clone(), until: deadline, set: true });
                    coders.insert(ws.id.clone());
                }
                Start::Set { to } if !view.shutting_down => {
                    let from = countdown::coder_deadline(ws).unwrap_or(to);
                    let event = move_event(AuditKind::CountdownSet, view, self.config.mode, j, from, to);
                    let countdown = Countdown {
                        build_id: ws.latest_build.id.to_string(),
                        last_used_at: ws.last_used_at,
                        original_deadline: from,
                        deadline: to,
                        moved: true,
                    };
                    plan.calls.push(Call::Extend { workspace_id: ws.id.clone(), to, event: Box::new(event.clone()) });
                    self.planned.insert(ws.id.clone(), Planned::Set { countdown, event, pool: d.pool });
                    coders.insert(ws.id.clone());
                }
                Start::Set { .. } => {}
            }
        }
        if self.running.is_empty() {
            return coders;
        }
        let listed: IdSet<&str> = view.judged.iter().map(|j| j.workspace.id.as_str()).collect();
        let mut gone: Vec<&String> = self.running.keys().filter(|id| !listed.contains(id.as_str())).collect();
        gone.sort();
        plan.calls.extend(gone.iter().map(|id| Call::FollowCountdown { workspace_id: (*id).clone() }));
        // Gone past its deadline: Coder is stopping it, and its GPU is on its way to a waiter of
        // its pool (one waiter, one stop: the fleet rules count it from the next pass).
        for (id, r) in self.running.iter_mut().filter(|(id, _)| !listed.contains(id.as_str())) {
            if !r.serving && coder_now >= r.countdown.deadline {
                r.serving = true;
                self.serving_new.push((id.clone(), r.pool));
            }
        }
        coders
    }

    /// A listed workspace with a countdown: still idle, it runs (or has expired); no longer
    /// idle, it ends.
    fn running_one(&mut self, view: &PassView, plan: &mut Plan, j: &Listed, interval: std::time::Duration, coders: &mut IdSet<String>) {
        let (ws, d) = (j.workspace, j.decision);
        let coder_now = view.coder_now();
        let Some(r) = self.running.get_mut(&ws.id) else { return };
        // The breaker holds every stop (a broken exporter reads as zeros): Coder's countdown is one
        // too, and is withdrawn like any countdown of a workspace no longer judged idle. An ended
        // countdown whose deadline is still to be put back never resumes.
        if d.verdict == Verdict::Reclaim && view.fleet.breaker.is_none() && !r.ended_said {
            countdown::follow_coder(&mut r.countdown, ws);
            if countdown::expired(coder_now, &r.countdown, interval) {
                if !r.expired_said {
                    r.expired_said = true;
                    let event = AuditEvent { event: AuditKind::CountdownExpired, time: view.now, ..r.event.clone() };
                    let text = format!(
                        "Coder's countdown ended at {} and Coder has not stopped it (autostop switched off since, a blocked lifecycle executor, no provisioner?): the reclaimer stops it",
                        crate::pass::mode::at(r.countdown.deadline)
                    );
                    plan.notes.push(Note::new(Level::Warn, "countdown_expired", text).audit(event));
                }
                return;
            }
            self.acted.counting_down.push(CountingDown { workspace_id: ws.id.clone(), until: r.countdown.deadline, set: true });
            coders.insert(ws.id.clone());
            return;
        }
        let end = countdown::end(coder_now, ws, &r.countdown);
        if !r.ended_said {
            r.ended_said = true;
            let base = AuditEvent { time: view.now, reason: d.reason.as_str(), message: d.message.clone(), ..r.event.clone() };
            if end.averted {
                let text = "used again before Coder's countdown ended: it keeps running";
                let event = AuditEvent { event: AuditKind::CountdownAverted, ..base };
                plan.notes.push(Note::new(Level::Info, "countdown_averted", text).audit(event).count(Count::CountdownAverted));
                self.acted.countdowns_averted.push(ws.id.clone());
            } else {
                let text = match &view.fleet.breaker {
                    Some(_) => "the circuit breaker holds every stop this pass: Coder's countdown is withdrawn".to_string(),
                    None => format!("no longer idle ({}): Coder's countdown is withdrawn", d.reason.as_str()),
                };
                let event = AuditEvent { event: AuditKind::CountdownWithdrawn, ..base };
                plan.notes.push(Note::new(Level::Info, "countdown_withdrawn", text).audit(event));
            }
        }
        match end.restore {
            Some(to) if !view.shutting_down => {
                let from = countdown::coder_deadline(ws).unwrap_or(r.countdown.deadline);
                let event = move_event(AuditKind::CountdownRestored, view, self.config.mode, j, from, to);
                plan.calls.push(Call::Extend { workspace_id: ws.id.clone(), to, event: Box::new(event.clone()) });
                self.planned.insert(ws.id.clone(), Planned::Restore { event });
            }
            Some(_) => {}
            None => {
                self.running.remove(&ws.id);
            }
        }
    }

    /// Observe mode: what enforce mode would count down, said once per build. Returns the
    /// workspaces whose stop would be Coder's.
    pub(super) fn would(&mut self, view: &PassView, plan: &mut Plan) -> IdSet<String> {
        let mut coders = IdSet::default();
        let coder_now = view.coder_now();
        for &i in &view.fleet.stop_order {
            let Some(j) = view.judged.get(i) else { continue };
            let (ws, d) = (j.workspace, j.decision);
            let Some(length) = d.countdown.filter(|_| d.verdict == Verdict::Reclaim) else { continue };
            let (until, set) = match countdown::start(coder_now, ws, length, d.reason) {
                Start::OwnStop(_) => continue,
                Start::Sooner { deadline } => (deadline, true),
                Start::Set { to } => (to, false),
            };
            if !set && self.said_once.first_time("would_countdown", &ws.id, &ws.latest_build.id) {
                let from = countdown::coder_deadline(ws).unwrap_or(until);
                let event = move_event(AuditKind::WouldCountdown, view, self.config.mode, j, from, until);
                let text =
                    format!("would start Coder's countdown to {} (observe mode: the deadline is not moved)", crate::pass::mode::at(until));
                plan.notes.push(Note::new(Level::Info, "would_countdown", text).fact(Fact::To, until).audit(event));
            }
            self.acted.counting_down.push(CountingDown { workspace_id: ws.id.clone(), until, set });
            coders.insert(ws.id.clone());
        }
        coders
    }

    /// Reads back the countdowns a previous run left running: a workspace whose latest countdown
    /// line is `countdown_set` (no end after it) is counted down again, so that a return still
    /// puts back the deadline this service moved and Coder's stop is still read as a reclaim.
    /// Its `last_used_at` then is not in the line: the line's time stands for it (a use after the
    /// countdown began is a return). Returns how many.
    pub(super) fn recover(&mut self, records: Vec<AuditRecord>) -> usize {
        // Per workspace: its latest `countdown_set`, whether a line ended it for good since
        // (done, expired, its deadline put back), and whether one ended it while its deadline
        // may still be to put back (averted, withdrawn).
        let mut latest: IdMap<String, (AuditRecord, bool, bool)> = IdMap::default();
        for r in records {
            match r.kind() {
                Some(AuditKind::CountdownSet) => {
                    latest.insert(r.workspace_id.clone(), (r, false, false));
                }
                Some(AuditKind::CountdownAverted | AuditKind::CountdownWithdrawn) => {
                    if let Some(l) = latest.get_mut(&r.workspace_id) {
                        l.2 = true;
                    }
                }
                Some(_) => {
                    if let Some(l) = latest.get_mut(&r.workspace_id) {
                        l.1 = true;
                    }
                }
                None => {}
            }
        }
        for (id, (r, over, ended)) in latest {
            let (Some(build_id), Some(from), Some(to)) = (r.build_id.clone(), r.deadline_from, r.deadline_to) else { continue };
            if over {
                continue;
            }
            let countdown = Countdown { build_id, last_used_at: r.time, original_deadline: from, deadline: to, moved: from != to };
            let event = AuditEvent { extension: None, ..AuditEvent::recovered(AuditKind::CountdownSet, &r) };
            self.running.insert(id, Running { countdown, event, expired_said: false, ended_said: ended, pool: 0, serving: false });
        }
        self.running.len()
    }

    /// Coder's stops that began serving a waiter this pass, for the stop path's count.
    pub(super) fn take_serving(&mut self) -> Vec<(String, usize)> {
        std::mem::take(&mut self.serving_new)
    }

    /// The workspaces whose deadline this pass moves for a countdown (no extension is planned
    /// for them this pass: one write per workspace).
    pub(super) fn moving(&self) -> IdSet<String> {
        self.planned.keys().cloned().collect()
    }

    /// Whether this pass planned a move of this workspace's deadline (its answer is ours).
    pub(super) fn planned(&self, id: &str) -> bool {
        self.planned.contains_key(id)
    }

    /// Coder's answer to a move of the deadline.
    pub(super) fn moved(&mut self, id: &str, answer: Result<(), Failure>, notes: &mut Vec<Note>) {
        let Some(planned) = self.planned.remove(id) else { return };
        match (planned, answer) {
            (Planned::Set { countdown, event, pool }, Ok(())) => {
                let text = format!(
                    "idle: Coder's autostop deadline moved to {}; Coder warns its owner and stops it then unless someone uses it",
                    crate::pass::mode::at(countdown.deadline)
                );
                let note = Note::new(Level::Info, "countdown_set", text).fact(Fact::From, countdown.original_deadline);
                notes.push(note.fact(Fact::To, countdown.deadline).audit(event.clone()).count(Count::CountdownSet));
                let until = countdown.deadline;
                self.running
                    .insert(id.to_string(), Running { countdown, event, expired_said: false, ended_said: false, pool, serving: false });
                self.acted.counting_down.push(CountingDown { workspace_id: id.to_string(), until, set: true });
            }
            (Planned::Set { countdown, event, .. }, Err(f)) => {
                let refused = f.is_refusal();
                let n = match self.failed.get(id) {
                    Some((b, n, _)) if *b == countdown.build_id => n + 1,
                    _ => 1,
                };
                let n = if refused { MAX_COUNTDOWN_FAILURES } else { n };
                let maybe_moved = f.is_unclear().then_some(countdown.original_deadline);
                self.failed.insert(id.to_string(), (countdown.build_id, n, maybe_moved));
                let text = if n >= MAX_COUNTDOWN_FAILURES {
                    "Coder did not take the countdown's deadline: the reclaimer stops it itself from the next pass"
                } else {
                    "could not move Coder's deadline for the countdown; trying again next pass"
                };
                let kind = if refused { "countdown_refused" } else { "countdown_failed" };
                notes.push(Note::new(Level::Warn, kind, text).about(&event).error(f.text));
            }
            (Planned::Restore { event }, answer) => {
                match answer {
                    Ok(()) => {
                        let to = event.extension.as_ref().map(|x| x.deadline_to);
                        let note = Note::new(Level::Info, "countdown_restored", "Coder's autostop deadline moved back after its countdown");
                        notes.push(
                            match to {
                                Some(to) => note.fact(Fact::To, to),
                                None => note,
                            }
                            .audit(event),
                        );
                    }
                    Err(f) if !f.is_refusal() => {
                        let text = "could not move Coder's deadline back after its countdown; trying again next pass";
                        notes.push(Note::new(Level::Warn, "countdown_restore_failed", text).about(&event).error(f.text));
                        return;
                    }
                    Err(f) => {
                        let text = "Coder refuses to move the deadline back after its countdown: Coder may stop it at the countdown's deadline; extend it in Coder's dashboard";
                        notes.push(Note::new(Level::Warn, "countdown_restore_refused", text).about(&event).error(f.text));
                    }
                }
                self.running.remove(id);
            }
        }
    }

    /// What became of a workspace counted down that is no longer listed running: for the stop
    /// path, a stop Coder made at its end (`countdown_done`), or one Coder's build failed.
    pub(super) fn followed(
        &mut self,
        id: &str,
        answer: Result<Option<WorkspaceBuild>, Failure>,
        notes: &mut Vec<Note>,
    ) -> Option<Followed> {
        let b = match answer {
            Ok(Some(b)) => b,
            Ok(None) => {
                self.running.remove(id);
                return None;
            }
            Err(_) => return None,
        };
        let autostop = b.transition == Transition::Stop && b.reason == BuildReason::Autostop;
        if autostop && b.job.status.is_active() {
            return None;
        }
        let r = self.running.remove(id)?;
        if !autostop {
            // Stopped, rebuilt or deleted otherwise (its owner, another tool, the service's own
            // stop after expiry): not Coder's countdown.
            let text = format!(
                "its countdown ended without Coder's autostop: its latest build is a {} by {}",
                b.transition.as_str(),
                b.reason.as_str()
            );
            notes.push(Note::new(Level::Info, "countdown_ended", text).about(&r.event).build(b.id));
            return Some(Followed::Ended);
        }
        if b.job.status != JobStatus::Succeeded {
            let text = format!(
                "Coder's autostop build at the end of the countdown is {}: its pod keeps its GPU; the reclaimer stops it itself",
                b.job.status.as_str()
            );
            notes.push(Note::new(Level::Warn, "countdown_stop_failed", text).about(&r.event).build(b.id.clone()));
            let event = AuditEvent { time: self.now, build_id: Some(b.id.to_string()), ..r.event };
            return Some(Followed::StopFailed { event, build_id: b.id.to_string() });
        }
        let time = b.job.completed_at.map_or(self.now, |t| (t - self.coder_offset).min(self.now));
        let done = AuditEvent { event: AuditKind::CountdownDone, time, build_id: Some(b.id.to_string()), ..r.event };
        let text = "Coder stopped it at the end of its countdown: its GPU is free";
        notes.push(Note::new(Level::Info, "countdown_done", text).audit(done.clone()));
        self.acted.stops_done.push(id.to_string());
        Some(Followed::Done(done))
    }
}

/// What a read of a counted-down workspace that is no longer listed found, for the stop path.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Followed {
    /// Coder stopped it: a reclaim (its `resumed` line comes as for the service's own stops).
    Done(AuditEvent),
    /// Coder's autostop build failed (or was canceled, reaped): the pod keeps its GPU, and the
    /// service's own stop is tried as for a stop of its own that failed.
    StopFailed { event: AuditEvent, build_id: String },
    /// Stopped, rebuilt or deleted otherwise: not Coder's countdown, and no GPU on its way.
    Ended,
}
