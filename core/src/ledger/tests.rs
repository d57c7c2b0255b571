//! The ledger's lifecycles as tables of passes on a clock the test sets: each row is a pass (its
//! time, what the listing and the fleet rules say) and what Coder answers to the calls it plans;
//! the checks compare the calls and notes of a pass, as controller-rs compares API calls.

use chrono::{DateTime, Duration, TimeZone, Utc};

use super::*;
use crate::coder::types::{
    BuildReason, JobStatus, JobTags, MatchedProvisioners, ProvisionerJob, Transition, Workspace, WorkspaceBuild, WorkspaceStatus,
};
use crate::pass::audit::AuditRecord;
use crate::pass::deadline::{DeadlineAction, DeadlinePlan, GpuEvidence, Limit};
use crate::pass::decide::{Decision, Reason, Verdict};
use crate::pass::fleet::FleetOutcome;
use crate::pass::judge::Judged;
use crate::pass::mode::Mode;

const ME: &str = "reclaimer-user";

pub(super) fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 10, 0, 0).single().unwrap_or_default()
}

pub(super) fn at(minutes: i64) -> DateTime<Utc> {
    t0() + Duration::minutes(minutes)
}

pub(super) fn ledger() -> Ledger {
    let config = LedgerConfig {
        mode: Mode::Enforce.as_str(),
        enforce: true,
        interval: Duration::seconds(60),
        stop_timeout: Duration::minutes(10),
        start_allowance: Duration::minutes(10),
    };
    Ledger::new(config, Some(ME.into()))
}

pub(super) fn observing() -> Ledger {
    let config = LedgerConfig {
        mode: Mode::Observe.as_str(),
        enforce: false,
        interval: Duration::seconds(60),
        stop_timeout: Duration::minutes(10),
        start_allowance: Duration::minutes(10),
    };
    Ledger::new(config, Some(ME.into()))
}

pub(super) fn build(id: &str, transition: Transition, status: JobStatus) -> WorkspaceBuild {
    WorkspaceBuild {
        id: id.into(),
        created_at: Some(t0() - Duration::hours(3)),
        transition,
        status: WorkspaceStatus::Running,
        job: ProvisionerJob {
            id: format!("job-{id}").into(),
            status,
            completed_at: (status == JobStatus::Succeeded).then(|| t0() - Duration::hours(3)),
            error: None,
            canceled_at: None,
            tags: JobTags::from_pairs([("scope", "organization"), ("owner", "")]),
        },
        initiator_id: Some("owner-id".into()),
        template_version_id: Some("v1".into()),
        reason: BuildReason::Initiator,
        resources: Vec::new(),
        deadline: None,
        max_deadline: None,
        matched_provisioners: None,
    }
}

/// A stop build by this service, as Coder answers for it.
pub(super) fn stop_build(id: &str, status: JobStatus) -> WorkspaceBuild {
    let mut b = build(id, Transition::Stop, status);
    b.initiator_id = Some(ME.into());
    b.matched_provisioners =
        (status == JobStatus::Pending).then_some(MatchedProvisioners { count: 1, available: 1, most_recently_seen: None });
    b
}

pub(super) fn workspace(id: &str, start_build: &str, last_used: DateTime<Utc>) -> Workspace {
    Workspace {
        id: id.into(),
        name: format!("{id}-name"),
        owner_name: "alice".into(),
        owner_id: "owner-id".into(),
        template_name: "gpu".into(),
        template_id: "gpu-id".into(),
        organization_id: "org".into(),
        organization_name: "org".into(),
        created_at: t0() - Duration::days(1),
        last_used_at: last_used,
        latest_build: build(start_build, Transition::Start, JobStatus::Succeeded),
        ttl_ms: None,
        autostart_schedule: None,
        is_prebuild: false,
        task_id: None,
    }
}

pub(super) fn judged(ws: Workspace, verdict: Verdict, reason: Reason) -> Judged {
    let decision = Decision {
        workspace_id: ws.id.clone(),
        verdict,
        reason,
        message: format!("{} for the test", reason.as_str()),
        gpu_idle: Some(Duration::minutes(45)),
        connection_idle: Duration::minutes(45),
        stop_at: None,
        restore_ttl_ms: None,
        deadline: None,
        pool: 0,
        countdown: None,
    };
    Judged { workspace: ws, decision, gpus: 1, price: None }
}

