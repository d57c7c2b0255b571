//! Which scrape jobs carry dcgm-exporter's series behind Prometheus. The exporter's `job` label
//! differs by install (the GPU Operator's ServiceMonitor `nvidia-dcgm-exporter`, with DRA
//! `nvidia-dcgm-exporter-dra`, the exporter's own chart `dcgm-exporter` or
//! `<release>-dcgm-exporter`, NVIDIA's kube-prometheus-stack recipe `gpu-metrics`, anything in a
//! hand-written scrape config: reference dcgm NOTES §12), so with `prometheus_job` unset the
//! source asks Prometheus once at start and then every hour (`count by (job)` of one DCGM
//! family). Exactly one, named by two answers in a row (a job whose first scrape has not landed
//! yet must not leave another alone in the answer): it is read. None: the GPU Operator's name, as
//! before (asked again each pass until a job carries them). Several: nothing
//! is read (a job anyone could push into must not be chosen by accident), and the source fails
//! with each job named.

use std::time::{Duration, Instant};

use crate::gpu::source::JobsRead;

/// The scrape job of dcgm-exporter as the GPU Operator's ServiceMonitor names it (its Service):
/// read when no job carries the exporter's series yet.
pub const DEFAULT_JOB: &str = "nvidia-dcgm-exporter";

/// The family asked about: in dcgm-exporter's default counters, and reported for MIG instances
/// too (`DCGM_FI_DEV_GPU_UTIL` is not).
pub const DISCOVERY_FAMILY: &str = "DCGM_FI_DEV_FB_USED";

/// How often the jobs are asked for again once known.
pub const ASK_AGAIN: Duration = Duration::from_secs(3600);

/// Jobs named in a discovery answer at most (more are counted, not listed).
pub const MAX_JOBS_LISTED: usize = 16;

/// Jobs `prometheus_job` may list.
pub const MAX_JOBS: usize = 8;

/// How the jobs are chosen: named by `prometheus_job` (one or a list), or found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobChoice {
    Named(Vec<String>),
    Discover,
}

/// What the last discovery found, and when it was asked.
#[derive(Debug, Default)]
pub struct Discovery {
    asked: Option<Instant>,
    /// Each job with series of `DISCOVERY_FAMILY`, most series first (`Ok`), or why Prometheus
    /// could not say (`Err`).
    found: Option<Result<Vec<(String, u64)>, String>>,
    /// The answer before it: one job is read only when both name it alone.
    before: Option<Result<Vec<(String, u64)>, String>>,
}

impl Discovery {
    /// Whether to ask now: never asked, the last answer failed or named no job (a store that
    /// has not scraped the exporter yet), or `ASK_AGAIN` passed.
    pub fn due(&self) -> bool {
        match (&self.asked, &self.found) {
            // One job named once, or several (one short-lived push must not stop reading for an
            // hour): asked again next pass.
            (Some(_), Some(Ok(found))) if found.len() > 1 || (found.len() == 1 && self.one_job().is_none()) => true,
            (Some(at), Some(Ok(found))) if !found.is_empty() => at.elapsed() >= ASK_AGAIN,
            _ => true,
        }
    }

    /// The one job the last two answers both name alone.
    fn one_job(&self) -> Option<&str> {
        alone(&self.found).filter(|job| alone(&self.before) == Some(*job))
    }

    /// Records an answer: each job's series count (any order).
    pub fn answered(&mut self, found: Result<Vec<(String, u64)>, String>) {
        self.asked = Some(Instant::now());
        self.before = self.found.take();
        self.found = Some(found.map(|mut jobs| {
            jobs.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            jobs
        }));
    }
}

/// The job an answer names alone.
fn alone(answer: &Option<Result<Vec<(String, u64)>, String>>) -> Option<&str> {
    match answer {
        Some(Ok(found)) if found.len() == 1 => Some(found[0].0.as_str()),
        _ => None,
    }
}

/// The jobs to read this pass under `choice` and what discovery found, as the status document
/// shows them. Nothing is read when `jobs` is empty: `problem` says why when they cannot be told;
/// without one, a single job waits for a second answer to name it.
pub fn jobs_to_read(choice: &JobChoice, discovery: &Discovery) -> JobsRead {
    let named = |how: &'static str, jobs: Vec<String>, found: Vec<(String, u64)>| JobsRead { how, jobs, found, problem: None };
    let found = match &discovery.found {
        Some(Ok(found)) => found.iter().take(MAX_JOBS_LISTED).cloned().collect(),
        _ => Vec::new(),
    };
    match choice {
        JobChoice::Named(jobs) => named("configured", jobs.clone(), found),
        JobChoice::Discover => match &discovery.found {
            None => JobsRead { how: "discovered", jobs: Vec::new(), found: Vec::new(), problem: Some("not asked yet".into()) },
            Some(Err(e)) => JobsRead {
                how: "discovered",
                jobs: Vec::new(),
                found: Vec::new(),
                problem: Some(format!(
                    "cannot ask Prometheus which scrape job carries dcgm-exporter's series ({e}); nothing is read until it answers, or set prometheus_job"
                )),
            },
            Some(Ok(found)) if found.is_empty() => named("default", vec![DEFAULT_JOB.to_string()], Vec::new()),
            Some(Ok(found)) if found.len() == 1 => match discovery.one_job() {
                Some(job) => named("discovered", vec![job.to_string()], found.clone()),
                None => named("discovered", Vec::new(), found.clone()),
            },
            Some(Ok(found)) => JobsRead {
                how: "discovered",
                jobs: Vec::new(),
                found: found.iter().take(MAX_JOBS_LISTED).cloned().collect(),
                problem: Some(format!(
                    "{} scrape jobs carry dcgm-exporter series ({}): nothing is read, since a job another install (or anyone who can push) writes must not be chosen by accident; set prometheus_job to the exporter's job, or to the list of jobs to read",
                    found.len(),
                    listed(found)
                )),
            },
        },
    }
}

