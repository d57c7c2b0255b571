//! The decisions. `decide` judges one workspace from its Coder record, its GPU windows, the
//! policy and `now`; `fleet::apply_fleet_rules` then applies what needs the whole fleet
//! (contention, the stop cap, the circuit breaker). Pure: no I/O, no clock reads, no randomness, so every
//! rule is table-tested. Missing data never leads to a stop.

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::coder::types::{BuildParameter, JobStatus, TemplateSchedule, Transition, Workspace};
use crate::duration::{chrono as dur, human};
use crate::gpu::signals::{Signal, SignalValues};
use crate::gpu::window::GpuWindow;
use crate::gpu::{Attribution, GpuKey, GpuSeries};
use crate::pass::deadline::{self, CONNECTED_WITHIN, DeadlinePlan, GpuEvidence};
use crate::pass::policy::{Policy, Thresholds};
use crate::pass::starts::{Absent, StartFacts, absent, agent_never_connected};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Skip,
    Waiting,
    Unknown,
    Keep,
    Warn,
    Reclaim,
}

impl Verdict {
    pub const ALL: [Verdict; 6] = [Verdict::Skip, Verdict::Waiting, Verdict::Unknown, Verdict::Keep, Verdict::Warn, Verdict::Reclaim];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Skip => "skip",
            Verdict::Waiting => "waiting",
            Verdict::Unknown => "unknown",
            Verdict::Keep => "keep",
            Verdict::Warn => "warn",
            Verdict::Reclaim => "reclaim",
        }
    }
}

/// Stable, machine-readable reason codes (status API, metric labels, logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    NotRunning,
    BuildActive,
    Prebuild,
    Task,
    Excluded,
    NoPermission,
    NoGpu,
    WaitingForGpu,
    AgentLost,
    NoGpuData,
    SampleGap,
    StaleData,
    FrozenData,
    MetricsDisagree,
    NoDeviceSeries,
    TooManyGpuSeries,
    GpuChanged,
    GpuActive,
    Connected,
    Starting,
    WarmingUp,
    NotIdleLongEnough,
    NoContention,
    Idle,
    MemoryHeldIdle,
    PhantomUtilization,
    ConnectedButGpuIdle,
    MaxLifetime,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotRunning => "not-running",
            Reason::BuildActive => "build-active",
            Reason::Prebuild => "prebuild",
            Reason::Task => "task",
            Reason::Excluded => "excluded",
            Reason::NoPermission => "no-permission",
            Reason::NoGpu => "no-gpu",
            Reason::WaitingForGpu => "waiting-for-gpu",
            Reason::AgentLost => "agent-lost",
            Reason::NoGpuData => "no-gpu-data",
            Reason::SampleGap => "sample-gap",
            Reason::StaleData => "stale-data",
            Reason::FrozenData => "frozen-data",
            Reason::MetricsDisagree => "metrics-disagree",
            Reason::NoDeviceSeries => "no-device-series",
            Reason::TooManyGpuSeries => "too-many-gpu-series",
            Reason::GpuChanged => "gpu-changed",
            Reason::GpuActive => "gpu-active",
            Reason::Connected => "connected",
            Reason::Starting => "starting",
            Reason::WarmingUp => "warming-up",
            Reason::NotIdleLongEnough => "not-idle-long-enough",
            Reason::NoContention => "no-contention",
            Reason::Idle => "idle",
            Reason::MemoryHeldIdle => "memory-held-idle",
            Reason::PhantomUtilization => "phantom-utilization",
            Reason::ConnectedButGpuIdle => "connected-but-gpu-idle",
            Reason::MaxLifetime => "max-lifetime",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub workspace_id: String,
    pub verdict: Verdict,
    pub reason: Reason,
    pub message: String,
    /// How long every GPU of the workspace has been continuously not compute-active.
    pub gpu_idle: Option<Duration>,
    /// now - last_used_at.
    pub connection_idle: Duration,
    /// While warning: when the stop is due.
    pub stop_at: Option<DateTime<Utc>>,
    /// `restore_autostop`: the TTL to set back, when the user's is off or longer.
    pub restore_ttl_ms: Option<i64>,
    /// `extend_while_busy`: Coder's deadline of a workspace kept because its GPU computes with
    /// nobody connected, and whether to move it this pass (`pass::deadline`).
    pub deadline: Option<Box<DeadlinePlan>>,
    /// Its GPU pool: an index into `Policy::pools` (`pool` of its rule, else the default).
    pub pool: usize,
    /// `countdown_in_coder` of its rule, for a workspace judged stop-eligible: its reclaim is
    /// Coder's countdown (`pass::countdown`), not a stop of the service's own.
    pub countdown: Option<std::time::Duration>,
}