pub(super) fn idle(id: &str, start_build: &str) -> Judged {
    judged(workspace(id, start_build, t0() - Duration::hours(1)), Verdict::Reclaim, Reason::Idle)
}

/// The fleet rules' outcome that stops `order` (indices into the listing) with `slots`.
pub(super) fn fleet(order: &[usize], slots: usize) -> FleetOutcome {
    FleetOutcome { stop_order: order.to_vec(), stop_slots: slots, ..FleetOutcome::default() }
}

/// One pass: the plan at `now` over `listed` with `fleet`.
pub(super) fn plan(ledger: &mut Ledger, now: DateTime<Utc>, listed: &[Judged], fleet: &FleetOutcome) -> Plan {
    let listed: Vec<Listed> = listed.iter().map(Listed::from).collect();
    let view =
        PassView { now, coder_offset: Duration::zero(), judged: &listed, fleet, new_warnings: &[], currency: None, shutting_down: false };
    ledger.plan(&view)
}

pub(super) fn events(notes: &[Note]) -> Vec<&'static str> {
    notes.iter().map(|n| n.event).collect()
}

pub(super) fn audited(notes: &[Note]) -> Vec<&'static str> {
    notes.iter().filter(|n| n.audit).filter_map(|n| n.record.as_ref()).map(|e| e.event.as_str()).collect()
}

fn follow(ws: &str, build: &str) -> Call {
    Call::FollowStop { workspace_id: ws.into(), build_id: build.into() }
}

fn followed(ws: &str, build: WorkspaceBuild) -> Outcome {
    Outcome::FollowStop { workspace_id: ws.into(), build_id: build.id.to_string(), answer: Ok(build) }
}

fn queued(ws: &str, build: WorkspaceBuild) -> Outcome {
    Outcome::Stop { workspace_id: ws.into(), answer: StopAnswer::Queued(Box::new(build)) }
}

fn refused(ws: &str, status: u16) -> Outcome {
    Outcome::Stop { workspace_id: ws.into(), answer: StopAnswer::Refused(Failure { status: Some(status), text: format!("{status}") }) }
}

/// The stop calls of a plan: (workspace, expected build, guarded on use).
fn stops(p: &Plan) -> Vec<(String, String, bool)> {
    p.calls
        .iter()
        .filter_map(|c| match c {
            Call::Stop(s) => Some((s.event.workspace_id.clone(), s.expect_build.clone(), s.last_used_at.is_some())),
            _ => None,
        })
        .collect()
}

fn s(ws: &str, build: &str) -> (String, String, bool) {
    (ws.into(), build.into(), true)
}

#[test]
fn a_stop_once_sent_is_only_followed_until_it_is_stopped_whatever_the_workspace_does() {
    // The user comes back while the stop is pending (its last_used_at carries coderd's flush
    // time, after the POST): the ledger has no call that would withdraw it, it follows it.
    let mut l = ledger();
    let listed = [idle("a", "start-1")];
    let p = plan(&mut l, at(0), &listed, &fleet(&[0], 10));
    assert_eq!(stops(&p), [s("a", "start-1")]);
    let notes = l.observe(vec![queued("a", stop_build("stop-1", JobStatus::Pending))]);
    assert_eq!(events(&notes), ["stop_sent"]);
    assert_eq!(audited(&notes), ["stop_sent"]);
    // (pass, the stop build's job as Coder reports it, the calls planned, the notes of the answer)
    let rows: [(i64, JobStatus, &[&str]); 4] = [
        (1, JobStatus::Pending, &[]),
        (2, JobStatus::Pending, &[]),
        (3, JobStatus::Running, &["stop_running"]),
        (4, JobStatus::Succeeded, &["stop_done"]),
    ];
    for (minute, status, want) in rows {
        // The workspace is no longer listed running (its latest build is the stop).
        let p = plan(&mut l, at(minute), &[], &fleet(&[], 10));
        assert_eq!(p.calls, [follow("a", "stop-1")], "minute {minute}: only a read of the stop build");
        let notes = l.observe(vec![followed("a", stop_build("stop-1", status))]);
        assert_eq!(events(&notes), want, "minute {minute}");
    }
    assert_eq!(l.acted(false).stops_done, ["a"]);
    assert_eq!(l.tracked_count(), 0);
    let p = plan(&mut l, at(5), &[], &fleet(&[], 10));
    assert!(p.calls.is_empty(), "{:?}", p.calls);
}

