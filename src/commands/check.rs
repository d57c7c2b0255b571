//! `check`: the settings, Coder, the token's permissions and the GPU sources, one line per check
//! (`ok` or `FAIL` with the fix), without stopping at the first failure.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::app::{coder_client, gpu_source};
use crate::coder::CoderClient;
use crate::coder::identity::connect;
use crate::coder::types::{JobStatus, Transition, Workspace};
use crate::config::Settings;
use crate::error::Error;
use crate::gpu::{Collection, GpuKey, GpuSeries, GpuSource};
use crate::pass::metrics::Metrics;
use crate::retry::RetryPolicy;

use super::token_file_readable;

/// Prints one line per check; `true` when every check passed. `settings` is the outcome of
/// resolving them: a failure there is the first failed line.
pub async fn run(settings: Result<Settings, Error>) -> bool {
    let mut all_ok = true;
    let mut line = |ok: bool, what: &str, detail: &str| {
        all_ok &= ok;
        println!("{} {what}: {detail}", if ok { "ok  " } else { "FAIL" });
    };
    let mut settings = match settings {
        Ok(s) => s,
        Err(e) => {
            line(false, "settings", e.message());
            return false;
        }
    };
    line(true, "settings", &settings.summary());
    if let Some(why) = token_file_readable(&settings) {
        // A warning, not a failure: the token still works.
        println!("warn token file: {why}");
    }
    let policy = &settings.policy;
    line(
        true,
        "policy",
        &format!(
            "{} rule(s), gpu_templates={:?}, max_stops_per_pass={}, max_idle_fraction={}",
            policy.rules.len(),
            policy.gpu_templates,
            policy.max_stops_per_pass,
            policy.max_idle_fraction
        ),
    );
    let metrics = Arc::new(Metrics::new());
    // A person is waiting: give up on an unreachable Coder after a few seconds.
    settings.api_retry = RetryPolicy { max_elapsed: Duration::from_secs(3), ..settings.api_retry };
    let (coder, source) = match (coder_client(&settings, &metrics), gpu_source(&settings)) {
        (Ok(c), Ok(s)) => (c, s),
        (Err(e), _) | (_, Err(e)) => {
            line(false, "clients", e.message());
            return false;
        }
    };
    let identity = match connect(&coder).await {
        Ok(id) => {
            line(true, "coder", &format!("{} reachable, version {}", crate::http::redact(&settings.coder_url), id.coder_version));
            line(true, "token", &format!("belongs to {:?}", id.username));
            match id.cannot_read().or_else(|| id.cannot_stop()) {
                None => line(true, "permission", "the token may read and stop workspaces (POST /api/v2/authcheck)"),
                Some(why) => line(false, "permission", &why),
            }
            Some(id)
        }
        Err(e) => {
            line(false, "coder", e.message());
            None
        }
    };
    if let Some(id) = &identity {
        match id.token_expires_at {
            Some(exp) if exp - chrono::Utc::now() < crate::coder::identity::EXPIRY_WARNING => {
                line(false, "token expiry", &format!("expires {exp}: create a new owner token and update the Secret"))
            }
            Some(exp) => line(true, "token expiry", &format!("expires {exp}")),
            None => {
                line(false, "token expiry", "unknown: the token's key could not be read; make sure it is a `coder tokens create` token")
            }
        }
    }
    // Read as a pass reads it: behind Prometheus only the listed workspaces' series are held.
    if source.lists_first() {
        if let Ok(listing) = coder.listing().await {
            source.want(listing.workspaces.iter().map(|w| w.id.as_str()));
        }
    }
    if let Some(why) = crate::app::gpu_templates_unset(&source, &settings.policy) {
        println!("warn gpu templates: {why}");
    }
    // Behind Prometheus a discovered job is read once two answers name it: the first here.
    if let Some(prom) = source.prometheus() {
        prom.jobs().await;
    }
    // One line per URL actually read (a dns+ target stands for every address it resolved to).
    let collection = source.collect(chrono::Utc::now()).await;
    let mut series: BTreeMap<&str, HashSet<&GpuKey>> = BTreeMap::new();
    for s in &collection.series {
        series.entry(s.source.as_ref()).or_default().insert(&s.key);
    }
    for f in &collection.failures {
        line(false, "gpu source", &format!("{}: {} (fix the URL or the exporter)", f.source, f.error));
    }
    for (url, gpus) in &series {
        line(true, "gpu source", &format!("{url}: {} GPU series", gpus.len()));
    }
    if series.is_empty() && collection.failures.is_empty() {
        let job = match &collection.jobs {
            Some(read) if !read.jobs.is_empty() => {
                format!("; behind Prometheus only the scrape jobs {:?} are read (prometheus_job, {})", read.jobs, read.how)
            }
            _ => String::new(),
        };
        line(
            false,
            "gpu source",
            &format!("no GPU series at all: check the exporter URLs and that dcgm-exporter runs with --kubernetes{job}"),
        );
    }
    if let (Some(prom), Some(read)) = (source.prometheus(), &collection.jobs) {
        let (ok, detail) = prometheus_jobs(read, prom.jobs_with_series().await);
        line(ok, "prometheus job", &detail);
    }
    if let Some(t) = collection.twins.first() {
        line(
            false,
            "twins",
            &format!(
                "{} workspace GPU key(s) reported by more than one scrape target, e.g. {} by {}: a GPU has one exporter, so one is a copy (forged into a store others can write, or two exporters on one node); find the second target",
                collection.twin_count,
                t.uuid,
                t.reported_by.join(", ")
            ),
        );
    }
    if !collection.series.is_empty() {
        line(true, "frozen detection", &frozen_detection(&collection.series));
        if let Some(missing) = device_series_missing(&collection.series, &settings.policy, collection.step.is_some()) {
            line(false, "device-level series", &missing);
        }
        if let Some(step) = collection.step {
            let (ok, detail) = sample_interval(&collection.series, step, &settings.policy);
            line(ok, "sample interval", &detail);
        }
    }
    if identity.is_some() {
        match coder.listing().await {
            Ok(listing) => {
                match listing.clock_offset {
                    Some(offset) if offset.num_seconds().abs() > crate::pass::evaluate::CLOCK_SKEW_WARNING.num_seconds() => line(
                        false,
                        "clock",
                        &format!(
                            "Coder's clock is {}s off this machine's; decisions use Coder's, but fix NTP on one of them",
                            offset.num_seconds()
                        ),
                    ),
                    Some(offset) => line(true, "clock", &format!("Coder's clock is {}s off this machine's", offset.num_seconds())),
                    None => line(false, "clock", "Coder's answer had no Date header: its clock cannot be compared"),
                }
                if let Some(behind) = listing.clock_offset.and_then(|o| date_behind_coder(&listing.workspaces, chrono::Utc::now() + o)) {
                    println!(
                        "warn clock: the Date header is {}s earlier than times in Coder's own answer (its latest activity): it is not this coderd's clock but likely a proxy's in front of it (nginx writes its own Date), or another coderd replica's; decisions read Coder's times on the header's clock, so fix NTP there",
                        behind.num_seconds()
                    );
                }
                let ws = listing.workspaces;
                organization_permissions(&coder, &ws, &mut line).await;
                provisioners(&coder, &ws, &mut line).await;
                let (ok, detail) = coverage(&collection.series, &ws, &settings);
                line(ok, "coverage", &detail);
                line(true, "gpu templates", &gpu_templates(&collection.series, &ws, &settings.policy));
                let spacing = collection.step.and_then(|_| super::check_starts::sample_spacing(&collection.series));
                let (ok, detail) = super::check_starts::start_grace(&settings.policy, spacing, &ws);
                line(ok, "start grace", &detail);
                line(true, "cpu variants", &super::check_starts::cpu_variants(&coder, &settings.policy, &ws).await);
                held_outside(&coder, &collection, &ws, settings.interval * 2, &mut line).await;
            }
            Err(e) => line(false, "coverage", &format!("cannot list workspaces: {e}")),
        }
    }
    all_ok
}

