//! The accounting of what is given back, on a scripted story with exact figures: an idle GPU,
//! its stop, the GPU given back until the workspace runs again, and a waiter that gets a GPU.

use chrono::{DateTime, Duration, Utc};
use coder_gpu_reclaimer::accounting::{Accounting, Increments};
use coder_gpu_reclaimer::coder::types::Workspace;
use coder_gpu_reclaimer::decide::{Decision, Reason, Verdict};

use crate::common::running_workspace;

const A: &str = "0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70";
const B: &str = "5d3e1f0a-2b4c-4d6e-8f10-3a5b7c9d1e2f";

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
    }
}

#[test]
fn a_scripted_story_gives_exact_figures() {
    let mut acc = Accounting::default();
    let idle_a = decision(A, Verdict::Keep, Reason::NotIdleLongEnough, Some(600));
    let waiting_b = decision(B, Verdict::Waiting, Reason::WaitingForGpu, None);
    let mut total = Increments::default();
    let mut add = |inc: Increments| {
        total.idle_gpu_seconds.extend(inc.idle_gpu_seconds);
        total.gpus_reclaimed.extend(inc.gpus_reclaimed);
        total.given_back_gpu_seconds.extend(inc.given_back_gpu_seconds);
        total.waits_ended.extend(inc.waits_ended);
    };
    // 10:00 A idle on 1 GPU, B waits; 10:01 the same.
    add(acc.pass(t(0), &[ws(A), ws(B)], &[idle_a.clone(), waiting_b.clone()], &[1, 0], &[]));
    add(acc.pass(t(60), &[ws(A), ws(B)], &[idle_a, waiting_b.clone()], &[1, 0], &[]));
    assert_eq!(acc.summary(t(60)).waiting, 1);
    assert_eq!(acc.summary(t(60)).longest_wait_seconds, 60);
    // 10:02 A's stop build completed (A is no longer listed as running).
    add(acc.pass(t(120), &[ws(B)], &[waiting_b], &[0], &[A.to_string()]));
    // 10:03 B has its GPU and computes; A's GPU has been given back for a minute.
    add(acc.pass(t(180), &[ws(B)], &[decision(B, Verdict::Keep, Reason::GpuActive, Some(0))], &[1], &[]));
    // 10:05 still: two more minutes given back.
    add(acc.pass(t(300), &[ws(B)], &[decision(B, Verdict::Keep, Reason::GpuActive, Some(0))], &[1], &[]));
    // 10:06 A runs again: giving back ends (this minute is not counted: A was listed running).
    add(acc.pass(
        t(360),
        &[ws(A), ws(B)],
        &[decision(A, Verdict::Keep, Reason::WarmingUp, None), decision(B, Verdict::Keep, Reason::GpuActive, Some(0))],
        &[1, 1],
        &[],
    ));
    add(acc.pass(
        t(420),
        &[ws(A), ws(B)],
        &[decision(A, Verdict::Keep, Reason::WarmingUp, None), decision(B, Verdict::Keep, Reason::GpuActive, Some(0))],
        &[1, 1],
        &[],
    ));

    assert_eq!(total.idle_gpu_seconds, vec![("gpu-a10g".to_string(), 60.0)], "one minute of one idle GPU");
    assert_eq!(total.gpus_reclaimed, vec![("gpu-a10g".to_string(), 1)]);
    let given: f64 = total.given_back_gpu_seconds.iter().map(|(_, s)| s).sum();
    assert_eq!(given, 60.0 + 120.0, "from the stop (10:02) until A runs again (10:06), pass by pass");
    assert_eq!(total.waits_ended, vec![180.0], "B waited from 10:00 to 10:03");
    let s = acc.summary(t(420));
    assert_eq!((s.gpu_hours_given_back_today, s.gpu_hours_given_back_7d, s.waiting), (0.05, 0.05, 0));
}

#[test]
fn a_service_that_was_down_does_not_count_the_gap() {
    let mut acc = Accounting::default();
    let idle = decision(A, Verdict::Keep, Reason::NotIdleLongEnough, Some(86_400));
    acc.pass(t(0), &[ws(A)], std::slice::from_ref(&idle), &[2], &[]);
    let inc = acc.pass(t(3600), &[ws(A)], &[idle], &[2], &[]);
    assert_eq!(inc.idle_gpu_seconds, vec![("gpu-a10g".to_string(), 600.0)], "at most 5 minutes a pass, times 2 GPUs");
}
