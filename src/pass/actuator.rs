//! The actuator: the executor of the ledger's plans (`reclaimer_core::ledger`), and the only code
//! with side effects toward Coder or people (stop builds, deadline moves, TTL restores, audit
//! lines, webhook events, the log lines of actions). It holds the one `CoderActions` of a run,
//! and only in enforce mode: `acts` is the one place in the crate that decides by the mode, and
//! `Application::build` makes the capability only where it says so, so observe mode and `plan`
//! cannot write to Coder by construction.
//!
//! A pass: the ledger plans (calls and notes, as values); the notes are written; each call is
//! made once, in order (no retry inside a pass: Coder's answer goes back to the ledger, which
//! backs off across passes; no new write once shutdown began); the ledger observes the answers
//! and the notes they cause are written.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tracing::Instrument;

use crate::coder::actions::CoderActions;
use crate::coder::identity::Identity;
use crate::coder::types::WorkspaceBuild;
use crate::coder::{CoderError, ErrorKind, StopOutcome};
use crate::error::Error;
use crate::logging::workspace_span;
use crate::pass::audit::{AuditKind, AuditLog, Notifier};
use crate::pass::evaluate::Evaluation;
use crate::pass::metrics::{ExtensionFailure, ExtensionFailureLabels, Metrics, StopFailure, StopFailureLabels, StopLabels, TemplateLabels};
use crate::pass::mode::Mode;
use reclaimer_core::ledger::{Call, Count, Failure, Ledger, LedgerConfig, Level, Note, Outcome, StopAnswer, StopCall};

pub use reclaimer_core::ledger::{Acted, MAX_STOP_ATTEMPTS, NoProvisioner, StuckStop};

/// How long shutdown waits for webhook deliveries in flight.
pub const NOTIFY_DRAIN: std::time::Duration = std::time::Duration::from_secs(3);

/// Provisioner tags (`job.tags`).
pub type Tags = crate::coder::types::JobTags;

/// Whether the mode writes to Coder: the one place in the crate where the mode is checked.
/// `Application::build` makes `CoderActions` only where this holds.
pub fn acts(mode: Mode) -> bool {
    matches!(mode, Mode::Enforce)
}

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

/// How often and how long the ledger waits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StopLimits {
    /// Between passes: a failed stop's first retry waits this long.
    pub interval: std::time::Duration,
    /// A stop build pending longer than this (no provisioner took it) is reported as stuck.
    pub stop_timeout: std::time::Duration,
    /// How long a done stop keeps serving a waiter of its pool while that waiter still waits.
    pub start_allowance: std::time::Duration,
}

pub struct Actuator {
    ledger: Ledger,
    /// The right to write to Coder: `Some` in enforce mode only.
    coder: Option<CoderActions>,
    metrics: Arc<Metrics>,
    outputs: Outputs,
}

impl Actuator {
    /// `coder` is the capability to write (enforce mode) or `None` (observe mode: the ledger
    /// plans no call, only what enforce mode would do).
    pub fn new(
        mode: Mode,
        coder: Option<CoderActions>,
        metrics: Arc<Metrics>,
        outputs: Outputs,
        limits: StopLimits,
        self_id: Option<String>,
    ) -> Self {
        tracing::info!(event = "mode", mode = mode.as_str(), "{}", mode.describe());
        let config = LedgerConfig {
            mode: mode.as_str(),
            enforce: coder.is_some(),
            interval: crate::duration::chrono(limits.interval),
            stop_timeout: crate::duration::chrono(limits.stop_timeout),
            start_allowance: crate::duration::chrono(limits.start_allowance),
        };
        Actuator { ledger: Ledger::new(config, self_id), coder, metrics, outputs }
    }

    /// The token's user changed (a rotated token of another account): its stops are ours.
    pub fn set_self_id(&mut self, id: String) {
        self.ledger.set_self_id(id);
    }

    /// At shutdown: gives webhook deliveries in flight a few seconds to finish.
    pub async fn finish(&self) {
        if let Some(n) = &self.outputs.notifier {
            n.drain(NOTIFY_DRAIN).await;
        }
    }

    /// Stops being followed, retried later, canceled or abandoned.
    pub fn tracked_count(&self) -> usize {
        self.ledger.tracked_count()
    }

    /// Stops already sent that still serve a waiter, per pool (for the next pass's fleet rules).
    pub fn serving(&self) -> Vec<usize> {
        self.ledger.serving()
    }

