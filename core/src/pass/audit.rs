//! The audit vocabulary: what one audit line says (`AuditKind`, the event's name; `AuditEvent`,
//! the line as written; `AuditRecord`, the line as read back by `report` and the service's own
//! recovery), and the texts of each kind. The writer (a file appended and synced) and the webhook
//! are the service crate's `pass::audit`; both halves use these names, so a reader never spells an
//! event the writer does not.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::coder::types::Workspace;
use crate::duration::human;
use crate::pass::decide::Decision;

/// What happened. The observe-mode kinds (`would_*`) are what enforce mode would have done.
/// Written and read by one spelling, `as_str`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditKind {
    /// A grace period began: the stop follows unless the workspace becomes active.
    Warn,
    WouldWarn,
    /// Written and synced before the stop's POST: a stop is never sent without its line. After
    /// a restart, one with no `stop_sent` after it is checked against Coder's builds.
    StopSending,
    /// The stop announced by `stop_sending` was not sent after all (another build was active,
    /// or after a restart no such build is found): it closes the `stop_sending` line.
    StopNotSent,
    StopSent,
    WouldStop,
    /// A provisioner took the stop build.
    StopRunning,
    /// The stop build stayed pending past `stop_timeout` (once per idle episode).
    StopStuck,
    /// The stop was refused, or its build failed on its own: tried again after a back-off.
    StopFailed,
    /// coderd's job reaper failed the stop build (no provisioner took it in 30 minutes, or it hung).
    StopReaped,
    /// A person canceled the stop build: not sent again in this idle episode.
    StopCanceled,
    /// Written by earlier versions, which withdrew a pending stop when its workspace was used
    /// again; read back (recovery, `report`), never written: a stop once sent is never canceled
    /// (reference coder NOTES §18).
    StopWithdrawn,
    /// Every attempt to stop failed; nothing more is tried until the workspace's next build.
    StopAbandoned,
    RestoreTtl,
    /// The stop build succeeded: the workspace's GPUs are free.
    StopDone,
    /// A workspace this service stopped runs again: the GPUs it gave back, for how long.
    Resumed,
    /// Coder's autostop deadline was moved because the GPU computes with nobody connected.
    DeadlineExtended,
    /// Observe mode: the deadline would have been moved (once per build).
    WouldExtend,
    /// The deadline Coder had before the first extension passed while the GPU still computed:
    /// without the extension Coder's autostop would have stopped the work (once per build).
    AutostopAverted,
    /// `countdown_in_coder`: Coder's deadline was moved to now plus the countdown; Coder warns,
    /// and stops the workspace at it unless someone comes back.
    CountdownSet,
    /// Observe mode: the countdown would have been started (once per build).
    WouldCountdown,
    /// Someone came back before the countdown's deadline: nothing was stopped.
    CountdownAverted,
    /// The workspace is no longer judged idle (the GPU computes, the data turned doubtful,
    /// nobody waits any more): the countdown ended without a use.
    CountdownWithdrawn,
    /// Coder's deadline was moved back where the countdown had found it (or to now plus the TTL).
    CountdownRestored,
    /// Coder's lifecycle executor stopped the workspace at the countdown's deadline: its GPUs
    /// are free, a reclaim like `stop_done`.
    CountdownDone,
    /// The deadline passed and Coder did not stop it: the service's own stop follows.
    CountdownExpired,
}

