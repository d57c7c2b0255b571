//! What the ledger keeps of each stop (`TrackedStop`), a stop planned this pass (`Candidate`), and
//! what the status document shows of them (`StuckStop`, `NoProvisioner`).

use chrono::{DateTime, Utc};

use super::intent::{Listed, PassView};
use crate::coder::types::JobTags;
use crate::pass::audit::{AuditEvent, AuditKind};
use crate::pass::decide::Reason;
use crate::pass::stop_lifecycle::StopState;

/// A stop the ledger follows.
#[derive(Debug, Clone)]
pub(super) struct TrackedStop {
    pub(super) event: AuditEvent,
    /// When the current state began (for a stop in flight: when it was sent).
    pub(super) since: DateTime<Utc>,
    /// The build the stop was decided on (the running start build): a different latest build
    /// in the listing means a new session, and tracking starts afresh.
    pub(super) session: String,
    pub(super) organization: String,
    /// Its GPU pool (an index into `Policy::pools`).
    pub(super) pool: usize,
    /// `last_used_at` when the stop was decided: a later one means the workspace was used since.
    pub(super) last_used_at: DateTime<Utc>,
    /// Stop POSTs so far, sent or refused (a succeeded stop ends tracking).
    pub(super) attempts: u32,
    /// `stop_stuck` was written this idle episode.
    pub(super) stuck_reported: bool,
    /// A reaped stop was sent again this idle episode.
    pub(super) resent_after_reap: bool,
    /// Since the reap, a provisioner listing (or, without one, a build completed in the
    /// organization) said a provisioner answers: the reaped stop may be sent again.
    pub(super) provisioner_answered: bool,
    /// The provisioner tags its build needs (the start's, until Coder answered with the stop's).
    pub(super) tags: JobTags,
    /// Since when no provisioner matching `tags` is available for it: it is not sent again
    /// meanwhile, nor is any new stop that needs the same tags.
    pub(super) no_provisioner_since: Option<DateTime<Utc>>,
    pub(super) state: StopState,
}

impl TrackedStop {
    /// A stop a previous run sent, read back from the audit log: followed as any stop in flight;
    /// its session is unknown, so a listed running build ends it once its job is final.
    pub(super) fn recovered(event: AuditEvent, state: StopState) -> Self {
        TrackedStop {
            since: event.time,
            session: String::new(),
            organization: String::new(),
            pool: 0,
            last_used_at: event.time,
            attempts: 1,
            stuck_reported: false,
            resent_after_reap: false,
            provisioner_answered: false,
            tags: JobTags::default(),
            no_provisioner_since: None,
            state,
            event,
        }
    }

    pub(super) fn change(&self, kind: AuditKind, now: DateTime<Utc>) -> AuditEvent {
        AuditEvent { event: kind, time: now, attempts: Some(self.attempts), ..self.event.clone() }
    }
}

/// One stop planned this pass, as `observe` needs it to track the answer.
#[derive(Debug, Clone)]
pub(super) struct Candidate {
    pub(super) event: AuditEvent,
    pub(super) pool: usize,
    pub(super) session: String,
    pub(super) organization: String,
    pub(super) last_used_at: DateTime<Utc>,
    pub(super) tags: JobTags,
}

/// Stops that wait for a provisioner matching their tags (status document, `check`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct NoProvisioner {
    pub organization_id: String,
    pub tags: JobTags,
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

/// A stop build that has stayed pending longer than `stop_timeout`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StuckStop {
    pub workspace_id: String,
    pub workspace: String,
    pub owner: String,
    pub build_id: String,
    pub pending_since: DateTime<Utc>,
}

/// The audit event of a stop (or would-stop) of a judged workspace: its decision, how many GPUs
/// it holds and what one of its GPU-hours costs.
pub(super) fn stop_event(kind: AuditKind, view: &PassView, mode: &'static str, j: &Listed) -> AuditEvent {
    AuditEvent {
        gpus: Some(j.gpus),
        gpu_hour_price: j.price,
        currency: j.price.and(view.currency.map(str::to_string)),
        ..AuditEvent::new(kind, view.now, mode, j.workspace, j.decision)
    }
}

/// Stops decided while someone is connected expect use: their guard checks the build only.
pub(super) fn expects_use(reason: &str) -> bool {
    reason == Reason::ConnectedButGpuIdle.as_str() || reason == Reason::MaxLifetime.as_str()
}
