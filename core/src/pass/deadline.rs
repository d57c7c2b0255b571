//! Keeping busy work running: how far to move Coder's autostop deadline for a workspace whose
//! GPU computes while nobody is connected. Coder's autostop counts connections only, so an
//! unattended training job is stopped at its deadline; with `extend_while_busy` the service keeps
//! that deadline ahead of now while the GPU computes, and lets it pass once the GPU idles.
//!
//! Pure: `decide` calls `plan` for a workspace it keeps because its GPU computes, and the
//! actuator sends what the plan says (`PUT /api/v2/workspaces/{id}/extend`). Coder's rules
//! (reference coder NOTES §16, `coderd/workspaces.go` `putExtendWorkspace`): the new deadline
//! must be at least 30 minutes ahead and not after `max_deadline`; a connection moves the
//! deadline by itself (the activity bump); the lifecycle executor stops the workspace once the
//! deadline has passed.

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::coder::types::WorkspaceBuild;
use crate::duration::chrono as dur;
use crate::pass::policy::{CODER_MIN_AHEAD, Thresholds};

/// A workspace used this recently is connected: Coder's activity bump keeps its deadline ahead
/// (`last_used_at` trails a connection by up to about 90 s, NOTES §7; the dashboard calls a
/// workspace used within 2 minutes "connected", NOTES §16).
pub const CONNECTED_WITHIN: Duration = Duration::minutes(2);

/// What bounds how far the deadline may move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// `extend_limit` after the build completed.
    ExtendLimit,
    /// The build's `max_deadline` (the template's autostop requirement).
    MaxDeadline,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::ExtendLimit => "extend_limit",
            Limit::MaxDeadline => "max_deadline",
        }
    }
}

/// What to do with the deadline this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum DeadlineAction {
    /// Far enough ahead for now.
    Ahead,
    /// Move it to `to` (whole seconds, Coder's clock).
    Extend { to: DateTime<Utc> },
    /// The limit leaves no extension of 30 minutes or more: Coder stops the workspace at its
    /// deadline.
    LimitReached,
}

/// The GPU readings an extension rests on: the peaks over the decision's window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct GpuEvidence {
    pub sm_active_peak: Option<f64>,
    pub gr_engine_active_peak: Option<f64>,
}

/// Coder's deadline for a workspace kept because its GPU computes, and what to do about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadlinePlan {
    /// Coder's deadline as listed (Coder's clock).
    pub deadline: DateTime<Utc>,
    #[serde(flatten)]
    pub action: DeadlineAction,
    /// The latest the service moves it to, and what sets that.
    pub limit: DateTime<Utc>,
    pub limited_by: Limit,
    pub evidence: GpuEvidence,
}

impl DeadlinePlan {
    /// The extension to send this pass, if one is due.
    pub fn extend_to(&self) -> Option<DateTime<Utc>> {
        match self.action {
            DeadlineAction::Extend { to } => Some(to),
            _ => None,
        }
    }
}

/// The plan for one running start build whose GPU computes with nobody connected, or `None`
/// when there is nothing to keep: `extend_while_busy` is off, or autostop is (no deadline).
/// `coder_now` is Coder's clock, as are the build's times. An extension is due once the
/// deadline is closer than `within` (`Policy::extend_when_within`); it moves the deadline to
/// `now + extend_by`, clamped to the build's completion plus `extend_limit` and to
/// `max_deadline`, and is sent only when that is at least 30 minutes ahead (Coder refuses less)
/// and later than the deadline (an extension never shortens one).
pub fn plan(
    coder_now: DateTime<Utc>,
    build: &WorkspaceBuild,
    t: &Thresholds,
    within: std::time::Duration,
    evidence: GpuEvidence,
) -> Option<DeadlinePlan> {
    if !t.extend_while_busy {
        return None;
    }
    let deadline = build.deadline?;
    let completed = build.job.completed_at.or(build.created_at)?;
    let by_limit = completed + dur(t.extend_limit);
    let (limit, limited_by) = match build.max_deadline {
        Some(max) if max < by_limit => (max, Limit::MaxDeadline),
        _ => (by_limit, Limit::ExtendLimit),
    };
    let now = whole_seconds(coder_now);
    let action = if deadline - coder_now >= dur(within) {
        DeadlineAction::Ahead
    } else {
        let to = whole_seconds((now + dur(t.extend_by)).min(limit));
        if to < now + dur(CODER_MIN_AHEAD) || (to <= deadline && to == whole_seconds(limit)) {
            DeadlineAction::LimitReached
        } else if to <= deadline {
            DeadlineAction::Ahead
        } else {
            DeadlineAction::Extend { to }
        }
    };
    Some(DeadlinePlan { deadline, action, limit, limited_by, evidence })
}

/// The thresholds and lead for a template that reminds its owners `lead` before autostop: an
/// extension is due while the deadline is still the policy's margin (`extend_when_within` past
/// Coder's 30 minutes: two pass intervals) outside that window, so a pass sends it before the
/// window opens, and moves the deadline at least that margin beyond the new lead, so the
/// reminder is not due right after. Without a reminder, as the policy says.
pub fn ahead_of_reminder(t: &Thresholds, within: std::time::Duration, lead: Option<Duration>) -> (Thresholds, std::time::Duration) {
    let Some(lead) = lead.filter(|l| *l > Duration::zero()).and_then(|l| l.to_std().ok()) else { return (t.clone(), within) };
    let margin = within.saturating_sub(CODER_MIN_AHEAD);
    let within = within.max(lead + margin);
    let extend_by = t.extend_by.max(within + margin);
    (Thresholds { extend_by, ..t.clone() }, within)
}

/// A time without its fraction of a second (never later than it was).
fn whole_seconds(t: DateTime<Utc>) -> DateTime<Utc> {
    t - Duration::nanoseconds(i64::from(t.timestamp_subsec_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pass::policy::Policy;

    fn minutes(m: u64) -> std::time::Duration {
        std::time::Duration::from_secs(m * 60)
    }

    #[test]
    fn an_extension_comes_before_coders_reminder_window_and_moves_the_deadline_past_it() {
        // A 60 s pass: extensions are due 32 minutes ahead (Coder's 30 plus two passes), and move
        // the deadline an hour (`extend_by`).
        let policy = Policy::defaults(std::time::Duration::from_secs(60));
        let t = policy.thresholds.clone();
        // (the template's reminder lead, due while closer than, moved to now plus)
        let rows: [(Option<i64>, u64, u64); 5] =
            [(None, 32, 60), (Some(0), 32, 60), (Some(15), 32, 60), (Some(60), 62, 64), (Some(120), 122, 124)];
        for (lead, within, extend_by) in rows {
            let (th, w) = ahead_of_reminder(&t, policy.extend_when_within, lead.map(Duration::minutes));
            assert_eq!((w, th.extend_by), (minutes(within), minutes(extend_by)), "lead {lead:?} min");
        }
    }
}
