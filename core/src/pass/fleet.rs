//! The fleet rules: what a pass decides beyond each workspace's verdict. Contention per pool (in
//! `contended` mode an idle workspace is reclaimed only while someone waits in its pool, as many as
//! wait, less the stops already sent that still serve one), the stop cap, the circuit breaker,
//! and the extension cap. Pure: `judge` applies them to a pass's decisions.

use crate::pass::decide::{Decision, Reason, Verdict};
use crate::pass::policy::{Policy, ReclaimWhen};

/// What the fleet-level step decided beyond each verdict.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FleetOutcome {
    /// Indices into the decisions to stop this pass, longest GPU-idle first: the first
    /// `stop_slots` reclaims.
    pub stop_order: Vec<usize>,
    /// How many stop builds this pass may send, retries of earlier stops included:
    /// `max_stops_per_pass`, none while the breaker holds. The stop order takes them first; the
    /// actuator gives the rest to due retries. The one place the cap is applied.
    pub stop_slots: usize,
    /// Reclaims left for a later pass by `max_stops_per_pass`.
    pub deferred: usize,
    /// Set when the circuit breaker refuses every stop this pass, with the reason.
    pub breaker: Option<String>,
    pub waiting: usize,
    pub gpu_workspaces: usize,
    /// Per pool (`Policy::pools`, same order): who waits there and who is idle there.
    pub pools: Vec<PoolCounts>,
    /// Indices into the decisions whose deadline is due to be extended, soonest deadline first
    /// (the breaker, which guards against zeros, does not hold extensions back).
    pub extend_order: Vec<usize>,
    /// How many of them this pass may send: `max_extensions_per_pass`. The actuator skips those
    /// Coder refused for their build without using a slot.
    pub extension_slots: usize,
}

/// One pool's demand and supply in a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolCounts {
    /// Workspaces waiting for a GPU in the pool.
    pub waiting: usize,
    /// Idle workspaces of the pool: stop-eligible, or kept only because nobody waits there.
    pub idle: usize,
}

/// Applies contention (per pool), the breaker and the caps to a pass's decisions.
pub fn apply_fleet_rules(decisions: &mut [Decision], policy: &Policy) -> FleetOutcome {
    fleet_rules_serving(decisions, policy, &[])
}

/// `apply_fleet_rules` with the stops already sent that still serve a waiter, per pool (an index
/// into `Policy::pools`): in `contended` mode each counts against one waiter of its pool, so one
/// waiter costs one stop however long its GPU takes to reach it (the ledger says how many).
pub fn fleet_rules_serving(decisions: &mut [Decision], policy: &Policy, serving: &[usize]) -> FleetOutcome {
    let pools = policy.pools.len().max(1);
    let pool_of = |d: &Decision| d.pool.min(pools - 1);
    let mut waiting_in = vec![0usize; pools];
    for d in decisions.iter().filter(|d| d.verdict == Verdict::Waiting) {
        waiting_in[pool_of(d)] += 1;
    }
    let waiting = waiting_in.iter().sum();
    let by_idle_desc = |ds: &[Decision], pick: &dyn Fn(&Decision) -> bool| {
        let mut idx: Vec<usize> = (0..ds.len()).filter(|&i| pick(&ds[i])).collect();
        idx.sort_by(|&a, &b| ds[b].gpu_idle.cmp(&ds[a].gpu_idle).then_with(|| ds[a].workspace_id.cmp(&ds[b].workspace_id)));
        idx
    };
    if policy.reclaim_when == ReclaimWhen::Contended {
        // Longest idle first, as many in each pool as wait there.
        let mut given = vec![0usize; pools];
        for i in by_idle_desc(decisions, &|d| d.is_stop_eligible()) {
            let p = pool_of(&decisions[i]);
            let sent = serving.get(p).copied().unwrap_or(0);
            if given[p] + sent < waiting_in[p] {
                given[p] += 1;
                continue;
            }
            let d = &mut decisions[i];
            let whose = if pools > 1 { format!(" in its pool {:?}", policy.pools[p]) } else { String::new() };
            d.message = match (waiting_in[p], sent) {
                (0, _) => format!("{}; kept: no workspace is waiting for a GPU{whose}", d.message),
                (n, 0) => format!("{}; kept: the {n} waiting for a GPU{whose} are served by longer-idle workspaces", d.message),
                (n, _) => format!(
                    "{}; kept: the {n} waiting for a GPU{whose} are served by longer-idle workspaces and {sent} stop(s) already sent",
                    d.message
                ),
            };
            d.verdict = Verdict::Keep;
            d.reason = Reason::NoContention;
            d.stop_at = None;
        }
    }
    let gpu_workspaces =
        decisions.iter().filter(|d| matches!(d.verdict, Verdict::Keep | Verdict::Warn | Verdict::Reclaim | Verdict::Unknown)).count();
    let reclaim = by_idle_desc(decisions, &|d| d.verdict == Verdict::Reclaim);
    let mut counts: Vec<PoolCounts> = waiting_in.iter().map(|&waiting| PoolCounts { waiting, idle: 0 }).collect();
    for d in decisions.iter().filter(|d| d.is_stop_eligible() || d.reason == Reason::NoContention) {
        counts[pool_of(d)].idle += 1;
    }
    let mut out = FleetOutcome { waiting, gpu_workspaces, pools: counts, ..FleetOutcome::default() };
    let mut extend: Vec<usize> =
        (0..decisions.len()).filter(|&i| decisions[i].deadline.as_ref().is_some_and(|p| p.extend_to().is_some())).collect();
    let soonest = |i: usize| decisions[i].deadline.as_ref().map(|p| p.deadline);
    extend.sort_by(|&a, &b| soonest(a).cmp(&soonest(b)).then_with(|| decisions[a].workspace_id.cmp(&decisions[b].workspace_id)));
    out.extend_order = extend;
    out.extension_slots = policy.max_extensions_per_pass;
    if gpu_workspaces >= 4 && reclaim.len() as f64 > policy.max_idle_fraction * gpu_workspaces as f64 {
        out.breaker = Some(format!(
            "{} of {} GPU workspaces are reclaimable at once (more than max_idle_fraction {}): a broken exporter reads as zeros, so no stop is sent this pass; if this is real, raise max_idle_fraction",
            reclaim.len(),
            gpu_workspaces,
            policy.max_idle_fraction
        ));
        return out;
    }
    out.stop_slots = policy.max_stops_per_pass;
    out.deferred = reclaim.len().saturating_sub(out.stop_slots);
    out.stop_order = reclaim.into_iter().take(out.stop_slots).collect();
    out
}
