//! Reads GPU history from Prometheus (or Thanos, Mimir, VictoriaMetrics) instead of scraping
//! exporters, for large fleets. Decisions need raw samples, never the values Prometheus fills in
//! for up to 5 minutes (its lookback), so every point is `max_over_time(x[step])` at a
//! step-aligned time: the highest raw sample in that step, and no point at all for a step with no
//! raw sample (a gap or stale series shows as what it is). Only the fields the decisions use are
//! asked for, one query per exporter field name (a constant number, whatever the fleet size), and
//! after the first pass only the new steps are fetched.
//!
//! A fetch of a few steps (every pass after the first) is aggregated by the labels that identify
//! a GPU and its pod, dropping the scrape target's: for one or two points per series, the labels
//! are most of the bytes. A fetch of the whole window asks for the series as stored: Prometheus
//! 2.42 spends about 1.3 µs per series and step on `max by` (measured: 1.5 s against 0.6 s for
//! one field of 10,000 GPUs over 70 steps), so aggregating a first pass over 10,000 GPUs (34
//! steps, 5 fields) would cost it 2.2 s more CPU, to save a quarter of the bytes (250 against
//! 338 KB gzip-compressed for that field). Either way the answer is folded as it streams in, per GPU and step, taking the higher
//! value when two series describe one GPU (an exporter restart, two replicas), which is what
//! `max by` would have done; no answer is ever held whole.
//!
//! Any failure (HTTP error, `status: "error"`, a timeout, a body over the limit) makes the data
//! unknown, never zero.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use reclaimer_core::ids::{DigestMap, IdMap};
use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::error::Error;
use crate::http::{Outbound, StreamError, host_port, read_split, redact};

use super::source::{Collection, GpuSource, JobsRead, SourceContext, SourceFailure};
use answer::{
    DEVICE_POINTS_BYTES, Fold, GPUS_PER_LISTED_WORKSPACE, LabelMemo, MAX_REMEMBERED_BYTES, MAX_STEPS_RESERVED, RESULT, SeriesInto, Wanted,
    check_envelope,
};
pub use answer::{MAX_POINTS_BYTES, POINT_BYTES, Series, read_answer};
pub use jobs::DEFAULT_JOB;
use jobs::{Discovery, JobChoice, discovery_query, jobs_to_read};
use query::{AGGREGATE_UP_TO_STEPS, Filters, QuerySpec};

mod answer;
pub mod jobs;
mod query;
use reclaimer_core::gpu::{GpuKey, Ownership, PerPod, merge_device_level, twins_in};

/// One query's body at most (uncompressed); over 10,000 GPUs a steady-state pass reads about
/// 3 MB per field, the first pass about 14 MB.
pub const DEFAULT_MAX_BODY: usize = 128 << 20;
/// Distinct GPU series one pass's answers may hold: twice the 10,000-GPU fleet the benchmarks
/// measure (a larger fleet raises it, and the memory limit with it); answers that name more
/// fail the pass for this source and create nothing more.
pub const DEFAULT_MAX_SERIES: usize = 20_000;

/// Queries sent at once: each is folded as it streams in, so this bounds Prometheus's load (a
/// third of its default 20 concurrent queries), not this process's memory. With 2, a steady pass
/// over 10,000 GPUs (five fields with data) took 1.15-1.33 s, Prometheus and the service each
/// waiting on the other; with 5 or 6, 0.85-1.38 s, median 1.06 s (benches/prometheus.rs).
pub const MAX_QUERIES_IN_FLIGHT: usize = 6;

/// The Prometheus source's settings, as plain values (`Settings::resolve` fills them in from the
/// flags and the config file).
#[derive(Debug, Clone, PartialEq)]
pub struct PrometheusConfig {
    pub url: Url,
    /// Its options; `power` is the policy's, set where the source is built.
    pub options: PrometheusOptions,
    /// The largest answer to one query (`max_prometheus_body_mib`).
    pub max_body: usize,
}

