//! The actuator: the only code with side effects toward Coder or people (stop builds, TTL
//! restores, warnings, webhook events, audit lines), and the one place that decides by the mode
//! (`acts`; other modules only show it or phrase texts with it, see `mode`).
//!
//! It tracks every stop across passes, keyed by workspace, through the states of
//! `stop_lifecycle` (each change one audit line): a stop build is followed until its job is
//! final; a refused or failed stop backs off (doubling from one interval, at most 30 min) and is
//! abandoned after `MAX_STOP_ATTEMPTS`; a stop Coder's job reaper failed is sent once more when
//! a provisioner matching its tags answers; while a stop finds none, new stops that need the
//! same tags are held; a pending stop is withdrawn when its workspace is used again; a canceled
//! one is not sent again in that idle episode; a stop whose reply was lost (a timeout, then 409,
//! or the latest build being our stop) counts as sent, once. Tracking starts afresh when the
//! workspace gets a new build. No new stop starts once shutdown began. It also keeps busy work
//! running: Coder's deadline of a workspace whose GPU computes is moved (`extend_deadlines`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use tokio::sync::watch;

use crate::coder::actions::CoderActions;
use crate::coder::identity::Identity;
use crate::coder::types::{JobStatus, Transition, Workspace, WorkspaceBuild};
use crate::coder::{ErrorKind, StopOutcome};
use crate::duration::human;
use crate::error::Error;
use tracing::Instrument;

use crate::logging::workspace_span;
use crate::pass::audit::{AuditEvent, AuditKind, AuditLog, Extension, Notifier, gpu_seconds_given_back};
use crate::pass::deadline::{DeadlineAction, DeadlinePlan};
use crate::pass::decide::Verdict;
use crate::pass::evaluate::{Evaluation, Judged};
use crate::pass::metrics::{ExtensionFailure, ExtensionFailureLabels, Metrics, StopFailure, StopFailureLabels, StopLabels, TemplateLabels};
use crate::pass::mode::Mode;
use crate::pass::stop_lifecycle::{JobChange, StopState, provisioners_answer};
use crate::retry::RetryPolicy;

/// How many times a stop is tried before it is abandoned (until the workspace's next build).
pub const MAX_STOP_ATTEMPTS: u32 = 5;
/// How long shutdown waits for webhook deliveries in flight.
pub const NOTIFY_DRAIN: std::time::Duration = std::time::Duration::from_secs(3);
/// The longest wait between two attempts to stop one workspace.
pub const MAX_STOP_BACKOFF: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// Refuses to start when the token may not do what the mode needs: reading workspaces always,
/// stopping them in enforce mode (in observe mode a missing stop permission is a warning, so a
/// rollout can begin with a read-only token).
pub fn require_permissions(mode: Mode, identity: &Identity) -> Result<(), Error> {
    if let Some(why) = identity.cannot_read() {
        return Err(Error::Config(why));
    }
    match identity.cannot_stop() {
        None => Ok(()),
        Some(why) if acts(mode) => Err(Error::Config(why)),
        Some(why) => {
            tracing::warn!(event = "permission_missing", "{why}; observe mode goes on, but --enforce would refuse to start");
            Ok(())
        }
    }
}

/// Whether the mode sends stop builds: the one place in the crate where the mode is checked.
fn acts(mode: Mode) -> bool {
    matches!(mode, Mode::Enforce)
}

#[derive(Debug, Clone)]
struct TrackedStop {
    event: AuditEvent,
    /// When the current state began (for a stop in flight: when it was sent).
    since: DateTime<Utc>,
    /// The build the stop was decided on (the running start build): a different latest build
    /// in the listing means a new session, and tracking starts afresh.
    session: String,
    organization: String,
    /// `last_used_at` when the stop was decided: a later one means the workspace was used
    /// since, and the idle episode is over.
    last_used_at: DateTime<Utc>,
    /// Stop POSTs so far, sent or refused (a succeeded stop ends tracking).
    attempts: u32,
    /// `stop_stuck` was written this idle episode.
    stuck_reported: bool,
    /// A reaped stop was sent again this idle episode.
    resent_after_reap: bool,
    /// Coder refused to withdraw the pending stop (412: a provisioner took it; another 4xx):
    /// not asked again.
    withdraw_refused: bool,
    /// The provisioner tags its build needs (the start's, until Coder answered with the stop's).
    tags: Tags,
    /// Since when no provisioner matching `tags` is available for it (Coder's
    /// `matched_provisioners.available` of the pending stop is 0, or after a reap, the
    /// organization's daemon listing shows none): it is not sent again meanwhile, nor is any new
    /// stop that needs the same tags.
    no_provisioner_since: Option<DateTime<Utc>>,
    state: StopState,
}

impl TrackedStop {
    /// A stop a previous run sent, read back from the audit log (`Actuator::recover`): followed
    /// as any stop in flight; its session is unknown, so a listed running build ends it.
    fn recovered(event: AuditEvent, state: StopState) -> Self {
        TrackedStop {
            since: event.time,
            session: String::new(),
            organization: String::new(),
            last_used_at: event.time,
            attempts: 1,
            stuck_reported: false,
            resent_after_reap: false,
            withdraw_refused: false,
            tags: Tags::default(),
            no_provisioner_since: None,
            state,
            event,
        }
    }
}

/// Provisioner tags (`job.tags`).
pub type Tags = crate::coder::types::JobTags;

/// Stops that wait for a provisioner matching their tags (status document, `check`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct NoProvisioner {
    pub organization_id: String,
    pub tags: Tags,
    pub since: DateTime<Utc>,
    /// How many tracked stops wait for these tags.
    pub stops: usize,
}

impl NoProvisioner {
    /// "no provisioner for tags {...} since <time>: ...", as the page and the plan show it.
    pub fn words(&self) -> String {
        format!(
            "no provisioner for tags {} since {}: {} stop(s) wait, and new stops that need these tags are held; check the provisioner daemons in Coder",
            self.tags,
            self.since.format("%Y-%m-%d %H:%M:%S UTC"),
            self.stops
        )
    }
}

/// Whether a job with `tags` needs at least what one with `other` needs (`other` ⊆ `tags`, as
/// coderd's `provisioner_tagset_contains` matches: an untagged set only equals itself).
fn needs_at_least(tags: &Tags, other: &Tags) -> bool {
    let untagged = other.get("owner").is_some_and(str::is_empty) && other.len() == 2 && other.get("scope").is_some();
    if untagged { tags == other } else { other.iter().all(|(k, v)| tags.get(k) == Some(v)) }
}

/// Where stop events go besides the logs. Its fields are private: only the actuator writes to
/// them.
#[derive(Default, Clone)]
pub struct Outputs {
    audit: Option<Arc<AuditLog>>,
    notifier: Option<Notifier>,
}

