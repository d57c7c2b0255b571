//! Coder's countdown (`countdown_in_coder`) as tables of passes on a clock the test sets: what
//! each pass plans, what Coder answers, and the notes that follow.

use super::tests::{at, audited, build, events, fleet, idle, judged, ledger, observing, plan, stop_build, workspace};
use super::*;
use crate::coder::types::{BuildReason, JobStatus, Transition, WorkspaceBuild};
use crate::pass::decide::{Reason, Verdict};
use crate::pass::fleet::FleetOutcome;
use crate::pass::judge::Judged;

const THIRTY: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// An idle workspace chosen for a reclaim, with Coder's deadline `deadline` minutes after the
/// test's start (`None`: autostop off), counted down by 30 minutes.
fn counted(deadline: Option<i64>) -> Judged {
    let mut j = idle("a", "start-1");
    j.workspace.latest_build.deadline = deadline.map(at);
    j.workspace.ttl_ms = Some(8 * 3600 * 1000);
    j.decision.countdown = Some(THIRTY);
    j
}

/// The same workspace used at `minute` (its `last_used_at` moved), judged active.
fn used(deadline: i64, minute: i64) -> Judged {
    let mut ws = workspace("a", "start-1", at(minute));
    ws.latest_build.deadline = Some(at(deadline));
    ws.ttl_ms = Some(8 * 3600 * 1000);
    judged(ws, Verdict::Keep, Reason::Connected)
}

fn moves(p: &Plan) -> Vec<(String, chrono::DateTime<chrono::Utc>, &'static str)> {
    p.calls
        .iter()
        .filter_map(|c| match c {
            Call::Extend { workspace_id, to, event } => Some((workspace_id.clone(), *to, event.event.as_str())),
            _ => None,
        })
        .collect()
}

/// A ledger whose countdown for "a" was set at 10:00 (Coder's deadline 14:00 moved to 10:30).
fn counting_down() -> Ledger {
    let mut l = ledger();
    plan(&mut l, at(0), &[counted(Some(240))], &fleet(&[0], 10));
    l.observe(vec![ok("a")]);
    l
}

fn stop_calls(p: &Plan) -> usize {
    p.calls.iter().filter(|c| matches!(c, Call::Stop(_))).count()
}

/// The counted-down workspace, its GPU computing again (kept, deadline 10:30).
fn computing_again() -> Judged {
    let mut busy = counted(Some(30));
    busy.decision.verdict = Verdict::Keep;
    busy.decision.reason = Reason::GpuActive;
    busy
}

/// Coder refuses the stop just planned for "a" (a 400): the ledger tries again later.
fn refuse_stop(l: &mut Ledger) {
    l.observe(vec![Outcome::Stop {
        workspace_id: "a".into(),
        answer: StopAnswer::Refused(Failure { status: Some(400), text: "400".into() }),
    }]);
}

fn ok(ws: &str) -> Outcome {
    Outcome::Extend { workspace_id: ws.into(), answer: Ok(()) }
}

fn coders_stop(status: JobStatus) -> WorkspaceBuild {
    let mut b = build("autostop-1", Transition::Stop, status);
    b.reason = BuildReason::Autostop;
    b.job.completed_at = (status == JobStatus::Succeeded).then(|| at(31));
    b
}

