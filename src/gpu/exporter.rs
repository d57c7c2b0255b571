//! Scrapes dcgm-exporter `/metrics` URLs directly, all concurrently, once per pass. One exporter
//! failing, or answering with an empty body (it does during a hot reload), makes only its GPUs
//! unknown. `dns+http://name:port/path` expands to every address the name resolves to (a
//! headless Service), each scraped on its own. Each value is the exporter's latest cached
//! reading; the scrape time is recorded as the sample time.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::task::JoinSet;

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
        let mut tasks = JoinSet::new();
        for url in urls.iter().cloned() {
            let http = self.http.clone();
            tasks.spawn(async move {
                let body = scrape(http, url.clone()).await;
                (url, body)
            });
        }
        let mut readings: Vec<GpuReading> = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let Ok((url, body)) = joined else { continue };
            let body = match body {
                Ok(b) => b,
                Err(error) => {
                    failures.push(SourceFailure { source: url, error });
                    continue;
                }
            };
            if body.trim().is_empty() {
                failures.push(SourceFailure { source: url, error: "empty body (the exporter is reloading, or has no GPUs)".into() });
                continue;
            }
            let source: Arc<str> = Arc::from(url.as_str());
            let (found, errors) = readings_from_exposition(&body, now, &source, &self.ownership);
            if found.is_empty() {
                let why =
                    errors.first().map_or("no DCGM GPU metrics in the response".to_string(), |e| format!("unparseable exposition ({e})"));
                failures.push(SourceFailure { source: url, error: why });
                continue;
            }
            if !errors.is_empty() {
                tracing::warn!(event = "scrape_malformed_lines", source = %url, count = errors.len(), first = %errors[0], "skipped malformed exposition lines");
            }
            readings.extend(found);
        }
        Collection { readings, failures, requests: urls.len() }
    }

    fn endpoints(&self) -> Vec<String> {
        self.targets.clone()
    }
}