impl Decision {
    pub fn is_stop_eligible(&self) -> bool {
        matches!(self.verdict, Verdict::Warn | Verdict::Reclaim)
    }
}

/// What one sample says about compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SampleState {
    Active,
    Idle,
    /// Utilization claims work the SMs or the memory say is not there.
    Phantom,
    /// No compute signal at all in this sample.
    NoCompute,
}

/// What a sample is read with besides its values: the power veto for its model, and whether
/// its memory reading is a sharer's own compute processes' (`Attribution::OwnProcesses`: an
/// empty one proves nothing, a graphics process holds memory that is not counted there).
#[derive(Debug, Clone, Copy, Default)]
pub struct SampleContext {
    pub active_power_watts: Option<f64>,
    pub own_processes: bool,
}

impl SampleContext {
    /// A MIG instance gets no power veto: every instance reports the whole GPU's power
    /// (reference dcgm NOTES §10 "MIG"), so a threshold says nothing about one instance.
    pub fn of(w: &GpuWindow, p: &Policy) -> Self {
        Self::for_gpu(&w.key, w.model.as_deref(), w.attribution, p)
    }

    /// The same for a series' raw points (the backtest reads a stopped workspace's GPU after
    /// its simulated stop, outside any window).
    pub fn of_series(s: &GpuSeries, p: &Policy) -> Self {
        Self::for_gpu(&s.key, s.model.as_deref(), s.attribution, p)
    }

    fn for_gpu(key: &GpuKey, model: Option<&str>, attribution: Attribution, p: &Policy) -> Self {
        let active_power_watts = if key.gpu_instance.is_some() { None } else { p.active_power_for(model) };
        SampleContext { active_power_watts, own_processes: attribution == Attribution::OwnProcesses }
    }
}

/// Classifies one sample by the best compute signal it has: SM_ACTIVE, else GR_ENGINE_ACTIVE,
/// else utilization. Video encode or decode at the utilization minimum is work, and so is device
/// memory busy (copy-only work: memcpy or peer-to-peer traffic without kernels, reference dcgm
/// NOTES §10) and drawing the model's `active_power_watts`. Utilization or GR_ENGINE_ACTIVE
/// claiming work that SM_ACTIVE does not show is phantom (a one-thread kernel, or a light one:
/// GR ≈ d, SM ≈ d / SMs), and so is utilization above zero on an (almost) empty framebuffer.
/// A sharer of a time-sliced GPU reads the device's memory (a real reading: an empty one is
/// empty), or its own compute processes' (`own_processes`: never taken as empty).
pub fn classify(v: &SignalValues, p: &Policy, ctx: SampleContext) -> SampleState {
    let util = v.get(Signal::GpuUtil);
    let gr = v.get(Signal::GrEngineActive);
    let video = [Signal::EncUtil, Signal::DecUtil].into_iter().any(|s| v.get(s).is_some_and(|x| x >= p.gpu_util_min));
    let copying = v.get(Signal::DramActive).is_some_and(|x| x >= p.sm_active_min);
    let power = ctx.active_power_watts.is_some_and(|min| v.get(Signal::PowerWatts).is_some_and(|w| w >= min));
    if video || copying || power {
        return SampleState::Active;
    }
    let compute_active = match v.compute() {
        Some((Signal::SmActive, sm)) => sm >= p.sm_active_min,
        Some((Signal::GrEngineActive, gr)) => gr >= p.gr_engine_active_min,
        Some((_, u)) => u >= p.gpu_util_min,
        None => return SampleState::NoCompute,
    };
    let empty_memory = !ctx.own_processes && v.get(Signal::FbUsedMib).is_some_and(|fb| fb < p.empty_memory_mib);
    let claims_work = util.is_some_and(|u| u >= p.gpu_util_min) || gr.is_some_and(|g| g >= p.gr_engine_active_min);
    if compute_active && !empty_memory {
        SampleState::Active
    } else if claims_work || (empty_memory && util.is_some_and(|u| u > 0.0)) {
        SampleState::Phantom
    } else {
        SampleState::Idle
    }
}

