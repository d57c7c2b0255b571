//! Evaluate: the first step of a pass. Gathers the running workspaces (one listing) and the GPU
//! readings (one collection), merges readings into per-workspace windows, decides each
//! workspace and applies the fleet rules. It returns a plain value, `Evaluation`, and has no
//! side effects toward Coder or people: `plan` is evaluate + publish, `run` is evaluate + act +
//! publish. It reads the clock once per pass and hands that `now` to every decision.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use chrono::{DateTime, Utc};

use crate::coder::types::Workspace;
use crate::coder::{CoderClient, CoderError, ErrorKind};
use crate::gpu::source::JobsRead;
use crate::gpu::window::Windows;
use crate::gpu::{Collection, GpuSource, SourceFailure, Sources};
use crate::pass::decide::{Decision, Reason};
use crate::pass::fleet::FleetOutcome;
use crate::pass::judge::{Judge, Judgement, PassContext, merge_points, session_starts};
use crate::pass::outside::{self, HeldOutside, Outside};
use crate::pass::policy::Policy;
use crate::pass::starts;
use reclaimer_core::ledger::{Listed, PassView};
use reclaimer_core::pass::blind::{Blindness, likely_cause};

/// Everything one evaluation found.
#[derive(Debug)]
pub struct Evaluation {
    pub now: DateTime<Utc>,
    pub started: Instant,
    /// The running workspaces, in listing order; `judged()` pairs each with its decision and
    /// its GPUs. The three lists stay apart: pairing them into one list copied every listing
    /// entry while the listing was still held (about 5 MiB more at a steady pass's peak RSS,
    /// 10,000 workspaces).
    workspaces: Vec<Workspace>,
    /// One decision per workspace, in listing order.
    decisions: Vec<Decision>,
    /// What each workspace's GPUs are, in listing order.
    holdings: Vec<Holding>,
    /// The fleet rules' outcome; its indices are into the listing order.
    pub fleet: FleetOutcome,
    /// Indices of the workspaces whose warning (grace) began this pass.
    new_warnings: Vec<usize>,
    /// GPU source requests made this pass.
    pub gpu_requests: usize,
    pub source_failures: Vec<SourceFailure>,
    /// GPU keys more than one scrape target reported (the first few), and how many in all.
    pub twins: Vec<crate::gpu::Twin>,
    pub twin_count: usize,
    /// Entries the listing repeated (offset paging can repeat one); each was dropped.
    pub duplicates: usize,
    /// Coder's clock minus this machine's, as this listing's `Date` header measured it (`None`
    /// without the header). Coder's timestamps were judged by it, except that an offset within
    /// `CLOCK_RESOLUTION` counts as none and a listing without the header keeps the last one.
    pub coder_clock_offset: Option<chrono::Duration>,
    /// The offset the decisions used (the filtered, remembered one; zero when unknown).
    pub coder_offset: chrono::Duration,
    /// The currency of the prices, when GPU time is priced.
    pub currency: Option<String>,
    /// Workspaces whose pods report a GPU while Coder does not list them running.
    pub held_outside: Vec<HeldOutside>,
    /// Behind Prometheus: the scrape jobs read, and how they were chosen.
    pub gpu_jobs: Option<JobsRead>,
    /// Running GPU workspaces whose agents are connected but that have no GPU series.
    pub without_series: usize,
    /// What keeps the service from seeing (the status document's `problems`, the page's banners).
    pub problems: Vec<String>,
}

/// What one listed workspace's GPUs are this pass.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Holding {
    /// How many GPUs report for it.
    pub gpus: u64,
    /// The price of one of its GPU-hours (`gpu_hour_price` for its GPUs' model), when set.
    pub price: Option<f64>,
}

impl Evaluation {
    /// Coder's clock now, as the decisions read it: this pass's time plus `coder_offset`.
    pub fn coder_now(&self) -> DateTime<Utc> {
        self.now + self.coder_offset
    }

