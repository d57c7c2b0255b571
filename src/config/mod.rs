//! Settings: the config file's shape, and the one place raw flags, the environment and the file
//! are validated into `Settings` (flag > env > file > default). After `Settings::resolve`, URLs
//! are parsed URLs, an exporter target is a URL or a `dns+` name, the log format, listen address,
//! audit log and webhook are decided. Two things are not final here: `prometheus_headers` stay
//! raw strings (checked when the source is built, turned into headers again at each pass), and
//! `prometheus.power` is a placeholder `false` that `app::gpu_source` sets from the policy. Every
//! error here names the setting and the fix, and is an `Error::Config` (exit 2).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Url;
use serde::Deserialize;

use crate::cli::{CommonArgs, LogFormat, RunOptions};
use crate::coder::SessionToken;
use crate::coder::token::TOKEN_ADVICE;
use crate::error::Error;
use crate::gpu::Ownership;
use crate::gpu::SourceConfig;
use crate::gpu::prometheus::PrometheusOptions;
use crate::gpu::prometheus::jobs::JobChoice;
use crate::http::{Outbound, Secret, http_url};
use crate::pass::mode::Mode;
use crate::pass::policy::{CODER_MIN_AHEAD, Policy, ReclaimWhen, Rule};
use crate::retry::RetryPolicy;

mod names;
pub use names::OneOrMore;
use names::{coderd_job, gpu_parameters, prometheus_jobs};

fn err<T>(msg: impl Into<String>) -> Result<T, Error> {
    Err(Error::Config(msg.into()))
}

/// The `--config` TOML file. Every key is optional; unknown keys are errors.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub coder_url: Option<String>,
    pub token_file: Option<PathBuf>,
    pub dcgm_exporters: Option<Vec<String>>,
    pub prometheus_url: Option<String>,
    /// Extra headers for Prometheus-compatible stores (e.g. `X-Scope-OrgID` for Mimir).
    pub prometheus_headers: Option<std::collections::BTreeMap<String, String>>,
    /// A file with a bearer token for Prometheus (Thanos, Mimir or a proxy in front).
    pub prometheus_bearer_token_file: Option<PathBuf>,
    /// Only GPU series in this Kubernetes namespace count.
    pub namespace: Option<String>,
    /// A series label whose value is the workspace id (instead of finding it in the pod name).
    pub workspace_id_label: Option<String>,
    #[serde(default, with = "crate::duration::opt")]
    pub interval: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub sample_interval: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub request_timeout: Option<Duration>,
    pub log_format: Option<LogFormat>,
    pub listen: Option<String>,
    pub health_listen: Option<String>,
    pub audit_log: Option<PathBuf>,
    pub history_journal: Option<PathBuf>,
    pub history_journal_max_mib: Option<usize>,
    pub notify_webhook: Option<String>,
    pub notify_webhook_file: Option<PathBuf>,
    pub status_token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    /// Largest accepted bodies, MiB: the Coder listing, one exporter scrape, one Prometheus query.
    pub max_listing_mib: Option<usize>,
    pub max_exporter_body_mib: Option<usize>,
    pub max_prometheus_body_mib: Option<usize>,
    /// What the exporter scrapes in flight may hold together, MiB.
    pub max_in_flight_body_mib: Option<usize>,
    /// Distinct GPU series one exporter scrape, and one pass's Prometheus answers, may hold.
    pub max_gpus_per_exporter: Option<usize>,
    pub max_gpu_series: Option<usize>,
    /// Label matchers added to every Prometheus query, e.g. `job="gpu-metrics"`.
    pub prometheus_selector: Option<String>,
    /// The exporter's scrape job, or a list of them: behind Prometheus only their series count.
    /// Unset: the one job Prometheus names (`gpu::prometheus::jobs`).
    pub prometheus_job: Option<OneOrMore>,
    /// coderd's scrape job, whose agent-stat gauges `backtest` reads (unset: the one job that
    /// carries them).
    pub coderd_job: Option<String>,
    /// The one HTTP proxy outgoing requests use; proxies in the environment are ignored.
    pub proxy_url: Option<String>,

    #[serde(default, with = "crate::duration::opt")]
    pub idle_after: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub grace: Option<Duration>,
    pub reclaim_when: Option<ReclaimWhen>,
    #[serde(default, with = "crate::duration::opt")]
    pub connected_idle_after: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub max_lifetime: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub restore_autostop: Option<Duration>,
    pub extend_while_busy: Option<bool>,
    #[serde(default, with = "crate::duration::opt")]
    pub extend_by: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub extend_limit: Option<Duration>,
    /// Coder's own countdown instead of the service's stop (`pass::countdown`).
    #[serde(default, with = "crate::duration::opt")]
    pub countdown_in_coder: Option<Duration>,
    pub max_extensions_per_pass: Option<usize>,
    pub max_gpus_per_workspace: Option<usize>,
    /// The default GPU pool's name (`contended`: demand is per pool).
    pub pool: Option<String>,
    pub gpu_templates: Option<Vec<String>>,
    pub sm_active_min: Option<f64>,
    pub gr_engine_active_min: Option<f64>,
    pub gpu_util_min_percent: Option<f64>,
    pub empty_memory_mib: Option<f64>,
    pub memory_held_mib: Option<f64>,
    pub min_samples: Option<usize>,
    #[serde(default, with = "crate::duration::opt")]
    pub max_sample_gap: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub stale_after: Option<Duration>,
    pub max_stops_per_pass: Option<usize>,
    pub max_idle_fraction: Option<f64>,
    pub reclaim_tasks: Option<bool>,
    #[serde(default, with = "crate::duration::opt")]
    pub stop_timeout: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub frozen_after: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub start_allowance: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub bind_allowance: Option<Duration>,
    /// Build parameters whose value `0`, `false`, `none` or empty marks a CPU variant.
    pub gpu_parameters: Option<Vec<String>>,
    #[serde(default, with = "crate::duration::opt")]
    pub agent_lost_after: Option<Duration>,
    #[serde(default, with = "crate::duration::opt")]
    pub exporter_collect_interval: Option<Duration>,
    /// GPU model glob -> watts: a GPU drawing at least this is kept (a power veto).
    #[serde(default)]
    pub active_power_watts: Option<std::collections::BTreeMap<String, f64>>,
    /// GPU model glob -> price of one GPU-hour, in `currency`.
    #[serde(default)]
    pub gpu_hour_price: Option<std::collections::BTreeMap<String, f64>>,
    pub currency: Option<String>,
    #[serde(default, rename = "rule")]
    pub rules: Vec<Rule>,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::config(format!("--config {}: cannot read it ({e}); fix the path or unset CODER_GPU_RECLAIMER_CONFIG", path.display()))
        })?;
        Self::parse(&text).map_err(|e| Error::config(format!("--config {}: {e}", path.display())))
    }

    /// Parses the TOML text; errors name the key and the line.
    pub fn parse(text: &str) -> Result<Self, Error> {
        toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            let msg = e.message().trim().to_string();
            Error::Config(match line {
                Some(l) => {
                    let source = text.lines().nth(l - 1).unwrap_or("").trim();
                    format!("line {l} ({source}): {msg}")
                }
                None => msg,
            })
        })
    }
}