/// As many SMs as any GPU has (H100 SXM 132, B200 148, B300 160; reference dcgm NOTES §11.5): a
/// kernel keeping the GR engine busy a fraction d of the time keeps at least one SM busy as
/// long, so SM_ACTIVE ≥ d / this.
const MOST_SMS_OF_ANY_GPU: f64 = 160.0;

/// How far below one SM's share SM_ACTIVE may read before it contradicts GR_ENGINE_ACTIVE: the
/// seed's one-thread kernel on an 80-SM A10G read SM 0.012 at GR 1.0, 0.96 of one SM's 0.0125,
/// so on 160 SMs the same kernel reads 0.006, under 1 / 160; six-decimal printing
/// (`gpu_collector.go` `toString`) and f32 samples take a little more (GR 0.070000, SM 0.000437:
/// 0.06992). A stuck counter reads 0 (DCGM #244): half a share leaves room for all of it.
const ONE_SM_SHARE_FLOOR: f64 = 0.5;

/// SM_ACTIVE below what one SM would show while GR_ENGINE_ACTIVE reads busy, beyond what
/// measurement and printing could explain.
fn sm_below_one_sms_share(sm: f64, gr: f64) -> bool {
    sm * MOST_SMS_OF_ANY_GPU < gr * ONE_SM_SHARE_FLOOR
}

/// A counter that contradicts another in one sample: SM_ACTIVE below what even one SM would
/// show for the time GR_ENGINE_ACTIVE is busy, or the chosen compute signal at zero while the
/// tensor pipes are busy. SM_ACTIVE near zero with GR_ENGINE_ACTIVE a little busy is no
/// contradiction: a one-block kernel busy a fraction d of the time reads GR ≈ d and SM ≈ d / SMs,
/// an honest light kernel (reference dcgm NOTES §10). An empty framebuffer settles it: no
/// process, so the busy readings are phantom, not stuck.
fn contradiction(v: &SignalValues, p: &Policy) -> Option<&'static str> {
    if v.get(Signal::FbUsedMib).is_some_and(|fb| fb < p.empty_memory_mib) {
        return None;
    }
    if let (Some(sm), Some(gr)) = (v.get(Signal::SmActive), v.get(Signal::GrEngineActive)) {
        if gr >= p.gr_engine_active_min && sm_below_one_sms_share(sm, gr) {
            return Some("SM_ACTIVE reads less than half of one SM's share while GR_ENGINE_ACTIVE says busy (a stuck profiling counter?)");
        }
    }
    let compute_zero = v.compute().is_some_and(|(_, x)| x <= p.about_zero);
    if compute_zero && v.get(Signal::TensorActive).is_some_and(|x| x >= p.sm_active_min) {
        return Some("the compute counter reads zero while the tensor pipes are busy (a stuck counter?)");
    }
    None
}

/// Why a GPU's utilization and memory are not its own readings but virtual-GPU placeholders with
/// no device-level series to read instead (reference dcgm NOTES §11.3: behind Prometheus the
/// empty `pod_uid` that marks them is dropped at ingestion, and a relabeling or selector on
/// workload labels leaves the device-level series out): a time-sliced sharer without it, or an
/// exclusive GPU whose utilization and memory read exactly zero while its profiling fields (the
/// device's) show compute. In the default layout that sample cannot happen (a kernel holds a
/// context, and memory with it), so nothing there is read as this.
fn without_the_device_series<'a>(w: &GpuWindow, mut values: impl Iterator<Item = &'a SignalValues>, p: &Policy) -> Option<&'static str> {
    if w.attribution == Attribution::DeviceSeriesMissing {
        return Some(
            "a time-sliced GPU's per-pod copies without the device-level GPU_UTIL/FB_USED series: the pod's own utilization and memory read 0 whatever runs; keep the exporter's series without a workload pod in the store (the relabeling, prometheus_selector)",
        );
    }
    values.any(|v| placeholders_beside_compute(v, p)).then_some(
        "utilization and memory read exactly 0 while the profiling fields show compute: virtual-GPU per-pod copies without the device-level series; keep the exporter's series without a workload pod in the store (the relabeling, prometheus_selector)",
    )
}

