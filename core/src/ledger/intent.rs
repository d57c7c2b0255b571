//! The ledger's vocabulary: its settings and input (`LedgerConfig`, `PassView`), what a pass
//! plans (`Plan`: `Call`s to Coder and `Note`s to write), what Coder answered (`Outcome`), and
//! what a pass did (`Acted`). Values only; `ledger` moves on them.

use chrono::{DateTime, Duration, Utc};

use crate::coder::types::{JobTags, Workspace, WorkspaceBuild};
use crate::pass::audit::AuditEvent;
use crate::pass::decide::Decision;
use crate::pass::fleet::FleetOutcome;
use crate::pass::judge::Judged;

/// How many times a stop is tried before it is abandoned (until the workspace's next build).
pub const MAX_STOP_ATTEMPTS: u32 = 5;
/// The longest wait between two attempts to stop one workspace.
pub const MAX_STOP_BACKOFF: Duration = Duration::minutes(30);
/// How long a stop done is remembered for its `resumed` line (deleted, or never started again).
pub const STOPPED_MEMORY: Duration = Duration::days(8);

/// The settings the ledger reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LedgerConfig {
    /// The mode's name in the events it writes (`Mode::as_str`).
    pub mode: &'static str,
    /// Whether it plans writes to Coder (enforce mode, with the capability to write). Without,
    /// it plans what enforce mode would do as `would_*` notes and no call at all.
    pub enforce: bool,
    /// The pass interval: a failed stop's first retry waits this long.
    pub interval: Duration,
    /// A stop build pending longer than this (no provisioner took it) is reported as stuck.
    pub stop_timeout: Duration,
    /// How long a done stop keeps serving a waiter of its pool while that waiter still waits
    /// (the policy's `start_allowance`: its pod may still be binding, pulling, starting).
    pub start_allowance: Duration,
}

/// One listed workspace as the ledger reads it, borrowed from the pass (`run`'s evaluation, or the
/// backtest's listing and decisions).
#[derive(Debug, Clone, Copy)]
pub struct Listed<'a> {
    pub workspace: &'a Workspace,
    pub decision: &'a Decision,
    /// How many GPUs report for it.
    pub gpus: u64,
    /// The price of one of its GPU-hours, when set.
    pub price: Option<f64>,
}

impl<'a> From<&'a Judged> for Listed<'a> {
    fn from(j: &'a Judged) -> Self {
        Listed { workspace: &j.workspace, decision: &j.decision, gpus: j.gpus, price: j.price }
    }
}

/// One pass as judged: the ledger's input.
#[derive(Debug, Clone, Copy)]
pub struct PassView<'a> {
    /// This machine's clock at the pass.
    pub now: DateTime<Utc>,
    /// Coder's clock minus this machine's.
    pub coder_offset: Duration,
    /// The running workspaces, in listing order, each with its decision.
    pub judged: &'a [Listed<'a>],
    /// The fleet rules' outcome; its indices are into `judged`.
    pub fleet: &'a FleetOutcome,
    /// Indices into `judged` of the workspaces whose warning began this pass.
    pub new_warnings: &'a [usize],
    /// The currency of the prices, when GPU time is priced.
    pub currency: Option<&'a str>,
    /// Shutdown began: no new write is planned.
    pub shutting_down: bool,
}

impl PassView<'_> {
    /// Coder's clock at the pass.
    pub fn coder_now(&self) -> DateTime<Utc> {
        self.now + self.coder_offset
    }
}

/// A call to Coder the executor makes, once, this pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// `GET /api/v2/workspacebuilds/{build}`: follow a stop build in flight.
    FollowStop { workspace_id: String, build_id: String },
    /// `GET /api/v2/workspaces/{id}`: settle a stop whose `stop_sending` line a previous run left
    /// without an outcome.
    Settle { workspace_id: String },
    /// `GET /api/v2/organizations/{org}/provisionerdaemons?tags=`: whether a reaped stop has a
    /// provisioner again.
    ListProvisioners { organization: String, tags: JobTags },
    /// A guarded stop: `GET /api/v2/workspaces/{id}`; only if its latest build is still
    /// `expect_build` and its `last_used_at` is not after `last_used_at`, the `stop_sending` line
    /// (written and synced; no stop without it), then `POST .../builds {"transition":"stop"}`;
    /// when the reply is lost or a build is active, the workspace's latest build is read back.
    Stop(Box<StopCall>),
    /// `PUT /api/v2/workspaces/{id}/extend`; on success `event` is written.
    Extend { workspace_id: String, to: DateTime<Utc>, event: Box<AuditEvent> },
    /// `PUT /api/v2/workspaces/{id}/ttl`; on success `event` is written.
    RestoreTtl { workspace_id: String, ttl_ms: i64, event: Box<AuditEvent> },
    /// `GET /api/v2/workspaces/{id}`: what became of a workspace counted down (Coder's countdown,
    /// `countdown_in_coder`) that is no longer listed running.
    FollowCountdown { workspace_id: String },
}

