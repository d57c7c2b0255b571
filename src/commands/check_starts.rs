//! `check`'s lines on who counts as waiting for a GPU (issue 47): whether the start grace
//! (`exporter_collect_interval` plus `bind_allowance`) covers how often a new pod can show up in
//! the GPU source it reads and outlasts the agents' `connection_timeout`, and which build
//! parameters mark CPU variants in the templates it lists.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::coder::CoderClient;
use crate::coder::types::{BuildParameter, Workspace};
use crate::gpu::GpuSeries;
use crate::pass::policy::Policy;

/// Builds whose parameters `check` reads at most (one per running workspace of a GPU template).
const MAX_PARAMETER_READS: usize = 64;

/// The start grace against the source's sample spacing (behind Prometheus, `spacing`: a new pod
/// shows up there no sooner) and the listed agents' `connection_timeout` (a `timeout` agent is
/// a waiter at once). `(ok, detail)`.
pub fn start_grace(policy: &Policy, spacing: Option<Duration>, workspaces: &[Workspace]) -> (bool, String) {
    let human = |d: Duration| crate::duration::human(crate::duration::chrono(d));
    let grace = policy.first_report_allowance();
    let mut detail = format!(
        "a start whose pod reports no GPU yet is starting, not waiting, for {} after its agent's creation (exporter_collect_interval {} plus bind_allowance {})",
        human(grace),
        human(policy.exporter_collect_interval),
        human(policy.bind_allowance)
    );
    let shortest_timeout = workspaces
        .iter()
        .filter(|w| policy.is_gpu_template(&w.template_name))
        .flat_map(|w| w.latest_build.agents().map(|a| a.connection_timeout_seconds))
        .filter(|t| *t > 0)
        .min();
    if let Some(t) = shortest_timeout.map(|t| Duration::from_secs(t as u64)).filter(|t| *t < grace) {
        detail.push_str(&format!(
            "; some agents time out after {} (connection_timeout): from then on a start without a GPU counts as waiting, before the grace ends",
            human(t)
        ));
    }
    match spacing {
        Some(seen) if seen > policy.exporter_collect_interval => (
            false,
            format!(
                "{detail}; but the store's samples of a GPU are {} apart, longer than exporter_collect_interval: a new pod can show up only that late, so set exporter_collect_interval to {} (or scrape dcgm-exporter as often as it collects)",
                human(seen),
                human(seen)
            ),
        ),
        Some(seen) => (true, format!("{detail}; the store's samples are {} apart, within it", human(seen))),
        None => (
            true,
            format!("{detail}; set exporter_collect_interval to dcgm-exporter's -c (DCGM_EXPORTER_INTERVAL): the exporter does not say it"),
        ),
    }
}

/// The typical spacing of a GPU's samples (9 in 10 gaps), when the source returned history.
pub fn sample_spacing(series: &[GpuSeries]) -> Option<Duration> {
    let mut gaps: Vec<i64> = series.iter().flat_map(|s| s.points.windows(2).map(|w| (w[1].at - w[0].at).num_seconds())).collect();
    gaps.sort_unstable();
    let typical = *gaps.get((gaps.len() * 9 / 10).min(gaps.len().checked_sub(1)?))?;
    Some(Duration::from_secs(typical.max(0) as u64))
}

/// Which `gpu_parameters` tell CPU variants apart in the listed templates: the running
/// workspaces of a GPU template whose latest builds differ in one of those parameters, with a
/// value that says no GPU among them. Reads at most `MAX_PARAMETER_READS` builds.
pub async fn cpu_variants(coder: &CoderClient, policy: &Policy, workspaces: &[Workspace]) -> String {
    if policy.gpu_parameters.is_empty() {
        return "gpu_parameters = []: a template's CPU variant starting counts as waiting for a GPU".into();
    }
    let once = coder.without_retries();
    let candidates: Vec<&Workspace> = workspaces.iter().filter(|w| policy.is_gpu_template(&w.template_name)).collect();
    // template -> parameter name -> values seen
    let mut seen: BTreeMap<&str, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let (mut read, mut failed) = (0usize, 0usize);
    for ws in candidates.iter().take(MAX_PARAMETER_READS) {
        match once.build_parameters(&ws.latest_build.id).await {
            Ok(params) => {
                read += 1;
                for BuildParameter { name, value } in params {
                    if policy.gpu_parameters.iter().any(|n| n.eq_ignore_ascii_case(name.trim())) {
                        seen.entry(ws.template_name.as_str()).or_default().entry(name).or_default().insert(value);
                    }
                }
            }
            Err(_) => failed += 1,
        }
    }
    let marks: Vec<String> = seen
        .iter()
        .flat_map(|(template, names)| {
            names.iter().filter(|(name, values)| values.len() > 1 && values.iter().any(|v| cpu(policy, name, v))).map(
                move |(name, values)| {
                    format!(
                        "template {template:?}: {name} marks CPU variants (values {})",
                        values.iter().cloned().collect::<Vec<_>>().join(", ")
                    )
                },
            )
        })
        .collect();
    let more = if candidates.len() > MAX_PARAMETER_READS { format!(" (the first {MAX_PARAMETER_READS})") } else { String::new() };
    let unread = if failed > 0 { format!("; {failed} could not be read") } else { String::new() };
    if marks.is_empty() {
        format!(
            "no listed template's running workspaces differ in a gpu_parameters value ({read} builds read{more}{unread}); gpu_parameters = {:?}",
            policy.gpu_parameters
        )
    } else {
        format!("{} ({read} builds read{more}{unread}); their CPU variants are never demand", marks.join("; "))
    }
}

fn cpu(policy: &Policy, name: &str, value: &str) -> bool {
    policy.cpu_variant(&[BuildParameter { name: name.into(), value: value.into() }]).is_some()
}