#[test]
fn a_reclaim_becomes_coders_countdown_and_coders_stop_is_a_reclaim() {
    let mut l = ledger();
    let p = plan(&mut l, at(0), &[counted(Some(240))], &fleet(&[0], 10));
    assert_eq!(moves(&p), [("a".into(), at(30), "countdown_set")]);
    assert_eq!(stop_calls(&p), 0, "no stop of the service's own");
    let notes = l.observe(vec![ok("a")]);
    assert_eq!(audited(&notes), ["countdown_set"]);
    assert_eq!(l.acted(false).counting_down, [CountingDown { workspace_id: "a".into(), until: at(30), set: true }]);
    // (minute, listed running, the calls planned)
    for minute in [1, 10, 29, 30] {
        let p = plan(&mut l, at(minute), &[counted(Some(30))], &fleet(&[0], 10));
        assert!(p.calls.is_empty(), "minute {minute}: Coder counts down, nothing is sent: {:?}", p.calls);
        assert_eq!(l.acted(false).counting_down.len(), 1);
    }
    // Coder's lifecycle executor stopped it: it is no longer listed, and what Coder did is read.
    let p = plan(&mut l, at(31), &[], &fleet(&[], 10));
    assert_eq!(p.calls, [Call::FollowCountdown { workspace_id: "a".into() }]);
    let notes = l.observe(vec![Outcome::FollowCountdown { workspace_id: "a".into(), answer: Ok(Some(coders_stop(JobStatus::Pending))) }]);
    assert!(notes.is_empty(), "{notes:?}");
    let p = plan(&mut l, at(32), &[], &fleet(&[], 10));
    assert_eq!(p.calls.len(), 1);
    let notes = l.observe(vec![Outcome::FollowCountdown { workspace_id: "a".into(), answer: Ok(Some(coders_stop(JobStatus::Succeeded))) }]);
    assert_eq!(audited(&notes), ["countdown_done"]);
    assert_eq!(notes[0].record.as_ref().map(|e| (e.time, e.gpus)), Some((at(31), Some(1))), "from the stop build's completion");
    assert_eq!(l.acted(false).stops_done, ["a"], "counted like a stop of its own");
    // Nothing more is read; when it runs again, the GPU time it gave back is said.
    assert!(plan(&mut l, at(40), &[], &fleet(&[], 10)).calls.is_empty());
    let mut again = idle("a", "start-2");
    again.workspace.latest_build.created_at = Some(at(91));
    again.decision.verdict = Verdict::Keep;
    let p = plan(&mut l, at(95), &[again], &fleet(&[], 10));
    let resumed = p.notes.iter().find(|n| n.event == "resumed").and_then(|n| n.record.as_ref()).and_then(|e| e.gpu_seconds_given_back);
    assert_eq!(resumed, Some(60 * 60), "one GPU from 10:31 to 11:31");
}

#[test]
fn coming_back_averts_it_and_puts_back_a_deadline_coder_did_not_bump() {
    // (Coder's deadline after the use: bumped by Coder past where it was, bumped short of it, or
    // still the countdown's; the restore: now plus its 8 h TTL, later than where it was)
    let rows = [(600, None), (90, Some(at(12 + 480))), (30, Some(at(12 + 480)))];
    for (deadline, restore) in rows {
        let mut l = counting_down();
        let p = plan(&mut l, at(12), &[used(deadline, 11)], &fleet(&[], 10));
        assert_eq!(events(&p.notes), ["countdown_averted"], "deadline {deadline}");
        assert_eq!(p.notes[0].count, Some(Count::CountdownAverted));
        assert_eq!(l.acted(false).countdowns_averted, ["a"]);
        let want: Vec<_> = restore.map(|to| ("a".to_string(), to, "countdown_restored")).into_iter().collect();
        assert_eq!(moves(&p), want, "deadline {deadline}");
        assert_eq!(stop_calls(&p), 0);
        if restore.is_some() {
            assert_eq!(audited(&l.observe(vec![ok("a")])), ["countdown_restored"]);
        }
        // Forgotten: idle again later, a new countdown starts from the next reclaim.
        let p = plan(&mut l, at(60), &[counted(Some(240))], &fleet(&[0], 10));
        assert_eq!(moves(&p), [("a".into(), at(90), "countdown_set")], "deadline {deadline}");
        assert!(l.acted(false).countdowns_averted.is_empty(), "counted once");
    }
}