    /// Stop builds reported stuck and still pending (for the status document).
    pub fn stuck_stops(&self) -> Vec<StuckStop> {
        self.ledger.stuck_stops()
    }

    /// Stops that wait for a provisioner, by organization and tags (for the status document).
    pub fn without_provisioner(&self) -> Vec<NoProvisioner> {
        self.ledger.without_provisioner()
    }

    /// Rebuilds, from the audit log a previous run wrote, what it knew about stops (the ledger
    /// decides; this reads the file).
    pub fn recover(&mut self, now: DateTime<Utc>) {
        if !self.ledger.enforces() {
            return;
        }
        // Only a regular file is read back (a device such as /dev/full reads forever).
        let Some(path) = self.outputs.audit.as_ref().filter(|a| a.is_regular()).map(|a| a.path().to_path_buf()) else { return };
        let mut records = Vec::new();
        if let Err(e) = crate::pass::audit::read_records(&path, |r| {
            if r.kind().is_some_and(|k| k.as_str().starts_with("stop_") || k.as_str().starts_with("countdown_") || k == AuditKind::Resumed)
            {
                records.push(r);
            }
        }) {
            tracing::warn!(event = "audit_recovery_failed", path = %path.display(), error = %e, "cannot read the audit log back; stops of the previous run are not followed");
            return;
        }
        let found = self.ledger.recover(now, records);
        if found.followed + found.resumable + found.unconfirmed + found.countdowns > 0 {
            tracing::info!(
                event = "audit_recovered",
                followed = found.followed,
                resumable = found.resumable,
                unconfirmed = found.unconfirmed,
                countdowns = found.countdowns,
                "read back the stops of the previous run from the audit log"
            );
        }
    }

    /// One pass: the ledger plans, the calls are made once each, the ledger observes.
    pub async fn act(&mut self, eval: &Evaluation, shutdown: &watch::Receiver<bool>) -> Acted {
        let listed = eval.listed();
        let plan = self.ledger.plan(&eval.view(&listed, *shutdown.borrow()));
        self.write_all(plan.notes);
        let mut outcomes = Vec::with_capacity(plan.calls.len());
        // Stops of this pass that Coder answered with a build no provisioner matches.
        let mut unmatched: Vec<(StopCall, WorkspaceBuild)> = Vec::new();
        for call in plan.calls {
            if call.writes() && *shutdown.borrow() {
                let span = call.workspace_id().map_or_else(tracing::Span::none, |id| workspace_span(id, "", ""));
                span.in_scope(|| tracing::info!(event = "stop_skipped_shutdown", "shutting down: no new write to Coder"));
                continue;
            }
            if let Call::Stop(stop) = &call {
                if unmatched.iter().any(|(earlier, answer)| stop.held_by(earlier, answer)) {
                    outcomes.push(Outcome::Stop { workspace_id: stop.event.workspace_id.clone(), answer: StopAnswer::Held });
                    continue;
                }
            }
            let stop = match &call {
                Call::Stop(stop) => Some((**stop).clone()),
                _ => None,
            };
            let Some(outcome) = self.perform(call).await else { continue };
            if let (Some(stop), Outcome::Stop { answer: StopAnswer::Queued(build), .. }) = (stop, &outcome) {
                unmatched.push((stop, (**build).clone()));
            }
            outcomes.push(outcome);
        }
        let notes = self.ledger.observe(outcomes);
        self.write_all(notes);
        self.metrics.stuck_stops.set(self.ledger.stuck_stops().len() as i64);
        self.ledger.acted(self.outputs.audit.as_ref().is_some_and(|a| !a.probe()))
    }

