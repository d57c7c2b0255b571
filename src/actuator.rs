//! The actuator: the only code with side effects toward Coder or people (stop builds, TTL
//! restores, warnings, webhook events, audit lines), and the one place that reads the mode.
//!
//! It tracks every stop across passes, keyed by workspace: a stop build is followed until its
//! job is final; a refused or failed stop backs off (doubling from one interval, at most 30 min)
//! and is abandoned after `MAX_STOP_ATTEMPTS`; a stop whose reply was lost (a timeout, then 409,
//! or the latest build being our stop) counts as sent, once. Tracking starts afresh when the
//! workspace gets a new build. No new stop starts once shutdown began.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use tokio::sync::watch;

use crate::audit::{AuditEvent, AuditKind, AuditLog, Notifier};
use crate::coder::types::{JobStatus, Transition, Workspace, WorkspaceBuild};
use crate::coder::{CoderClient, ErrorKind, StopOutcome};
use crate::decide::{Verdict, human};
use crate::error::Error;
use crate::evaluate::Evaluation;
use crate::metrics::{Metrics, StopFailureLabels, StopLabels};
use crate::retry::RetryPolicy;
use crate::startup::Identity;

/// How many times a stop is tried before it is abandoned (until the workspace's next build).
pub const MAX_STOP_ATTEMPTS: u32 = 5;
/// The longest wait between two attempts to stop one workspace.
pub const MAX_STOP_BACKOFF: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// Refuses to start when the token may not do what the mode needs: reading workspaces always,
/// stopping them in enforce mode (in observe mode a missing stop permission is a warning, so a
/// rollout can begin with a read-only token).
pub fn require_permissions(mode: Mode, identity: &Identity) -> Result<(), Error> {
    if let Some(why) = identity.cannot_read() {
        return Err(Error::Config(why));
    }
    match (mode, identity.cannot_stop()) {
        (_, None) => Ok(()),
        (Mode::Enforce, Some(why)) => Err(Error::Config(why)),
        (Mode::Observe, Some(why)) => {
            tracing::warn!(event = "permission_missing", "{why}; observe mode goes on, but --enforce would refuse to start");
            Ok(())
        }
    }
}

/// Observe (report only) or enforce (send stop builds).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Mode {
    Observe,
    Enforce,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Observe => "observe",
            Mode::Enforce => "enforce",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Mode::Observe => "observe mode: decisions are logged and reported, nothing is stopped (pass --enforce to act)",
            Mode::Enforce => "enforce mode: idle workspaces are stopped with Coder stop builds",
        }
    }

    /// The countdown of a warning, as people read it in the status API and the template's
    /// metadata: only enforce mode promises a stop.
    pub fn countdown(self, left: Duration) -> String {
        match self {
            Mode::Enforce => format!("stops in {} unless it becomes active", human(left)),
            Mode::Observe => format!("would stop in {} unless it becomes active (observe mode: nothing is stopped)", human(left)),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum StopState {
    /// Coder created `build_id`; following it until its job is final.
    InFlight { build_id: String },
    /// The POST was refused or the build failed; try again at `retry_at` if still eligible.
    /// `failed_build` is our stop build that failed, if that is how it failed.
    Failed { retry_at: DateTime<Utc>, failed_build: Option<String> },
    /// Every attempt failed: nothing more until the workspace gets a new build.
    Abandoned { since: DateTime<Utc> },
}

#[derive(Debug, Clone)]
struct TrackedStop {
    event: AuditEvent,
    /// When the current state began (for a stop in flight: when it was sent).
    since: DateTime<Utc>,
    /// `stop_stuck` was reported for this stop build.
    stuck: bool,
    /// The build the stop was decided on (the running start build): a different latest build
    /// in the listing means a new session, and tracking starts afresh.
    session: String,
    attempts: u32,
    state: StopState,
}

/// Where stop events go besides the logs.
#[derive(Default, Clone)]
pub struct Outputs {
    pub audit: Option<Arc<AuditLog>>,
    pub notifier: Option<Notifier>,
}

impl Outputs {
    /// Opens the audit log and builds the webhook client named in the settings.
    pub fn open(settings: &crate::config::Settings) -> Result<Self, Error> {
        Ok(Outputs {
            audit: settings.audit_log.as_deref().map(AuditLog::open).transpose()?.map(Arc::new),
            notifier: settings.notify_webhook.clone().map(|url| Notifier::new(url, &settings.tls)).transpose()?,
        })
    }
}

/// How often and how long the actuator tries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StopLimits {
    /// Between passes: a failed stop's first retry waits this long.
    pub interval: std::time::Duration,
    pub max_stops_per_pass: usize,
    /// A stop build pending longer than this (no provisioner took it) is reported as stuck.
    pub stop_timeout: std::time::Duration,
}

/// A stop build that has stayed pending longer than `stop_timeout`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StuckStop {
    pub workspace_id: String,
    pub workspace: String,
    pub owner: String,
    pub build_id: String,
    pub pending_since: DateTime<Utc>,
}