#[test]
fn the_service_stops_it_itself_where_coder_cannot_count_down() {
    // Autostop off: the service's own stop at once, said once per build.
    let mut l = ledger();
    let p = plan(&mut l, at(0), &[counted(None)], &fleet(&[0], 10));
    assert_eq!((moves(&p).len(), stop_calls(&p)), (0, 1));
    assert_eq!(events(&p.notes), ["countdown_not_set"]);
    // Coder refuses the move (400 past max_deadline): remembered for the build, own stop next.
    let mut l = ledger();
    plan(&mut l, at(0), &[counted(Some(240))], &fleet(&[0], 10));
    let notes = l.observe(vec![Outcome::Extend {
        workspace_id: "a".into(),
        answer: Err(Failure { status: Some(400), text: "Cannot extend workspace beyond max deadline.".into() }),
    }]);
    assert_eq!(events(&notes), ["countdown_refused"]);
    let p = plan(&mut l, at(1), &[counted(Some(240))], &fleet(&[0], 10));
    assert_eq!((moves(&p).len(), stop_calls(&p)), (0, 1));
    // No answer (5xx): tried again, at most MAX_COUNTDOWN_FAILURES times, then its own stop.
    let mut l = ledger();
    let unclear = || Outcome::Extend { workspace_id: "a".into(), answer: Err(Failure { status: Some(503), text: "503".into() }) };
    for minute in 0..i64::from(MAX_COUNTDOWN_FAILURES) {
        let p = plan(&mut l, at(minute), &[counted(Some(240))], &fleet(&[0], 10));
        assert_eq!((moves(&p).len(), stop_calls(&p)), (1, 0), "minute {minute}");
        assert_eq!(events(&l.observe(vec![unclear()])), ["countdown_failed"]);
    }
    let p = plan(&mut l, at(9), &[counted(Some(240))], &fleet(&[0], 10));
    assert_eq!((moves(&p).len(), stop_calls(&p)), (0, 1));
}

#[test]
fn a_deadline_passed_without_coders_stop_is_the_services_own_stop() {
    let mut l = counting_down();
    // A 60 s interval: Coder has until two intervals and a minute past the deadline (10:33).
    // (minute, stop calls, notes)
    let rows: [(i64, usize, &[&str]); 4] = [(32, 0, &[]), (33, 0, &[]), (34, 1, &["countdown_expired"]), (35, 1, &[])];
    for (minute, stops, notes) in rows {
        let p = plan(&mut l, at(minute), &[counted(Some(30))], &fleet(&[0], 10));
        assert_eq!((stop_calls(&p), events(&p.notes).as_slice()), (stops, notes), "minute {minute}");
        if stops > 0 {
            refuse_stop(&mut l);
        }
    }
}

#[test]
fn a_workspace_no_longer_idle_withdraws_it_and_an_extension_is_never_doubled() {
    // The GPU computes again (extend_while_busy plans its own move this pass): nothing else.
    let mut l = counting_down();
    let mut busy = computing_again();
    let p = plan(&mut l, at(5), &[busy.clone()], &fleet(&[], 10));
    assert_eq!(events(&p.notes), ["countdown_withdrawn"]);
    assert_eq!(moves(&p), [("a".into(), at(5 + 480), "countdown_restored")], "now plus its 8 h TTL, later than 14:00");
    // Doubtful data (unknown): put back too, and the stop is never sent.
    let mut l = counting_down();
    busy.decision.verdict = Verdict::Unknown;
    let p = plan(&mut l, at(5), &[busy], &fleet(&[], 10));
    assert_eq!((moves(&p).len(), stop_calls(&p)), (1, 0));
    // Still judged idle, but the breaker holds every stop (zeros from a broken exporter): the
    // countdown is a stop too, and is withdrawn.
    let mut l = counting_down();
    let held = FleetOutcome { breaker: Some("the breaker".into()), ..FleetOutcome::default() };
    let p = plan(&mut l, at(5), &[counted(Some(30))], &held);
    assert_eq!(events(&p.notes), ["countdown_withdrawn"]);
    assert_eq!((moves(&p).len(), stop_calls(&p)), (1, 0));
}

#[test]
fn coders_own_sooner_deadline_is_left_as_it_is() {
    let mut l = ledger();
    let p = plan(&mut l, at(0), &[counted(Some(20))], &fleet(&[0], 10));
    assert!(p.calls.is_empty(), "{:?}", p.calls);
    assert_eq!(events(&p.notes), ["countdown_sooner"]);
    assert_eq!(l.acted(false).counting_down, [CountingDown { workspace_id: "a".into(), until: at(20), set: true }]);
    // Used again: nothing was moved, so nothing is put back.
    let p = plan(&mut l, at(5), &[used(20, 4)], &fleet(&[], 10));
    assert_eq!((events(&p.notes).as_slice(), p.calls.len()), (["countdown_averted"].as_slice(), 0));
}