    /// The running workspaces, in listing order, each with its decision and its GPUs.
    pub fn judged(&self) -> impl ExactSizeIterator<Item = Listed<'_>> + Clone {
        self.workspaces.iter().zip(&self.decisions).zip(&self.holdings).map(|((workspace, decision), held)| Listed {
            workspace,
            decision,
            gpus: held.gpus,
            price: held.price,
        })
    }

    /// How many running workspaces the pass judged.
    pub fn len(&self) -> usize {
        self.workspaces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workspaces.is_empty()
    }

    /// The listed workspaces as the ledger reads them (`view`).
    pub fn listed(&self) -> Vec<Listed<'_>> {
        self.judged().collect()
    }

    /// The pass as the ledger reads it, over `listed` (`listed()`).
    pub fn view<'a>(&'a self, listed: &'a [Listed<'a>], shutting_down: bool) -> PassView<'a> {
        PassView {
            now: self.now,
            coder_offset: self.coder_offset,
            judged: listed,
            fleet: &self.fleet,
            new_warnings: &self.new_warnings,
            currency: self.currency.as_deref(),
            shutting_down,
        }
    }

    /// The running workspaces' listing entries.
    pub fn workspaces(&self) -> impl Iterator<Item = &Workspace> {
        self.workspaces.iter()
    }

    /// The decisions, in listing order.
    pub fn decisions(&self) -> impl Iterator<Item = &Decision> {
        self.decisions.iter()
    }

    /// The decisions, in listing order, taken out of the evaluation.
    pub fn into_decisions(self) -> Vec<Decision> {
        self.decisions
    }
}

/// A clock difference larger than this is logged (`clock_skew`): decisions correct for it, but
/// it means NTP is off somewhere.
pub const CLOCK_SKEW_WARNING: chrono::Duration = chrono::Duration::seconds(30);

/// Offsets this small are below what the `Date` header can tell.
pub const CLOCK_RESOLUTION: chrono::Duration = chrono::Duration::seconds(2);

pub use crate::pass::judge::LEARNED_TEMPLATE_MEMORY;

pub struct Evaluator {
    coder: CoderClient,
    source: Sources,
    /// The judgment's state (windows, warnings, sessions, learned templates) and its pure step,
    /// which `backtest` replays through too.
    judge: Judge,
    /// Coder's clock offset as last measured (kept when a response lacks the header).
    coder_clock_offset: chrono::Duration,
    /// Whether the token may stop workspaces, per organization id: asked once per organization
    /// that has running workspaces, forgotten when the token changes.
    may_stop: HashMap<String, bool>,
    /// When each template's schedule was last asked for, and whether Coder answered
    /// (`learn_templates`).
    templates_read: HashMap<String, (Instant, bool)>,
    interval: std::time::Duration,
    /// Workspaces GPU series name that the listing does not hold (`held_outside`).
    outside: Outside,
    /// Those already logged as holding a GPU outside Coder (logged once while they do).
    said_outside: HashSet<String>,
    /// Builds whose parameters could not be read, already logged (asked again each pass).
    said_parameters_unread: HashSet<String>,
    /// The scrape jobs last logged (`said_jobs`): a change is logged once.
    said_jobs: Option<JobsRead>,
    /// Passes in a row whose source answered while no listed workspace mapped to a series.
    blindness: Blindness,
}

/// The most build parameter reads in one pass (a start that may wait for a GPU, once per build).
const MAX_PARAMETER_READS: usize = 16;
/// The most template schedules read in one pass.
const MAX_TEMPLATE_READS: usize = 16;
/// A template's schedule is read again after this.
const TEMPLATE_REREAD: std::time::Duration = std::time::Duration::from_secs(3600);
/// A template read that failed is asked again after this (not every pass).
const TEMPLATE_RETRY: std::time::Duration = std::time::Duration::from_secs(600);

impl Evaluator {
    pub fn new(coder: CoderClient, source: Sources, policy: Policy, interval: std::time::Duration) -> Self {
        Evaluator {
            judge: Judge::new(policy, interval),
            coder,
            source,
            coder_clock_offset: chrono::Duration::zero(),
            may_stop: HashMap::new(),
            templates_read: HashMap::new(),
            interval,
            outside: Outside::default(),
            said_outside: HashSet::new(),
            said_parameters_unread: HashSet::new(),
            said_jobs: None,
            blindness: Blindness::default(),
        }
    }