impl Outputs {
    /// Opens the audit log and builds the webhook client the settings name.
    pub fn open(
        audit_log: Option<&std::path::Path>,
        notify_webhook: Option<reqwest::Url>,
        outbound: &crate::http::Outbound,
    ) -> Result<Self, Error> {
        Ok(Outputs {
            audit: audit_log.map(AuditLog::open).transpose()?.map(Arc::new),
            notifier: notify_webhook.map(|url| Notifier::new(url, outbound)).transpose()?,
        })
    }
}

/// The span of an action on a listed workspace.
fn span_of(ws: &Workspace) -> tracing::Span {
    workspace_span(&ws.id, &ws.owner_name, &ws.template_name)
}

/// How often and how long the actuator tries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StopLimits {
    /// Between passes: a failed stop's first retry waits this long.
    pub interval: std::time::Duration,
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

/// What `act` did this pass: the publish step counts and logs it; tests and the demo read it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Acted {
    pub stops_sent: Vec<String>,
    pub would_stop: Vec<String>,
    pub build_active: Vec<String>,
    pub failed: Vec<String>,
    pub abandoned: Vec<String>,
    /// Stop builds that became stuck this pass (reported once each).
    pub stuck: Vec<String>,
    /// Workspaces whose stop build succeeded this pass: their GPUs are free.
    pub stops_done: Vec<String>,
    /// Workspaces whose Coder deadline was moved this pass (enforce), or would have been
    /// (observe, reported once per build).
    pub extended: Vec<String>,
    pub would_extend: Vec<String>,
    /// Workspaces whose own Coder deadline passed this pass while an extension kept them running.
    pub autostops_averted: Vec<String>,
    /// Workspaces whose pending stop was withdrawn this pass: they were used after it was sent.
    pub withdrawn: Vec<String>,
    /// The audit log's latest append failed: readiness fails until one works.
    pub audit_failing: bool,
}

/// One stop to attempt this pass.
struct Candidate {
    event: AuditEvent,
    session: String,
    organization: String,
    last_used_at: DateTime<Utc>,
    tags: Tags,
}

pub struct Actuator {
    mode: Mode,
    coder: CoderActions,
    metrics: Arc<Metrics>,
    outputs: Outputs,
    backoff: RetryPolicy,
    stop_timeout: Duration,
    /// The token's user: stop builds it initiated are ours (a lost reply is recognised by it).
    self_id: Option<String>,
    tracked: HashMap<String, TrackedStop>,
    /// Workspaces this service stopped, until they run again (the `resumed` audit line).
    stopped: HashMap<String, (AuditEvent, DateTime<Utc>)>,
    /// Observe mode: workspaces already reported as would-stop in this idle episode.
    reported: HashSet<String>,
    /// Workspaces whose TTL Coder refused for good, with the template version it refused at.
    ttl_refused: HashMap<String, String>,
    /// Deadline extensions Coder refused (4xx), by workspace, with the build it refused for: not
    /// asked again for that build.
    extend_refused: HashMap<String, String>,
    /// Builds whose deadline this service moved, while listed: Coder's own deadline, and
    /// whether its passing was counted (one `autostop_averted` per build).
    extended: HashMap<String, ExtendedBuild>,
    /// Per workspace, the build for which `would_extend` (observe) or `extend_limit_reached`
    /// was already said: each is said once per build.
    said_once: HashMap<(String, &'static str), String>,
    /// Stops whose `stop_sending` line a previous run left without an outcome (`recover`).
    unconfirmed: HashMap<String, AuditEvent>,
}

/// A build whose deadline was moved.
#[derive(Debug, Clone)]
struct ExtendedBuild {
    build_id: String,
    /// Coder's own deadline for the build (or the one it had when first moved).
    original_deadline: DateTime<Utc>,
    /// `autostop_averted` was written for the build (or cannot be known: see `extend_deadlines`).
    averted: bool,
    event: AuditEvent,
}

impl Actuator {
    pub fn new(
        mode: Mode,
        coder: CoderActions,
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
            stop_timeout: crate::duration::chrono(limits.stop_timeout),
            self_id,
            tracked: HashMap::new(),
            stopped: HashMap::new(),
            reported: HashSet::new(),
            ttl_refused: HashMap::new(),
            extend_refused: HashMap::new(),
            extended: HashMap::new(),
            said_once: HashMap::new(),
            unconfirmed: HashMap::new(),
        }
    }

    /// The token's user changed (a rotated token of another account): its stops are ours.
    pub fn set_self_id(&mut self, id: String) {
        self.self_id = Some(id);
    }

    /// At shutdown: gives webhook deliveries in flight a few seconds to finish.
    pub async fn finish(&self) {
        if let Some(n) = &self.outputs.notifier {
            n.drain(NOTIFY_DRAIN).await;
        }
    }

    /// Stops being followed, retried later, canceled or abandoned.
    pub fn tracked_count(&self) -> usize {
        self.tracked.len()
    }

    /// Writes one audit line: the one way the actuator writes to the audit log. `false` when a
    /// configured log could not take it (counted; readiness fails meanwhile).
    fn audit(&self, event: &AuditEvent) -> bool {
        let Some(a) = &self.outputs.audit else { return true };
        let written = a.append(event);
        if !written {
            self.metrics.audit_write_failures.inc();
        }
        written
    }

    /// Rebuilds, from the audit log a previous run wrote, what it knew about stops: stops sent
    /// and not finished (followed again), stops done whose workspace has not run since (for their
    /// `resumed` line), and stops whose POST may or may not have happened before the process
    /// ended (`stop_sending` alone: checked against Coder's builds at the next pass).
    pub fn recover(&mut self, now: DateTime<Utc>) {
        // Observe mode follows no stop: what an earlier enforce run left open stays for the next one.
        if !acts(self.mode) {
            return;
        }
        // Only a regular file is read back (a device such as /dev/full reads forever).
        let Some(path) = self.outputs.audit.as_ref().filter(|a| a.is_regular()).map(|a| a.path().to_path_buf()) else { return };
        /// Where a workspace's stop stood at its latest stop line: each line replaces the last.
        enum Open {
            Sending(AuditEvent),
            InFlight(AuditEvent),
            Done(AuditEvent),
        }
        let mut by_ws: HashMap<String, Open> = HashMap::new();
        let read = crate::pass::audit::read_records(&path, |r| {
            let Some(kind) = r.kind() else { return };
            let event = AuditEvent::recovered(kind, &r);
            let open = match kind {
                AuditKind::StopSending => Some(Open::Sending(event)),
                AuditKind::StopSent | AuditKind::StopRunning | AuditKind::StopStuck => Some(Open::InFlight(event)),
                AuditKind::StopDone => Some(Open::Done(event)),
                AuditKind::Resumed
                | AuditKind::StopNotSent
                | AuditKind::StopFailed
                | AuditKind::StopReaped
                | AuditKind::StopCanceled
                | AuditKind::StopWithdrawn
                | AuditKind::StopAbandoned => None,
                _ => return,
            };
            match open {
                Some(o) => by_ws.insert(r.workspace_id.clone(), o),
                None => by_ws.remove(&r.workspace_id),
            };
        });
        if let Err(e) = read {
            tracing::warn!(event = "audit_recovery_failed", path = %path.display(), error = %e, "cannot read the audit log back; stops of the previous run are not followed");
            return;
        }
        let (mut followed, mut resumable, mut unconfirmed) = (0, 0, 0);
        for (id, open) in by_ws {
            match open {
                Open::Done(done) if now - done.time < Duration::days(8) => {
                    let at = done.time;
                    self.stopped.insert(id, (done, at));
                    resumable += 1;
                }
                Open::Done(_) => {}
                Open::InFlight(sent) => {
                    let Some(build_id) = sent.build_id.clone() else { continue };
                    self.tracked.insert(id, TrackedStop::recovered(sent, StopState::Sent { build_id }));
                    followed += 1;
                }
                Open::Sending(sending) => {
                    self.unconfirmed.insert(id, sending);
                    unconfirmed += 1;
                }
            }
        }
        if followed + resumable + unconfirmed > 0 {
            tracing::info!(
                event = "audit_recovered",
                followed,
                resumable,
                unconfirmed,
                "read back the stops of the previous run from the audit log"
            );
        }
    }