impl AuditKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditKind::Warn => "warn",
            AuditKind::WouldWarn => "would_warn",
            AuditKind::StopSending => "stop_sending",
            AuditKind::StopNotSent => "stop_not_sent",
            AuditKind::StopSent => "stop_sent",
            AuditKind::WouldStop => "would_stop",
            AuditKind::StopRunning => "stop_running",
            AuditKind::StopStuck => "stop_stuck",
            AuditKind::StopFailed => "stop_failed",
            AuditKind::StopReaped => "stop_reaped",
            AuditKind::StopCanceled => "stop_canceled",
            AuditKind::StopWithdrawn => "stop_withdrawn",
            AuditKind::StopAbandoned => "stop_abandoned",
            AuditKind::RestoreTtl => "restore_ttl",
            AuditKind::StopDone => "stop_done",
            AuditKind::Resumed => "resumed",
            AuditKind::DeadlineExtended => "deadline_extended",
            AuditKind::WouldExtend => "would_extend",
            AuditKind::AutostopAverted => "autostop_averted",
            AuditKind::CountdownSet => "countdown_set",
            AuditKind::WouldCountdown => "would_countdown",
            AuditKind::CountdownAverted => "countdown_averted",
            AuditKind::CountdownWithdrawn => "countdown_withdrawn",
            AuditKind::CountdownRestored => "countdown_restored",
            AuditKind::CountdownDone => "countdown_done",
            AuditKind::CountdownExpired => "countdown_expired",
        }
    }

    /// Every kind, in the order `as_str` lists them.
    pub const ALL: [AuditKind; 26] = [
        AuditKind::Warn,
        AuditKind::WouldWarn,
        AuditKind::StopSending,
        AuditKind::StopNotSent,
        AuditKind::StopSent,
        AuditKind::WouldStop,
        AuditKind::StopRunning,
        AuditKind::StopStuck,
        AuditKind::StopFailed,
        AuditKind::StopReaped,
        AuditKind::StopCanceled,
        AuditKind::StopWithdrawn,
        AuditKind::StopAbandoned,
        AuditKind::RestoreTtl,
        AuditKind::StopDone,
        AuditKind::Resumed,
        AuditKind::DeadlineExtended,
        AuditKind::WouldExtend,
        AuditKind::AutostopAverted,
        AuditKind::CountdownSet,
        AuditKind::WouldCountdown,
        AuditKind::CountdownAverted,
        AuditKind::CountdownWithdrawn,
        AuditKind::CountdownRestored,
        AuditKind::CountdownDone,
        AuditKind::CountdownExpired,
    ];

    /// The kind an audit line names (`event`), as the writer wrote it.
    pub fn named(text: &str) -> Option<AuditKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }

    /// The sentence a person reads, e.g. in Slack.
    fn headline(self, e: &AuditEvent) -> String {
        let left = e.stop_at.map(|t| human(t - e.time));
        match (self, left) {
            (AuditKind::Warn, Some(left)) => format!("will be stopped in {left} to free its GPU unless it becomes active"),
            (AuditKind::Warn, None) => "will be stopped to free its GPU unless it becomes active".into(),
            (AuditKind::WouldWarn, Some(left)) => {
                format!("would be stopped in {left} to free its GPU (observe mode: nothing is stopped)")
            }
            (AuditKind::WouldWarn, None) => "would be stopped to free its GPU (observe mode: nothing is stopped)".into(),
            (AuditKind::StopSending, _) => "is being stopped to free its GPU".into(),
            (AuditKind::StopNotSent, _) => "was not stopped after all".into(),
            (AuditKind::StopSent, _) => "was stopped to free its GPU".into(),
            (AuditKind::WouldStop, _) => "would be stopped to free its GPU (observe mode: nothing was stopped)".into(),
            (AuditKind::StopRunning, _) => "is being stopped".into(),
            (AuditKind::StopStuck, _) => "has a stop build that no provisioner takes".into(),
            (AuditKind::StopFailed, _) => "could not be stopped this time; the reclaimer tries again later".into(),
            (AuditKind::StopReaped, _) => {
                "had its stop build failed by Coder's job reaper (no provisioner took it); it keeps its GPU for now".into()
            }
            (AuditKind::StopCanceled, _) => "had its stop canceled by a person; it is not stopped again while it stays idle".into(),
            (AuditKind::StopWithdrawn, _) => {
                "was used again before its stop build started: the reclaimer withdrew the stop; start the workspace again to reconnect"
                    .into()
            }
            (AuditKind::StopAbandoned, _) => "could not be stopped; the reclaimer gave up until its next build".into(),
            (AuditKind::RestoreTtl, _) => "had its autostop TTL set back".into(),
            (AuditKind::StopDone, _) => "is stopped; its GPU is free".into(),
            (AuditKind::Resumed, _) => "runs again".into(),
            (AuditKind::DeadlineExtended, _) => match &e.extension {
                Some(x) => format!("is kept running by its GPU work until {}", crate::pass::mode::at(x.deadline_to)),
                None => "is kept running by its GPU work".into(),
            },
            (AuditKind::WouldExtend, _) => {
                "would be kept running by its GPU work (observe mode: Coder's autostop deadline is not moved)".into()
            }
            (AuditKind::AutostopAverted, _) => "passed its original autostop deadline while its GPU computes".into(),
            (AuditKind::CountdownSet, _) => match &e.extension {
                Some(x) => {
                    format!("will be stopped by Coder at {} to free its GPU unless someone uses it", crate::pass::mode::at(x.deadline_to))
                }
                None => "will be stopped by Coder to free its GPU unless someone uses it".into(),
            },
            (AuditKind::WouldCountdown, _) => {
                "would get Coder's countdown to free its GPU (observe mode: its deadline is not moved)".into()
            }
            (AuditKind::CountdownAverted, _) => "was used again before Coder's countdown ended: it keeps running".into(),
            (AuditKind::CountdownWithdrawn, _) => "is no longer idle: Coder's countdown is withdrawn".into(),
            (AuditKind::CountdownRestored, _) => "had its autostop deadline moved back after its countdown".into(),
            (AuditKind::CountdownDone, _) => "was stopped by Coder at the end of its countdown; its GPU is free".into(),
            (AuditKind::CountdownExpired, _) => "passed its countdown's deadline but Coder did not stop it: the reclaimer stops it".into(),
        }
    }
}

