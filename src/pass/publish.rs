//! Publish: the last step of a pass. Shows what the pass produced (`PassOutcome`) in `State` (the
//! status document the HTTP server serves, readiness and liveness), the metrics, the accounting
//! of what was given back, and one `pass` log line; a pass whose listing failed, in the metrics,
//! liveness and a `pass_failed` line. `State` is shared by the loop and the HTTP server, as in
//! kube-rs' controller-rs.

use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use chrono::Utc;

use crate::coder::{CoderError, ErrorKind};
use crate::gpu::SourceFailure;
use crate::pass::accounting::Accounting;
use crate::pass::actuator::{Acted, NoProvisioner, StuckStop};
use crate::pass::decide::Verdict;
use crate::pass::evaluate::{Evaluation, Evaluator};
use crate::pass::metrics::{Metrics, PassLabels, PassResult, PoolLabels, SourceLabels};
use crate::pass::mode::Mode;
use crate::pass::status::{KeptRunning, PoolStatus, StatusDocument, WorkspaceStatus};
use reclaimer_core::ledger::Listed;

/// What is wrong with the token.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenProblem {
    /// Coder answered 401: expired or revoked. A listing that succeeds clears it.
    Rejected(String),
    /// It may not do what the mode needs. A re-check of a new token clears it.
    Permission(String),
}

impl TokenProblem {
    pub fn message(&self) -> &str {
        match self {
            TokenProblem::Rejected(m) | TokenProblem::Permission(m) => m,
        }
    }
}

/// One pass's status document, as every reader gets it: the JSON and the page are made once, on
/// the first request after the pass, and shared by every reader (a slow reader holds a reference
/// to them, never a copy of its own).
pub struct Published {
    pub doc: StatusDocument,
    json: OnceLock<bytes::Bytes>,
    page: OnceLock<bytes::Bytes>,
}

impl Published {
    fn new(doc: StatusDocument) -> Self {
        Published { doc, json: OnceLock::new(), page: OnceLock::new() }
    }

    /// The document as JSON (`/api/v1/workspaces`).
    pub fn json(&self) -> bytes::Bytes {
        self.json
            .get_or_init(|| match serde_json::to_vec(&self.doc) {
                Ok(v) => v.into(),
                Err(e) => format!("{{\"message\":\"cannot encode the status document: {e}\"}}").into(),
            })
            .clone()
    }

    /// The status page, as of the pass (its countdowns are from the pass's time).
    pub fn page(&self) -> bytes::Bytes {
        self.page.get_or_init(|| crate::pass::page::render(&self.doc, self.doc.generated_at).into()).clone()
    }
}

impl std::ops::Deref for Published {
    type Target = StatusDocument;
    fn deref(&self) -> &StatusDocument {
        &self.doc
    }
}

/// What the loop and the HTTP server share.
pub struct State {
    pub metrics: Arc<Metrics>,
    /// The mode the documents are phrased in (`plan` shows observe's words).
    mode: Mode,
    status: RwLock<Arc<Published>>,
    last_good_pass: Mutex<Option<Instant>>,
    /// The end of the latest pass, good or failed (or the start): the loop is alive.
    last_pass_end: Mutex<Instant>,
    /// Why the token is not good enough, while it is not: /readyz fails with it.
    token_problem: Mutex<Option<TokenProblem>>,
    /// The audit log's latest append failed (`Acted::audit_failing`).
    pub audit_failing: std::sync::atomic::AtomicBool,
    pub interval: Duration,
}

impl State {
    pub fn new(metrics: Arc<Metrics>, mode: Mode, interval: Duration) -> Self {
        State {
            metrics,
            mode,
            status: RwLock::new(Arc::new(Published::new(StatusDocument::empty(mode.as_str())))),
            last_good_pass: Mutex::new(None),
            last_pass_end: Mutex::new(Instant::now()),
            token_problem: Mutex::new(None),
            audit_failing: std::sync::atomic::AtomicBool::new(false),
            interval,
        }
    }

