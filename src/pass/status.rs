//! The status document: what `GET /api/v1/workspaces` serves and `plan --output json` prints,
//! one entry per running workspace. It holds no token and no secret.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::coder::types::{CoderId, Workspace};
use crate::duration::human;
use crate::gpu::GpuKey;
use crate::gpu::signals::Signal;
use crate::gpu::window::GpuWindow;
use crate::pass::accounting::AccountingSummary;
use crate::pass::actuator::{NoProvisioner, StuckStop};
use crate::pass::deadline::{DeadlineAction, DeadlinePlan};
use crate::pass::decide::{Decision, Reason, SampleContext, SampleState, Verdict, classify};
use crate::pass::mode::{Mode, limit_reached};
use crate::pass::outside::HeldOutside;
use crate::pass::policy::Policy;

/// The latest reading of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuSummary {
    /// The window's own (`Arc`: the document holds no copy of its strings).
    #[serde(flatten)]
    pub key: std::sync::Arc<GpuKey>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<std::sync::Arc<str>>,
    pub samples: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_sample_at: Option<DateTime<Utc>>,
    pub state: SampleState,
    pub gpu_util: Option<f64>,
    pub sm_active: Option<f64>,
    pub gr_engine_active: Option<f64>,
    pub fb_used_mib: Option<f64>,
    pub power_watts: Option<f64>,
}