/// Validated settings: what `run`, `plan`, the demo, the tests and the benchmarks build the
/// service from (`app::Application::build`); `check` builds only the clients from them.
#[derive(Debug, Clone)]
pub struct Settings {
    pub coder_url: Url,
    pub token: SessionToken,
    /// Where the token was read from, when a file: it is re-read when it changes.
    pub token_file: Option<PathBuf>,
    /// The GPU source's own settings (`gpu::SourceConfig`: each source's, from its file).
    pub gpu: SourceConfig,
    pub ownership: Ownership,
    pub interval: Duration,
    /// Exporters are scraped this often between passes (at most `interval`).
    pub sample_interval: Duration,
    pub request_timeout: Duration,
    pub log_format: LogFormat,
    pub listen: SocketAddr,
    /// A second listener for /healthz, /readyz and /metrics only.
    pub health_listen: Option<SocketAddr>,
    pub audit_log: Option<PathBuf>,
    /// `run` journals each change of a running workspace here (off when `None`).
    pub history_journal: Option<PathBuf>,
    /// One journal file's bound in bytes (the older half kept beside it).
    pub history_journal_max: usize,
    /// coderd's scrape job for `backtest`'s gauges (`None`: the one job that carries them).
    pub coderd_job: Option<String>,
    pub notify_webhook: Option<Url>,
    /// Required as a bearer token on the fleet-wide HTTP routes, when set.
    pub status_token: Option<std::sync::Arc<crate::http::SecretFile>>,
    /// Extra CAs every outgoing client trusts.
    pub outbound: Outbound,
    /// The largest running-workspace listing (`max_listing_mib`).
    pub max_listing: usize,
    /// `run --enforce`; observe otherwise (and always for `plan` and `check`).
    pub mode: Mode,
    pub policy: Policy,
    /// Retries of one Coder call inside a pass (not a flag; tests shorten it).
    pub api_retry: RetryPolicy,
}

fn count(setting: &str, v: Option<usize>, default: usize) -> Result<usize, Error> {
    match v {
        None => Ok(default),
        Some(n) if (1..=10_000_000).contains(&n) => Ok(n),
        Some(n) => err(format!("{setting} = {n} must be between 1 and 10000000, e.g. {default}")),
    }
}

