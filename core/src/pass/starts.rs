//! A workspace whose agent never connected, or lost its connection: whether it is `starting`
//! (kept, no demand), `waiting` for a GPU (demand in `contended` mode), a template's CPU variant
//! (no GPU at all), or lost for good. In `contended` mode every false waiter stops someone's idle
//! GPU, so a start is demand only once its pod could have reported a GPU and did not. Pure; the
//! caller (`decide`) turns the answer into a decision. Facts: reference coder NOTES §12, §15,
//! §19; dcgm NOTES §3 (a pod is listed at the exporter's next collection).

use chrono::{DateTime, Duration, Utc};

use crate::coder::types::{AgentStatus, BuildParameter, Workspace};
use crate::duration::{chrono as dur, human};
use crate::gpu::window::GpuWindow;
use crate::pass::policy::Policy;

/// What a workspace without a connected agent is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Absent {
    /// Kept, not demand: its pod may still get or report its GPU.
    Starting(String),
    /// A pod waiting for a GPU: demand.
    Waiting(String),
    /// Its build's parameters say it has no GPU (a template's CPU variant): never demand.
    CpuVariant(String),
    /// Disconnected for good with no GPU reporting: not demand, `unknown`.
    Lost(String),
}

/// What `absent` reads besides the workspace and its windows.
#[derive(Debug, Clone, Copy)]
pub struct StartFacts<'a> {
    /// This machine's clock and Coder's (`now` plus Coder's offset).
    pub now: DateTime<Utc>,
    pub coder_now: DateTime<Utc>,
    /// Its template is a GPU template: only those wait for a GPU.
    pub gpu_template: bool,
    /// The GPU source's step when it answers in complete steps (Prometheus).
    pub step: Option<std::time::Duration>,
    /// The build parameter that says this build has no GPU, when its parameters were read.
    pub cpu_variant: Option<&'a BuildParameter>,
}

/// Every agent connected once and is now `disconnected`: the pod was evicted or rescheduled,
/// or lost for good. Returns since when the last of them was last seen.
pub fn agent_lost(ws: &Workspace) -> Option<DateTime<Utc>> {
    let mut agents = ws.latest_build.agents().peekable();
    agents.peek()?;
    let mut since: Option<DateTime<Utc>> = None;
    for a in agents {
        if a.first_connected_at.is_some() && a.status == AgentStatus::Disconnected {
            since = since.max(a.disconnected_at.or(a.last_connected_at).or(a.first_connected_at));
        } else {
            return None;
        }
    }
    since
}

/// Build succeeded, but no agent has ever connected: the pod is Pending (no GPU for it, or its
/// volume still binding), or still starting (image pull, container start). Returns when the
/// newest agent was created.
pub fn agent_never_connected(ws: &Workspace) -> Option<DateTime<Utc>> {
    let build = &ws.latest_build;
    let mut agents = build.agents().peekable();
    agents.peek()?;
    let mut created: Option<DateTime<Utc>> = None;
    for a in agents {
        if a.first_connected_at.is_some() || !matches!(a.status, AgentStatus::Connecting | AgentStatus::Timeout) {
            return None;
        }
        created = created.max(a.created_at);
    }
    created.or(build.job.completed_at).or(build.created_at).or(Some(ws.created_at))
}

/// Whether a start is one `absent` may judge waiting (a never-connected or lost agent of a GPU
/// template whose pod reports no fresh GPU): the workspaces whose build parameters are worth
/// reading before the pass decides.
pub fn may_wait(ws: &Workspace, windows: &[GpuWindow], now: DateTime<Utc>, policy: &Policy) -> bool {
    (agent_never_connected(ws).is_some() || agent_lost(ws).is_some()) && !fresh_gpu(windows.iter(), now, policy)
}

fn fresh_gpu<'w>(mut windows: impl Iterator<Item = &'w GpuWindow>, now: DateTime<Utc>, policy: &Policy) -> bool {
    windows.any(|w| w.last_at().is_some_and(|t| now - t <= dur(policy.stale_after)))
}

/// How long a start may take before a never-connected agent whose pod holds a GPU is judged by
/// it: the policy's `start_allowance`, or the agents' `connection_timeout` when that is longer.
pub fn start_allowance(ws: &Workspace, policy: &Policy) -> Duration {
    let timeout = ws.latest_build.agents().map(|a| a.connection_timeout_seconds).max().unwrap_or(0);
    dur(policy.start_allowance).max(Duration::seconds(timeout.max(0)))
}

