//! The accounting of what is given back, on a scripted story with exact figures: an idle GPU,
//! its stop, the GPU given back until the workspace runs again, and a waiter that gets a GPU.

use chrono::{DateTime, Duration, Utc};
use coder_gpu_reclaimer::coder::types::Workspace;
use coder_gpu_reclaimer::pass::accounting::{Accounting, Increments};
use coder_gpu_reclaimer::pass::decide::{Decision, Reason, Verdict};
use coder_gpu_reclaimer::pass::judge::Judged;
use reclaimer_core::ledger::Listed;

use crate::common::running_workspace;

const A: &str = "0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70";
const B: &str = "5d3e1f0a-2b4c-4d6e-8f10-3a5b7c9d1e2f";
/// Both workspaces' GPUs cost 1.20 per GPU-hour (`gpu_hour_price`).
const PRICE: Option<f64> = Some(1.2);

fn t(secs: i64) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-29T10:00:00Z").unwrap().with_timezone(&Utc) + Duration::seconds(secs)
}

fn ws(id: &str) -> Workspace {
    let mut w = running_workspace(id, t(-3600));
    w.template_name = "gpu-a10g".into();
    w
}

fn decision(id: &str, verdict: Verdict, reason: Reason, gpu_idle: Option<i64>) -> Decision {
    Decision {
        workspace_id: id.into(),
        verdict,
        reason,
        message: String::new(),
        gpu_idle: gpu_idle.map(Duration::seconds),
        connection_idle: Duration::hours(1),
        stop_at: None,
        restore_ttl_ms: None,
        deadline: None,
        pool: 0,
        countdown: None,
    }
}

/// One pass of `acc` over workspaces as the evaluation lists them (`Evaluation::listed`).
fn pass(acc: &mut Accounting, now: DateTime<Utc>, judged: &[Judged], stops_done: &[String]) -> Increments {
    acc.pass(now, &judged.iter().map(Listed::from).collect::<Vec<_>>(), stops_done)
}

/// The workspace `d` is about, judged with `gpus` GPUs at `price` per GPU-hour.
fn judged(d: &Decision, gpus: u64, price: Option<f64>) -> Judged {
    Judged { workspace: ws(&d.workspace_id), decision: d.clone(), gpus, price }
}

#[test]
fn a_scripted_story_gives_exact_figures() {
    let mut acc = Accounting::priced("EUR");
    let idle_a = decision(A, Verdict::Keep, Reason::NotIdleLongEnough, Some(600));
    let waiting_b = decision(B, Verdict::Waiting, Reason::WaitingForGpu, None);
    let mut total = Increments::default();
    let mut add = |inc: Increments| {
        total.idle_gpu_seconds.extend(inc.idle_gpu_seconds);
        total.gpus_reclaimed.extend(inc.gpus_reclaimed);
        total.given_back_gpu_seconds.extend(inc.given_back_gpu_seconds);
        total.waits_ended.extend(inc.waits_ended);
        total.idle_cost.extend(inc.idle_cost);
        total.given_back_cost.extend(inc.given_back_cost);
    };
    // 10:00 A idle on 1 GPU, B waits; 10:01 the same.
    add(pass(&mut acc, t(0), &[judged(&idle_a, 1, PRICE), judged(&waiting_b, 0, PRICE)], &[]));
    add(pass(&mut acc, t(60), &[judged(&idle_a, 1, PRICE), judged(&waiting_b, 0, PRICE)], &[]));
    assert_eq!(acc.summary(t(60)).waiting, 1);
    assert_eq!(acc.summary(t(60)).longest_wait_seconds, 60);
    // 10:02 A's stop build completed (A is no longer listed as running).
    add(pass(&mut acc, t(120), &[judged(&waiting_b, 0, PRICE)], &[A.to_string()]));
    // 10:03 B has its GPU and computes; A's GPU has been given back for a minute.
    let working_b = judged(&decision(B, Verdict::Keep, Reason::GpuActive, Some(0)), 1, PRICE);
    add(pass(&mut acc, t(180), std::slice::from_ref(&working_b), &[]));
    // 10:05 still: two more minutes given back.
    add(pass(&mut acc, t(300), std::slice::from_ref(&working_b), &[]));
    // 10:06 A runs again: giving back ends (this minute is not counted: A was listed running).
    let warming_a = judged(&decision(A, Verdict::Keep, Reason::WarmingUp, None), 1, PRICE);
    add(pass(&mut acc, t(360), &[warming_a.clone(), working_b.clone()], &[]));
    add(pass(&mut acc, t(420), &[warming_a, working_b], &[]));

    assert_eq!(total.idle_gpu_seconds, vec![("gpu-a10g".to_string(), 60.0)], "one minute of one idle GPU");
    assert_eq!(total.gpus_reclaimed, vec![("gpu-a10g".to_string(), 1)]);
    let given: f64 = total.given_back_gpu_seconds.iter().map(|(_, s)| s).sum();
    assert_eq!(given, 60.0 + 120.0, "from the stop (10:02) until A runs again (10:06), pass by pass");
    assert_eq!(total.waits_ended, vec![180.0], "B waited from 10:00 to 10:03");
    let s = acc.summary(t(420));
    assert_eq!((s.gpu_hours_given_back_today, s.gpu_hours_given_back_7d, s.waiting), (0.05, 0.05, 0));
    assert_eq!(s.gpu_hours_idle_today, 0.02, "one idle GPU-minute");
    // Money: GPU-hours times the price.
    let money = |v: &[(String, f64)]| (v.iter().map(|(_, m)| m).sum::<f64>() * 1e6).round() / 1e6;
    assert_eq!((money(&total.idle_cost), money(&total.given_back_cost)), (0.02, 0.06), "60 s and 180 s at 1.20 an hour");
    let cost = s.cost.clone().unwrap();
    assert_eq!((cost.currency.as_str(), cost.given_back_today, cost.given_back_7d, cost.idle_today), ("EUR", 0.06, 0.06, 0.02));
    // The stop, as the page lists it: when, and what it gave back until A ran again.
    assert_eq!(s.recent_stops.len(), 1);
    let r = &s.recent_stops[0];
    assert_eq!((r.workspace_id.as_str(), r.template.as_str(), r.gpus), (A, "gpu-a10g", 1));
    assert_eq!((r.stopped_at, r.resumed_at, r.gpu_hours_given_back, r.cost_given_back), (t(120), Some(t(360)), 0.05, Some(0.06)));
}