/// Label matchers for every Prometheus query (`job="gpu-metrics"`, `cluster=~"gpu-.*"`): only
/// the exporter's series are read, not a look-alike another job exports with a workspace's pod
/// label. Checked for shape here; Prometheus checks the rest.
fn prometheus_selector(raw: &str) -> Result<String, Error> {
    let s = raw.trim().trim_start_matches('{').trim_end_matches('}').trim();
    let example = "prometheus_selector = 'job=\"nvidia-dcgm-exporter\"'";
    let quotes = s.chars().filter(|c| *c == '"').count();
    let has_op = ["=", "!=", "=~", "!~"].iter().any(|op| s.contains(op));
    if s.is_empty() || quotes % 2 != 0 || quotes == 0 || !has_op || s.contains(['{', '}', '\n']) {
        return err(format!("prometheus_selector {raw:?}: write label matchers without braces, e.g. {example}"));
    }
    Ok(s.to_string())
}

fn mib(setting: &str, v: Option<usize>, default: usize) -> Result<usize, Error> {
    match v {
        None => Ok(default),
        Some(n) if (1..=4096).contains(&n) => Ok(n << 20),
        Some(n) => err(format!("{setting} = {n} must be between 1 and 4096 (MiB), e.g. {}", default >> 20)),
    }
}

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// dcgm-exporter collects every 30 s by default: sampling at 15 s sees every reading.
pub const DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_secs(15);
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 9464);

impl Settings {
    /// Defaults around the three things nothing can default: Coder, the token, the GPU source.
    pub fn new(coder_url: Url, token: SessionToken, gpu: SourceConfig) -> Self {
        Settings {
            coder_url,
            token,
            token_file: None,
            gpu,
            ownership: Ownership::default(),
            interval: DEFAULT_INTERVAL,
            sample_interval: DEFAULT_SAMPLE_INTERVAL,
            request_timeout: Duration::from_secs(10),
            log_format: LogFormat::Text,
            listen: DEFAULT_LISTEN,
            health_listen: None,
            audit_log: None,
            history_journal: None,
            history_journal_max: crate::pass::journal::DEFAULT_MAX_BYTES,
            coderd_job: None,
            notify_webhook: None,
            status_token: None,
            outbound: Outbound::default(),
            max_listing: crate::coder::DEFAULT_MAX_LISTING,
            mode: Mode::Observe,
            policy: Policy::defaults(DEFAULT_INTERVAL),
            api_retry: RetryPolicy::for_api_calls(),
        }
    }

    /// Settings for a service pointed at local fakes (the demo, the in-process tests, the
    /// benchmarks): Coder at `coder_url` with `token`, GPU readings from `gpu`, a pass every
    /// `interval` under the default policy for it. Callers change the rest.
    pub fn local(coder_url: &str, token: &str, gpu: SourceConfig, interval: Duration) -> Result<Settings, Error> {
        let mut settings = Settings::new(
            http_url("coder_url", coder_url, "http://127.0.0.1:3000")?,
            SessionToken::new(token).map_err(Error::config)?,
            gpu,
        );
        settings.interval = interval;
        settings.policy = Policy::defaults(interval);
        Ok(settings)
    }