impl PrometheusConfig {
    /// `url` with the default options and limits.
    pub fn new(url: Url) -> Self {
        PrometheusConfig { url, options: PrometheusOptions::default(), max_body: DEFAULT_MAX_BODY }
    }

    pub fn build(&self, cx: &SourceContext) -> Result<PrometheusSource, Error> {
        let options = PrometheusOptions { power: cx.power, series_per_pod: cx.max_gpus_per_workspace + 1, ..self.options.clone() };
        PrometheusSource::with_options(
            &self.url,
            cx.ownership.clone(),
            cx.lookback,
            cx.step,
            cx.timeout,
            cx.outbound,
            self.max_body,
            options,
        )
    }
}

/// Options for stores people run at scale.
#[derive(Debug, Clone, PartialEq)]
pub struct PrometheusOptions {
    /// Extra request headers, e.g. `X-Scope-OrgID` for a Mimir tenant.
    pub headers: Vec<(String, String)>,
    /// A file holding a bearer token (re-read at each pass: a rotated token is picked up).
    pub bearer_token_file: Option<PathBuf>,
    /// Ask for the power draw too: only a policy with a power veto (`active_power_watts`) reads
    /// it, and each field is a sixth of what Prometheus does per pass.
    pub power: bool,
    /// Label matchers added to every query (`exported_namespace="coder"`).
    pub selector: Option<String>,
    /// The exporter's scrape jobs: only series with one of these `job` labels count, not a
    /// look-alike another job exports (or pushes) with a workspace's pod label; unset
    /// (`Discover`), the one job Prometheus names (`jobs`).
    pub jobs: JobChoice,
    /// Distinct GPU series one pass may hold (`max_gpu_series`).
    pub max_series: usize,
    /// GPU series one pod's may hold in one pass (the policy's `max_gpus_per_workspace` plus one,
    /// set where the source is built): past it a pod fails its own workspace, never the source.
    pub series_per_pod: usize,
}

impl Default for PrometheusOptions {
    fn default() -> Self {
        PrometheusOptions {
            headers: Vec::new(),
            bearer_token_file: None,
            power: false,
            selector: None,
            jobs: JobChoice::Named(vec![DEFAULT_JOB.to_string()]),
            max_series: DEFAULT_MAX_SERIES,
            series_per_pod: reclaimer_core::gpu::DEFAULT_MAX_GPUS_PER_WORKSPACE + 1,
        }
    }
}

pub struct PrometheusSource {
    http: reqwest::Client,
    base: String,
    /// The base URL as logs and labels show it.
    shown: String,
    host: String,
    max_body: usize,
    ownership: Ownership,
    /// How far back the first fetch reaches (the longest rule's look-back).
    range: Duration,
    step: Duration,
    options: PrometheusOptions,
    /// The end of the last fetch that succeeded (unix seconds, step-aligned): the next fetches
    /// only the steps after it.
    fetched_until: Mutex<Option<i64>>,
    /// The workspaces the latest listing named (`want`): only their series are held.
    wanted: Mutex<Option<Arc<Wanted>>>,
    /// Workspace GPU keys two scrape targets report, with the targets and the steps they did
    /// (see `twins_in`); a key not co-reported in a fetch is dropped, so it is bounded by the
    /// series a fetch holds.
    co_reported: Mutex<HashMap<GpuKey, (Vec<String>, i64)>>,
    /// Which jobs carry the exporter's series, when `jobs` is `Discover`.
    discovery: Mutex<Discovery>,
    /// How many series the last fetch held: the next reserves room for as many (at most
    /// `max_series`) instead of doubling its list up to them.
    last_series: std::sync::atomic::AtomicUsize,
}