    pub fn status(&self) -> Arc<Published> {
        match self.status.read() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_status(&self, doc: StatusDocument) {
        match self.status.write() {
            Ok(mut s) => *s = Arc::new(Published::new(doc)),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(Published::new(doc)),
        }
    }

    fn mark_good_pass(&self) {
        if let Ok(mut t) = self.last_good_pass.lock() {
            *t = Some(Instant::now());
        }
        self.mark_pass_end();
    }

    fn mark_pass_end(&self) {
        if let Ok(mut t) = self.last_pass_end.lock() {
            *t = Instant::now();
        }
    }

    /// Alive while passes keep ending (good or failed): none for three intervals (plus 30 s for
    /// a slow pass) means the loop hung.
    pub fn alive(&self) -> Result<(), String> {
        let last = self.last_pass_end.lock().map(|t| *t).unwrap_or_else(|p| *p.into_inner());
        let limit = self.interval * 3 + Duration::from_secs(30);
        let since = last.elapsed();
        if since > limit {
            Err(format!("no pass has ended for {}s (limit {}s): the loop is stuck", since.as_secs(), limit.as_secs()))
        } else {
            Ok(())
        }
    }

    /// Records (or clears) a token problem; logs `token_rejected` when one begins or changes,
    /// `token_accepted` when it ends.
    pub fn set_token_problem(&self, problem: Option<TokenProblem>) {
        let mut current = self.token_problem.lock().unwrap_or_else(|p| p.into_inner());
        if *current == problem {
            return;
        }
        match &problem {
            Some(p) => tracing::error!(event = "token_rejected", "{}", p.message()),
            None => tracing::info!(event = "token_accepted", "the token works again"),
        }
        *current = problem;
    }

    pub fn token_problem(&self) -> Option<TokenProblem> {
        self.token_problem.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Ready when the token is good and the latest good pass finished within three intervals.
    pub fn ready(&self) -> Result<(), String> {
        if let Some(p) = self.token_problem() {
            return Err(p.message().to_string());
        }
        if self.audit_failing.load(std::sync::atomic::Ordering::Relaxed) {
            return Err("the audit log cannot be written (a full or read-only volume?): no stop is sent until it can".into());
        }
        let last = self.last_good_pass.lock().ok().and_then(|t| *t);
        match last {
            None => Err("no successful pass yet".into()),
            Some(t) if t.elapsed() > self.interval * 3 => Err(format!("the last successful pass was {}s ago", t.elapsed().as_secs())),
            Some(_) => Ok(()),
        }
    }
}

fn scrape_failures(metrics: &Metrics, failures: &[SourceFailure]) {
    for f in failures {
        tracing::warn!(event = "scrape_failed", source = %f.source, error = %f.error, "GPU source failed; its workspaces are unknown this pass");
        metrics.scrape_errors.get_or_create(&SourceLabels { source: f.host.as_str().into() }).inc();
    }
}

/// A pass whose listing failed: nothing was decided, nothing was stopped.
pub fn failed_pass(state: &State, error: &CoderError, failures: &[SourceFailure]) {
    scrape_failures(&state.metrics, failures);
    if error.kind == ErrorKind::Unauthorized {
        let why = if error.user_inactive() {
            format!("Coder rejects the token ({}): {}", error.message, error.token_advice())
        } else {
            format!(
                "Coder rejects the token ({}): it expired or was revoked; put a new one in the token file (it is picked up without a restart) or CODER_SESSION_TOKEN (restart)",
                error.message
            )
        };
        state.set_token_problem(Some(TokenProblem::Rejected(why)));
    }
    tracing::error!(event = "pass_failed", error = %error, "cannot list workspaces; nothing is stopped this pass");
    state.metrics.passes.get_or_create(&PassLabels { result: PassResult::Failed }).inc();
    state.mark_pass_end();
}

/// What one pass produced: what evaluate found and what act did (nothing for `plan`), with the
/// stops the actuator tracks after it. `publish` shows it; `Application::pass` returns it.
#[derive(Debug)]
pub struct PassOutcome {
    pub eval: Evaluation,
    pub acted: Acted,
    /// Stops tracked after the pass: in flight, backing off or abandoned.
    pub tracked_stops: usize,
    /// Stop builds reported stuck and still pending.
    pub stuck_stops: Vec<StuckStop>,
    /// Stops that wait for a provisioner matching their tags.
    pub without_provisioner: Vec<NoProvisioner>,
}

/// Publishes one pass: `judged_by` is the evaluator whose windows and policy it was judged with
/// (each workspace's GPUs are shown from them); `accounting` adds the pass's figures.
pub fn publish(state: &State, pass: &PassOutcome, judged_by: &Evaluator, accounting: &mut Accounting) {
    let PassOutcome { eval, acted, tracked_stops, stuck_stops, without_provisioner } = pass;
    let (windows, policy, mode) = (judged_by.windows(), judged_by.policy(), state.mode);
    let metrics = &state.metrics;
    scrape_failures(metrics, &eval.source_failures);
    if eval.duplicates > 0 {
        tracing::warn!(
            event = "listing_duplicates",
            count = eval.duplicates,
            "the workspace listing repeated entries; each workspace is judged once"
        );
    }
    let count = |v: Verdict| eval.decisions().filter(|d| d.verdict == v).count();
    if let Some(why) = &eval.fleet.breaker {
        tracing::warn!(
            event = "breaker_tripped",
            reclaimable = count(Verdict::Reclaim),
            gpu_workspaces = eval.fleet.gpu_workspaces,
            "{why}"
        );
        metrics.breaker_trips.inc();
    }
    state.audit_failing.store(acted.audit_failing, std::sync::atomic::Ordering::Relaxed);
    metrics.set_verdicts(eval.decisions().map(|d| (d.verdict, d.reason)));
    let inc = accounting.pass(eval.now, &eval.listed(), &acted.stops_done);
    accounting.averted(eval.now, acted.autostops_averted.len(), acted.countdowns_averted.len());
    metrics.account(&inc, &policy.currency);
    metrics.gpu_series_twins.set(eval.twin_count as i64);
    metrics.held_outside.set(eval.held_outside.len() as i64);
    metrics.without_series.set(eval.without_series as i64);
    if let Some(offset) = eval.coder_clock_offset {
        metrics.coder_clock_offset.set(offset.num_milliseconds() as f64 / 1000.0);
    }
    for (name, counts) in policy.pools.iter().zip(&eval.fleet.pools) {
        metrics.waiting.get_or_create(&PoolLabels { pool: name.as_str().into() }).set(counts.waiting as i64);
    }
    metrics.passes.get_or_create(&PassLabels { result: PassResult::Ok }).inc();
    metrics.pass_duration.observe(eval.started.elapsed().as_secs_f64());
    metrics.last_pass.set(Utc::now().timestamp_millis() as f64 / 1000.0);
    let counting_down: std::collections::HashMap<&str, &reclaimer_core::ledger::CountingDown> =
        acted.counting_down.iter().map(|c| (c.workspace_id.as_str(), c)).collect();
    let doc = StatusDocument {
        generated_at: eval.now,
        mode: mode.as_str(),
        breaker: eval.fleet.breaker.clone(),
        coder_clock_offset_seconds: eval.coder_clock_offset.map(|o| o.num_seconds()),
        accounting: accounting.summary(eval.now),
        stuck_stops: stuck_stops.clone(),
        no_provisioner: without_provisioner.clone(),
        held_outside: eval.held_outside.clone(),
        pools: policy
            .pools
            .iter()
            .zip(&eval.fleet.pools)
            .map(|(name, c)| PoolStatus { pool: name.clone(), waiting: c.waiting, idle: c.idle })
            .collect(),
        twins: eval.twins.clone(),
        problems: eval.problems.clone(),
        gpu_jobs: eval.gpu_jobs.clone(),
        notes: Vec::new(),
        workspaces: eval
            .judged()
            .map(|Listed { workspace: ws, decision: d, .. }| {
                let mut entry = WorkspaceStatus::new(ws, d, windows.get(&ws.id), policy);
                if let (Verdict::Warn, Some(stop_at)) = (d.verdict, d.stop_at) {
                    entry.message = format!("{}; {}", entry.message, mode.countdown(stop_at - eval.now));
                }
                if let Some(plan) = &d.deadline {
                    let kept = KeptRunning::new(plan, mode, acted.extended.contains(&ws.id));
                    entry.deadline = Some(kept.until);
                    entry.kept_running = Some(Box::new(kept));
                }
                if let Some(c) = counting_down.get(ws.id.as_str()) {
                    // Coder's countdown: a warning Coder gives, with its deadline as the stop.
                    entry.verdict = Verdict::Warn;
                    entry.message = format!("{}; {}", entry.message, mode.coder_countdown(c.until, c.set));
                    entry.stop_at = Some(c.until - eval.coder_offset);
                    if c.set {
                        entry.deadline = Some(c.until);
                    }
                }
                entry
            })
            .collect(),
    };
    state.set_status(doc);
    state.mark_good_pass();
    if matches!(state.token_problem(), Some(TokenProblem::Rejected(_))) {
        state.set_token_problem(None);
    }
    tracing::info!(
        event = "pass",
        workspaces = eval.len(),
        reclaim = count(Verdict::Reclaim),
        warn = count(Verdict::Warn),
        waiting = count(Verdict::Waiting),
        unknown = count(Verdict::Unknown),
        stops_sent = acted.stops_sent.len(),
        in_flight = tracked_stops,
        duration_ms = eval.started.elapsed().as_millis() as u64,
        "pass done"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alive_until_no_pass_has_ended_for_three_intervals() {
        let state = State::new(Arc::new(Metrics::new()), Mode::Observe, Duration::from_secs(60));
        assert!(state.alive().is_ok(), "alive at start");
        assert!(state.ready().is_err(), "not ready before the first pass");
        let long_ago = Instant::now().checked_sub(Duration::from_secs(3 * 60 + 31)).unwrap();
        *state.last_pass_end.lock().unwrap() = long_ago;
        let why = state.alive().unwrap_err();
        assert!(why.contains("the loop is stuck"), "{why}");
        state.mark_pass_end();
        assert!(state.alive().is_ok(), "a pass that ended, even a failed one, shows the loop runs");
    }

    #[test]
    fn a_pass_is_serialised_once_for_every_reader() {
        let state = State::new(Arc::new(Metrics::new()), Mode::Observe, Duration::from_secs(60));
        state.set_status(StatusDocument::empty("observe"));
        let (a, b) = (state.status(), state.status());
        assert_eq!(a.json().as_ptr(), b.json().as_ptr(), "one JSON for all readers");
        assert_eq!(a.page().as_ptr(), b.page().as_ptr(), "one page for all readers");
        let doc: serde_json::Value = serde_json::from_slice(&a.json()).unwrap();
        assert_eq!(doc["mode"], "observe");
        state.set_status(StatusDocument::empty("observe"));
        assert_ne!(state.status().json().as_ptr(), a.json().as_ptr(), "a new pass, a new document");
    }
}
