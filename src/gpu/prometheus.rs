//! Reads GPU history from Prometheus (or Thanos, Mimir, VictoriaMetrics) instead of scraping
//! exporters, for large fleets. Decisions need raw samples, never the values Prometheus fills in
//! for up to 5 minutes (its lookback), so every point is `max_over_time(x[step])` at a
//! step-aligned time: the highest raw sample in that step, and no point at all for a step with no
//! raw sample (a gap or stale series shows as what it is). Points are aggregated by the labels
//! that identify a GPU and its pod (the scrape target's own labels dropped), only the signals
//! the decisions use are asked for, one query per signal and unit (a constant number, whatever
//! the fleet size), and after the first pass only the new steps are fetched. Any failure (HTTP
//! error, `status: "error"`, a timeout, a body over the limit) makes the data unknown, never zero.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::signals::{NAMES, Signal, SignalValues};
use crate::error::Error;
use crate::http::{Tls, error_chain, host_port, read_limited, redact, redirect_refused};

use super::{Collection, GpuKey, GpuReading, GpuSource, Ownership, SourceFailure, merge_shared};

/// One query's body at most; a steady-state pass reads a few hundred KB, the first pass over
/// 10,000 GPUs a few tens of MB.
pub const DEFAULT_MAX_BODY: usize = 128 << 20;

/// Queries sent at once: each holds its body and its parsed matrix until it is merged.
const MAX_QUERIES_IN_FLIGHT: usize = 2;

/// The labels a point is aggregated by: what identifies a GPU (`UUID`, or `uuid` with `-o`; a MIG
/// instance), its pod and namespace (as the exporter names them, as Prometheus renames them, and
/// with `-o`), its model, and the virtual-GPU marker. The scrape target's `instance`, `job`,
/// `pod` of the exporter and the like are dropped (`pod` is kept for the workload when there is
/// no `exported_pod`).
const BY: &[&str] = &[
    "UUID",
    "uuid",
    "GPU_I_ID",
    "pod",
    "exported_pod",
    "pod_name",
    "namespace",
    "exported_namespace",
    "pod_namespace",
    "modelName",
    "vgpu",
];

/// Options for stores people run at scale.
#[derive(Debug, Clone, Default)]
pub struct PrometheusOptions {
    /// Extra request headers, e.g. `X-Scope-OrgID` for a Mimir tenant.
    pub headers: Vec<(String, String)>,
    /// A file holding a bearer token (re-read at each pass: a rotated token is picked up).
    pub bearer_token_file: Option<PathBuf>,
}

/// What one query asks for: a signal in one unit (its names share a scale), or the energy counter.
#[derive(Debug, Clone)]
struct QuerySpec {
    signal: Option<Signal>,
    names: Vec<&'static str>,
}

