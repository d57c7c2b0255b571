//! The fake world both fakes share: users and tokens, a template, workspaces and their builds,
//! pods and a pool of GPUs, connections and `last_used_at`, GPU loads, and an event log.
//! Behaviour follows Coder v2.34.3 as recorded in `reference/coder/NOTES.md`:
//! builds go pending -> running -> succeeded; a start build succeeds even when its pod cannot
//! get a GPU (the official template has `wait_for_rollout = false`), and its agent then stays
//! `connecting`, later `timeout`; `last_used_at` is refreshed about every 60 s while a
//! connection is open and written in 60 s batches; a build while another is active is a 409.
//! coderd's job reaper fails a job pending 30 minutes or hung 5 (`coderd/jobreaper/detector.go`);
//! a build can be canceled; permissions are per organization (`rbac/roles.go`): an organization
//! admin acts on its own organization's workspaces, a template admin only reads them. Coder's
//! lifecycle executor stops a workspace whose deadline passed (reason `autostop`), a connection
//! bumps the deadline, and `PUT .../extend` checks what `putExtendWorkspace` checks. The facts
//! are in `reference/coder/NOTES.md` sections 7 and 14-16.
//! Timestamps are real wall-clock times; Coder's own durations are divided by `scale`, so a
//! 30-minute story plays in 30 s at scale 60.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A GPU load from the seed's stage-2 table (A10G, 80 SMs, DCGM 4.7.1), plus stage 1's phantom
/// and the shapes of reference dcgm NOTES §9-10 (light kernel, video, copy-only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Nothing running: 0%, 0 MiB, 24.3 W.
    Idle,
    /// A process holds memory and waits: 0%, 19,376 MiB, 89.1 W.
    MemoryOnly,
    /// A one-thread kernel in a loop: 100%, 302 MiB, 90.0 W, GR 1.000, SM 0.012.
    OneThread,
    /// A one-block kernel busy a tenth of the time: GR ≈ d = 0.1, SM ≈ d / 80 SMs = 0.00125
    /// (NOTES §10: the one-thread kernel's shape at a lower duty cycle).
    LightKernel,
    /// A large matmul in a loop: 100%, 850 MiB, 299.2 W, GR 1.000, SM 0.984.
    Matmul,
    /// Stage 1's phantom: utilization 100% on an empty framebuffer.
    Phantom,
    /// Video transcoding (NVDEC + NVENC): the video engines are busy, the compute engines are not.
    Encode,
    /// Copies only (memcpy, peer-to-peer): device memory busy, no kernel (NOTES §10).
    CopyOnly,
    /// Computes in short bursts (a notebook cell, a cron job): a matmul for `busy` out of every
    /// `period` (real time), idle with its memory held otherwise.
    Bursty { period: Duration, busy: Duration },
}

/// What dcgm-exporter would report for a load (utilization and video engines in %, memory in
/// MiB, power in W, profiling fields as ratios).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub util_percent: f64,
    pub fb_used_mib: f64,
    pub power_watts: f64,
    pub gr_engine_active: f64,
    pub sm_active: f64,
    pub tensor_active: f64,
    pub dram_active: f64,
    pub enc_percent: f64,
    pub dec_percent: f64,
}

impl Reading {
    /// What the whole device reads while two pods time-slice it: their work and memory add up
    /// (each engine saturating), the board draws what the busier draws.
    pub fn together(&self, other: &Reading) -> Reading {
        let ratio = |a: f64, b: f64| (a + b).min(1.0);
        let percent = |a: f64, b: f64| (a + b).min(100.0);
        Reading {
            util_percent: percent(self.util_percent, other.util_percent),
            fb_used_mib: self.fb_used_mib + other.fb_used_mib,
            power_watts: self.power_watts.max(other.power_watts),
            gr_engine_active: ratio(self.gr_engine_active, other.gr_engine_active),
            sm_active: ratio(self.sm_active, other.sm_active),
            tensor_active: ratio(self.tensor_active, other.tensor_active),
            dram_active: ratio(self.dram_active, other.dram_active),
            enc_percent: percent(self.enc_percent, other.enc_percent),
            dec_percent: percent(self.dec_percent, other.dec_percent),
        }
    }
}

impl Load {
    /// A kernel of one block (a one-thread kernel, a light periodic one): it keeps one SM busy,
    /// so its SM_ACTIVE is its duty over the GPU's SM count (reference dcgm NOTES §10).
    pub fn is_one_block(self) -> bool {
        matches!(self, Load::OneThread | Load::LightKernel)
    }

    /// The reading now (a bursty load depends on the time).
    pub fn reading(self) -> Reading {
        let millis = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        self.reading_at(millis)
    }

    /// The reading at `millis` (real time since the epoch).
    pub fn reading_at(self, millis: u128) -> Reading {
        let r = |util_percent, fb_used_mib, power_watts, gr_engine_active, sm_active| Reading {
            util_percent,
            fb_used_mib,
            power_watts,
            gr_engine_active,
            sm_active,
            tensor_active: 0.0,
            dram_active: 0.0,
            enc_percent: 0.0,
            dec_percent: 0.0,
        };
        match self {
            Load::Idle => r(0.0, 0.0, 24.3, 0.0, 0.0),
            Load::MemoryOnly => r(0.0, 19376.0, 89.1, 0.0, 0.0),
            Load::OneThread => r(100.0, 302.0, 90.0, 1.0, 0.012),
            Load::LightKernel => r(10.0, 302.0, 41.0, 0.1, 0.00125),
            Load::Matmul => Reading { tensor_active: 0.412, dram_active: 0.533, ..r(100.0, 850.0, 299.2, 1.0, 0.984) },
            Load::Phantom => r(100.0, 0.0, 24.3, 1.0, 0.0),
            Load::Encode => Reading { enc_percent: 61.0, dec_percent: 35.0, ..r(0.0, 412.0, 71.5, 0.0, 0.0) },
            Load::CopyOnly => Reading { dram_active: 0.62, ..r(0.0, 8192.0, 112.0, 0.0, 0.0) },
            Load::Bursty { period, busy } => {
                let phase = millis % period.as_millis().max(1);
                if phase < busy.as_millis() { Load::Matmul.reading_at(millis) } else { Load::MemoryOnly.reading_at(millis) }
            }
        }
    }
}

/// Whether the workspace's agent reports stats, which carry its connections (and so move
/// `last_used_at` and the deadline): only while its build is the latest, a start. While a stop is
/// pending or running the old agent may still authenticate (for shutdown scripts), but coderd
/// closes its dRPC connection every 15 s once its build is not the latest (`checkBuildIsLatest`,
/// `coderd/workspaceagentsrpc.go`) and `coder ssh` refuses such a workspace (`cli/ssh.go`); once
/// that stop is canceled, failed or reaped the agent cannot authenticate at all
/// (`GetAuthenticatedWorkspaceAgentAndBuildByAuthToken`). Reference coder NOTES §16, §18.
fn agent_reports_stats(ws: &Workspace) -> bool {
    ws.latest().is_some_and(|b| b.transition == "start")
}

/// Coder's activity bump (`ActivityBumpWorkspace`, NOTES §16) on an agent-stats report with
/// connections: a completed start with a deadline, under 95% of the bump left, moves to at least
/// now plus the bump, never past `max_deadline`, never earlier. Not for prebuilds.
fn activity_bump(ws: &mut Workspace, now: DateTime<Utc>, bump: chrono::Duration) {
    if ws.prebuild || bump <= chrono::Duration::zero() {
        return;
    }
    let Some(b) = ws.builds.last_mut().filter(|b| b.transition == "start" && b.job.status == "succeeded") else { return };
    let Some(deadline) = b.deadline else { return };
    if deadline - bump * 95 / 100 >= now {
        return;
    }
    let bumped = deadline.max(now + bump);
    b.deadline = Some(b.max_deadline.map_or(bumped, |max| bumped.min(max)));
}

/// Which waiting pod gets a freed GPU. The seed saw either; Kubernetes does not promise one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    OldestFirst,
    Random,
}