    /// Resolves everything. `run` is `Some` for the `run` command's own flags; `token_env` is
    /// CODER_SESSION_TOKEN's value (read by the caller); `default_log_format` is the command's.
    pub fn resolve(
        args: &CommonArgs,
        run: Option<&RunOptions>,
        token_env: Option<String>,
        default_log_format: LogFormat,
    ) -> Result<Settings, Error> {
        let file = match &args.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        let coder_url = args.coder_url.clone().or_else(|| file.coder_url.clone()).filter(|s| !s.trim().is_empty());
        let Some(coder_url) = coder_url else {
            return err("CODER_URL is not set: pass --coder-url https://coder.example.com");
        };
        let coder_url = http_url("--coder-url", coder_url.trim().trim_end_matches('/'), "https://coder.example.com")?;

        // An explicit --token-file (or CODER_SESSION_TOKEN_FILE) wins over CODER_SESSION_TOKEN,
        // which wins over the config file's token_file.
        let from_file = |path: &Path| SessionToken::from_file(path).map_err(|e| Error::config(format!("--token-file: {e}")));
        let (token, token_file) = match (&args.token_file, token_env.filter(|t| !t.trim().is_empty()), &file.token_file) {
            (Some(path), _, _) => (from_file(path)?, Some(path.clone())),
            (None, Some(t), _) => {
                (SessionToken::new(&t).map_err(|e| Error::config(format!("CODER_SESSION_TOKEN: {e}: set it to an owner token")))?, None)
            }
            (None, None, Some(path)) => (from_file(path)?, Some(path.clone())),
            (None, None, None) => {
                return err(format!("no session token: set CODER_SESSION_TOKEN, or pass --token-file PATH (create one {TOKEN_ADVICE})"));
            }
        };

        let exporters: Vec<String> = if args.dcgm_exporters.iter().any(|s| !s.trim().is_empty()) {
            args.dcgm_exporters.clone()
        } else {
            file.dcgm_exporters.clone().unwrap_or_default()
        }
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
        let prometheus = args.prometheus_url.clone().or_else(|| file.prometheus_url.clone()).filter(|s| !s.trim().is_empty());
        let gpu = match (exporters.is_empty(), prometheus) {
            (false, Some(_)) => return err("both --dcgm-exporter and --prometheus-url are set: choose one GPU source"),
            (true, None) => {
                return err(
                    "no GPU source: pass --dcgm-exporter http://dcgm-exporter.gpu-operator:9400/metrics (repeatable) or --prometheus-url http://prometheus:9090",
                );
            }
            (true, Some(p)) => SourceConfig::prometheus_at("--prometheus-url", &p)?,
            (false, None) => SourceConfig::exporters_at(&exporters)?,
        };

        let interval = args.interval.or(file.interval).unwrap_or(DEFAULT_INTERVAL);
        if interval < Duration::from_secs(1) {
            return err("--interval must be at least 1s, e.g. --interval 60s");
        }
        let sample_interval = match args.sample_interval.or(file.sample_interval) {
            Some(d) if d > interval => {
                return err(format!(
                    "--sample-interval {} is longer than --interval {}: sample at most once a pass, e.g. --sample-interval 15s",
                    humantime::format_duration(d),
                    humantime::format_duration(interval)
                ));
            }
            Some(d) if d < Duration::from_millis(500) => {
                return err("--sample-interval must be at least 500ms, e.g. --sample-interval 15s");
            }
            Some(d) => d,
            None => DEFAULT_SAMPLE_INTERVAL.min(interval),
        };
        let request_timeout = args.request_timeout.or(file.request_timeout).unwrap_or(Duration::from_secs(10));
        if request_timeout.is_zero() {
            return err("--request-timeout must be more than 0s, e.g. --request-timeout 10s");
        }
        let policy = build_policy(args, &file, interval)?;
        let run = run.cloned().unwrap_or_default();
        let listen = match (run.listen, &file.listen) {
            (Some(a), _) => a,
            (None, Some(s)) => s
                .trim()
                .parse()
                .map_err(|e| Error::config(format!("listen = {s:?} in the config file: {e}; write e.g. \"0.0.0.0:9464\"")))?,
            (None, None) => DEFAULT_LISTEN,
        };
        let health_listen = match (run.health_listen, &file.health_listen) {
            (Some(a), _) => Some(a),
            (None, Some(s)) => Some(
                s.trim()
                    .parse()
                    .map_err(|e| Error::config(format!("health_listen = {s:?} in the config file: {e}; write e.g. \"0.0.0.0:9465\"")))?,
            ),
            (None, None) => None,
        };
        if health_listen.is_some_and(|h| h == listen && h.port() != 0) {
            return err(format!(
                "--health-listen {listen} is the same address as --listen: give the probes a port of their own, e.g. 0.0.0.0:9465"
            ));
        }
        const HOOK_EXAMPLE: &str = "https://hooks.slack.com/services/...";
        let notify_webhook = match (run.notify_webhook.filter(|s| !s.trim().is_empty()), run.notify_webhook_file) {
            (Some(u), _) => Some(http_url("--notify-webhook", &u, HOOK_EXAMPLE)?),
            (None, Some(path)) => Some(webhook_from_file(&path)?),
            (None, None) => match (&file.notify_webhook, &file.notify_webhook_file) {
                (Some(_), Some(_)) => return err("notify_webhook and notify_webhook_file are both in the config file: keep one"),
                (Some(u), None) => Some(http_url("notify_webhook", u, HOOK_EXAMPLE)?),
                (None, Some(path)) => Some(webhook_from_file(path)?),
                (None, None) => None,
            },
        };
        let status_token = run
            .status_token_file
            .or_else(|| file.status_token_file.clone())
            .map(|p| crate::http::SecretFile::open("--status-token-file", &p).map(std::sync::Arc::new))
            .transpose()?;
        let mut outbound = match args.ca_file.clone().or_else(|| file.ca_file.clone()) {
            Some(path) => Outbound::from_pem_file(&path)?,
            None => Outbound::default(),
        };
        if let Some(raw) = args.proxy_url.clone().or_else(|| file.proxy_url.clone()).filter(|s| !s.trim().is_empty()) {
            let proxy = http_url("proxy_url", raw.trim(), "http://proxy.example.com:3128")?;
            if coder_url.scheme() == "http" {
                return err(
                    "proxy_url is set and coder_url is http://: the owner token would cross the proxy in clear; use Coder's https:// URL, or drop proxy_url",
                );
            }
            let bearer_in_clear = file.prometheus_bearer_token_file.is_some() && gpu.prometheus_url().is_some_and(|u| u.scheme() == "http");
            if bearer_in_clear {
                return err(
                    "proxy_url is set and prometheus_url is http:// with prometheus_bearer_token_file: the bearer token would cross the proxy in clear; use Prometheus's https:// URL, or drop proxy_url",
                );
            }
            outbound.proxy = Some(proxy);
        }
        let named = if args.prometheus_job.is_empty() {
            file.prometheus_job.clone().map(OneOrMore::into_vec)
        } else {
            Some(args.prometheus_job.clone())
        };
        let prometheus_jobs = match named {
            Some(jobs) => JobChoice::Named(prometheus_jobs(&jobs)?),
            None => JobChoice::Discover,
        };
        // Every limit is checked, whichever source is configured; each source keeps its own.
        let max_listing = mib("max_listing_mib", file.max_listing_mib, crate::coder::DEFAULT_MAX_LISTING)?;
        let history_journal_max = mib("history_journal_max_mib", file.history_journal_max_mib, crate::pass::journal::DEFAULT_MAX_BYTES)?;
        let exporter_body = mib("max_exporter_body_mib", file.max_exporter_body_mib, crate::gpu::exporter::DEFAULT_MAX_BODY)?;
        let in_flight = mib("max_in_flight_body_mib", file.max_in_flight_body_mib, crate::gpu::exporter::DEFAULT_IN_FLIGHT_BUDGET)?;
        let exporter_gpus = count("max_gpus_per_exporter", file.max_gpus_per_exporter, crate::gpu::exporter::DEFAULT_MAX_GPUS)?;
        let prometheus_body = mib("max_prometheus_body_mib", file.max_prometheus_body_mib, crate::gpu::prometheus::DEFAULT_MAX_BODY)?;
        let max_series = count("max_gpu_series", file.max_gpu_series, crate::gpu::prometheus::DEFAULT_MAX_SERIES)?;
        let selector = file.prometheus_selector.as_deref().map(prometheus_selector).transpose()?;
        let mut gpu = gpu;
        match &mut gpu {
            SourceConfig::Exporters(c) => {
                (c.max_body, c.in_flight, c.max_gpus) = (exporter_body, in_flight, exporter_gpus);
            }
            SourceConfig::Prometheus(c) => {
                c.max_body = prometheus_body;
                c.options = PrometheusOptions {
                    headers: file.prometheus_headers.clone().unwrap_or_default().into_iter().collect(),
                    bearer_token_file: file.prometheus_bearer_token_file.clone(),
                    power: false, // the policy's, where the source is built
                    selector,
                    jobs: prometheus_jobs,
                    max_series,
                    // The policy's, where the source is built.
                    series_per_pod: crate::gpu::DEFAULT_MAX_GPUS_PER_WORKSPACE + 1,
                };
            }
        }
        Ok(Settings {
            coder_url,
            token,
            token_file,
            gpu,
            ownership: Ownership {
                namespace: args.namespace.clone().or_else(|| file.namespace.clone()).filter(|n| !n.trim().is_empty()),
                workspace_id_label: file.workspace_id_label.clone(),
            },
            interval,
            sample_interval,
            request_timeout,
            log_format: args.log_format.or(file.log_format).unwrap_or(default_log_format),
            listen,
            health_listen,
            audit_log: run.audit_log.or_else(|| file.audit_log.clone()),
            history_journal: run.history_journal.or_else(|| file.history_journal.clone()),
            history_journal_max,
            coderd_job: file.coderd_job.as_deref().map(coderd_job).transpose()?,
            notify_webhook,
            status_token,
            outbound,
            max_listing,
            mode: if run.enforce { Mode::Enforce } else { Mode::Observe },
            policy,
            api_retry: RetryPolicy::for_api_calls(),
        })
    }