    /// Stops whose `stop_sending` line has no outcome (the process ended around the POST): the
    /// workspace's latest build tells. A stop build by this service's user created since is the
    /// stop: written as sent (found) and followed; anything else means it was not sent.
    async fn confirm_unconfirmed(&mut self, coder_offset: Duration, acted: &mut Acted) {
        for (id, sending) in std::mem::take(&mut self.unconfirmed) {
            let span = workspace_span(&id, &sending.owner, &sending.template);
            self.confirm_one(coder_offset, id, sending, acted).instrument(span).await;
        }
    }

    async fn confirm_one(&mut self, coder_offset: Duration, id: String, sending: AuditEvent, acted: &mut Acted) {
        let ws = match self.coder.workspace(&id).await {
            Ok(ws) => ws,
            Err(e) if matches!(e.kind, ErrorKind::Status(404 | 410)) => return,
            Err(e) => {
                // Asked again next pass: a stop that landed must not be forgotten.
                tracing::warn!(event = "stop_check_deferred", error = %e, "cannot read the workspace to settle a stop of the previous run; asking again next pass");
                self.unconfirmed.insert(id, sending);
                return;
            }
        };
        let b = ws.latest_build;
        let by_us = matches!((&self.self_id, &b.initiator_id), (Some(me), Some(initiator)) if me == initiator);
        // Created around the POST (its time on this machine's clock, within the request's
        // timeout and some skew), by this service's user, and a stop.
        let around = b.created_at.is_some_and(|c| {
            let c = c - coder_offset;
            c >= sending.time - Duration::minutes(2) && c <= sending.time + Duration::minutes(2)
        });
        if b.transition == Transition::Stop && by_us && around {
            let event = AuditEvent {
                event: AuditKind::StopSent,
                build_id: Some(b.id.clone()),
                message: format!("{} (found after a restart: sent before the previous run ended)", sending.message),
                ..sending
            };
            tracing::info!(event = "stop_found", build_id = %b.id, "a stop sent before the previous run ended was found in Coder's builds");
            self.audit(&event);
            self.tracked.insert(id.clone(), TrackedStop::recovered(event, StopState::Sent { build_id: b.id }));
            acted.stops_sent.push(id);
        } else {
            tracing::info!(event = "stop_not_found", "a stop about to be sent when the previous run ended was not sent");
            self.audit(&AuditEvent { event: AuditKind::StopNotSent, ..sending });
        }
    }

    /// Sends one event to the webhook.
    fn notify(&self, event: &AuditEvent) {
        if let Some(n) = &self.outputs.notifier {
            n.send(event);
        }
    }

    /// An audit line and a webhook event.
    fn announce(&self, event: &AuditEvent) {
        self.audit(event);
        self.notify(event);
    }

    /// Acts on one evaluation: announces warnings that began, sends the stops the fleet rules
    /// chose (or reports them in observe mode), retries due ones, restores TTLs, and follows
    /// stop builds in flight.
    pub async fn act(&mut self, eval: &Evaluation, shutdown: &watch::Receiver<bool>) -> Acted {
        let now = eval.now;
        let mut acted = Acted::default();
        self.say_limits_once(eval);
        if !acts(self.mode) {
            self.announce_warnings(eval, AuditKind::WouldWarn);
            self.would_act(eval, &mut acted);
            acted.audit_failing = self.outputs.audit.as_ref().is_some_and(|a| !a.probe());
            return acted;
        }
        self.announce_warnings(eval, AuditKind::Warn);
        self.resumed(eval);
        self.confirm_unconfirmed(eval.coder_offset, &mut acted).await;
        self.follow(now, eval.coder_offset, &mut acted).await;
        self.reconcile(eval);
        self.provisioners_for_reaped(eval).await;
        for c in self.candidates(eval) {
            let span = workspace_span(&c.event.workspace_id, &c.event.owner, &c.event.template);
            if *shutdown.borrow() {
                span.in_scope(|| tracing::info!(event = "stop_skipped_shutdown", "shutting down: no new stop"));
                break;
            }
            // Another stop that needs the same tags found no provisioner (this pass included).
            let own = self.tracked.get(&c.event.workspace_id).and_then(|t| t.no_provisioner_since);
            if let Some(since) = self.waiting_for_provisioner(&c.organization, &c.tags).filter(|_| own.is_none()) {
                span.in_scope(|| tracing::info!(event = "stop_held", tags = %c.tags, since = %since, "no provisioner for these tags: the stop waits until one answers"));
                continue;
            }
            self.stop(now, c, &mut acted).instrument(span).await;
        }
        self.restore_ttls(eval, shutdown).await;
        self.count_averted(eval, &mut acted);
        self.extend_deadlines(eval, shutdown, &mut acted).await;
        acted.audit_failing = self.outputs.audit.as_ref().is_some_and(|a| !a.probe());
        acted
    }

    /// Whether `what` was already said for this workspace's current build; remembers it if not.
    fn first_time(&mut self, what: &'static str, ws: &Workspace) -> bool {
        let key = (ws.id.clone(), what);
        if self.said_once.get(&key) == Some(&ws.latest_build.id) {
            return false;
        }
        self.said_once.insert(key, ws.latest_build.id.clone());
        true
    }