#[test]
fn observe_mode_says_it_would_count_down_once_and_sends_nothing() {
    let mut l = observing();
    for minute in 0..3 {
        let p = plan(&mut l, at(minute), &[counted(Some(240))], &fleet(&[0], 10));
        assert!(p.calls.is_empty());
        let want: &[&str] = if minute == 0 { &["would_countdown"] } else { &[] };
        assert_eq!(audited(&p.notes), want, "minute {minute}: said once per build, and no would_stop");
        assert_eq!(l.acted(false).counting_down, [CountingDown { workspace_id: "a".into(), until: at(minute + 30), set: false }]);
    }
    // Autostop off: the would-stop of the service's own.
    let mut l = observing();
    let p = plan(&mut l, at(0), &[counted(None)], &fleet(&[0], 10));
    assert_eq!(events(&p.notes), ["would_stop"]);
}

#[test]
fn a_countdown_is_left_alone_when_coder_stops_it_otherwise() {
    let mut l = counting_down();
    plan(&mut l, at(2), &[], &fleet(&[], 10));
    let mut by_owner = stop_build("stop-by-owner", JobStatus::Succeeded);
    by_owner.initiator_id = Some("owner-id".into());
    let notes = l.observe(vec![Outcome::FollowCountdown { workspace_id: "a".into(), answer: Ok(Some(by_owner)) }]);
    assert_eq!((events(&notes).as_slice(), audited(&notes).len()), (["countdown_ended"].as_slice(), 0));
    assert!(l.acted(false).stops_done.is_empty(), "not the countdown's reclaim");
    assert!(plan(&mut l, at(3), &[], &fleet(&[], 10)).calls.is_empty(), "forgotten");
}

