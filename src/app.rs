//! The one way to build the service from `Settings` (in the spirit of zero-to-production's
//! `Application::build`), used by `run`, `plan`, `demo`, the in-process tests and the pass
//! benchmarks. A pass is three named steps: evaluate (a plain value), act (the actuator; `plan`
//! has none), publish (status document, metrics, accounting, log line).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::Instrument;

use crate::coder::actions::CoderActions;
use crate::coder::identity::connect;
use crate::coder::{ClientOptions, CoderClient, CoderError, TokenSource};
use crate::config::Settings;
use crate::error::Error;
use crate::gpu::{SourceContext, Sources};
use crate::http::SecretFile;
use crate::pass::accounting::Accounting;
use crate::pass::actuator::{Acted, Actuator, Outputs, StopLimits, acts, require_permissions};
use crate::pass::evaluate::Evaluator;
use crate::pass::journal::Journal;
use crate::pass::metrics::Metrics;
use crate::pass::mode::Mode;
use crate::pass::publish::{self, PassOutcome, State, TokenProblem};

/// What the service is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// One evaluation, published; no actuator exists.
    Plan,
    /// Passes with an actuator in the settings' mode.
    Run,
}

pub struct Application {
    pub state: Arc<State>,
    pub evaluator: Evaluator,
    /// `None` for `plan`: nothing can act.
    pub actuator: Option<Actuator>,
    pub coder: CoderClient,
    /// What the token must be allowed to do (`plan` observes).
    mode: Mode,
    /// When the token was last asked about (expiry, permissions).
    token_checked: Instant,
    /// Exporters are scraped this often between passes (`None`: Prometheus keeps the history,
    /// or the sample interval is not shorter than a pass's).
    sample_interval: Option<Duration>,
    accounting: Accounting,
    /// Passes begun (the `pass` field of every log line inside one).
    passes: u64,
    /// The history journal (`run --history-journal`), written after each evaluation.
    journal: Option<Journal>,
}

/// How often the token's expiry and permissions are asked about when it does not change.
const TOKEN_RECHECK: Duration = Duration::from_secs(24 * 3600);

/// The Coder client the settings describe, counting its requests in `metrics`.
pub fn coder_client(settings: &Settings, metrics: &Arc<Metrics>) -> Result<CoderClient, Error> {
    let options = ClientOptions {
        outbound: settings.outbound.clone(),
        max_listing_bytes: settings.max_listing,
        ..ClientOptions::new(settings.request_timeout, settings.api_retry)
    };
    let token = match &settings.token_file {
        Some(path) => TokenSource::file(settings.token.clone(), path.clone()),
        None => TokenSource::fixed(settings.token.clone()),
    };
    Ok(CoderClient::with_options(&settings.coder_url, token, options)?.with_observer(metrics.observer()))
}

/// The GPU source the settings describe.
pub fn gpu_source(settings: &Settings) -> Result<Sources, Error> {
    settings.gpu.build(&SourceContext {
        ownership: &settings.ownership,
        timeout: settings.request_timeout,
        outbound: &settings.outbound,
        lookback: settings.policy.longest_lookback(),
        step: settings.interval,
        power: !settings.policy.active_power_watts.is_empty(),
        max_gpus_per_workspace: settings.policy.max_gpus_per_workspace,
    })
}

