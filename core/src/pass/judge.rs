//! A pass's judgment as state and one pure step: the windows, the warnings in progress (grace),
//! the sessions (a new build is a new session) and the learned GPU templates, and the step that
//! turns a listing and the readings into decisions under the fleet rules. `run`'s evaluator and
//! `backtest`'s replay both judge through `Judge`, so a backtest cannot disagree with what `run`
//! would have decided on the same data. No I/O and no clock: `now` comes in.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use crate::coder::types::{BuildParameter, CoderId, TemplateSchedule, Workspace};
use crate::gpu::window::Windows;
use crate::gpu::{GpuSeries, Point};
use crate::ids::{IdMap, IdSet};

use super::decide::{Decision, PassFacts, Verdict, decide_with, without_stop_permission};
use super::fleet::{FleetOutcome, fleet_rules_serving};
use super::policy::Policy;
use super::starts::may_wait;

/// How long a template counts as a GPU template after the last of its workspaces that had a GPU
/// series was seen with one.
pub const LEARNED_TEMPLATE_MEMORY: chrono::Duration = chrono::Duration::days(7);
/// The most templates learned at once (Coder deployments have tens): the longest unseen go first.
const MAX_LEARNED_TEMPLATES: usize = 10_000;

/// A template is learned as a GPU template once this many distinct workspaces of it were seen
/// with GPU series, over at least this many passes.
pub const LEARN_FROM: usize = 2;

/// A template on its way to being learned: the workspaces seen with GPU series (the first
/// `LEARN_FROM`), in how many passes, and when last.
#[derive(Debug, Default)]
struct Teaching {
    workspaces: Vec<String>,
    passes: usize,
    seen: Option<DateTime<Utc>>,
}

/// What a pass remembers for the next.
#[derive(Debug)]
pub struct Judge {
    policy: Policy,
    windows: Windows,
    /// Warnings in progress (grace): workspace id -> stop time.
    warnings: IdMap<String, DateTime<Utc>>,
    /// The latest build id seen per workspace: a new build is a new session.
    sessions: IdMap<String, CoderId>,
    /// While `gpu_templates` is unset: templates learned as GPU templates, and when a workspace
    /// of theirs was last seen with a GPU series (`LEARNED_TEMPLATE_MEMORY`).
    gpu_templates_seen: HashMap<String, DateTime<Utc>>,
    /// Templates seen with GPU series but not learned yet (`Teaching`): one series, or one
    /// workspace, teaches nothing (a forged series must not make a CPU template a GPU one).
    teaching: HashMap<String, Teaching>,
    /// Stops already sent that still serve a waiter, per pool (`Ledger::serving`): set before a
    /// pass by whoever acts.
    serving: Vec<usize>,
    /// Templates' schedules by template id, as Coder last answered (`know_template`).
    templates: IdMap<String, TemplateSchedule>,
    /// Workspaces one of whose GPUs two scrape targets report this pass (`set_twinned`): the ids
    /// come from the GPU source's labels, so SipHash (`core::ids`' rule).
    twinned: HashSet<String>,
    /// By build id, for the listed workspaces' latest builds whose parameters were read: the
    /// parameter that says the build has no GPU (`Policy::cpu_variant`), or `None` when none
    /// does. A build's parameters never change, so each is read once.
    build_parameters: IdMap<String, Option<BuildParameter>>,
    /// Passes begun, and the one whose templates were learned last (`learn_gpu_templates`
    /// learns once a pass).
    passes: u64,
    learned_in: u64,
}

/// One running workspace as a pass judged it, owned: its listing entry, its decision, and what
/// its GPUs are. `run`'s evaluation keeps these in three lists and lends them as `Listed`; this
/// is for passes built by hand (the ledger's and the accounting's tests).
#[derive(Debug, Clone)]
pub struct Judged {
    pub workspace: Workspace,
    pub decision: Decision,
    /// How many GPUs report for it.
    pub gpus: u64,
    /// The price of one of its GPU-hours (`gpu_hour_price` for its GPUs' model), when set.
    pub price: Option<f64>,
}

/// What one pass decided: a decision per listed workspace (listing order), the fleet rules'
/// outcome (its indices are into `decisions`), and the warnings that began this pass.
#[derive(Debug)]
pub struct Judgement {
    pub decisions: Vec<Decision>,
    pub fleet: FleetOutcome,
    pub new_warnings: Vec<usize>,
}

/// The facts of one pass besides the readings.
#[derive(Debug, Clone, Copy, Default)]
pub struct PassContext {
    /// Coder's clock minus this machine's (see `PassFacts::coder_offset`).
    pub coder_offset: chrono::Duration,
    /// The GPU source's step when it reads history in complete steps (Prometheus).
    pub step: Option<std::time::Duration>,
}