/// A workspace whose agent never connected, or lost its connection (`None`: it is judged by its
/// GPUs: its agents are connected, it is no GPU template's, or its pod reports a GPU past
/// `start_allowance`).
/// - A young start whose pod already reports a GPU is starting (image pull, container start).
/// - A start whose agent is still `connecting` and whose pod reports no GPU is starting until one
///   exporter collection plus `bind_allowance` after its agent was created (its volume binds
///   first on a `WaitForFirstConsumer` class, then the pod is admitted, then the exporter lists
///   it); behind Prometheus, until a complete step begins after that moment.
/// - A CPU variant (its build's parameters say no GPU) is never waiting.
/// - Otherwise it waits for a GPU, until an agent lost for `agent_lost_after` is lost for good.
pub fn absent(ws: &Workspace, windows: &[&GpuWindow], policy: &Policy, facts: StartFacts<'_>) -> Option<Absent> {
    let StartFacts { now, coder_now, gpu_template, step, cpu_variant } = facts;
    if !gpu_template {
        return None;
    }
    let fresh_gpu = fresh_gpu(windows.iter().copied(), now, policy);
    let cpu = |what: &str| {
        cpu_variant.map(|p| {
            Absent::CpuVariant(format!(
                "its build's parameter {:?} = {:?} says it has no GPU (a CPU variant of its template, gpu_parameters): {what}, not waiting for a GPU",
                p.name, p.value
            ))
        })
    };
    if let Some(created) = agent_never_connected(ws) {
        let age = (coder_now - created).max(Duration::zero());
        let allowance = start_allowance(ws, policy);
        if fresh_gpu && age < allowance {
            return Some(Absent::Starting(format!(
                "starting for {}: its pod already reports a GPU, its agent has not connected yet (image pull, container start; allowance {})",
                human(age),
                human(allowance)
            )));
        }
        // Past the allowance with its pod reporting a GPU (an image that never pulls, a
        // crash-looping entrypoint: kubelet keeps the device allocated): not waiting, it holds
        // a GPU, and is judged by it like any other workspace.
        if fresh_gpu {
            return None;
        }
        if let Some(not_waiting) = cpu("its agent has not connected yet") {
            return Some(not_waiting);
        }
        let connecting = ws.latest_build.agents().all(|a| a.status == AgentStatus::Connecting);
        let first_report = dur(policy.first_report_allowance());
        if let Some(step) = step {
            if !before_a_complete_step(now, created - (coder_now - now), step, policy).is_zero() {
                return Some(Absent::Starting(format!(
                    "starting: behind Prometheus no complete {} step has begun since its pod could report a GPU (its agent's creation plus one exporter collection and bind_allowance, {}); not counted as waiting yet",
                    human(dur(step)),
                    human(first_report)
                )));
            }
        } else if connecting && age < first_report {
            return Some(Absent::Starting(format!(
                "starting for {}: its pod reports no GPU yet (its volume may still bind, the exporter lists a pod at its next collection); not counted as waiting for {} (exporter_collect_interval plus bind_allowance)",
                human(age),
                human(first_report)
            )));
        }
        return Some(Absent::Waiting("started, but its agent never connected: the pod is waiting for a GPU".into()));
    }
    let since = agent_lost(ws).filter(|_| !fresh_gpu)?;
    if let Some(not_waiting) = cpu("its agent lost its connection") {
        return Some(not_waiting);
    }
    let lost_for = (coder_now - since).max(Duration::zero());
    if lost_for >= dur(policy.agent_lost_after) {
        return Some(Absent::Lost(format!(
            "its agent has been disconnected for {} and no GPU reports for it: the pod is gone for good (a bare pod after an eviction, a lost node?); not counted as waiting; restart or stop it in Coder",
            human(lost_for)
        )));
    }
    Some(Absent::Waiting(
        "its agent lost its connection and no GPU reports for it: the pod was evicted or rescheduled and waits for a GPU".into(),
    ))
}

/// How long until the GPU source's newest complete step began after a pod created at `created`
/// (this machine's clock) could report a GPU: dcgm-exporter maps GPUs to pods at a collection,
/// so one `exporter_collect_interval` after creation, after `bind_allowance` for its volume, and
/// Prometheus answers for complete steps only (`max_over_time` at step ends up to now). Zero once
/// the source can have seen the pod.
fn before_a_complete_step(now: DateTime<Utc>, created: DateTime<Utc>, step: std::time::Duration, policy: &Policy) -> Duration {
    let s = i64::try_from(step.as_secs()).unwrap_or(i64::MAX).max(1);
    let could_report = (created + dur(policy.first_report_allowance())).timestamp();
    let first_step_start = could_report.div_euclid(s) * s + if could_report.rem_euclid(s) == 0 { 0 } else { s };
    let newest_complete_end = now.timestamp().div_euclid(s) * s;
    Duration::seconds((first_step_start + s - newest_complete_end).max(0))
}