    /// Forgets what it remembers about deadlines for workspaces no longer listed, and logs, once
    /// per build, a busy workspace whose limit leaves no extension: Coder's autostop stops it at
    /// its deadline.
    fn say_limits_once(&mut self, eval: &Evaluation) {
        let listed: HashSet<&str> = eval.workspaces().map(|w| w.id.as_str()).collect();
        self.said_once.retain(|(id, _), _| listed.contains(id.as_str()));
        self.extend_refused.retain(|id, _| listed.contains(id.as_str()));
        self.extended.retain(|id, _| listed.contains(id.as_str()));
        for j in &eval.judged {
            let Some(plan) = j.decision.deadline.as_ref().filter(|p| p.action == DeadlineAction::LimitReached) else { continue };
            if self.first_time("extend_limit_reached", &j.workspace) {
                let _in = span_of(&j.workspace).entered();
                tracing::info!(event = "extend_limit_reached", deadline = %plan.deadline, limit = %plan.limit, limited_by = plan.limited_by.as_str(), "its GPU computes, but {} leaves no extension of 30 minutes or more: Coder's autostop stops it at its deadline", plan.limited_by.as_str());
            }
        }
    }

    /// Sends the deadline extensions the fleet rules found due (`extend_while_busy`), in their
    /// slots. A 4xx is remembered for the build and not asked again (nor does it take a slot);
    /// a 5xx or no answer is asked again next pass.
    async fn extend_deadlines(&mut self, eval: &Evaluation, shutdown: &watch::Receiver<bool>, acted: &mut Acted) {
        let mut slots = eval.fleet.extension_slots;
        for (j, plan, to) in eval.extend_order() {
            let ws = &j.workspace;
            if self.extend_refused.get(&ws.id) == Some(&ws.latest_build.id) {
                continue;
            }
            if slots == 0 || *shutdown.borrow() {
                break;
            }
            slots -= 1;
            let template = TemplateLabels { template: ws.template_name.as_str().into() };
            let span = span_of(ws);
            let answer = self.coder.extend_deadline(&ws.id, to).instrument(span.clone()).await;
            let _in = span.enter();
            match answer {
                Ok(()) => {
                    let event = extension_event(AuditKind::DeadlineExtended, eval.now, self.mode, j, plan, to);
                    tracing::info!(event = "deadline_extended", from = %plan.deadline, to = %to, limit = %plan.limit, limited_by = plan.limited_by.as_str(), "its GPU computes with nobody connected: Coder's autostop deadline moved");
                    self.metrics.deadline_extensions.get_or_create(&template).inc();
                    self.audit(&event);
                    if self.extended.get(&ws.id).is_none_or(|e| e.build_id != ws.latest_build.id) {
                        let original = coders_own_deadline(ws).map_or(plan.deadline, |d| d.min(plan.deadline));
                        // Already past when this process first moved it: a deadline this service
                        // set before a restart (or one the user had moved), not Coder's own.
                        let averted = eval.coder_now() >= original;
                        let build_id = ws.latest_build.id.clone();
                        self.extended.insert(ws.id.clone(), ExtendedBuild { build_id, original_deadline: original, averted, event });
                    }
                    acted.extended.push(ws.id.clone());
                }
                Err(err) if matches!(err.kind, ErrorKind::Conflict | ErrorKind::NoPermission | ErrorKind::Status(400..=499)) => {
                    tracing::warn!(event = "extend_refused", error = %err, "Coder refuses to move this workspace's deadline: not asked again for this build");
                    self.metrics
                        .deadline_extension_failures
                        .get_or_create(&ExtensionFailureLabels { reason: ExtensionFailure::Refused })
                        .inc();
                    self.extend_refused.insert(ws.id.clone(), ws.latest_build.id.clone());
                }
                Err(err) => {
                    tracing::warn!(event = "extend_failed", error = %err, "could not move the deadline; trying again next pass");
                    self.metrics
                        .deadline_extension_failures
                        .get_or_create(&ExtensionFailureLabels { reason: ExtensionFailure::Error })
                        .inc();
                }
            }
        }
    }

    /// Builds whose own Coder deadline has passed while they still run because this service
    /// moved it: one `autostop_averted` per build.
    fn count_averted(&mut self, eval: &Evaluation, acted: &mut Acted) {
        let coder_now = eval.coder_now();
        for ws in eval.workspaces() {
            let Some(e) = self.extended.get_mut(&ws.id) else { continue };
            if e.averted || e.build_id != ws.latest_build.id || coder_now < e.original_deadline {
                continue;
            }
            e.averted = true;
            let _in = span_of(ws).entered();
            let event = AuditEvent { event: AuditKind::AutostopAverted, time: eval.now, ..e.event.clone() };
            tracing::info!(event = "autostop_averted", original_deadline = %e.original_deadline, "the workspace runs past the autostop deadline Coder had set, because its GPU computes");
            self.metrics.autostops_averted.get_or_create(&TemplateLabels { template: ws.template_name.as_str().into() }).inc();
            self.audit(&event);
            acted.autostops_averted.push(ws.id.clone());
        }
    }

    fn announce_warnings(&self, eval: &Evaluation, kind: AuditKind) {
        for j in eval.new_warnings() {
            let _in = span_of(&j.workspace).entered();
            let event = AuditEvent::new(kind, eval.now, self.mode.as_str(), &j.workspace, &j.decision);
            tracing::info!(event = kind.as_str(), reason = event.reason, stop_at = ?event.stop_at, "{}", event.text());
            self.notify(&event);
        }
    }

    /// Observe mode: reports each would-stop once per idle episode, and would-be TTL restores.
    fn would_act(&mut self, eval: &Evaluation, acted: &mut Acted) {
        // A tripped breaker leaves the order empty (`apply_fleet_rules`).
        let current: HashSet<&str> = eval.stop_order().map(|j| j.workspace.id.as_str()).collect();
        self.reported.retain(|id| current.contains(id.as_str()));
        for j in eval.stop_order() {
            if !self.reported.insert(j.workspace.id.clone()) {
                continue;
            }
            let _in = span_of(&j.workspace).entered();
            let event = stop_event(AuditKind::WouldStop, eval, j, self.mode);
            tracing::info!(event = "would_stop", reason = event.reason, "{}", event.message);
            self.metrics.stops.get_or_create(&StopLabels { reason: event.reason, mode: Mode::Observe.as_str() }).inc();
            self.announce(&event);
            acted.would_stop.push(event.workspace_id);
        }
        for Judged { workspace: ws, decision: d, .. } in &eval.judged {
            if let Some(ttl) = d.restore_ttl_ms {
                let _in = span_of(ws).entered();
                tracing::info!(event = "would_restore_ttl", ttl_ms = ttl, "would set the autostop TTL back");
            }
        }
        for (j, plan, to) in eval.extend_order() {
            let ws = &j.workspace;
            if self.first_time("would_extend", ws) {
                let _in = span_of(ws).entered();
                let event = extension_event(AuditKind::WouldExtend, eval.now, self.mode, j, plan, to);
                tracing::info!(event = "would_extend", from = %plan.deadline, to = %to, "its GPU computes with nobody connected: would move Coder's autostop deadline (observe mode: Coder stops it at its deadline)");
                self.audit(&event);
                acted.would_extend.push(ws.id.clone());
            }
        }
    }