/// A pass between its listing and its decisions: its readings are merged in (`merge`), then
/// `decide` ends it. Made by `Judge::begin`, which has already started new sessions afresh.
pub struct JudgePass<'a> {
    judge: &'a mut Judge,
    workspaces: &'a [Workspace],
    context: PassContext,
    /// Where each listed workspace's session begins on this machine's clock (its latest build).
    session_start: IdMap<&'a str, Option<DateTime<Utc>>>,
}

impl Judge {
    pub fn new(policy: Policy, interval: std::time::Duration) -> Self {
        let retain = crate::duration::chrono(policy.longest_lookback());
        Judge {
            windows: Windows::new(retain, interval).with_max_per_workspace(policy.max_gpus_per_workspace),
            policy,
            warnings: IdMap::default(),
            sessions: IdMap::default(),
            gpu_templates_seen: HashMap::new(),
            teaching: HashMap::new(),
            serving: Vec::new(),
            templates: IdMap::default(),
            twinned: HashSet::new(),
            build_parameters: IdMap::default(),
            passes: 0,
            learned_in: 0,
        }
    }

    /// A build's parameters as Coder answered them (`GET /api/v2/workspacebuilds/{id}/parameters`):
    /// a CPU variant's build never waits for a GPU and never teaches a template.
    pub fn know_build_parameters(&mut self, build_id: &str, parameters: &[BuildParameter]) {
        let cpu = self.policy.cpu_variant(parameters).cloned();
        self.build_parameters.insert(build_id.to_string(), cpu);
    }

    /// The parameter that says a build has no GPU, when its parameters were read and one does.
    pub fn cpu_variant(&self, build_id: &str) -> Option<&BuildParameter> {
        self.build_parameters.get(build_id).and_then(Option::as_ref)
    }

    /// A template's schedule as Coder answered it (its activity bump, its autostop reminder).
    pub fn know_template(&mut self, template_id: String, schedule: TemplateSchedule) {
        self.templates.insert(template_id, schedule);
    }

    /// The workspaces one of whose GPUs is a twin this pass: their deadlines are not moved.
    pub fn set_twinned(&mut self, twinned: impl IntoIterator<Item = String>) {
        self.twinned = twinned.into_iter().collect();
    }