/// What `act` did this pass (for tests, logs and the demo).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ActReport {
    pub stops_sent: Vec<String>,
    pub would_stop: Vec<String>,
    pub build_active: Vec<String>,
    pub failed: Vec<String>,
    pub abandoned: Vec<String>,
    /// Stop builds that became stuck this pass (reported once each).
    pub stuck: Vec<String>,
    /// Workspaces whose stop build succeeded this pass: their GPUs are free.
    pub stops_done: Vec<String>,
}

/// One stop to attempt this pass.
struct Candidate {
    event: AuditEvent,
    session: String,
}

pub struct Actuator {
    mode: Mode,
    coder: CoderClient,
    metrics: Arc<Metrics>,
    outputs: Outputs,
    backoff: RetryPolicy,
    max_stops_per_pass: usize,
    stop_timeout: Duration,
    /// The token's user: stop builds it initiated are ours (a lost reply is recognised by it).
    self_id: Option<String>,
    tracked: HashMap<String, TrackedStop>,
    /// Workspaces this service stopped, until they run again (the `resumed` audit line).
    stopped: HashMap<String, (AuditEvent, DateTime<Utc>)>,
    /// Observe mode: workspaces already reported as would-stop in this idle episode.
    reported: HashSet<String>,
}

impl Actuator {
    pub fn new(
        mode: Mode,
        coder: CoderClient,
        metrics: Arc<Metrics>,
        outputs: Outputs,
        limits: StopLimits,
        self_id: Option<String>,
    ) -> Self {
        // A failed stop waits one pass, then twice as long each time, at most 30 minutes.
        let interval = limits.interval;
        let backoff =
            RetryPolicy { initial: interval, max_interval: MAX_STOP_BACKOFF.max(interval), max_elapsed: std::time::Duration::ZERO };
        tracing::info!(event = "mode", mode = mode.as_str(), "{}", mode.describe());
        Actuator {
            mode,
            coder,
            metrics,
            outputs,
            backoff,
            max_stops_per_pass: limits.max_stops_per_pass,
            stop_timeout: crate::duration::chrono(limits.stop_timeout),
            self_id,
            tracked: HashMap::new(),
            stopped: HashMap::new(),
            reported: HashSet::new(),
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The token's user changed (a rotated token of another account): its stops are ours.
    pub fn set_self_id(&mut self, id: String) {
        self.self_id = Some(id);
    }

    /// Stops being followed, retried later, or abandoned.
    pub fn tracked_count(&self) -> usize {
        self.tracked.len()
    }

    fn announce(&self, event: &AuditEvent, to_audit: bool) {
        if to_audit {
            if let Some(a) = &self.outputs.audit {
                a.append(event);
            }
        }
        if let Some(n) = &self.outputs.notifier {
            n.send(event);
        }
    }

    /// Acts on one evaluation: announces warnings that began, sends the stops the fleet rules
    /// chose (or reports them in observe mode), retries due ones, restores TTLs, and follows
    /// stop builds in flight.
    pub async fn act(&mut self, eval: &Evaluation, shutdown: &watch::Receiver<bool>) -> ActReport {
        let now = eval.now;
        let mut report = ActReport::default();
        // The one place the mode is checked.
        if self.mode == Mode::Observe {
            self.announce_warnings(eval, AuditKind::WouldWarn);
            self.observe(eval, &mut report);
            return report;
        }
        self.announce_warnings(eval, AuditKind::Warn);
        self.resumed(eval);
        self.follow(now, &mut report).await;
        self.reconcile(now, &eval.workspaces);
        if eval.fleet.breaker.is_none() {
            let candidates = self.candidates(eval);
            for c in candidates {
                if *shutdown.borrow() {
                    tracing::info!(event = "stop_skipped_shutdown", workspace_id = %c.event.workspace_id, "shutting down: no new stop");
                    break;
                }
                self.stop(now, c, &mut report).await;
            }
        }
        self.restore_ttls(eval, shutdown).await;
        report
    }

    fn announce_warnings(&self, eval: &Evaluation, kind: AuditKind) {
        for &i in &eval.new_warnings {
            let event = AuditEvent::new(kind, eval.now, self.mode.as_str(), &eval.workspaces[i], &eval.decisions[i]);
            tracing::info!(event = kind.as_str(), workspace_id = %event.workspace_id, owner = %event.owner, reason = event.reason, stop_at = ?event.stop_at, "{}", event.text());
            self.announce(&event, false);
        }
    }

    /// Observe mode: report each would-stop once per idle episode, and would-be TTL restores.
    fn observe(&mut self, eval: &Evaluation, report: &mut ActReport) {
        let chosen: Vec<usize> = if eval.fleet.breaker.is_none() { eval.fleet.stop_order.clone() } else { Vec::new() };
        let current: HashSet<&str> = chosen.iter().map(|&i| eval.decisions[i].workspace_id.as_str()).collect();
        self.reported.retain(|id| current.contains(id.as_str()));
        for i in chosen {
            let (ws, d) = (&eval.workspaces[i], &eval.decisions[i]);
            if !self.reported.insert(ws.id.clone()) {
                continue;
            }
            let event = AuditEvent {
                gpus: eval.gpus.get(i).copied(),
                ..AuditEvent::new(AuditKind::WouldStop, eval.now, self.mode.as_str(), ws, d)
            };
            tracing::info!(event = "would_stop", workspace_id = %event.workspace_id, owner = %event.owner, reason = event.reason, "{}", event.message);
            self.metrics.stops.get_or_create(&StopLabels { reason: event.reason, mode: "observe" }).inc();
            self.announce(&event, true);
            report.would_stop.push(event.workspace_id);
        }
        for (ws, d) in eval.workspaces.iter().zip(&eval.decisions) {
            if let Some(ttl) = d.restore_ttl_ms {
                tracing::info!(event = "would_restore_ttl", workspace_id = %ws.id, owner = %ws.owner_name, ttl_ms = ttl, "would set the autostop TTL back");
            }
        }
    }

    /// Workspaces this service stopped that run again: one `resumed` audit line each, with the
    /// GPU-seconds they gave back. Forgotten after 8 days (deleted, or never started again).
    fn resumed(&mut self, eval: &Evaluation) {
        for ws in &eval.workspaces {
            let Some((done, at)) = self.stopped.remove(&ws.id) else { continue };
            let gpus = done.gpus.unwrap_or(0);
            let event = AuditEvent {
                event: AuditKind::Resumed,
                time: eval.now,
                gpu_seconds_given_back: Some((eval.now - at).num_seconds().max(0) * gpus as i64),
                ..done
            };
            tracing::info!(event = "resumed", workspace_id = %ws.id, gpu_seconds_given_back = event.gpu_seconds_given_back, "a workspace this service stopped runs again");
            if let Some(a) = &self.outputs.audit {
                a.append(&event);
            }
        }
        self.stopped.retain(|_, (_, at)| eval.now - *at < Duration::days(8));
    }

    /// Drops tracking of workspaces that got a new build (a new session: start afresh) and of
    /// abandoned stops whose workspace has not been seen running for a day.
    fn reconcile(&mut self, now: DateTime<Utc>, workspaces: &[Workspace]) {
        let latest: HashMap<&str, &str> = workspaces.iter().map(|w| (w.id.as_str(), w.latest_build.id.as_str())).collect();
        self.tracked.retain(|id, t| match latest.get(id.as_str()) {
            Some(build) => *build == t.session,
            None => !matches!(t.state, StopState::Abandoned { since } if now - since > Duration::days(1)),
        });
    }

    /// The stops to attempt this pass, at most the cap: workspaces the fleet rules chose that
    /// are not in flight, backing off or abandoned, then due retries of failed stop builds
    /// (their workspace is no longer listed as running, so it has no decision this pass).
    fn candidates(&self, eval: &Evaluation) -> Vec<Candidate> {
        let mut out = Vec::new();
        for &i in &eval.fleet.stop_order {
            let (ws, d) = (&eval.workspaces[i], &eval.decisions[i]);
            let due = match self.tracked.get(&ws.id).map(|t| &t.state) {
                None => true,
                Some(StopState::Failed { retry_at, .. }) => *retry_at <= eval.now,
                Some(StopState::InFlight { .. } | StopState::Abandoned { .. }) => false,
            };
            if due {
                let event = AuditEvent {
                    gpus: eval.gpus.get(i).copied(),
                    ..AuditEvent::new(AuditKind::StopSent, eval.now, self.mode.as_str(), ws, d)
                };
                out.push(Candidate { event, session: ws.latest_build.id.clone() });
            }
        }
        let listed: HashSet<&str> = eval.workspaces.iter().map(|w| w.id.as_str()).collect();
        for (id, t) in &self.tracked {
            if let StopState::Failed { retry_at, failed_build: Some(_) } = &t.state {
                if *retry_at <= eval.now && !listed.contains(id.as_str()) {
                    out.push(Candidate { event: AuditEvent { time: eval.now, ..t.event.clone() }, session: t.session.clone() });
                }
            }
        }
        out.truncate(self.max_stops_per_pass);
        out
    }

    async fn stop(&mut self, now: DateTime<Utc>, c: Candidate, report: &mut ActReport) {
        let id = c.event.workspace_id.clone();
        let previous = self.tracked.get(&id).cloned();
        let attempts = previous.as_ref().map_or(0, |t| t.attempts) + 1;
        if let Some(StopState::Failed { failed_build: Some(failed), .. }) = previous.as_ref().map(|t| &t.state) {
            // Retrying a failed stop build of a workspace that is not listed as running: only
            // while nobody has built it since (its latest build is still our failed stop).
            match self.coder.workspace(&id).await {
                Ok(ws) if ws.latest_build.id == *failed => {}
                Ok(_) => {
                    tracing::info!(event = "stop_retry_dropped", workspace_id = %id, "the workspace was built again since the failed stop; deciding afresh");
                    self.tracked.remove(&id);
                    return;
                }
                Err(e) => {
                    tracing::warn!(event = "stop_retry_deferred", workspace_id = %id, error = %e, "cannot read the workspace; retrying later");
                    return;
                }
            }
        }
        let outcome = self.coder.stop_workspace(&id).await;
        let lost_reply = match &outcome {
            Ok(StopOutcome::BuildActive(_)) => true,
            Err(e) => matches!(e.kind, ErrorKind::Transport | ErrorKind::Status(500..=599)),
            Ok(StopOutcome::Queued(_)) => false,
        };
        // A timeout after Coder created the build, then a 409 on the retry, is still our stop:
        // the latest build tells.
        let ours = if lost_reply { self.our_stop_build(&id).await } else { None };
        match (outcome, ours) {
            (Ok(StopOutcome::Queued(build)), _) => self.sent(now, c, attempts, &build.id, false, report),
            (_, Some(build)) => self.sent(now, c, attempts, &build.id, true, report),
            (Ok(StopOutcome::BuildActive(msg)), None) => {
                tracing::info!(event = "stop_deferred", workspace_id = %id, detail = %msg, "another build is active; deciding again next pass");
                self.tracked.remove(&id);
                report.build_active.push(id);
            }
            (Err(e), None) => {
                tracing::warn!(event = "stop_failed", workspace_id = %id, owner = %c.event.owner, error = %e, attempt = attempts, "the stop build was refused");
                self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: "rejected" }).inc();
                self.fail(now, c.event, c.session, attempts, None, report);
            }
        }
    }