#[test]
fn a_stop_is_sent_only_if_the_fresh_read_finds_the_workspace_as_judged() {
    let mut l = ledger();
    let listed = [idle("a", "start-1")];
    let p = plan(&mut l, at(0), &listed, &fleet(&[0], 10));
    let Some(Call::Stop(call)) = p.calls.first() else { panic!("{:?}", p.calls) };
    assert_eq!((call.expect_build.as_str(), call.last_used_at), ("start-1", Some(t0() - Duration::hours(1))));
    // Used since the listing (the usage tracker flushed meanwhile): not sent, not tracked.
    let moved = StopAnswer::Moved { latest_build: "start-1".into(), last_used_at: at(0) };
    let notes = l.observe(vec![Outcome::Stop { workspace_id: "a".into(), answer: moved }]);
    assert_eq!(events(&notes), ["stop_not_sent_used"]);
    assert!(audited(&notes).is_empty(), "no stop_sending line was written: nothing to close");
    assert_eq!((l.acted(false).not_sent_used.as_slice(), l.tracked_count()), (["a".to_string()].as_slice(), 0));
    // Judged afresh next pass: still idle, so stopped then.
    let p = plan(&mut l, at(1), &listed, &fleet(&[0], 10));
    assert_eq!(stops(&p), [s("a", "start-1")]);
}

#[test]
fn a_stop_decided_while_connected_is_guarded_on_its_build_only() {
    let mut l = ledger();
    let connected = judged(workspace("c", "start-1", at(0)), Verdict::Reclaim, Reason::ConnectedButGpuIdle);
    let lifetime = judged(workspace("m", "start-2", at(0)), Verdict::Reclaim, Reason::MaxLifetime);
    let p = plan(&mut l, at(0), &[connected, lifetime, idle("i", "start-3")], &fleet(&[0, 1, 2], 10));
    assert_eq!(stops(&p), [("c".into(), "start-1".into(), false), ("m".into(), "start-2".into(), false), s("i", "start-3")]);
}

#[test]
fn a_failed_stop_backs_off_across_passes_and_is_abandoned_after_five_attempts() {
    let mut l = ledger();
    let listed = [idle("a", "start-1")];
    let order = fleet(&[0], 10);
    // (minute of the pass, whether a stop is planned then). Refused at 0 (retry at +1 min), 1
    // (+2), 3 (+4), 7 (+8); the fifth attempt at 15 is the last.
    let rows: [(i64, bool); 8] = [(0, true), (0, false), (1, true), (2, false), (3, true), (6, false), (7, true), (15, true)];
    let mut attempts = 0;
    for (minute, planned) in rows {
        let p = plan(&mut l, at(minute), &listed, &order);
        assert_eq!(!stops(&p).is_empty(), planned, "minute {minute}: {:?}", p.calls);
        let outcomes = if planned { vec![refused("a", 403)] } else { vec![] };
        let notes = l.observe(outcomes);
        if planned {
            attempts += 1;
            let want: &[&str] = if attempts < 5 { &["stop_failed", "stop_retry_scheduled"] } else { &["stop_failed", "stop_abandoned"] };
            assert_eq!(events(&notes), want, "attempt {attempts}");
        }
    }
    assert_eq!(l.acted(false).abandoned, ["a"]);
    let p = plan(&mut l, at(600), &listed, &order);
    assert!(stops(&p).is_empty(), "abandoned until its next build");
    let p = plan(&mut l, at(601), &[idle("a", "start-2")], &order);
    assert_eq!(stops(&p), [s("a", "start-2")], "a new build starts afresh");
}

#[test]
fn backoff_doubles_from_one_interval_to_thirty_minutes() {
    let interval = Duration::seconds(60);
    let got: Vec<i64> = (1..=8).map(|n| stop_backoff(interval, n).num_seconds()).collect();
    assert_eq!(got, [60, 120, 240, 480, 960, 1800, 1800, 1800]);
    assert_eq!(stop_backoff(Duration::hours(1), 3), Duration::hours(1), "never shorter than one interval");
}