    /// A one-line, secret-free summary (for `check` and the start-up log).
    pub fn summary(&self) -> String {
        let gpu = self.gpu.describe();
        let t = &self.policy.thresholds;
        let when = match self.policy.reclaim_when {
            ReclaimWhen::Always => "always",
            ReclaimWhen::Contended => "contended",
        };
        format!(
            "coder_url={} {gpu} interval={} sample_interval={} idle_after={} grace={} reclaim_when={when} rules={}",
            crate::http::redact(&self.coder_url).trim_end_matches('/'),
            humantime::format_duration(self.interval),
            humantime::format_duration(self.sample_interval),
            humantime::format_duration(t.idle_after),
            humantime::format_duration(t.grace),
            self.policy.rules.len()
        )
    }
}

/// The webhook URL from a file (a mounted Secret): the URL is a secret, so errors never echo it.
fn webhook_from_file(path: &Path) -> Result<Url, Error> {
    let secret = Secret::from_file("--notify-webhook-file", path)?;
    http_url("--notify-webhook-file", secret.expose(), "https://hooks.slack.com/services/...").map_err(|_| {
        Error::config(format!("--notify-webhook-file {}: does not hold an http(s) URL; write the webhook URL alone in it", path.display()))
    })
}

fn ratio(setting: &str, v: Option<f64>, default: f64) -> Result<f64, Error> {
    match v {
        None => Ok(default),
        Some(x) if (0.0..=1.0).contains(&x) => Ok(x),
        Some(x) => err(format!("{setting} = {x} is out of range: write a ratio between 0 and 1, e.g. {default}")),
    }
}