    /// The workspace's latest build, if it is a stop this service's user started.
    async fn our_stop_build(&self, workspace_id: &str) -> Option<WorkspaceBuild> {
        let ws = self.coder.workspace(workspace_id).await.ok()?;
        let b = ws.latest_build;
        let by_us = match (&self.self_id, &b.initiator_id) {
            (Some(me), Some(initiator)) => me == initiator,
            _ => true,
        };
        (b.transition == Transition::Stop && by_us).then_some(b)
    }

    /// Records a stop build Coder created: exactly once per build id.
    fn sent(&mut self, now: DateTime<Utc>, c: Candidate, attempts: u32, build_id: &str, lost_reply: bool, report: &mut ActReport) {
        let id = c.event.workspace_id.clone();
        if self.tracked.get(&id).is_some_and(|t| t.state == StopState::InFlight { build_id: build_id.to_string() }) {
            return;
        }
        let event = AuditEvent { event: AuditKind::StopSent, time: now, build_id: Some(build_id.to_string()), ..c.event };
        tracing::info!(event = "stop_sent", workspace_id = %id, owner = %event.owner, reason = event.reason, build_id = %build_id, attempt = attempts, reply_lost = lost_reply, "{}", event.message);
        self.metrics.stops.get_or_create(&StopLabels { reason: event.reason, mode: "enforce" }).inc();
        self.announce(&event, true);
        let state = StopState::InFlight { build_id: build_id.to_string() };
        self.tracked.insert(id.clone(), TrackedStop { event, since: now, stuck: false, session: c.session, attempts, state });
        report.stops_sent.push(id);
    }