impl GpuSummary {
    pub fn new(w: &GpuWindow, p: &Policy) -> Self {
        let latest = w.latest_values().copied().unwrap_or_default();
        // Rounded for people; the values are f32 underneath.
        let show = |s: Signal| latest.get(s).map(|v| (v * 1e4).round() / 1e4);
        GpuSummary {
            key: w.key.clone(),
            model: w.model.clone(),
            samples: w.samples.len(),
            last_sample_at: w.last_at(),
            state: classify(&latest, p, SampleContext::of(w, p)),
            gpu_util: show(Signal::GpuUtil),
            sm_active: show(Signal::SmActive),
            gr_engine_active: show(Signal::GrEngineActive),
            fb_used_mib: show(Signal::FbUsedMib),
            power_watts: show(Signal::PowerWatts),
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StatusDocument {
    pub generated_at: DateTime<Utc>,
    pub mode: &'static str,
    /// Set while the circuit breaker refuses stops.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker: Option<String>,
    /// Coder's clock minus this service's; Coder's timestamps are judged by Coder's clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coder_clock_offset_seconds: Option<i64>,
    /// What was given back and who waits, counted while the service runs.
    pub accounting: AccountingSummary,
    /// Stop builds pending past `stop_timeout` (no provisioner took them); not sent again while
    /// they are pending.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stuck_stops: Vec<StuckStop>,
    /// Stops that wait for a provisioner matching their job's tags (none is available): they
    /// are not sent again meanwhile, nor are new stops that need the same tags.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub no_provisioner: Vec<NoProvisioner>,
    /// Workspaces whose pods report a GPU while Coder does not list them running (a canceled,
    /// failed or stuck stop): nobody sees them in Coder and no autostop stops them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held_outside: Vec<HeldOutside>,
    /// Per GPU pool (the config's `pool` keys; one, `default`, without them): who waits there and
    /// who is idle there. In `contended` mode only a pool's own idle workspaces are stopped for
    /// its waiters.
    pub pools: Vec<PoolStatus>,
    /// Workspace GPU keys more than one scrape target reported this pass (the first few): a
    /// forged copy of a GPU looks like this, where a store lets others write.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub twins: Vec<crate::gpu::Twin>,
    /// What keeps the service from seeing: scrape jobs that cannot be told apart, a GPU source
    /// that answers while no running workspace maps to its series (absent when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// Behind Prometheus: the scrape jobs whose series are read, and how they were chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_jobs: Option<crate::gpu::source::JobsRead>,
    /// Caveats about this document (for example, a short sampling history in `plan`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    pub workspaces: Vec<WorkspaceStatus>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkspaceStatus {
    pub id: CoderId,
    pub name: String,
    pub owner: String,
    pub template: String,
    pub verdict: Verdict,
    pub reason: Reason,
    pub message: String,
    pub gpu_idle_seconds: Option<i64>,
    pub connection_idle_seconds: i64,
    pub last_used_at: DateTime<Utc>,
    pub stop_at: Option<DateTime<Utc>>,
    /// Coder's autostop deadline of the running build (Coder's clock; absent: autostop off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// `extend_while_busy`: the GPU computes with nobody connected, and what that does to
    /// Coder's deadline. Boxed: few workspaces have one, and every entry would hold its 80 bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_running: Option<Box<KeptRunning>>,
    pub gpus: Vec<GpuSummary>,
    /// Compute activity over the window, oldest first, 0..=100 (the busiest GPU per sample; the
    /// best compute signal: SM_ACTIVE, else GR_ENGINE_ACTIVE, else utilization). For the status
    /// page's sparkline; not in the JSON.
    #[serde(skip)]
    pub activity: Vec<u8>,
}

/// One pool's demand and supply in the latest pass.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PoolStatus {
    pub pool: String,
    /// Workspaces waiting for a GPU in this pool.
    pub waiting: usize,
    /// Its idle workspaces: to be stopped, or kept because nobody waits in this pool.
    pub idle: usize,
}

/// A busy workspace's deadline, as the status document shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KeptRunning {
    /// `extend` (an extension is due this pass), `ahead` (far enough ahead for now) or
    /// `limit_reached` (no extension of 30 minutes or more is left: Coder stops it at `deadline`).
    pub action: &'static str,
    /// Coder's deadline after this pass (Coder's clock): moved only when this pass moved it.
    pub until: DateTime<Utc>,
    /// The latest the service moves the deadline to, and what sets it.
    pub limit: DateTime<Utc>,
    pub limited_by: &'static str,
    /// The line people read (phrased by the mode).
    pub text: String,
}

impl KeptRunning {
    /// `sent`: this pass moved the deadline to the plan's (enforce mode); otherwise it stays
    /// where Coder has it.
    pub fn new(plan: &DeadlinePlan, mode: Mode, sent: bool) -> Self {
        let until = match plan.action {
            DeadlineAction::Extend { to } if sent => to,
            _ => plan.deadline,
        };
        let (action, text) = match plan.action {
            DeadlineAction::Ahead => ("ahead", mode.kept_running(plan.deadline, plan.deadline, sent)),
            DeadlineAction::Extend { to } => ("extend", mode.kept_running(to, plan.deadline, sent)),
            DeadlineAction::LimitReached => ("limit_reached", limit_reached(plan.deadline, plan.limited_by.as_str())),
        };
        KeptRunning { action, until, limit: plan.limit, limited_by: plan.limited_by.as_str(), text }
    }
}

/// A sample's compute level, 0..=100, by the best compute signal it has.
fn compute_level(v: &crate::gpu::signals::SignalValues) -> u8 {
    let level = v.compute().map_or(0.0, |(_, x)| x);
    (level.clamp(0.0, 1.0) * 100.0).round() as u8
}

/// The busiest GPU's level per sample, aligned on the newest sample.
fn activity(gpus: &[GpuWindow]) -> Vec<u8> {
    let len = gpus.iter().map(|w| w.samples.len()).max().unwrap_or(0);
    (0..len)
        .map(|i| {
            gpus.iter()
                .filter_map(|w| w.samples.len().checked_sub(len - i).and_then(|j| w.samples.values_at(j)).map(compute_level))
                .max()
                .unwrap_or(0)
        })
        .collect()
}

impl WorkspaceStatus {
    pub fn new(ws: &Workspace, d: &Decision, gpus: Option<&[GpuWindow]>, policy: &Policy) -> Self {
        WorkspaceStatus {
            id: ws.id.as_str().into(),
            name: ws.name.clone(),
            owner: ws.owner_name.clone(),
            template: ws.template_name.clone(),
            verdict: d.verdict,
            reason: d.reason,
            message: d.message.clone(),
            gpu_idle_seconds: d.gpu_idle.map(|g| g.num_seconds()),
            connection_idle_seconds: d.connection_idle.num_seconds(),
            last_used_at: ws.last_used_at,
            stop_at: d.stop_at,
            deadline: ws.latest_build.deadline,
            kept_running: None,
            gpus: gpus.map_or_else(Vec::new, |g| g.iter().map(|w| GpuSummary::new(w, policy)).collect()),
            activity: gpus.map_or_else(Vec::new, activity),
        }
    }

