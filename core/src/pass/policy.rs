//! The reclaim policy: every threshold the decisions use, `gpu_templates`, and ordered rules
//! that match a workspace by template, owner or name (globs; first match wins) to override
//! thresholds or exempt it. Built from the config file's keys plus flag/env overrides by
//! `config`; read by `decide` (and by the rest of the pass for look-back and prices). Defaults are the design's starting values, not advice.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::coder::types::{BuildParameter, Workspace};

/// Coder refuses a deadline less than 30 minutes ahead (`putExtendWorkspace` checks
/// `now + 29m`, reference coder NOTES §16): no extension is sent for less.
pub const CODER_MIN_AHEAD: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReclaimWhen {
    /// Reclaim every idle GPU workspace.
    #[default]
    Always,
    /// Reclaim only while GPU workspaces wait for a GPU, and only as many as wait.
    Contended,
}

/// The thresholds one workspace is judged by (the policy with its matching rule applied).
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds {
    pub idle_after: Duration,
    pub grace: Duration,
    pub connected_idle_after: Option<Duration>,
    pub max_lifetime: Option<Duration>,
    /// Keeping busy work running: while the GPU computes and nobody is connected, keep Coder's
    /// autostop deadline ahead of now (`pass::deadline`).
    pub extend_while_busy: bool,
    /// The new deadline is now plus this (at least `CODER_MIN_AHEAD`).
    pub extend_by: Duration,
    /// No extension moves the deadline past the build's completion plus this.
    pub extend_limit: Duration,
    /// Its GPU pool: an index into `Policy::pools`.
    pub pool: usize,
    /// Coder's own countdown (`pass::countdown`): a reclaim moves Coder's autostop deadline to
    /// now plus this (at least `CODER_MIN_AHEAD`) and Coder stops the workspace, instead of a
    /// stop of the service's own. Off when `None`.
    pub countdown_in_coder: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub thresholds: Thresholds,
    pub reclaim_when: ReclaimWhen,
    /// When not empty, only these templates (globs) are GPU templates: `waiting` and
    /// `no-gpu-data` apply to them only, and no-GPU workspaces of other templates are skipped.
    pub gpu_templates: Vec<String>,
    pub restore_autostop: Option<Duration>,
    /// A sample is compute-active when SM_ACTIVE reaches this (ratio)...
    pub sm_active_min: f64,
    /// ...or, without SM_ACTIVE, GR_ENGINE_ACTIVE reaches this (ratio)...
    pub gr_engine_active_min: f64,
    /// ...or, with neither, utilization reaches this (ratio; the file says percent).
    pub gpu_util_min: f64,
    /// Utilization with less framebuffer in use than this (MiB) is phantom.
    pub empty_memory_mib: f64,
    /// An idle GPU holding at least this much (MiB) is `memory-held-idle`.
    pub memory_held_mib: f64,
    /// A ratio at or below this reads as zero for the cross-checks (a stuck counter reads 0.000000;
    /// one busy SM of 132 on an H100 is 0.0076, so this is well below one SM).
    pub about_zero: f64,
    /// A GPU whose energy counter has not risen this long (and for at least two
    /// `exporter_collect_interval`s) is `unknown`: the exporter or hostengine serves cached
    /// values. A GPU without the counter is never judged frozen: an idle GPU's other readings do
    /// not change either.
    pub frozen_after: Duration,
    /// dcgm-exporter's `-c` (`DCGM_EXPORTER_INTERVAL`, default 30 s): readings, the energy
    /// counter included, change only once per collection (reference dcgm NOTES §3, §10).
    pub exporter_collect_interval: Duration,
    /// Optional power veto: a GPU of a model matching the glob that draws at least this many
    /// watts is kept (first match wins; off when empty).
    pub active_power_watts: Vec<(String, f64)>,
    /// Optional price of one GPU-hour per GPU model glob (the longest matching glob wins), in
    /// `currency`: when set, GPU-hours given back and spent idle are also shown as money.
    pub gpu_hour_price: Vec<(String, f64)>,
    pub currency: String,
    pub min_samples: usize,
    pub max_sample_gap: Duration,
    pub stale_after: Duration,
    pub max_stops_per_pass: usize,
    /// Deadline extensions sent per pass at most (the soonest deadlines first).
    pub max_extensions_per_pass: usize,
    /// GPU series one workspace may have; more, and it is judged on none (`too-many-gpu-series`).
    pub max_gpus_per_workspace: usize,
    /// An extension is due once Coder's deadline is closer than this: Coder's 30 minutes plus
    /// two pass intervals, so a pass that fails or runs late still leaves one before it passes.
    pub extend_when_within: Duration,
    pub max_idle_fraction: f64,
    /// Judge workspaces that back a Coder Task too (skipped by default: stopping one pauses an
    /// agent mid-work).
    pub reclaim_tasks: bool,
    /// A stop build whose job stays pending this long (no provisioner took it) is reported.
    pub stop_timeout: Duration,
    /// A start whose agent has not connected yet but whose pod already reports a GPU is
    /// `starting` (not waiting) this long after the agent was created, or for the agent's
    /// `connection_timeout` when that is longer: image pulls of GPU images are slow.
    pub start_allowance: Duration,
    /// A first start's pod may report no GPU yet while its volume binds (a `WaitForFirstConsumer`
    /// storage class provisions it only once the pod is scheduled) and until dcgm-exporter's next
    /// collection: a never-connected start whose agent is `connecting` and whose pod reports no
    /// GPU is `starting` (no demand) until its agent's creation plus `exporter_collect_interval`
    /// plus this.
    pub bind_allowance: Duration,
    /// Build parameters (names, matched without case) whose value says whether a workspace of a
    /// template with a GPU variant and a CPU variant has a GPU: `0`, `false`, `none` or empty
    /// mean none (`cpu_variant`).
    pub gpu_parameters: Vec<String>,
    /// An agent disconnected this long with no GPU reporting for it has lost its pod for good
    /// (a bare pod after an eviction, a lost node): it stops counting as demand.
    pub agent_lost_after: Duration,
    pub rules: Vec<Rule>,
    /// The GPU pools, by name: the default one first (`pool`, `"default"` unless set), then
    /// every other one a rule names. In `contended` mode a waiting workspace is demand for its
    /// own pool only.
    pub pools: Vec<String>,
}