    /// Workspaces this service stopped that run again: one `resumed` audit line each, with the
    /// GPU-seconds they gave back. Forgotten after 8 days (deleted, or never started again).
    fn resumed(&mut self, eval: &Evaluation) {
        for ws in eval.workspaces() {
            let Some((done, at)) = self.stopped.remove(&ws.id) else { continue };
            let _in = span_of(ws).entered();
            let gpus = done.gpus.unwrap_or(0);
            // It runs again since its start build (on Coder's clock), not since this pass saw
            // it: after a restart that may be long ago.
            let started = ws.latest_build.created_at.map(|t| t - eval.coder_offset).filter(|t| *t > at && *t < eval.now);
            let time = started.unwrap_or(eval.now);
            let event = AuditEvent {
                event: AuditKind::Resumed,
                time,
                gpu_seconds_given_back: Some(gpu_seconds_given_back(gpus, at, time).round() as i64),
                ..done
            };
            tracing::info!(
                event = "resumed",
                gpu_seconds_given_back = event.gpu_seconds_given_back,
                "a workspace this service stopped runs again"
            );
            self.audit(&event);
        }
        self.stopped.retain(|_, (_, at)| eval.now - *at < Duration::days(8));
    }

    /// Drops tracking of workspaces that got a new build (a new session: start afresh), of
    /// canceled stops whose workspace is active again (a new idle episode may stop it), and of
    /// any other stop not in flight whose workspace is not listed running and whose state has not
    /// changed for a day.
    fn reconcile(&mut self, eval: &Evaluation) {
        let listed: HashMap<&str, (&str, bool)> = eval
            .judged
            .iter()
            .map(|j| (j.workspace.id.as_str(), (j.workspace.latest_build.id.as_str(), j.decision.is_stop_eligible())))
            .collect();
        let now = eval.now;
        self.tracked.retain(|id, t| match listed.get(id.as_str()) {
            Some((build, _)) if *build != t.session => false,
            Some((_, eligible)) => *eligible || t.state != StopState::Canceled,
            // Not listed running: followed while in flight; otherwise kept a day (a retry of a
            // failed or reaped stop checks the workspace first).
            None => {
                t.state.in_flight().is_some()
                    || (t.no_provisioner_since.is_some() && matches!(t.state, StopState::Reaped { .. }))
                    || now - t.since < Duration::days(1)
            }
        });
    }

    /// The stops to attempt this pass, in the fleet rules' stop slots (none while the breaker
    /// holds): first the stop order as given, less workspaces with a stop in flight, backing off,
    /// canceled or abandoned; then, in the slots left, stops of workspaces no longer listed as
    /// running (their latest build is our failed stop, so they have no decision this pass): due
    /// retries of failed stop builds, and reaped stops once provisioners answer again.
    fn candidates(&self, eval: &Evaluation) -> Vec<Candidate> {
        let mut out = Vec::new();
        for j in eval.stop_order() {
            let ws = &j.workspace;
            let due = match self.tracked.get(&ws.id).map(|t| &t.state) {
                None => true,
                Some(StopState::Failed { retry_at, .. }) => *retry_at <= eval.now,
                Some(_) => false,
            };
            if due {
                let tags = &ws.latest_build.job.tags;
                let event = stop_event(AuditKind::StopSent, eval, j, self.mode);
                out.push(Candidate {
                    event,
                    session: ws.latest_build.id.clone(),
                    organization: ws.organization_id.clone(),
                    last_used_at: ws.last_used_at,
                    tags: tags.clone(),
                });
            }
        }
        let slots_left = eval.fleet.stop_slots.saturating_sub(out.len());
        let listed: HashSet<&str> = eval.workspaces().map(|w| w.id.as_str()).collect();
        let retries = self.tracked.iter().filter(|(id, t)| {
            let due = match &t.state {
                StopState::Failed { retry_at, build_id: Some(_) } => *retry_at <= eval.now,
                // `provisioners_for_reaped` found a matching provisioner (or, without an answer,
                // a build in the organization completed since).
                StopState::Reaped { .. } => !t.resent_after_reap && t.no_provisioner_since.is_none(),
                _ => false,
            };
            due && !listed.contains(id.as_str())
        });
        out.extend(retries.take(slots_left).map(|(_, t)| Candidate {
            event: AuditEvent { time: eval.now, ..t.event.clone() },
            session: t.session.clone(),
            organization: t.organization.clone(),
            last_used_at: t.last_used_at,
            tags: t.tags.clone(),
        }));
        out
    }

    /// What Coder says of the provisioners for a stop build: its tags, and while it is pending,
    /// `matched_provisioners` (filled only then; `available` counts daemons seen since 90 s
    /// before the job was created, reference NOTES §16). A reaped stop is left to
    /// `provisioners_for_reaped`.
    fn note_provisioners(&mut self, now: DateTime<Utc>, id: &str, build: &WorkspaceBuild) {
        let Some(t) = self.tracked.get_mut(id) else { return };
        if !build.job.tags.is_empty() {
            t.tags.clone_from(&build.job.tags);
        }
        match (build.job.status, build.matched_provisioners) {
            (JobStatus::Pending, Some(m)) if m.available == 0 => {
                if t.no_provisioner_since.is_none() {
                    t.no_provisioner_since = Some(now);
                    tracing::error!(event = "no_provisioner", build_id = %build.id, tags = ?t.tags, matched = m.count, "no provisioner for tags {:?} is available: the stop waits, and so does every new stop that needs the same tags; check the provisioner daemons in Coder", t.tags);
                }
            }
            (JobStatus::Failed, _) => {}
            _ => t.no_provisioner_since = None,
        }
    }

    /// Since when stops needing `tags` in this organization wait for a provisioner, if they do.
    /// A stop whose tags contain a waiting one's needs a daemon that would take that one too.
    fn waiting_for_provisioner(&self, organization: &str, tags: &Tags) -> Option<DateTime<Utc>> {
        self.tracked
            .values()
            .filter(|t| t.state.in_flight().is_some() || matches!(t.state, StopState::Reaped { .. }))
            .filter(|t| t.organization == organization && needs_at_least(tags, &t.tags))
            .filter_map(|t| t.no_provisioner_since)
            .min()
    }