    /// One line for a Coder agent metadata item, e.g. "reclaim (idle): GPU idle 41m, ...".
    pub fn one_line(&self) -> String {
        format!("{} ({}): {}", self.verdict.as_str(), self.reason.as_str(), self.message_with_deadline())
    }

    /// The message, and what happens to Coder's deadline when that is said (`kept_running`).
    pub fn message_with_deadline(&self) -> String {
        match &self.kept_running {
            Some(k) => format!("{}; {}", self.message, k.text),
            None => self.message.clone(),
        }
    }
}

impl StatusDocument {
    pub fn empty(mode: &'static str) -> Self {
        StatusDocument {
            generated_at: DateTime::UNIX_EPOCH,
            mode,
            breaker: None,
            coder_clock_offset_seconds: None,
            accounting: AccountingSummary::default(),
            stuck_stops: Vec::new(),
            no_provisioner: Vec::new(),
            held_outside: Vec::new(),
            pools: Vec::new(),
            twins: Vec::new(),
            problems: Vec::new(),
            gpu_jobs: None,
            notes: Vec::new(),
            workspaces: Vec::new(),
        }
    }

    /// An aligned table for people (`plan --output table`; Coder's names with their control
    /// characters written out).
    pub fn table(&self) -> String {
        crate::logging::terminal_safe(self.table_text())
    }

    fn table_text(&self) -> String {
        let header = ["WORKSPACE", "OWNER", "TEMPLATE", "VERDICT", "REASON", "GPU IDLE", "LAST USED", "GPUS", "WHY"];
        let rows: Vec<[String; 9]> = self
            .workspaces
            .iter()
            .map(|w| {
                [
                    w.name.clone(),
                    w.owner.clone(),
                    w.template.clone(),
                    w.verdict.as_str().to_string(),
                    w.reason.as_str().to_string(),
                    w.gpu_idle_seconds.map_or("-".into(), |s| human(chrono::Duration::seconds(s))),
                    format!("{} ago", human(chrono::Duration::seconds(w.connection_idle_seconds))),
                    w.gpus.len().to_string(),
                    w.message_with_deadline(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for r in &rows {
            for (i, c) in r.iter().enumerate() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        let mut line = |cells: &[String]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    s.push_str(c);
                } else {
                    s.push_str(&format!("{c:<w$}  ", w = widths[i]));
                }
            }
            out.push_str(s.trim_end());
            out.push('\n');
        };
        line(&header.map(String::from));
        for r in &rows {
            line(r);
        }
        if self.workspaces.is_empty() {
            out.push_str("(no running workspaces)\n");
        }
        if self.pools.len() > 1 {
            for p in &self.pools {
                out.push_str(&format!("\npool {}: {} waiting, {} idle\n", p.pool, p.waiting, p.idle));
            }
        }
        if let Some(b) = &self.breaker {
            out.push_str(&format!("\ncircuit breaker: {b}\n"));
        }
        for n in &self.no_provisioner {
            out.push_str(&format!("\n{}\n", n.words()));
        }
        for h in &self.held_outside {
            out.push_str(&format!("\n{}\n", h.words()));
        }
        for p in &self.problems {
            out.push_str(&format!("\nproblem: {p}\n"));
        }
        for s in &self.stuck_stops {
            out.push_str(&format!("\nstuck stop: {}/{} build {} pending since {}\n", s.owner, s.workspace, s.build_id, s.pending_since));
        }
        for n in &self.notes {
            out.push_str(&format!("\nnote: {n}\n"));
        }
        out
    }
}
