//! The lists of names the config file takes: `prometheus_job` (one scrape job or a list) and
//! `gpu_parameters` (build parameter names), each validated into plain strings with an error
//! that names the fix.

use serde::Deserialize;

use crate::error::Error;
use crate::gpu::prometheus::jobs::MAX_JOBS;

/// A TOML key that takes one string or a list of them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMore {
    One(String),
    More(Vec<String>),
}

impl OneOrMore {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMore::One(s) => vec![s],
            OneOrMore::More(v) => v,
        }
    }
}

/// `prometheus_job`: one or more scrape jobs, each matched exactly (escaped in the query).
pub fn prometheus_jobs(jobs: &[String]) -> Result<Vec<String>, Error> {
    let example = "e.g. prometheus_job = \"gpu-metrics\", or [\"nvidia-dcgm-exporter\", \"gpu-metrics\"]";
    if jobs.is_empty() || jobs.len() > MAX_JOBS {
        return Err(Error::config(format!("prometheus_job lists {} jobs: name 1 to {MAX_JOBS} scrape jobs, {example}", jobs.len())));
    }
    let mut out: Vec<String> = Vec::new();
    for job in jobs {
        let bad = job.trim().is_empty() || job.len() > 256 || job.chars().any(|c| c.is_control() || c == '\u{22}' || c == '\u{5c}');
        if bad {
            return Err(Error::config(format!(
                "prometheus_job {job:?}: name the exporter's scrape job (the `job` label of its series), {example}"
            )));
        }
        if !out.iter().any(|j| j == job.trim()) {
            out.push(job.trim().to_string());
        }
    }
    Ok(out)
}

/// `coderd_job`: the scrape job of coderd's own metrics (`backtest` reads its agent-stat gauges
/// from it only), matched exactly.
pub fn coderd_job(job: &str) -> Result<String, Error> {
    let bad = job.trim().is_empty() || job.len() > 256 || job.chars().any(|c| c.is_control() || c == '\u{22}' || c == '\u{5c}');
    if bad {
        return Err(Error::config(format!(
            "coderd_job {job:?}: name the scrape job of coderd's metrics (the `job` label of coderd_agentstats_* series), e.g. coderd_job = \"coder\""
        )));
    }
    Ok(job.trim().to_string())
}

/// The most names `gpu_parameters` may list.
const MAX_GPU_PARAMETERS: usize = 32;

/// `gpu_parameters`: build parameter names (Coder's are identifiers; matched without case).
pub fn gpu_parameters(names: &[String]) -> Result<Vec<String>, Error> {
    if names.len() > MAX_GPU_PARAMETERS {
        return Err(Error::config(format!("gpu_parameters lists {} names: at most {MAX_GPU_PARAMETERS}", names.len())));
    }
    for name in names {
        let ok = (1..=128).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
        if !ok {
            return Err(Error::config(format!(
                "gpu_parameters {name:?}: a build parameter's name (letters, digits, '-', '_'), e.g. gpu_parameters = [\"gpu_count\", \"gpu_type\"]; [] turns CPU variants off"
            )));
        }
    }
    Ok(names.to_vec())
}
