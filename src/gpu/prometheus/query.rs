//! The query plan: which fields are asked for (`QuerySpec::all`, one query per exporter field
//! name), narrowed how (`Filters`: namespace, workspace label, selector, job) and aggregated by
//! what (`BY`), as PromQL. The source decides when and over which steps to send them.

use reclaimer_core::gpu::signals::{self, NAMES, Signal};

/// The labels a point is aggregated by: what identifies a GPU (`UUID`, or `uuid` with `-o`; a MIG
/// instance), its pod and namespace (as the exporter names them, as Prometheus renames them, and
/// with `-o`), its model, the virtual-GPU marker, and the scrape target's `instance` (one GPU
/// reported by two targets is a `Twin`). The target's `job`, `pod` of the exporter and the like
/// are dropped (`pod` is kept for the workload when there is no `exported_pod`).
pub(super) const BY: &[&str] = &[
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
    "pod_uid",
    "instance",
];

/// Fetches of at most this many steps are aggregated by `BY` (see the module's notes).
pub(super) const AGGREGATE_UP_TO_STEPS: i64 = 10;

/// What narrows every query: the namespace filter, the workspace label, the selector, the
/// exporter's job.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Filters<'a> {
    pub(super) namespace: Option<&'a str>,
    pub(super) workspace_label: Option<&'a str>,
    pub(super) selector: Option<&'a str>,
    /// The scrape jobs read (each matched exactly; several are `or`ed); empty: any job.
    pub(super) jobs: &'a [String],
}

/// One query: one exporter field, a signal or the energy counter.
#[derive(Debug, Clone, Copy)]
pub(super) struct QuerySpec {
    pub(super) name: &'static str,
}

impl QuerySpec {
    /// Every field the decisions use, by each name dcgm-exporter has given it; the power draw
    /// only when asked for.
    pub(super) fn all(power: bool) -> Vec<QuerySpec> {
        NAMES
            .iter()
            .filter(|m| power || m.signal != Signal::PowerWatts)
            .map(|m| m.name)
            .chain(signals::ENERGY_NAMES.map(|(name, _)| name))
            .map(|name| QuerySpec { name })
            .collect()
    }

    /// `max_over_time(NAME[STEPs])`, aggregated as `max by (GPU and pod labels) (...)` when
    /// `aggregate`, for the namespace if one is set (as the exporter, Prometheus or `-o` names
    /// the label). With a namespace, the per-process fields (`GPU_UTIL`, `FB_USED`) also fetch
    /// the device-level series, which carry no workload namespace (only, behind Prometheus, the
    /// exporter's own): in virtual-GPU mode a pod's copies of them read 0 and only the device's
    /// are real (reference dcgm NOTES §10).
    /// The GPUs (by `BY` and `job`) that more than one series reports at a step: two copies under
    /// one scrape target that differ in a label `BY` drops (a forged copy with the exporter's
    /// `instance` plus one label of its own) collapse in `max by`, and only a count shows them.
    /// Per job: one GPU that two configured jobs both scrape is no copy.
    pub(super) fn copies(&self, step_secs: u64, filters: Filters<'_>) -> String {
        let raw = self.promql(step_secs, filters, false);
        let mut by: Vec<&str> = BY.to_vec();
        by.push("job");
        by.extend(filters.workspace_label);
        format!("count by ({}) ({raw}) > 1", by.join(", "))
    }

    pub(super) fn promql(&self, step_secs: u64, filters: Filters<'_>, aggregate: bool) -> String {
        let name = self.name;
        let Filters { namespace, workspace_label, selector, jobs } = filters;
        let job_matchers: Vec<String> = jobs.iter().map(|j| format!("job=\"{}\"", j.replace('\\', "\\\\").replace('"', "\\\""))).collect();
        let job_matchers = if job_matchers.is_empty() { vec![String::new()] } else { job_matchers };
        let select_one = |job: &str, ns_matcher: &str| {
            let matchers: Vec<&str> = [job, selector.unwrap_or(""), ns_matcher].into_iter().filter(|m| !m.is_empty()).collect();
            let raw = format!("max_over_time({name}{{{}}}[{step_secs}s])", matchers.join(","));
            if !aggregate {
                return raw;
            }
            let mut by: Vec<&str> = BY.to_vec();
            by.extend(workspace_label);
            format!("max by ({}) ({raw})", by.join(", "))
        };
        // Each job's select, `or`ed: one job reads as before; with several, a GPU two of them
        // report comes once (`or` keeps the first), and no regular expression escapes a name.
        let select = |ns_matcher: &str| job_matchers.iter().map(|job| select_one(job, ns_matcher)).collect::<Vec<_>>().join(" or ");
        match namespace {
            None => select(""),
            Some(ns) => {
                let ns = ns.replace('\\', "\\\\").replace('"', "\\\"");
                let mut selects: Vec<String> =
                    ["exported_namespace", "pod_namespace", "namespace"].iter().map(|l| select(&format!("{l}=\"{ns}\""))).collect();
                if signals::lookup(name).is_some_and(|m| m.signal.per_process()) {
                    selects.push(select("exported_namespace=\"\",pod_namespace=\"\""));
                }
                selects.join(" or ")
            }
        }
    }
}