/// A sample whose utilization and memory read exactly 0 while its profiling fields show compute:
/// the shape of virtual-GPU per-pod copies read without their device-level series.
/// (A MIG instance has no utilization field: its memory alone is the copy.)
pub fn placeholders_beside_compute(v: &SignalValues, p: &Policy) -> bool {
    let computes = v.get(Signal::SmActive).is_some_and(|x| x >= p.sm_active_min)
        || v.get(Signal::GrEngineActive).is_some_and(|x| x >= p.gr_engine_active_min);
    v.get(Signal::GpuUtil).is_none_or(|u| u == 0.0) && v.get(Signal::FbUsedMib) == Some(0.0) && computes
}

/// GR_ENGINE_ACTIVE at zero while utilization says busy, in two consecutive samples (one could
/// be two readings taken at slightly different moments).
fn gr_stuck<'a>(samples: impl Iterator<Item = &'a SignalValues>, p: &Policy) -> bool {
    let one = |v: &SignalValues| {
        v.get(Signal::FbUsedMib).is_none_or(|fb| fb >= p.empty_memory_mib)
            && v.get(Signal::GrEngineActive).is_some_and(|g| g <= p.about_zero)
            && v.get(Signal::GpuUtil).is_some_and(|u| u >= p.gpu_util_min)
    };
    // Two such samples in a row.
    let mut previous = false;
    samples.map(one).any(|now| std::mem::replace(&mut previous, now) && now)
}

#[derive(Clone, Copy)]
struct Builder<'a> {
    ws: &'a Workspace,
    connection_idle: Duration,
    pool: usize,
}

impl Builder<'_> {
    fn out(self, verdict: Verdict, reason: Reason, message: String, gpu_idle: Option<Duration>) -> Decision {
        Decision {
            workspace_id: self.ws.id.clone(),
            verdict,
            reason,
            message,
            gpu_idle,
            connection_idle: self.connection_idle,
            stop_at: None,
            restore_ttl_ms: None,
            deadline: None,
            pool: self.pool,
            countdown: None,
        }
    }
}

/// The token may not stop workspaces in this workspace's organization: it is not judged (no
/// stop would be accepted), but a waiting one still counts as demand (GPUs are the cluster's,
/// not an organization's), and one that is not running stays as it was.
pub fn without_stop_permission(d: &mut Decision, organization: &str) {
    if matches!(d.verdict, Verdict::Waiting | Verdict::Skip) {
        return;
    }
    d.verdict = Verdict::Skip;
    d.reason = Reason::NoPermission;
    d.message = format!(
        "the token may not stop workspaces in organization {organization:?} (authcheck per organization): give its user the organization-admin role there, or use an owner's token"
    );
    d.stop_at = None;
    d.restore_ttl_ms = None;
    d.deadline = None;
}

/// Judges one workspace. `prior_stop_at` is the stop time of a warning issued in an earlier
/// pass (grace), which the caller remembers and clears when the verdict is no longer eligible.
/// Coder's timestamps are read on this machine's clock, and its template is a GPU template when
/// `gpu_templates` says so (every template while it is unset); see `decide_with`.
pub fn decide(
    now: DateTime<Utc>,
    ws: &Workspace,
    gpus: Option<&[GpuWindow]>,
    policy: &Policy,
    prior_stop_at: Option<DateTime<Utc>>,
) -> Decision {
    let gpu_template = policy.is_gpu_template(&ws.template_name);
    decide_with(now, ws, gpus, policy, prior_stop_at, PassFacts { gpu_template, ..PassFacts::default() })
}

/// What a pass knows besides a workspace's record and its GPU windows.
#[derive(Debug, Clone, Copy, Default)]
pub struct PassFacts<'a> {
    /// Coder's clock minus this machine's (negative: behind). `last_used_at` and build times
    /// are Coder's, so they are judged against `now + coder_offset`; GPU samples are this
    /// machine's, judged against `now`.
    pub coder_offset: Duration,
    /// The workspace's template is a GPU template (the evaluator's answer: `gpu_templates`, or
    /// while that is unset, a template one of whose workspaces has had a GPU series). Only a GPU
    /// template's workspaces wait for a GPU (demand) or lack GPU data.
    pub gpu_template: bool,
    /// The GPU source's step when it reads history in complete steps (Prometheus): a start is
    /// not waiting before a complete step could have shown its pod.
    pub step: Option<std::time::Duration>,
    /// The latest time a GPU series naming this workspace was refused for being more than
    /// `max_gpus_per_workspace` (`Windows::refused_at`): within the idle window it is judged on
    /// none of its series, never on a subset.
    pub gpu_series_refused_at: Option<DateTime<Utc>>,
    /// Its template's schedule, when read (`GET /api/v2/templates/{id}`): whether a connection
    /// moves the deadline, and how long before it Coder sends its autostop reminder.
    pub template: Option<TemplateSchedule>,
    /// The parameter of its latest build that says it has no GPU (`Policy::cpu_variant`), when
    /// its parameters were read: it never waits for a GPU, and without GPU series it is `no-gpu`.
    pub cpu_variant: Option<&'a BuildParameter>,
    /// One of its GPUs is reported by two scrape targets (a twin: forged, where the store lets
    /// others write): no provenance, so its deadline is never moved for it.
    pub twinned: bool,
    /// When a GPU with another `UUID` appeared on its pod after another was sampled, within
    /// this session (`Windows::changed_at`): judged on none of its series until its next build.
    pub gpu_changed_at: Option<DateTime<Utc>>,
}