/// A stop to send, with the guard it is sent under.
#[derive(Debug, Clone, PartialEq)]
pub struct StopCall {
    /// The `stop_sent` event it becomes (its `stop_sending` line is this with that kind).
    pub event: AuditEvent,
    /// The build the decision was made on (a listed start, or our failed stop for a retry).
    pub expect_build: String,
    /// `last_used_at` when decided: a later one means the workspace was used since. `None`
    /// for a stop decided while someone is connected (a GPU idle behind an open tab,
    /// `max_lifetime`): it expects use, and only a new build stops it.
    pub last_used_at: Option<DateTime<Utc>>,
    /// Its workspace's organization and the provisioner tags its build needs.
    pub organization: String,
    pub tags: JobTags,
}

impl StopCall {
    /// Whether an earlier stop of this pass, which Coder answered with a build that no available
    /// provisioner matches (`matched_provisioners.available` 0, reference coder NOTES §16), holds
    /// this one: same organization, and this one needs at least its tags, so it would wait
    /// likewise. The first stop of a tag set is sent blind; only Coder's answer tells.
    pub fn held_by(&self, earlier: &StopCall, answer: &WorkspaceBuild) -> bool {
        let unmatched =
            answer.job.status == crate::coder::types::JobStatus::Pending && answer.matched_provisioners.is_some_and(|m| m.available == 0);
        let tags = if answer.job.tags.is_empty() { &earlier.tags } else { &answer.job.tags };
        unmatched && self.organization == earlier.organization && needs_at_least(&self.tags, tags)
    }
}

impl Call {
    /// The workspace the call is about, if one.
    pub fn workspace_id(&self) -> Option<&str> {
        match self {
            Call::FollowStop { workspace_id, .. }
            | Call::Settle { workspace_id }
            | Call::Extend { workspace_id, .. }
            | Call::RestoreTtl { workspace_id, .. }
            | Call::FollowCountdown { workspace_id } => Some(workspace_id),
            Call::Stop(s) => Some(&s.event.workspace_id),
            Call::ListProvisioners { .. } => None,
        }
    }

    /// Whether it changes Coder's state (the executor sends no new one once shutdown began).
    pub fn writes(&self) -> bool {
        matches!(self, Call::Stop(_) | Call::Extend { .. } | Call::RestoreTtl { .. })
    }
}

/// Why a call failed, as the executor read Coder's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The HTTP status, `None` when no answer came (a timeout, a refused connection) or the
    /// answer could not be read.
    pub status: Option<u16>,
    pub text: String,
}

impl Failure {
    /// Coder answered 4xx: final for what was asked (not a 401, an expired or revoked token,
    /// nor a 429, Coder's rate limit).
    pub fn is_refusal(&self) -> bool {
        self.status.is_some_and(|s| (400..500).contains(&s) && s != 401 && s != 429)
    }

    /// No answer, or a 5xx: the request may have reached Coder.
    pub fn is_unclear(&self) -> bool {
        self.status.is_none_or(|s| s >= 500)
    }
}

/// What Coder answered to a `Call`.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    FollowStop {
        workspace_id: String,
        build_id: String,
        answer: Result<WorkspaceBuild, Failure>,
    },
    /// The workspace's latest build (`Ok(None)`: Coder has no such workspace, 404 or 410).
    Settle {
        workspace_id: String,
        answer: Result<Option<WorkspaceBuild>, Failure>,
    },
    ListProvisioners {
        organization: String,
        tags: JobTags,
        answer: Result<bool, Failure>,
    },
    Stop {
        workspace_id: String,
        answer: StopAnswer,
    },
    Extend {
        workspace_id: String,
        answer: Result<(), Failure>,
    },
    RestoreTtl {
        workspace_id: String,
        answer: Result<(), Failure>,
    },
    /// The workspace's latest build (`Ok(None)`: Coder has no such workspace, 404 or 410).
    FollowCountdown {
        workspace_id: String,
        answer: Result<Option<WorkspaceBuild>, Failure>,
    },
}

