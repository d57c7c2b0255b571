//! The subcommands `run`, `plan` and `check`: build the pieces from `Settings` and run them.
//! Returns `AppError` so `main` can map failures to exit codes (2 configuration, 1 runtime).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::actuator::{Actuator, Outputs};
use crate::audit::{AuditLog, Notifier};
use crate::cli::{CheckArgs, CommonArgs, OutputFormat, PlanArgs, RunArgs};
use crate::coder::CoderClient;
use crate::config::{ConfigError, GpuSourceSettings, Settings};
use crate::gpu::exporter::ExporterSource;
use crate::gpu::prometheus::PrometheusSource;
use crate::gpu::{GpuSource, Sources};
use crate::metrics::{Metrics, Mode};
use crate::reclaim::{Reclaimer, State};
use crate::retry::RetryPolicy;
use crate::startup::{StartupError, confirm_owner};

#[derive(Debug)]
pub enum AppError {
    /// Exit 2: the operator must change a setting.
    Config(String),
    /// Exit 1: something failed at run time.
    Runtime(String),
}

impl From<ConfigError> for AppError {
    fn from(e: ConfigError) -> Self {
        AppError::Config(e.0)
    }
}

impl From<StartupError> for AppError {
    fn from(e: StartupError) -> Self {
        match e {
            StartupError::Config(m) => AppError::Config(m),
            StartupError::Runtime(m) => AppError::Runtime(m),
        }
    }
}

pub fn resolve(common: &CommonArgs) -> Result<Settings, AppError> {
    Ok(Settings::resolve(common, std::env::var("CODER_SESSION_TOKEN").ok())?)
}

pub fn coder_client(settings: &Settings, metrics: &Arc<Metrics>, retry: RetryPolicy) -> Result<CoderClient, AppError> {
    Ok(CoderClient::new(&settings.coder_url, settings.token.clone(), settings.request_timeout, retry)
        .map_err(AppError::Runtime)?
        .with_observer(metrics.observer()))
}

pub fn gpu_source(settings: &Settings) -> Result<Sources, AppError> {
    Ok(match &settings.gpu {
        GpuSourceSettings::Exporters(urls) => Sources::Exporters(
            ExporterSource::new(urls.clone(), settings.ownership.clone(), settings.request_timeout).map_err(AppError::Runtime)?,
        ),
        GpuSourceSettings::Prometheus(url) => Sources::Prometheus(
            PrometheusSource::new(
                url,
                settings.ownership.clone(),
                settings.policy.longest_lookback(),
                settings.interval,
                settings.request_timeout,
            )
            .map_err(AppError::Runtime)?,
        ),
    })
}

/// Sets `shutdown` to true when SIGTERM or ctrl-c arrives (in a task of its own).
pub fn spawn_signal_handler(shutdown: watch::Sender<bool>) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(event = "signal_setup_failed", error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!(event = "shutdown_requested", "shutting down: no new stops; finishing requests in flight (at most 10 s)");
        let _ = shutdown.send(true);
    });
}

pub async fn run(args: RunArgs) -> Result<(), AppError> {
    let settings = resolve(&args.common)?;
    let file = &settings.file;
    let audit_path = args.audit_log.clone().or_else(|| file.audit_log.clone());
    let audit = audit_path.map(|p| AuditLog::open(&p).map(Arc::new)).transpose().map_err(AppError::Config)?;
    let webhook = args.notify_webhook.clone().or_else(|| file.notify_webhook.clone());
    let notifier = webhook.map(|u| Notifier::new(&u)).transpose().map_err(AppError::Config)?;
    let listen = match args.listen {
        Some(a) => a,
        None => match &file.listen {
            Some(s) => {
                s.parse().map_err(|e| AppError::Config(format!("listen = {s:?} in the config file: {e}; write e.g. \"0.0.0.0:9464\"")))?
            }
            None => ([0, 0, 0, 0], 9464).into(),
        },
    };
    let mode = if args.enforce { Mode::Enforce } else { Mode::Observe };
    let metrics = Arc::new(Metrics::new());
    let coder = coder_client(&settings, &metrics, RetryPolicy::for_api_calls())?;
    let source = gpu_source(&settings)?;
    let listener = TcpListener::bind(listen).await.map_err(|e| {
        AppError::Config(format!("--listen {listen}: cannot bind ({e}); choose a free address, e.g. --listen 127.0.0.1:9464"))
    })?;
    let bound = listener.local_addr().map_err(|e| AppError::Runtime(e.to_string()))?;
    tracing::info!(event = "starting", mode = mode.as_str(), listen = %bound, settings = %settings.summary(), "coder-gpu-reclaimer starting");
    if mode == Mode::Observe {
        tracing::info!(
            event = "observe_mode",
            "observe mode: decisions are logged and reported, nothing is stopped (pass --enforce to act)"
        );
    }
    let identity = confirm_owner(&coder, &settings.token).await?;
    if let Some(exp) = identity.token_expires_at {
        metrics.token_expiry.set(exp.timestamp() as f64);
    }
    let state = Arc::new(State::new(metrics.clone(), mode, settings.interval));
    let (tx, rx) = watch::channel(false);
    spawn_signal_handler(tx);
    let server = tokio::spawn(crate::serve::serve(listener, state.clone(), rx.clone()));
    let actuator =
        Actuator::new(mode, coder.clone(), metrics, Outputs { audit, notifier }, settings.interval, settings.policy.max_stops_per_pass);
    let reclaimer = Reclaimer::new(coder, source, settings.policy.clone(), actuator, state);
    reclaimer.run(rx).await;
    match tokio::time::timeout(Duration::from_secs(5), server).await {
        Ok(Ok(Err(e))) => Err(AppError::Runtime(format!("the HTTP server failed: {e}"))),
        _ => Ok(()),
    }
}