/// `decide`, with what the pass knows (`PassFacts`).
pub fn decide_with(
    now: DateTime<Utc>,
    ws: &Workspace,
    gpus: Option<&[GpuWindow]>,
    policy: &Policy,
    prior_stop_at: Option<DateTime<Utc>>,
    facts: PassFacts<'_>,
) -> Decision {
    let PassFacts { coder_offset, gpu_template, step, gpu_series_refused_at, template, cpu_variant, twinned, gpu_changed_at } = facts;
    let coder_now = now + coder_offset;
    let windows: Vec<&GpuWindow> = gpus.map(|g| g.iter().filter(|w| !w.samples.is_empty()).collect()).unwrap_or_default();
    let (th, exempt) = policy.for_workspace(ws);
    let b = Builder { ws, connection_idle: (coder_now - ws.last_used_at).max(Duration::zero()), pool: th.pool };
    let build = &ws.latest_build;
    if build.job.status.is_active() {
        return b.out(
            Verdict::Skip,
            Reason::BuildActive,
            format!("a {} build is {}", build.transition.as_str(), build.job.status.as_str()),
            None,
        );
    }
    if build.transition != Transition::Start || build.job.status != JobStatus::Succeeded {
        let msg = format!("latest build is {} ({})", build.transition.as_str(), build.status.as_str());
        return b.out(Verdict::Skip, Reason::NotRunning, msg, None);
    }
    // A stopped prebuild is never claimed, and Coder creates a replacement that asks for a GPU
    // again; a Pending prebuild is not a person waiting.
    if ws.is_prebuild() {
        return b.out(Verdict::Skip, Reason::Prebuild, "a prebuilt workspace, waiting to be claimed".into(), None);
    }
    // Stopping a Task's workspace pauses an agent mid-work without telling anyone; an exempt one
    // is never judged. Neither is ever stopped, but one waiting for a GPU waits like anyone
    // else: it is demand.
    let not_judged = if ws.task_id.is_some() && !policy.reclaim_tasks {
        Some((Reason::Task, "backs a Coder Task (set reclaim_tasks = true to judge it)"))
    } else if exempt {
        Some((Reason::Excluded, "exempt by a policy rule"))
    } else {
        None
    };
    let absent = absent(ws, &windows, policy, StartFacts { now, coder_now, gpu_template, step, cpu_variant }).map(|a| match a {
        Absent::Starting(why) => b.out(Verdict::Keep, Reason::Starting, why, None),
        Absent::Waiting(why) => b.out(Verdict::Waiting, Reason::WaitingForGpu, why, None),
        Absent::CpuVariant(why) => b.out(Verdict::Skip, Reason::NoGpu, why, None),
        Absent::Lost(why) => b.out(Verdict::Unknown, Reason::AgentLost, why, None),
    });
    match (absent, not_judged) {
        (Some(d), None) => return d,
        (Some(d), Some(_)) if d.verdict == Verdict::Waiting => return d,
        (_, Some((reason, why))) => return b.out(Verdict::Skip, reason, why.into(), None),
        (None, None) => {}
    }
    // With `gpu_templates` set, a workspace of another template has no GPU, whatever series
    // carry its pod's name.
    if !gpu_template && !policy.gpu_templates.is_empty() {
        let why = if windows.is_empty() { "" } else { "; GPU series naming its pod are not read" };
        return b.out(Verdict::Skip, Reason::NoGpu, format!("its template is not in gpu_templates{why}"), None);
    }
    if let Some(at) = gpu_series_refused_at.filter(|t| *t >= now - dur(th.idle_after)) {
        return b.out(
            Verdict::Unknown,
            Reason::TooManyGpuSeries,
            format!(
                "more GPU series than max_gpus_per_workspace named this workspace (latest {}s ago): it is judged on none of them (forged or misconfigured series?)",
                (now - at).num_seconds().max(0)
            ),
            None,
        );
    }
    if let Some(at) = gpu_changed_at {
        return b.out(
            Verdict::Unknown,
            Reason::GpuChanged,
            format!(
                "a GPU with another UUID appeared on its pod {}s ago, after its first GPU was read: a pod gains no device without a restart, so it is a copy (forged series?); judged on none of them until its next build",
                (now - at).num_seconds().max(0)
            ),
            None,
        );
    }
    if windows.is_empty() {
        if let Some(p) = cpu_variant {
            let why = format!(
                "no GPU series maps to this workspace, and its build's parameter {:?} = {:?} says it has none (a CPU variant)",
                p.name, p.value
            );
            return b.out(Verdict::Skip, Reason::NoGpu, why, None);
        }
        if gpu_template && !policy.gpu_templates.is_empty() {
            return b.out(Verdict::Unknown, Reason::NoGpuData, "a GPU template, but no GPU series maps to this workspace".into(), None);
        }
        return b.out(Verdict::Skip, Reason::NoGpu, "no GPU series maps to this workspace".into(), None);
    }
    // A pod whose agent never connected was not used since it was created, but not before it
    // either: its `last_used_at` is the last session's.
    let created = agent_never_connected(ws);
    let b = Builder {
        connection_idle: created.map_or(b.connection_idle, |c| b.connection_idle.min((coder_now - c).max(Duration::zero()))),
        ..b
    };
    let mut d = judge_gpus(now, coder_now, ws, &windows, policy, &th, b);
    if gpu_template && created.is_some() {
        d.message = format!("its agent never connected, but its pod holds a GPU past start_allowance; {}", d.message);
    }
    // Keeping busy work running: only what the GPU itself shows computing in the latest sample
    // (never a power veto alone), on readings that would be enough to judge it idle (enough
    // samples, no gap), and only with nobody connected where the template bumps (Coder moves a
    // connected one's deadline itself; with `activity_bump` 0 nothing does, reference coder
    // NOTES §18). Where the template reminds the owner before autostop, the extension comes
    // before that reminder's window opens, so a kept-alive workspace never gets "will stop soon".
    let span_start = now - dur(th.idle_after);
    let bumps = template.is_none_or(|t| t.bumps());
    if th.extend_while_busy
        && !twinned
        && d.reason == Reason::GpuActive
        && (d.connection_idle >= CONNECTED_WITHIN || !bumps)
        && computes_by_its_readings(&windows, policy)
        && enough_readings(&windows, policy, span_start, now)
    {
        let (th, within) = deadline::ahead_of_reminder(&th, policy.extend_when_within, template.map(|t| t.reminder_lead()));
        d.deadline = deadline::plan(coder_now, &ws.latest_build, &th, within, evidence(&windows, span_start)).map(Box::new);
    }
    if twinned && th.extend_while_busy && d.reason == Reason::GpuActive {
        d.message.push_str("; its deadline is not moved: one of its GPUs is reported by two scrape targets (a twin)");
    }
    if d.is_stop_eligible() {
        d.countdown = th.countdown_in_coder;
    }
    if d.is_stop_eligible() && !th.grace.is_zero() {
        let stop_at = prior_stop_at.unwrap_or(now + dur(th.grace));
        d.stop_at = Some(stop_at);
        if now < stop_at {
            // The countdown is for people; its wording depends on the mode, so the publish step
            // and the actuator phrase it from `stop_at` (decisions do not know the mode).
            d.verdict = Verdict::Warn;
        }
    }
    if let Some(restore) = policy.restore_autostop {
        let want = i64::try_from(restore.as_millis()).unwrap_or(i64::MAX);
        if d.verdict != Verdict::Unknown && ws.ttl_ms.is_none_or(|ttl| ttl <= 0 || ttl > want) {
            d.restore_ttl_ms = Some(want);
        }
    }
    d
}