fn non_negative(setting: &str, v: Option<f64>, default: f64) -> Result<f64, Error> {
    match v {
        None => Ok(default),
        Some(x) if x >= 0.0 && x.is_finite() => Ok(x),
        Some(x) => err(format!("{setting} = {x} must be a number of 0 or more, e.g. {default}")),
    }
}

/// The policy's duration keys `backtest --sweep` may vary (as the config file spells them).
pub const SWEEP_KEYS: &[&str] = &[
    "idle_after",
    "grace",
    "connected_idle_after",
    "max_lifetime",
    "restore_autostop",
    "extend_by",
    "extend_limit",
    "max_sample_gap",
    "stale_after",
    "frozen_after",
    "start_allowance",
    "bind_allowance",
    "agent_lost_after",
];

/// `--sweep KEY=V1,V2,...`: one policy per value, each the configured policy (flags, file,
/// defaults) with that key set to that value, labelled `KEY=V`. The key's flag, when given,
/// yields to the swept value.
pub fn swept_policies(args: &CommonArgs, sweep: &str, interval: Duration) -> Result<Vec<(String, Policy)>, Error> {
    let example = "--sweep idle_after=15m,30m,1h,2h";
    let Some((key, values)) = sweep.split_once('=') else {
        return err(format!("--sweep {sweep:?}: write KEY=VALUE,VALUE,..., e.g. {example}"));
    };
    let key = key.trim();
    if !SWEEP_KEYS.contains(&key) {
        return err(format!("--sweep {key:?} is not a duration key of the policy: use one of {}, e.g. {example}", SWEEP_KEYS.join(", ")));
    }
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let mut args = args.clone();
    match key {
        "idle_after" => args.idle_after = None,
        "grace" => args.grace = None,
        _ => {}
    }
    let mut out = Vec::new();
    for raw in values.split(',').map(str::trim).filter(|v| !v.is_empty()) {
        let d = crate::duration::parse(raw).map_err(|e| Error::config(format!("--sweep {key}={raw}: {e}, e.g. {example}")))?;
        let mut file = file.clone();
        let slot = match key {
            "idle_after" => &mut file.idle_after,
            "grace" => &mut file.grace,
            "connected_idle_after" => &mut file.connected_idle_after,
            "max_lifetime" => &mut file.max_lifetime,
            "restore_autostop" => &mut file.restore_autostop,
            "extend_by" => &mut file.extend_by,
            "extend_limit" => &mut file.extend_limit,
            "max_sample_gap" => &mut file.max_sample_gap,
            "stale_after" => &mut file.stale_after,
            "frozen_after" => &mut file.frozen_after,
            "start_allowance" => &mut file.start_allowance,
            "bind_allowance" => &mut file.bind_allowance,
            _ => &mut file.agent_lost_after,
        };
        *slot = Some(d);
        let policy = build_policy(&args, &file, interval).map_err(|e| Error::config(format!("--sweep {key}={raw}: {e}")))?;
        out.push((format!("{key}={raw}"), policy));
    }
    if out.is_empty() {
        return err(format!("--sweep {key}= names no value, e.g. {example}"));
    }
    if out.len() > MAX_SWEEP_VALUES {
        return err(format!("--sweep {key}: {} values, at most {MAX_SWEEP_VALUES} (each is a replay held in memory)", out.len()));
    }
    Ok(out)
}

/// The most values one sweep replays (each holds its own windows for the fleet).
pub const MAX_SWEEP_VALUES: usize = 16;