    /// For every reaped stop not yet sent again: whether a provisioner matching its tags answers
    /// now (`GET .../provisionerdaemons?tags=`, daemons seen within 90 s). Without an answer from
    /// Coder, a build in the same organization that completed since the reap stands in.
    async fn provisioners_for_reaped(&mut self, eval: &Evaluation) {
        let reaped: Vec<(String, String, Tags, DateTime<Utc>)> = self
            .tracked
            .iter()
            .filter_map(|(id, t)| match &t.state {
                StopState::Reaped { at, .. } if !t.resent_after_reap => Some((id.clone(), t.organization.clone(), t.tags.clone(), *at)),
                _ => None,
            })
            .collect();
        // One listing per organization and tag set, however many stops wait on it.
        let mut listed: HashMap<(String, Tags), Option<bool>> = HashMap::new();
        for (id, organization, tags, reaped_at) in reaped {
            let span = self.tracked.get(&id).map_or_else(tracing::Span::none, |t| workspace_span(&id, &t.event.owner, &t.event.template));
            let key = (organization.clone(), tags.clone());
            let answer = match listed.get(&key) {
                Some(known) => *known,
                None => {
                    let answer = match self.coder.provisioner_daemons(&organization, &tags).instrument(span.clone()).await {
                        Ok(daemons) => Some(!daemons.is_empty()),
                        Err(e) => {
                            let _in = span.enter();
                            tracing::warn!(event = "provisioners_unknown", error = %e, "cannot list the provisioner daemons for a reaped stop; a build with its tags completed in its organization since stands in");
                            None
                        }
                    };
                    listed.insert(key, answer);
                    answer
                }
            };
            let _in = span.enter();
            let available = answer.unwrap_or_else(|| {
                let completed = eval
                    .workspaces()
                    .filter(|w| needs_at_least(&w.latest_build.job.tags, &tags))
                    .map(|w| (w.organization_id.as_str(), w.latest_build.job.completed_at));
                provisioners_answer(&organization, reaped_at, completed)
            });
            if let Some(t) = self.tracked.get_mut(&id) {
                if available {
                    t.no_provisioner_since = None;
                } else if t.no_provisioner_since.is_none() {
                    t.no_provisioner_since = Some(eval.now);
                    tracing::error!(event = "no_provisioner", tags = ?tags, "no provisioner for tags {tags:?}: the reaped stop is sent again once one answers; stops that need the same tags wait");
                }
            }
        }
    }

