//! Prometheus metrics, all prefixed `coder_gpu_reclaimer_`. Labels are typed and bounded:
//! pass results, verdicts, reason codes, modes, stop failure kinds, route templates and status
//! codes, GPU source addresses (`host:port`), template names, pools (from the config) and the
//! currency; never a workspace id or name.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::pass::decide::{Reason, Verdict};

/// Failure labels are closed sets: an enum per label, spelled once by `as_label` (the alert
/// rules and dashboards read these values).
macro_rules! label_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $label:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            /// Every value, in order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            pub fn as_label(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }
        }

        impl EncodeLabelValue for $name {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                use std::fmt::Write as _;
                encoder.write_str(self.as_label())
            }
        }
    };
}

label_enum! {
    /// How a pass ended: the `result` label of `passes_total`.
    PassResult {
        Ok => "ok",
        /// The listing could not be read: nothing was decided.
        Failed => "failed",
    }
}

label_enum! {
    /// Why a stop did not go as planned: the `kind` label of `stop_failures_total`.
    StopFailure {
        /// The stop's POST failed.
        Rejected => "rejected",
        /// The stop build's job failed on its own.
        BuildFailed => "build_failed",
        /// Coder's job reaper failed it.
        Reaped => "reaped",
        /// Pending past `stop_timeout`.
        Stuck => "stuck",
        /// Every attempt failed; nothing more until the next build.
        Abandoned => "abandoned",
        /// The audit line could not be written, so the stop was not sent.
        Audit => "audit",
    }
}