pub async fn plan(args: PlanArgs) -> Result<String, AppError> {
    let settings = resolve(&args.common)?;
    let metrics = Arc::new(Metrics::new());
    let coder = coder_client(&settings, &metrics, RetryPolicy::for_api_calls())?;
    let source = gpu_source(&settings)?;
    confirm_owner(&coder, &settings.token).await?;
    let sampling = matches!(source, Sources::Exporters(_));
    let sample_for = args.sample_for.unwrap_or(Duration::from_secs(15));
    let state = Arc::new(State::new(metrics.clone(), Mode::Observe, settings.interval));
    let actuator =
        Actuator::new(Mode::Observe, coder.clone(), metrics, Outputs::default(), settings.interval, settings.policy.max_stops_per_pass);
    let mut reclaimer = Reclaimer::new(coder, source, settings.policy.clone(), actuator, state.clone());
    // One sample every 5 s: the default 15 s gives the 3 samples min_samples asks for.
    let step = Duration::from_secs(5);
    if sampling && !sample_for.is_zero() {
        eprintln!("sampling the exporters for {} before deciding...", humantime::format_duration(sample_for));
        let mut waited = Duration::ZERO;
        while waited < sample_for {
            reclaimer.sample().await;
            let nap = step.min(sample_for - waited);
            tokio::time::sleep(nap).await;
            waited += nap;
        }
    }
    let (_tx, rx) = watch::channel(false);
    reclaimer.pass(false, &rx).await.map_err(|e| AppError::Runtime(e.to_string()))?;
    let mut doc = state.status().as_ref().clone();
    doc.mode = "plan";
    let idle_after = settings.policy.thresholds.idle_after;
    if sampling && sample_for < idle_after {
        doc.notes.push(format!(
            "history is short: {} of samples against idle_after {}, so idle GPUs show as warming-up or unknown here; `run` builds the history, or use --prometheus-url",
            humantime::format_duration(sample_for),
            humantime::format_duration(idle_after)
        ));
    }
    Ok(match args.output {
        OutputFormat::Json => serde_json::to_string_pretty(&doc).map_err(|e| AppError::Runtime(e.to_string()))? + "\n",
        OutputFormat::Table => doc.table(),
    })
}

/// Prints one line per check; `Ok(true)` when every check passed.
pub async fn check(args: CheckArgs) -> Result<bool, AppError> {
    let mut all_ok = true;
    let mut line = |ok: bool, what: &str, detail: &str| {
        all_ok &= ok;
        println!("{} {what}: {detail}", if ok { "ok  " } else { "FAIL" });
    };
    let settings = match resolve(&args.common) {
        Ok(s) => s,
        Err(AppError::Config(m)) | Err(AppError::Runtime(m)) => {
            line(false, "settings", &m);
            return Ok(false);
        }
    };
    line(true, "settings", &settings.summary());
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
    let quick = RetryPolicy { max_elapsed: Duration::from_secs(3), ..RetryPolicy::for_api_calls() };
    let coder = coder_client(&settings, &metrics, quick)?;
    let identity = match confirm_owner(&coder, &settings.token).await {
        Ok(id) => {
            line(true, "coder", &format!("{} reachable, version {}", settings.coder_url, id.coder_version));
            line(true, "token", &format!("belongs to {:?}, an owner", id.username));
            Some(id)
        }
        Err(StartupError::Config(m)) | Err(StartupError::Runtime(m)) => {
            line(false, "coder", &m);
            None
        }
    };
    if let Some(id) = &identity {
        match id.token_expires_at {
            Some(exp) if exp - chrono::Utc::now() < crate::startup::EXPIRY_WARNING => {
                line(false, "token expiry", &format!("expires {exp}: create a new owner token and update the Secret"))
            }
            Some(exp) => line(true, "token expiry", &format!("expires {exp}")),
            None => {
                line(false, "token expiry", "unknown: the token's key could not be read; make sure it is a `coder tokens create` token")
            }
        }
    }
    let source = gpu_source(&settings)?;
    // One line per URL actually read (a dns+ target stands for every address it resolved to).
    let collection = source.collect(chrono::Utc::now()).await;
    let mut series: std::collections::BTreeMap<&str, std::collections::HashSet<&crate::gpu::GpuKey>> = Default::default();
    for r in &collection.readings {
        series.entry(r.source.as_ref()).or_default().insert(&r.key);
    }
    for f in &collection.failures {
        line(false, "gpu source", &format!("{}: {} (fix the URL or the exporter)", f.source, f.error));
    }
    for (url, gpus) in &series {
        line(true, "gpu source", &format!("{url}: {} GPU series", gpus.len()));
    }
    if series.is_empty() && collection.failures.is_empty() {
        line(false, "gpu source", "no GPU series at all: check the exporter URLs and that dcgm-exporter runs with --kubernetes");
    }
    if identity.is_some() {
        match coder.running_workspaces().await {
            Ok(ws) => {
                let mapped: std::collections::HashSet<&str> =
                    collection.readings.iter().filter_map(|r| r.workspace_id.as_deref()).collect();
                let covered = ws.iter().filter(|w| mapped.contains(w.id.as_str())).count();
                line(true, "coverage", &format!("{covered} of {} running workspaces have GPU series mapped to them", ws.len()));
            }
            Err(e) => line(false, "coverage", &format!("cannot list workspaces: {e}")),
        }
    }
    Ok(all_ok)
}