/// After a restart the countdown a previous run set is read back from its audit line: a return
/// still puts back the deadline it moved (on a template whose bump would not), and a countdown
/// that ended is not revived.
#[test]
fn a_countdown_of_a_previous_run_is_read_back_from_its_audit_line() {
    let line = |event: &str, minute: i64| -> crate::pass::audit::AuditRecord {
        serde_json::from_value(serde_json::json!({
            "time": at(minute), "event": event, "workspace_id": "a", "workspace": "a-name", "owner": "alice",
            "template": "gpu", "reason": "idle", "build_id": "start-1", "gpus": 1,
            "deadline_from": at(240), "deadline_to": at(30)
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let mut l = ledger();
    let found = l.recover(at(5), vec![line("countdown_set", 0)]);
    assert_eq!(found.countdowns, 1);
    let p = plan(&mut l, at(12), &[used(30, 11)], &fleet(&[], 10));
    assert_eq!(events(&p.notes), ["countdown_averted"]);
    assert_eq!(moves(&p), [("a".into(), at(12 + 480), "countdown_restored")], "put back: later of 14:00 and now + 8 h");
    // Averted before the restart, its deadline not put back yet: put back, said once.
    let mut l = ledger();
    assert_eq!(l.recover(at(5), vec![line("countdown_set", 0), line("countdown_averted", 2)]).countdowns, 1);
    let p = plan(&mut l, at(12), &[used(30, 11)], &fleet(&[], 10));
    assert_eq!((events(&p.notes).len(), moves(&p).len()), (0, 1));
    // Ended for good (put back, done, expired): nothing to follow.
    for end in ["countdown_restored", "countdown_done", "countdown_expired"] {
        let mut l = ledger();
        assert_eq!(l.recover(at(5), vec![line("countdown_set", 0), line("countdown_averted", 2), line(end, 3)]).countdowns, 0, "{end}");
        assert!(plan(&mut l, at(12), &[used(30, 11)], &fleet(&[], 10)).calls.is_empty());
    }
    // Observe mode reads nothing back.
    assert_eq!(observing().recover(at(5), vec![line("countdown_set", 0)]).countdowns, 0);
}

/// Someone moves the deadline later in Coder's dashboard (+1 h): the countdown ends there, and
/// the service's own stop comes only after that deadline, not the countdown's first one.
#[test]
fn a_deadline_moved_later_in_the_dashboard_is_the_countdowns_new_end() {
    let mut l = counting_down();
    // (minute, Coder's deadline, stop calls): +1 h at minute 10 moves the end to 11:30.
    for (minute, deadline, stops) in [(10, 90, 0), (34, 90, 0), (92, 90, 0), (94, 90, 1)] {
        let p = plan(&mut l, at(minute), &[counted(Some(deadline))], &fleet(&[0], 10));
        assert_eq!((stop_calls(&p), moves(&p).len()), (stops, 0), "minute {minute}");
        if stops > 0 {
            refuse_stop(&mut l);
        }
    }
}

/// The move's answer was lost (a timeout after Coder applied it): the next pass finds the
/// countdown's deadline and knows it as this service's, so a return still puts it back.
#[test]
fn a_move_whose_answer_was_lost_is_still_put_back() {
    let mut l = ledger();
    plan(&mut l, at(0), &[counted(Some(240))], &fleet(&[0], 10));
    l.observe(vec![Outcome::Extend { workspace_id: "a".into(), answer: Err(Failure { status: None, text: "timed out".into() }) }]);
    let p = plan(&mut l, at(1), &[counted(Some(30))], &fleet(&[0], 10));
    assert_eq!((events(&p.notes).as_slice(), p.calls.len()), (["countdown_sooner"].as_slice(), 0));
    let p = plan(&mut l, at(12), &[used(30, 11)], &fleet(&[], 10));
    assert_eq!(moves(&p), [("a".into(), at(12 + 480), "countdown_restored")]);
}

/// A countdown put back while the GPU computes again (`extend_while_busy` finds an extension
/// due): one write this pass, the put-back; the extension waits for the next pass.
#[test]
fn a_put_back_and_an_extension_are_never_both_sent_in_one_pass() {
    let mut l = counting_down();
    let mut busy = computing_again();
    busy.decision.deadline = Some(Box::new(crate::pass::deadline::DeadlinePlan {
        deadline: at(30),
        action: crate::pass::deadline::DeadlineAction::Extend { to: at(65) },
        limit: at(24 * 60),
        limited_by: crate::pass::deadline::Limit::ExtendLimit,
        evidence: crate::pass::deadline::GpuEvidence::default(),
    }));
    let extending = FleetOutcome { extend_order: vec![0], extension_slots: 10, ..FleetOutcome::default() };
    let p = plan(&mut l, at(5), &[busy], &extending);
    assert_eq!(moves(&p), [("a".into(), at(5 + 480), "countdown_restored")], "one write: {:?}", p.calls);
}

/// Coder's autostop build at a countdown's end fails: the pod keeps its GPU outside Coder's
/// running workspaces. The stop becomes the service's own, a failed one due at once, sent under
/// the guard of that failed build.
#[test]
fn a_failed_autostop_at_a_countdowns_end_becomes_the_services_own_stop() {
    let mut l = counting_down();
    plan(&mut l, at(31), &[], &fleet(&[], 10));
    let notes = l.observe(vec![Outcome::FollowCountdown { workspace_id: "a".into(), answer: Ok(Some(coders_stop(JobStatus::Failed))) }]);
    assert_eq!(events(&notes), ["countdown_stop_failed"]);
    assert!(l.acted(false).stops_done.is_empty(), "no GPU was freed");
    let p = plan(&mut l, at(32), &[], &fleet(&[], 10));
    let stops: Vec<(String, String)> = p
        .calls
        .iter()
        .filter_map(|c| match c {
            Call::Stop(s) => Some((s.event.workspace_id.clone(), s.expect_build.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(stops, [("a".to_string(), "autostop-1".to_string())]);
}

/// One waiter, one stop: Coder's stop at a countdown's end serves a waiter of its pool from the
/// pass its workspace leaves the listing past its deadline, until its GPU is on its way.
#[test]
fn coders_stop_at_a_countdowns_end_serves_one_waiter() {
    let mut l = counting_down();
    assert!(l.serving().iter().all(|n| *n == 0), "a countdown running serves nobody yet");
    plan(&mut l, at(31), &[], &fleet(&[], 10));
    assert_eq!(l.serving(), [1], "gone past its deadline: Coder is stopping it");
    l.observe(vec![Outcome::FollowCountdown { workspace_id: "a".into(), answer: Ok(Some(coders_stop(JobStatus::Pending))) }]);
    plan(&mut l, at(32), &[], &fleet(&[], 10));
    assert_eq!(l.serving(), [1], "counted once");
    // Stopped by its owner instead: nothing is on its way.
    let mut l = counting_down();
    plan(&mut l, at(31), &[], &fleet(&[], 10));
    l.observe(vec![Outcome::FollowCountdown { workspace_id: "a".into(), answer: Ok(Some(stop_build("by-owner", JobStatus::Succeeded))) }]);
    assert!(l.serving().iter().all(|n| *n == 0));
}