/// One `check` line behind Prometheus: the scrape jobs read and how they were chosen, and the jobs
/// that carry dcgm-exporter's series now; a failure when several do and none is configured, or
/// when the jobs read hold none while others do (each named with its series count).
fn prometheus_jobs(read: &crate::gpu::source::JobsRead, found: Result<Vec<(String, u64)>, String>) -> (bool, String) {
    use crate::gpu::prometheus::jobs::listed;
    if let Some(problem) = &read.problem {
        return (false, problem.clone());
    }
    let reading = format!("reading {:?} ({})", read.jobs, read.how);
    match found {
        Err(e) => (true, format!("{reading}; cannot ask Prometheus which jobs carry dcgm-exporter series: {e}")),
        Ok(mut found) => {
            found.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            let holds = found.iter().any(|(j, n)| *n > 0 && read.jobs.contains(j));
            match (holds, found.is_empty()) {
                (true, _) => (true, format!("{reading}; jobs with dcgm-exporter series: {}", listed(&found))),
                (false, true) => (
                    false,
                    format!(
                        "{reading}; no job carries dcgm-exporter series ({}): is dcgm-exporter scraped at all?",
                        crate::gpu::prometheus::jobs::DISCOVERY_FAMILY
                    ),
                ),
                (false, false) => (
                    false,
                    format!(
                        "{reading}, which holds no dcgm-exporter series; jobs that do: {}; set prometheus_job to the exporter's (or unset it to use the one found)",
                        listed(&found)
                    ),
                ),
            }
        }
    }
}