#[test]
fn a_stop_build_that_fails_is_retried_for_the_unlisted_workspace_under_the_same_guard() {
    let mut l = ledger();
    let listed = [idle("a", "start-1")];
    plan(&mut l, at(0), &listed, &fleet(&[0], 10));
    l.observe(vec![queued("a", stop_build("stop-1", JobStatus::Pending))]);
    plan(&mut l, at(1), &[], &fleet(&[], 10));
    let mut failed = stop_build("stop-1", JobStatus::Failed);
    failed.job.error = Some("terraform apply: context deadline exceeded".into());
    let notes = l.observe(vec![followed("a", failed)]);
    assert_eq!(events(&notes), ["stop_failed", "stop_retry_scheduled"]);
    assert_eq!(audited(&notes), ["stop_failed"]);
    // Not listed (its latest build is our failed stop): retried after the back-off, guarded on
    // that failed build and the last use the stop was decided on.
    assert!(stops(&plan(&mut l, at(1), &[], &fleet(&[], 10))).is_empty(), "backing off");
    let p = plan(&mut l, at(3), &[], &fleet(&[], 10));
    assert_eq!(stops(&p), [s("a", "stop-1")]);
    let moved = StopAnswer::Moved { latest_build: "start-2".into(), last_used_at: at(2) };
    l.observe(vec![Outcome::Stop { workspace_id: "a".into(), answer: moved }]);
    assert_eq!(l.tracked_count(), 0, "built or used since: decided afresh");
}

#[test]
fn a_reaped_stop_is_sent_once_more_when_a_provisioner_answers_and_abandoned_if_reaped_again() {
    const REAPED: &str = "Coder: Build has been detected as pending for 30 minutes and has been terminated by the reaper.";
    let mut l = ledger();
    plan(&mut l, at(0), &[idle("a", "start-1")], &fleet(&[0], 10));
    l.observe(vec![queued("a", stop_build("stop-1", JobStatus::Pending))]);
    plan(&mut l, at(31), &[], &fleet(&[], 10));
    let mut reaped = stop_build("stop-1", JobStatus::Failed);
    reaped.job.error = Some(REAPED.into());
    reaped.job.completed_at = Some(at(30));
    assert_eq!(events(&l.observe(vec![followed("a", reaped.clone())])), ["stop_reaped"]);
    let tags = JobTags::from_pairs([("scope", "organization"), ("owner", "")]);
    let list = Call::ListProvisioners { organization: "org".into(), tags: tags.clone() };
    let p = plan(&mut l, at(32), &[], &fleet(&[], 10));
    assert_eq!(p.calls, [list]);
    let none = Outcome::ListProvisioners { organization: "org".into(), tags: tags.clone(), answer: Ok(false) };
    assert_eq!(events(&l.observe(vec![none])), ["no_provisioner"]);
    assert_eq!(l.without_provisioner().len(), 1);
    // A new stop that needs the same tags is held meanwhile.
    let p = plan(&mut l, at(33), &[idle("b", "start-9")], &fleet(&[0], 10));
    assert_eq!((stops(&p), events(&p.notes)), (vec![], vec!["stop_held"]));
    let some = Outcome::ListProvisioners { organization: "org".into(), tags: tags.clone(), answer: Ok(true) };
    l.observe(vec![some]);
    let p = plan(&mut l, at(34), &[], &fleet(&[], 10));
    assert_eq!(stops(&p), [s("a", "stop-1")], "sent once more, and only once the listing answered");
    l.observe(vec![queued("a", stop_build("stop-2", JobStatus::Pending))]);
    plan(&mut l, at(65), &[], &fleet(&[], 10));
    reaped.id = "stop-2".into();
    let notes = l.observe(vec![followed("a", reaped)]);
    assert_eq!(events(&notes), ["stop_reaped", "stop_abandoned"]);
}

#[test]
fn a_stop_a_person_canceled_is_not_sent_again_while_the_workspace_stays_idle() {
    let mut l = ledger();
    let listed = [idle("a", "start-1")];
    plan(&mut l, at(0), &listed, &fleet(&[0], 10));
    l.observe(vec![queued("a", stop_build("stop-1", JobStatus::Pending))]);
    plan(&mut l, at(1), &[], &fleet(&[], 10));
    let notes = l.observe(vec![followed("a", stop_build("stop-1", JobStatus::Canceled))]);
    assert_eq!(audited(&notes), ["stop_canceled"]);
    // A person canceled: the workspace reads canceled (not running); if it is started again the
    // new build starts afresh, while the same session stays idle nothing is sent.
    for minute in 2..10 {
        assert!(plan(&mut l, at(minute), &[], &fleet(&[], 10)).calls.is_empty());
    }
    assert!(stops(&plan(&mut l, at(10), &[idle("a", "start-2")], &fleet(&[0], 10))).len() == 1);
}