    /// Makes one call, once. `None` only without the capability (observe mode plans none).
    async fn perform(&self, call: Call) -> Option<Outcome> {
        let coder = self.coder.as_ref()?;
        let span = match &call {
            Call::Stop(s) => workspace_span(&s.event.workspace_id, &s.event.owner, &s.event.template),
            Call::Extend { event, .. } | Call::RestoreTtl { event, .. } => {
                workspace_span(&event.workspace_id, &event.owner, &event.template)
            }
            other => other.workspace_id().map_or_else(tracing::Span::none, |id| workspace_span(id, "", "")),
        };
        let outcome = match call {
            Call::FollowStop { workspace_id, build_id } => {
                let answer = coder.workspace_build(&build_id).instrument(span).await.map_err(failure);
                Outcome::FollowStop { workspace_id, build_id, answer }
            }
            Call::Settle { workspace_id } => {
                let answer = latest_build(coder, &workspace_id).instrument(span).await;
                Outcome::Settle { workspace_id, answer }
            }
            Call::FollowCountdown { workspace_id } => {
                let answer = latest_build(coder, &workspace_id).instrument(span).await;
                Outcome::FollowCountdown { workspace_id, answer }
            }
            Call::ListProvisioners { organization, tags } => {
                let answer = coder.provisioner_daemons(&organization, &tags).await.map(|d| !d.is_empty()).map_err(failure);
                Outcome::ListProvisioners { organization, tags, answer }
            }
            Call::Stop(stop) => {
                let workspace_id = stop.event.workspace_id.clone();
                let answer = self.guarded_stop(coder, *stop).instrument(span).await;
                Outcome::Stop { workspace_id, answer }
            }
            Call::Extend { workspace_id, to, .. } => {
                let answer = coder.extend_deadline(&workspace_id, to).instrument(span).await.map_err(failure);
                Outcome::Extend { workspace_id, answer }
            }
            Call::RestoreTtl { workspace_id, ttl_ms, .. } => {
                let answer = coder.set_ttl(&workspace_id, Some(ttl_ms)).instrument(span).await.map_err(failure);
                Outcome::RestoreTtl { workspace_id, answer }
            }
        };
        Some(outcome)
    }

    /// A stop under its guard: the workspace read afresh, the `stop_sending` line written and
    /// synced, the POST, and the latest build read back when the reply is unclear.
    async fn guarded_stop(&self, coder: &CoderActions, stop: StopCall) -> StopAnswer {
        let id = stop.event.workspace_id.as_str();
        let ws = match coder.workspace(id).await {
            Ok(ws) => ws,
            Err(e) => return StopAnswer::Unread(failure(e)),
        };
        let used = stop.last_used_at.is_some_and(|t| ws.last_used_at > t);
        if ws.latest_build.id != stop.expect_build || used {
            return StopAnswer::Moved { latest_build: ws.latest_build.id.to_string(), last_used_at: ws.last_used_at };
        }
        // The line first, on disk, then the POST: a stop is never sent without its audit line.
        let sending = reclaimer_core::pass::audit::AuditEvent { event: AuditKind::StopSending, ..stop.event.clone() };
        if !self.audit(&sending) {
            return StopAnswer::AuditFailed;
        }
        let reply = match coder.stop_workspace(id).await {
            Ok(StopOutcome::Queued(build)) => return StopAnswer::Queued(build),
            Ok(StopOutcome::BuildActive(message)) => Ok(message),
            Err(e) if matches!(e.kind, ErrorKind::Transport | ErrorKind::Status(500..=599)) => Err(failure(e)),
            Err(e) => return StopAnswer::Refused(failure(e)),
        };
        // A timeout after Coder created the build, then a 409 on the retry, is still our stop:
        // the latest build tells.
        let latest = coder.workspace(id).await.ok().map(|w| Box::new(w.latest_build));
        StopAnswer::Unclear { reply, latest }
    }

    fn write_all(&self, notes: Vec<Note>) {
        for note in notes {
            self.write(note);
        }
    }

