//! Serde models of the Coder API (v2.34.3 `codersdk` shapes), only the fields this service uses:
//! at 10,000 workspaces every field kept is 10,000 allocations, so unused ones are not parsed.
//! Enums are lenient: Coder adds statuses and build reasons over time, and an unknown value must
//! parse as `Unknown`, never fail a whole listing. Optional fields that Coder omits (`ttl_ms`,
//! `autostart_schedule`, agent timestamps) or sends as `null` (`deadline`) are `Option`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

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
    pub owner_id: String,
    #[serde(default)]
    pub template_name: String,
    /// Permissions are per organization (`rbac/roles.go`): an organization admin may stop
    /// workspaces of its own only.
    #[serde(default)]
    pub organization_id: String,
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

/// The `prebuilds` system user (`coderd/database/migrations`): its workspaces are prebuilds,
/// also on servers older than the `is_prebuild` field.
pub const PREBUILDS_USER_ID: &str = "c42fdf75-3097-471c-8c33-fb52454d81c0";

impl Workspace {
    pub fn is_prebuild(&self) -> bool {
        self.is_prebuild || self.owner_id.eq_ignore_ascii_case(PREBUILDS_USER_ID)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct WorkspaceBuild {
    pub id: String,
    /// When the build was asked for (Coder's clock): the session's samples start after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Time>,
    pub transition: Transition,
    pub status: WorkspaceStatus,
    pub job: ProvisionerJob,
    /// Who started the build: this service's user for its own stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initiator_id: Option<String>,
    /// A TTL the template refused is not asked for again until the template version changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_version_id: Option<String>,
    #[serde(default)]
    pub reason: BuildReason,
    #[serde(default)]
    pub resources: Vec<WorkspaceResource>,
    /// `null` means no autostop deadline (manual shutdown).
    #[serde(default)]
    pub deadline: Option<Time>,
}

impl WorkspaceBuild {
    pub fn agents(&self) -> impl Iterator<Item = &WorkspaceAgent> {
        self.resources.iter().flat_map(|r| r.agents.iter())
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct ProvisionerJob {
    pub id: String,
    pub status: JobStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct WorkspaceResource {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<WorkspaceAgent>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct WorkspaceAgent {
    pub id: String,
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
    pub fn is_final(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Canceled)
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

/// `codersdk.UpdateWorkspaceTTLRequest`. `None` (null) disables autostop.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UpdateWorkspaceTtlRequest {
    pub ttl_ms: Option<i64>,
}
