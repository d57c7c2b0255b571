//! Scrapes dcgm-exporter `/metrics` URLs directly, all concurrently, once per pass. One exporter
//! failing, or answering with an empty body (it does during a hot reload), makes only its GPUs
//! unknown. `dns+http://name:port/path` expands to every address the name resolves to (a
//! headless Service), each scraped on its own. Each value is the exporter's latest cached
//! reading; the scrape time is recorded as the sample time.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Scrapes in flight at once: bounds sockets and memory on large fleets (each body is parsed
/// into readings inside its task and dropped there).
const MAX_CONCURRENT_SCRAPES: usize = 32;

use super::{Collection, GpuReading, GpuSource, Ownership, SourceFailure, readings_from_exposition};

pub struct ExporterSource {
    http: reqwest::Client,
    targets: Vec<String>,
    ownership: Ownership,
}

impl ExporterSource {
    pub fn new(targets: Vec<String>, ownership: Ownership, timeout: Duration) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(3)))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(ExporterSource { http, targets, ownership })
    }

    /// The concrete URLs to scrape this pass, with failures for names that did not resolve.
    async fn expand(&self) -> (Vec<String>, Vec<SourceFailure>) {
        let mut urls = Vec::new();
        let mut failures = Vec::new();
        for target in &self.targets {
            let Some(rest) = target.strip_prefix("dns+") else {
                urls.push(target.clone());
                continue;
            };
            match resolve_all(rest).await {
                Ok(expanded) if !expanded.is_empty() => urls.extend(expanded),
                Ok(_) => failures.push(SourceFailure { source: target.clone(), error: "the name resolved to no address".into() }),
                Err(e) => failures.push(SourceFailure { source: target.clone(), error: e }),
            }
        }
        (urls, failures)
    }
}

/// `http://name:port/path` -> one URL per resolved address.
async fn resolve_all(url: &str) -> Result<Vec<String>, String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| format!("{url}: expected dns+http://host:port/path"))?;
    let (authority, path) = rest.find('/').map_or((rest, "/metrics"), |i| (&rest[..i], &rest[i..]));
    let host_port = if authority.contains(':') { authority.to_string() } else { format!("{authority}:9400") };
    let addrs = tokio::net::lookup_host(host_port.as_str()).await.map_err(|e| format!("cannot resolve {authority}: {e}"))?;
    let mut urls: Vec<String> = addrs.map(|a| format!("{scheme}://{a}{path}")).collect();
    urls.sort();
    urls.dedup();
    Ok(urls)
}

/// Parses one exporter's body into readings; an empty or unparseable body is a failure.
fn read_exposition(url: &str, body: &str, now: DateTime<Utc>, ownership: &Ownership) -> Result<Vec<GpuReading>, String> {
    if body.trim().is_empty() {
        return Err("empty body (the exporter is reloading, or has no GPUs)".into());
    }
    let source: Arc<str> = Arc::from(url);
    let (found, errors) = readings_from_exposition(body, now, &source, ownership);
    if found.is_empty() {
        return Err(errors.first().map_or("no DCGM GPU metrics in the response".to_string(), |e| format!("unparseable exposition ({e})")));
    }
    if !errors.is_empty() {
        tracing::warn!(event = "scrape_malformed_lines", source = %url, count = errors.len(), first = %errors[0], "skipped malformed exposition lines");
    }
    Ok(found)
}

async fn scrape(http: reqwest::Client, url: String) -> Result<String, String> {
    let resp =
        http.get(&url).send().await.map_err(|e| if e.is_timeout() { "timed out".to_string() } else { format!("no response: {e}") })?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("HTTP {}", status.as_u16()));
    }
    resp.text().await.map_err(|e| format!("reading the body failed: {e}"))
}

impl GpuSource for ExporterSource {
    async fn collect(&self, now: DateTime<Utc>) -> Collection {
        let (urls, mut failures) = self.expand().await;
        let permits = Arc::new(Semaphore::new(MAX_CONCURRENT_SCRAPES));
        let mut tasks = JoinSet::new();
        for url in urls.iter().cloned() {
            let (http, ownership, permits) = (self.http.clone(), self.ownership.clone(), permits.clone());
            tasks.spawn(async move {
                let _permit = permits.acquire_owned().await;
                let result = scrape(http, url.clone()).await.and_then(|body| read_exposition(&url, &body, now, &ownership));
                (url, result)
            });
        }
        let mut readings: Vec<GpuReading> = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let Ok((url, result)) = joined else { continue };
            match result {
                Ok(found) => readings.extend(found),
                Err(error) => failures.push(SourceFailure { source: url, error }),
            }
        }
        Collection { readings, failures, requests: urls.len() }
    }
}