/// The policy from defaults, the file, then flags.
pub fn build_policy(args: &CommonArgs, file: &FileConfig, interval: Duration) -> Result<Policy, Error> {
    let mut p = Policy::defaults(interval);
    let t = &mut p.thresholds;
    t.idle_after = args.idle_after.or(file.idle_after).unwrap_or(t.idle_after);
    t.grace = args.grace.or(file.grace).unwrap_or(t.grace);
    t.connected_idle_after = file.connected_idle_after;
    t.max_lifetime = file.max_lifetime;
    let longest = [("idle_after", Some(t.idle_after)), ("grace", Some(t.grace)), ("connected_idle_after", t.connected_idle_after)];
    for (name, d) in longest.into_iter().chain([("max_lifetime", t.max_lifetime)]) {
        if d.is_some_and(|d| d > crate::duration::MAX) {
            return err(format!("{name} is longer than a year: write a shorter duration, like 30m or 8h"));
        }
    }
    if t.idle_after.is_zero() {
        return err("idle_after must be more than 0s, e.g. --idle-after 30m");
    }
    if t.connected_idle_after.is_some_and(|c| c < t.idle_after) {
        return err("connected_idle_after must be at least idle_after: it is the longer limit for GPUs idle behind an open connection");
    }
    p.reclaim_when = args.reclaim_when.map(ReclaimWhen::from).or(file.reclaim_when).unwrap_or_default();
    p.gpu_templates = file.gpu_templates.clone().unwrap_or_default();
    p.restore_autostop = file.restore_autostop;
    if let Some(d) = p.restore_autostop {
        if d < Duration::from_secs(60) || d > Duration::from_secs(30 * 24 * 3600) {
            return err("restore_autostop must be between 1m and 30d (Coder's TTL limits), e.g. restore_autostop = \"8h\"");
        }
    }
    t.extend_while_busy = file.extend_while_busy.unwrap_or(t.extend_while_busy);
    t.extend_by = file.extend_by.unwrap_or(t.extend_by);
    t.extend_limit = file.extend_limit.unwrap_or(t.extend_limit);
    let per_rule = file.rules.iter().enumerate().map(|(i, r)| (format!("rule {}: ", i + 1), r.extend_by, r.extend_limit));
    for (at, by, limit) in [(String::new(), Some(t.extend_by), Some(t.extend_limit))].into_iter().chain(per_rule) {
        if by.is_some_and(|d| d < CODER_MIN_AHEAD + interval * 3) {
            return err(format!(
                "{at}extend_by must be at least 30m plus three intervals: Coder refuses a deadline less than 30 minutes ahead, and an extension must outlast the passes until the next one is due, e.g. extend_by = \"1h\""
            ));
        }
        if by.into_iter().chain(limit).any(|d| d > crate::duration::MAX) || limit.is_some_and(|d| d.is_zero()) {
            return err(format!("{at}extend_by and extend_limit must be more than 0s and at most a year, e.g. extend_limit = \"24h\""));
        }
    }
    t.countdown_in_coder = file.countdown_in_coder;
    let per_rule = file.rules.iter().enumerate().map(|(i, r)| (format!("rule {}: ", i + 1), r.countdown_in_coder));
    for (at, countdown) in [(String::new(), t.countdown_in_coder)].into_iter().chain(per_rule) {
        if countdown.is_some_and(|d| d < CODER_MIN_AHEAD || d > Duration::from_secs(7 * 24 * 3600)) {
            return err(format!(
                "{at}countdown_in_coder must be between 30m and 7d: Coder refuses a deadline less than 30 minutes ahead (leave it unset for the reclaimer's own stop), e.g. countdown_in_coder = \"30m\""
            ));
        }
    }
    p.max_extensions_per_pass = file.max_extensions_per_pass.unwrap_or(p.max_extensions_per_pass);
    p.max_gpus_per_workspace = match file.max_gpus_per_workspace {
        Some(n) if n == 0 || n > crate::gpu::window::MAX_GPUS_PER_WORKSPACE => {
            return err(format!(
                "max_gpus_per_workspace = {n}: give 1 to {} (a pod's GPUs, or MIG instances)",
                crate::gpu::window::MAX_GPUS_PER_WORKSPACE
            ));
        }
        Some(n) => n,
        None => p.max_gpus_per_workspace,
    };
    p.sm_active_min = ratio("sm_active_min", file.sm_active_min, p.sm_active_min)?;
    p.gr_engine_active_min = ratio("gr_engine_active_min", file.gr_engine_active_min, p.gr_engine_active_min)?;
    p.gpu_util_min = ratio("gpu_util_min_percent", file.gpu_util_min_percent.map(|x| x / 100.0), p.gpu_util_min)?;
    p.empty_memory_mib = non_negative("empty_memory_mib", file.empty_memory_mib, p.empty_memory_mib)?;
    p.memory_held_mib = non_negative("memory_held_mib", file.memory_held_mib, p.memory_held_mib)?;
    p.max_idle_fraction = ratio("max_idle_fraction", file.max_idle_fraction, p.max_idle_fraction)?;
    p.min_samples = file.min_samples.unwrap_or(p.min_samples).max(1);
    p.max_sample_gap = file.max_sample_gap.unwrap_or(p.max_sample_gap);
    p.stale_after = file.stale_after.unwrap_or(p.stale_after);
    if p.max_sample_gap <= interval || p.stale_after <= interval {
        return err(
            "max_sample_gap and stale_after must be longer than the interval, or every pass reads as a gap; the defaults are 3x and 2x the interval",
        );
    }
    p.max_stops_per_pass = file.max_stops_per_pass.unwrap_or(p.max_stops_per_pass);
    p.reclaim_tasks = file.reclaim_tasks.unwrap_or(p.reclaim_tasks);
    p.frozen_after = file.frozen_after.unwrap_or(p.frozen_after);
    if file.frozen_after.is_some() && p.frozen_after < interval * 2 {
        return err("frozen_after must be at least twice the interval: readings are compared pass to pass, e.g. frozen_after = \"3m\"");
    }
    p.exporter_collect_interval = file.exporter_collect_interval.unwrap_or(p.exporter_collect_interval);
    if p.exporter_collect_interval.is_zero() {
        return err("exporter_collect_interval is dcgm-exporter's -c (DCGM_EXPORTER_INTERVAL), e.g. exporter_collect_interval = \"30s\"");
    }
    if let Some(table) = &file.active_power_watts {
        p.active_power_watts = per_model_table(table, |glob, watts| {
            format!("active_power_watts {glob:?} = {watts}: write the watts a busy GPU of that model draws, e.g. 150")
        })?;
    }
    if let Some(table) = &file.gpu_hour_price {
        p.gpu_hour_price = per_model_table(table, |glob, price| {
            format!("gpu_hour_price {glob:?} = {price}: write what one GPU-hour of that model costs, e.g. 2.5")
        })?;
    }
    if let Some(currency) = &file.currency {
        let ok = (1..=8).contains(&currency.len()) && currency.chars().all(|c| c.is_ascii_alphanumeric());
        if !ok {
            return err(format!("currency {currency:?}: a short code of letters, e.g. currency = \"USD\""));
        }
        p.currency = currency.clone();
    }
    p.stop_timeout = file.stop_timeout.unwrap_or(p.stop_timeout);
    if p.stop_timeout < interval {
        return err("stop_timeout must be at least the interval: a stop build is looked at once a pass");
    }
    p.start_allowance = file.start_allowance.unwrap_or(p.start_allowance);
    p.bind_allowance = file.bind_allowance.unwrap_or(p.bind_allowance);
    if p.bind_allowance > Duration::from_secs(3600) {
        return err("bind_allowance is how long a first start's volume may take to bind, at most 1h, e.g. bind_allowance = \"30s\"");
    }
    if let Some(names) = &file.gpu_parameters {
        p.gpu_parameters = gpu_parameters(names)?;
    }
    p.agent_lost_after = file.agent_lost_after.unwrap_or(p.agent_lost_after);
    if p.agent_lost_after < interval {
        return err("agent_lost_after must be at least the interval: an agent is looked at once a pass, e.g. agent_lost_after = \"1h\"");
    }
    for (i, r) in file.rules.iter().enumerate() {
        if r.template.is_none() && r.owner.is_none() && r.workspace.is_none() {
            return err(format!("rule {} matches everything: give it a template, owner or workspace pattern", i + 1));
        }
    }
    p.rules = file.rules.clone();
    p.pools = pools(file)?;
    Ok(p)
}

