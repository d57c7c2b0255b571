//! What a GPU source is: the `GpuSource` trait, what it is built with besides its own settings
//! (`SourceContext`), what one collection returns (`Collection`) and a source that could not be
//! read (`SourceFailure`). The lowest module of `gpu`: the two sources
//! implement it and `Sources` picks one.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reclaimer_core::gpu::{GpuSeries, Ownership, Twin};
use serde::Serialize;

use crate::http::Outbound;

/// A source that could not be read this pass.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceFailure {
    /// The URL without credentials or query (for logs and `check`).
    pub source: String,
    /// `host:port` only (the metric label).
    pub host: String,
    pub error: String,
}

impl SourceFailure {
    pub fn new(source: String, host: String, error: String) -> Self {
        SourceFailure { source, host, error }
    }
}

/// Behind Prometheus: which scrape jobs' series were read, and how they were chosen (the status
/// document's `gpu_jobs`, `check`'s line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobsRead {
    /// `configured` (`prometheus_job`), `discovered` (the one job Prometheus named), or
    /// `default` (none was found: the GPU Operator's name).
    pub how: &'static str,
    /// The jobs read (empty when `problem` is set).
    pub jobs: Vec<String>,
    /// What discovery found: each job with its series count, most first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub found: Vec<(String, u64)>,
    /// Why nothing is read (several jobs, or Prometheus could not say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// What one collection round returned.
#[derive(Debug, Default)]
pub struct Collection {
    pub series: Vec<GpuSeries>,
    pub failures: Vec<SourceFailure>,
    /// GPU keys more than one scrape target reported (the first `MAX_TWINS_LISTED`).
    pub twins: Vec<Twin>,
    /// How many there were in all.
    pub twin_count: usize,
    /// Every workspace one of whose GPU keys is a twin (no deadline of theirs is moved).
    pub twinned: std::collections::HashSet<String>,
    /// HTTP requests made (the benchmark checks this does not grow with the fleet).
    pub requests: usize,
    /// Workspaces whose GPU series the source saw at its latest step but did not hold, because
    /// the listing did not name them (behind Prometheus; the first few): they may hold a GPU
    /// outside Coder's running workspaces. An exporter's scrape holds every series instead.
    pub unlisted: Vec<String>,
    /// Set when each point is a finished sample of its own step (Prometheus history: the
    /// highest raw sample in the step ending at its time), not one more reading to merge into
    /// the pass's sample (an exporter scrape).
    pub step: Option<std::time::Duration>,
    /// Behind Prometheus: the scrape jobs read.
    pub jobs: Option<JobsRead>,
}

/// A place GPU readings come from. Both sources yield the same series, so the windows and
/// decisions never know which one is configured.
pub trait GpuSource: Send + Sync {
    fn collect(&self, now: DateTime<Utc>) -> impl Future<Output = Collection> + Send;
}

/// What any source is built with besides its own settings, as plain values.
#[derive(Debug, Clone, Copy)]
pub struct SourceContext<'a> {
    pub ownership: &'a Ownership,
    pub timeout: Duration,
    pub outbound: &'a Outbound,
    /// How far back a pass reads (the policy's longest look-back) and the pass interval.
    pub lookback: Duration,
    pub step: Duration,
    /// Whether the policy reads the power draw (a power veto).
    pub power: bool,
    /// The policy's `max_gpus_per_workspace`: a pod's series past it plus one are not held (the
    /// one more is what makes its workspace too-many-gpu-series), so a pod never fails a source.
    pub max_gpus_per_workspace: usize,
}
