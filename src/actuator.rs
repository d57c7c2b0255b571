//! The actuator: the only code that sends stop builds (and TTL restores), and the one place
//! observe mode is checked. It never sends a second stop while one is in flight, follows each
//! stop build until its job is final, retries failed stops with backoff on later passes, and
//! starts no new stop once shutdown began.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use tokio::sync::watch;

use crate::audit::{AuditEvent, AuditLog, Notifier};
use crate::coder::types::{JobStatus, Workspace};
use crate::coder::{CoderClient, StopOutcome};
use crate::decide::{Decision, FleetOutcome, Verdict};
use crate::metrics::{Metrics, Mode, StopFailureLabels, StopLabels};
use crate::retry::RetryPolicy;

/// How many times a failed stop is retried before it is given up (and reported).
pub const MAX_STOP_ATTEMPTS: u32 = 5;

#[derive(Debug, Clone, PartialEq)]
enum StopState {
    /// Queued; following `build_id` until its job is final.
    InFlight { build_id: String },
    /// The build failed or the POST was refused; try again at `retry_at`.
    Failed { retry_at: DateTime<Utc> },
}

#[derive(Debug, Clone)]
struct TrackedStop {
    event: AuditEvent,
    attempts: u32,
    state: StopState,
}

/// Where stop events go besides the logs.
#[derive(Default, Clone)]
pub struct Outputs {
    pub audit: Option<Arc<AuditLog>>,
    pub notifier: Option<Notifier>,
}

/// What `act` did this pass (for tests, logs and the demo).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ActReport {
    pub stops_sent: Vec<String>,
    pub would_stop: Vec<String>,
    pub build_active: Vec<String>,
    pub failed: Vec<String>,
}

pub struct Actuator {
    mode: Mode,
    coder: CoderClient,
    metrics: Arc<Metrics>,
    audit: Option<Arc<AuditLog>>,
    notifier: Option<Notifier>,
    retry: RetryPolicy,
    max_stops_per_pass: usize,
    tracked: HashMap<String, TrackedStop>,
    /// Observe mode: workspaces already reported as would-stop in this idle episode.
    reported: HashSet<String>,
}

impl Actuator {
    pub fn new(
        mode: Mode,
        coder: CoderClient,
        metrics: Arc<Metrics>,
        outputs: Outputs,
        interval: std::time::Duration,
        max_stops_per_pass: usize,
    ) -> Self {
        // Failed stops wait one pass, then twice as long each time, at most 10 passes.
        let retry = RetryPolicy { initial: interval, max_interval: interval * 10, max_elapsed: interval * 60 };
        Actuator {
            mode,
            coder,
            metrics,
            audit: outputs.audit,
            notifier: outputs.notifier,
            retry,
            max_stops_per_pass,
            tracked: HashMap::new(),
            reported: HashSet::new(),
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Stops whose build is still being followed or retried.
    pub fn tracked_count(&self) -> usize {
        self.tracked.len()
    }

    /// A workspace that is running again (a succeeded start is its latest build) is no longer
    /// ours to follow: the user started it, or the stop never took. Decide afresh.
    pub fn forget_running(&mut self, running: &[Workspace]) {
        for ws in running {
            self.tracked.remove(&ws.id);
        }
    }

    fn record(&self, event: &AuditEvent) {
        if let Some(a) = &self.audit {
            a.append(event);
        }
    }

    /// Announces a warning (grace) once, when it begins.
    pub fn warned(&self, event: AuditEvent) {
        tracing::info!(event = "warn", workspace_id = %event.workspace_id, owner = %event.owner, reason = event.reason, stop_at = ?event.stop_at, "{}", event.message);
        if let Some(n) = &self.notifier {
            n.send(&event);
        }
    }

    /// Acts on a pass's decisions: the stops chosen by the fleet rules, TTL restores, and due
    /// retries of failed stops. `decisions[i]` is about `workspaces[i]`.
    pub async fn act(
        &mut self,
        now: DateTime<Utc>,
        workspaces: &[Workspace],
        decisions: &[Decision],
        fleet: &FleetOutcome,
        shutdown: &watch::Receiver<bool>,
    ) -> ActReport {
        let mut report = ActReport::default();
        let mut to_stop: Vec<AuditEvent> = Vec::new();
        if fleet.breaker.is_none() {
            for &i in &fleet.stop_order {
                let id = &decisions[i].workspace_id;
                // Never a second stop while one is in flight.
                if !self.tracked.contains_key(id) {
                    to_stop.push(AuditEvent::new("decision", now, self.mode, &workspaces[i], &decisions[i]));
                }
            }
            let due: Vec<AuditEvent> = self
                .tracked
                .values()
                .filter(|t| matches!(t.state, StopState::Failed { retry_at } if retry_at <= now))
                .map(|t| t.event.clone())
                .collect();
            to_stop.extend(due);
            to_stop.truncate(self.max_stops_per_pass);
        }

        // The one place the mode is checked.
        if self.mode == Mode::Observe {
            let current: HashSet<String> = to_stop.iter().map(|e| e.workspace_id.clone()).collect();
            self.reported.retain(|id| current.contains(id));
            for event in to_stop {
                if !self.reported.insert(event.workspace_id.clone()) {
                    continue;
                }
                let event = AuditEvent { event: "would_stop", mode: "observe", time: now, ..event };
                tracing::info!(event = "would_stop", workspace_id = %event.workspace_id, owner = %event.owner, reason = event.reason, "{}", event.message);
                self.metrics.stops.get_or_create(&StopLabels { reason: event.reason, mode: "observe" }).inc();
                self.record(&event);
                if let Some(n) = &self.notifier {
                    n.send(&event);
                }
                report.would_stop.push(event.workspace_id);
            }
            for (ws, d) in workspaces.iter().zip(decisions) {
                if let Some(ttl) = d.restore_ttl_ms {
                    tracing::info!(event = "would_restore_ttl", workspace_id = %ws.id, owner = %ws.owner_name, ttl_ms = ttl, "would set the autostop TTL back");
                }
            }
            return report;
        }

        for event in to_stop {
            if *shutdown.borrow() {
                tracing::info!(event = "stop_skipped_shutdown", workspace_id = %event.workspace_id, "shutting down: no new stop");
                break;
            }
            self.stop(now, event, &mut report).await;
        }
        for (ws, d) in workspaces.iter().zip(decisions) {
            let Some(ttl) = d.restore_ttl_ms else { continue };
            if *shutdown.borrow() || d.verdict == Verdict::Reclaim {
                continue;
            }
            let e = AuditEvent::new("restore_ttl", now, self.mode, ws, d);
            match self.coder.set_ttl(&e.workspace_id, Some(ttl)).await {
                Ok(()) => {
                    tracing::info!(event = "restore_ttl", workspace_id = %e.workspace_id, owner = %e.owner, ttl_ms = ttl, "set the autostop TTL back");
                    self.metrics.ttl_restores.inc();
                    self.record(&e);
                }
                Err(err) => {
                    tracing::warn!(event = "restore_ttl_failed", workspace_id = %e.workspace_id, error = %err, "could not set the autostop TTL back")
                }
            }
        }
        report
    }

    async fn stop(&mut self, now: DateTime<Utc>, event: AuditEvent, report: &mut ActReport) {
        let id = event.workspace_id.clone();
        let attempts = self.tracked.get(&id).map_or(0, |t| t.attempts) + 1;
        match self.coder.stop_workspace(&id).await {
            Ok(StopOutcome::Queued(build)) => {
                let event = AuditEvent { event: "stop_sent", mode: "enforce", time: now, build_id: Some(build.id.clone()), ..event };
                tracing::info!(event = "stop_sent", workspace_id = %id, owner = %event.owner, reason = event.reason, build_id = %build.id, attempt = attempts, "{}", event.message);
                self.metrics.stops.get_or_create(&StopLabels { reason: event.reason, mode: "enforce" }).inc();
                self.record(&event);
                if let Some(n) = &self.notifier {
                    n.send(&event);
                }
                self.tracked.insert(id.clone(), TrackedStop { event, attempts, state: StopState::InFlight { build_id: build.id } });
                report.stops_sent.push(id);
            }
            Ok(StopOutcome::BuildActive(msg)) => {
                tracing::info!(event = "stop_deferred", workspace_id = %id, detail = %msg, "a build is already active; deciding again next pass");
                self.tracked.remove(&id);
                report.build_active.push(id);
            }
            Err(e) => {
                tracing::warn!(event = "stop_failed", workspace_id = %id, owner = %event.owner, error = %e, attempt = attempts, "the stop build was refused");
                self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: "rejected" }).inc();
                self.fail(now, event, attempts);
                report.failed.push(id);
            }
        }
    }