/// The most pools: each is a label value of `waiting_workspaces`.
const MAX_POOLS: usize = 32;

/// The pools the file names: the default (`pool`, else `"default"`) first, then each rule's in
/// order of first use.
fn pools(file: &FileConfig) -> Result<Vec<String>, Error> {
    let mut out = vec![file.pool.clone().unwrap_or_else(|| crate::pass::policy::DEFAULT_POOL.to_string())];
    for name in file.rules.iter().filter_map(|r| r.pool.as_ref()) {
        if !out.contains(name) {
            out.push(name.clone());
        }
    }
    for name in &out {
        let ok = (1..=63).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !ok {
            return err(format!("pool {name:?}: a short name of letters, digits, '-', '_' and '.', e.g. pool = \"a10g\""));
        }
    }
    if out.len() > MAX_POOLS {
        return err(format!("{} pools: at most {MAX_POOLS}; group templates that share nodes into one pool", out.len()));
    }
    Ok(out)
}

/// A per-model table (glob -> positive number), the most specific glob first: a longer glob
/// wins over a shorter one.
fn per_model_table(
    table: &std::collections::BTreeMap<String, f64>,
    explain: impl Fn(&str, f64) -> String,
) -> Result<Vec<(String, f64)>, Error> {
    let mut rules: Vec<(String, f64)> = Vec::with_capacity(table.len());
    for (glob, value) in table {
        if !value.is_finite() || *value <= 0.0 {
            return Err(Error::config(explain(glob, *value)));
        }
        rules.push((glob.clone(), *value));
    }
    rules.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    Ok(rules)
}

#[cfg(test)]
mod tests;