    /// The stops already sent that still serve a waiter, per pool, for the next `decide`.
    pub fn set_serving(&mut self, serving: Vec<usize>) {
        self.serving = serving;
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn windows(&self) -> &Windows {
        &self.windows
    }

    /// Whether a template is a GPU template: one `gpu_templates` names, or while that is unset,
    /// one of whose workspaces has had a GPU series within `LEARNED_TEMPLATE_MEMORY`.
    pub fn is_gpu_template(&self, template: &str) -> bool {
        if self.policy.gpu_templates.is_empty() {
            self.gpu_templates_seen.contains_key(template)
        } else {
            self.policy.is_gpu_template(template)
        }
    }

    /// Whether any template is known as a GPU template (named, or learned).
    pub fn knows_gpu_templates(&self) -> bool {
        !self.policy.gpu_templates.is_empty() || !self.gpu_templates_seen.is_empty()
    }

    /// The templates learned as GPU templates (`gpu_templates` unset), sorted.
    pub fn learned_gpu_templates(&self) -> Vec<String> {
        let mut out: Vec<String> = self.gpu_templates_seen.keys().cloned().collect();
        out.sort();
        out
    }

    /// A workspace a listing named before any pass (`plan` samples before its pass): its
    /// readings between passes are kept from now on.
    pub fn know_session(&mut self, workspace_id: &str, build_id: &str) {
        self.sessions.entry(workspace_id.to_string()).or_insert_with(|| CoderId::new(build_id));
    }

    /// A reading between passes: kept only for a workspace a listing said runs, merged into the
    /// next pass's sample.
    pub fn record_between_passes(&mut self, series: &GpuSeries) {
        if series.workspace_id.as_deref().is_some_and(|id| self.sessions.contains_key(id)) {
            self.windows.record(series, None, false);
        }
    }

    /// Ends a sampling step as a pass would: the readings since become one sample.
    pub fn flush_samples(&mut self) {
        self.windows.flush();
    }

    /// Begins a pass over these running workspaces: one restarted since the last pass (a new
    /// latest build) starts afresh, its samples and warning forgotten.
    pub fn begin<'a>(&'a mut self, workspaces: &'a [Workspace], context: PassContext) -> JudgePass<'a> {
        self.passes += 1;
        // Keyed by the listed ids: it answers "is it listed" for the whole pass too.
        let session_start = session_starts(workspaces, context.coder_offset);
        for ws in workspaces {
            let build = &ws.latest_build.id;
            match self.sessions.get_mut(&ws.id) {
                Some(seen) if seen == build => {}
                Some(seen) => {
                    // Restarted since the last pass: its old samples describe another session.
                    self.windows.forget(&ws.id);
                    self.warnings.remove(&ws.id);
                    seen.clone_from(build);
                }
                None => {
                    self.sessions.insert(ws.id.clone(), build.clone());
                }
            }
        }
        // Every listed id is in `sessions` now: only when it holds more is one no longer listed.
        if self.sessions.len() > session_start.len() {
            self.sessions.retain(|id, _| session_start.contains_key(id.as_str()));
        }
        if !self.build_parameters.is_empty() {
            let latest: IdSet<&str> = workspaces.iter().map(|w| w.latest_build.id.as_str()).collect();
            self.build_parameters.retain(|build, _| latest.contains(build.as_str()));
        }
        JudgePass { judge: self, workspaces, context, session_start }
    }

    /// Learns the templates of workspaces that have GPU series now (`LEARN_FROM` workspaces over
    /// as many passes; a CPU variant teaches nothing), and forgets the ones not seen with one
    /// for `LEARNED_TEMPLATE_MEMORY`. Called twice in a pass at most (`parameters_wanted`, then
    /// `decide`), it learns in the first: the second would find the same series and the same
    /// pass (a build parameter read between them makes a CPU variant teach nothing more, and
    /// takes back nothing it taught).
    fn learn_gpu_templates(&mut self, workspaces: &[Workspace], now: DateTime<Utc>) {
        if !self.policy.gpu_templates.is_empty() || self.learned_in == self.passes {
            return;
        }
        self.learned_in = self.passes;
        let has_series = |w: &Workspace| self.windows.get(&w.id).is_some_and(|g| g.iter().any(|w| !w.samples.is_empty()));
        let taught: Vec<&Workspace> =
            workspaces.iter().filter(|w| has_series(w) && self.cpu_variant(&w.latest_build.id).is_none()).collect();
        for ws in taught {
            if let Some(seen) = self.gpu_templates_seen.get_mut(&ws.template_name) {
                *seen = now;
                continue;
            }
            let t = self.teaching.entry(ws.template_name.clone()).or_default();
            if t.seen != Some(now) {
                t.passes += 1;
                t.seen = Some(now);
            }
            if t.workspaces.len() < LEARN_FROM && !t.workspaces.contains(&ws.id) {
                t.workspaces.push(ws.id.clone());
            }
            if t.workspaces.len() >= LEARN_FROM && t.passes >= LEARN_FROM {
                self.teaching.remove(&ws.template_name);
                self.gpu_templates_seen.insert(ws.template_name.clone(), now);
            }
        }
        self.teaching.retain(|_, t| t.seen.is_some_and(|seen| now - seen < LEARNED_TEMPLATE_MEMORY));
        if self.teaching.len() > MAX_LEARNED_TEMPLATES {
            let mut by_age: Vec<(Option<DateTime<Utc>>, String)> = self.teaching.iter().map(|(k, t)| (t.seen, k.clone())).collect();
            by_age.sort();
            for (_, k) in by_age.into_iter().take(self.teaching.len() - MAX_LEARNED_TEMPLATES) {
                self.teaching.remove(&k);
            }
        }
        self.gpu_templates_seen.retain(|_, seen| now - *seen < LEARNED_TEMPLATE_MEMORY);
        if self.gpu_templates_seen.len() > MAX_LEARNED_TEMPLATES {
            let mut by_age: Vec<(DateTime<Utc>, String)> = self.gpu_templates_seen.iter().map(|(t, at)| (*at, t.clone())).collect();
            by_age.sort();
            for (_, t) in by_age.into_iter().take(self.gpu_templates_seen.len() - MAX_LEARNED_TEMPLATES) {
                self.gpu_templates_seen.remove(&t);
            }
        }
    }
}

impl JudgePass<'_> {
    /// The latest builds whose parameters are worth reading before this pass decides: a GPU
    /// template's workspace whose agent never connected or was lost and whose pod reports no
    /// fresh GPU (it may be waiting, or a CPU variant), not read yet. In listing order. Ends the
    /// pass's sample first and learns the templates this pass's series teach, as `decide` would:
    /// a start is looked at with what the decision will know.
    pub fn parameters_wanted(&mut self, now: DateTime<Utc>) -> Vec<String> {
        self.judge.windows.flush();
        self.judge.learn_gpu_templates(self.workspaces, now);
        let judge = &*self.judge;
        self.workspaces
            .iter()
            .filter(|ws| !judge.build_parameters.contains_key(ws.latest_build.id.as_str()) && judge.is_gpu_template(&ws.template_name))
            .filter(|ws| may_wait(ws, judge.windows.get(&ws.id).unwrap_or(&[]), now, &judge.policy))
            .map(|ws| ws.latest_build.id.to_string())
            .collect()
    }