impl QuerySpec {
    /// The signals the decisions use, grouped by unit, and the energy counter.
    fn all() -> Vec<QuerySpec> {
        let mut specs: Vec<QuerySpec> = Vec::new();
        // Names share a query when they share a unit: the same scale, and for utilization the
        // same reading of values above 1 (`Mapping::normalise`).
        let unit =
            |m: &super::signals::Mapping| (m.signal, m.scale.to_bits(), m.signal == Signal::GpuUtil && m.name.ends_with("_UTIL_RATIO"));
        for m in NAMES {
            match specs.iter_mut().find(|q| super::signals::lookup(q.names[0]).is_some_and(|x| unit(&x) == unit(m))) {
                Some(q) => q.names.push(m.name),
                None => specs.push(QuerySpec { signal: Some(m.signal), names: vec![m.name] }),
            }
        }
        specs.push(QuerySpec { signal: None, names: vec!["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] });
        specs
    }

    /// `max by (GPU and pod labels) (max_over_time({__name__=~"A|B"}[STEPs]))`, for the namespace
    /// if one is set (as the exporter or as Prometheus names the label).
    fn promql(&self, step_secs: u64, namespace: Option<&str>, workspace_label: Option<&str>) -> String {
        let names = self.names.join("|");
        let mut by: Vec<&str> = BY.to_vec();
        if let Some(l) = workspace_label {
            by.push(l);
        }
        let by = by.join(", ");
        let select = |ns_matcher: &str| format!("max by ({by}) (max_over_time({{__name__=~\"{names}\"{ns_matcher}}}[{step_secs}s]))");
        match namespace {
            None => select(""),
            Some(ns) => {
                let ns = ns.replace('\\', "\\\\").replace('"', "\\\"");
                format!("{} or {}", select(&format!(",exported_namespace=\"{ns}\"")), select(&format!(",namespace=\"{ns}\"")))
            }
        }
    }
}

#[derive(Deserialize)]
struct Envelope {
    status: String,
    #[serde(default)]
    data: Option<MatrixData>,
    #[serde(default, rename = "errorType")]
    error_type: String,
    #[serde(default)]
    error: String,
}

#[derive(Deserialize)]
struct MatrixData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<Series>,
}

/// One series of a `query_range` answer.
#[derive(Debug, Deserialize)]
pub struct Series {
    pub metric: HashMap<String, String>,
    #[serde(default)]
    pub values: Vec<(f64, String)>,
}

/// Decodes a `query_range` answer: the series of a `matrix`, or what went wrong. Never panics,
/// whatever the bytes.
pub fn parse_matrix(status: u16, body: &[u8]) -> Result<Vec<Series>, String> {
    let envelope: Envelope = serde_json::from_slice(body).map_err(|_| format!("HTTP {status}: not a Prometheus API response"))?;
    if envelope.status != "success" || !(200..300).contains(&status) {
        return Err(format!("HTTP {status}: {} {}", envelope.error_type, envelope.error).trim_end().to_string());
    }
    let data = envelope.data.ok_or("success without data")?;
    if data.result_type != "matrix" {
        return Err(format!("expected a matrix, got {}", data.result_type));
    }
    Ok(data.result)
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
}

impl PrometheusSource {
    pub fn new(base: &Url, ownership: Ownership, range: Duration, step: Duration, timeout: Duration) -> Result<Self, Error> {
        Self::with_options(base, ownership, range, step, timeout, &Tls::default(), DEFAULT_MAX_BODY, PrometheusOptions::default())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn with_options(
        base: &Url,
        ownership: Ownership,
        range: Duration,
        step: Duration,
        timeout: Duration,
        tls: &Tls,
        max_body: usize,
        options: PrometheusOptions,
    ) -> Result<Self, Error> {
        let http = crate::http::client(timeout, Duration::from_secs(5), tls)?;
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
        })
    }

    /// Every query a pass sends (for tests and the README).
    pub fn queries(&self) -> Vec<String> {
        let step = self.step.as_secs();
        QuerySpec::all()
            .iter()
            .map(|q| q.promql(step, self.ownership.namespace.as_deref(), self.ownership.workspace_id_label.as_deref()))
            .collect()
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

    fn headers(&self) -> Result<HeaderMap, String> {
        let mut h = HeaderMap::new();
        for (k, v) in &self.options.headers {
            if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_str(v)) {
                h.insert(k, v);
            }
        }
        if let Some(path) = &self.options.bearer_token_file {
            let token = std::fs::read_to_string(path).map_err(|e| format!("cannot read the bearer token file {}: {e}", path.display()))?;
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

async fn query_range(q: Query, query: String, start: i64, end: i64, step: u64) -> Result<Vec<Series>, String> {
    let url = format!("{}/api/v1/query_range", q.base);
    let params = [("query", query), ("start", start.to_string()), ("end", end.to_string()), ("step", format!("{step}s"))];
    let resp =
        q.http.get(&url).headers(q.headers).query(&params).send().await.map_err(|e| {
            if e.is_timeout() { "timed out".to_string() } else { format!("no response: {}", error_chain(&e.without_url())) }
        })?;
    let status = resp.status();
    if status.is_redirection() {
        return Err(redirect_refused(status.as_u16(), resp.headers()));
    }
    let body = read_limited(resp, q.max_body).await.map_err(|e| e.to_string())?;
    parse_matrix(status.as_u16(), &body)
}

impl GpuSource for PrometheusSource {
    async fn collect(&self, now: DateTime<Utc>) -> Collection {
        let specs = QuerySpec::all();
        let requests = specs.len();
        let Some((start, end)) = self.span(now) else {
            return Collection { readings: Vec::new(), failures: Vec::new(), requests: 0, step: Some(self.step) };
        };
        let headers = match self.headers() {
            Ok(h) => h,
            Err(error) => {
                let failures = vec![SourceFailure::new(self.shown.clone(), self.host.clone(), error)];
                return Collection { readings: Vec::new(), failures, requests: 0, step: Some(self.step) };
            }
        };
        let step = self.step.as_secs().max(1);
        let mut tasks = JoinSet::new();
        // A few queries at a time: a full window's bodies and matrices, all at once, would be
        // the pass's peak memory (12 x 10,000 series at a fleet's first pass).
        let in_flight = Arc::new(Semaphore::new(MAX_QUERIES_IN_FLIGHT));
        for (i, spec) in specs.iter().enumerate() {
            let in_flight = in_flight.clone();
            let q = Query { http: self.http.clone(), base: self.base.clone(), max_body: self.max_body, headers: headers.clone() };
            let query = spec.promql(step, self.ownership.namespace.as_deref(), self.ownership.workspace_id_label.as_deref());
            tasks.spawn(async move {
                let _permit = in_flight.acquire_owned().await;
                (i, query_range(q, query, start, end, step).await)
            });
        }
        let source: Arc<str> = Arc::from(self.shown.as_str());
        let mut failures = Vec::new();
        let mut points: HashMap<(GpuKey, i64), GpuReading> = HashMap::new();
        while let Some(joined) = tasks.join_next().await {
            let Ok((i, result)) = joined else { continue };
            let spec = &specs[i];
            let series = match result {
                Ok(s) => s,
                Err(error) => {
                    let what = spec.signal.map_or("energy", Signal::as_str);
                    failures.push(SourceFailure::new(self.shown.clone(), self.host.clone(), format!("{what} query: {error}")));
                    continue;
                }
            };
            let mapping = spec.names.first().and_then(|n| super::signals::lookup(n));
            for s in series {
                let Some(uuid) = s.metric.get("UUID").or_else(|| s.metric.get("uuid")) else { continue };
                let (workspace_id, pod, namespace) = self.ownership.owner(|k| s.metric.get(k).cloned());
                let key = GpuKey { uuid: uuid.clone(), gpu_instance: s.metric.get("GPU_I_ID").cloned(), pod };
                for (t, v) in &s.values {
                    let Ok(value) = v.parse::<f64>() else { continue };
                    let secs = t.round() as i64;
                    let Some(at) = DateTime::from_timestamp(secs, 0) else { continue };
                    let reading = points.entry((key.clone(), secs)).or_insert_with(|| GpuReading {
                        key: key.clone(),
                        workspace_id: workspace_id.clone(),
                        namespace: namespace.clone(),
                        model: s.metric.get("modelName").cloned(),
                        at,
                        values: SignalValues::default(),
                        source: source.clone(),
                        shared: s.metric.get("vgpu").is_some_and(|v| !v.is_empty()),
                        energy_joules: None,
                    });
                    match (spec.signal, mapping) {
                        (Some(signal), Some(m)) => {
                            if let Some(v) = m.normalise(value) {
                                reading.values.set(signal, v);
                            }
                        }
                        _ => reading.energy_joules = super::signals::energy_joules("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", value).flatten(),
                    }
                }
            }
        }
        if !failures.is_empty() {
            // A partial picture is worse than none: a missing SM_ACTIVE would fall back to
            // utilization silently. Report every GPU from this source as unknown, and fetch
            // these steps again next pass.
            return Collection { readings: Vec::new(), failures, requests, step: Some(self.step) };
        }
        *self.fetched_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(end);
        let mut readings: Vec<GpuReading> = points.into_values().collect();
        merge_shared(&mut readings);
        readings.sort_by(|a, b| a.at.cmp(&b.at).then_with(|| a.key.cmp(&b.key)));
        Collection { readings, failures, requests, step: Some(self.step) }
    }
}