    /// Reads the schedule of the listed workspaces' templates not read within the hour (at most
    /// `MAX_TEMPLATE_READS` a pass, one attempt each: a pass never waits on retries; a failed read
    /// is asked again after `TEMPLATE_RETRY`, and meanwhile the template counts as bumping,
    /// Coder's default, with no reminder).
    async fn learn_templates(&mut self, workspaces: &[Workspace]) {
        let due: HashSet<&str> = workspaces
            .iter()
            .map(|w| w.template_id.as_str())
            .filter(|id| {
                !id.is_empty()
                    && self
                        .templates_read
                        .get(*id)
                        .is_none_or(|(at, ok)| at.elapsed() >= if *ok { TEMPLATE_REREAD } else { TEMPLATE_RETRY })
            })
            .collect();
        let once = self.coder.without_retries();
        for id in due.into_iter().take(MAX_TEMPLATE_READS) {
            let answer = once.template_schedule(id).await;
            self.templates_read.insert(id.to_string(), (Instant::now(), answer.is_ok()));
            match answer {
                Ok(schedule) => self.judge.know_template(id.to_string(), schedule),
                Err(e) => {
                    tracing::warn!(event = "template_unread", template_id = %id, error = %e, "cannot read a template's schedule (activity bump, autostop reminder); asking again in 10 minutes")
                }
            }
        }
    }

    /// The stops already sent that still serve a waiter, per pool (the actuator's ledger says).
    pub fn set_serving(&mut self, serving: Vec<usize>) {
        self.judge.set_serving(serving);
    }

    /// The token changed (or a day passed): ask again what it may do in each organization.
    pub fn forget_permissions(&mut self) {
        self.may_stop.clear();
    }

    /// Asks `authcheck` about the organizations not asked about yet. When Coder does not
    /// answer, those organizations are asked again next pass; meanwhile a stop there is tried
    /// (a refusal is a 403 the actuator backs off from, never a wrong stop).
    async fn learn_permissions(&mut self, workspaces: &[Workspace]) {
        let mut new: Vec<&str> =
            workspaces.iter().map(|w| w.organization_id.as_str()).filter(|o| !o.is_empty() && !self.may_stop.contains_key(*o)).collect();
        new.sort_unstable();
        new.dedup();
        if new.is_empty() {
            return;
        }
        match self.coder.may_stop_in(&new).await {
            Ok(answers) => {
                for org in new {
                    let allowed = answers.get(org).copied().unwrap_or(false);
                    if !allowed {
                        let name = workspaces.iter().find(|w| w.organization_id == org).map_or(org, |w| w.organization_name.as_str());
                        tracing::warn!(event = "permission_missing", organization = %name, "the token may not stop workspaces in organization {name:?}: they are skipped (no-permission); give its user the organization-admin role there, or use an owner's token");
                    }
                    self.may_stop.insert(org.to_string(), allowed);
                }
            }
            Err(e) => {
                tracing::warn!(event = "permission_check_failed", error = %e, "cannot ask Coder what the token may do per organization; asking again next pass")
            }
        }
    }

    pub fn policy(&self) -> &Policy {
        self.judge.policy()
    }

    /// Whether a template is a GPU template (`Judge::is_gpu_template`).
    pub fn is_gpu_template(&self, template: &str) -> bool {
        self.judge.is_gpu_template(template)
    }

    /// The templates learned as GPU templates (`gpu_templates` unset), sorted.
    pub fn learned_gpu_templates(&self) -> Vec<String> {
        self.judge.learned_gpu_templates()
    }

    pub fn windows(&self) -> &Windows {
        self.judge.windows()
    }

    pub fn source(&self) -> &Sources {
        &self.source
    }

    /// Reads the GPU sources only, between passes (`--sample-interval`, and `plan`'s sampling):
    /// the readings are merged into the next pass's sample, so no reading is skipped. Only the
    /// readings of workspaces a listing said run are kept: a source naming other pods (or new
    /// ones every scrape) grows nothing, and before the first listing nothing is kept at all.
    pub async fn sample(&mut self) {
        let collection = self.source.collect(Utc::now()).await;
        for series in &collection.series {
            self.judge.record_between_passes(series);
        }
    }

    /// Lists the running workspaces once, before any pass (`plan` samples before its pass), so
    /// that `sample` knows whose readings to keep.
    pub async fn learn_running(&mut self) -> Result<(), CoderError> {
        let listing = self.coder.listing().await?;
        for ws in &listing.workspaces {
            self.judge.know_session(&ws.id, &ws.latest_build.id);
        }
        Ok(())
    }

    /// Ends a sampling step as a pass would: the readings since become one sample (`plan`
    /// samples a few times before its one pass).
    pub fn flush_samples(&mut self) {
        self.judge.flush_samples();
    }