fn judge_gpus(
    now: DateTime<Utc>,
    coder_now: DateTime<Utc>,
    ws: &Workspace,
    windows: &[&GpuWindow],
    policy: &Policy,
    th: &Thresholds,
    b: Builder<'_>,
) -> Decision {
    let idle_after = dur(th.idle_after);
    let span_start = now - idle_after;
    if let Some(w) = windows.iter().find(|w| w.source_failed) {
        return b.out(Verdict::Unknown, Reason::StaleData, format!("GPU source {} failed this pass", w.source), None);
    }
    let oldest_latest = windows.iter().filter_map(|w| w.last_at()).min().unwrap_or(now);
    if now - oldest_latest > dur(policy.stale_after) {
        return b.out(Verdict::Unknown, Reason::StaleData, format!("newest GPU sample is {} old", human(now - oldest_latest)), None);
    }
    let frozen_after = dur(policy.frozen_limit());
    if let Some((w, since)) = windows.iter().filter_map(|w| w.unchanged_since().map(|t| (w, t))).find(|(_, t)| now - *t > frozen_after) {
        return b.out(
            Verdict::Unknown,
            Reason::FrozenData,
            format!(
                "GPU {}: energy counter not rising for {}: the exporter or hostengine serves cached values",
                w.key.uuid,
                human(now - since)
            ),
            None,
        );
    }
    for w in windows {
        // The samples within the idle window, read a few times over without being copied.
        let values = || w.values_since(span_start);
        let disagreement = if gr_stuck(values(), policy) {
            Some("GR_ENGINE_ACTIVE reads zero while utilization says busy (a stuck profiling counter?)")
        } else {
            values().find_map(|v| contradiction(v, policy))
        };
        if let Some(why) = disagreement {
            return b.out(Verdict::Unknown, Reason::MetricsDisagree, format!("GPU {}: {why}", w.key.uuid), None);
        }
        if let Some(why) = without_the_device_series(w, values(), policy) {
            return b.out(Verdict::Unknown, Reason::NoDeviceSeries, format!("GPU {}: {why}", w.key.uuid), None);
        }
        let ctx = SampleContext::of(w, policy);
        if values().any(|v| classify(v, policy, ctx) == SampleState::NoCompute) {
            return b.out(
                Verdict::Unknown,
                Reason::NoGpuData,
                format!("GPU {}: no compute signal (SM_ACTIVE, GR_ENGINE_ACTIVE or GPU_UTIL)", w.key.uuid),
                None,
            );
        }
    }
    let active_in = |w: &GpuWindow, v: &SignalValues| classify(v, policy, SampleContext::of(w, policy)) == SampleState::Active;
    if windows.iter().any(|w| w.latest_values().is_some_and(|v| active_in(w, v))) {
        return b.out(Verdict::Keep, Reason::GpuActive, "GPU is computing".into(), Some(Duration::zero()));
    }
    let fewest = windows.iter().map(|w| w.count_since(span_start)).min().unwrap_or(0);
    if fewest < policy.min_samples {
        let msg = format!("only {fewest} GPU sample(s) so far, {} needed", policy.min_samples);
        return b.out(Verdict::Unknown, Reason::NoGpuData, msg, None);
    }
    let max_gap = dur(policy.max_sample_gap);
    if let Some(gap) = windows.iter().map(|w| w.longest_gap(span_start, now)).max().filter(|g| *g > max_gap) {
        return b.out(
            Verdict::Unknown,
            Reason::SampleGap,
            format!("a {} gap in GPU samples within the last {}", human(gap), human(idle_after)),
            None,
        );
    }
    // Every GPU is idle now; the workspace has been idle since the latest GPU went idle.
    let idle_since = windows.iter().filter_map(|w| w.idle_since(|s| active_in(w, s), max_gap)).max().unwrap_or(now);
    let gpu_idle = (now - idle_since).max(Duration::zero());
    let conn_idle = b.connection_idle;
    let history_from = windows.iter().filter_map(|w| w.first_at()).max().unwrap_or(now);
    // A reclaim needs fresh data: an idle GPU's energy counter always rises (an idle A10G draws
    // 24 W), so one that has not risen within the idle window proves nothing, however short
    // `idle_after` is against the exporter's collections (frozen detection waits for two).
    let not_rising = windows.iter().find(|w| w.unchanged_since().is_some_and(|t| t <= span_start));
    let reclaim = |reason: Reason, msg: String| {
        match not_rising {
        Some(w) => b.out(
            Verdict::Unknown,
            Reason::FrozenData,
            format!(
                "GPU {}: energy counter not risen within the last {}: a reclaim needs readings that move (the exporter may serve cached values); would be: {msg}",
                w.key.uuid,
                human(idle_after)
            ),
            None,
        ),
        None => b.out(Verdict::Reclaim, reason, msg, Some(gpu_idle)),
    }
    };

    if let Some(max_lifetime) = th.max_lifetime {
        let started = ws.latest_build.job.completed_at.unwrap_or(ws.created_at);
        if coder_now - started >= dur(max_lifetime) {
            let msg = format!(
                "running for {} (max lifetime {}) and the GPU is not computing",
                human(coder_now - started),
                human(dur(max_lifetime))
            );
            return reclaim(Reason::MaxLifetime, msg);
        }
    }
    if gpu_idle >= idle_after && conn_idle >= idle_after {
        let reason = idle_reason(idle_since, windows, policy);
        let what = match reason {
            Reason::PhantomUtilization => "GPU shows utilization but no SM work",
            Reason::MemoryHeldIdle => "GPU memory held, no compute",
            _ => "GPU idle",
        };
        let msg = format!("{what} {}, no connection for {}", human(gpu_idle), human(conn_idle));
        return reclaim(reason, msg);
    }
    if let Some(limit) = th.connected_idle_after.map(dur) {
        if gpu_idle >= limit {
            let msg = format!("GPU idle {} while a connection is open (last used {} ago)", human(gpu_idle), human(conn_idle));
            return reclaim(Reason::ConnectedButGpuIdle, msg);
        }
    }
    if history_from > span_start && gpu_idle < idle_after {
        let msg = format!("watching the GPU for {} of {} before judging idleness", human(now - history_from), human(idle_after));
        return b.out(Verdict::Keep, Reason::WarmingUp, msg, Some(gpu_idle));
    }
    if conn_idle < idle_after {
        let msg = format!("GPU idle {}, but used {} ago (a connection is open or was recently)", human(gpu_idle), human(conn_idle));
        return b.out(Verdict::Keep, Reason::Connected, msg, Some(gpu_idle));
    }
    let msg = format!("GPU idle {} of {}", human(gpu_idle), human(idle_after));
    b.out(Verdict::Keep, Reason::NotIdleLongEnough, msg, Some(gpu_idle))
}

