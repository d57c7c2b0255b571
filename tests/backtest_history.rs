//! `backtest` on histories built by hand, each a case where reading Coder's records as they are
//! now would say what `run` would not have done (reference coder NOTES §18): a claimed prebuild's
//! past, a stop that failed and left the GPU held, an autostart inside a regret window.

use std::time::Duration;

use chrono::{DateTime, Utc};
use coder_gpu_reclaimer::coder::types::{BuildReason, JobStatus, PREBUILDS_USER_ID, Transition, Workspace, WorkspaceBuild};
use coder_gpu_reclaimer::pass::policy::Policy;
use reclaimer_core::backtest::replay::{Chunk, Replay};
use reclaimer_core::backtest::timeline::WorkspaceTimeline;

use crate::common::{idle_gpu_series, running_workspace};

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-29T18:00:00Z").unwrap().with_timezone(&Utc)
}

fn minute(m: i64) -> DateTime<Utc> {
    now() + chrono::Duration::minutes(m)
}

/// The fixture's workspace, idle for two hours, its GPU idle all along.
fn idle_workspace() -> Workspace {
    running_workspace("1c1d2e3f-0000-4000-8000-000000000001", minute(-120))
}

/// A build of `ws` at `m` minutes, by `initiator`, its job `status`.
fn build(ws: &Workspace, id: &str, transition: Transition, m: i64, status: JobStatus, initiator: &str) -> WorkspaceBuild {
    let mut b = ws.latest_build.clone();
    b.id = id.into();
    b.transition = transition;
    b.created_at = Some(minute(m));
    b.job.status = status;
    b.job.completed_at = Some(minute(m));
    b.initiator_id = Some(initiator.into());
    b.reason = BuildReason::Initiator;
    b
}

/// A replay of passes every minute from 0 to `last` over one timeline; its stops.
fn replay(timeline: WorkspaceTimeline, last: i64) -> Replay {
    let ws = timeline.record.listing(WorkspaceBuild::default());
    let series = [idle_gpu_series(&ws, now(), -180, last + 120)];
    let policy = Policy { gpu_templates: vec!["gpu-*".into()], ..Policy::defaults(Duration::from_secs(60)) };
    let mut replay = Replay::new("policy".into(), policy, Duration::from_secs(60), Duration::from_secs(3600));
    let timelines = [timeline];
    let chunk = Chunk::new(&series, &timelines, None);
    for m in 0..=last {
        let since = (m > 0).then(|| minute(m - 1));
        replay.pass(minute(m), since, &timelines, &chunk, Duration::from_secs(60), minute(last + 120));
    }
    replay
}

#[test]
fn a_claimed_prebuild_gets_no_simulated_stop_before_its_claim() {
    let ws = idle_workspace();
    let owner = ws.owner_id.clone();
    // (who started it: the prebuilds user, then claimed at minute 60; or its owner; stops before the claim)
    for (first, want) in [(PREBUILDS_USER_ID, 0), (owner.as_str(), 1)] {
        let started = build(&ws, "b1", Transition::Start, -180, JobStatus::Succeeded, first);
        let claimed = build(&ws, "b2", Transition::Start, 60, JobStatus::Succeeded, &owner);
        let r = replay(WorkspaceTimeline::new(ws.clone(), vec![started, claimed]), 50);
        assert_eq!(r.stops.len(), want, "started by {first}: {:?}", r.stops.iter().map(|s| s.at).collect::<Vec<_>>());
    }
}

#[test]
fn a_failed_stop_keeps_counting_gpu_hours_until_a_stop_succeeds() {
    let ws = idle_workspace();
    let owner = ws.owner_id.clone();
    let started = build(&ws, "b1", Transition::Start, -180, JobStatus::Succeeded, &owner);
    let failed = build(&ws, "s1", Transition::Stop, 20, JobStatus::Failed, &owner);
    let stopped = build(&ws, "s2", Transition::Stop, 40, JobStatus::Succeeded, &owner);
    let r = replay(WorkspaceTimeline::new(ws, vec![started, failed, stopped]), 0);
    let given: Vec<(i64, f64)> = r.stops.iter().map(|s| ((s.at - now()).num_minutes(), s.gpu_hours_given_back)).collect();
    assert_eq!(given.len(), 1);
    assert_eq!(given[0].0, 0);
    assert!((given[0].1 - 40.0 / 60.0).abs() < 1e-9, "the pod held its GPU through the failed stop until 40: {given:?}");
}

#[test]
fn an_autostart_within_the_regret_window_does_not_make_a_stop_regretted() {
    let ws = idle_workspace();
    let owner = ws.owner_id.clone();
    // (the start at minute 30: a schedule's, or the owner's own; regretted)
    for (reason, regretted) in [(BuildReason::Autostart, false), (BuildReason::Initiator, true)] {
        let started = build(&ws, "b1", Transition::Start, -180, JobStatus::Succeeded, &owner);
        let stopped = build(&ws, "s1", Transition::Stop, 10, JobStatus::Succeeded, &owner);
        let mut again = build(&ws, "b2", Transition::Start, 30, JobStatus::Succeeded, &owner);
        again.reason = reason;
        let r = replay(WorkspaceTimeline::new(ws.clone(), vec![started, stopped, again]), 40);
        let first = r.stops.first().unwrap();
        assert_eq!((first.at, first.regret.is_some()), (now(), regretted), "{reason:?}: {:?}", first.regret);
    }
}

/// `docs/backtest.md` documents the journal's format for people who write their own: every field
/// a line carries, and every `change`.
#[test]
fn the_journal_format_in_the_docs_names_every_field_and_change() {
    use reclaimer_core::history::{Change, JournalLine};
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/backtest.md")).unwrap();
    let table = docs.split("**The journal's format**").nth(1).unwrap().split("A `gone` line").next().unwrap();
    for change in [Change::Running, Change::Used, Change::Agent, Change::Gone] {
        let line = JournalLine {
            time: now(),
            change,
            workspace_id: "w".into(),
            owner: "alice".into(),
            workspace: "train".into(),
            template: "gpu".into(),
            last_used_at: Some(now()),
            build_id: "b".into(),
            agent: Some("connected".into()),
        };
        let value = serde_json::to_value(&line).unwrap();
        for (key, v) in value.as_object().unwrap() {
            assert!(table.contains(&format!("`{key}`")), "the field {key} is documented:\n{table}");
            if key == "change" {
                assert!(table.contains(&format!("`{}`", v.as_str().unwrap())), "the change {v} is documented");
            }
        }
    }
}