#[test]
fn a_stuck_stop_is_reported_once() {
    let mut l = ledger();
    plan(&mut l, at(0), &[idle("a", "start-1")], &fleet(&[0], 10));
    l.observe(vec![queued("a", stop_build("stop-1", JobStatus::Pending))]);
    let mut said = Vec::new();
    for minute in [5, 11, 12, 20] {
        plan(&mut l, at(minute), &[], &fleet(&[], 10));
        said.extend(events(&l.observe(vec![followed("a", stop_build("stop-1", JobStatus::Pending))])));
    }
    assert_eq!(said, ["stop_stuck"]);
    assert_eq!(l.stuck_stops().len(), 1);
}

#[test]
fn a_lost_reply_is_our_stop_when_the_latest_build_is_a_stop_by_us() {
    let mut l = ledger();
    plan(&mut l, at(0), &[idle("a", "start-1")], &fleet(&[0], 10));
    let timeout = Failure { status: None, text: "timed out".into() };
    let answer = StopAnswer::Unclear { reply: Err(timeout.clone()), latest: Some(Box::new(stop_build("stop-1", JobStatus::Pending))) };
    let notes = l.observe(vec![Outcome::Stop { workspace_id: "a".into(), answer }]);
    assert_eq!(events(&notes), ["stop_sent"]);
    assert_eq!(plan(&mut l, at(1), &[], &fleet(&[], 10)).calls, [follow("a", "stop-1")]);
    // 409 and the latest build is someone else's: another build is active, closed as not sent.
    let mut l = ledger();
    plan(&mut l, at(0), &[idle("b", "start-1")], &fleet(&[0], 10));
    let mut theirs = stop_build("stop-9", JobStatus::Running);
    theirs.initiator_id = Some("owner-id".into());
    let answer = StopAnswer::Unclear { reply: Ok("a build is active".into()), latest: Some(Box::new(theirs)) };
    let notes = l.observe(vec![Outcome::Stop { workspace_id: "b".into(), answer }]);
    assert_eq!((events(&notes), audited(&notes)), (vec!["stop_deferred"], vec!["stop_not_sent"]));
    assert_eq!(l.acted(false).build_active, ["b"]);
}

#[test]
fn observe_mode_plans_no_call_and_reports_each_would_stop_once_per_idle_episode() {
    let mut l = observing();
    let listed = [idle("a", "start-1")];
    let mut said = Vec::new();
    for minute in 0..3 {
        let p = plan(&mut l, at(minute), &listed, &fleet(&[0], 10));
        assert!(p.calls.is_empty(), "{:?}", p.calls);
        said.extend(events(&p.notes));
    }
    assert_eq!(said, ["would_stop"]);
    plan(&mut l, at(3), &listed, &fleet(&[], 10));
    assert_eq!(events(&plan(&mut l, at(4), &listed, &fleet(&[0], 10)).notes), ["would_stop"], "a new idle episode");
}

#[test]
fn shutdown_plans_no_write() {
    let mut l = ledger();
    let judged = [idle("a", "start-1")];
    let listed: Vec<Listed> = judged.iter().map(Listed::from).collect();
    let order = fleet(&[0], 10);
    let view = PassView {
        now: at(0),
        coder_offset: Duration::zero(),
        judged: &listed,
        fleet: &order,
        new_warnings: &[],
        currency: None,
        shutting_down: true,
    };
    assert!(l.plan(&view).calls.iter().all(|c| !c.writes()));
}

#[test]
fn the_stop_slots_take_the_order_first_then_due_retries() {
    let mut l = ledger();
    plan(&mut l, at(0), &[idle("r", "start-r")], &fleet(&[0], 10));
    l.observe(vec![refused("r", 500)]);
    let listed = [idle("a", "start-a"), idle("b", "start-b")];
    // The retry of `r` (unlisted, its POST refused: no failed build) is not a retry of a build.
    let p = plan(&mut l, at(5), &listed, &fleet(&[0, 1], 2));
    assert_eq!(stops(&p), [s("a", "start-a"), s("b", "start-b")]);
}

fn busy(id: &str, deadline: DateTime<Utc>, to: DateTime<Utc>) -> Judged {
    let mut j = judged(workspace(id, &format!("start-{id}"), at(-60)), Verdict::Keep, Reason::GpuActive);
    j.workspace.latest_build.deadline = Some(deadline);
    j.decision.deadline = Some(Box::new(DeadlinePlan {
        deadline,
        action: DeadlineAction::Extend { to },
        limit: at(24 * 60),
        limited_by: Limit::ExtendLimit,
        evidence: GpuEvidence::default(),
    }));
    j
}