    /// Writes one note: its log line (in its workspace's span), its audit line, its webhook
    /// event, its counter.
    fn write(&self, note: Note) {
        let span = note.who.as_ref().map_or_else(tracing::Span::none, |w| workspace_span(&w.workspace_id, &w.owner, &w.template));
        let _in = span.enter();
        log(&note);
        if let Some(record) = &note.record {
            if note.audit {
                self.audit(record);
            }
            if note.notify {
                if let Some(n) = &self.outputs.notifier {
                    n.send(record);
                }
            }
        }
        let template = || TemplateLabels { template: note.who.as_ref().map_or("", |w| w.template.as_str()).into() };
        match note.count {
            None => {}
            Some(Count::Stop { reason, mode }) => {
                self.metrics.stops.get_or_create(&StopLabels { reason, mode }).inc();
            }
            Some(Count::StopFailure(kind)) => {
                self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: stop_failure(kind) }).inc();
            }
            Some(Count::DeadlineExtended) => {
                self.metrics.deadline_extensions.get_or_create(&template()).inc();
            }
            Some(Count::ExtensionRefused) => self.extension_failure(ExtensionFailure::Refused),
            Some(Count::ExtensionFailed) => self.extension_failure(ExtensionFailure::Error),
            Some(Count::AutostopAverted) => {
                self.metrics.autostops_averted.get_or_create(&template()).inc();
            }
            Some(Count::TtlRestored) => {
                self.metrics.ttl_restores.inc();
            }
            Some(Count::CountdownSet) => {
                self.metrics.countdowns_set.get_or_create(&template()).inc();
            }
            Some(Count::CountdownAverted) => {
                self.metrics.countdowns_averted.get_or_create(&template()).inc();
            }
        }
    }

    fn extension_failure(&self, reason: ExtensionFailure) {
        self.metrics.deadline_extension_failures.get_or_create(&ExtensionFailureLabels { reason }).inc();
    }

    /// Writes one audit line: the one way the actuator writes to the audit log. `false` when a
    /// configured log could not take it (counted; readiness fails meanwhile).
    fn audit(&self, event: &reclaimer_core::pass::audit::AuditEvent) -> bool {
        let Some(a) = &self.outputs.audit else { return true };
        let written = a.append(event);
        if !written {
            self.metrics.audit_write_failures.inc();
        }
        written
    }
}

/// A workspace's latest build, `None` when Coder has no such workspace (or no longer lets the
/// token read it).
async fn latest_build(coder: &CoderActions, id: &str) -> Result<Option<WorkspaceBuild>, Failure> {
    match coder.workspace(id).await {
        Ok(ws) => Ok(Some(ws.latest_build)),
        Err(e) if matches!(e.kind, ErrorKind::NoPermission | ErrorKind::Status(404 | 410)) => Ok(None),
        Err(e) => Err(failure(e)),
    }
}

/// A note's log line at its level, each fact a field of its own.
fn log(note: &Note) {
    use reclaimer_core::ledger::Fact as F;
    let f = |k| note.get(k);
    let (event, text) = (note.event, note.text.as_str());
    let (build_id, reason, error) = (note.build_id.as_deref(), note.reason, note.error.as_deref());
    macro_rules! at_level {
        ($level:expr) => {
            tracing::event!(
                $level,
                event,
                build_id,
                reason,
                error,
                attempt = f(F::Attempt),
                attempts = f(F::Attempts),
                deadline = f(F::Deadline),
                detail = f(F::Detail),
                from = f(F::From),
                gpu_seconds_given_back = f(F::GpuSecondsGivenBack),
                job_status = f(F::JobStatus),
                last_used_at = f(F::LastUsedAt),
                latest_build = f(F::LatestBuild),
                limit = f(F::Limit),
                limited_by = f(F::LimitedBy),
                matched = f(F::Matched),
                original_deadline = f(F::OriginalDeadline),
                pending_for = f(F::PendingFor),
                reply_lost = f(F::ReplyLost),
                retry_in = f(F::RetryIn),
                since = f(F::Since),
                stop_at = f(F::StopAt),
                tags = f(F::Tags),
                to = f(F::To),
                ttl_ms = f(F::TtlMs),
                "{text}"
            )
        };
    }
    match note.level {
        Level::Info => at_level!(tracing::Level::INFO),
        Level::Warn => at_level!(tracing::Level::WARN),
        Level::Error => at_level!(tracing::Level::ERROR),
    }
}

/// A Coder error as the ledger reads it: its status (`None` without an answer) and its words.
fn failure(e: CoderError) -> Failure {
    let status = match e.kind {
        ErrorKind::Unauthorized => Some(401),
        ErrorKind::NoPermission => Some(403),
        ErrorKind::Conflict => Some(409),
        ErrorKind::RateLimited => Some(429),
        ErrorKind::Status(s) => Some(s),
        ErrorKind::Transport | ErrorKind::Decode => None,
    };
    Failure { status, text: e.to_string() }
}

fn stop_failure(kind: reclaimer_core::ledger::StopFailure) -> StopFailure {
    use reclaimer_core::ledger::StopFailure as K;
    match kind {
        K::Rejected => StopFailure::Rejected,
        K::BuildFailed => StopFailure::BuildFailed,
        K::Stuck => StopFailure::Stuck,
        K::Reaped => StopFailure::Reaped,
        K::Abandoned => StopFailure::Abandoned,
        K::Audit => StopFailure::Audit,
    }
}
