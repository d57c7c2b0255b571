//! The ledger: what the service remembers between passes about its own actions on Coder (stops
//! in flight and their lifecycle, back-off, provisioner holds, deadline extensions, TTL restores,
//! what was said once, stops a previous run left open), and what it will do next, as values.
//!
//! A pass crosses it twice. `plan(&view)` turns the judged pass into a `Plan`: the Coder calls to
//! make (`Call`: follow a stop build, settle a stop of a previous run, list provisioners, a
//! guarded stop, a deadline move, a TTL restore) and the `Note`s to write now (log lines, audit
//! lines, webhook events, counters). The executor (the service crate's `pass::actuator`) makes
//! the calls, in order, one attempt each, and hands Coder's answers back to `observe(outcomes)`,
//! which moves the ledger and returns the notes they cause. Nothing here waits, retries or reads
//! a clock: back-off is a time in the ledger, compared with the `now` a pass brings, so a test
//! plays any lifecycle as a table of passes on a clock it sets.
//!
//! Rules kept here (reference coder NOTES §16 and §18):
//! - A stop once sent is never canceled: while a stop is pending coderd cuts the old agent off
//!   every 15 s and no client connects to it, so a withdrawn stop strands the GPU outside Coder's
//!   running workspaces. Instead, just before a stop is sent the workspace is read afresh, and the
//!   stop is sent only if neither its latest build nor its `last_used_at` moved since the listing.
//! - No call is retried inside a pass; a failed stop backs off across passes (one interval, then
//!   doubling, at most 30 minutes) and is abandoned after `MAX_STOP_ATTEMPTS` attempts.
//! - With `countdown_in_coder`, a reclaim is Coder's countdown (`countdowns`): the stop path
//!   sends nothing for a workspace Coder will stop, and a move of the deadline and a stop are
//!   never both planned for one workspace in one pass.
//! - An autostop averted is counted against the deadline Coder reported before the first
//!   extension (its activity bumps included), once per build.

#[cfg(test)]
mod countdown_tests;
mod countdowns;
mod deadlines;
mod intent;
mod recovery;
mod serving;
mod stops;
#[cfg(test)]
mod tests;
mod tracked;

use chrono::{DateTime, Utc};

pub use countdowns::MAX_COUNTDOWN_FAILURES;
pub use intent::{
    Acted, Call, Count, CountingDown, Fact, Failure, LedgerConfig, Level, Listed, MAX_STOP_ATTEMPTS, MAX_STOP_BACKOFF, Note, Outcome,
    PassView, Plan, STOPPED_MEMORY, StopAnswer, StopCall, StopFailure, Who, needs_at_least, stop_backoff,
};
pub use recovery::Recovered;
pub use tracked::{NoProvisioner, StuckStop};

use crate::pass::audit::AuditRecord;

/// What the service remembers between passes about its actions on Coder: its stops and its
/// deadline moves.
#[derive(Debug)]
pub struct Ledger {
    stops: stops::Stops,
    deadlines: deadlines::Deadlines,
    countdowns: countdowns::Countdowns,
}

impl Ledger {
    pub fn new(config: LedgerConfig, self_id: Option<String>) -> Self {
        Ledger {
            stops: stops::Stops::new(config, self_id),
            deadlines: deadlines::Deadlines::new(config),
            countdowns: countdowns::Countdowns::new(config),
        }
    }

    /// The token's user changed (a rotated token of another account): its stops are ours.
    pub fn set_self_id(&mut self, id: String) {
        self.stops.self_id = Some(id);
    }

    /// Whether it plans writes (enforce mode).
    pub fn enforces(&self) -> bool {
        self.stops.config.enforce
    }

    /// Stops being followed, retried later, canceled or abandoned.
    pub fn tracked_count(&self) -> usize {
        self.stops.tracked_count()
    }

    /// Stops already sent that still serve a waiter, per pool (an index into `Policy::pools`): the
    /// next pass's fleet rules count each against one waiter of its pool.
    pub fn serving(&self) -> Vec<usize> {
        self.stops.serving()
    }