/// The build parameter names that usually carry a template's GPU count or kind.
pub const DEFAULT_GPU_PARAMETERS: &[&str] = &["gpu", "gpus", "gpu_count", "num_gpus", "gpu_type"];

/// Parameter values that say "no GPU" (compared trimmed, without case).
const NO_GPU_VALUES: &[&str] = &["0", "false", "none", ""];

/// The default pool's name.
pub const DEFAULT_POOL: &str = "default";

#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Glob on the template name (`*` and `?`).
    #[serde(default)]
    pub template: Option<String>,
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub workspace: Option<String>,
    #[serde(default)]
    pub exempt: bool,
    #[serde(default, with = "crate::duration::opt")]
    pub idle_after: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub grace: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub connected_idle_after: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub max_lifetime: Option<Duration>,
    #[serde(default)]
    pub extend_while_busy: Option<bool>,
    #[serde(default, with = "crate::duration::opt")]
    pub extend_by: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub extend_limit: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub countdown_in_coder: Option<Duration>,
    /// The GPU pool its workspaces wait in and give back to (`contended` mode).
    #[serde(default)]
    pub pool: Option<String>,
}

impl Rule {
    pub fn matches(&self, ws: &Workspace) -> bool {
        let field = |pattern: &Option<String>, value: &str| pattern.as_deref().is_none_or(|p| glob_match(p, value));
        field(&self.template, &ws.template_name) && field(&self.owner, &ws.owner_name) && field(&self.workspace, &ws.name)
    }
}

impl Policy {
    /// Defaults for a pass interval (gap and staleness limits scale with it).
    pub fn defaults(interval: Duration) -> Self {
        Policy {
            thresholds: Thresholds {
                idle_after: Duration::from_secs(30 * 60),
                grace: Duration::ZERO,
                connected_idle_after: None,
                max_lifetime: None,
                extend_while_busy: false,
                // An hour, or longer when passes are so far apart that an hour would not outlast
                // the passes until the next extension (30 minutes plus three intervals).
                extend_by: Duration::from_secs(60 * 60).max(CODER_MIN_AHEAD + interval * 4),
                extend_limit: Duration::from_secs(24 * 60 * 60),
                pool: 0,
                countdown_in_coder: None,
            },
            reclaim_when: ReclaimWhen::Always,
            gpu_templates: Vec::new(),
            restore_autostop: None,
            sm_active_min: 0.05,
            gr_engine_active_min: 0.05,
            gpu_util_min: 0.05,
            empty_memory_mib: 1.0,
            memory_held_mib: 1024.0,
            about_zero: 0.002,
            frozen_after: Duration::from_secs(3 * 60).max(interval * 3),
            exporter_collect_interval: Duration::from_secs(30),
            active_power_watts: Vec::new(),
            gpu_hour_price: Vec::new(),
            currency: "USD".into(),
            min_samples: 3,
            max_sample_gap: interval * 3,
            stale_after: interval * 2,
            max_stops_per_pass: 10,
            max_extensions_per_pass: 50,
            max_gpus_per_workspace: crate::gpu::window::DEFAULT_MAX_GPUS_PER_WORKSPACE,
            extend_when_within: CODER_MIN_AHEAD + interval * 2,
            max_idle_fraction: 0.5,
            reclaim_tasks: false,
            stop_timeout: Duration::from_secs(10 * 60).max(interval),
            start_allowance: Duration::from_secs(10 * 60),
            bind_allowance: Duration::from_secs(30),
            gpu_parameters: DEFAULT_GPU_PARAMETERS.iter().map(|s| (*s).to_string()).collect(),
            agent_lost_after: Duration::from_secs(60 * 60),
            rules: Vec::new(),
            pools: vec![DEFAULT_POOL.to_string()],
        }
    }