    /// A build's parameters, read during this pass (`Judge::know_build_parameters`).
    pub fn know_build_parameters(&mut self, build_id: &str, parameters: &[BuildParameter]) {
        self.judge.know_build_parameters(build_id, parameters);
    }

    /// Merges one series' points (all of them, or the ones up to this pass out of a longer
    /// fetch) into its workspace's window, from its current session on (`merge_points`).
    pub fn merge(&mut self, series: &GpuSeries, points: &[Point]) {
        merge_points(&mut self.judge.windows, &self.session_start, series, points, self.context.step);
    }

    /// Ends the pass: the readings become one sample per pass, GPUs of failed sources are
    /// flagged, gone workspaces and old samples dropped; then each workspace is decided and the
    /// fleet rules applied. `may_stop` answers whether the token may stop a workspace (`None`:
    /// not known yet, tried).
    pub fn decide(self, now: DateTime<Utc>, failed_sources: &HashSet<&str>, may_stop: impl Fn(&Workspace) -> Option<bool>) -> Judgement {
        let JudgePass { judge, workspaces, context, session_start } = self;
        judge.windows.flush();
        judge.windows.mark_failed_sources(failed_sources);
        judge.windows.prune(now, |id| session_start.contains_key(id));
        judge.learn_gpu_templates(workspaces, now);
        let mut decisions: Vec<Decision> = workspaces
            .iter()
            .map(|ws| {
                let prior = judge.warnings.get(&ws.id).copied();
                let seen = judge.windows.of(&ws.id);
                let facts = PassFacts {
                    coder_offset: context.coder_offset,
                    gpu_template: judge.is_gpu_template(&ws.template_name),
                    step: context.step,
                    gpu_series_refused_at: seen.refused_at,
                    template: judge.templates.get(ws.template_id.as_str()).copied(),
                    cpu_variant: judge.cpu_variant(&ws.latest_build.id),
                    twinned: judge.twinned.contains(&ws.id),
                    gpu_changed_at: seen.changed_at,
                };
                decide_with(now, ws, seen.windows, &judge.policy, prior, facts)
            })
            .collect();
        for (ws, d) in workspaces.iter().zip(decisions.iter_mut()) {
            if may_stop(ws) == Some(false) {
                without_stop_permission(d, &ws.organization_name);
            }
        }
        let fleet = fleet_rules_serving(&mut decisions, &judge.policy, &judge.serving);
        let new_warnings = (0..decisions.len())
            .filter(|&i| decisions[i].verdict == Verdict::Warn && !judge.warnings.contains_key(&decisions[i].workspace_id))
            .collect();
        judge.warnings =
            decisions.iter().filter(|d| d.is_stop_eligible()).filter_map(|d| d.stop_at.map(|t| (d.workspace_id.clone(), t))).collect();
        Judgement { decisions, fleet, new_warnings }
    }
}

/// Where each workspace's current session begins on this machine's clock: its latest build's
/// creation (Coder's clock, `coder_offset` is Coder's minus ours).
pub fn session_starts(workspaces: &[Workspace], coder_offset: chrono::Duration) -> IdMap<&str, Option<DateTime<Utc>>> {
    workspaces.iter().map(|w| (w.id.as_str(), w.latest_build.created_at.map(|t| t - coder_offset))).collect()
}

/// Adds a series' points to its workspace's window, from its current session on. History
/// (Prometheus) also holds the previous pod's series from before the latest build, which say
/// nothing about this session; a point of a source read in steps covers the step ending at its
/// time, so it belongs to the session only when the whole step does. A series of a workspace
/// not listed is dropped.
pub fn merge_points(
    windows: &mut Windows,
    session_start: &IdMap<&str, Option<DateTime<Utc>>>,
    series: &GpuSeries,
    points: &[Point],
    step: Option<std::time::Duration>,
) {
    let Some(start) = series.workspace_id.as_deref().and_then(|id| session_start.get(id)) else { return };
    let covers = step.map_or(chrono::Duration::zero(), crate::duration::chrono);
    windows.record_points(series, points, start.map(|s| s + covers), step.is_some());
}