/// What became of a guarded stop.
#[derive(Debug, Clone, PartialEq)]
pub enum StopAnswer {
    /// The fresh read found the workspace used or built since the decision: not sent.
    Moved { latest_build: String, last_used_at: DateTime<Utc> },
    /// The fresh read failed: not sent this pass.
    Unread(Failure),
    /// Not sent: an earlier stop of this pass needing the same tags found no provisioner
    /// (`StopCall::held_by`).
    Held,
    /// The `stop_sending` line could not be written: not sent.
    AuditFailed,
    /// 201: the stop build.
    Queued(Box<WorkspaceBuild>),
    /// 409 (another build is active), or no clear answer; `latest` is the workspace's latest
    /// build read back (if the read worked): our stop if its reply was lost.
    Unclear { reply: Result<String, Failure>, latest: Option<Box<WorkspaceBuild>> },
    /// Refused (4xx other than 409).
    Refused(Failure),
}

/// How loud a note is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// A counter the executor increments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// A stop sent (enforce mode) or reported (observe mode), by reason and the mode's name.
    Stop {
        reason: &'static str,
        mode: &'static str,
    },
    StopFailure(StopFailure),
    DeadlineExtended,
    ExtensionRefused,
    ExtensionFailed,
    AutostopAverted,
    TtlRestored,
    /// Coder's countdown started (`countdown_in_coder`).
    CountdownSet,
    /// Someone came back before Coder's countdown ended.
    CountdownAverted,
}

/// Why a stop did not go as planned (the `stop_failures_total` kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopFailure {
    Rejected,
    BuildFailed,
    Stuck,
    Reaped,
    Abandoned,
    Audit,
}

/// The facts a note's log line may carry besides its build, reason and error (each its own
/// field; the executor names them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fact {
    Attempt,
    Attempts,
    Deadline,
    Detail,
    From,
    GpuSecondsGivenBack,
    JobStatus,
    LastUsedAt,
    LatestBuild,
    Limit,
    LimitedBy,
    Matched,
    OriginalDeadline,
    PendingFor,
    ReplyLost,
    RetryIn,
    Since,
    StopAt,
    Tags,
    To,
    TtlMs,
}

/// Who a note is about (its log span).
#[derive(Debug, Clone, PartialEq)]
pub struct Who {
    pub workspace_id: String,
    pub owner: String,
    pub template: String,
}

impl Who {
    pub fn of(event: &AuditEvent) -> Self {
        Who { workspace_id: event.workspace_id.clone(), owner: event.owner.clone(), template: event.template.clone() }
    }

    pub fn of_workspace(ws: &Workspace) -> Self {
        Who { workspace_id: ws.id.clone(), owner: ws.owner_name.clone(), template: ws.template_name.clone() }
    }
}

/// One thing to write now: a log line, and as it says, an audit line, a webhook event and a
/// counter. Decided here, written by the executor.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub level: Level,
    /// The log line's `event` field.
    pub event: &'static str,
    pub who: Option<Who>,
    pub text: String,
    pub build_id: Option<String>,
    pub reason: Option<&'static str>,
    pub error: Option<String>,
    /// Further facts for the log line, each a field of its own.
    pub facts: Vec<(Fact, String)>,
    /// The event it is about, written where `audit` and `notify` say.
    pub record: Option<AuditEvent>,
    /// Write `record` to the audit log.
    pub audit: bool,
    /// Send `record` to the webhook.
    pub notify: bool,
    pub count: Option<Count>,
}

impl Note {
    pub fn new(level: Level, event: &'static str, text: impl Into<String>) -> Self {
        Note {
            level,
            event,
            who: None,
            text: text.into(),
            build_id: None,
            reason: None,
            error: None,
            facts: Vec::new(),
            record: None,
            audit: false,
            notify: false,
            count: None,
        }
    }

    pub fn about(mut self, event: &AuditEvent) -> Self {
        self.who = Some(Who::of(event));
        self
    }