/// One `check` line: workspaces whose pods report a GPU while Coder does not list them running
/// (a canceled, failed or stuck stop), read from Coder (the first few): nobody sees them in
/// Coder's list and no autostop stops them. As `run`, only once their latest build has been over
/// for `settled` (two intervals: a pod terminating after a stop is on its way).
async fn held_outside(
    coder: &CoderClient,
    collection: &Collection,
    workspaces: &[Workspace],
    settled: Duration,
    line: &mut impl FnMut(bool, &str, &str),
) {
    let listed: HashSet<&str> = workspaces.iter().map(|w| w.id.as_str()).collect();
    let mut unlisted: Vec<&str> = collection.unlisted.iter().map(String::as_str).collect();
    unlisted.extend(collection.series.iter().filter_map(|s| s.workspace_id.as_deref()).filter(|id| !listed.contains(id)));
    unlisted.sort_unstable();
    unlisted.dedup();
    let mut held = Vec::new();
    for id in unlisted.into_iter().take(crate::pass::outside::MAX_READS_PER_PASS) {
        let Ok(ws) = coder.workspace(id).await else { continue };
        let b = &ws.latest_build;
        // A build in progress, or one that ended within `settled` (its pod terminating), is on
        // its way.
        let over = b.job.completed_at.is_some_and(|t| chrono::Utc::now() - t > crate::duration::chrono(settled));
        if (b.transition != Transition::Start || b.job.status != JobStatus::Succeeded) && !b.job.status.is_active() && over {
            held.push(format!("{}/{} (latest build: {}, {})", ws.owner_name, ws.name, b.transition.as_str(), b.job.status.as_str()));
        }
    }
    match held.as_slice() {
        [] => line(true, "held outside coder", "no pod reports a GPU for a workspace Coder does not list running"),
        _ => line(
            false,
            "held outside coder",
            &format!(
                "{}: their pods still report a GPU while Coder does not list them running, so nobody sees them and no autostop stops them; start and stop each in Coder, or delete its pod",
                held.join(", ")
            ),
        ),
    }
}

/// One `check` line: whether a provisioner daemon answers (seen within 90 s) for the tags every
/// running workspace's builds need, per organization: without one, a stop build stays pending
/// until Coder's reaper fails it (reference NOTES §16).
async fn provisioners(coder: &CoderClient, workspaces: &[Workspace], line: &mut impl FnMut(bool, &str, &str)) {
    // (organization, tags) -> (organization name, running workspaces)
    let mut needed: BTreeMap<(&str, &crate::pass::actuator::Tags), (&str, usize)> = BTreeMap::new();
    for w in workspaces.iter().filter(|w| !w.organization_id.is_empty()) {
        needed.entry((w.organization_id.as_str(), &w.latest_build.job.tags)).or_insert((w.organization_name.as_str(), 0)).1 += 1;
    }
    let mut missing = Vec::new();
    for ((org, tags), (name, n)) in &needed {
        match coder.provisioner_daemons(org, tags).await {
            Ok(daemons) if daemons.is_empty() => missing.push(format!("tags {} in organization {name:?} ({n} running)", tags)),
            Ok(_) => {}
            Err(e) => {
                line(false, "provisioners", &format!("cannot list the provisioner daemons of organization {name:?}: {e}"));
                return;
            }
        }
    }
    if missing.is_empty() {
        line(true, "provisioners", &format!("a provisioner answers for the tags of all {} running-workspace tag set(s)", needed.len()));
    } else {
        line(
            false,
            "provisioners",
            &format!(
                "no provisioner for {} has been seen within 90 s: their stop builds would stay pending until Coder's reaper fails them; start a provisioner daemon with those tags",
                missing.join(", ")
            ),
        );
    }
}