#[derive(Debug, Clone)]
pub struct WorldConfig {
    pub gpus: usize,
    /// Coder seconds per real second.
    pub scale: f64,
    /// Coder time a build job waits in the queue, then runs.
    pub build_queue: Duration,
    pub build_run: Duration,
    /// Coder time from a pod getting its GPU to the agent connecting.
    pub agent_connect: Duration,
    /// `coder_agent.connection_timeout` (default 120 s).
    pub connection_timeout_seconds: i64,
    pub assignment: Assignment,
    /// Requests per user and path per Coder minute before 429 (Coder's default is 512).
    pub rate_limit_per_minute: usize,
    pub gpu_model: String,
    /// Lifetime of the owner's token (owner tokens last at most 7 days by default).
    pub owner_token_lifetime: chrono::Duration,
    /// Seed of the random GPU assignment (deterministic per seed).
    pub seed: u64,
    /// Coder's clock minus the real one: every timestamp Coder writes, and its `Date` header,
    /// use coderd's own clock (`reference/coder/NOTES.md` section 14, "Time").
    pub clock_offset: chrono::Duration,
    /// coderd's job reaper (`coderd/jobreaper/detector.go`): a job pending this long
    /// (`PendingJobDuration`, 30 min) or running this long without an update (`HungJobDuration`,
    /// 5 min; this world's jobs send no updates while running) is marked failed. Coder time.
    pub reaper_pending: Duration,
    pub reaper_hung: Duration,
    /// The template's `allow_user_cancel_workspace_jobs` (false by default, `coderd/templates.go`):
    /// without it only site owners may cancel a build; the handler lets `expect_status=pending`
    /// through (`verifyUserCanCancelWorkspaceBuilds`) and dbauthz then answers 500 (NOTES §16, §18).
    pub allow_user_cancel: bool,
    /// The template lets users set their own autostop TTL (`UserAutostopEnabled`); when not,
    /// `PUT .../ttl` answers 400 (`coderd/workspaces.go` `putWorkspaceTTL`).
    pub allow_user_autostop: bool,
    /// The template's autostop requirement (Premium): a start build's `max_deadline` is its
    /// completion plus this, and neither its deadline, an activity bump nor `PUT .../extend`
    /// goes past it. `None`: AGPL (`max_deadline: null`). Wall-clock time, like `ttl_ms`.
    pub max_deadline_after: Option<Duration>,
    /// The template's `activity_bump` (default 1 h, `coderd/templates.go`): a connection moves the
    /// deadline to at least now plus this. Wall-clock time, like `ttl_ms`; zero turns it off.
    pub activity_bump: Duration,
    /// The template's `time_til_autostop_notify_ms` (main only): `None` on a Coder without the
    /// autostop reminder (the field is absent).
    pub autostop_notify: Option<Duration>,
    /// A reverse proxy in front of coderd writes the `Date` header from its own clock, off the
    /// real one by this (nginx does not pass the upstream's `Date`: `ngx_http_proxy_module`,
    /// `proxy_pass_header`); `None`: no proxy, coderd's own `Date`.
    pub proxy_clock_offset: Option<chrono::Duration>,
    /// A first start's pod waits this long (Coder time) for its volume before it can be
    /// scheduled: the official Kubernetes template creates the home PVC with
    /// `wait_until_bound = false`, and a `WaitForFirstConsumer` storage class provisions the
    /// volume only once the pod is scheduled (5-60 s). The start build has succeeded by then
    /// (`wait_for_rollout = false`), its agent `connecting`. Zero: bound at once.
    pub volume_bind: Duration,
}

impl Default for WorldConfig {
    fn default() -> Self {
        WorldConfig {
            gpus: 1,
            scale: 1.0,
            build_queue: Duration::from_secs(2),
            build_run: Duration::from_secs(8),
            agent_connect: Duration::from_secs(5),
            connection_timeout_seconds: 120,
            assignment: Assignment::OldestFirst,
            rate_limit_per_minute: 512,
            gpu_model: "NVIDIA A10G".into(),
            owner_token_lifetime: chrono::Duration::days(7),
            seed: 0x9E37_79B9_7F4A_7C15,
            clock_offset: chrono::Duration::zero(),
            reaper_pending: Duration::from_secs(30 * 60),
            reaper_hung: Duration::from_secs(5 * 60),
            allow_user_autostop: true,
            // coderd's default (`coderd/templates.go`): only site owners may cancel.
            allow_user_cancel: false,
            max_deadline_after: None,
            activity_bump: Duration::from_secs(60 * 60),
            autostop_notify: None,
            proxy_clock_offset: None,
            volume_bind: Duration::ZERO,
        }
    }
}

/// An organization role (`rbac/roles.go`): an admin may do anything to the organization's
/// workspaces; a template admin may read them, not stop them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrgRole {
    Admin,
    TemplateAdmin,
}

/// Coder's constants (usage refresh, batch flush): about every 60 s each.
pub const USAGE_REFRESH: Duration = Duration::from_secs(60);
pub const USAGE_FLUSH: Duration = Duration::from_secs(60);
/// The lifecycle executor's poll (`--autobuild-poll-interval`, default 1 min; NOTES §7, §16).
pub const AUTOBUILD_POLL: Duration = Duration::from_secs(60);
/// After the last connection closes, the seed saw two more refreshes (about 80 s).
pub const TAIL_REFRESHES: u32 = 2;

#[derive(Debug, Clone)]
pub struct User {
    pub id: Uuid,
    pub username: String,
    /// The site role `owner`: every action on every workspace.
    pub owner: bool,
    /// Organization roles, by index into `World::organizations`: `organization-admin` may do every
    /// workspace action but ssh and application_connect in its organization, an
    /// `organization-template-admin` only reads its workspaces (`coderd/rbac/roles.go`).
    pub org_roles: Vec<(usize, OrgRole)>,
    /// `active`, or `suspended`: a suspended user's tokens get 401 "User is not active"
    /// (`coderd/httpmw/apikey.go`).
    pub status: &'static str,
    /// A system user (`prebuilds`): not a person.
    pub system: bool,
    /// The user's first token (see `World::tokens` for all).
    pub key_id: String,
    pub token: String,
    pub expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
}

/// One API key: `<10-char id>-<secret>` (`apikey/apikey.go`). A token made with `--scope`
/// may do less than its user (`coderd/authorize.go` evaluates the scope).
#[derive(Debug, Clone)]
pub struct ApiToken {
    pub key_id: String,
    pub token: String,
    pub user: usize,
    /// Empty: `coder:all`. Otherwise `resource:action` entries such as `workspace:read`.
    pub scopes: Vec<String>,
    pub expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub revoked: bool,
}

/// The prebuilds system user's id (`coderd/database/migrations`, `prebuilds` user).
pub const PREBUILDS_USER_ID: &str = "c42fdf75-3097-471c-8c33-fb52454d81c0";

#[derive(Debug, Clone)]
pub struct Agent {
    pub id: Uuid,
    pub created_at: DateTime<Utc>,
    pub first_connected_at: Option<DateTime<Utc>>,
    pub last_connected_at: Option<DateTime<Utc>>,
    pub disconnected_at: Option<DateTime<Utc>>,
    /// Its pod runs and it heartbeats.
    pub online: bool,
    pub lifecycle: &'static str,
    pub connection_timeout_seconds: i64,
}

#[derive(Debug, Clone)]
pub struct Job {
    pub id: Uuid,
    pub status: &'static str,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub completed_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
    /// Someone canceled the job (`patchCancelWorkspaceBuild`).
    pub canceled_at: Option<DateTime<Utc>>,
    /// The provisioner tags the job needs (its workspace's `job_tags`).
    pub tags: BTreeMap<String, String>,
}

/// A provisioner daemon (`codersdk.ProvisionerDaemon`): it takes the pending jobs of its
/// organization whose tags it has (`provisioner_tagset_contains`, NOTES §16) and heartbeats
/// while online.
#[derive(Debug, Clone)]
pub struct Provisioner {
    pub id: Uuid,
    pub name: String,
    /// Index into `World::organizations`.
    pub org: usize,
    pub tags: BTreeMap<String, String>,
    pub online: bool,
    pub last_seen: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
}

/// The tags of an untagged job or daemon: organization scope, no owner.
pub fn untagged() -> BTreeMap<String, String> {
    [("scope".to_string(), "organization".to_string()), ("owner".to_string(), String::new())].into()
}