fn extending(order: &[usize], slots: usize) -> FleetOutcome {
    FleetOutcome { extend_order: order.to_vec(), extension_slots: slots, ..FleetOutcome::default() }
}

fn extended(ws: &str, answer: Result<(), Failure>) -> Outcome {
    Outcome::Extend { workspace_id: ws.into(), answer }
}

#[test]
fn an_extension_coder_refuses_is_not_asked_again_for_the_build_and_takes_no_slot() {
    let mut l = ledger();
    // (pass, Coder's answer, the extensions planned that pass)
    let listed = [busy("a", at(20), at(60)), busy("b", at(25), at(60))];
    let p = plan(&mut l, at(0), &listed, &extending(&[0, 1], 1));
    let planned: Vec<Option<&str>> = p.calls.iter().map(Call::workspace_id).collect();
    assert_eq!(planned, [Some("a")], "one slot");
    let refusal = Failure { status: Some(400), text: "Cannot extend workspace beyond max deadline.".into() };
    assert_eq!(events(&l.observe(vec![extended("a", Err(refusal))])), ["extend_refused"]);
    let p = plan(&mut l, at(1), &listed, &extending(&[0, 1], 1));
    let planned: Vec<Option<&str>> = p.calls.iter().map(Call::workspace_id).collect();
    assert_eq!(planned, [Some("b")], "a refused for this build, b takes the slot");
    let error = Failure { status: Some(500), text: "Failed to extend workspace deadline.".into() };
    assert_eq!(events(&l.observe(vec![extended("b", Err(error))])), ["extend_failed"]);
    let p = plan(&mut l, at(2), &listed, &extending(&[0, 1], 1));
    let planned: Vec<Option<&str>> = p.calls.iter().map(Call::workspace_id).collect();
    assert_eq!(planned, [Some("b")], "a 5xx is asked again next pass, not within the pass");
}

#[test]
fn an_autostop_averted_counts_against_the_deadline_coder_reported_with_its_bumps() {
    // Completed 3 h ago with a 3 h TTL: completion + TTL is t0, but activity bumps moved Coder's
    // deadline to 10:30. The first extension (at 10:10) moves it to 11:10; the autostop it
    // averts is the one at 10:30, not at 10:00.
    let mut l = ledger();
    let mut row = busy("a", at(30), at(70));
    row.workspace.ttl_ms = Some(3 * 3_600_000);
    plan(&mut l, at(10), std::slice::from_ref(&row), &extending(&[0], 5));
    l.observe(vec![extended("a", Ok(()))]);
    // (minute, Coder's deadline as listed, averted this pass)
    let rows: [(i64, i64, bool); 4] = [(15, 70, false), (29, 70, false), (31, 70, true), (45, 70, false)];
    for (minute, deadline, want) in rows {
        let mut j = row.clone();
        j.workspace.latest_build.deadline = Some(at(deadline));
        j.decision.deadline = None;
        let p = plan(&mut l, at(minute), &[j], &extending(&[], 5));
        assert_eq!(events(&p.notes).contains(&"autostop_averted"), want, "minute {minute}");
    }
    assert_eq!(l.acted(false).autostops_averted, Vec::<String>::new(), "once per build");
    // Extended again and again on the same build: still one autostop averted.
    for minute in [60, 90, 120] {
        let again = busy("a", at(minute + 20), at(minute + 60));
        let p = plan(&mut l, at(minute), std::slice::from_ref(&again), &extending(&[0], 5));
        assert_eq!(p.calls.len(), 1, "minute {minute}: {:?}", p.calls);
        assert!(!events(&p.notes).contains(&"autostop_averted"), "minute {minute}");
        let notes = l.observe(vec![extended("a", Ok(()))]);
        assert_eq!(audited(&notes), ["deadline_extended"], "one audit line per extension");
    }
}

