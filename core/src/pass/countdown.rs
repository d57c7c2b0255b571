//! Coder's own countdown (`countdown_in_coder`): instead of stopping an idle workspace itself,
//! the service moves Coder's autostop deadline to Coder's now plus the countdown
//! (`PUT /api/v2/workspaces/{id}/extend`; Coder lets a deadline move earlier while it stays 30
//! minutes ahead, reference coder NOTES §16). Coder then warns where people look (the dashboard's
//! "Stop in 30 minutes", the autostop reminder, which re-arms on every deadline value, NOTES §18),
//! a connection bumps the deadline (coming back averts the stop), and the lifecycle executor makes
//! the stop build itself, reason `autostop`.
//!
//! Pure: the ledger (`ledger::countdowns`) asks `start` for a reclaim the fleet rules chose,
//! `expired` each pass while one runs, and `end` once its workspace is judged no longer idle. The
//! rules, each a row of this module's tests:
//! - only a completed start with a deadline can be counted down: autostop off (`Workspace
//!   shutdown is manual.`) and prebuilds (Coder refuses them) take the service's own stop;
//! - a deadline already sooner than the countdown is left as it is: Coder stops it sooner;
//! - a countdown whose deadline passed more than two intervals plus one minute ago while the same
//!   build runs (a blocked lifecycle executor, no provisioner) is the service's own stop again;
//! - one that ends with Coder's deadline still where the countdown put it (a template whose
//!   activity bump is 0 or too short to move it, or no use at all: the GPU computes again, the data
//!   turned doubtful, nobody waits any more) has its deadline moved back to where it was, or to
//!   now plus the workspace's TTL, whichever is later, and never less than Coder's 30 minutes.

use chrono::{DateTime, Duration, Utc};

use crate::coder::types::{JobStatus, Transition, Workspace};
use crate::duration::chrono as dur;
use crate::pass::policy::CODER_MIN_AHEAD;

/// A countdown the service started (or found Coder's own deadline sooner than), remembered for
/// its build.
#[derive(Debug, Clone, PartialEq)]
pub struct Countdown {
    pub build_id: String,
    /// `last_used_at` when it began: a later one is someone coming back.
    pub last_used_at: DateTime<Utc>,
    /// Coder's deadline before it (Coder's clock).
    pub original_deadline: DateTime<Utc>,
    /// When Coder stops it (Coder's clock).
    pub deadline: DateTime<Utc>,
    /// Whether the service moved the deadline (false: Coder's own was sooner).
    pub moved: bool,
}

/// How a reclaim chosen this pass begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Move Coder's deadline to `to` (whole seconds, Coder's clock).
    Set { to: DateTime<Utc> },
    /// Coder's deadline is already sooner than the countdown: nothing to send, Coder stops it then.
    Sooner { deadline: DateTime<Utc> },
    /// No countdown can be set: the service's own stop, for this reason.
    OwnStop(&'static str),
}

/// The start of a countdown of `countdown` for a workspace the pass would reclaim.
pub fn start(coder_now: DateTime<Utc>, ws: &Workspace, countdown: std::time::Duration) -> Start {
    let b = &ws.latest_build;
    if ws.is_prebuild() {
        return Start::OwnStop("a prebuild: Coder moves no prebuild's deadline");
    }
    if b.transition != Transition::Start || b.job.status != JobStatus::Succeeded {
        return Start::OwnStop("its latest build is not a completed start");
    }
    let Some(deadline) = coder_deadline(ws) else {
        return Start::OwnStop("its autostop is off (no deadline: Workspace shutdown is manual.)");
    };
    let to = whole_seconds(coder_now + dur(countdown.max(CODER_MIN_AHEAD)));
    if deadline <= to { Start::Sooner { deadline } } else { Start::Set { to } }
}

/// Coder's autostop deadline of the latest build, `None` when autostop is off (null, or Go's
/// zero time).
pub fn coder_deadline(ws: &Workspace) -> Option<DateTime<Utc>> {
    ws.latest_build.deadline.filter(|d| d.timestamp() > 0)
}

/// How long past its deadline a countdown waits for Coder's lifecycle executor (which stops a
/// workspace 0 to about 2 minutes after its deadline, NOTES §16) before the service stops it.
pub fn expiry_margin(interval: std::time::Duration) -> Duration {
    dur(interval) * 2 + Duration::minutes(1)
}

/// Whether Coder should have stopped it by now: the deadline passed more than
/// `expiry_margin(interval)` ago.
pub fn expired(coder_now: DateTime<Utc>, c: &Countdown, interval: std::time::Duration) -> bool {
    coder_now > c.deadline + expiry_margin(interval)
}

/// How a countdown ends while its workspace runs the same build and is no longer judged idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// `last_used_at` moved since it began: someone came back (`countdowns_averted`).
    pub averted: bool,
    /// Where to move Coder's deadline back to, when the countdown's is still there.
    pub restore: Option<DateTime<Utc>>,
}

/// The end of a countdown. `extending`: this pass moves the deadline anyway (busy GPU work,
/// `extend_while_busy`), so nothing else is sent.
pub fn end(coder_now: DateTime<Utc>, ws: &Workspace, c: &Countdown, extending: bool) -> End {
    let averted = ws.last_used_at > c.last_used_at;
    let still_ours = coder_deadline(ws).is_some_and(|d| d <= c.deadline);
    let restore = (c.moved && still_ours && !extending).then(|| {
        let ttl = ws.ttl_ms.filter(|t| *t > 0).map_or(Duration::zero(), Duration::milliseconds);
        whole_seconds(c.original_deadline.max(coder_now + ttl).max(coder_now + dur(CODER_MIN_AHEAD) + Duration::seconds(1)))
    });
    End { averted, restore }
}

