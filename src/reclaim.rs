//! One pass (gather, merge, decide, act, report) and the loop around it. The pass reads the
//! clock once and hands `now` to the decisions. `State` is shared with the HTTP server.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::actuator::{ActReport, Actuator};
use crate::audit::AuditEvent;
use crate::coder::types::Workspace;
use crate::coder::{CoderClient, CoderError};
use crate::decide::{Decision, FleetOutcome, Verdict, apply_fleet_rules, decide};
use crate::gpu::GpuSource;
use crate::gpu::window::Windows;
use crate::metrics::{Metrics, Mode, PassLabels, SourceLabels};
use crate::policy::Policy;
use crate::status::{StatusDocument, WorkspaceStatus};

/// What the loop and the HTTP server share.
pub struct State {
    pub metrics: Arc<Metrics>,
    status: RwLock<Arc<StatusDocument>>,
    last_good_pass: Mutex<Option<Instant>>,
    pub interval: Duration,
}

impl State {
    pub fn new(metrics: Arc<Metrics>, mode: Mode, interval: Duration) -> Self {
        State { metrics, status: RwLock::new(Arc::new(StatusDocument::empty(mode.as_str()))), last_good_pass: Mutex::new(None), interval }
    }

    pub fn status(&self) -> Arc<StatusDocument> {
        match self.status.read() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn publish(&self, doc: StatusDocument) {
        match self.status.write() {
            Ok(mut s) => *s = Arc::new(doc),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(doc),
        }
    }

    fn mark_good_pass(&self) {
        if let Ok(mut t) = self.last_good_pass.lock() {
            *t = Some(Instant::now());
        }
    }

    /// Ready when the latest good pass finished within three intervals.
    pub fn ready(&self) -> Result<(), String> {
        let last = self.last_good_pass.lock().ok().and_then(|t| *t);
        match last {
            None => Err("no successful pass yet".into()),
            Some(t) if t.elapsed() > self.interval * 3 => Err(format!("the last successful pass was {}s ago", t.elapsed().as_secs())),
            Some(_) => Ok(()),
        }
    }
}

/// Everything one pass produced.
#[derive(Debug)]
pub struct PassReport {
    pub workspaces: Vec<Workspace>,
    pub decisions: Vec<Decision>,
    pub fleet: FleetOutcome,
    /// GPU source requests made this pass.
    pub gpu_requests: usize,
    pub acted: ActReport,
}

pub struct Reclaimer<S: GpuSource> {
    coder: CoderClient,
    source: S,
    policy: Policy,
    windows: Windows,
    /// Warnings in progress (grace): workspace id -> stop time.
    warnings: HashMap<String, DateTime<Utc>>,
    /// The latest build id seen per workspace: a new build is a new session.
    sessions: HashMap<String, String>,
    actuator: Actuator,
    state: Arc<State>,
}

impl<S: GpuSource> Reclaimer<S> {
    pub fn new(coder: CoderClient, source: S, policy: Policy, actuator: Actuator, state: Arc<State>) -> Self {
        let retain = chrono::Duration::from_std(policy.longest_lookback()).unwrap_or(chrono::Duration::MAX);
        Reclaimer {
            windows: Windows::new(retain, state.interval),
            coder,
            source,
            policy,
            warnings: HashMap::new(),
            sessions: HashMap::new(),
            actuator,
            state,
        }
    }

    /// Reads GPU sources only, adding samples to the windows (plan's sampling before a pass).
    pub async fn sample(&mut self) {
        let collection = self.source.collect(Utc::now()).await;
        for r in &collection.readings {
            self.windows.record(r);
        }
    }