impl Application {
    /// Builds the clients, checks the token against Coder (may it do what the mode needs? when
    /// does it expire?), opens the audit log and builds the actuator (`Role::Run` only).
    pub async fn build(settings: &Settings, role: Role) -> Result<Self, Error> {
        let metrics = Arc::new(Metrics::new());
        let coder = coder_client(settings, &metrics)?;
        let source = gpu_source(settings)?;
        let journal = match (role, &settings.history_journal) {
            (Role::Run, Some(path)) => Some(Journal::open(path, settings.history_journal_max)?),
            _ => None,
        };
        let outputs = match role {
            Role::Run => Some(Outputs::open(settings.audit_log.as_deref(), settings.notify_webhook.clone(), &settings.outbound)?),
            Role::Plan => None,
        };
        let mode = match role {
            Role::Run => settings.mode,
            Role::Plan => Mode::Observe,
        };
        let identity = connect(&coder).await?;
        require_permissions(mode, &identity)?;
        if let Some(exp) = identity.token_expires_at {
            metrics.token_expiry.set(exp.timestamp() as f64);
        }
        let state = Arc::new(State::new(metrics.clone(), mode, settings.interval));
        let limits = StopLimits {
            interval: settings.interval,
            stop_timeout: settings.policy.stop_timeout,
            start_allowance: settings.policy.start_allowance,
        };
        let actuator = outputs.map(|outputs| {
            // The capability to write exists in enforce mode only, and makes one attempt per
            // call: the ledger backs off across passes, a pass never waits on one workspace.
            let writer = acts(mode).then(|| CoderActions::new(coder.without_retries()));
            let mut actuator = Actuator::new(mode, writer, metrics, outputs, limits, Some(identity.user_id.clone()));
            actuator.recover(chrono::Utc::now());
            actuator
        });
        let sampling = source.samples_between_passes();
        if let Some(why) = gpu_templates_unset(&source, &settings.policy) {
            tracing::warn!(event = "gpu_templates_unset", "{why}");
        }
        let evaluator = Evaluator::new(coder.clone(), source, settings.policy.clone(), settings.interval);
        let sample_interval = (sampling && settings.sample_interval < settings.interval).then_some(settings.sample_interval);
        Ok(Application {
            state,
            evaluator,
            actuator,
            coder,
            mode,
            token_checked: Instant::now(),
            sample_interval,
            accounting: if settings.policy.prices_gpu_time() {
                Accounting::priced(&settings.policy.currency)
            } else {
                Accounting::default()
            },
            passes: 0,
            journal,
        })
    }

    /// Re-reads the token file each pass; a new token (or a day since the last look) is asked
    /// about again: expiry, permissions. A token that may not do what the mode needs fails
    /// /readyz until a good one arrives.
    async fn refresh_token(&mut self) {
        let changed = self.coder.reload_token();
        if !changed && self.token_checked.elapsed() < TOKEN_RECHECK {
            return;
        }
        self.token_checked = Instant::now();
        match connect(&self.coder).await {
            Ok(identity) => {
                if let Some(exp) = identity.token_expires_at {
                    self.state.metrics.token_expiry.set(exp.timestamp() as f64);
                }
                match require_permissions(self.mode, &identity) {
                    Ok(()) => {
                        if matches!(self.state.token_problem(), Some(TokenProblem::Permission(_))) {
                            self.state.set_token_problem(None);
                        }
                    }
                    Err(e) => self.state.set_token_problem(Some(TokenProblem::Permission(e.message().to_string()))),
                }
                if let Some(a) = &mut self.actuator {
                    a.set_self_id(identity.user_id.clone());
                }
                self.evaluator.forget_permissions();
            }
            Err(e) => tracing::warn!(event = "token_check_failed", error = %e, "cannot ask Coder about the token; trying again next pass"),
        }
    }

    /// One pass: evaluate, act (when there is an actuator), publish. Fails only when the listing
    /// fails; then nothing was decided and nothing is stopped.
    pub async fn pass(&mut self, shutdown: &watch::Receiver<bool>) -> Result<PassOutcome, CoderError> {
        self.passes += 1;
        // At the highest level, like the workspace span: on whatever level the log is written at.
        let span = tracing::error_span!("pass", pass = self.passes);
        self.pass_in_span(shutdown).instrument(span).await
    }