/// Organization scope, no owner, and these tags.
pub fn tagged(tags: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut all = untagged();
    all.extend(tags.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    all
}

impl Provisioner {
    /// Whether it may take a job with `tags`: an untagged job only a daemon with exactly the
    /// untagged tags, any other job one whose tags contain the job's (NOTES §16).
    pub fn matches(&self, tags: &BTreeMap<String, String>) -> bool {
        if *tags == untagged() {
            return self.tags == *tags;
        }
        tags.iter().all(|(k, v)| self.tags.get(k) == Some(v))
    }
}

#[derive(Debug, Clone)]
pub struct Build {
    pub id: Uuid,
    pub number: i64,
    pub transition: &'static str,
    pub reason: &'static str,
    pub initiator: usize,
    pub created_at: DateTime<Utc>,
    pub job: Job,
    pub deadline: Option<DateTime<Utc>>,
    /// The template's autostop requirement for this build (Premium), else `None`.
    pub max_deadline: Option<DateTime<Utc>>,
    pub agent: Option<Agent>,
    queued_real: Instant,
    fail: bool,
    /// No provisioner takes this job: it stays `pending` (`reference/coder/NOTES.md` section 14).
    stalled: bool,
    /// The parameter values it was made with (`GET /api/v2/workspacebuilds/{id}/parameters`).
    pub parameters: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
pub struct Pod {
    pub name: String,
    pub gpu: Option<usize>,
    pub created_at: DateTime<Utc>,
    connect_at: Option<Instant>,
    /// Until then its volume binds: it is not scheduled, and gets no GPU (`volume_bind`).
    bound_at: Instant,
}

#[derive(Debug, Clone)]
pub struct Workspace {
    pub id: Uuid,
    pub name: String,
    pub owner: usize,
    /// Index into `World::organizations`.
    pub org: usize,
    pub created_at: DateTime<Utc>,
    pub last_used_at: DateTime<Utc>,
    pub ttl_ms: Option<i64>,
    pub builds: Vec<Build>,
    pub pod: Option<Pod>,
    pub load: Load,
    pub connections: u32,
    tail_refreshes: u32,
    pub home_files: Vec<String>,
    pub tmp_files: Vec<String>,
    fail_next_stop: bool,
    /// The next stop build's job is never picked up (no provisioner matches): it stays pending.
    stall_next_stop: bool,
    /// A prebuilt workspace, owned by the `prebuilds` system user until a user claims it.
    pub prebuild: bool,
    /// The Coder Task this workspace backs, if any.
    pub task_id: Option<Uuid>,
    /// Its template's name (`gpu-workspace` unless made with `create_workspace_of`).
    pub template: String,
    /// Its pod asks for a GPU (`nvidia.com/gpu`); a CPU template's does not, and runs at once.
    pub needs_gpu: bool,
    /// Its agent never connects (an image that never pulls, a crash-looping entrypoint), while
    /// its pod keeps whatever GPU it was given (kubelet's device stays allocated).
    pub agent_never_connects: bool,
    /// The provisioner tags its builds' jobs need (its template version's; untagged at first).
    pub job_tags: BTreeMap<String, String>,
    /// The build parameters its next build is made with (`wsbuilder` copies the previous
    /// build's values; reference NOTES §19).
    pub parameters: Vec<(String, String)>,
}

/// The template of workspaces made with `create_workspace`.
pub const GPU_TEMPLATE: &str = "gpu-workspace";

impl Workspace {
    pub fn latest(&self) -> Option<&Build> {
        self.builds.last()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub at: DateTime<Utc>,
    pub workspace: String,
    pub kind: &'static str,
    pub detail: String,
}

/// An error as Coder answers it: status and `codersdk.Response` message.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub detail: String,
}

fn api_error(status: u16, message: &str) -> ApiError {
    ApiError { status, message: message.into(), detail: String::new() }
}

pub const NOT_FOUND: &str = "Resource not found or you do not have access to this resource";

pub struct World {
    pub config: WorldConfig,
    pub users: Vec<User>,
    pub tokens: Vec<ApiToken>,
    pub template_id: Uuid,
    pub template_version_id: Uuid,
    /// The default organization's id (`organizations[0]`).
    pub organization_id: Uuid,
    /// Every organization: id and name; the first is the default one, `coder`.
    pub organizations: Vec<(Uuid, String)>,
    /// No provisioner daemon answers: no pending job starts (the reaper fails them in time).
    pub provisioners_down: bool,
    /// coderd's lifecycle executor makes no build (a stuck executor, or `hasValidProvisioner`
    /// finding no daemon for the active version's tags, NOTES §16): no autostop, no reminder.
    pub executor_paused: bool,
    /// Autostop reminders sent (template `time_til_autostop_notify_ms`, main only): the
    /// workspace and the deadline each was sent for.
    pub reminders: Vec<(Uuid, DateTime<Utc>)>,
    /// The provisioner daemons; at first one untagged daemon in the default organization.
    pub provisioners: Vec<Provisioner>,
    pub workspaces: Vec<Workspace>,
    /// Which workspace's pod holds each GPU.
    pub gpu_holders: Vec<Option<Uuid>>,
    /// GPUs on drained (cordoned) nodes: nothing is scheduled onto them.
    pub cordoned: Vec<bool>,
    pub gpu_uuids: Vec<String>,
    pub events: Vec<Event>,
    rng: u64,
    next_refresh: Instant,
    next_flush: Instant,
    next_autobuild: Instant,
    pending_usage: HashSet<Uuid>,
}

impl World {
    pub fn new(config: WorldConfig) -> Self {
        let now = Utc::now() + config.clock_offset;
        let user = |name: &str, owner: bool, lifetime: chrono::Duration| {
            let key_id: String = Uuid::new_v4().simple().to_string()[..10].to_string();
            User {
                id: Uuid::new_v4(),
                username: name.into(),
                owner,
                org_roles: Vec::new(),
                status: "active",
                system: false,
                token: format!("{key_id}-{}", Uuid::new_v4().simple()),
                key_id,
                expires_at: now + lifetime,
                created_at: now,
            }
        };
        let mut users = vec![
            user("admin", true, config.owner_token_lifetime),
            user("alice", false, chrono::Duration::days(30)),
            user("bob", false, chrono::Duration::days(30)),
            User { org_roles: vec![(0, OrgRole::Admin)], ..user("orgadmin", false, chrono::Duration::days(30)) },
            User { system: true, ..user("prebuilds", false, chrono::Duration::days(30)) },
        ];
        if let (Some(p), Ok(id)) = (users.last_mut(), Uuid::parse_str(PREBUILDS_USER_ID)) {
            p.id = id;
        }
        let tokens = users
            .iter()
            .enumerate()
            .map(|(i, u)| ApiToken {
                key_id: u.key_id.clone(),
                token: u.token.clone(),
                user: i,
                scopes: Vec::new(),
                expires_at: u.expires_at,
                created_at: u.created_at,
                revoked: false,
            })
            .collect();
        let now_real = Instant::now();
        let default_org = Uuid::new_v4();
        let gpus = config.gpus;
        let scale = config.scale.max(0.001);
        World {
            users,
            tokens,
            template_id: Uuid::new_v4(),
            template_version_id: Uuid::new_v4(),
            organization_id: default_org,
            organizations: vec![(default_org, "coder".into())],
            provisioners_down: false,
            executor_paused: false,
            reminders: Vec::new(),
            provisioners: vec![Provisioner {
                id: Uuid::new_v4(),
                name: "provisioner-0".into(),
                org: 0,
                tags: untagged(),
                online: true,
                last_seen: now,
                created_at: now,
            }],
            workspaces: Vec::new(),
            gpu_holders: vec![None; gpus],
            cordoned: vec![false; gpus],
            gpu_uuids: (0..gpus).map(|_| format!("GPU-{}", Uuid::new_v4())).collect(),
            events: Vec::new(),
            rng: config.seed.max(1),
            next_refresh: now_real + USAGE_REFRESH.div_f64(scale),
            next_flush: now_real + USAGE_FLUSH.div_f64(scale).mul_f64(1.5),
            next_autobuild: now_real + AUTOBUILD_POLL.div_f64(scale),
            pending_usage: HashSet::new(),
            config,
        }
    }

    /// Real time for a span of Coder time.
    pub fn real(&self, coder: Duration) -> Duration {
        coder.div_f64(self.config.scale.max(0.001))
    }

    /// Coder's clock (the real one plus `clock_offset`).
    /// In microseconds, as PostgreSQL's `timestamptz` keeps every time coderd stores: a
    /// `created_at` read back and sent as `since` is the stored time itself.
    pub fn now(&self) -> DateTime<Utc> {
        use chrono::SubsecRound;
        (Utc::now() + self.config.clock_offset).trunc_subsecs(6)
    }

    /// The token, if it exists and is not revoked (expiry is the caller's check).
    pub fn token(&self, token: &str) -> Option<&ApiToken> {
        self.tokens.iter().find(|t| t.token == token && !t.revoked)
    }

    pub fn user_by_token(&self, token: &str) -> Option<usize> {
        self.token(token).map(|t| t.user)
    }

    /// `coder tokens create [--scope ...]` for `user`: a new token (the old ones stay valid).
    pub fn create_token(&mut self, user: &str, scopes: &[&str], lifetime: chrono::Duration) -> Option<String> {
        let ui = self.user_index(user)?;
        let key_id: String = Uuid::new_v4().simple().to_string()[..10].to_string();
        let token = format!("{key_id}-{}", Uuid::new_v4().simple());
        let now = self.now();
        self.tokens.push(ApiToken {
            key_id,
            token: token.clone(),
            user: ui,
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            expires_at: now + lifetime,
            created_at: now,
            revoked: false,
        });
        Some(token)
    }

    /// `coder tokens remove`: the key is deleted; its next request gets 401.
    pub fn revoke_token(&mut self, token: &str) {
        for t in self.tokens.iter_mut().filter(|t| t.token == token) {
            t.revoked = true;
        }
    }

    /// Whether `user` may read `ws`: an owner any, an organization admin or template admin those
    /// of its organization, a member its own (`rbac/roles.go`).
    pub fn may_read(&self, user: usize, ws: &Workspace) -> bool {
        let u = &self.users[user];
        u.owner || ws.owner == user || u.org_roles.iter().any(|(org, _)| *org == ws.org)
    }

    /// Whether `user` may start, stop or otherwise change `ws`: an owner any, an organization
    /// admin those of its organization, a member its own; a template admin may not.
    pub fn may_act_on(&self, user: usize, ws: &Workspace) -> bool {
        let u = &self.users[user];
        u.owner || ws.owner == user || u.org_roles.contains(&(ws.org, OrgRole::Admin))
    }

    /// What `POST /api/v2/authcheck` answers for one check: the role's permission on the
    /// object set, then the token's scope (`coderd/authorize.go`, `rbac/roles.go`, `rbac/scopes.go`).
    /// `org`: the set is that organization's objects; `any_org`: those of some organization.
    pub fn authorize(
        &self,
        token: &ApiToken,
        resource: &str,
        action: &str,
        owner_id: Option<&str>,
        org: Option<&str>,
        any_org: bool,
    ) -> bool {
        let u = &self.users[token.user];
        let org_role = |role: &OrgRole| match (resource, action) {
            ("workspace", "ssh" | "application_connect") => false,
            ("workspace", "read") => true,
            ("workspace", _) => *role == OrgRole::Admin,
            _ => false,
        };
        let in_scope = |i: usize| any_org || org == Some(self.organizations[i].0.to_string().as_str());
        let role = u.owner
            || u.org_roles.iter().any(|(i, r)| in_scope(*i) && org_role(r))
            || (resource == "workspace" && owner_id == Some(u.id.to_string().as_str()));
        let scoped = token.scopes.is_empty()
            || token
                .scopes
                .iter()
                .any(|s| s == "coder:all" || s == "all" || *s == format!("{resource}:{action}") || *s == format!("{resource}:*"));
        role && scoped
    }

    /// A new organization (no members) with an untagged provisioner daemon of its own
    /// (coderd matches jobs to daemons of the job's organization only); returns its index.
    pub fn add_organization(&mut self, name: &str) -> usize {
        self.organizations.push((Uuid::new_v4(), name.into()));
        let org = self.organizations.len() - 1;
        self.add_provisioner(&format!("{name}-provisioner"), org, &[], true);
        org
    }

    /// Gives `user` a role in organization `org`.
    pub fn grant(&mut self, user: &str, org: usize, role: OrgRole) {
        if let Some(u) = self.user_index(user) {
            self.users[u].org_roles.push((org, role));
        }
    }

    /// `coder users suspend`: the user's tokens are refused (401) until reactivated.
    pub fn set_user_status(&mut self, user: &str, status: &'static str) {
        if let Some(u) = self.user_index(user) {
            self.users[u].status = status;
        }
    }

    pub fn user_index(&self, name: &str) -> Option<usize> {
        self.users.iter().position(|u| u.username == name)
    }

    pub fn token_of(&self, name: &str) -> Option<String> {
        self.users.iter().find(|u| u.username == name).map(|u| u.token.clone())
    }

    pub fn ws_index(&self, id: Uuid) -> Option<usize> {
        self.workspaces.iter().position(|w| w.id == id)
    }

    pub fn ws_by_name(&self, name: &str) -> Option<&Workspace> {
        self.workspaces.iter().find(|w| w.name == name)
    }

    fn log(&mut self, workspace: &str, kind: &'static str, detail: String) {
        self.events.push(Event { at: self.now(), workspace: workspace.into(), kind, detail });
    }

    fn random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Creates a workspace for `owner` and queues its first start build.
    pub fn create_workspace(&mut self, owner: &str, name: &str, ttl_ms: Option<i64>) -> Result<Uuid, ApiError> {
        let owner_idx = self.user_index(owner).ok_or_else(|| api_error(400, "unknown user"))?;
        let now = self.now();
        let id = Uuid::new_v4();
        self.workspaces.push(Workspace {
            id,
            name: name.into(),
            owner: owner_idx,
            org: 0,
            created_at: now,
            last_used_at: now,
            ttl_ms,
            builds: Vec::new(),
            pod: None,
            load: Load::Idle,
            connections: 0,
            tail_refreshes: 0,
            home_files: Vec::new(),
            tmp_files: Vec::new(),
            fail_next_stop: false,
            stall_next_stop: false,
            prebuild: false,
            task_id: None,
            template: GPU_TEMPLATE.into(),
            needs_gpu: true,
            agent_never_connects: false,
            job_tags: untagged(),
            parameters: Vec::new(),
        });
        self.create_build(id, "start", owner_idx, "initiator")?;
        Ok(id)
    }

    /// A workspace of another template; `needs_gpu: false` is a CPU template's (its pod runs
    /// without a GPU).
    pub fn create_workspace_of(&mut self, owner: &str, name: &str, template: &str, needs_gpu: bool) -> Result<Uuid, ApiError> {
        let id = self.create_workspace(owner, name, None)?;
        if let Some(wi) = self.ws_index(id) {
            self.workspaces[wi].template = template.into();
            self.workspaces[wi].needs_gpu = needs_gpu;
        }
        Ok(id)
    }

    /// A workspace of a template with a GPU and a CPU variant, chosen by build parameters (e.g.
    /// `gpu_count`): its pod asks for a GPU when `needs_gpu`. Its first build, still pending,
    /// is made with `parameters`, and so is every later one (Coder copies them).
    pub fn create_workspace_variant(
        &mut self,
        owner: &str,
        name: &str,
        template: &str,
        parameters: &[(&str, &str)],
        needs_gpu: bool,
    ) -> Result<Uuid, ApiError> {
        let id = self.create_workspace_of(owner, name, template, needs_gpu)?;
        if let Some(wi) = self.ws_index(id) {
            let values: Vec<(String, String)> = parameters.iter().map(|(n, v)| ((*n).to_string(), (*v).to_string())).collect();
            for b in &mut self.workspaces[wi].builds {
                b.parameters.clone_from(&values);
            }
            self.workspaces[wi].parameters = values;
        }
        Ok(id)
    }

    /// Its builds' jobs need these provisioner tags from now on (besides organization scope),
    /// a build still pending included (as if its template version had them from the start).
    pub fn set_job_tags(&mut self, ws_id: Uuid, tags: &[(&str, &str)]) {
        if let Some(wi) = self.ws_index(ws_id) {
            let all = tagged(tags);
            if let Some(b) = self.workspaces[wi].builds.last_mut().filter(|b| b.job.status == "pending") {
                b.job.tags.clone_from(&all);
            }
            self.workspaces[wi].job_tags = all;
        }
    }

    /// A provisioner daemon in organization `org` with these tags (besides organization
    /// scope), online or not; returns its index.
    pub fn add_provisioner(&mut self, name: &str, org: usize, tags: &[(&str, &str)], online: bool) -> usize {
        let now = self.now();
        let last_seen = if online { now } else { now - chrono::Duration::hours(1) };
        self.provisioners.push(Provisioner {
            id: Uuid::new_v4(),
            name: name.into(),
            org,
            tags: tagged(tags),
            online,
            last_seen,
            created_at: now,
        });
        self.provisioners.len() - 1
    }

    /// Whether an online daemon of the organization takes jobs with these tags.
    fn provisioner_takes(&self, org: usize, tags: &BTreeMap<String, String>) -> bool {
        !self.provisioners_down && self.provisioners.iter().any(|p| p.online && p.org == org && p.matches(tags))
    }

    /// How recently a daemon must have been seen to count (coderd's 90 s, Coder time).
    pub fn seen_within(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.real(Duration::from_secs(90))).unwrap_or_default()
    }

    /// `matched_provisioners` of a job: filled only while pending; `available` counts the
    /// matching daemons seen after the job's creation minus 90 s (`db2sdk.MatchedProvisioners`).
    pub fn matched_provisioners(&self, ws: &Workspace, job: &Job) -> (usize, usize, Option<DateTime<Utc>>) {
        if job.status != "pending" {
            return (0, 0, None);
        }
        let matching: Vec<&Provisioner> = self.provisioners.iter().filter(|p| p.org == ws.org && p.matches(&job.tags)).collect();
        let since = job.created_at - self.seen_within();
        let available = matching.iter().filter(|p| p.last_seen > since).count();
        (matching.len(), available, matching.iter().map(|p| p.last_seen).max())
    }

    /// Its agent never connects from now on (its pod keeps any GPU it has).
    pub fn agent_never_connects(&mut self, ws_id: Uuid) {
        if let Some(wi) = self.ws_index(ws_id) {
            self.workspaces[wi].agent_never_connects = true;
        }
    }

    /// Creates a workspace in organization `org` (an index into `organizations`).
    pub fn create_workspace_in(&mut self, org: usize, owner: &str, name: &str) -> Result<Uuid, ApiError> {
        let id = self.create_workspace(owner, name, None)?;
        if let Some(wi) = self.ws_index(id) {
            self.workspaces[wi].org = org.min(self.organizations.len() - 1);
        }
        Ok(id)
    }

    /// A prebuilt workspace, as the prebuild reconciler creates it: owned by `prebuilds`,
    /// `is_prebuild: true`, started (it asks for a GPU like any other).
    pub fn create_prebuild(&mut self, name: &str) -> Result<Uuid, ApiError> {
        let id = self.create_workspace("prebuilds", name, None)?;
        if let Some(wi) = self.ws_index(id) {
            self.workspaces[wi].prebuild = true;
        }
        Ok(id)
    }

    /// Marks a workspace as backing a Coder Task.
    pub fn make_task(&mut self, ws_id: Uuid) {
        if let Some(wi) = self.ws_index(ws_id) {
            self.workspaces[wi].task_id = Some(Uuid::new_v4());
        }
    }

    /// `POST /api/v2/workspaces/{id}/builds`, as `by` (a user index).
    pub fn create_build(&mut self, ws_id: Uuid, transition: &'static str, by: usize, reason: &'static str) -> Result<Uuid, ApiError> {
        let wi = self.ws_index(ws_id).ok_or_else(|| api_error(404, NOT_FOUND))?;
        if !self.may_read(by, &self.workspaces[wi]) {
            // A member cannot read another user's workspace: Coder says 404, not 403.
            return Err(api_error(404, NOT_FOUND));
        }
        if !self.may_act_on(by, &self.workspaces[wi]) {
            // `wsbuilder.go` authorize: readable, but not this action.
            return Err(api_error(403, &format!("You do not have permission to {transition} this workspace.")));
        }
        if self.workspaces[wi].latest().is_some_and(|b| matches!(b.job.status, "pending" | "running" | "canceling")) {
            let mut e = api_error(409, "A workspace build is already active.");
            e.detail = "A workspace build is already active.".into();
            return Err(e);
        }
        let now = self.now();
        let ws = &mut self.workspaces[wi];
        let number = ws.builds.len() as i64 + 1;
        let fail = transition == "stop" && std::mem::take(&mut ws.fail_next_stop);
        let stalled = transition == "stop" && std::mem::take(&mut ws.stall_next_stop);
        let id = Uuid::new_v4();
        ws.builds.push(Build {
            id,
            number,
            transition,
            reason,
            initiator: by,
            created_at: now,
            job: Job {
                id: Uuid::new_v4(),
                status: "pending",
                created_at: now,
                started_at: None,
                completed_at: None,
                error: None,
                canceled_at: None,
                tags: ws.job_tags.clone(),
            },
            deadline: None,
            max_deadline: None,
            agent: None,
            queued_real: Instant::now(),
            fail,
            stalled,
            parameters: ws.parameters.clone(),
        });
        let name = ws.name.clone();
        let who = self.users[by].username.clone();
        self.log(&name, "build_queued", format!("{transition} #{number} by {who}"));
        Ok(id)
    }

    /// Rewrites a workspace's history as coderd would have stored it had these builds happened
    /// at these times (a backtest reads history, and a test cannot wait days for it): each
    /// `(transition, by, at)` a build whose job succeeded at `at`, numbered in order; a start's
    /// agent connected then (its `first_connected_at`, `coderd/workspaceagents.go`), a stop has
    /// none (§12). The latest build's pod and GPU are left as they are.
    pub fn rewrite_history(&mut self, ws_id: Uuid, builds: &[(&'static str, usize, DateTime<Utc>)]) {
        let Some(wi) = self.ws_index(ws_id) else { return };
        let template = self.workspaces[wi].builds.first().cloned();
        let Some(template) = template else { return };
        let ws = &mut self.workspaces[wi];
        ws.builds = builds
            .iter()
            .enumerate()
            .map(|(i, &(transition, by, at))| {
                let mut b = template.clone();
                b.id = Uuid::new_v4();
                b.number = i as i64 + 1;
                b.transition = transition;
                b.reason = "initiator";
                b.initiator = by;
                b.created_at = at;
                b.job.id = Uuid::new_v4();
                b.job.status = "succeeded";
                b.job.created_at = at;
                b.job.started_at = Some(at);
                b.job.completed_at = Some(at);
                b.deadline = None;
                b.agent = (transition == "start").then(|| Agent {
                    id: Uuid::new_v4(),
                    created_at: at,
                    first_connected_at: Some(at),
                    last_connected_at: Some(at),
                    disconnected_at: None,
                    online: true,
                    lifecycle: "ready",
                    connection_timeout_seconds: 120,
                });
                b
            })
            .collect();
        if let Some(first) = builds.first() {
            ws.created_at = first.2;
        }
    }

    pub fn find_build(&self, build_id: Uuid) -> Option<(usize, usize)> {
        self.workspaces.iter().enumerate().find_map(|(wi, w)| w.builds.iter().position(|b| b.id == build_id).map(|bi| (wi, bi)))
    }

    /// Advances jobs, pods, agents and usage to now. Called by the fakes' ticker.
    pub fn tick(&mut self) {
        let now_real = Instant::now();
        let (queue, run) = (self.real(self.config.build_queue), self.real(self.config.build_run));
        for wi in 0..self.workspaces.len() {
            let Some(bi) = self.workspaces[wi].builds.len().checked_sub(1) else { continue };
            let b = &self.workspaces[wi].builds[bi];
            let age = now_real.duration_since(b.queued_real);
            let reap = match b.job.status {
                "pending" => (age >= self.real(self.config.reaper_pending)).then_some(("pending", self.config.reaper_pending)),
                "running" => (age >= queue + self.real(self.config.reaper_hung)).then_some(("hung", self.config.reaper_hung)),
                _ => None,
            };
            if let Some((kind, threshold)) = reap {
                self.reap(wi, bi, kind, threshold);
            } else if b.job.status == "pending"
                && age >= queue
                && !b.stalled
                && self.provisioner_takes(self.workspaces[wi].org, &b.job.tags)
            {
                let now = self.now();
                let b = &mut self.workspaces[wi].builds[bi];
                b.job.status = "running";
                b.job.started_at = Some(now);
            } else if matches!(b.job.status, "running" | "canceling") && age >= queue + run {
                self.finish_build(wi, bi);
            }
        }
        self.schedule_pods();
        for wi in 0..self.workspaces.len() {
            let now = self.now();
            let ws = &mut self.workspaces[wi];
            let Some(pod) = &mut ws.pod else { continue };
            if pod.connect_at.is_some_and(|t| now_real >= t) && !ws.agent_never_connects {
                pod.connect_at = None;
                if let Some(agent) = ws.builds.last_mut().and_then(|b| b.agent.as_mut()) {
                    agent.first_connected_at = agent.first_connected_at.or(Some(now));
                    agent.last_connected_at = Some(now);
                    agent.online = true;
                    agent.lifecycle = "ready";
                }
                let name = ws.name.clone();
                self.log(&name, "agent_connected", "the agent connected".into());
            }
        }
        // Online provisioner daemons heartbeat (every minute in coderd; every tick here).
        if !self.provisioners_down {
            let now = self.now();
            for p in self.provisioners.iter_mut().filter(|p| p.online) {
                p.last_seen = now;
            }
        }
        // Connected agents heartbeat.
        let now = self.now();
        for ws in &mut self.workspaces {
            if let Some(agent) = ws.builds.last_mut().and_then(|b| b.agent.as_mut()).filter(|a| a.online) {
                agent.last_connected_at = Some(now);
            }
        }
        if now_real >= self.next_refresh {
            self.next_refresh = now_real + self.real(USAGE_REFRESH);
            let bump = chrono::Duration::from_std(self.config.activity_bump).unwrap_or_default();
            for ws in self.workspaces.iter_mut().filter(|ws| agent_reports_stats(ws)) {
                if ws.connections > 0 {
                    activity_bump(ws, now, bump);
                    self.pending_usage.insert(ws.id);
                } else if ws.tail_refreshes > 0 {
                    // The same agent-stats report with connections: it bumps too.
                    ws.tail_refreshes -= 1;
                    activity_bump(ws, now, bump);
                    self.pending_usage.insert(ws.id);
                }
            }
        }
        if now_real >= self.next_autobuild {
            self.next_autobuild = now_real + self.real(AUTOBUILD_POLL);
            self.autostop(now);
        }
        if now_real >= self.next_flush {
            self.next_flush = now_real + self.real(USAGE_FLUSH);
            let used = std::mem::take(&mut self.pending_usage);
            for ws in &mut self.workspaces {
                if used.contains(&ws.id) && ws.last_used_at < now {
                    ws.last_used_at = now;
                }
            }
        }
    }

    /// The lifecycle executor's autostop (`coderd/autobuild/lifecycle_executor.go`, NOTES §16):
    /// a workspace whose latest build is a start whose job did not fail, not a prebuild, and whose
    /// deadline is set and has passed (or whose owner is suspended), gets a stop build with
    /// reason `autostop`, initiated by its owner; without a provisioner it is skipped and tried on
    /// the next tick. The tick is not truncated to the minute here (coderd's is: its stop comes 0
    /// to about 2 minutes after the deadline, this one within a poll).
    fn autostop(&mut self, tick: DateTime<Utc>) {
        if self.provisioners_down || self.executor_paused {
            return;
        }
        self.remind(tick);
        let due: Vec<(Uuid, usize)> = self
            .workspaces
            .iter()
            .filter(|ws| !ws.prebuild && !self.users[ws.owner].system)
            // `hasValidProvisioner`: without a daemon for its tags nothing is built this tick.
            .filter(|ws| self.provisioner_takes(ws.org, &ws.job_tags))
            .filter(|ws| {
                let suspended = self.users[ws.owner].status == "suspended";
                ws.latest().is_some_and(|b| {
                    b.transition == "start"
                        && b.job.completed_at.is_some()
                        && b.job.status != "failed"
                        && (b.deadline.is_some_and(|d| d < tick) || suspended)
                })
            })
            .map(|ws| (ws.id, ws.owner))
            .collect();
        for (id, owner) in due {
            if self.create_build(id, "stop", owner, "autostop").is_ok() {
                let name = self.workspaces.iter().find(|w| w.id == id).map(|w| w.name.clone()).unwrap_or_default();
                self.log(&name, "autostop", "the deadline passed: Coder's lifecycle executor stops it".into());
            }
        }
    }

    /// The autostop reminder (main only, `shouldRemindAutostop`, NOTES §16 and §18): a succeeded
    /// start whose deadline is in the future and within the template's lead gets one "will stop
    /// soon" per deadline value (`notified_autostop_deadline != deadline`), so every new deadline,
    /// a `PUT /extend` included, re-arms it.
    fn remind(&mut self, tick: DateTime<Utc>) {
        let Some(lead) = self.config.autostop_notify.and_then(|l| chrono::Duration::from_std(l).ok()) else { return };
        for ws in self.workspaces.iter().filter(|ws| !ws.prebuild) {
            let Some(deadline) = ws.latest().filter(|b| b.transition == "start" && b.job.status == "succeeded").and_then(|b| b.deadline)
            else {
                continue;
            };
            let stamped = self.reminders.iter().rev().find(|(id, _)| *id == ws.id).map(|(_, d)| *d);
            if deadline > tick && deadline <= tick + lead && stamped != Some(deadline) {
                self.reminders.push((ws.id, deadline));
                self.events.push(Event {
                    at: tick,
                    workspace: ws.name.clone(),
                    kind: "autostop_reminder",
                    detail: format!("Your workspace \"{}\" will stop soon (at {deadline})", ws.name),
                });
            }
        }
    }

    /// coderd's job reaper (`coderd/jobreaper/detector.go`): the job is failed with its message
    /// and the previous build's provisioner state is kept, so a reaped stop leaves the pod running.
    fn reap(&mut self, wi: usize, bi: usize, kind: &str, threshold: Duration) {
        let now = self.now();
        let b = &mut self.workspaces[wi].builds[bi];
        b.job.status = "failed";
        b.job.started_at = b.job.started_at.or(Some(now));
        b.job.completed_at = Some(now);
        b.job.error = Some(format!(
            "Coder: Build has been detected as {kind} for {:.0} minutes and has been terminated by the reaper.",
            threshold.as_secs_f64() / 60.0
        ));
        let name = self.workspaces[wi].name.clone();
        self.log(&name, "build_reaped", format!("{kind}: failed by the job reaper"));
    }

    /// `PATCH /api/v2/workspacebuilds/{id}/cancel` (`coderd/workspacebuilds.go`
    /// `patchCancelWorkspaceBuild`): a pending job is canceled at once, a running one goes
    /// `canceling` and ends `canceled`; a finished one is a 400.
    pub fn cancel_build(&mut self, build_id: Uuid, by: usize) -> Result<(), ApiError> {
        self.cancel_build_expecting(build_id, by, None)
    }

    /// `cancel_build` with `expect_status`: 412 `Job is not in the expected state.` when the
    /// job's status is another.
    pub fn cancel_build_expecting(&mut self, build_id: Uuid, by: usize, expect: Option<&str>) -> Result<(), ApiError> {
        let (wi, bi) = self.find_build(build_id).ok_or_else(|| api_error(404, NOT_FOUND))?;
        if !self.may_read(by, &self.workspaces[wi]) {
            return Err(api_error(404, NOT_FOUND));
        }
        // The handler: anyone with expect_status=pending; otherwise the template's
        // allow_user_cancel_workspace_jobs or a site owner. Then dbauthz
        // (`UpdateProvisionerJobWithCancelByID`) repeats that check for every status and needs
        // `update` on the workspace; its refusal is a 500 (NOTES §16, §18): an organization
        // admin cannot cancel a pending build on a template that does not allow it.
        let (site_owner, allowed) = (self.users[by].owner, self.config.allow_user_cancel);
        if expect != Some("pending") && !allowed && !site_owner {
            return Err(api_error(403, "User is not allowed to cancel workspace builds. Owner role is required."));
        }
        if !self.may_act_on(by, &self.workspaces[wi]) || (!allowed && !site_owner) {
            return Err(api_error(500, "Internal error updating provisioner job."));
        }
        let now = self.now();
        let b = &mut self.workspaces[wi].builds[bi];
        // After the completed and canceled checks (400), as coderd orders them.
        if matches!(b.job.status, "pending" | "running") && expect.is_some_and(|e| e != b.job.status) {
            return Err(api_error(412, "Job is not in the expected state."));
        }
        match b.job.status {
            "pending" => {
                b.job.status = "canceled";
                b.job.completed_at = Some(now);
                b.job.canceled_at = Some(now);
            }
            "running" => {
                b.job.status = "canceling";
                b.job.canceled_at = Some(now);
            }
            "canceling" | "canceled" => return Err(api_error(400, "Job has already been marked as canceled!")),
            _ => return Err(api_error(400, "Job has already completed!")),
        }
        let name = self.workspaces[wi].name.clone();
        let who = self.users[by].username.clone();
        self.log(&name, "build_canceled", format!("by {who}"));
        Ok(())
    }

    /// The latest build of a workspace (by name), for tests that act on it.
    pub fn latest_build_id(&self, ws_id: Uuid) -> Option<Uuid> {
        self.ws_index(ws_id).and_then(|wi| self.workspaces[wi].latest()).map(|b| b.id)
    }

    fn finish_build(&mut self, wi: usize, bi: usize) {
        let now = self.now();
        let timeout = self.config.connection_timeout_seconds;
        let ws = &mut self.workspaces[wi];
        let b = &mut ws.builds[bi];
        b.job.completed_at = Some(now);
        if b.job.status == "canceling" {
            // coderd's `job_status` reads `error` before `canceled_at` (NOTES §16): a canceled job
            // that ends in an error (here a build set to fail: the provisioner's force-cancel,
            // "Cancel timed out") is `failed`, with `canceled_at` set.
            let (status, what) =
                if b.fail { ("failed", "the canceled job failed (Cancel timed out)") } else { ("canceled", "the job ended canceled") };
            b.job.status = status;
            b.job.error = b.fail.then(|| "Cancel timed out".to_string());
            let name = ws.name.clone();
            self.log(&name, "build_canceled", what.into());
            return;
        }
        if b.fail {
            b.job.status = "failed";
            b.job.error = Some("terraform apply: context deadline exceeded".into());
            let name = ws.name.clone();
            self.log(&name, "build_failed", "the stop build failed".into());
            return;
        }
        b.job.status = "succeeded";
        let transition = b.transition;
        let name = ws.name.clone();
        match transition {
            "start" => {
                // `schedule.CalculateAutostop`: completion plus the TTL, never past max_deadline.
                b.max_deadline = self.config.max_deadline_after.and_then(|d| chrono::Duration::from_std(d).ok()).map(|d| now + d);
                b.deadline = ws.ttl_ms.filter(|t| *t > 0).map(|t| now + chrono::Duration::milliseconds(t));
                if let (Some(d), Some(max)) = (b.deadline, b.max_deadline) {
                    b.deadline = Some(d.min(max));
                }
                b.agent = Some(Agent {
                    id: Uuid::new_v4(),
                    created_at: now,
                    first_connected_at: None,
                    last_connected_at: None,
                    disconnected_at: None,
                    online: false,
                    lifecycle: "created",
                    connection_timeout_seconds: timeout,
                });
                match &ws.pod {
                    // A start on a running workspace leaves its Deployment and pod as they are;
                    // the running agent reconnects to the new build at once.
                    Some(pod) if pod.gpu.is_some() => {
                        if let Some(agent) = &mut b.agent {
                            agent.first_connected_at = Some(now);
                            agent.last_connected_at = Some(now);
                            agent.online = true;
                            agent.lifecycle = "ready";
                        }
                    }
                    Some(_) => {}
                    None => {
                        let rs = &Uuid::new_v4().simple().to_string()[..10];
                        let suffix = &Uuid::new_v4().simple().to_string()[..5];
                        // A first start's volume binds first (`volume_bind`); then a CPU template's
                        // pod is scheduled at once, and a GPU one waits for a GPU.
                        let scale = self.config.scale.max(0.001);
                        let first_start = ws.builds.iter().filter(|b| b.transition == "start").count() == 1;
                        let bind = if first_start { self.config.volume_bind.div_f64(scale) } else { Duration::ZERO };
                        let bound_at = Instant::now() + bind;
                        let connect_at = (!ws.needs_gpu).then(|| bound_at + self.config.agent_connect.div_f64(scale));
                        let name = format!("coder-{}-{rs}-{suffix}", ws.id);
                        ws.pod = Some(Pod { name, gpu: None, created_at: now, connect_at, bound_at });
                    }
                }
                self.log(&name, "build_succeeded", "start: the Deployment exists (wait_for_rollout = false)".into());
            }
            _ => {
                let freed = ws.pod.take().and_then(|p| p.gpu);
                ws.tmp_files.clear();
                ws.connections = 0;
                ws.tail_refreshes = 0;
                ws.load = Load::Idle;
                if let Some(g) = freed {
                    self.gpu_holders[g] = None;
                    self.log(&name, "gpu_released", format!("GPU {g} is free"));
                }
                self.log(&name, "build_succeeded", format!("{transition}: the pod is gone; home survives, /tmp does not"));
            }
        }
    }

    /// Gives free GPUs to pods waiting for one: the oldest first, or at random.
    fn schedule_pods(&mut self) {
        loop {
            let Some(free) = (0..self.gpu_holders.len()).find(|&g| self.gpu_holders[g].is_none() && !self.cordoned[g]) else { return };
            let now_real = Instant::now();
            let mut waiting: Vec<usize> = (0..self.workspaces.len())
                .filter(|&i| {
                    self.workspaces[i].needs_gpu
                        && self.workspaces[i].pod.as_ref().is_some_and(|p| p.gpu.is_none() && p.bound_at <= now_real)
                })
                .collect();
            if waiting.is_empty() {
                return;
            }
            waiting.sort_by_key(|&i| self.workspaces[i].pod.as_ref().map(|p| p.created_at));
            let pick = match self.config.assignment {
                Assignment::OldestFirst => waiting[0],
                Assignment::Random => waiting[(self.random() % waiting.len() as u64) as usize],
            };
            let connect = Instant::now() + self.real(self.config.agent_connect);
            let ws = &mut self.workspaces[pick];
            self.gpu_holders[free] = Some(ws.id);
            if let Some(pod) = &mut ws.pod {
                pod.gpu = Some(free);
                pod.connect_at = Some(connect);
            }
            let name = ws.name.clone();
            self.log(&name, "gpu_assigned", format!("GPU {free}"));
        }
    }

    /// Agent status, derived the way Coder derives it (`WorkspaceAgent.Status`).
    pub fn agent_status(&self, agent: &Agent) -> &'static str {
        let now = self.now();
        match agent.first_connected_at {
            None => {
                let timeout = self.real(Duration::from_secs(agent.connection_timeout_seconds.max(0) as u64));
                let waited = (now - agent.created_at).to_std().unwrap_or_default();
                if agent.connection_timeout_seconds > 0 && waited > timeout { "timeout" } else { "connecting" }
            }
            // `disconnected_at >= last_connected_at`, or no heartbeat for 30 s (Coder time).
            Some(_) => {
                let last = agent.last_connected_at.unwrap_or(agent.created_at);
                let silent = (now - last).to_std().unwrap_or_default() > self.real(Duration::from_secs(30));
                if agent.disconnected_at.is_some_and(|d| d >= last) || silent { "disconnected" } else { "connected" }
            }
        }
    }

    pub fn open_connection(&mut self, ws_id: Uuid) {
        if let Some(wi) = self.ws_index(ws_id) {
            self.workspaces[wi].connections += 1;
            let now = self.now();
            let name = self.workspaces[wi].name.clone();
            self.log(&name, "connection_opened", format!("at {now}"));
        }
    }

    pub fn close_connection(&mut self, ws_id: Uuid) {
        if let Some(wi) = self.ws_index(ws_id) {
            let ws = &mut self.workspaces[wi];
            ws.connections = ws.connections.saturating_sub(1);
            if ws.connections == 0 {
                ws.tail_refreshes = TAIL_REFRESHES;
            }
            let name = ws.name.clone();
            self.log(&name, "connection_closed", String::new());
        }
    }

    pub fn set_load(&mut self, ws_id: Uuid, load: Load) {
        if let Some(wi) = self.ws_index(ws_id) {
            self.workspaces[wi].load = load;
            let name = self.workspaces[wi].name.clone();
            self.log(&name, "load", format!("{load:?}"));
        }
    }

    /// Makes the next stop build of this workspace stay pending (no provisioner takes it).
    pub fn stall_next_stop(&mut self, ws_id: Uuid) {
        if let Some(wi) = self.ws_index(ws_id) {
            self.workspaces[wi].stall_next_stop = true;
        }
    }

    /// A provisioner frees up for this workspace's stalled stop: its pending job is taken at the
    /// next tick, as coderd's `AcquireProvisionerJob` takes the oldest pending job.
    pub fn release_stalled_stop(&mut self, ws_id: Uuid) {
        if let Some(b) = self.ws_index(ws_id).and_then(|wi| self.workspaces[wi].builds.last_mut()) {
            b.stalled = false;
        }
    }

    /// The node of GPU `g` is drained: it is cordoned and the pod on it is evicted.
    pub fn drain_gpu(&mut self, g: usize) {
        if g >= self.cordoned.len() {
            return;
        }
        self.cordoned[g] = true;
        if let Some(ws) = self.gpu_holders[g] {
            self.evict(ws);
        }
    }

    /// The pod is evicted (node drain, preemption): its GPU is freed, a new pod waits for one,
    /// and the agent, which had connected, is `disconnected` until the new pod runs.
    pub fn evict(&mut self, ws_id: Uuid) {
        let Some(wi) = self.ws_index(ws_id) else { return };
        let now = self.now();
        let ws = &mut self.workspaces[wi];
        let Some(pod) = ws.pod.as_mut() else { return };
        let freed = pod.gpu.take();
        pod.connect_at = None;
        pod.created_at = now;
        let suffix = &Uuid::new_v4().simple().to_string()[..5];
        if let Some((prefix, _)) = pod.name.rsplit_once('-') {
            pod.name = format!("{prefix}-{suffix}");
        }
        self.pod_gone(wi, freed, "pod_evicted", "a new pod waits for a GPU");
    }

    /// What follows a pod's end: its agent is `disconnected` from now on, its GPU (if it had one)
    /// is free, and both are logged.
    fn pod_gone(&mut self, wi: usize, freed: Option<usize>, kind: &'static str, detail: &str) {
        let now = self.now();
        let ws = &mut self.workspaces[wi];
        if let Some(agent) = ws.builds.last_mut().and_then(|b| b.agent.as_mut()) {
            agent.disconnected_at = Some(now);
            agent.online = false;
        }
        let name = ws.name.clone();
        if let Some(g) = freed {
            self.gpu_holders[g] = None;
            self.log(&name, "gpu_released", format!("GPU {g} is free ({kind})"));
        }
        self.log(&name, kind, detail.into());
    }

    /// The pod is gone for good: a bare pod (no Deployment) evicted, or its node lost. Its GPU is
    /// free, nothing recreates it, and the agent stays `disconnected` while the workspace is
    /// still `running` in Coder (`reference/coder/NOTES.md` section 15).
    pub fn lose_pod(&mut self, ws_id: Uuid) {
        let Some(wi) = self.ws_index(ws_id) else { return };
        let freed = self.workspaces[wi].pod.take().and_then(|p| p.gpu);
        self.pod_gone(wi, freed, "pod_lost", "nothing recreates it");
    }

    /// Makes the next stop build of this workspace fail (its job ends `failed`).
    pub fn fail_next_stop(&mut self, ws_id: Uuid) {
        if let Some(wi) = self.ws_index(ws_id) {
            self.workspaces[wi].fail_next_stop = true;
        }
    }

    pub fn write_file(&mut self, ws_id: Uuid, path: &str) {
        if let Some(wi) = self.ws_index(ws_id) {
            let ws = &mut self.workspaces[wi];
            if path.starts_with("/tmp/") { ws.tmp_files.push(path.into()) } else { ws.home_files.push(path.into()) }
        }
    }

    /// `PUT /api/v2/workspaces/{id}/extend` as `by` (a user index), with `putExtendWorkspace`'s
    /// checks in its order (NOTES §16; the 30-minute rule in wall-clock time, like deadlines). A caller that may read
    /// but not update the workspace gets the 500 dbauthz's refusal turns into.
    pub fn extend(&mut self, ws_id: Uuid, deadline: DateTime<Utc>, by: usize) -> Result<String, ApiError> {
        let wi = self.ws_index(ws_id).ok_or_else(|| api_error(404, NOT_FOUND))?;
        if !self.may_read(by, &self.workspaces[wi]) {
            return Err(api_error(404, NOT_FOUND));
        }
        let may_update = self.may_act_on(by, &self.workspaces[wi]);
        // Deadlines here are wall-clock, as TTLs are: so is Coder's 29-minute rule on them.
        let min_ahead = chrono::Duration::minutes(29);
        let now = self.now();
        let ws = &mut self.workspaces[wi];
        if ws.prebuild {
            return Err(api_error(409, "Deadline extension is not supported for prebuilt workspaces"));
        }
        let b = ws.builds.last_mut().ok_or_else(|| api_error(409, "Workspace must be started, current status: stop"))?;
        if b.transition != "start" {
            return Err(api_error(409, &format!("Workspace must be started, current status: {}", b.transition)));
        }
        let Some(completed) = b.job.completed_at else { return Err(api_error(409, "Workspace is still building!")) };
        if b.deadline.is_none() {
            return Err(api_error(409, "Workspace shutdown is manual."));
        }
        if deadline < now + min_ahead {
            return Err(api_error(400, "Cannot extend workspace: new deadline must be at least 30 minutes in the future"));
        }
        if deadline < completed {
            return Err(api_error(400, "Cannot extend workspace: new deadline must be before workspace start time"));
        }
        if b.max_deadline.is_some_and(|max| deadline > max) {
            return Err(api_error(400, "Cannot extend workspace beyond max deadline."));
        }
        if !may_update {
            return Err(api_error(500, "Failed to extend workspace deadline."));
        }
        b.deadline = Some(deadline);
        let name = ws.name.clone();
        let who = self.users[by].username.clone();
        self.log(&name, "deadline_extended", format!("to {deadline} by {who}"));
        Ok(format!("Deadline updated to {}.", deadline.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)))
    }

    /// `PUT /api/v2/workspaces/{id}/ttl`: null or 0 disables autostop; otherwise 1 min..30 days,
    /// truncated to the minute. The current build's deadline is only cleared when disabling.
    pub fn set_ttl(&mut self, ws_id: Uuid, ttl_ms: Option<i64>) -> Result<(), ApiError> {
        let wi = self.ws_index(ws_id).ok_or_else(|| api_error(404, NOT_FOUND))?;
        if !self.config.allow_user_autostop {
            return Err(ApiError {
                status: 400,
                message: "Error updating workspace time until shutdown.".into(),
                detail: "ttl_ms: Custom autostop TTL is not allowed for workspaces using this template.".into(),
            });
        }
        let ws = &mut self.workspaces[wi];
        match ttl_ms.filter(|t| *t != 0) {
            None => {
                ws.ttl_ms = None;
                if let Some(b) = ws.builds.last_mut() {
                    b.deadline = None; // moved to max_deadline, which is zero on AGPL
                }
            }
            Some(t) => {
                let t = t - t % 60_000;
                let detail = if t < 60_000 {
                    Some("time until shutdown must be at least one minute")
                } else if t > 30 * 24 * 3_600_000 {
                    Some("time until shutdown must be less than 30 days")
                } else {
                    None
                };
                if let Some(detail) = detail {
                    return Err(ApiError {
                        status: 400,
                        message: "Error updating workspace time until shutdown.".into(),
                        detail: format!("ttl_ms: {detail}"),
                    });
                }
                ws.ttl_ms = Some(t);
            }
        }
        Ok(())
    }

    /// Stop builds initiated by `user` for a workspace (tests count double stops with it).
    pub fn stop_builds_by(&self, ws_id: Uuid, user: &str) -> usize {
        let Some(ui) = self.user_index(user) else { return 0 };
        self.ws_index(ws_id)
            .map_or(0, |wi| self.workspaces[wi].builds.iter().filter(|b| b.transition == "stop" && b.initiator == ui).count())
    }

    /// The workspace whose pod holds GPU `g`, with its pod name and load.
    pub fn gpu_holder(&self, g: usize) -> Option<(&Workspace, &Pod)> {
        let id = self.gpu_holders.get(g).copied().flatten()?;
        let ws = self.workspaces.iter().find(|w| w.id == id)?;
        Some((ws, ws.pod.as_ref()?))
    }

    /// coderd marks a workspace deleted when its delete build succeeds (`workspaces.deleted`);
    /// its id still answers `/builds`, and `GET /workspaces/{id}` answers 410 unless asked
    /// with `include_deleted=true` (reference/coder/NOTES.md section 17).
    pub fn is_deleted(&self, ws: &Workspace) -> bool {
        ws.latest().is_some_and(|b| b.transition == "delete" && b.job.status == "succeeded")
    }

    /// True when the latest build is a succeeded start (Coder's `status:running`).
    pub fn is_running(&self, ws: &Workspace) -> bool {
        ws.latest().is_some_and(|b| b.transition == "start" && b.job.status == "succeeded")
    }
}