impl Serialize for AuditKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// GPU time given back: `gpus` GPUs from `from` until `to` (none unless `to` is later), in
/// seconds. The one formula behind the `resumed` line, `report`'s sums and the running
/// accounting.
pub fn gpu_seconds_given_back(gpus: u64, from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    let seconds = (to - from).num_milliseconds().max(0) as f64 / 1000.0;
    seconds * gpus as f64
}

/// One event about one workspace.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AuditEvent {
    pub time: DateTime<Utc>,
    pub event: AuditKind,
    /// `observe` or `enforce`.
    pub mode: &'static str,
    pub workspace_id: String,
    pub workspace: String,
    pub owner: String,
    pub template: String,
    pub reason: &'static str,
    pub message: String,
    pub gpu_idle_seconds: Option<i64>,
    pub connection_idle_seconds: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// GPUs the workspace held (stops).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u64>,
    /// GPU-seconds given back, from the stop until it ran again (`resumed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_seconds_given_back: Option<i64>,
    /// The price of one of its GPU-hours when it was stopped (`gpu_hour_price`), and its currency:
    /// the `report` subcommand prices what was given back with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_hour_price: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// A deadline extension (or would-be one): the deadlines and the GPU evidence.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub extension: Option<Extension>,
}

/// What an extension moved and why (`deadline_extended`, `would_extend`, `autostop_averted`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Extension {
    /// Coder's deadline before (for `autostop_averted`: the one before the first extension).
    pub deadline_from: DateTime<Utc>,
    pub deadline_to: DateTime<Utc>,
    /// The latest the service extends to, and what sets it (`extend_limit`, `max_deadline`).
    pub deadline_limit: DateTime<Utc>,
    pub limited_by: &'static str,
    /// The peaks of the window the decision read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sm_active_peak: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gr_engine_active_peak: Option<f64>,
}

