//! Scrapes dcgm-exporter `/metrics` URLs directly, at most 32 at a time, once per pass and
//! every sample interval between passes. Each body is folded into series as it streams in, never
//! held whole. Memory is bounded whatever an exporter sends: a body at most `max_body`, what the
//! scrapes in flight receive together at most the in-flight budget, one scrape at most `max_gpus`
//! distinct GPU series (a breach fails that exporter this pass). One exporter failing, or
//! answering with an empty body (it does during a hot reload), makes only its GPUs
//! unknown. `dns+http://name:port/path` expands to every address the name resolves to (a
//! headless Service), each scraped on its own. Each value is the exporter's latest cached
//! reading; the scrape time is recorded as the sample time.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::Url;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::error::Error;
use crate::http::{BodyBudget, Outbound, host_port, http_url, redact, stream_within};

/// Scrapes in flight at once: bounds sockets and memory on large fleets (each body is folded
/// into readings inside its task as it arrives).
pub const MAX_CONCURRENT_SCRAPES: usize = 32;
/// One exporter's body at most: a node of 8 GPUs is about 80 KB (30 metrics each), a MIG node
/// a few hundred KB; an endless body stops here instead of filling memory.
pub const DEFAULT_MAX_BODY: usize = 16 << 20;
/// Distinct GPU series one scrape may hold: a node has at most 8-16 GPUs, each at most 7 MIG
/// instances, and virtual-GPU mode repeats a device once per pod; 512 is far above any of them.
pub const DEFAULT_MAX_GPUS: usize = 512;
/// What the scrapes in flight may receive together (32 at a time, 16 MiB each would be 512 MiB):
/// real bodies are about 100 KB, so 32 of them are 3 MB. A body is folded into series as it
/// arrives and never held whole; what a scrape keeps (its series, the label sets it remembers, a
/// line that spans two chunks) is bounded by what it received. Each scrape's first 512 KiB are
/// its own (`BodyBudget`): stalled exporters cannot starve healthy ones.
pub const DEFAULT_IN_FLIGHT_BUDGET: usize = 32 << 20;

/// How much one exporter may send, and all of them together.
#[derive(Debug, Clone)]
pub struct ExporterLimits {
    pub max_body: usize,
    pub max_gpus: usize,
    pub in_flight: BodyBudget,
}

impl Default for ExporterLimits {
    fn default() -> Self {
        ExporterLimits {
            max_body: DEFAULT_MAX_BODY,
            max_gpus: DEFAULT_MAX_GPUS,
            in_flight: BodyBudget::new(DEFAULT_IN_FLIGHT_BUDGET, MAX_CONCURRENT_SCRAPES),
        }
    }
}

use super::source::{Collection, GpuSource, SourceContext, SourceFailure};
use reclaimer_core::gpu::scrape::ScrapeFold;
use reclaimer_core::gpu::{GpuSeries, Ownership};

/// The exporter source's settings, as plain values (`Settings::resolve` fills them in from the
/// flags and the config file).
#[derive(Debug, Clone, PartialEq)]
pub struct ExporterConfig {
    pub targets: Vec<ExporterTarget>,
    /// The largest scrape body (`max_exporter_body_mib`).
    pub max_body: usize,
    /// GPU series one scrape may hold (`max_gpus_per_exporter`).
    pub max_gpus: usize,
    /// What the scrapes in flight may hold together (`max_in_flight_body_mib`).
    pub in_flight: usize,
}

impl ExporterConfig {
    /// `targets` with the default limits.
    pub fn new(targets: Vec<ExporterTarget>) -> Self {
        ExporterConfig { targets, max_body: DEFAULT_MAX_BODY, max_gpus: DEFAULT_MAX_GPUS, in_flight: DEFAULT_IN_FLIGHT_BUDGET }
    }

    pub fn build(&self, cx: &SourceContext) -> Result<ExporterSource, Error> {
        let limits = ExporterLimits {
            max_body: self.max_body,
            max_gpus: self.max_gpus,
            in_flight: BodyBudget::new(self.in_flight, MAX_CONCURRENT_SCRAPES),
        };
        ExporterSource::with_options(self.targets.clone(), cx.ownership.clone(), cx.timeout, cx.outbound, limits)
    }
}

/// One `--dcgm-exporter` value: a URL scraped as it is, or `dns+http://name:port/path`, scraped
/// at every address the name resolves to (a headless Service).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExporterTarget {
    Url(Url),
    /// The URL after `dns+`; its host is resolved at each collection.
    Dns(Url),
}

impl ExporterTarget {
    pub fn parse(raw: &str) -> Result<Self, Error> {
        const EXAMPLE: &str = "http://10.0.0.7:9400/metrics or dns+http://nvidia-dcgm-exporter.gpu-operator:9400/metrics";
        match raw.trim().strip_prefix("dns+") {
            Some(rest) => Ok(ExporterTarget::Dns(http_url("--dcgm-exporter", rest, EXAMPLE)?)),
            None => Ok(ExporterTarget::Url(http_url("--dcgm-exporter", raw, EXAMPLE)?)),
        }
    }
}

impl fmt::Display for ExporterTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExporterTarget::Url(u) => write!(f, "{}", redact(u)),
            ExporterTarget::Dns(u) => write!(f, "dns+{}", redact(u)),
        }
    }
}

