//! Serde models of the Coder API (v2.34.3 `codersdk` shapes), only the fields this service uses:
//! at 10,000 workspaces every field kept is 10,000 allocations, so unused ones are not parsed.
//! Enums are lenient: Coder adds statuses and build reasons over time, and an unknown value must
//! parse as `Unknown`, never fail a whole listing. Optional fields that Coder omits (`ttl_ms`,
//! `autostart_schedule`, agent timestamps) or sends as `null` (`deadline`) are `Option`. The
//! listing is read into them by `read_workspace` (through `json_read`: 1.8-1.9 times as fast as
//! serde on 42 MB a pass, benches/parse.rs), which must stay in step with the derives: a test reads a workspace
//! with every field set both ways, another every captured workspace.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use super::BuildParameter;
pub use super::job_tags::JobTags;
pub use crate::coder_id::CoderId;

use crate::json_read::{ReadError, Reader, malformed};

pub type Time = DateTime<Utc>;

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct WorkspacesResponse {
    pub workspaces: Vec<Workspace>,
    #[serde(default)]
    pub count: i64,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Workspace {
    pub id: String,
    pub name: String,
    pub owner_name: String,
    #[serde(default)]
    pub owner_id: CoderId,
    #[serde(default)]
    pub template_name: String,
    /// Its template's id: the template's schedule (activity bump, autostop reminder) is read by it.
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub template_id: CoderId,
    /// Permissions are per organization (`rbac/roles.go`): an organization admin may stop
    /// workspaces of its own only.
    #[serde(default)]
    pub organization_id: CoderId,
    #[serde(default)]
    pub organization_name: String,
    pub created_at: Time,
    pub last_used_at: Time,
    pub latest_build: WorkspaceBuild,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autostart_schedule: Option<String>,
    /// A prebuilt workspace (owned by the `prebuilds` system user until claimed).
    #[serde(default)]
    pub is_prebuild: bool,
    /// The Coder Task this workspace backs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
}

/// A template's autostop schedule, the fields of `GET /api/v2/templates/{id}` this service reads
/// (`codersdk.Template`). `None`: the field is absent (a server that does not have it).
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct TemplateSchedule {
    /// How far a connection moves the deadline (0: not at all; coderd's default is 1 h,
    /// `coderd/templates.go`; reference coder NOTES §18).
    #[serde(default)]
    pub activity_bump_ms: Option<i64>,
    /// How long before the deadline Coder reminds the owner that it will stop ("will stop soon",
    /// main only; 0 or absent: off).
    #[serde(default)]
    pub time_til_autostop_notify_ms: Option<i64>,
}

impl TemplateSchedule {
    /// Whether a connection moves the deadline (unknown counts as yes: Coder's default).
    pub fn bumps(&self) -> bool {
        self.activity_bump_ms.is_none_or(|b| b > 0)
    }

    /// How long before the deadline the reminder is sent (zero when off or unknown).
    pub fn reminder_lead(&self) -> chrono::Duration {
        chrono::Duration::milliseconds(self.time_til_autostop_notify_ms.unwrap_or(0).max(0))
    }
}

/// The `prebuilds` system user (`coderd/database/migrations`): its workspaces are prebuilds,
/// also on servers older than the `is_prebuild` field.
pub const PREBUILDS_USER_ID: &str = "c42fdf75-3097-471c-8c33-fb52454d81c0";

impl Workspace {
    pub fn is_prebuild(&self) -> bool {
        self.is_prebuild || self.owner_id.eq_ignore_ascii_case(PREBUILDS_USER_ID)
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct WorkspaceBuild {
    pub id: CoderId,
    /// When the build was asked for (Coder's clock): the session's samples start after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Time>,
    pub transition: Transition,
    pub status: WorkspaceStatus,
    pub job: ProvisionerJob,
    /// Who started the build: this service's user for its own stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initiator_id: Option<CoderId>,
    /// A TTL the template refused is not asked for again until the template version changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_version_id: Option<CoderId>,
    #[serde(default)]
    pub reason: BuildReason,
    #[serde(default)]
    pub resources: Vec<WorkspaceResource>,
    /// `null` means no autostop deadline (manual shutdown).
    #[serde(default)]
    pub deadline: Option<Time>,
    /// The latest `deadline` may move to (the template's autostop requirement, Premium); `null`
    /// on AGPL. `PUT .../extend` refuses a deadline after it (reference NOTES §16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_deadline: Option<Time>,
    /// Provisioner daemons matching the job's tags; filled by Coder only while the job is
    /// pending (`{0, 0}` otherwise), `available` counted from the job's creation (NOTES §16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_provisioners: Option<MatchedProvisioners>,
}

/// `codersdk.MatchedProvisioners`.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq)]
pub struct MatchedProvisioners {
    #[serde(default)]
    pub count: i64,
    #[serde(default)]
    pub available: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub most_recently_seen: Option<Time>,
}

/// `codersdk.ProvisionerDaemon`, the fields this service reads.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct ProvisionerDaemon {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_at: Option<Time>,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub tags: std::collections::BTreeMap<String, String>,
}

impl WorkspaceBuild {
    pub fn agents(&self) -> impl Iterator<Item = &WorkspaceAgent> {
        self.resources.iter().flat_map(|r| r.agents.iter())
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct ProvisionerJob {
    pub id: CoderId,
    pub status: JobStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Set when someone canceled the job. coderd's `job_status` tests `error` first, so a job
    /// canceled while running that then fails (the provisioner's "Cancel timed out") reads
    /// `failed` with this set (reference coder NOTES §16): it was still a person's cancel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canceled_at: Option<Time>,
    /// The provisioner tags the job needs (a daemon whose tags contain them takes it; a stop
    /// has its start's, reference coder NOTES §16).
    #[serde(default, skip_serializing_if = "JobTags::is_empty")]
    pub tags: JobTags,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct WorkspaceResource {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<WorkspaceAgent>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct WorkspaceAgent {
    pub id: CoderId,
    pub status: AgentStatus,
    /// When the build created the agent: a start-up (image pull, container start) is timed from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Time>,
    /// `coder_agent.connection_timeout` (0: none).
    #[serde(default)]
    pub connection_timeout_seconds: i64,
    #[serde(default)]
    pub lifecycle_state: AgentLifecycle,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_connected_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_connected_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disconnected_at: Option<Time>,
}

macro_rules! lenient_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
        pub enum $name {
            $(#[serde(rename = $text)] $variant,)+
            /// A value this version does not know (Coder added it later).
            #[default]
            #[serde(other, rename = "unknown")]
            Unknown,
        }
        impl $name {
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text,)+ Self::Unknown => "unknown" }
            }
            /// As serde reads it: a value this version does not know is `Unknown`.
            pub fn from_text(text: &str) -> Self {
                match text { $($text => Self::$variant,)+ _ => Self::Unknown }
            }
        }
    };
}

lenient_enum!(Transition { Start = "start", Stop = "stop", Delete = "delete" });
lenient_enum!(
    /// `codersdk.WorkspaceStatus`, derived by Coder from job status + transition.
    WorkspaceStatus {
        Pending = "pending", Starting = "starting", Running = "running", Stopping = "stopping",
        Stopped = "stopped", Failed = "failed", Canceling = "canceling", Canceled = "canceled",
        Deleting = "deleting", Deleted = "deleted",
    }
);
lenient_enum!(JobStatus {
    Pending = "pending", Running = "running", Succeeded = "succeeded", Canceling = "canceling",
    Canceled = "canceled", Failed = "failed",
});
lenient_enum!(AgentStatus { Connecting = "connecting", Connected = "connected", Disconnected = "disconnected", Timeout = "timeout" });
lenient_enum!(AgentLifecycle {
    Created = "created", Starting = "starting", StartTimeout = "start_timeout", StartError = "start_error",
    Ready = "ready", ShuttingDown = "shutting_down", ShutdownTimeout = "shutdown_timeout",
    ShutdownError = "shutdown_error", Off = "off",
});
lenient_enum!(
    /// The API returns values the swagger enum omits (`failedstop`, `autodelete`, task reasons).
    BuildReason {
        Initiator = "initiator", Autostart = "autostart", Autostop = "autostop", Dormancy = "dormancy",
        Dashboard = "dashboard", Cli = "cli", SshConnection = "ssh_connection",
        VscodeConnection = "vscode_connection", JetbrainsConnection = "jetbrains_connection",
        FailedStop = "failedstop", AutoDelete = "autodelete",
    }
);

impl JobStatus {
    /// Coder's `Active()`: a build in this state blocks new builds (409).
    pub fn is_active(self) -> bool {
        matches!(self, JobStatus::Pending | JobStatus::Running | JobStatus::Canceling)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct User {
    pub id: String,
    pub username: String,
    #[serde(default)]
    pub roles: Vec<SlimRole>,
    #[serde(default)]
    pub status: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct SlimRole {
    pub name: String,
    #[serde(default)]
    pub display_name: String,
}

/// `codersdk.APIKey`: only the expiry matters here.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct ApiKey {
    pub id: String,
    pub expires_at: Time,
    #[serde(default)]
    pub token_name: String,
    #[serde(default)]
    pub login_type: String,
    #[serde(default)]
    pub lifetime_seconds: i64,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct BuildInfo {
    pub version: String,
    #[serde(default)]
    pub external_url: String,
}

/// `codersdk.Response`: the body of every Coder error.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct CoderResponse {
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validations: Vec<ValidationError>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct ValidationError {
    pub field: String,
    pub detail: String,
}

/// `codersdk.CreateWorkspaceBuildRequest`, as this service sends it: a stop, nothing else.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CreateWorkspaceBuildRequest {
    pub transition: Transition,
}

/// `codersdk.AuthorizationRequest`: named permission checks.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AuthorizationRequest {
    pub checks: std::collections::BTreeMap<String, AuthorizationCheck>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AuthorizationCheck {
    pub object: AuthorizationObject,
    /// An RBAC action (`codersdk.RBACAction`: `read`, `stop`, ...).
    pub action: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AuthorizationObject {
    pub resource_type: String,
    /// "In some organization": never set together with `organization_id` (the spec forbids it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub any_org: Option<bool>,
    /// The answer for this organization only (an organization admin's rights end at its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub organization_id: Option<String>,
}

/// `codersdk.PutExtendWorkspaceRequest`: the current start build's new autostop deadline.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PutExtendWorkspaceRequest {
    pub deadline: Time,
}

/// `codersdk.UpdateWorkspaceTTLRequest`. `None` (null) disables autostop.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UpdateWorkspaceTtlRequest {
    pub ttl_ms: Option<i64>,
}

/// Reads one listed workspace as `serde_json::from_slice::<Workspace>` would (the same
/// defaults, the same errors for the members it reads: missing, duplicate or mistyped), taking
/// only the members the models hold and skipping the rest undecoded (`json_read`). Tested
/// against serde's parse of every model field and of the captured listings. "As serde" holds for
/// JSON shaped as Coder writes it: serde also takes a struct written as an array, and refuses a
/// malformed member no model holds, which this skips unchecked.
pub fn read_workspace(r: &mut Reader<'_>) -> Result<Workspace, ReadError> {
    let (mut id, mut name, mut owner_name, mut owner_id, mut template_name, mut template_id) = (None, None, None, None, None, None);
    let (mut organization_id, mut organization_name, mut created_at, mut last_used_at) = (None, None, None, None);
    let (mut latest_build, mut ttl_ms, mut autostart_schedule, mut is_prebuild, mut task_id) = (None, None, None, None, None);
    r.object(|r, key| match key {
        b"id" => set(&mut id, key, text(r)?),
        b"name" => set(&mut name, key, text(r)?),
        b"owner_name" => set(&mut owner_name, key, text(r)?),
        b"owner_id" => set(&mut owner_id, key, coder_id(r)?),
        b"template_name" => set(&mut template_name, key, text(r)?),
        b"template_id" => set(&mut template_id, key, coder_id(r)?),
        b"organization_id" => set(&mut organization_id, key, coder_id(r)?),
        b"organization_name" => set(&mut organization_name, key, text(r)?),
        b"created_at" => set(&mut created_at, key, time(r)?),
        b"last_used_at" => set(&mut last_used_at, key, time(r)?),
        b"latest_build" => set(&mut latest_build, key, read_build(r)?),
        b"ttl_ms" => set(&mut ttl_ms, key, optional(r, |r| r.i64())?),
        b"autostart_schedule" => set(&mut autostart_schedule, key, optional(r, text)?),
        b"is_prebuild" => set(&mut is_prebuild, key, r.bool()?),
        b"task_id" => set(&mut task_id, key, optional(r, text)?),
        _ => r.skip(),
    })?;
    Ok(Workspace {
        id: required(id, "id")?,
        name: required(name, "name")?,
        owner_name: required(owner_name, "owner_name")?,
        owner_id: owner_id.unwrap_or_default(),
        template_name: template_name.unwrap_or_default(),
        template_id: template_id.unwrap_or_default(),
        organization_id: organization_id.unwrap_or_default(),
        organization_name: organization_name.unwrap_or_default(),
        created_at: required(created_at, "created_at")?,
        last_used_at: required(last_used_at, "last_used_at")?,
        latest_build: required(latest_build, "latest_build")?,
        ttl_ms: ttl_ms.flatten(),
        autostart_schedule: autostart_schedule.flatten(),
        is_prebuild: is_prebuild.unwrap_or_default(),
        task_id: task_id.flatten(),
    })
}

fn read_build(r: &mut Reader<'_>) -> Result<WorkspaceBuild, ReadError> {
    let (mut id, mut created_at, mut transition, mut status, mut job) = (None, None, None, None, None);
    let (mut initiator_id, mut template_version_id, mut reason, mut resources, mut deadline) = (None, None, None, None, None);
    let (mut max_deadline, mut matched_provisioners) = (None, None);
    r.object(|r, key| match key {
        b"id" => set(&mut id, key, coder_id(r)?),
        b"created_at" => set(&mut created_at, key, optional(r, time)?),
        b"transition" => set(&mut transition, key, Transition::from_text(&r.string()?)),
        b"status" => set(&mut status, key, WorkspaceStatus::from_text(&r.string()?)),
        b"job" => set(&mut job, key, read_job(r)?),
        b"initiator_id" => set(&mut initiator_id, key, optional(r, coder_id)?),
        b"template_version_id" => set(&mut template_version_id, key, optional(r, coder_id)?),
        b"reason" => set(&mut reason, key, BuildReason::from_text(&r.string()?)),
        b"resources" => set(&mut resources, key, list(r, read_resource)?),
        b"deadline" => set(&mut deadline, key, optional(r, time)?),
        b"max_deadline" => set(&mut max_deadline, key, optional(r, time)?),
        b"matched_provisioners" => set(&mut matched_provisioners, key, optional(r, read_matched)?),
        _ => r.skip(),
    })?;
    Ok(WorkspaceBuild {
        id: required(id, "id")?,
        created_at: created_at.flatten(),
        transition: required(transition, "transition")?,
        status: required(status, "status")?,
        job: required(job, "job")?,
        initiator_id: initiator_id.flatten(),
        template_version_id: template_version_id.flatten(),
        reason: reason.unwrap_or_default(),
        resources: resources.unwrap_or_default(),
        deadline: deadline.flatten(),
        max_deadline: max_deadline.flatten(),
        matched_provisioners: matched_provisioners.flatten(),
    })
}

fn read_matched(r: &mut Reader<'_>) -> Result<MatchedProvisioners, ReadError> {
    let (mut count, mut available, mut most_recently_seen) = (None, None, None);
    r.object(|r, key| match key {
        b"count" => set(&mut count, key, r.i64()?),
        b"available" => set(&mut available, key, r.i64()?),
        b"most_recently_seen" => set(&mut most_recently_seen, key, optional(r, time)?),
        _ => r.skip(),
    })?;
    Ok(MatchedProvisioners {
        count: count.unwrap_or_default(),
        available: available.unwrap_or_default(),
        most_recently_seen: most_recently_seen.flatten(),
    })
}

/// A string map as serde reads one (a repeated key: the last value wins).
fn read_tags(r: &mut Reader<'_>) -> Result<JobTags, ReadError> {
    let mut pairs = Vec::new();
    r.object(|r, key| {
        pairs.push((String::from_utf8_lossy(key).into_owned(), text(r)?));
        Ok(())
    })?;
    Ok(JobTags::from_pairs(pairs))
}

fn read_job(r: &mut Reader<'_>) -> Result<ProvisionerJob, ReadError> {
    let (mut id, mut status, mut completed_at, mut error, mut canceled_at) = (None, None, None, None, None);
    let mut tags = None;
    r.object(|r, key| match key {
        b"id" => set(&mut id, key, coder_id(r)?),
        b"status" => set(&mut status, key, JobStatus::from_text(&r.string()?)),
        b"completed_at" => set(&mut completed_at, key, optional(r, time)?),
        b"error" => set(&mut error, key, optional(r, text)?),
        b"canceled_at" => set(&mut canceled_at, key, optional(r, time)?),
        b"tags" => set(&mut tags, key, read_tags(r)?),
        _ => r.skip(),
    })?;
    Ok(ProvisionerJob {
        id: required(id, "id")?,
        status: required(status, "status")?,
        completed_at: completed_at.flatten(),
        error: error.flatten(),
        canceled_at: canceled_at.flatten(),
        tags: tags.unwrap_or_default(),
    })
}

fn read_resource(r: &mut Reader<'_>) -> Result<WorkspaceResource, ReadError> {
    let mut agents = None;
    r.object(|r, key| match key {
        b"agents" => set(&mut agents, key, list(r, read_agent)?),
        _ => r.skip(),
    })?;
    Ok(WorkspaceResource { agents: agents.unwrap_or_default() })
}

fn read_agent(r: &mut Reader<'_>) -> Result<WorkspaceAgent, ReadError> {
    let (mut id, mut status, mut created_at, mut connection_timeout_seconds) = (None, None, None, None);
    let (mut lifecycle_state, mut first_connected_at, mut last_connected_at, mut disconnected_at) = (None, None, None, None);
    r.object(|r, key| match key {
        b"id" => set(&mut id, key, coder_id(r)?),
        b"status" => set(&mut status, key, AgentStatus::from_text(&r.string()?)),
        b"created_at" => set(&mut created_at, key, optional(r, time)?),
        b"connection_timeout_seconds" => set(&mut connection_timeout_seconds, key, r.i64()?),
        b"lifecycle_state" => set(&mut lifecycle_state, key, AgentLifecycle::from_text(&r.string()?)),
        b"first_connected_at" => set(&mut first_connected_at, key, optional(r, time)?),
        b"last_connected_at" => set(&mut last_connected_at, key, optional(r, time)?),
        b"disconnected_at" => set(&mut disconnected_at, key, optional(r, time)?),
        _ => r.skip(),
    })?;
    Ok(WorkspaceAgent {
        id: required(id, "id")?,
        status: required(status, "status")?,
        created_at: created_at.flatten(),
        connection_timeout_seconds: connection_timeout_seconds.unwrap_or_default(),
        lifecycle_state: lifecycle_state.unwrap_or_default(),
        first_connected_at: first_connected_at.flatten(),
        last_connected_at: last_connected_at.flatten(),
        disconnected_at: disconnected_at.flatten(),
    })
}

/// A member read once: serde refuses a duplicate field.
fn set<T>(slot: &mut Option<T>, key: &[u8], value: T) -> Result<(), ReadError> {
    if slot.is_some() {
        return malformed(format!("duplicate field `{}`", String::from_utf8_lossy(key)));
    }
    *slot = Some(value);
    Ok(())
}

fn required<T>(slot: Option<T>, key: &str) -> Result<T, ReadError> {
    slot.map_or_else(|| malformed(format!("missing field `{key}`")), Ok)
}

fn text(r: &mut Reader<'_>) -> Result<String, ReadError> {
    r.string().map(|s| s.into_owned())
}

/// An id, held inline (`CoderId`): no allocation where the text has no escapes.
fn coder_id(r: &mut Reader<'_>) -> Result<CoderId, ReadError> {
    r.string().map(|s| CoderId::new(&s))
}

/// A time as chrono's serde support reads one (`DateTime<Utc>::from_str`); Go's RFC 3339 in
/// UTC (`2026-11-29T16:01:27.841201Z`, what Coder sends) is read directly, ten per workspace.
fn time(r: &mut Reader<'_>) -> Result<Time, ReadError> {
    let text = r.string()?;
    if let Some(t) = utc_rfc3339(&text) {
        return Ok(t);
    }
    text.parse().map_or_else(|e| malformed(format!("{text:?}: {e}")), Ok)
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z` with a valid date and time (no leap second), else `None`
/// (then chrono reads it, or says why not).
fn utc_rfc3339(text: &str) -> Option<Time> {
    let b = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<u32> {
        b.get(range)?.iter().try_fold(0u32, |n, &d| d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0')))
    };
    let shape = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if b.len() < 20 || b.last() != Some(&b'Z') || shape.iter().any(|&(i, c)| b.get(i) != Some(&c)) {
        return None;
    }
    let nanos = match b.get(19..b.len() - 1)? {
        [] => 0,
        [b'.', fraction @ ..] if (1..=9).contains(&fraction.len()) && fraction.iter().all(u8::is_ascii_digit) => {
            fraction.iter().fold(0u32, |n, &d| n * 10 + u32::from(d - b'0')) * 10u32.pow(9 - fraction.len() as u32)
        }
        _ => return None,
    };
    let date = chrono::NaiveDate::from_ymd_opt(i32::try_from(digits(0..4)?).ok()?, digits(5..7)?, digits(8..10)?)?;
    let time = chrono::NaiveTime::from_hms_nano_opt(digits(11..13)?, digits(14..16)?, digits(17..19)?, nanos)?;
    Some(date.and_time(time).and_utc())
}

fn optional<T>(r: &mut Reader<'_>, read: impl FnOnce(&mut Reader<'_>) -> Result<T, ReadError>) -> Result<Option<T>, ReadError> {
    if r.null()? { Ok(None) } else { read(r).map(Some) }
}

fn list<T>(r: &mut Reader<'_>, read: impl Fn(&mut Reader<'_>) -> Result<T, ReadError>) -> Result<Vec<T>, ReadError> {
    let mut out = Vec::new();
    r.array(|r| read(r).map(|item| out.push(item)))?;
    // Most lists hold one or two (a workspace's resources and agents): without this, each held
    // room for four, 3.5 MB of the listing's memory at 10,000 workspaces.
    out.shrink_to_fit();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed_both_ways(text: &str) -> (Workspace, Workspace) {
        let full: Workspace = serde_json::from_str(text).unwrap();
        let mut r = Reader::new(text.as_bytes(), true);
        let read = read_workspace(&mut r).unwrap();
        r.end().unwrap();
        (full, read)
    }

    #[test]
    fn the_reader_reads_every_field_the_models_have_as_serde_does() {
        // Every field set, none to its default: a field the reader misses reads as its
        // default (or fails), and the two parses differ.
        let t = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap();
        let agent = WorkspaceAgent {
            id: "agent".into(),
            status: AgentStatus::Disconnected,
            created_at: Some(t(1)),
            connection_timeout_seconds: 120,
            lifecycle_state: AgentLifecycle::Ready,
            first_connected_at: Some(t(2)),
            last_connected_at: Some(t(3)),
            disconnected_at: Some(t(4)),
        };
        let ws = Workspace {
            id: "ws".into(),
            name: "name".into(),
            owner_name: "owner".into(),
            owner_id: "owner-id".into(),
            template_name: "tpl".into(),
            template_id: "tpl-id".into(),
            organization_id: "org".into(),
            organization_name: "org-name".into(),
            created_at: t(5),
            last_used_at: t(6),
            latest_build: WorkspaceBuild {
                id: "build".into(),
                created_at: Some(t(7)),
                transition: Transition::Stop,
                status: WorkspaceStatus::Failed,
                job: ProvisionerJob {
                    id: "job".into(),
                    status: JobStatus::Failed,
                    completed_at: Some(t(8)),
                    error: Some("boom".into()),
                    canceled_at: Some(t(11)),
                    tags: JobTags::from_pairs([("scope", "organization"), ("gpu", "true"), ("odd:key", "3:x")]),
                },
                initiator_id: Some("initiator".into()),
                template_version_id: Some("version".into()),
                reason: BuildReason::Autostop,
                resources: vec![WorkspaceResource::default(), WorkspaceResource { agents: vec![agent] }],
                deadline: Some(t(9)),
                max_deadline: Some(t(10)),
                matched_provisioners: Some(MatchedProvisioners { count: 2, available: 1, most_recently_seen: Some(t(12)) }),
            },
            ttl_ms: Some(3_600_000),
            autostart_schedule: Some("CRON_TZ=UTC 0 9 * * 1-5".into()),
            is_prebuild: true,
            task_id: Some("task".into()),
        };
        let mut value = serde_json::to_value(&ws).unwrap();
        // Members no model reads, at every level, are dropped without changing the result.
        value["template_icon"] = serde_json::json!({"big": ["nested", {"x": "}]\""}]});
        value["latest_build"]["workspace_owner_avatar_url"] = serde_json::json!({"count": 1, "x": ["}"]});
        value["latest_build"]["resources"][1]["agents"][0]["apps"] = serde_json::json!([{"url": "http://x"}]);
        let text = serde_json::to_string_pretty(&value).unwrap();
        let (full, pruned) = parsed_both_ways(&text);
        assert_eq!(full, ws);
        assert_eq!(pruned, ws);
    }

    #[test]
    fn job_tags_keep_every_pair_whatever_it_holds() {
        let tags = JobTags::from_pairs([("scope", "organization"), ("owner", ""), ("a:1", "2:b"), ("ünï", "cödé"), ("scope", "user")]);
        let pairs: Vec<(&str, &str)> = tags.iter().collect();
        assert_eq!(pairs, [("a:1", "2:b"), ("owner", ""), ("scope", "user"), ("ünï", "cödé")], "sorted; the last value of a key wins");
        assert_eq!((tags.len(), tags.get("owner"), tags.get("none")), (4, Some(""), None));
        assert_eq!(tags.to_string(), "{a:1=2:b, owner=, scope=user, ünï=cödé}");
        let json = serde_json::to_value(&tags).unwrap();
        assert_eq!(json, serde_json::json!({"a:1": "2:b", "owner": "", "scope": "user", "ünï": "cödé"}));
        assert_eq!(serde_json::from_value::<JobTags>(json).unwrap(), tags);
        assert!(JobTags::default().is_empty() && JobTags::default().iter().next().is_none());
    }

    #[test]
    fn coder_times_are_read_as_chrono_reads_them() {
        for text in [
            "2026-11-29T16:01:27.841201Z",
            "2026-11-29T16:01:27Z",
            "2026-11-29T16:01:27.1Z",
            "2026-11-29T16:01:27.123456789Z",
            "2024-02-29T23:59:59.999Z",
            "0001-01-01T00:00:00Z",
        ] {
            let chrono: Time = text.parse().unwrap();
            assert_eq!(utc_rfc3339(text), Some(chrono), "{text}");
        }
        // Anything else is left to chrono: offsets, a leap second, lower case, out of range.
        for text in [
            "2026-11-29T16:01:27+02:00",
            "2026-11-29T23:59:60Z",
            "2026-11-29t16:01:27Z",
            "2026-11-29 16:01:27Z",
            "2023-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-11-29T24:00:00Z",
            "2026-11-29T16:01:27.Z",
            "2026-11-29T16:01:27.1234567890Z",
            "2026-11-29T16:01:2xZ",
            "",
        ] {
            assert_eq!(utc_rfc3339(text), None, "{text}");
            let via_reader = time(&mut Reader::new(format!("{text:?}").as_bytes(), true)).ok();
            assert_eq!(via_reader, text.parse::<Time>().ok(), "{text}: as chrono reads it");
        }
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // a test reads the service crate's captured fixtures
    fn every_captured_workspace_reads_as_serde_parses_it() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/coder");
        let mut seen = 0;
        let mut files = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
            // A listing, or one workspace (the unknown-enums capture).
            let listed = value["workspaces"].as_array().cloned().unwrap_or_default();
            let one = value.get("latest_build").map(|_| value.clone());
            files += usize::from(!listed.is_empty() || one.is_some());
            for ws in listed.iter().chain(one.as_ref()) {
                let (full, pruned) = parsed_both_ways(&ws.to_string());
                assert_eq!(full, pruned);
                seen += 1;
            }
        }
        assert!(seen >= 3 && files >= 2, "the captured workspaces: {seen} in {files} files");
    }
}