    /// Stops that wait for a provisioner, by organization and tags (for the status document).
    pub fn without_provisioner(&self) -> Vec<NoProvisioner> {
        let mut out: Vec<NoProvisioner> = Vec::new();
        for t in self.tracked.values() {
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

    async fn stop(&mut self, now: DateTime<Utc>, c: Candidate, acted: &mut Acted) {
        let id = c.event.workspace_id.clone();
        let ours = self.tracked.get(&id).and_then(|t| match &t.state {
            StopState::Failed { build_id: Some(b), .. } | StopState::Reaped { build_id: b, .. } => Some(b.clone()),
            _ => None,
        });
        if let Some(failed) = ours {
            // Sending again for a workspace that is not listed as running: only while nobody has
            // built or used it since (its latest build is still our stop, and `last_used_at` has
            // not moved: a person who came back ended this idle episode).
            match self.coder.workspace(&id).await {
                Ok(ws) if ws.latest_build.id == failed && ws.last_used_at <= c.last_used_at => {}
                Ok(_) => {
                    tracing::info!(event = "stop_retry_dropped", "the workspace was built or used since the stop failed; deciding afresh");
                    self.tracked.remove(&id);
                    return;
                }
                Err(e) => {
                    tracing::warn!(event = "stop_retry_deferred", error = %e, "cannot read the workspace; retrying later");
                    return;
                }
            }
        }
        // The line first, on disk, then the POST: a stop is never sent without its audit line.
        if !self.audit(&AuditEvent { event: AuditKind::StopSending, time: now, ..c.event.clone() }) {
            tracing::error!(
                event = "stop_not_sent",
                "the audit log cannot be written: the stop is not sent (no stop without its audit line); fix the audit log's volume"
            );
            self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: StopFailure::Audit }).inc();
            return;
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
            (Ok(StopOutcome::Queued(build)), _) => {
                self.sent(now, c, &build.id, false, acted);
                self.note_provisioners(now, &id, &build);
            }
            (_, Some(build)) => self.sent(now, c, &build.id, true, acted),
            (Ok(StopOutcome::BuildActive(msg)), None) => {
                tracing::info!(event = "stop_deferred", detail = %msg, "another build is active; deciding again next pass");
                self.audit(&AuditEvent { event: AuditKind::StopNotSent, time: now, ..c.event.clone() });
                self.tracked.remove(&id);
                acted.build_active.push(id);
            }
            (Err(e), None) => {
                tracing::warn!(event = "stop_failed", error = %e, "the stop build was refused");
                self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: StopFailure::Rejected }).inc();
                let t = self.track(now, c);
                t.attempts += 1;
                self.fail(now, &id, None, &e.to_string(), acted);
            }
        }
    }

    /// The tracked stop of a candidate, created when this is the episode's first attempt.
    fn track(&mut self, now: DateTime<Utc>, c: Candidate) -> &mut TrackedStop {
        let id = c.event.workspace_id.clone();
        let t = self.tracked.entry(id).or_insert_with(|| TrackedStop {
            event: c.event.clone(),
            since: now,
            session: c.session.clone(),
            organization: c.organization.clone(),
            last_used_at: c.last_used_at,
            attempts: 0,
            stuck_reported: false,
            resent_after_reap: false,
            withdraw_refused: false,
            tags: c.tags.clone(),
            no_provisioner_since: None,
            state: StopState::Failed { retry_at: now, build_id: None },
        });
        t.event = c.event;
        t
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
    fn sent(&mut self, now: DateTime<Utc>, c: Candidate, build_id: &str, lost_reply: bool, acted: &mut Acted) {
        let id = c.event.workspace_id.clone();
        if self.tracked.get(&id).and_then(|t| t.state.in_flight()) == Some(build_id) {
            return;
        }
        let t = self.track(now, c);
        if matches!(t.state, StopState::Reaped { .. }) {
            t.resent_after_reap = true;
        }
        t.attempts += 1;
        t.since = now;
        t.state = StopState::Sent { build_id: build_id.to_string() };
        t.event = AuditEvent { event: AuditKind::StopSent, time: now, build_id: Some(build_id.to_string()), ..t.event.clone() };
        let (event, attempts) = (t.event.clone(), t.attempts);
        tracing::info!(event = "stop_sent", reason = event.reason, build_id = %build_id, attempt = attempts, reply_lost = lost_reply, "{}", event.message);
        self.metrics.stops.get_or_create(&StopLabels { reason: event.reason, mode: Mode::Enforce.as_str() }).inc();
        self.announce(&event);
        acted.stops_sent.push(id);
    }

    /// Writes the audit line of a stop's change of state (once per change).
    fn audit_change(&self, t: &TrackedStop, kind: AuditKind, now: DateTime<Utc>) {
        self.audit(&AuditEvent { event: kind, time: now, attempts: Some(t.attempts), ..t.event.clone() });
    }

    /// A refused POST or a failed stop build: back off, or abandon after the last attempt.
    fn fail(&mut self, now: DateTime<Utc>, id: &str, failed_build: Option<String>, error: &str, acted: &mut Acted) {
        let Some(t) = self.tracked.get_mut(id) else { return };
        if t.attempts >= MAX_STOP_ATTEMPTS {
            t.state = StopState::Abandoned;
            t.since = now;
            self.abandon(now, id, acted);
            return;
        }
        let delay = crate::duration::chrono(self.backoff.delay_for_attempt(t.attempts));
        // A refused POST for a workspace whose stop build had failed (or was reaped) keeps that
        // build: the retry checks that nobody built or used the workspace since.
        let previous = match &t.state {
            StopState::Failed { build_id, .. } => build_id.clone(),
            StopState::Reaped { build_id, .. } => Some(build_id.clone()),
            _ => None,
        };
        t.state = StopState::Failed { retry_at: now + delay, build_id: failed_build.or(previous) };
        t.since = now;
        let t = t.clone();
        tracing::info!(event = "stop_retry_scheduled", attempt = t.attempts, retry_in = %human(delay), error = %error, "the stop did not happen; trying again later");
        self.audit_change(&t, AuditKind::StopFailed, now);
        acted.failed.push(id.to_string());
    }

    fn abandon(&mut self, now: DateTime<Utc>, id: &str, acted: &mut Acted) {
        let Some(t) = self.tracked.get_mut(id) else { return };
        t.state = StopState::Abandoned;
        t.no_provisioner_since = None;
        t.since = now;
        let t = t.clone();
        let event = AuditEvent { event: AuditKind::StopAbandoned, time: now, attempts: Some(t.attempts), ..t.event };
        tracing::error!(
            event = "stop_abandoned",
            attempts = t.attempts,
            "giving up on stopping this workspace until its next build; look at its build log, the provisioners and the token's permissions in Coder"
        );
        self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: StopFailure::Abandoned }).inc();
        self.announce(&event);
        acted.abandoned.push(id.to_string());
    }

    /// Follows every stop build in flight and moves its tracked stop by what Coder says of the
    /// job (`stop_lifecycle::job_change`): running, stuck (once per episode), succeeded, failed
    /// (retried later), reaped (sent once more when provisioners answer again), canceled.
    async fn follow(&mut self, now: DateTime<Utc>, coder_offset: Duration, acted: &mut Acted) {
        let in_flight: Vec<(String, String)> =
            self.tracked.iter().filter_map(|(id, t)| t.state.in_flight().map(|b| (id.clone(), b.to_string()))).collect();
        for (id, build_id) in in_flight {
            let span = self.tracked.get(&id).map_or_else(tracing::Span::none, |t| workspace_span(&id, &t.event.owner, &t.event.template));
            self.follow_one(now, coder_offset, id, build_id, acted).instrument(span).await;
        }
        self.metrics.stuck_stops.set(self.stuck_stops().len() as i64);
    }

    /// One stop build in flight, followed (in its workspace's span).
    async fn follow_one(&mut self, now: DateTime<Utc>, coder_offset: Duration, id: String, build_id: String, acted: &mut Acted) {
        let build = match self.coder.workspace_build(&build_id).await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(event = "stop_follow_failed", build_id = %build_id, error = %e, "cannot read the stop build; trying again next pass");
                return;
            }
        };
        self.note_provisioners(now, &id, &build);
        if build.job.status == JobStatus::Pending && self.withdraw_if_used(now, coder_offset, &id, &build_id, acted).await {
            return;
        }
        let Some(t) = self.tracked.get_mut(&id) else { return };
        let Some(change) =
            crate::pass::stop_lifecycle::job_change(&t.state, &build.job, now - t.since, self.stop_timeout, t.stuck_reported)
        else {
            return;
        };
        let error = build.job.error.clone().unwrap_or_default();
        if change == JobChange::Reaped {
            self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: StopFailure::Reaped }).inc();
        }
        match change {
            JobChange::Running => t.state = StopState::Running { build_id: build_id.clone() },
            JobChange::Stuck => {
                t.stuck_reported = true;
                t.state = StopState::Stuck { build_id: build_id.clone() };
                tracing::error!(event = "stop_stuck", build_id = %build_id, pending_for = %human(now - t.since), "the stop build is still pending: no provisioner has taken it; check the provisioner daemons in Coder (it is not sent again while pending; Coder's job reaper fails it after 30 minutes)");
                self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: StopFailure::Stuck }).inc();
                acted.stuck.push(id.clone());
            }
            JobChange::Succeeded => {
                let Some(t) = self.tracked.remove(&id) else { return };
                tracing::info!(event = "stop_done", build_id = %build_id, "the workspace is stopped; its GPU is free");
                acted.stops_done.push(id.clone());
                // When Coder finished it (on this machine's clock), not when a pass saw it:
                // after a restart that may be long before.
                let at = build.job.completed_at.map(|c| c - coder_offset).filter(|c| *c <= now && *c >= t.since).unwrap_or(now);
                let done = AuditEvent { event: AuditKind::StopDone, time: at, ..t.event };
                self.audit(&done);
                self.stopped.insert(id.clone(), (done, at));
                return;
            }
            JobChange::Canceled => {
                t.state = StopState::Canceled;
                t.since = now;
                tracing::warn!(event = "stop_canceled", build_id = %build_id, "a person canceled the stop build; it is not sent again while the workspace stays idle");
            }
            JobChange::Reaped if t.resent_after_reap => {
                tracing::error!(event = "stop_reaped", build_id = %build_id, error = %error, "Coder's job reaper failed the stop build again");
                let t = t.clone();
                self.audit_change(&t, AuditKind::StopReaped, now);
                self.abandon(now, &id, acted);
                return;
            }
            JobChange::Reaped => {
                let at = build.job.completed_at.unwrap_or(now);
                t.state = StopState::Reaped { build_id: build_id.clone(), at };
                t.since = now;
                tracing::error!(event = "stop_reaped", build_id = %build_id, error = %error, "Coder's job reaper failed the stop build: no provisioner took it; the workspace keeps its GPU and is stopped once more when a build in its organization completes again");
            }
            JobChange::Failed => {
                tracing::warn!(event = "stop_failed", build_id = %build_id, job_status = build.job.status.as_str(), error = %error, "the stop build did not succeed; retrying later");
                self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: StopFailure::BuildFailed }).inc();
                let mut ignored = Acted::default();
                self.fail(now, &id, Some(build_id), &error, &mut ignored);
                return;
            }
        }
        if let Some(t) = self.tracked.get(&id) {
            self.audit_change(t, change.audit_kind(), now);
        }
    }

    /// Withdraws a stop no provisioner has taken yet when its workspace was used after it was sent
    /// (its `last_used_at` moved past the send): while the stop is pending the old agent still
    /// authenticates, so the user came back and works (reference coder NOTES §16). `PATCH
    /// .../cancel?expect_status=pending`; Coder's 4xx (412: a provisioner took it meanwhile) is
    /// reported once and not asked again; no answer is asked again next pass. True when withdrawn.
    async fn withdraw_if_used(&mut self, now: DateTime<Utc>, coder_offset: Duration, id: &str, build_id: &str, acted: &mut Acted) -> bool {
        // Stops decided with a connection open (a GPU idle behind an open tab, max_lifetime) are
        // not withdrawn for being used: they expect it.
        let pending = |t: &&TrackedStop| {
            !t.withdraw_refused
                && matches!(t.state, StopState::Sent { .. } | StopState::Stuck { .. })
                && !matches!(t.event.reason, "connected-but-gpu-idle" | "max-lifetime")
        };
        let Some(t) = self.tracked.get(id).filter(pending) else { return false };
        let sent_at = t.since + coder_offset;
        let used = match self.coder.workspace(id).await {
            Ok(ws) => ws.last_used_at,
            Err(e) => {
                tracing::warn!(event = "stop_follow_failed", error = %e, "cannot read the workspace of a pending stop; trying again next pass");
                return false;
            }
        };
        if used <= sent_at {
            return false;
        }
        match self.coder.cancel_pending_build(build_id).await {
            Ok(()) => {
                let Some(t) = self.tracked.get_mut(id) else { return false };
                // Once its stop is canceled the old agent cannot authenticate (NOTES §16): the user
                // starts the workspace again to go on, and a new build ends this tracking. If
                // nobody does, the pod would hold its GPU unlisted for good: the stop is sent
                // again after the longest back-off, while the workspace stays as it is.
                t.state =
                    StopState::Failed { retry_at: now + crate::duration::chrono(MAX_STOP_BACKOFF), build_id: Some(build_id.to_string()) };
                t.since = now;
                t.last_used_at = used;
                t.no_provisioner_since = None;
                let t = t.clone();
                tracing::info!(event = "stop_withdrawn", build_id = %build_id, last_used_at = %used, "the workspace was used after its stop was sent, and no provisioner had taken the stop yet: withdrawn; start it again to reconnect (without a new build it is stopped after 30 minutes)");
                let event = AuditEvent { event: AuditKind::StopWithdrawn, time: now, attempts: Some(t.attempts), ..t.event.clone() };
                self.announce(&event);
                acted.withdrawn.push(id.to_string());
                true
            }
            // dbauthz's refusal of a token without `update` is a 500 (NOTES §16): final as well.
            Err(e) if matches!(e.kind, ErrorKind::Status(400..=500) | ErrorKind::Conflict | ErrorKind::NoPermission) => {
                tracing::warn!(event = "stop_withdraw_refused", build_id = %build_id, error = %e, "the workspace was used after its stop was sent, but Coder refuses to withdraw the stop (a provisioner may have taken it): not asked again");
                if let Some(t) = self.tracked.get_mut(id) {
                    t.withdraw_refused = true;
                }
                false
            }
            Err(e) => {
                tracing::warn!(event = "stop_withdraw_failed", build_id = %build_id, error = %e, "could not withdraw the pending stop; trying again next pass");
                false
            }
        }
    }

    /// Stop builds reported stuck and still pending (for the status document).
    pub fn stuck_stops(&self) -> Vec<StuckStop> {
        let mut out: Vec<StuckStop> = self
            .tracked
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

    /// Sets TTLs back (`restore_autostop`). A TTL Coder refuses for good (400: the template
    /// forbids a user autostop TTL; 403/404: the token may not update the workspace) is not
    /// asked for again until the workspace's template version changes.
    async fn restore_ttls(&mut self, eval: &Evaluation, shutdown: &watch::Receiver<bool>) {
        for Judged { workspace: ws, decision: d, .. } in &eval.judged {
            let Some(ttl) = d.restore_ttl_ms else { continue };
            if *shutdown.borrow() || d.verdict == Verdict::Reclaim {
                continue;
            }
            let version = ws.latest_build.template_version_id.clone().unwrap_or_default();
            if self.ttl_refused.get(&ws.id) == Some(&version) {
                continue;
            }
            let span = span_of(ws);
            let answer = self.coder.set_ttl(&ws.id, Some(ttl)).instrument(span.clone()).await;
            let _in = span.enter();
            match answer {
                Ok(()) => {
                    let e = AuditEvent::new(AuditKind::RestoreTtl, eval.now, self.mode.as_str(), ws, d);
                    tracing::info!(event = "restore_ttl", ttl_ms = ttl, "set the autostop TTL back");
                    self.metrics.ttl_restores.inc();
                    self.audit(&e);
                }
                Err(err) if matches!(err.kind, ErrorKind::Status(400) | ErrorKind::NoPermission) => {
                    tracing::warn!(event = "restore_ttl_refused", error = %err, "Coder refuses this workspace's autostop TTL (the template forbids a user TTL, or the token may not update it): not asked again until its template version changes; set the TTL in the template instead");
                    self.ttl_refused.insert(ws.id.clone(), version);
                }
                Err(err) => {
                    tracing::warn!(event = "restore_ttl_failed", error = %err, "could not set the autostop TTL back; trying again next pass")
                }
            }
        }
        let listed: HashSet<&str> = eval.workspaces().map(|w| w.id.as_str()).collect();
        self.ttl_refused.retain(|id, _| listed.contains(id.as_str()));
    }
}