    fn fail(&mut self, now: DateTime<Utc>, event: AuditEvent, attempts: u32) {
        let id = event.workspace_id.clone();
        if attempts >= MAX_STOP_ATTEMPTS {
            tracing::error!(event = "stop_abandoned", workspace_id = %id, owner = %event.owner, attempts, "giving up on stopping this workspace; look at its build log in Coder");
            self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: "abandoned" }).inc();
            self.tracked.remove(&id);
            return;
        }
        let delay = Duration::from_std(self.retry.delay_for_attempt(attempts)).unwrap_or(Duration::MAX);
        self.tracked.insert(id, TrackedStop { event, attempts, state: StopState::Failed { retry_at: now + delay } });
    }

    /// Follows every in-flight stop build: `stop_done` when its job succeeds, `stop_failed`
    /// (and a later retry) when it fails or is canceled.
    pub async fn follow(&mut self, now: DateTime<Utc>) -> Vec<(String, JobStatus)> {
        let in_flight: Vec<(String, String)> = self
            .tracked
            .iter()
            .filter_map(|(id, t)| match &t.state {
                StopState::InFlight { build_id } => Some((id.clone(), build_id.clone())),
                StopState::Failed { .. } => None,
            })
            .collect();
        let mut finished = Vec::new();
        for (id, build_id) in in_flight {
            let build = match self.coder.workspace_build(&build_id).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(event = "stop_follow_failed", workspace_id = %id, build_id = %build_id, error = %e, "cannot read the stop build; trying again next pass");
                    continue;
                }
            };
            let status = build.job.status;
            if !status.is_final() {
                continue;
            }
            let Some(tracked) = self.tracked.remove(&id) else { continue };
            if status == JobStatus::Succeeded {
                tracing::info!(event = "stop_done", workspace_id = %id, owner = %tracked.event.owner, build_id = %build_id, "the workspace is stopped; its GPU is free");
            } else {
                let error = build.job.error.unwrap_or_default();
                tracing::warn!(event = "stop_failed", workspace_id = %id, owner = %tracked.event.owner, build_id = %build_id, job_status = status.as_str(), error = %error, "the stop build did not succeed; retrying later");
                self.metrics.stop_failures.get_or_create(&StopFailureLabels { kind: "build_failed" }).inc();
                self.fail(now, tracked.event, tracked.attempts);
            }
            finished.push((id, status));
        }
        finished
    }
}