impl PrometheusSource {
    pub fn new(base: &Url, ownership: Ownership, range: Duration, step: Duration, timeout: Duration) -> Result<Self, Error> {
        Self::with_options(base, ownership, range, step, timeout, &Outbound::default(), DEFAULT_MAX_BODY, PrometheusOptions::default())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn with_options(
        base: &Url,
        ownership: Ownership,
        range: Duration,
        step: Duration,
        timeout: Duration,
        outbound: &Outbound,
        max_body: usize,
        options: PrometheusOptions,
    ) -> Result<Self, Error> {
        let http = crate::http::client(timeout, Duration::from_secs(5), outbound)?;
        for (k, v) in &options.headers {
            if HeaderName::from_bytes(k.as_bytes()).is_err() || HeaderValue::from_str(v).is_err() {
                return Err(Error::config(format!("prometheus_headers: {k:?} is not a valid HTTP header name and value")));
            }
        }
        Ok(PrometheusSource {
            http,
            base: base.as_str().trim_end_matches('/').to_string(),
            shown: redact(base).trim_end_matches('/').to_string(),
            host: host_port(base),
            max_body,
            ownership,
            range,
            step: step.max(Duration::from_secs(1)),
            options,
            fetched_until: Mutex::new(None),
            wanted: Mutex::new(None),
            co_reported: Mutex::new(HashMap::new()),
            discovery: Mutex::new(Discovery::default()),
            last_series: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Holds only the series of these workspaces from the next fetch on (the pass's listing):
    /// a store naming other pods, however many, costs nothing but the bytes read. The ids are
    /// remembered as 16-byte digests (`DigestMap`), not copies: a 10,000-workspace listing's
    /// copies and their set took 0.9 MB, held from one pass to the next.
    pub fn want<'a>(&self, workspaces: impl Iterator<Item = &'a str>) {
        let mut wanted = DigestMap::default();
        for id in workspaces {
            wanted.insert(id, ());
        }
        *self.wanted.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(wanted));
    }

    /// Every query a fetch sends: of the whole window (`aggregate = false`), or of a few new
    /// steps (for tests and the README), for the configured jobs (the default job while they are
    /// to be discovered).
    pub fn queries(&self, aggregate: bool) -> Vec<String> {
        let jobs = match &self.options.jobs {
            JobChoice::Named(jobs) => jobs.clone(),
            JobChoice::Discover => vec![DEFAULT_JOB.to_string()],
        };
        QuerySpec::all(self.options.power).iter().map(|q| self.promql(*q, aggregate, &jobs)).collect()
    }

    fn promql(&self, spec: QuerySpec, aggregate: bool, jobs: &[String]) -> String {
        let filters = Filters {
            namespace: self.ownership.namespace.as_deref(),
            workspace_label: self.ownership.workspace_id_label.as_deref(),
            selector: self.options.selector.as_deref(),
            jobs,
        };
        spec.promql(self.step.as_secs().max(1), filters, aggregate)
    }

    /// The scrape jobs to read this pass: the configured ones, or, to be discovered, the one job
    /// Prometheus names (asked at the first pass, again after an hour, and after a failure).
    pub async fn jobs(&self) -> JobsRead {
        let due = self.options.jobs == JobChoice::Discover && self.discovery.lock().unwrap_or_else(|p| p.into_inner()).due();
        if due {
            let answer = self.jobs_with_series().await;
            self.discovery.lock().unwrap_or_else(|p| p.into_inner()).answered(answer);
        }
        jobs_to_read(&self.options.jobs, &self.discovery.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Which jobs carry dcgm-exporter's series now (`jobs::discovery_query`), each with its
    /// series count; jobs without a name are left out (no scrape job has none).
    pub async fn jobs_with_series(&self) -> Result<Vec<(String, u64)>, String> {
        // Now, not the last step's end: a store that began scraping within the step answers too.
        let end = Utc::now().timestamp();
        let mut found: Vec<(String, u64)> = Vec::new();
        let mut on = |s: Series<'_>| {
            let job = s.metric.get("job").unwrap_or("");
            let count = s.values.last().and_then(|v| v.1).filter(|v| v.is_finite() && *v >= 0.0).unwrap_or(0.0);
            if !job.is_empty() && found.len() < jobs::MAX_JOBS_LISTED * 16 {
                found.push((answer::bounded(job).into_owned(), count as u64));
            }
        };
        self.query_each(discovery_query(self.options.selector.as_deref()), (end, end, 60), &mut on).await?;
        Ok(found)
    }

    /// The steps to fetch now: `(start, end)` in unix seconds, both on the step grid, `end`
    /// the latest complete step; `None` when nothing new has completed.
    fn span(&self, now: DateTime<Utc>) -> Option<(i64, i64)> {
        let step = self.step.as_secs().max(1) as i64;
        let end = now.timestamp().div_euclid(step) * step;
        let full = end - (self.range.as_secs() as i64).div_euclid(step) * step;
        let start = match *self.fetched_until.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(until) if until >= full => until + step,
            _ => full,
        };
        (start <= end).then_some((start, end))
    }

    /// Which series speak for which workspace (the namespace filter, the workspace label).
    pub fn ownership(&self) -> &Ownership {
        &self.ownership
    }

    /// Marks each held GPU that two series report under one target at a step as reported by a
    /// second target too (`Fold::instances`), so `twins_in` names it a twin from two such steps.
    async fn count_copies(&self, range: (i64, i64, u64), jobs: &[String], fold: &Arc<Mutex<Fold>>) -> Result<(), String> {
        let filters = Filters {
            namespace: self.ownership.namespace.as_deref(),
            workspace_label: self.ownership.workspace_id_label.as_deref(),
            selector: self.options.selector.as_deref(),
            jobs,
        };
        let query = QuerySpec { name: jobs::DISCOVERY_FAMILY }.copies(range.2.max(1), filters);
        let second: Arc<str> = Arc::from("a second series under the same target");
        let mut copied: Vec<(usize, i64, i64)> = Vec::new();
        let within = |t: f64| t.fract() == 0.0 && (range.0 as f64..=range.1 as f64).contains(&t);
        let mut on = |s: Series<'_>| {
            let times = s.values.iter().filter(|(t, v)| v.is_some() && within(*t)).map(|(t, _)| *t as i64);
            let (Some(key), Some(first), Some(last)) =
                (GpuKey::from_labels(|k| s.metric.get(k), &self.ownership), times.clone().min(), times.max())
            else {
                return;
            };
            let f = fold.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(&i) = f.index.get(&key) {
                copied.push((i, first, last));
            }
        };
        self.query_each(query, range, &mut on).await?;
        let mut f = fold.lock().unwrap_or_else(|p| p.into_inner());
        // Most GPUs in two series each is the store's layout (an HA pair read without
        // de-duplication), not a forger's copies: said, and no twin made of each.
        let held = f.series.iter().filter(|s| s.key.pod.is_some()).count();
        if copied.len() >= 4 && copied.len() * 2 > held {
            return Err(format!(
                "{} of {held} GPUs have two series under one target: the store keeps duplicates (an HA pair read without de-duplication?); read a de-duplicating endpoint or one replica",
                copied.len()
            ));
        }
        for (i, first, last) in copied {
            let targets = f.instances.entry(i).or_default();
            if !targets.iter().any(|(t, _, _)| *t == second) && targets.len() < 4 {
                targets.push((second.clone(), first, last));
            }
        }
        Ok(())
    }

    /// The step every fetch is read at.
    pub fn step(&self) -> Duration {
        self.step
    }

    /// The base URL as logs and reports show it.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// One `query_range` of the caller's own query (the backtest's coderd gauges), with this
    /// source's headers, timeout and body limit; each series handed to `on_series` as the
    /// answer streams in, labels decoded.
    pub async fn query_each(
        &self,
        query: String,
        range: (i64, i64, u64),
        on_series: &mut (dyn FnMut(Series<'_>) + Send),
    ) -> Result<(), String> {
        let (start, end, step) = range;
        let headers = self.headers()?;
        let url = format!("{}/api/v1/query_range", self.base);
        let params = [("query", query), ("start", start.to_string()), ("end", end.to_string()), ("step", format!("{step}s"))];
        let resp = crate::http::send(self.http.get(&url).headers(headers).query(&params)).await?;
        let status = resp.status().as_u16();
        let mut each = answer::EachSeries { status, on_series, values: Vec::new() };
        let rest = read_split(resp, self.max_body, RESULT, &mut each).await.map_err(|e| match e {
            StreamError::Body(e) => e.to_string(),
            StreamError::Parse(e) => e,
        })?;
        check_envelope(status, &rest)
    }

    fn headers(&self) -> Result<HeaderMap, String> {
        let mut h = HeaderMap::new();
        for (k, v) in &self.options.headers {
            if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_str(v)) {
                h.insert(k, v);
            }
        }
        if let Some(path) = &self.options.bearer_token_file {
            let token =
                crate::http::read_secret_file(path).map_err(|e| format!("cannot read the bearer token file {}: {e}", path.display()))?;
            let mut v = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
                .map_err(|_| "the bearer token file holds no valid token".to_string())?;
            v.set_sensitive(true);
            h.insert(reqwest::header::AUTHORIZATION, v);
        }
        Ok(h)
    }
}

struct Query {
    http: reqwest::Client,
    base: String,
    max_body: usize,
    headers: HeaderMap,
}

impl PrometheusSource {
    /// Every field's query over one slice of steps, a few at a time, folded into `fold`; the
    /// failures (none: the slice is whole).
    async fn fetch_slice(
        &self,
        specs: &[QuerySpec],
        headers: &HeaderMap,
        range: (i64, i64, u64),
        aggregate: bool,
        jobs: &[String],
        fold: &Arc<Mutex<Fold>>,
    ) -> Vec<SourceFailure> {
        // A few queries at a time: each keeps Prometheus busy evaluating it (a whole window over
        // 10,000 GPUs is 700,000 points per field); more would only queue there.
        let in_flight = Arc::new(Semaphore::new(MAX_QUERIES_IN_FLIGHT));
        let mut tasks = JoinSet::new();
        for &spec in specs {
            let in_flight = in_flight.clone();
            let q = Query { http: self.http.clone(), base: self.base.clone(), max_body: self.max_body, headers: headers.clone() };
            let query = self.promql(spec, aggregate, jobs);
            let fold = fold.clone();
            tasks.spawn(async move {
                let _permit = in_flight.acquire_owned().await;
                (spec, query_range(q, spec, query, range, fold).await)
            });
        }
        let mut failures = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((_, Ok(()))) => {}
                Ok((spec, Err(error))) => {
                    failures.push(SourceFailure::new(self.shown.clone(), self.host.clone(), format!("{} query: {error}", spec.name)))
                }
                Err(e) => failures.push(SourceFailure::new(self.shown.clone(), self.host.clone(), format!("a query task failed: {e}"))),
            }
        }
        failures
    }
}

/// Steps one query asks for at most: a longer fetch (a first pass over a long look-back) is
/// sent as slices of this many steps, oldest first.
const SLICE_STEPS: i64 = 60;

/// Sends one `query_range` and folds its answer into `fold` as it streams in.
async fn query_range(q: Query, spec: QuerySpec, query: String, range: (i64, i64, u64), fold: Arc<Mutex<Fold>>) -> Result<(), String> {
    let (start, end, step) = range;
    let url = format!("{}/api/v1/query_range", q.base);
    let params = [("query", query), ("start", start.to_string()), ("end", end.to_string()), ("step", format!("{step}s"))];
    let resp = crate::http::send(q.http.get(&url).headers(q.headers).query(&params)).await?;
    let status = resp.status().as_u16();
    let mut into = SeriesInto { status, spec, fold: &fold, points: Vec::new() };
    let rest = read_split(resp, q.max_body, RESULT, &mut into).await.map_err(|e| match e {
        StreamError::Body(e) => e.to_string(),
        StreamError::Parse(e) => e,
    })?;
    check_envelope(status, &rest)
}

impl GpuSource for PrometheusSource {
    async fn collect(&self, now: DateTime<Utc>) -> Collection {
        let Some((start, end)) = self.span(now) else {
            return self.nothing();
        };
        self.collect_span(start, end, true).await
    }
}

impl PrometheusSource {
    /// The steps from `start` to `end` (unix seconds, inclusive, step-aligned), fetched as a
    /// pass fetches its span, without moving where the next pass's fetch starts: several spans
    /// may be in flight at once (the backtest fetches the chunks ahead of the one it replays).
    pub async fn collect_between(&self, start: i64, end: i64) -> Collection {
        let step = self.step.as_secs().max(1) as i64;
        let (start, end) = (start.div_euclid(step) * step, end.div_euclid(step) * step);
        if start > end {
            return self.nothing();
        }
        self.collect_span(start, end, false).await
    }

