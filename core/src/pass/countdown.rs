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
use crate::pass::decide::Reason;
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
pub fn start(coder_now: DateTime<Utc>, ws: &Workspace, countdown: std::time::Duration, reason: Reason) -> Start {
    let b = &ws.latest_build;
    // Someone is connected: each connection moves Coder's deadline (the activity bump), so no
    // countdown could end; the service stops it itself.
    if matches!(reason, Reason::ConnectedButGpuIdle | Reason::MaxLifetime) {
        return Start::OwnStop("someone is connected (Coder's activity bump would move every countdown)");
    }
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

/// A countdown whose deadline someone moved later in Coder (the dashboard's +1 h, an activity
/// bump without a use the listing shows yet) ends at that later deadline: the person's choice
/// stands, and the service's own stop, if Coder does not stop it, comes only after it.
pub fn follow_coder(c: &mut Countdown, ws: &Workspace) {
    if let Some(d) = coder_deadline(ws).filter(|d| *d > c.deadline) {
        c.deadline = d;
    }
}

/// How a countdown ends while its workspace runs the same build and is no longer judged idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// `last_used_at` moved since it began: someone came back (`countdowns_averted`).
    pub averted: bool,
    /// Where to move Coder's deadline back to: where it was before the countdown, or now plus
    /// the workspace's TTL when later, never less than Coder's 30 minutes nor past `max_deadline`;
    /// `None` when Coder's deadline is already there or later (or the service moved nothing).
    pub restore: Option<DateTime<Utc>>,
}

/// The end of a countdown.
pub fn end(coder_now: DateTime<Utc>, ws: &Workspace, c: &Countdown) -> End {
    let averted = ws.last_used_at > c.last_used_at;
    let ttl = ws.ttl_ms.filter(|t| *t > 0).map_or(Duration::zero(), Duration::milliseconds);
    let mut to = whole_seconds(c.original_deadline.max(coder_now + ttl).max(coder_now + dur(CODER_MIN_AHEAD) + Duration::seconds(1)));
    if let Some(max) = ws.latest_build.max_deadline.filter(|m| m.timestamp() > 0) {
        to = to.min(max);
    }
    // A bump that moved it past the countdown's deadline but short of where it was still puts
    // it back: a job started after the return must not meet the shortened deadline.
    let short = coder_deadline(ws).is_some_and(|d| d < to);
    let restore = (c.moved && short).then_some(to);
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
            assert_eq!(start(t(0) + Duration::milliseconds(400), &w, countdown, Reason::Idle), want, "row {i}");
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
        let mut capped = used(30, 60);
        capped.latest_build.max_deadline = Some(t(200));
        // (workspace, countdown, end), at 12:10
        let rows = [
            // Coder's activity bump moved it to where it was, or later: nothing to send.
            (used(240, 60), &c, End { averted: true, restore: None }),
            (used(300, 60), &c, End { averted: true, restore: None }),
            // A bump past the countdown's deadline but short of where it was: put back.
            (used(70, 60), &c, End { averted: true, restore: back(240) }),
            // No bump (activity_bump 0, or one too short to move it): back to where it was...
            (used(30, 60), &c, End { averted: true, restore: back(240) }),
            // ...or to now plus the workspace's TTL, whichever is later...
            (used(30, 360), &c, End { averted: true, restore: back(370) }),
            // ...never less than Coder's 30 minutes...
            (used(30, 10), &late, End { averted: true, restore: Some(t(40) + Duration::seconds(1)) }),
            // ...and never past max_deadline (Coder refuses it).
            (capped, &c, End { averted: true, restore: back(200) }),
            // No use (the GPU computes again, the data turned doubtful): put back, not averted.
            (ws(Some(30)), &c, End { averted: false, restore: back(480 + 10) }),
            // Coder's own deadline was sooner: the service moved nothing.
            (used(20, 480), &sooner, End { averted: true, restore: None }),
        ];
        for (i, (w, c, want)) in rows.into_iter().enumerate() {
            assert_eq!(end(t(10), &w, c), want, "row {i}");
        }
    }

    #[test]
    fn a_deadline_moved_later_in_coder_is_the_countdowns_new_end() {
        // (Coder's deadline now, the countdown's end after it)
        for (coder, want) in [(Some(30), 30), (Some(90), 90), (Some(20), 30), (None, 30)] {
            let mut c = counted(240, 30, true);
            follow_coder(&mut c, &ws(coder));
            assert_eq!(c.deadline, t(want), "{coder:?}");
        }
    }

    #[test]
    fn a_workspace_someone_is_connected_to_is_never_counted_down() {
        for reason in [Reason::ConnectedButGpuIdle, Reason::MaxLifetime] {
            assert!(matches!(start(t(0), &ws(Some(240)), THIRTY, reason), Start::OwnStop(_)), "{reason:?}");
        }
        assert_eq!(start(t(0), &ws(Some(240)), THIRTY, Reason::MemoryHeldIdle), Start::Set { to: t(30) });
    }
}