#[test]
fn without_prices_there_is_no_money() {
    let mut acc = Accounting::default();
    let idle = decision(A, Verdict::Keep, Reason::NotIdleLongEnough, Some(600));
    let idle = [judged(&idle, 1, None)];
    pass(&mut acc, t(0), &idle, &[]);
    let inc = pass(&mut acc, t(60), &idle, &[]);
    assert!(inc.idle_cost.is_empty() && acc.summary(t(60)).cost.is_none());
}

#[test]
fn a_service_that_was_down_does_not_count_the_gap() {
    let mut acc = Accounting::default();
    let idle = decision(A, Verdict::Keep, Reason::NotIdleLongEnough, Some(86_400));
    let idle = [judged(&idle, 2, PRICE)];
    pass(&mut acc, t(0), &idle, &[]);
    let inc = pass(&mut acc, t(3600), &idle, &[]);
    assert_eq!(inc.idle_gpu_seconds, vec![("gpu-a10g".to_string(), 600.0)], "at most 5 minutes a pass, times 2 GPUs");
}

/// A stop takes several passes (queued, running) during which the workspace is not listed as
/// running: its completion is still counted, with the GPUs it held.
#[test]
fn a_stop_that_completes_passes_later_is_counted() {
    let mut acc = Accounting::default();
    let idle = decision(A, Verdict::Reclaim, Reason::Idle, Some(3600));
    pass(&mut acc, t(0), &[judged(&idle, 2, None)], &[]);
    for m in 1..5 {
        pass(&mut acc, t(60 * m), &[], &[]); // stopping: not listed
    }
    let inc = pass(&mut acc, t(300), &[], &[A.to_string()]);
    assert_eq!(inc.gpus_reclaimed, vec![("gpu-a10g".to_string(), 2)]);
    assert_eq!(acc.summary(t(300)).recent_stops.len(), 1);
}

/// A workspace seen pass after pass is kept as last seen: renamed, given another owner name or
/// template, or more GPUs between passes, its stop is recorded with the latest of each.
#[test]
fn a_stop_is_recorded_with_what_the_workspace_was_last_seen_as() {
    let mut acc = Accounting::default();
    let idle = decision(A, Verdict::Reclaim, Reason::Idle, Some(3600));
    pass(&mut acc, t(0), &[judged(&idle, 1, None)], &[]);
    let mut renamed = judged(&idle, 2, None);
    renamed.workspace.name = "renamed".into();
    renamed.workspace.owner_name = "bob".into();
    renamed.workspace.template_name = "gpu-h100".into();
    pass(&mut acc, t(60), &[renamed], &[]);
    let inc = pass(&mut acc, t(120), &[], &[A.to_string()]);
    assert_eq!(inc.gpus_reclaimed, vec![("gpu-h100".to_string(), 2)]);
    let s = acc.summary(t(120));
    let r = &s.recent_stops[0];
    assert_eq!((r.workspace.as_str(), r.owner.as_str(), r.template.as_str(), r.gpus), ("renamed", "bob", "gpu-h100", 2));
}