/// Whether a GPU's latest sample computes by its readings alone: the compute rule of the
/// decisions without the power veto (a GPU drawing power is kept, not kept running).
fn computes_by_its_readings(windows: &[&GpuWindow], policy: &Policy) -> bool {
    windows.iter().any(|w| {
        let ctx = SampleContext { active_power_watts: None, ..SampleContext::of(w, policy) };
        w.latest_values().is_some_and(|v| classify(v, policy, ctx) == SampleState::Active)
    })
}

/// At least `min_samples` in the span and no gap longer than `max_sample_gap`: what an idle
/// judgement needs (a computing GPU is kept on its latest sample alone).
fn enough_readings(windows: &[&GpuWindow], policy: &Policy, span_start: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    let max_gap = dur(policy.max_sample_gap);
    windows.iter().all(|w| w.count_since(span_start) >= policy.min_samples && w.longest_gap(span_start, now) <= max_gap)
}

/// The SM_ACTIVE and GR_ENGINE_ACTIVE peaks of every GPU since `from`, to four decimals (the
/// readings are f32 underneath).
fn evidence(windows: &[&GpuWindow], from: DateTime<Utc>) -> GpuEvidence {
    let peak = |signal: Signal| {
        let values = windows.iter().flat_map(|w| w.values_since(from)).filter_map(|v| v.get(signal));
        values.fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x)))).map(|x| (x * 1e4).round() / 1e4)
    };
    GpuEvidence { sm_active_peak: peak(Signal::SmActive), gr_engine_active_peak: peak(Signal::GrEngineActive) }
}

fn idle_reason(idle_since: DateTime<Utc>, windows: &[&GpuWindow], policy: &Policy) -> Reason {
    let phantom = windows.iter().any(|w| {
        let ctx = SampleContext::of(w, policy);
        w.values_since(idle_since).any(|v| classify(v, policy, ctx) == SampleState::Phantom)
    });
    let holds_memory = windows.iter().any(|w| w.latest_value(Signal::FbUsedMib).is_some_and(|fb| fb >= policy.memory_held_mib));
    if phantom {
        Reason::PhantomUtilization
    } else if holds_memory {
        Reason::MemoryHeldIdle
    } else {
        Reason::Idle
    }
}