/// One `check` line: the organizations with running workspaces where the token may not stop
/// them (permissions are per organization: an organization admin's end at its own).
async fn organization_permissions(coder: &CoderClient, workspaces: &[Workspace], line: &mut impl FnMut(bool, &str, &str)) {
    let mut running: BTreeMap<&str, (&str, usize)> = BTreeMap::new();
    for w in workspaces.iter().filter(|w| !w.organization_id.is_empty()) {
        running.entry(w.organization_id.as_str()).or_insert((w.organization_name.as_str(), 0)).1 += 1;
    }
    if running.is_empty() {
        return;
    }
    let ids: Vec<&str> = running.keys().copied().collect();
    match coder.may_stop_in(&ids).await {
        Ok(answers) => {
            let denied: Vec<String> = running
                .iter()
                .filter(|(id, _)| !answers.get(**id).copied().unwrap_or(false))
                .map(|(_, (name, n))| format!("{name:?} ({n} running)"))
                .collect();
            if denied.is_empty() {
                line(
                    true,
                    "organizations",
                    &format!("the token may stop workspaces in all {} organization(s) with running workspaces", running.len()),
                );
            } else {
                line(
                    false,
                    "organizations",
                    &format!(
                        "the token may not stop workspaces in {}: they are skipped (no-permission); give its user the organization-admin role there, or use an owner's token",
                        denied.join(", ")
                    ),
                );
            }
        }
        Err(e) => line(false, "organizations", &format!("cannot ask Coder what the token may do per organization: {e}")),
    }
}

/// Whether frozen data can be told for the GPUs read: only from an energy counter, which a
/// trimmed counters file or a relabeling may drop (reference dcgm NOTES §10).
fn frozen_detection(series: &[GpuSeries]) -> String {
    let gpus: HashSet<&GpuKey> = series.iter().map(|s| &s.key).collect();
    let without: HashSet<&GpuKey> = series.iter().filter(|s| s.points.iter().all(|p| p.energy_joules.is_none())).map(|s| &s.key).collect();
    if without.is_empty() {
        return format!("every one of {} GPU series carries an energy counter", gpus.len());
    }
    let names = crate::gpu::signals::ENERGY_NAMES.map(|(n, _)| n).join(" or ");
    format!(
        "off for {} of {} GPU series: they carry no energy counter ({names}), so a hung exporter cannot be told from an idle GPU; they are judged on their other readings (add the counter to dcgm-exporter's counters file to detect it)",
        without.len(),
        gpus.len()
    )
}

/// How many GPUs read, at their latest point, as virtual-GPU copies without their device-level
/// series (NOTES §11.3): a time-sliced sharer without one, or utilization and memory at exactly
/// 0 beside compute. Those are `no-device-series` and never judged. Behind Prometheus the empty
/// `pod_uid` that marks the copies is gone, and a store with no series at all that lacks a
/// workload pod has most likely dropped the device-level ones (a GPU without profiling fields
/// then reads 0 % and 0 MiB however busy: nothing in the data can tell).
fn device_series_missing(series: &[GpuSeries], policy: &crate::pass::policy::Policy, behind_prometheus: bool) -> Option<String> {
    let missing: HashSet<&GpuKey> = series
        .iter()
        .filter(|s| {
            s.attribution == crate::gpu::Attribution::DeviceSeriesMissing
                || (behind_prometheus
                    && s.points.last().is_some_and(|p| crate::pass::decide::placeholders_beside_compute(&p.values, policy)))
        })
        .map(|s| &s.key)
        .collect();
    let fix = if behind_prometheus {
        "keep the exporter's series that carry no workload pod: no metricRelabelings drop of series without exported_pod, and no prometheus_selector on workload labels (the device-level series carry only the exporter's own pod and namespace)"
    } else {
        "the exporter writes the device-level GPU_UTIL/FB_USED beside the per-pod copies only when its counters file has them: add both"
    };
    if !missing.is_empty() {
        return Some(format!(
            "{} GPU series read as virtual-GPU per-pod copies (utilization and memory 0) with no device-level GPU_UTIL/FB_USED series beside them: they are unknown (no-device-series) and never judged; {fix}",
            missing.len()
        ));
    }
    let device_level = series.iter().any(|s| s.key.pod.is_none());
    (behind_prometheus && !device_level).then(|| {
        format!(
            "the store holds no GPU series without a workload pod (a free GPU's, or in virtual-GPU mode the device-level GPU_UTIL/FB_USED): if dcgm-exporter runs --kubernetes-virtual-gpus, a GPU without profiling fields then reads 0 % and 0 MiB however busy, and is stopped as idle; {fix}"
        )
    })
}