    fn fail(
        &mut self,
        now: DateTime<Utc>,
        event: AuditEvent,
        session: String,
        attempts: u32,
        failed_build: Option<String>,
        report: &mut ActReport,
    ) {
        let id = event.workspace_id.clone();
        if attempts >= MAX_STOP_ATTEMPTS {
            let event = AuditEvent { event: AuditKind::StopAbandoned, time: now, attempts: Some(attempts), ..event };
            tracing::error!(event = "stop_abandoned", workspace_id = %id, owner = %event.owner, attempts, "giving up on stopping this workspace until its next build; look at its build log and the token's permissions in Coder");
            self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: "abandoned" }).inc();
            self.announce(&event, true);
            let state = StopState::Abandoned { since: now };
            self.tracked.insert(id.clone(), TrackedStop { event, since: now, stuck: false, session, attempts, state });
            report.abandoned.push(id);
            return;
        }
        let delay = crate::duration::chrono(self.backoff.delay_for_attempt(attempts));
        let state = StopState::Failed { retry_at: now + delay, failed_build };
        self.tracked.insert(id.clone(), TrackedStop { event, since: now, stuck: false, session, attempts, state });
        report.failed.push(id);
    }

    /// Follows every in-flight stop build: `stop_done` when its job succeeds, `stop_failed`
    /// (and a later retry) when it fails or is canceled, `stop_stuck` (once, and never a second
    /// stop) when its job stays pending past `stop_timeout`: no provisioner took it.
    async fn follow(&mut self, now: DateTime<Utc>, report: &mut ActReport) {
        let in_flight: Vec<(String, String)> = self
            .tracked
            .iter()
            .filter_map(|(id, t)| match &t.state {
                StopState::InFlight { build_id } => Some((id.clone(), build_id.clone())),
                _ => None,
            })
            .collect();
        for (id, build_id) in in_flight {
            let build = match self.coder.workspace_build(&build_id).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(event = "stop_follow_failed", workspace_id = %id, build_id = %build_id, error = %e, "cannot read the stop build; trying again next pass");
                    continue;
                }
            };
            let status = build.job.status;
            if !status.is_final() {
                let stuck_timeout = self.stop_timeout;
                if let Some(t) =
                    self.tracked.get_mut(&id).filter(|t| !t.stuck && status == JobStatus::Pending && now - t.since >= stuck_timeout)
                {
                    t.stuck = true;
                    tracing::error!(event = "stop_stuck", workspace_id = %id, owner = %t.event.owner, build_id = %build_id, pending_for = %human(now - t.since), "the stop build is still pending: no provisioner has taken it; check the provisioner daemons in Coder (it is not sent again)");
                    self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: "stuck" }).inc();
                    report.stuck.push(id.clone());
                }
                continue;
            }
            let Some(tracked) = self.tracked.remove(&id) else { continue };
            if status == JobStatus::Succeeded {
                tracing::info!(event = "stop_done", workspace_id = %id, owner = %tracked.event.owner, build_id = %build_id, "the workspace is stopped; its GPU is free");
                report.stops_done.push(id.clone());
                let done = AuditEvent { event: AuditKind::StopDone, time: now, ..tracked.event };
                if let Some(a) = &self.outputs.audit {
                    a.append(&done);
                }
                self.stopped.insert(id.clone(), (done, now));
            } else {
                let error = build.job.error.unwrap_or_default();
                tracing::warn!(event = "stop_failed", workspace_id = %id, owner = %tracked.event.owner, build_id = %build_id, job_status = status.as_str(), error = %error, "the stop build did not succeed; retrying later");
                self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: "build_failed" }).inc();
                let mut ignored = ActReport::default();
                self.fail(now, tracked.event, tracked.session, tracked.attempts, Some(build_id), &mut ignored);
            }
        }
        self.metrics.stuck_stops.set(self.stuck_stops().len() as i64);
    }

    /// Stop builds reported stuck and still pending (for the status document).
    pub fn stuck_stops(&self) -> Vec<StuckStop> {
        let mut out: Vec<StuckStop> = self
            .tracked
            .values()
            .filter(|t| t.stuck)
            .filter_map(|t| match &t.state {
                StopState::InFlight { build_id } => Some(StuckStop {
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

    async fn restore_ttls(&self, eval: &Evaluation, shutdown: &watch::Receiver<bool>) {
        for (ws, d) in eval.workspaces.iter().zip(&eval.decisions) {
            let Some(ttl) = d.restore_ttl_ms else { continue };
            if *shutdown.borrow() || d.verdict == Verdict::Reclaim {
                continue;
            }
            match self.coder.set_ttl(&ws.id, Some(ttl)).await {
                Ok(()) => {
                    let e = AuditEvent::new(AuditKind::RestoreTtl, eval.now, self.mode.as_str(), ws, d);
                    tracing::info!(event = "restore_ttl", workspace_id = %e.workspace_id, owner = %e.owner, ttl_ms = ttl, "set the autostop TTL back");
                    self.metrics.ttl_restores.inc();
                    if let Some(a) = &self.outputs.audit {
                        a.append(&e);
                    }
                }
                Err(err) => {
                    tracing::warn!(event = "restore_ttl_failed", workspace_id = %ws.id, error = %err, "could not set the autostop TTL back")
                }
            }
        }
    }
}