    pub fn build(mut self, build_id: impl Into<String>) -> Self {
        self.build_id = Some(build_id.into());
        self
    }

    pub fn error(mut self, error: impl Into<String>) -> Self {
        self.error = Some(error.into());
        self
    }

    pub fn fact(mut self, key: Fact, value: impl std::fmt::Display) -> Self {
        self.facts.push((key, value.to_string()));
        self
    }

    /// The value of a fact, if the note has it.
    pub fn get(&self, key: Fact) -> Option<&str> {
        self.facts.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str())
    }

    /// The event is written to the audit log.
    pub fn audit(mut self, event: AuditEvent) -> Self {
        self.reason = Some(event.reason);
        self.who = Some(Who::of(&event));
        self.record = Some(event);
        self.audit = true;
        self
    }

    /// The event is written to the audit log and sent to the webhook.
    pub fn announce(self, event: AuditEvent) -> Self {
        let mut n = self.audit(event);
        n.notify = true;
        n
    }

    /// The event is sent to the webhook only (a warning).
    pub fn notify_only(self, event: AuditEvent) -> Self {
        let mut n = self.audit(event);
        (n.audit, n.notify) = (false, true);
        n
    }

    pub fn count(mut self, count: Count) -> Self {
        self.count = Some(count);
        self
    }
}

/// What a pass planned: the calls to make, in order, and what to write now.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    pub calls: Vec<Call>,
    pub notes: Vec<Note>,
}

/// What a pass did, by workspace id: the publish step counts and logs it; tests and the demo
/// read it.
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
    /// Workspaces whose reclaim is Coder's countdown this pass (`countdown_in_coder`): Coder
    /// stops them at their deadline (observe mode: would).
    pub counting_down: Vec<CountingDown>,
    /// Workspaces someone came back to before Coder's countdown ended, this pass.
    pub countdowns_averted: Vec<String>,
    /// Stops not sent because the fresh read found the workspace used or rebuilt since.
    pub not_sent_used: Vec<String>,
    /// The audit log's latest append failed: readiness fails until one works.
    pub audit_failing: bool,
}

/// Per workspace and line, the build for which a once-per-build line was already said.
#[derive(Debug, Default)]
pub(super) struct SaidOnce(std::collections::HashMap<(String, &'static str), String>);

impl SaidOnce {
    /// Whether `what` was already said for this workspace's build; remembers it if not.
    pub(super) fn first_time(&mut self, what: &'static str, workspace_id: &str, build_id: &str) -> bool {
        let key = (workspace_id.to_string(), what);
        if self.0.get(&key).is_some_and(|b| b == build_id) {
            return false;
        }
        self.0.insert(key, build_id.to_string());
        true
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Forgets what is not about `keep(workspace, build)`.
    pub(super) fn retain(&mut self, keep: impl Fn(&str, &str) -> bool) {
        self.0.retain(|(id, _), b| keep(id, b));
    }
}

/// A workspace whose reclaim is Coder's countdown.
#[derive(Debug, Clone, PartialEq)]
pub struct CountingDown {
    pub workspace_id: String,
    /// When Coder stops it (Coder's clock).
    pub until: DateTime<Utc>,
    /// Enforce mode: the deadline is there (moved by the service, or Coder's own, sooner). Observe
    /// mode: where it would be moved.
    pub set: bool,
}

/// The delay before a failed stop's retry after `attempts` attempts: one interval, then doubling,
/// at most `MAX_STOP_BACKOFF` (or the interval, if longer).
pub fn stop_backoff(interval: Duration, attempts: u32) -> Duration {
    let factor = 1i32 << attempts.saturating_sub(1).min(16);
    let cap = MAX_STOP_BACKOFF.max(interval);
    interval.checked_mul(factor).map_or(cap, |d| d.min(cap))
}

/// Whether a job with `tags` needs at least what one with `other` needs (`other` ⊆ `tags`, as
/// coderd's `provisioner_tagset_contains` matches: an untagged set only equals itself).
pub fn needs_at_least(tags: &JobTags, other: &JobTags) -> bool {
    let untagged = other.get("owner").is_some_and(str::is_empty) && other.len() == 2 && other.get("scope").is_some();
    if untagged { tags == other } else { other.iter().all(|(k, v)| tags.get(k) == Some(v)) }
}