/// `job (N series), ...` for the first `MAX_JOBS_LISTED`.
pub fn listed(found: &[(String, u64)]) -> String {
    let mut out: Vec<String> = found.iter().take(MAX_JOBS_LISTED).map(|(j, n)| format!("{j:?} ({n} series)")).collect();
    if found.len() > MAX_JOBS_LISTED {
        out.push(format!("and {} more", found.len() - MAX_JOBS_LISTED));
    }
    out.join(", ")
}

/// The discovery query: series of `DISCOVERY_FAMILY` per job over the last 10 minutes, within
/// the selector when one is set.
pub fn discovery_query(selector: Option<&str>) -> String {
    format!("count by (job) (last_over_time({DISCOVERY_FAMILY}{{{}}}[10m]))", selector.unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A discovery that got this answer twice in a row.
    fn found(jobs: &[(&str, u64)]) -> Discovery {
        let mut d = Discovery::default();
        for _ in 0..2 {
            d.answered(Ok(jobs.iter().map(|(j, n)| (j.to_string(), *n)).collect()));
        }
        d
    }

    #[test]
    fn one_job_is_read_none_is_the_default_and_several_read_nothing() {
        let discover = JobChoice::Discover;
        let one = jobs_to_read(&discover, &found(&[("gpu-metrics", 12)]));
        assert_eq!((one.how, one.jobs, one.problem), ("discovered", vec!["gpu-metrics".to_string()], None));
        let none = jobs_to_read(&discover, &found(&[]));
        assert_eq!((none.how, none.jobs), ("default", vec!["nvidia-dcgm-exporter".to_string()]));
        let two = jobs_to_read(&discover, &found(&[("dcgm", 3), ("gpu-metrics", 12)]));
        assert!(two.jobs.is_empty());
        let problem = two.problem.unwrap_or_default();
        assert!(problem.contains("2 scrape jobs") && problem.contains("\"gpu-metrics\" (12 series), \"dcgm\" (3 series)"), "{problem}");
        let mut failed = Discovery::default();
        failed.answered(Err("HTTP 503".into()));
        assert!(failed.due(), "a failed discovery is asked again next pass");
        assert!(jobs_to_read(&discover, &failed).problem.unwrap_or_default().contains("HTTP 503"));
        assert!(!found(&[("a", 1)]).due(), "a known answer is kept for an hour");
        assert!(found(&[]).due(), "no job yet: asked again next pass");
        let named = jobs_to_read(&JobChoice::Named(vec!["a".into(), "b".into()]), &found(&[("c", 4)]));
        assert_eq!((named.how, named.jobs.len(), named.problem, named.found.len()), ("configured", 2, None, 1));
        // One job in one answer: read only once the next answer names it alone too.
        let mut d = Discovery::default();
        d.answered(Ok(vec![("forged".into(), 1)]));
        assert!(jobs_to_read(&discover, &d).jobs.is_empty() && d.due(), "one answer is not enough");
        d.answered(Ok(vec![("forged".into(), 1), ("nvidia-dcgm-exporter".into(), 8)]));
        assert!(jobs_to_read(&discover, &d).problem.is_some(), "the real job's first scrape landed: two jobs");
        d.answered(Ok(vec![("nvidia-dcgm-exporter".into(), 8)]));
        d.answered(Ok(vec![("nvidia-dcgm-exporter".into(), 8)]));
        assert_eq!(jobs_to_read(&discover, &d).jobs, vec!["nvidia-dcgm-exporter".to_string()]);
        assert!(!d.due());
    }

    #[test]
    fn the_query_counts_one_family_by_job_within_the_selector() {
        assert_eq!(discovery_query(None), "count by (job) (last_over_time(DCGM_FI_DEV_FB_USED{}[10m]))");
        assert_eq!(
            discovery_query(Some("exported_namespace=\"coder\"")),
            "count by (job) (last_over_time(DCGM_FI_DEV_FB_USED{exported_namespace=\"coder\"}[10m]))"
        );
    }
}
