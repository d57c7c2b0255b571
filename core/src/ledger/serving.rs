//! One waiter, one stop: the stops sent for a pool's waiters, each counted against one waiter of
//! its pool from its POST until a waiter of the pool stops waiting (its pod got a GPU, or its
//! agent connected) or `start_allowance` after the stop succeeded; a stop that ends without
//! stopping (failed, reaped, canceled) frees no GPU and stops counting. The fleet rules read the
//! counts (`fleet::fleet_rules_serving`).

use chrono::{DateTime, Duration, Utc};

use super::intent::PassView;

/// A stop sent for its pool's waiters.
#[derive(Debug, Clone, PartialEq)]
struct Sent {
    workspace_id: String,
    pool: usize,
    /// When its build succeeded (this machine's clock).
    done_at: Option<DateTime<Utc>>,
}

/// The stops that serve waiters, and each pool's waiters at the last pass.
#[derive(Debug, Default)]
pub(super) struct Serving {
    sent: Vec<Sent>,
    last_waiting: Vec<usize>,
}

impl Serving {
    /// How many stops serve a waiter, per pool.
    pub(super) fn counts(&self) -> Vec<usize> {
        let mut out = vec![0; self.sent.iter().map(|s| s.pool + 1).max().unwrap_or(0)];
        for s in &self.sent {
            out[s.pool] += 1;
        }
        out
    }

    /// A stop was sent for the workspace (again: it replaces the last).
    pub(super) fn sent(&mut self, workspace_id: &str, pool: usize) {
        self.ended(workspace_id);
        self.sent.push(Sent { workspace_id: workspace_id.to_string(), pool, done_at: None });
    }

    /// The workspace's stop succeeded: its GPU is on its way to a waiter.
    pub(super) fn done(&mut self, workspace_id: &str, at: DateTime<Utc>) {
        if let Some(s) = self.sent.iter_mut().find(|s| s.workspace_id == workspace_id) {
            s.done_at = Some(at);
        }
    }

    /// The workspace's stop ended without stopping it: it frees no GPU.
    pub(super) fn ended(&mut self, workspace_id: &str) {
        self.sent.retain(|s| s.workspace_id != workspace_id);
    }

    /// Retires the stops that no longer serve a waiter: `allowance` after they succeeded, or one
    /// per waiter their pool lost since the last pass, those done first, the oldest first.
    pub(super) fn retire(&mut self, view: &PassView, allowance: Duration) {
        self.sent.retain(|s| s.done_at.is_none_or(|done| view.now - done < allowance));
        let waiting: Vec<usize> = view.fleet.pools.iter().map(|p| p.waiting).collect();
        for (pool, before) in std::mem::take(&mut self.last_waiting).into_iter().enumerate() {
            let mut gone = before.saturating_sub(waiting.get(pool).copied().unwrap_or(0));
            while gone > 0 {
                let oldest = (0..self.sent.len())
                    .filter(|&i| self.sent[i].pool == pool)
                    .min_by_key(|&i| (self.sent[i].done_at.is_none(), self.sent[i].done_at));
                let Some(i) = oldest else { break };
                self.sent.remove(i);
                gone -= 1;
            }
        }
        self.last_waiting = waiting;
    }
}