#[test]
fn a_stop_sending_line_without_an_outcome_is_settled_by_the_latest_build() {
    let record = |event: &str, minute: i64, build: Option<&str>| AuditRecord {
        time: at(minute),
        event: event.into(),
        workspace_id: "a".into(),
        workspace: "a-name".into(),
        owner: "alice".into(),
        template: "gpu".into(),
        reason: "idle".into(),
        message: "idle".into(),
        build_id: build.map(str::to_string),
        gpus: Some(1),
        gpu_seconds_given_back: None,
        gpu_hour_price: None,
        currency: None,
        deadline_from: None,
        deadline_to: None,
    };
    let mut l = ledger();
    let found = l.recover(
        at(5),
        vec![record("stop_sent", -60, Some("old")), record("stop_done", -59, Some("old")), record("stop_sending", 0, None)],
    );
    assert_eq!(found, Recovered { followed: 0, resumable: 0, unconfirmed: 1, countdowns: 0 }, "the latest line of a workspace wins");
    let p = plan(&mut l, at(5), &[], &fleet(&[], 10));
    assert_eq!(p.calls, [Call::Settle { workspace_id: "a".into() }]);
    let mut ours = stop_build("stop-1", JobStatus::Pending);
    ours.created_at = Some(at(0) + Duration::seconds(2));
    let notes = l.observe(vec![Outcome::Settle { workspace_id: "a".into(), answer: Ok(Some(ours)) }]);
    assert_eq!((events(&notes), audited(&notes)), (vec!["stop_found"], vec!["stop_sent"]));
    assert_eq!(plan(&mut l, at(6), &[], &fleet(&[], 10)).calls, [follow("a", "stop-1")]);
    // Nothing by this service around the POST: it was not sent.
    let mut l = ledger();
    l.recover(at(5), vec![record("stop_sending", 0, None)]);
    plan(&mut l, at(5), &[], &fleet(&[], 10));
    let theirs = build("start-2", Transition::Start, JobStatus::Succeeded);
    let notes = l.observe(vec![Outcome::Settle { workspace_id: "a".into(), answer: Ok(Some(theirs)) }]);
    assert_eq!(audited(&notes), ["stop_not_sent"]);
    // Observe mode reads nothing back: what an enforce run left stays for the next one.
    let mut o = observing();
    assert_eq!(o.recover(at(5), vec![record("stop_sending", 0, None)]), Recovered::default());
}

#[test]
fn a_stop_done_is_followed_by_its_resumed_line_with_the_gpu_time_given_back() {
    let mut l = ledger();
    plan(&mut l, at(0), &[idle("a", "start-1")], &fleet(&[0], 10));
    l.observe(vec![queued("a", stop_build("stop-1", JobStatus::Pending))]);
    plan(&mut l, at(1), &[], &fleet(&[], 10));
    let mut done = stop_build("stop-1", JobStatus::Succeeded);
    done.job.completed_at = Some(at(1));
    l.observe(vec![followed("a", done)]);
    let mut again = idle("a", "start-2");
    again.workspace.latest_build.created_at = Some(at(61));
    again.decision.verdict = Verdict::Keep;
    let p = plan(&mut l, at(62), &[again], &fleet(&[], 10));
    let resumed: Vec<Option<i64>> = p.notes.iter().filter_map(|n| n.record.as_ref()).map(|e| e.gpu_seconds_given_back).collect();
    assert_eq!(resumed, [Some(3600)], "one GPU from the stop's completion to the new start build");
}

#[test]
fn one_waiter_costs_one_stop_while_its_gpu_is_on_the_way() {
    use crate::pass::fleet::fleet_rules_serving;
    use crate::pass::policy::{Policy, ReclaimWhen};
    let policy = Policy { reclaim_when: ReclaimWhen::Contended, ..Policy::defaults(std::time::Duration::from_secs(60)) };
    let waiter = || judged(workspace("w", "start-w", at(0)), Verdict::Waiting, Reason::WaitingForGpu);
    let mut l = ledger();
    // (minute, the waiter still waits, the stop build's job, the workspaces stopped that pass).
    // Passes come every minute; the waiter's pod gets its GPU only at minute 6: until then the
    // stop already sent serves it, whatever state it is in.
    let rows: [(i64, bool, Option<JobStatus>, &[&str]); 7] = [
        (0, true, None, &["a"]),
        (1, true, Some(JobStatus::Pending), &[]),
        (2, true, Some(JobStatus::Running), &[]),
        (3, true, Some(JobStatus::Succeeded), &[]),
        (4, true, None, &[]),
        (6, false, None, &[]),
        (7, true, None, &["b"]),
    ];
    for (minute, waits, job, want) in rows {
        let mut listed: Vec<Judged> =
            ["a", "b", "c"].iter().filter(|id| minute == 0 || **id != "a").map(|id| idle(id, &format!("start-{id}"))).collect();
        for (k, j) in listed.iter_mut().enumerate() {
            j.decision.gpu_idle = Some(Duration::minutes(60 - k as i64));
        }
        if waits {
            listed.push(waiter());
        }
        let mut decisions: Vec<Decision> = listed.iter().map(|j| j.decision.clone()).collect();
        let fleet = fleet_rules_serving(&mut decisions, &policy, &l.serving());
        for (j, d) in listed.iter_mut().zip(decisions) {
            j.decision = d;
        }
        let p = plan(&mut l, at(minute), &listed, &fleet);
        let sent: Vec<String> = stops(&p).into_iter().map(|(ws, _, _)| ws).collect();
        assert_eq!(sent, want, "minute {minute}: serving {:?}", l.serving());
        let mut outcomes: Vec<Outcome> = sent.iter().map(|ws| queued(ws, stop_build(&format!("stop-{ws}"), JobStatus::Pending))).collect();
        if let Some(status) = job {
            outcomes.push(followed("a", stop_build("stop-a", status)));
        }
        l.observe(outcomes);
    }
}