    async fn pass_in_span(&mut self, shutdown: &watch::Receiver<bool>) -> Result<PassOutcome, CoderError> {
        self.refresh_token().await;
        if let Some(a) = &self.actuator {
            self.evaluator.set_serving(a.serving());
        }
        let eval = match self.evaluator.evaluate().await {
            Ok(e) => e,
            Err((error, failures)) => {
                publish::failed_pass(&self.state, &error, &failures);
                return Err(error);
            }
        };
        if let Some(journal) = &mut self.journal {
            journal.record(eval.now, eval.workspaces());
        }
        let pass = match &mut self.actuator {
            Some(actuator) => PassOutcome {
                acted: actuator.act(&eval, shutdown).await,
                tracked_stops: actuator.tracked_count(),
                stuck_stops: actuator.stuck_stops(),
                without_provisioner: actuator.without_provisioner(),
                eval,
            },
            None => {
                PassOutcome { eval, acted: Acted::default(), tracked_stops: 0, stuck_stops: Vec::new(), without_provisioner: Vec::new() }
            }
        };
        publish::publish(&self.state, &pass, &self.evaluator, &mut self.accounting);
        Ok(pass)
    }

    /// Runs a pass every interval until shutdown. A pass in progress at shutdown may finish its
    /// in-flight requests (the actuator starts no new stop) for at most 10 s.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(self.state.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Between passes, the exporters are read every sample interval; those readings join
        // the next pass's (the first sample comes one sample interval after a pass).
        let sample_every = self.sample_interval.unwrap_or(Duration::from_secs(365 * 24 * 3600));
        let mut sampler = tokio::time::interval_at(tokio::time::Instant::now() + sample_every, sample_every);
        sampler.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            let pass_due = tokio::select! {
                _ = ticker.tick() => true,
                _ = sampler.tick() => false,
                _ = shutdown.changed() => break,
            };
            if *shutdown.borrow() {
                break;
            }
            if !pass_due {
                self.evaluator.sample().await;
                continue;
            }
            sampler.reset();
            let stop_rx = shutdown.clone();
            let pass = self.pass(&stop_rx);
            tokio::pin!(pass);
            let mut cut_short = false;
            tokio::select! {
                _ = &mut pass => {}
                _ = shutdown.changed() => {
                    cut_short = tokio::time::timeout(Duration::from_secs(10), &mut pass).await.is_err();
                }
            }
            if cut_short {
                tracing::warn!(event = "shutdown_pass_abandoned", "the pass did not finish within 10 s of shutdown");
            }
            if *shutdown.borrow() {
                break;
            }
        }
        if let Some(a) = &self.actuator {
            a.finish().await;
        }
        tracing::info!(event = "shutdown", "stopped");
    }

    /// Serves the HTTP API on `listener` (and the probes on `health`) and runs passes until
    /// shutdown.
    pub async fn serve_and_run(
        self,
        listener: TcpListener,
        health: Option<TcpListener>,
        status_token: Option<Arc<SecretFile>>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), Error> {
        let server = tokio::spawn(crate::serve::serve(listener, self.state.clone(), status_token, shutdown.clone()));
        if let Some(health) = health {
            let router = crate::serve::health_router(self.state.clone());
            tokio::spawn(crate::serve::serve_router(health, router, crate::serve::HEALTH_LIMITS, shutdown.clone()));
        }
        self.run(shutdown).await;
        match tokio::time::timeout(Duration::from_secs(5), server).await {
            Ok(Ok(Err(e))) => Err(Error::runtime(format!("the HTTP server failed: {e}"))),
            _ => Ok(()),
        }
    }
}

/// Behind Prometheus with `gpu_templates` unset, the words of a warning: a store others can
/// write to can teach the service that any template is a GPU template (`run` logs it at start,
/// `check` prints it).
pub fn gpu_templates_unset(source: &crate::gpu::Sources, policy: &crate::pass::policy::Policy) -> Option<&'static str> {
    (source.prometheus().is_some() && policy.gpu_templates.is_empty()).then_some(
        "gpu_templates is unset behind Prometheus: templates are learned from GPU series (two workspaces over two passes), and where others can write to the store a forged series can make a CPU template look like a GPU template; set gpu_templates to your GPU templates' names (globs), e.g. gpu_templates = [\"gpu-*\"]",
    )
}