    /// The thresholds for one workspace and whether a rule exempts it. The first matching rule
    /// sets the thresholds; the pool is the first matching rule's that names one (so a rule
    /// that only changes `idle_after` keeps a workspace in the pool a later rule gives it).
    pub fn for_workspace(&self, ws: &Workspace) -> (Thresholds, bool) {
        let mut t = self.thresholds.clone();
        if self.pools.len() > 1 {
            let pool = self.rules.iter().filter(|r| r.pool.is_some() && r.matches(ws)).find_map(|r| r.pool.as_ref());
            t.pool = pool.and_then(|p| self.pools.iter().position(|name| name == p)).unwrap_or(0);
        }
        let Some(rule) = self.rules.iter().find(|r| r.matches(ws)) else { return (t, false) };
        if let Some(d) = rule.idle_after {
            t.idle_after = d;
        }
        if let Some(d) = rule.grace {
            t.grace = d;
        }
        if rule.connected_idle_after.is_some() {
            t.connected_idle_after = rule.connected_idle_after;
        }
        if rule.max_lifetime.is_some() {
            t.max_lifetime = rule.max_lifetime;
        }
        t.extend_while_busy = rule.extend_while_busy.unwrap_or(t.extend_while_busy);
        t.extend_by = rule.extend_by.unwrap_or(t.extend_by);
        t.extend_limit = rule.extend_limit.unwrap_or(t.extend_limit);
        t.countdown_in_coder = rule.countdown_in_coder.or(t.countdown_in_coder);
        (t, rule.exempt)
    }

    /// How long an energy counter may stand still before the readings count as frozen:
    /// `frozen_after`, and never less than two exporter collections (the counter moves once
    /// per collection, so a 5-minute `-c` leaves it still for up to 5 minutes).
    pub fn frozen_limit(&self) -> Duration {
        self.frozen_after.max(self.exporter_collect_interval * 2)
    }

    /// The power-veto threshold for a GPU model, if one is set for it.
    pub fn active_power_for(&self, model: Option<&str>) -> Option<f64> {
        per_model(&self.active_power_watts, model)
    }

    /// The price of one GPU-hour of this model, if one is set for it.
    pub fn gpu_hour_price_for(&self, model: Option<&str>) -> Option<f64> {
        per_model(&self.gpu_hour_price, model)
    }

    /// Whether GPU time is also counted in money.
    pub fn prices_gpu_time(&self) -> bool {
        !self.gpu_hour_price.is_empty()
    }

    pub fn is_gpu_template(&self, template: &str) -> bool {
        self.gpu_templates.is_empty() || self.gpu_templates.iter().any(|g| glob_match(g, template))
    }

    /// The parameter among a build's that says it has no GPU (a template's CPU variant): the
    /// first one `gpu_parameters` names whose value is `0`, `false`, `none` or empty.
    pub fn cpu_variant<'a>(&self, parameters: &'a [BuildParameter]) -> Option<&'a BuildParameter> {
        parameters.iter().find(|p| {
            self.gpu_parameters.iter().any(|name| name.eq_ignore_ascii_case(p.name.trim()))
                && NO_GPU_VALUES.iter().any(|none| none.eq_ignore_ascii_case(p.value.trim()))
        })
    }

    /// How long after its agent's creation a first start's pod may still report no GPU without
    /// waiting for one: one exporter collection plus `bind_allowance`.
    pub fn first_report_allowance(&self) -> Duration {
        self.exporter_collect_interval + self.bind_allowance
    }

    /// The longest span any rule looks back, plus `max_sample_gap` (the sample before the span
    /// counts for its gaps): how long windows must keep samples.
    pub fn longest_lookback(&self) -> Duration {
        let mut longest = self.thresholds.idle_after.max(self.thresholds.connected_idle_after.unwrap_or_default());
        for r in &self.rules {
            longest = longest.max(r.idle_after.unwrap_or_default()).max(r.connected_idle_after.unwrap_or_default());
        }
        longest + self.max_sample_gap
    }
}

/// `*` matches any run of characters, `?` one character; everything else literally.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// The value of the first glob of a per-model table (sorted most specific first) that matches.
fn per_model(table: &[(String, f64)], model: Option<&str>) -> Option<f64> {
    let model = model?;
    table.iter().find(|(glob, _)| glob_match(glob, model)).map(|(_, v)| *v)
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn globs() {
        for (p, t, want) in [
            ("gpu-*", "gpu-a100", true),
            ("gpu-*", "cpu-small", false),
            ("*", "", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*-ml-*", "team-ml-big", true),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("**a", "bba", true),
        ] {
            assert_eq!(glob_match(p, t), want, "{p} vs {t}");
        }
    }
}