impl AuditEvent {
    pub fn new(event: AuditKind, time: DateTime<Utc>, mode: &'static str, ws: &Workspace, d: &Decision) -> Self {
        AuditEvent {
            time,
            event,
            mode,
            workspace_id: ws.id.clone(),
            workspace: ws.name.clone(),
            owner: ws.owner_name.clone(),
            template: ws.template_name.clone(),
            reason: d.reason.as_str(),
            message: d.message.clone(),
            gpu_idle_seconds: d.gpu_idle.map(|g| g.num_seconds()),
            connection_idle_seconds: d.connection_idle.num_seconds(),
            build_id: None,
            stop_at: d.stop_at,
            attempts: None,
            gpus: None,
            gpu_seconds_given_back: None,
            gpu_hour_price: None,
            currency: None,
            extension: None,
        }
    }

    /// An event rebuilt from its audit line (enforce mode: only enforce mode sends stops).
    pub fn recovered(event: AuditKind, r: &AuditRecord) -> Self {
        AuditEvent {
            time: r.time,
            event,
            mode: crate::pass::mode::Mode::Enforce.as_str(),
            workspace_id: r.workspace_id.clone(),
            workspace: r.workspace.clone(),
            owner: r.owner.clone(),
            template: r.template.clone(),
            reason: stop_reason(&r.reason),
            message: r.message.clone(),
            gpu_idle_seconds: None,
            connection_idle_seconds: 0,
            build_id: r.build_id.clone(),
            stop_at: None,
            attempts: None,
            gpus: r.gpus,
            gpu_seconds_given_back: None,
            gpu_hour_price: r.gpu_hour_price,
            currency: r.currency.clone(),
            extension: None,
        }
    }

    /// "Workspace alice/train was stopped to free its GPU: GPU idle 41m, no connection for 38m".
    pub fn text(&self) -> String {
        format!("Workspace {}/{} {}: {}", self.owner, self.workspace, self.event.headline(self), self.message)
    }
}

/// One audit line as a reader sees it (`report`, and the service's own recovery after a
/// restart): the fields that say what happened to whose stop, owned, under the names
/// `AuditEvent` writes them (a round-trip test writes every kind and reads it back).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct AuditRecord {
    pub time: DateTime<Utc>,
    pub event: String,
    #[serde(default)]
    pub workspace_id: String,
    #[serde(default)]
    pub workspace: String,
    #[serde(default)]
    pub owner: String,
    #[serde(default)]
    pub template: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub build_id: Option<String>,
    #[serde(default)]
    pub gpus: Option<u64>,
    #[serde(default)]
    pub gpu_seconds_given_back: Option<i64>,
    #[serde(default)]
    pub gpu_hour_price: Option<f64>,
    #[serde(default)]
    pub currency: Option<String>,
    /// A deadline move's (`countdown_set`, `deadline_extended`): Coder's deadline before and after.
    #[serde(default)]
    pub deadline_from: Option<DateTime<Utc>>,
    #[serde(default)]
    pub deadline_to: Option<DateTime<Utc>>,
}

impl AuditRecord {
    /// The kind its `event` names, or `None` for a line of no kind this version writes.
    pub fn kind(&self) -> Option<AuditKind> {
        AuditKind::named(&self.event)
    }
}

/// The longest audit line read; real ones are under 2 KB.
pub const MAX_LINE: usize = 64 << 10;

/// A stop reason as the decisions name it (`Reason::as_str`), for an event rebuilt from its line.
pub fn stop_reason(text: &str) -> &'static str {
    use crate::pass::decide::Reason;
    [Reason::Idle, Reason::MemoryHeldIdle, Reason::PhantomUtilization, Reason::ConnectedButGpuIdle, Reason::MaxLifetime]
        .map(Reason::as_str)
        .into_iter()
        .find(|r| *r == text)
        .unwrap_or(Reason::Idle.as_str())
}