    /// Stop builds reported stuck and still pending (for the status document).
    pub fn stuck_stops(&self) -> Vec<StuckStop> {
        self.stops.stuck_stops()
    }

    /// Stops that wait for a provisioner, by organization and tags (for the status document).
    pub fn without_provisioner(&self) -> Vec<NoProvisioner> {
        self.stops.without_provisioner()
    }

    /// Reads back the audit records of a previous run, oldest first (enforce mode only).
    pub fn recover(&mut self, now: DateTime<Utc>, records: impl IntoIterator<Item = AuditRecord>) -> Recovered {
        let (countdowns, stops): (Vec<AuditRecord>, Vec<AuditRecord>) =
            records.into_iter().partition(|r| r.kind().is_some_and(|k| k.as_str().starts_with("countdown_")));
        let mut found = self.stops.recover(now, stops);
        if self.stops.config.enforce {
            found.countdowns = self.countdowns.recover(countdowns);
        }
        found
    }

    /// The first crossing of a pass: what to do, as values.
    pub fn plan(&mut self, view: &PassView) -> Plan {
        let mut plan = Plan::default();
        self.stops.begin(view);
        self.deadlines.begin(view);
        self.countdowns.begin(view);
        self.deadlines.say_limits_once(view, &mut plan);
        self.stops.warnings(view, &mut plan);
        if !self.stops.config.enforce {
            let coders = self.countdowns.would(view, &mut plan);
            self.stops.would_stop(view, &mut plan, &coders);
            self.deadlines.would_act(view, &mut plan);
            return plan;
        }
        let coders = self.countdowns.plan(view, &mut plan);
        self.stops.plan(view, &mut plan, &coders);
        for (id, pool) in self.countdowns.take_serving() {
            self.stops.serve_coders_stop(&id, pool);
        }
        if !view.shutting_down {
            self.deadlines.ttls_to_restore(view, &mut plan);
        }
        self.deadlines.count_averted(view, &mut plan);
        if !view.shutting_down {
            let moving = self.countdowns.moving();
            self.deadlines.extensions_to_send(view, &mut plan, &moving);
        }
        plan
    }

    /// The second crossing: Coder's answers move the ledger; what they cause is written.
    pub fn observe(&mut self, outcomes: Vec<Outcome>) -> Vec<Note> {
        let mut notes = Vec::new();
        for outcome in outcomes {
            match outcome {
                Outcome::Extend { workspace_id, answer } if self.countdowns.planned(&workspace_id) => {
                    self.countdowns.moved(&workspace_id, answer, &mut notes);
                }
                Outcome::Extend { workspace_id, answer } => self.deadlines.extend_answered(&workspace_id, answer, &mut notes),
                Outcome::FollowCountdown { workspace_id, answer } => match self.countdowns.followed(&workspace_id, answer, &mut notes) {
                    Some(countdowns::Followed::Done(done)) => self.stops.stopped_by_coder(done),
                    Some(countdowns::Followed::StopFailed { event, build_id }) => self.stops.adopt_failed(event, build_id),
                    Some(countdowns::Followed::Ended) => self.stops.coders_stop_ended(&workspace_id),
                    None => {}
                },
                Outcome::RestoreTtl { workspace_id, answer } => self.deadlines.ttl_answered(&workspace_id, answer, &mut notes),
                other => self.stops.observe(other, &mut notes),
            }
        }
        notes
    }

    /// What this pass did (after `observe`), with whether the audit log takes lines.
    pub fn acted(&self, audit_failing: bool) -> Acted {
        let (s, d, c) = (&self.stops.acted, &self.deadlines.acted, &self.countdowns.acted);
        Acted {
            extended: d.extended.clone(),
            would_extend: d.would_extend.clone(),
            autostops_averted: d.autostops_averted.clone(),
            counting_down: c.counting_down.clone(),
            countdowns_averted: c.countdowns_averted.clone(),
            stops_done: [s.stops_done.as_slice(), c.stops_done.as_slice()].concat(),
            audit_failing,
            ..s.clone()
        }
    }
}