label_enum! {
    /// Why a deadline extension failed: the `reason` label of `deadline_extension_failures_total`.
    ExtensionFailure {
        /// Coder answered 4xx: not asked again for this build.
        Refused => "refused",
        /// 5xx or no answer: asked again next pass.
        Error => "error",
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassLabels {
    pub result: PassResult,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    pub verdict: &'static str,
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StopLabels {
    pub reason: &'static str,
    pub mode: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StopFailureLabels {
    pub kind: StopFailure,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExtensionFailureLabels {
    pub reason: ExtensionFailure,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: &'static str,
    pub code: String,
}

/// A label value that comes from outside (a template name, a source address), escaped as the
/// text format requires (`\\`, `\"`, `\n`): prometheus-client writes label values as they are,
/// so a template named with a quote and a newline could otherwise inject a whole line.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
pub struct LabelText(pub String);

impl From<&str> for LabelText {
    fn from(s: &str) -> Self {
        LabelText(s.to_string())
    }
}

impl EncodeLabelValue for LabelText {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write as _;
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TemplateLabels {
    pub template: LabelText,
}

/// Money, by template, in the configured currency (one value).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CostLabels {
    pub template: LabelText,
    pub currency: LabelText,
}

/// A GPU pool (`pool` in the config: bounded, at most 32).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: LabelText,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub source: LabelText,
}

pub struct Metrics {
    pub registry: Registry,
    pub passes: Family<PassLabels, Counter>,
    pub pass_duration: Histogram,
    pub workspaces: Family<VerdictLabels, Gauge>,
    pub stops: Family<StopLabels, Counter>,
    pub stop_failures: Family<StopFailureLabels, Counter>,
    pub ttl_restores: Counter,
    pub deadline_extensions: Family<TemplateLabels, Counter>,
    pub deadline_extension_failures: Family<ExtensionFailureLabels, Counter>,
    pub autostops_averted: Family<TemplateLabels, Counter>,
    pub countdowns_set: Family<TemplateLabels, Counter>,
    pub countdowns_averted: Family<TemplateLabels, Counter>,
    pub breaker_trips: Counter,
    pub coder_requests: Family<RequestLabels, Counter>,
    pub scrape_errors: Family<SourceLabels, Counter>,
    pub token_expiry: Gauge<f64, AtomicU64>,
    pub waiting: Family<PoolLabels, Gauge>,
    pub last_pass: Gauge<f64, AtomicU64>,
    pub coder_clock_offset: Gauge<f64, AtomicU64>,
    pub stuck_stops: Gauge,
    pub held_outside: Gauge,
    pub without_series: Gauge,
    pub gpu_series_twins: Gauge,
    pub audit_write_failures: Counter,
    pub gpu_idle_seconds: Family<TemplateLabels, Counter<f64, AtomicU64>>,
    pub gpus_reclaimed: Family<TemplateLabels, Counter>,
    pub gpu_seconds_given_back: Family<TemplateLabels, Counter<f64, AtomicU64>>,
    pub gpu_cost_idle: Family<CostLabels, Counter<f64, AtomicU64>>,
    pub gpu_cost_given_back: Family<CostLabels, Counter<f64, AtomicU64>>,
    pub gpu_wait: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("coder_gpu_reclaimer");
        let m = Metrics {
            passes: Family::default(),
            pass_duration: Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            workspaces: Family::default(),
            stops: Family::default(),
            stop_failures: Family::default(),
            ttl_restores: Counter::default(),
            deadline_extensions: Family::default(),
            deadline_extension_failures: Family::default(),
            autostops_averted: Family::default(),
            countdowns_set: Family::default(),
            countdowns_averted: Family::default(),
            breaker_trips: Counter::default(),
            coder_requests: Family::default(),
            scrape_errors: Family::default(),
            token_expiry: Gauge::default(),
            waiting: Family::default(),
            last_pass: Gauge::default(),
            coder_clock_offset: Gauge::default(),
            stuck_stops: Gauge::default(),
            held_outside: Gauge::default(),
            without_series: Gauge::default(),
            gpu_series_twins: Gauge::default(),
            audit_write_failures: Counter::default(),
            gpu_idle_seconds: Family::default(),
            gpus_reclaimed: Family::default(),
            gpu_seconds_given_back: Family::default(),
            gpu_cost_idle: Family::default(),
            gpu_cost_given_back: Family::default(),
            gpu_wait: Histogram::new([60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0]),
            registry: Registry::default(),
        };
        registry.register("passes", "Passes run, by result (ok, failed)", m.passes.clone());
        registry.register("pass_duration_seconds", "Wall time of one pass", m.pass_duration.clone());
        registry.register("workspaces", "Running workspaces by verdict and reason in the latest pass", m.workspaces.clone());
        registry.register("stops", "Stop builds sent (enforce) or that would be sent (observe), by reason", m.stops.clone());
        registry.register("stop_failures", "Stops that failed, by kind", m.stop_failures.clone());
        registry.register("ttl_restores", "Autostop TTLs set back by restore_autostop", m.ttl_restores.clone());
        registry.register(
            "deadline_extensions",
            "Coder autostop deadlines moved because the GPU computes with nobody connected (extend_while_busy), by template",
            m.deadline_extensions.clone(),
        );
        registry.register(
            "deadline_extension_failures",
            "Deadline extensions Coder refused (refused) or that got no answer (error)",
            m.deadline_extension_failures.clone(),
        );
        registry.register(
            "autostops_averted",
            "Workspaces still running past the autostop deadline Coder had set, because their GPU computes, by template",
            m.autostops_averted.clone(),
        );
        registry.register(
            "countdowns_set",
            "Idle workspaces whose reclaim is Coder's countdown (countdown_in_coder): their deadline moved to now plus it, by template",
            m.countdowns_set.clone(),
        );
        registry.register(
            "countdowns_averted",
            "Workspaces used again before Coder's countdown ended (nothing was stopped), by template",
            m.countdowns_averted.clone(),
        );
        registry.register("breaker_trips", "Passes in which the circuit breaker refused every stop", m.breaker_trips.clone());
        registry.register(
            "coder_requests",
            "Requests to the Coder API by route and HTTP status (0: no response)",
            m.coder_requests.clone(),
        );
        registry.register("scrape_errors", "Failed GPU source reads, by source", m.scrape_errors.clone());
        registry.register("token_expiry_timestamp_seconds", "When the owner session token expires (unix time)", m.token_expiry.clone());
        registry.register("waiting_workspaces", "GPU workspaces waiting for a GPU in the latest pass, by pool", m.waiting.clone());
        registry.register("last_pass_timestamp_seconds", "When the latest successful pass finished (unix time)", m.last_pass.clone());
        registry.register(
            "coder_clock_offset_seconds",
            "Coder's clock minus this service's, from the listing's Date header",
            m.coder_clock_offset.clone(),
        );
        registry.register("stuck_stops", "Stop builds whose job has stayed pending longer than stop_timeout", m.stuck_stops.clone());
        registry.register(
            "gpus_held_outside_coder",
            "Workspaces whose pods report a GPU while Coder does not list them running (a canceled, failed or stuck stop)",
            m.held_outside.clone(),
        );
        registry.register(
            "gpu_workspaces_without_series",
            "Running GPU workspaces (agent connected) that no GPU series maps to: the service cannot judge them",
            m.without_series.clone(),
        );
        registry.register(
            "audit_write_failures",
            "Audit lines that could not be written (a full or read-only volume); no stop is sent without its line",
            m.audit_write_failures.clone(),
        );
        registry.register(
            "gpu_series_twins",
            "Workspace GPU keys reported by more than one scrape target in the latest pass (a forged copy looks like this)",
            m.gpu_series_twins.clone(),
        );
        registry.register("gpu_idle_seconds", "GPU-seconds observed not computing, by template", m.gpu_idle_seconds.clone());
        registry.register("gpus_reclaimed", "GPUs freed by completed stop builds, by template", m.gpus_reclaimed.clone());
        registry.register(
            "gpu_seconds_given_back",
            "GPU-seconds given back: from a completed stop until the workspace runs again, by template",
            m.gpu_seconds_given_back.clone(),
        );
        registry.register(
            "gpu_cost_idle",
            "Money spent on GPUs observed not computing (gpu_hour_price), by template and currency",
            m.gpu_cost_idle.clone(),
        );
        registry.register(
            "gpu_cost_given_back",
            "Money given back: priced GPU time from a completed stop until the workspace runs again, by template and currency",
            m.gpu_cost_given_back.clone(),
        );
        registry.register(
            "gpu_wait_seconds",
            "How long GPU sessions waited for a GPU (from waiting to running with one)",
            m.gpu_wait.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn set_verdicts<'a>(&self, decisions: impl Iterator<Item = (Verdict, Reason)> + 'a) {
        self.workspaces.clear();
        for (v, r) in decisions {
            self.workspaces.get_or_create(&VerdictLabels { verdict: v.as_str(), reason: r.as_str() }).inc();
        }
    }

    pub fn count_request(&self, endpoint: &'static str, code: u16) {
        self.coder_requests.get_or_create(&RequestLabels { endpoint, code: code.to_string() }).inc();
    }

    /// The hook the Coder client calls for each request it makes.
    pub fn observer(self: &Arc<Self>) -> crate::coder::RequestObserver {
        let m = self.clone();
        Arc::new(move |endpoint, code| m.count_request(endpoint, code))
    }

    /// Adds one pass's accounting; money is in `currency`.
    pub fn account(&self, inc: &crate::pass::accounting::Increments, currency: &str) {
        let t = |template: &str| TemplateLabels { template: template.into() };
        let c = |template: &str| CostLabels { template: template.into(), currency: currency.into() };
        for (template, money) in &inc.idle_cost {
            self.gpu_cost_idle.get_or_create(&c(template)).inc_by(*money);
        }
        for (template, money) in &inc.given_back_cost {
            self.gpu_cost_given_back.get_or_create(&c(template)).inc_by(*money);
        }
        for (template, s) in &inc.idle_gpu_seconds {
            self.gpu_idle_seconds.get_or_create(&t(template)).inc_by(*s);
        }
        for (template, n) in &inc.gpus_reclaimed {
            self.gpus_reclaimed.get_or_create(&t(template)).inc_by(*n);
        }
        for (template, s) in &inc.given_back_gpu_seconds {
            self.gpu_seconds_given_back.get_or_create(&t(template)).inc_by(*s);
        }
        for w in &inc.waits_ended {
            self.gpu_wait.observe(*w);
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pass::accounting::Increments;

    #[test]
    fn failure_labels_are_written_as_spelled_once() {
        let m = Metrics::new();
        for kind in StopFailure::ALL {
            m.stop_failures.get_or_create(&StopFailureLabels { kind: *kind }).inc();
        }
        for reason in ExtensionFailure::ALL {
            m.deadline_extension_failures.get_or_create(&ExtensionFailureLabels { reason: *reason }).inc();
        }
        for result in PassResult::ALL {
            m.passes.get_or_create(&PassLabels { result: *result }).inc();
        }
        let text = m.encode();
        let labels = StopFailure::ALL
            .iter()
            .map(|k| ("stop_failures_total", "kind", k.as_label()))
            .chain(ExtensionFailure::ALL.iter().map(|r| ("deadline_extension_failures_total", "reason", r.as_label())))
            .chain(PassResult::ALL.iter().map(|r| ("passes_total", "result", r.as_label())));
        for (metric, label, value) in labels {
            assert!(value.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{value}");
            let line = format!("coder_gpu_reclaimer_{metric}{{{label}=\"{value}\"}} 1");
            assert!(text.contains(&line), "{line}\n{text}");
        }
    }

    #[test]
    fn label_values_from_outside_are_escaped() {
        let m = Metrics::new();
        let evil = "gpu\"} 1\ncoder_gpu_reclaimer_injected{a=\"b\\";
        m.account(&Increments { gpus_reclaimed: vec![(evil.to_string(), 1)], ..Increments::default() }, "USD");
        let text = m.encode();
        assert!(!text.lines().any(|l| l.starts_with("coder_gpu_reclaimer_injected")), "{text}");
        assert!(
            text.contains(r#"coder_gpu_reclaimer_gpus_reclaimed_total{template="gpu\"} 1\ncoder_gpu_reclaimer_injected{a=\"b\\"} 1"#),
            "{text}"
        );
    }
}