/// How far apart a Prometheus source's samples of a GPU are: nine in ten of the gaps between a
/// GPU's points with data (each the highest raw sample of its step), so a scrape interval longer
/// than the step shows as the gaps it leaves (Prometheus 2's range selector is closed at both
/// ends, so a sample on a step's boundary shows in two steps: the gaps alternate, and the longer
/// is what `max_sample_gap` meets). Longer than `max_sample_gap`, every GPU is `sample-gap` forever.
fn sample_interval(series: &[GpuSeries], step: Duration, policy: &crate::pass::policy::Policy) -> (bool, String) {
    let human = |d: Duration| crate::duration::human(crate::duration::chrono(d));
    let Some(typical) = super::check_starts::sample_spacing(series) else {
        return (true, format!("too few points to tell the scrape interval (step {})", human(step)));
    };
    if typical > policy.max_sample_gap {
        return (
            false,
            format!(
                "the store's samples of a GPU are up to {} apart (9 in 10 gaps between stored samples: the scrape interval shows there), longer than max_sample_gap {}: every GPU would be sample-gap forever; scrape dcgm-exporter more often (the ServiceMonitor's interval) or raise max_sample_gap above it",
                human(typical),
                human(policy.max_sample_gap)
            ),
        );
    }
    (
        true,
        format!("samples of a GPU up to {} apart (9 in 10 gaps), within max_sample_gap {}", human(typical), human(policy.max_sample_gap)),
    )
}

/// How far the `Date` header (`coder_now`, on Coder's clock as the header says) is behind the
/// latest time Coder itself wrote into the listing, beyond a minute: a timestamp Coder wrote is
/// never later than its own clock, so a header earlier than one is some proxy's clock.
fn date_behind_coder(workspaces: &[Workspace], coder_now: chrono::DateTime<chrono::Utc>) -> Option<chrono::Duration> {
    let latest = workspaces
        .iter()
        .flat_map(|w| {
            let b = &w.latest_build;
            let agents = b.agents().flat_map(|a| [a.first_connected_at, a.last_connected_at, a.disconnected_at]);
            [Some(w.created_at), Some(w.last_used_at), b.created_at, b.job.completed_at].into_iter().chain(agents)
        })
        .flatten()
        .max()?;
    Some(latest - coder_now).filter(|behind| *behind > chrono::Duration::minutes(1))
}

/// Which templates are GPU templates (only their waiting workspaces are demand): the ones
/// `gpu_templates` names, or while it is unset, the ones learned from GPU series (those of this
/// check's running workspaces here; `run` remembers them for `LEARNED_TEMPLATE_MEMORY`).
fn gpu_templates(series: &[GpuSeries], workspaces: &[Workspace], policy: &crate::pass::policy::Policy) -> String {
    if !policy.gpu_templates.is_empty() {
        return format!("gpu_templates {:?}: only their workspaces wait for a GPU or lack GPU data", policy.gpu_templates);
    }
    let mapped: HashSet<&str> = series.iter().filter_map(|s| s.workspace_id.as_deref()).collect();
    let learned: std::collections::BTreeSet<&str> =
        workspaces.iter().filter(|w| mapped.contains(w.id.as_str())).map(|w| w.template_name.as_str()).collect();
    let list = if learned.is_empty() { "none yet".to_string() } else { format!("{learned:?}") };
    let contended = if policy.reclaim_when == crate::pass::policy::ReclaimWhen::Contended {
        "; with reclaim_when = \"contended\", set gpu_templates: a GPU template none of whose workspaces has had a GPU yet is no demand until one has"
    } else {
        ""
    };
    format!(
        "gpu_templates is unset: learned from GPU series, {list}; a workspace of another template never counts as waiting for a GPU{contended}"
    )
}

/// How many running workspaces have GPU series, and a failure when no workspace of a GPU
/// template has any: then nothing can ever be judged, and the likely cause is named.
fn coverage(series: &[GpuSeries], workspaces: &[Workspace], settings: &Settings) -> (bool, String) {
    let mapped: HashSet<&str> = series.iter().filter_map(|s| s.workspace_id.as_deref()).collect();
    let covered = workspaces.iter().filter(|w| mapped.contains(w.id.as_str())).count();
    let summary = format!("{covered} of {} running workspaces have GPU series mapped to them", workspaces.len());
    let gpu_workspaces = workspaces.iter().filter(|w| settings.policy.is_gpu_template(&w.template_name)).count();
    if gpu_workspaces == 0 || workspaces.iter().any(|w| settings.policy.is_gpu_template(&w.template_name) && mapped.contains(w.id.as_str()))
    {
        return (true, summary);
    }
    if series.is_empty() {
        return (false, format!("{summary}: no GPU series were read"));
    }
    let cause = reclaimer_core::pass::blind::likely_cause(series, &settings.ownership, "the GPU source");
    let templates = if settings.policy.gpu_templates.is_empty() {
        " (gpu_templates is unset: every template's workspaces were looked for; set gpu_templates if some have no GPU)"
    } else {
        ""
    };
    (false, format!("{summary}, none of {gpu_workspaces} of a GPU template{templates}: {cause}"))
}