    /// Gather, merge, decide, fleet rules. Fails only when the listing fails: then nothing is
    /// decided, so nothing can be stopped.
    pub async fn evaluate(&mut self) -> Result<Evaluation, (CoderError, Vec<SourceFailure>)> {
        let started = Instant::now();
        let now = Utc::now();
        let (listing, mut collection) = if self.source.lists_first() {
            let listing = match self.coder.listing().await {
                Ok(l) => l,
                Err(e) => return Err((e, Vec::new())),
            };
            self.source.want(listing.workspaces.iter().map(|w| w.id.as_str()));
            let collection = self.source.collect(now).await;
            (Ok(listing), collection)
        } else {
            tokio::join!(self.coder.listing(), self.source.collect(now))
        };
        let listing = match listing {
            Ok(l) => l,
            Err(e) => return Err((e, collection.failures)),
        };
        // The Date header has one-second resolution (and the round trip blurs it further): an
        // offset within `CLOCK_RESOLUTION` is no measurement, so the clocks are taken as equal.
        let measured = listing.clock_offset.map(|o| if o.abs() <= CLOCK_RESOLUTION { chrono::Duration::zero() } else { o });
        if let Some(offset) = measured {
            let was_skewed = self.coder_clock_offset.abs() > CLOCK_SKEW_WARNING;
            if offset.abs() > CLOCK_SKEW_WARNING && !was_skewed {
                tracing::warn!(
                    event = "clock_skew",
                    offset_seconds = offset.num_seconds(),
                    "Coder's clock differs from this machine's by more than 30 s; its timestamps are judged by its own clock, but fix NTP"
                );
            }
            self.coder_clock_offset = offset;
        }
        let gpu_jobs = collection.jobs.take();
        self.say_jobs(gpu_jobs.as_ref());
        let (workspaces, duplicates) = dedup_by_id(listing.workspaces);
        self.learn_permissions(&workspaces).await;
        self.learn_templates(&workspaces).await;
        let context = PassContext { coder_offset: self.coder_clock_offset, step: collection.step };
        // A pass whose source fetched nothing new keeps what the last fetch said of twins.
        if collection.requests > 0 {
            self.judge.set_twinned(std::mem::take(&mut collection.twinned));
        }
        let mut pass = self.judge.begin(&workspaces, context);
        // GPU series naming a workspace the listing does not hold: it may hold a GPU outside
        // Coder's running workspaces (`outside`). Behind Prometheus the source names them.
        let listed: HashSet<&str> = workspaces.iter().map(|w| w.id.as_str()).collect();
        // Before the series are merged (and drained): why none names a listed workspace, if so.
        let maps = collection.series.iter().any(|s| s.workspace_id.as_deref().is_some_and(|id| listed.contains(id)));
        let cause = (!maps).then(|| blind_cause(&collection, self.source.ownership(), gpu_jobs.as_ref()));
        let mut unlisted: Vec<String> = std::mem::take(&mut collection.unlisted);
        // Taken as they are merged: a first Prometheus pass's points go as the windows fill, and
        // the list itself before the pass decides (nothing after this reads the series).
        for series in std::mem::take(&mut collection.series) {
            if let Some(id) = series.workspace_id.as_deref().filter(|id| !listed.contains(id)) {
                if unlisted.len() < outside::MAX_FOLLOWED && !unlisted.iter().any(|u| u == id) {
                    unlisted.push(id.to_string());
                }
            }
            pass.merge(&series, &series.points);
        }
        // A start that may wait for a GPU: its build's parameters say whether it is a template's
        // CPU variant (one attempt each; a failed read leaves it waiting and is asked next pass).
        let once = self.coder.without_retries();
        let mut wanted = pass.parameters_wanted(now);
        // Builds whose read failed go last: they cannot take every read of a pass from the rest.
        wanted.sort_by_key(|b| self.said_parameters_unread.contains(b));
        for build in wanted.into_iter().take(MAX_PARAMETER_READS) {
            match once.build_parameters(&build).await {
                Ok(parameters) => pass.know_build_parameters(&build, &parameters),
                Err(e) => {
                    if self.said_parameters_unread.insert(build.clone()) {
                        tracing::warn!(event = "build_parameters_unread", build_id = %build, error = %e, "cannot read a starting workspace's build parameters (is it a CPU variant?): it counts as waiting for a GPU; asking again next pass");
                    }
                }
            }
        }
        self.said_parameters_unread.retain(|b| workspaces.iter().any(|w| &w.latest_build.id == b));
        let failed: HashSet<&str> = collection.failures.iter().map(|f| f.source.as_str()).collect();
        let may_stop = &self.may_stop;
        let Judgement { decisions, fleet, new_warnings } =
            pass.decide(now, &failed, |ws| may_stop.get(ws.organization_id.as_str()).copied());
        let held_outside = self.held_outside(now, &unlisted).await;
        let (without_series, problems) = self.blind(now, &collection, &workspaces, &decisions, (maps, cause), gpu_jobs.as_ref());
        let windows = self.judge.windows();
        let policy = self.judge.policy();
        // `judged()` zips the three lists: one decision per listed workspace, in its order.
        debug_assert_eq!(decisions.len(), workspaces.len(), "one decision per listed workspace");
        let holdings = workspaces
            .iter()
            .map(|workspace| {
                let gpus = windows.get(&workspace.id);
                let model = gpus.and_then(|g| g.iter().find_map(|w| w.model.as_deref()));
                Holding { gpus: gpus.map_or(0, |g| g.len() as u64), price: policy.gpu_hour_price_for(model) }
            })
            .collect();
        Ok(Evaluation {
            now,
            started,
            workspaces,
            decisions,
            holdings,
            fleet,
            new_warnings,
            gpu_requests: collection.requests,
            source_failures: collection.failures,
            twins: collection.twins,
            twin_count: collection.twin_count,
            duplicates,
            coder_clock_offset: listing.clock_offset,
            coder_offset: self.coder_clock_offset,
            currency: policy.prices_gpu_time().then(|| policy.currency.clone()),
            held_outside,
            gpu_jobs,
            without_series,
            problems,
        })
    }

