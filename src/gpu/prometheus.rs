//! Reads GPU history from Prometheus instead of scraping exporters (for large fleets): one
//! `query_range` per canonical signal over the decision window, step = the pass interval, so a
//! pass costs a constant number of queries whatever the fleet size. Any failure (HTTP error,
//! `status: "error"`, a timeout) makes the data unknown, never zero.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::Url;
use serde::Deserialize;
use tokio::task::JoinSet;

use super::signals::{Signal, SignalValues, lookup};
use crate::error::Error;
use crate::http::{Tls, error_chain, host_port, read_limited, redact, redirect_refused};

use super::{Collection, GpuKey, GpuReading, GpuSource, Ownership, SourceFailure};

/// One query's body at most: 7 queries over 10,000 GPUs read about 105 MB in all.
pub const DEFAULT_MAX_BODY: usize = 128 << 20;

pub struct PrometheusSource {
    http: reqwest::Client,
    base: String,
    /// The base URL as logs and labels show it.
    shown: String,
    host: String,
    max_body: usize,
    ownership: Ownership,
    /// How far back each query reaches (the longest rule's look-back).
    range: Duration,
    step: Duration,
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

impl PrometheusSource {
    pub fn new(base: &Url, ownership: Ownership, range: Duration, step: Duration, timeout: Duration) -> Result<Self, Error> {
        Self::with_options(base, ownership, range, step, timeout, &Tls::default(), DEFAULT_MAX_BODY)
    }

    pub fn with_options(
        base: &Url,
        ownership: Ownership,
        range: Duration,
        step: Duration,
        timeout: Duration,
        tls: &Tls,
        max_body: usize,
    ) -> Result<Self, Error> {
        let http = crate::http::client(timeout, Duration::from_secs(5), tls)?;
        Ok(PrometheusSource {
            http,
            base: base.as_str().trim_end_matches('/').to_string(),
            shown: redact(base).trim_end_matches('/').to_string(),
            host: host_port(base),
            max_body,
            ownership,
            range,
            step: step.max(Duration::from_secs(1)),
        })
    }

    /// `{__name__=~"LEGACY|RENAMED"}`: every name that carries the signal, in one query.
    pub fn query_for(signal: Signal) -> String {
        let names: Vec<&str> = signal.metric_names().collect();
        format!("{{__name__=~\"{}\"}}", names.join("|"))
    }
}

struct Query {
    http: reqwest::Client,
    base: String,
    max_body: usize,
}

async fn query_range(q: Query, query: String, start: f64, end: f64, step: f64) -> Result<Vec<Series>, String> {
    let url = format!("{}/api/v1/query_range", q.base);
    let params = [("query", query), ("start", format!("{start:.3}")), ("end", format!("{end:.3}")), ("step", format!("{step}s"))];
    let resp =
        q.http.get(&url).query(&params).send().await.map_err(|e| {
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
        let end = now.timestamp_millis() as f64 / 1000.0;
        let start = end - self.range.as_secs_f64();
        let mut tasks = JoinSet::new();
        for signal in Signal::ALL {
            let q = Query { http: self.http.clone(), base: self.base.clone(), max_body: self.max_body };
            let step = self.step.as_secs_f64();
            tasks.spawn(async move { (signal, query_range(q, Self::query_for(signal), start, end, step).await) });
        }
        let source: Arc<str> = Arc::from(self.shown.as_str());
        let mut failures = Vec::new();
        let mut points: HashMap<(GpuKey, i64), GpuReading> = HashMap::new();
        while let Some(joined) = tasks.join_next().await {
            let Ok((signal, result)) = joined else { continue };
            let series = match result {
                Ok(s) => s,
                Err(error) => {
                    let error = format!("{} query: {error}", signal.as_str());
                    failures.push(SourceFailure::new(self.shown.clone(), self.host.clone(), error));
                    continue;
                }
            };
            for s in series {
                let mapping = s.metric.get("__name__").and_then(|n| lookup(n));
                let Some(uuid) = s.metric.get("UUID").or_else(|| s.metric.get("uuid")) else { continue };
                let (workspace_id, pod, namespace) = self.ownership.owner(|k| s.metric.get(k).cloned());
                let key = GpuKey { uuid: uuid.clone(), gpu_instance: s.metric.get("GPU_I_ID").cloned(), pod };
                for (t, v) in &s.values {
                    let Ok(value) = v.parse::<f64>() else { continue };
                    let millis = (t * 1000.0).round() as i64;
                    let Some(at) = DateTime::from_timestamp_millis(millis) else { continue };
                    let reading = points.entry((key.clone(), millis)).or_insert_with(|| GpuReading {
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
                    if let Some(v) = mapping.map_or(Some(value), |m| m.normalise(value)) {
                        reading.values.set(signal, v);
                    }
                }
            }
        }
        if !failures.is_empty() {
            // A partial picture is worse than none: a missing SM_ACTIVE would fall back to
            // utilization silently. Report every GPU from this source as unknown.
            return Collection { readings: Vec::new(), failures, requests: Signal::ALL.len() };
        }
        let mut readings: Vec<GpuReading> = points.into_values().collect();
        readings.sort_by_key(|r| r.at);
        Collection { readings, failures, requests: Signal::ALL.len() }
    }
}