    /// A fetch that brought no series: no request, no failure, this source's step.
    fn nothing(&self) -> Collection {
        Collection { step: Some(self.step), ..Collection::default() }
    }

    /// One fetch of `[start, end]`; `advance`: the next `collect` starts after what it fetched.
    async fn collect_span(&self, start: i64, end: i64, advance: bool) -> Collection {
        let specs = QuerySpec::all(self.options.power);
        let headers = match self.headers() {
            Ok(h) => h,
            Err(error) => {
                let failures = vec![SourceFailure::new(self.shown.clone(), self.host.clone(), error)];
                return Collection { failures, ..self.nothing() };
            }
        };
        // No job to read: nothing is asked for (an empty list would match every job).
        let read = self.jobs().await;
        if read.jobs.is_empty() {
            let failures = read.problem.iter().map(|p| SourceFailure::new(self.shown.clone(), self.host.clone(), p.clone())).collect();
            return Collection { failures, requests: 1, jobs: Some(read), ..self.nothing() };
        }
        let step = self.step.as_secs().max(1);
        let steps = (end - start) / step as i64 + 1;
        let aggregate = steps <= AGGREGATE_UP_TO_STEPS;
        let wanted = self.wanted.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let wanted_count = wanted.as_ref().map_or(0, |w| w.len());
        let mut requests = 0;
        let fold = Arc::new(Mutex::new(Fold {
            source: Arc::from(self.shown.as_str()),
            ownership: self.ownership.clone(),
            steps: usize::try_from(steps).unwrap_or(0).min(MAX_STEPS_RESERVED),
            index: DigestMap::default(),
            series: Vec::with_capacity(self.last_series.load(std::sync::atomic::Ordering::Relaxed).min(self.options.max_series)),
            max_series: self.options.max_series,
            over: false,
            per_pod: PerPod::with_cap(self.options.series_per_pod),
            instances: IdMap::default(),
            wanted,
            unlisted: Vec::new(),
            step_secs: step as i64,
            slice: (start, end),
            slice_times: Vec::new(),
            points_left: MAX_POINTS_BYTES / POINT_BYTES
                + wanted_count.saturating_mul(GPUS_PER_LISTED_WORKSPACE).saturating_mul(usize::try_from(steps).unwrap_or(0)),
            device_points_left: DEVICE_POINTS_BYTES / POINT_BYTES,
            device_series: 0,
            span: (start, end),
            memo: LabelMemo::new(MAX_REMEMBERED_BYTES),
        }));
        // The steps in slices of `SLICE_STEPS`, oldest first: each query's answer (and what
        // Prometheus evaluates for it, `query.max-samples`) stays bounded however long the
        // look-back, and a slice that fails leaves the slices before it fetched.
        let mut failures = Vec::new();
        let mut done_until = None;
        let mut from = start;
        while from <= end {
            let to = (from + (SLICE_STEPS - 1) * step as i64).min(end);
            fold.lock().unwrap_or_else(|p| p.into_inner()).set_slice(from, to);
            requests += specs.len();
            let slice = self.fetch_slice(&specs, &headers, (from, to, step), aggregate, &read.jobs, &fold).await;
            if !slice.is_empty() {
                failures = slice;
                break;
            }
            done_until = Some(to);
            from = to + step as i64;
        }
        // Steady passes fold copies of a GPU under one target into one: count them (the readings
        // stand either way, so a failure is said, not a failed source).
        if aggregate && failures.is_empty() && done_until.is_some() {
            requests += 1;
            if let Err(e) = self.count_copies((start, end, step), &read.jobs, &fold).await {
                tracing::warn!(event = "gpu_copies_unread", source = %self.shown, "cannot tell copies of a GPU under one scrape target this pass: {e}");
            }
        }
        let max = self.options.max_series;
        let over = fold.lock().unwrap_or_else(|p| p.into_inner()).over;
        if over {
            failures.push(SourceFailure::new(
                self.shown.clone(),
                self.host.clone(),
                format!("the answers name more than {max} distinct GPU series (max_gpu_series): raise it if the fleet is that large, or narrow the queries with prometheus_selector"),
            ));
        }
        let Some(done_until) = done_until.filter(|_| !over) else {
            // A partial picture is worse than none: a missing SM_ACTIVE would fall back to
            // utilization silently. Report every GPU from this source as unknown, and fetch
            // these steps again next pass.
            return Collection { failures, requests, jobs: Some(read), ..self.nothing() };
        };
        if !failures.is_empty() {
            // The slices before the failed one are whole: kept, and not fetched again; the
            // failed one's points are dropped (some of its fields may be missing).
            let mut f = fold.lock().unwrap_or_else(|p| p.into_inner());
            for s in &mut f.series {
                s.points.retain(|p| p.at.timestamp() <= done_until);
            }
        }
        if advance {
            *self.fetched_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(done_until);
        }
        let (twins, twin_count) = {
            let mut f = fold.lock().unwrap_or_else(|p| p.into_inner());
            let instances = std::mem::take(&mut f.instances);
            twins_in(&f.series, instances, step as i64, &mut self.co_reported.lock().unwrap_or_else(|p| p.into_inner()))
        };
        let (mut series, unlisted) = {
            let mut f = fold.lock().unwrap_or_else(|p| p.into_inner());
            (std::mem::take(&mut f.series), std::mem::take(&mut f.unlisted))
        };
        self.last_series.store(series.len(), std::sync::atomic::Ordering::Relaxed);
        merge_device_level(&mut series);
        // In place: one series per key (`Fold::index`), so the order is the same as a stable
        // sort's, without its buffer of half the list.
        series.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        // Every workspace one of whose GPUs is a twin (the listed twins are the first few only).
        let twinned = {
            let co = self.co_reported.lock().unwrap_or_else(|p| p.into_inner());
            series
                .iter()
                .filter(|s| co.get(&s.key).is_some_and(|(_, steps)| *steps >= 2))
                .filter_map(|s| s.workspace_id.as_deref().map(str::to_string))
                .collect()
        };
        // Configured jobs that hold no listed workspace's series: which jobs do (hourly), to say.
        let mut read = read;
        let blind = wanted_count > 0 && !series.iter().any(|s| s.workspace_id.is_some());
        if blind && matches!(self.options.jobs, JobChoice::Named(_)) && self.discovery.lock().unwrap_or_else(|p| p.into_inner()).due() {
            let answer = self.jobs_with_series().await;
            self.discovery.lock().unwrap_or_else(|p| p.into_inner()).answered(answer);
            read = jobs_to_read(&self.options.jobs, &self.discovery.lock().unwrap_or_else(|p| p.into_inner()));
        }
        Collection { series, failures, twins, twin_count, twinned, requests, step: Some(self.step), unlisted, jobs: Some(read) }
    }
}

#[cfg(test)]
mod tests;