    /// How many running GPU workspaces have no GPU series, and the problems to show: the jobs
    /// behind Prometheus that cannot be read, and a source that answers while no listed
    /// workspace maps to its series (`gpu_series_missing`, logged at most once an hour).
    fn blind(
        &mut self,
        now: DateTime<Utc>,
        collection: &Collection,
        workspaces: &[Workspace],
        decisions: &[Decision],
        (maps, cause): (bool, Option<String>),
        jobs: Option<&JobsRead>,
    ) -> (usize, Vec<String>) {
        let judge = &self.judge;
        // With gpu_templates unset and no template learned yet, every template may be one.
        let nothing_known = !judge.knows_gpu_templates();
        let has_series = |w: &Workspace| judge.windows().get(&w.id).is_some_and(|g| g.iter().any(|g| !g.samples.is_empty()));
        let counts = |w: &Workspace, d: &Decision| {
            matches!(d.reason, Reason::NoGpu | Reason::NoGpuData)
                && (nothing_known || judge.is_gpu_template(&w.template_name))
                && judge.cpu_variant(&w.latest_build.id).is_none()
                && starts::agent_never_connected(w).is_none()
                && starts::agent_lost(w).is_none()
        };
        let without = workspaces.iter().zip(decisions).filter(|(w, d)| counts(w, d) && !has_series(w)).count();
        // This pass's series, not the windows' (they keep old samples for the whole look-back); a
        // pass that fetched nothing new (no new Prometheus step) says nothing either way.
        let answered = collection.failures.is_empty() && collection.requests > 0;
        let sight = self.blindness.pass(now, answered, usize::from(maps), without, || cause.unwrap_or_default());
        if let (true, Some(problem)) = (sight.say, &sight.problem) {
            tracing::warn!(event = "gpu_series_missing", workspaces = without, "{problem}");
        }
        let jobs_problem = jobs.and_then(|j| j.problem.clone());
        (without, jobs_problem.into_iter().chain(sight.problem).collect())
    }

    /// Logs the scrape jobs behind Prometheus when they change: the one discovered
    /// (`prometheus_job_discovered`), or why none is read (`prometheus_job_unknown`, a WARN).
    fn say_jobs(&mut self, jobs: Option<&JobsRead>) {
        let Some(jobs) = jobs else { return };
        if self.said_jobs.as_ref() == Some(jobs) {
            return;
        }
        match &jobs.problem {
            Some(problem) => tracing::warn!(event = "prometheus_job_unknown", "{problem}"),
            None if jobs.jobs.is_empty() => return,
            None if jobs.how == "discovered" => {
                let found = crate::gpu::prometheus::jobs::listed(&jobs.found);
                tracing::info!(event = "prometheus_job_discovered", jobs = ?jobs.jobs, found = %found, "reading dcgm-exporter's series of scrape job {:?}, the one Prometheus holds them under", jobs.jobs);
            }
            None if jobs.how == "default" => {
                tracing::info!(event = "prometheus_job_not_found", jobs = ?jobs.jobs, "no scrape job in Prometheus carries dcgm-exporter series yet: reading {:?} and asking again each pass", jobs.jobs);
            }
            None => {}
        }
        self.said_jobs = Some(jobs.clone());
    }