/// A time without its fraction of a second (never later than it was).
fn whole_seconds(t: DateTime<Utc>) -> DateTime<Utc> {
    t - Duration::nanoseconds(i64::from(t.timestamp_subsec_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(min: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_764_849_600 + min * 60, 0).unwrap_or_default()
    }

    /// A running workspace (a completed start) whose deadline is `deadline` minutes after the
    /// test's noon, last used an hour before it, with an 8 h TTL.
    fn ws(deadline: Option<i64>) -> Workspace {
        let json = serde_json::json!({
            "id": "w", "name": "train", "owner_name": "alice", "template_name": "gpu", "created_at": "2026-12-04T08:00:00Z",
            "last_used_at": t(-60), "ttl_ms": 8 * 3600 * 1000,
            "latest_build": {"id": "b", "transition": "start", "status": "running", "deadline": deadline.map(t),
                "job": {"id": "j", "status": "succeeded"}}
        });
        serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"))
    }

    fn used(deadline: i64, ttl_min: i64) -> Workspace {
        let mut w = ws(Some(deadline));
        w.last_used_at = t(10);
        w.ttl_ms = Some(ttl_min * 60 * 1000);
        w
    }

    const THIRTY: std::time::Duration = std::time::Duration::from_secs(30 * 60);

    fn counted(original: i64, deadline: i64, moved: bool) -> Countdown {
        Countdown { build_id: "b".into(), last_used_at: t(-60), original_deadline: t(original), deadline: t(deadline), moved }
    }

    #[test]
    fn a_countdown_starts_only_on_a_deadline_later_than_it() {
        let mut prebuild = ws(Some(240));
        prebuild.is_prebuild = true;
        let mut stopping = ws(Some(240));
        stopping.latest_build.transition = Transition::Stop;
        let mut zero = ws(None);
        zero.latest_build.deadline = DateTime::parse_from_rfc3339("0001-01-01T00:00:00Z").ok().map(|d| d.with_timezone(&Utc));
        assert!(zero.latest_build.deadline.is_some());
        let off = "its autostop is off (no deadline: Workspace shutdown is manual.)";
        // (workspace, countdown, start), at noon and 400 ms (sent in whole seconds)
        let rows = [
            (ws(Some(240)), THIRTY, Start::Set { to: t(30) }),
            (ws(Some(240)), THIRTY * 2, Start::Set { to: t(60) }),
            // Less than Coder's 30 minutes is never sent (coderd refuses it).
            (ws(Some(240)), THIRTY / 3, Start::Set { to: t(30) }),
            (ws(Some(30)), THIRTY, Start::Sooner { deadline: t(30) }),
            (ws(Some(12)), THIRTY, Start::Sooner { deadline: t(12) }),
            (ws(None), THIRTY, Start::OwnStop(off)),
            (zero, THIRTY, Start::OwnStop(off)),
            (prebuild, THIRTY, Start::OwnStop("a prebuild: Coder moves no prebuild's deadline")),
            (stopping, THIRTY, Start::OwnStop("its latest build is not a completed start")),
        ];
        for (i, (w, countdown, want)) in rows.into_iter().enumerate() {
            assert_eq!(start(t(0) + Duration::milliseconds(400), &w, countdown), want, "row {i}");
        }
    }

    #[test]
    fn coder_has_two_intervals_and_a_minute_past_the_deadline_before_the_service_stops_it() {
        let c = counted(240, 30, true);
        // (Coder's now in seconds after noon, interval in seconds, expired)
        let rows = [(0, 60, false), (30 * 60, 60, false), (33 * 60, 60, false), (33 * 60 + 1, 60, true), (32 * 60 + 1, 30, true)];
        for (s, interval, want) in rows {
            let now = t(0) + Duration::seconds(s);
            assert_eq!(expired(now, &c, std::time::Duration::from_secs(interval)), want, "{s} s, interval {interval} s");
        }
    }

    #[test]
    fn an_ended_countdown_puts_back_what_coder_did_not_move() {
        let (c, late, sooner) = (counted(240, 30, true), counted(35, 30, true), counted(20, 20, false));
        let back = |min: i64| Some(t(min));
        // (workspace, countdown, extending this pass, end), at 12:10
        let rows = [
            // Coder's activity bump moved it past the countdown: nothing to send.
            (used(70, 480), &c, false, End { averted: true, restore: None }),
            // No bump (activity_bump 0, or one too short to move it): back to where it was...
            (used(30, 60), &c, false, End { averted: true, restore: back(240) }),
            // ...or to now plus the workspace's TTL, whichever is later...
            (used(30, 360), &c, false, End { averted: true, restore: back(370) }),
            // ...and never less than Coder's 30 minutes.
            (used(30, 10), &late, false, End { averted: true, restore: Some(t(40) + Duration::seconds(1)) }),
            // No use (the GPU computes again, the data turned doubtful): put back, not averted.
            (ws(Some(30)), &c, false, End { averted: false, restore: back(480 + 10) }),
            // Busy GPU work is extended this pass anyway.
            (ws(Some(30)), &c, true, End { averted: false, restore: None }),
            // Coder's own deadline was sooner: the service moved nothing.
            (used(20, 480), &sooner, false, End { averted: true, restore: None }),
        ];
        for (i, (w, c, extending, want)) in rows.into_iter().enumerate() {
            assert_eq!(end(t(10), &w, c, extending), want, "row {i}");
        }
    }
}