pub struct ExporterSource {
    http: reqwest::Client,
    targets: Vec<ExporterTarget>,
    ownership: Ownership,
    limits: ExporterLimits,
}

impl ExporterSource {
    /// Which series speak for which workspace (the namespace filter, the workspace label).
    pub fn ownership(&self) -> &Ownership {
        &self.ownership
    }

    pub fn new(targets: Vec<ExporterTarget>, ownership: Ownership, timeout: Duration) -> Result<Self, Error> {
        Self::with_options(targets, ownership, timeout, &Outbound::default(), ExporterLimits::default())
    }

    pub fn with_options(
        targets: Vec<ExporterTarget>,
        ownership: Ownership,
        timeout: Duration,
        outbound: &Outbound,
        limits: ExporterLimits,
    ) -> Result<Self, Error> {
        let http = crate::http::client(timeout, Duration::from_secs(3), outbound)?;
        Ok(ExporterSource { http, targets, ownership, limits })
    }

    /// The concrete URLs to scrape this pass, with failures for names that did not resolve.
    async fn expand(&self) -> (Vec<Url>, Vec<SourceFailure>) {
        let mut urls = Vec::new();
        let mut failures = Vec::new();
        for target in &self.targets {
            let url = match target {
                ExporterTarget::Url(u) => {
                    urls.push(u.clone());
                    continue;
                }
                ExporterTarget::Dns(u) => u,
            };
            let fail = |error: String| SourceFailure::new(format!("dns+{}", redact(url)), host_port(url), error);
            match resolve_all(url).await {
                Ok(expanded) if !expanded.is_empty() => urls.extend(expanded),
                Ok(_) => failures.push(fail("the name resolved to no address".into())),
                Err(e) => failures.push(fail(e)),
            }
        }
        (urls, failures)
    }
}

/// `http://name:port/path` -> one URL per resolved address.
async fn resolve_all(url: &Url) -> Result<Vec<Url>, String> {
    let host = url.host_str().unwrap_or_default();
    let port = url.port_or_known_default().unwrap_or(80);
    let addrs = tokio::net::lookup_host((host, port)).await.map_err(|e| format!("cannot resolve {host}: {e}"))?;
    let mut urls: Vec<Url> = addrs
        .map(|a| {
            let mut u = url.clone();
            // An IP host and a port are always valid for an http(s) URL.
            let _ = u.set_ip_host(a.ip());
            let _ = u.set_port(Some(a.port()));
            u
        })
        .collect();
    urls.sort();
    urls.dedup();
    Ok(urls)
}

/// One scrape: the body folded into one series per GPU as it arrives (never held whole), at most
/// `max_body` bytes and within the in-flight budget; a redirect is refused. An empty body, one
/// with no DCGM metric, or one naming more than `max_gpus` GPUs is a failure.
async fn scrape(
    http: reqwest::Client,
    url: Url,
    source: &Arc<str>,
    now: DateTime<Utc>,
    ownership: &Ownership,
    limits: &ExporterLimits,
) -> Result<Vec<GpuSeries>, String> {
    let resp = crate::http::send(http.get(url)).await?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("HTTP {}", status.as_u16()));
    }
    let max_gpus = limits.max_gpus;
    let mut fold = ScrapeFold::new(now, source, ownership, max_gpus);
    stream_within(resp, limits.max_body, &limits.in_flight, |chunk| fold.feed(chunk)).await.map_err(|e| e.to_string())?;
    if !fold.any_text() {
        return Err("empty body (the exporter is reloading, or has no GPUs)".into());
    }
    let (found, errors, over) = fold.finish();
    if over {
        return Err(format!(
            "more than {max_gpus} distinct GPU series in one scrape (max_gpus_per_exporter): no node has that many, so none of them is read this pass"
        ));
    }
    if found.is_empty() {
        return Err(errors.first().map_or("no DCGM GPU metrics in the response".to_string(), |e| format!("unparseable exposition ({e})")));
    }
    if !errors.is_empty() {
        tracing::warn!(event = "scrape_malformed_lines", source = %source, count = errors.len(), first = %errors[0], "skipped malformed exposition lines");
    }
    Ok(found)
}

impl GpuSource for ExporterSource {
    async fn collect(&self, now: DateTime<Utc>) -> Collection {
        let (urls, mut failures) = self.expand().await;
        let requests = urls.len();
        let permits = Arc::new(Semaphore::new(MAX_CONCURRENT_SCRAPES));
        let mut tasks = JoinSet::new();
        for url in urls {
            let (http, ownership, permits, limits) = (self.http.clone(), self.ownership.clone(), permits.clone(), self.limits.clone());
            tasks.spawn(async move {
                let _permit = permits.acquire_owned().await;
                // Logs, labels and the status API show the URL without credentials or query.
                let source: Arc<str> = Arc::from(redact(&url));
                let host = host_port(&url);
                let result = scrape(http, url, &source, now, &ownership, &limits).await;
                (source, host, result)
            });
        }
        let mut series: Vec<GpuSeries> = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let Ok((source, host, result)) = joined else { continue };
            match result {
                Ok(found) => series.extend(found),
                Err(error) => failures.push(SourceFailure::new(source.to_string(), host, error)),
            }
        }
        // Twins are a store's question: scraped directly, the targets are the configured ones
        // (a `dns+` name's A and AAAA addresses are one exporter).
        Collection { series, failures, requests, step: None, ..Collection::default() }
    }
}