    /// Follows the workspaces GPU series name that the listing does not hold, reads the ones
    /// seen for more than two intervals from Coder (a few a pass), and says which hold a GPU
    /// outside Coder's running workspaces.
    async fn held_outside(&mut self, now: DateTime<Utc>, unlisted: &[String]) -> Vec<HeldOutside> {
        let interval = crate::duration::chrono(self.interval);
        // One attempt each: a pass never waits on retries (`Outside` asks again next pass).
        let once = self.coder.without_retries();
        for id in self.outside.pass(now, interval, unlisted) {
            let answer = match once.workspace(&id).await {
                Ok(ws) => Ok(Some(ws)),
                Err(e) if matches!(e.kind, ErrorKind::NoPermission | ErrorKind::Status(404 | 410)) => Ok(None),
                Err(e) => {
                    tracing::warn!(event = "unlisted_unread", workspace_id = %id, error = %e, "cannot read a workspace whose pod reports a GPU while Coder does not list it running; asking again next pass");
                    Err(())
                }
            };
            self.outside.read(now, &id, answer.as_ref().map(Option::as_ref).map_err(|_| ()));
        }
        let held = self.outside.held();
        for h in held.iter().filter(|h| !self.said_outside.contains(&h.workspace_id)) {
            tracing::warn!(event = "gpu_held_outside_coder", workspace_id = %h.workspace_id, owner = %h.owner, template = %h.template, "{}", h.words());
        }
        self.said_outside = held.iter().map(|h| h.workspace_id.clone()).collect();
        held
    }
}

/// Why no series names a listed workspace: the series the source returned, read against the
/// namespace filter and the workspace label, and behind Prometheus the jobs read and the others
/// that carry dcgm-exporter series.
fn blind_cause(collection: &Collection, ownership: &crate::gpu::Ownership, jobs: Option<&JobsRead>) -> String {
    let others: Vec<(String, u64)> =
        jobs.map(|j| j.found.iter().filter(|(job, _)| !j.jobs.contains(job)).cloned().collect()).unwrap_or_default();
    let mut cause = match jobs {
        Some(j) if !others.is_empty() && collection.series.is_empty() => format!(
            "Prometheus holds no dcgm-exporter series of a running workspace under scrape jobs {:?}, but other jobs carry dcgm-exporter series: {}; set prometheus_job to the exporter's job (or unset it to use the one found)",
            j.jobs,
            crate::gpu::prometheus::jobs::listed(&others)
        ),
        Some(j) => likely_cause(&collection.series, ownership, &format!("Prometheus (scrape jobs {:?})", j.jobs)),
        None => likely_cause(&collection.series, ownership, "the exporters"),
    };
    if !collection.unlisted.is_empty() {
        cause.push_str(&format!("; {} workspace id(s) in GPU series are not in Coder's running list", collection.unlisted.len()));
    }
    cause
}

/// Merges one collection into the windows, each running workspace's points from its current
/// session on (`judge::merge_points`), draining the series as they go (tests feed windows
/// directly through this).
pub fn merge_collection(
    windows: &mut Windows,
    collection: &mut Collection,
    workspaces: &[Workspace],
    coder_clock_offset: chrono::Duration,
) {
    let session_start = session_starts(workspaces, coder_clock_offset);
    for series in collection.series.drain(..) {
        merge_points(windows, &session_start, &series, &series.points, collection.step);
    }
}

/// Keeps the first entry of each workspace id, in listing order.
fn dedup_by_id(listed: Vec<Workspace>) -> (Vec<Workspace>, usize) {
    let total = listed.len();
    let mut seen = HashSet::with_capacity(total);
    let kept: Vec<Workspace> = listed.into_iter().filter(|w| seen.insert(w.id.clone())).collect();
    let duplicates = total - kept.len();
    (kept, duplicates)
}