/// The deadline Coder set when the build completed: completion plus the TTL, never past
/// `max_deadline` (`schedule.CalculateAutostop`, reference coder NOTES §7). `None` without a TTL
/// (the template's default TTL, which the listing does not show).
fn coders_own_deadline(ws: &Workspace) -> Option<DateTime<Utc>> {
    let b = &ws.latest_build;
    let own = b.job.completed_at? + Duration::milliseconds(ws.ttl_ms.filter(|t| *t > 0)?);
    Some(b.max_deadline.map_or(own, |max| own.min(max)))
}

/// The audit event of a deadline extension (or would-be one) from Coder's deadline to `to`.
fn extension_event(kind: AuditKind, now: DateTime<Utc>, mode: Mode, j: &Judged, plan: &DeadlinePlan, to: DateTime<Utc>) -> AuditEvent {
    let ws = &j.workspace;
    AuditEvent {
        build_id: Some(ws.latest_build.id.clone()),
        extension: Some(Extension {
            deadline_from: plan.deadline,
            deadline_to: to,
            deadline_limit: plan.limit,
            limited_by: plan.limited_by.as_str(),
            sm_active_peak: plan.evidence.sm_active_peak,
            gr_engine_active_peak: plan.evidence.gr_engine_active_peak,
        }),
        ..AuditEvent::new(kind, now, mode.as_str(), ws, &j.decision)
    }
}

/// The audit event of a stop (or would-stop) of a judged workspace: its decision, how many GPUs
/// it holds and what one of its GPU-hours costs.
fn stop_event(kind: AuditKind, eval: &Evaluation, j: &Judged, mode: Mode) -> AuditEvent {
    AuditEvent {
        gpus: Some(j.gpus),
        gpu_hour_price: j.price,
        currency: j.price.and(eval.currency.clone()),
        ..AuditEvent::new(kind, eval.now, mode.as_str(), &j.workspace, &j.decision)
    }
}