#[test]
fn a_done_stop_serves_its_waiter_for_start_allowance_at_most() {
    let mut l = ledger();
    let fleet_waiting = |n: usize| FleetOutcome { pools: vec![crate::pass::fleet::PoolCounts { waiting: n, idle: 0 }], ..fleet(&[0], 10) };
    plan(&mut l, at(0), &[idle("a", "start-a")], &fleet_waiting(1));
    l.observe(vec![queued("a", stop_build("stop-a", JobStatus::Pending))]);
    plan(&mut l, at(1), &[], &fleet_waiting(1));
    l.observe(vec![followed("a", stop_build("stop-a", JobStatus::Succeeded))]);
    // (minute, serving after that pass's plan): start_allowance (10 min) after the stop succeeded
    // at minute 1, it serves nobody any more.
    for (minute, want) in [(5, vec![1]), (10, vec![1]), (11, vec![])] {
        plan(&mut l, at(minute), &[], &fleet_waiting(1));
        assert_eq!(l.serving(), want, "minute {minute}");
    }
    // A stop that fails frees no GPU: it serves nobody.
    let mut l = ledger();
    plan(&mut l, at(0), &[idle("a", "start-a")], &fleet_waiting(1));
    l.observe(vec![queued("a", stop_build("stop-a", JobStatus::Pending))]);
    assert_eq!(l.serving(), [1]);
    plan(&mut l, at(1), &[], &fleet_waiting(1));
    l.observe(vec![followed("a", stop_build("stop-a", JobStatus::Failed))]);
    assert_eq!(l.serving(), Vec::<usize>::new());
}

#[test]
fn a_stop_coder_answers_with_no_provisioner_holds_the_later_stops_of_its_tags_in_the_pass() {
    let gpu = JobTags::from_pairs([("scope", "organization"), ("gpu", "true")]);
    let x = idle("x", "start-x");
    let event = crate::pass::audit::AuditEvent::new(
        crate::pass::audit::AuditKind::StopSent,
        at(0),
        Mode::Enforce.as_str(),
        &x.workspace,
        &x.decision,
    );
    let call = |org: &str, tags: &JobTags| StopCall {
        event: event.clone(),
        expect_build: "start-x".into(),
        last_used_at: None,
        organization: org.into(),
        tags: tags.clone(),
    };
    let mut unmatched = stop_build("stop-1", JobStatus::Pending);
    unmatched.job.tags = gpu.clone();
    unmatched.matched_provisioners = Some(MatchedProvisioners { count: 1, available: 0, most_recently_seen: None });
    let first = call("org", &gpu);
    let more = JobTags::from_pairs([("scope", "organization"), ("gpu", "true"), ("zone", "a")]);
    let untagged = JobTags::from_pairs([("scope", "organization"), ("owner", "")]);
    // (the later stop's organization and tags, held)
    let rows: [(&str, &JobTags, bool); 4] = [("org", &gpu, true), ("org", &more, true), ("other", &gpu, false), ("org", &untagged, false)];
    for (org, tags, want) in rows {
        assert_eq!(call(org, tags).held_by(&first, &unmatched), want, "{org} {tags}");
    }
    let mut matched = unmatched.clone();
    matched.matched_provisioners = Some(MatchedProvisioners { count: 1, available: 1, most_recently_seen: None });
    assert!(!call("org", &gpu).held_by(&first, &matched), "a provisioner is available");
}