    /// One full pass. `act = false` decides and reports but never calls the actuator (plan).
    pub async fn pass(&mut self, act: bool, shutdown: &watch::Receiver<bool>) -> Result<PassReport, CoderError> {
        let started = Instant::now();
        let now = Utc::now();
        let (listing, collection) = tokio::join!(self.coder.running_workspaces(), self.source.collect(now));
        let metrics = self.state.metrics.clone();
        for f in &collection.failures {
            tracing::warn!(event = "scrape_failed", source = %f.source, error = %f.error, "GPU source failed; its workspaces are unknown this pass");
            metrics.scrape_errors.get_or_create(&SourceLabels { source: f.source.clone() }).inc();
        }
        let workspaces = match listing {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(event = "pass_failed", error = %e, "cannot list workspaces; nothing is stopped this pass");
                metrics.passes.get_or_create(&PassLabels { result: "failed" }).inc();
                return Err(e);
            }
        };
        let live: HashSet<&str> = workspaces.iter().map(|w| w.id.as_str()).collect();
        for ws in &workspaces {
            let build = &ws.latest_build.id;
            if self.sessions.get(&ws.id).is_some_and(|seen| seen != build) {
                // Restarted since the last pass: its old samples describe another session.
                self.windows.forget(&ws.id);
                self.warnings.remove(&ws.id);
            }
            self.sessions.insert(ws.id.clone(), build.clone());
        }
        self.sessions.retain(|id, _| live.contains(id.as_str()));
        for r in &collection.readings {
            if r.workspace_id.as_deref().is_some_and(|id| live.contains(id)) {
                self.windows.record(r);
            }
        }
        let failed: HashSet<&str> = collection.failures.iter().map(|f| f.source.as_str()).collect();
        self.windows.mark_failed_sources(&failed);
        self.windows.prune(now, &live);

        let mut decisions: Vec<Decision> = workspaces
            .iter()
            .map(|ws| decide(now, ws, self.windows.get(&ws.id), &self.policy, self.warnings.get(&ws.id).copied()))
            .collect();
        let fleet = apply_fleet_rules(&mut decisions, &self.policy);
        let mut acted = ActReport::default();
        if act {
            for (ws, d) in workspaces.iter().zip(&decisions) {
                if d.verdict == Verdict::Warn && !self.warnings.contains_key(&d.workspace_id) {
                    self.actuator.warned(AuditEvent::new("warn", now, self.actuator.mode(), ws, d));
                }
            }
            self.warnings =
                decisions.iter().filter(|d| d.is_stop_eligible()).filter_map(|d| d.stop_at.map(|t| (d.workspace_id.clone(), t))).collect();
            if let Some(why) = &fleet.breaker {
                tracing::warn!(
                    event = "breaker_tripped",
                    reclaimable = decisions.iter().filter(|d| d.verdict == Verdict::Reclaim).count(),
                    gpu_workspaces = fleet.gpu_workspaces,
                    "{why}"
                );
                metrics.breaker_trips.inc();
            }
            self.actuator.forget_running(&workspaces);
            acted = self.actuator.act(now, &workspaces, &decisions, &fleet, shutdown).await;
            self.actuator.follow(now).await;
        }

        metrics.set_verdicts(decisions.iter().map(|d| (d.verdict, d.reason)));
        metrics.waiting.set(fleet.waiting as i64);
        metrics.passes.get_or_create(&PassLabels { result: "ok" }).inc();
        metrics.pass_duration.observe(started.elapsed().as_secs_f64());
        metrics.last_pass.set(Utc::now().timestamp_millis() as f64 / 1000.0);
        let doc = StatusDocument {
            generated_at: now,
            mode: self.actuator.mode().as_str(),
            breaker: fleet.breaker.clone(),
            notes: Vec::new(),
            workspaces: workspaces
                .iter()
                .zip(&decisions)
                .map(|(ws, d)| WorkspaceStatus::new(ws, d, self.windows.get(&ws.id), &self.policy))
                .collect(),
        };
        self.state.publish(doc);
        self.state.mark_good_pass();
        let count = |v: Verdict| decisions.iter().filter(|d| d.verdict == v).count();
        tracing::info!(
            event = "pass",
            workspaces = workspaces.len(),
            reclaim = count(Verdict::Reclaim),
            warn = count(Verdict::Warn),
            waiting = count(Verdict::Waiting),
            unknown = count(Verdict::Unknown),
            stops_sent = acted.stops_sent.len(),
            in_flight = self.actuator.tracked_count(),
            duration_ms = started.elapsed().as_millis() as u64,
            "pass done"
        );
        Ok(PassReport { workspaces, decisions, fleet, gpu_requests: collection.requests, acted })
    }

    /// Runs a pass every interval (the `State`'s) until shutdown. A pass in progress at shutdown
    /// may finish its in-flight requests (the actuator starts no new stop) for at most 10 s.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(self.state.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.changed() => break,
            }
            if *shutdown.borrow() {
                break;
            }
            let stop_rx = shutdown.clone();
            let pass = self.pass(true, &stop_rx);
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
        tracing::info!(event = "shutdown", "stopped");
    }
}
