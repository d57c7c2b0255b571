//! The decision rules, table-tested with the seed's real numbers (FINDINGS stage 2: A10G,
//! 120 s per load), plus the fleet rules and a property: activity within `idle_after` is never
//! reclaimed.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use coder_gpu_reclaimer::coder::types::{JobStatus, TemplateSchedule, Transition, Workspace};
use coder_gpu_reclaimer::gpu::signals::{Signal, SignalValues};
use coder_gpu_reclaimer::gpu::window::{GpuSample, GpuWindow};
use coder_gpu_reclaimer::gpu::{Attribution, GpuKey};
use coder_gpu_reclaimer::pass::deadline::{DeadlineAction, Limit};
use coder_gpu_reclaimer::pass::decide::{Decision, PassFacts, Reason, Verdict, decide, decide_with};
use coder_gpu_reclaimer::pass::fleet::apply_fleet_rules;
use coder_gpu_reclaimer::pass::policy::{Policy, ReclaimWhen, Rule};
use proptest::prelude::*;

use crate::common::{WS_ID, pending_workspace, running_workspace};

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-29T10:00:00Z").unwrap().with_timezone(&Utc)
}

fn mins(m: i64) -> Duration {
    Duration::minutes(m)
}

/// Which fields the exporter reports (profiling fields are absent on some GPUs).
#[derive(Clone, Copy, Debug)]
enum Fields {
    All,
    NoSm,
    UtilOnly,
}

/// The seed's stage-2 loads: (utilization %, framebuffer MiB, power W, GR_ENGINE, SM_ACTIVE).
const NOTHING: (f64, f64, f64, f64, f64) = (0.0, 0.0, 24.3, 0.0, 0.0);
const MEMORY_ONLY: (f64, f64, f64, f64, f64) = (0.0, 19_376.0, 89.1, 0.0, 0.0);
const ONE_THREAD: (f64, f64, f64, f64, f64) = (100.0, 302.0, 90.0, 1.0, 0.012);
const MATMUL: (f64, f64, f64, f64, f64) = (100.0, 850.0, 299.2, 1.0, 0.984);
/// Stage 1's phantom: 100% utilization on an empty framebuffer (injected metrics, no profiling).
const PHANTOM: (f64, f64, f64, f64, f64) = (100.0, 0.0, 24.3, 0.0, 0.0);

fn values(load: (f64, f64, f64, f64, f64), fields: Fields) -> SignalValues {
    let (util, fb, power, gr, sm) = load;
    let mut v = SignalValues::default().with(Signal::GpuUtil, util / 100.0).with(Signal::FbUsedMib, fb).with(Signal::PowerWatts, power);
    if !matches!(fields, Fields::UtilOnly) {
        v.set(Signal::GrEngineActive, gr);
    }
    if matches!(fields, Fields::All) {
        v.set(Signal::SmActive, sm);
    }
    v
}

/// One GPU sampled every minute from `from_min` minutes ago until now.
fn gpu(points: impl IntoIterator<Item = (i64, SignalValues)>) -> Vec<GpuWindow> {
    let key = GpuKey {
        uuid: "GPU-585834da-1c2b-4d5e-8f90-a1b2c3d4e5f6".into(),
        gpu_instance: None,
        pod: Some(format!("coder-{WS_ID}-7d9f8b6c5d-x2x9k")),
    };
    let mut w = GpuWindow::new(key.clone(), Arc::from("http://10.0.0.7:9400/metrics"));
    for (secs_ago, v) in points {
        w.push(GpuSample { at: now() - Duration::seconds(secs_ago), values: v });
    }
    vec![w]
}

fn steady(load: (f64, f64, f64, f64, f64), fields: Fields, minutes: i64) -> Vec<GpuWindow> {
    gpu((0..=minutes).rev().map(|m| (m * 60, values(load, fields))))
}

fn policy() -> Policy {
    Policy::defaults(StdDuration::from_secs(60))
}

fn ws(last_used_ago: Duration) -> Workspace {
    running_workspace(WS_ID, now() - last_used_ago)
}

fn judge(w: &Workspace, g: &[GpuWindow], p: &Policy) -> Decision {
    decide(now(), w, Some(g), p, None)
}

#[test]
fn the_four_stage_2_loads() {
    let p = policy();
    let away = ws(mins(40));
    let cases = [
        ("nothing running", NOTHING, Fields::All, Verdict::Reclaim, Reason::Idle),
        ("holds memory, waits", MEMORY_ONLY, Fields::All, Verdict::Reclaim, Reason::MemoryHeldIdle),
        ("one-thread kernel, SM_ACTIVE present", ONE_THREAD, Fields::All, Verdict::Reclaim, Reason::PhantomUtilization),
        ("one-thread kernel, only GR_ENGINE", ONE_THREAD, Fields::NoSm, Verdict::Keep, Reason::GpuActive),
        ("one-thread kernel, only utilization", ONE_THREAD, Fields::UtilOnly, Verdict::Keep, Reason::GpuActive),
        ("large matmul", MATMUL, Fields::All, Verdict::Keep, Reason::GpuActive),
        ("large matmul, only utilization", MATMUL, Fields::UtilOnly, Verdict::Keep, Reason::GpuActive),
        ("nothing running, only utilization", NOTHING, Fields::UtilOnly, Verdict::Reclaim, Reason::Idle),
        ("memory held, only utilization", MEMORY_ONLY, Fields::UtilOnly, Verdict::Reclaim, Reason::MemoryHeldIdle),
        ("stage 1 phantom: 100% on empty memory", PHANTOM, Fields::UtilOnly, Verdict::Reclaim, Reason::PhantomUtilization),
    ];
    for (name, load, fields, verdict, reason) in cases {
        let d = judge(&away, &steady(load, fields, 40), &p);
        assert_eq!((d.verdict, d.reason), (verdict, reason), "{name}: {}", d.message);
    }
    let d = judge(&away, &steady(MEMORY_ONLY, Fields::All, 40), &p);
    assert_eq!(d.message, "GPU memory held, no compute 40m, no connection for 40m");
    assert_eq!(d.gpu_idle, Some(mins(40)));
}

#[test]
fn stage_1_scenarios() {
    let p = policy();
    // 2: no connection, zero metrics -> reclaimed.
    assert_eq!(judge(&ws(mins(35)), &steady(NOTHING, Fields::UtilOnly, 35), &p).verdict, Verdict::Reclaim);
    // 3: phantom (100% utilization, empty memory) -> reclaimed.
    assert_eq!(judge(&ws(mins(35)), &steady(PHANTOM, Fields::UtilOnly, 35), &p).reason, Reason::PhantomUtilization);
    // 5: only a browser tab open (last_used_at refreshed a minute ago), metrics zero -> kept...
    let d = judge(&ws(Duration::seconds(60)), &steady(NOTHING, Fields::All, 35), &p);
    assert_eq!((d.verdict, d.reason), (Verdict::Keep, Reason::Connected));
    // ...and reclaimed once the tab has been closed for the threshold.
    assert_eq!(judge(&ws(mins(30)), &steady(NOTHING, Fields::All, 35), &p).verdict, Verdict::Reclaim);
}

#[test]
fn stage_3_scenarios() {
    let p = policy();
    // 1: build succeeded, agent never connected (timeout): the pod is Pending.
    let d = decide(now(), &pending_workspace(WS_ID), None, &p, None);
    assert_eq!((d.verdict, d.reason), (Verdict::Waiting, Reason::WaitingForGpu));
    // 6: last_used_at stopped refreshing about 80 s after the disconnect: the clock runs from
    // the last refresh, not from the disconnect.
    let g = steady(NOTHING, Fields::All, 40);
    assert_eq!(judge(&ws(mins(30) - Duration::seconds(1)), &g, &p).reason, Reason::Connected);
    assert_eq!(judge(&ws(mins(30)), &g, &p).verdict, Verdict::Reclaim);
    // 7: the user extended the deadline far ahead, or switched autostop off: still reclaimed.
    let mut extended = ws(mins(40));
    extended.latest_build.deadline = Some(now() + Duration::hours(10));
    assert_eq!(judge(&extended, &g, &p).verdict, Verdict::Reclaim);
    let mut autostop_off = ws(mins(40));
    autostop_off.ttl_ms = None;
    autostop_off.latest_build.deadline = None;
    assert_eq!(judge(&autostop_off, &g, &p).verdict, Verdict::Reclaim);
}

#[test]
fn missing_or_doubtful_data_never_reclaims() {
    let p = policy();
    let away = ws(mins(60));
    let idle = |secs_ago: i64| (secs_ago, values(NOTHING, Fields::All));
    let cases: Vec<(&str, Vec<GpuWindow>, Reason)> = vec![
        ("a 10-minute hole in the samples", gpu((0..=40).rev().filter(|m| !(10..20).contains(m)).map(|m| idle(m * 60))), Reason::SampleGap),
        ("the newest sample is 5 minutes old", gpu((5..=40).rev().map(|m| idle(m * 60))), Reason::StaleData),
        ("two samples only", gpu([idle(60), idle(0)]), Reason::NoGpuData),
        (
            "utilization 100% while GR_ENGINE reads 0 (profiling stuck)",
            gpu((0..=40).rev().map(|m| (m * 60, values((100.0, 300.0, 90.0, 0.0, 0.0), Fields::NoSm)))),
            Reason::MetricsDisagree,
        ),
        (
            "power only, no compute signal",
            gpu((0..=40).rev().map(|m| (m * 60, SignalValues::default().with(Signal::PowerWatts, 24.3)))),
            Reason::NoGpuData,
        ),
    ];
    for (name, g, reason) in cases {
        let d = judge(&away, &g, &p);
        assert_eq!((d.verdict, d.reason), (Verdict::Unknown, reason), "{name}: {}", d.message);
    }
    let mut failed = steady(NOTHING, Fields::All, 40);
    failed.iter_mut().for_each(|w| w.source_failed = true);
    assert_eq!(judge(&away, &failed, &p).reason, Reason::StaleData, "its exporter failed this pass");
    // No series at all: skipped, unless the template is a GPU template, then unknown.
    let d = decide(now(), &away, None, &p, None);
    assert_eq!((d.verdict, d.reason), (Verdict::Skip, Reason::NoGpu));
    let gpu_templates = Policy { gpu_templates: vec!["gpu-*".into()], ..policy() };
    let d = decide(now(), &away, None, &gpu_templates, None);
    assert_eq!((d.verdict, d.reason), (Verdict::Unknown, Reason::NoGpuData));
}

#[test]
fn a_restart_or_new_workspace_warms_up_before_judging() {
    let d = judge(&ws(mins(60)), &steady(NOTHING, Fields::All, 10), &policy());
    assert_eq!((d.verdict, d.reason), (Verdict::Keep, Reason::WarmingUp), "{}", d.message);
    let recently_active = gpu((0..=40).rev().map(|m| (m * 60, values(if m == 12 { MATMUL } else { NOTHING }, Fields::All))));
    let d = judge(&ws(mins(60)), &recently_active, &policy());
    assert_eq!((d.verdict, d.reason), (Verdict::Keep, Reason::NotIdleLongEnough));
    assert_eq!(d.gpu_idle, Some(mins(11)));
}

#[test]
fn build_states_and_rules() {
    let p = policy();
    let g = steady(NOTHING, Fields::All, 40);
    let mut stopping = ws(mins(40));
    stopping.latest_build.transition = Transition::Stop;
    stopping.latest_build.job.status = JobStatus::Running;
    assert_eq!(judge(&stopping, &g, &p).reason, Reason::BuildActive);
    stopping.latest_build.job.status = JobStatus::Succeeded;
    assert_eq!(judge(&stopping, &g, &p).reason, Reason::NotRunning);
    let mut failed_start = ws(mins(40));
    failed_start.latest_build.job.status = JobStatus::Failed;
    assert_eq!(judge(&failed_start, &g, &p).reason, Reason::NotRunning);

    let rules = |r: Vec<Rule>| Policy { rules: r, ..policy() };
    let exempt = rules(vec![
        Rule { owner: Some("nobody".into()), exempt: true, ..Rule::default() },
        Rule { template: Some("gpu-*".into()), exempt: true, ..Rule::default() },
    ]);
    assert_eq!(judge(&ws(mins(40)), &g, &exempt).reason, Reason::Excluded);
    let first_match_wins = rules(vec![
        Rule { workspace: Some("alice-*".into()), idle_after: Some(StdDuration::from_secs(7200)), ..Rule::default() },
        Rule { template: Some("gpu-*".into()), exempt: true, ..Rule::default() },
    ]);
    let d = judge(&ws(mins(40)), &steady(NOTHING, Fields::All, 130), &first_match_wins);
    assert_eq!((d.verdict, d.reason), (Verdict::Keep, Reason::Connected), "a 2h idle_after for alice-*: {}", d.message);
}

#[test]
fn grace_warns_first_and_activity_cancels() {
    let p = Policy {
        thresholds: coder_gpu_reclaimer::pass::policy::Thresholds { grace: StdDuration::from_secs(600), ..policy().thresholds },
        ..policy()
    };
    let g = steady(NOTHING, Fields::All, 40);
    let w = ws(mins(40));
    let first = decide(now(), &w, Some(&g), &p, None);
    assert_eq!((first.verdict, first.stop_at), (Verdict::Warn, Some(now() + mins(10))));
    assert!(
        !first.message.contains("stop"),
        "the decision promises nothing; the mode-aware layers phrase the countdown: {}",
        first.message
    );
    let still = decide(now(), &w, Some(&g), &p, Some(now() + mins(3)));
    assert_eq!((still.verdict, still.stop_at), (Verdict::Warn, Some(now() + mins(3))), "the stop time does not move");
    let due = decide(now(), &w, Some(&g), &p, Some(now() - Duration::seconds(1)));
    assert_eq!(due.verdict, Verdict::Reclaim);
    let active = decide(now(), &w, Some(&steady(MATMUL, Fields::All, 40)), &p, Some(now() - Duration::seconds(1)));
    assert_eq!(active.verdict, Verdict::Keep, "activity during grace cancels");
}

#[test]
fn max_lifetime_and_connected_idle_after() {
    let t = |f: &dyn Fn(&mut coder_gpu_reclaimer::pass::policy::Thresholds)| {
        let mut p = policy();
        f(&mut p.thresholds);
        p
    };
    let mut old = ws(Duration::seconds(30));
    old.latest_build.job.completed_at = Some(now() - Duration::hours(25));
    let lifetime = t(&|th| th.max_lifetime = Some(StdDuration::from_secs(24 * 3600)));
    let d = judge(&old, &steady(NOTHING, Fields::All, 5), &lifetime);
    assert_eq!((d.verdict, d.reason), (Verdict::Reclaim, Reason::MaxLifetime), "{}", d.message);
    assert_eq!(judge(&old, &steady(MATMUL, Fields::All, 5), &lifetime).verdict, Verdict::Keep, "unless computing now");

    let tab = t(&|th| th.connected_idle_after = Some(StdDuration::from_secs(3600)));
    let connected = ws(Duration::seconds(45));
    assert_eq!(judge(&connected, &steady(NOTHING, Fields::All, 50), &tab).reason, Reason::Connected);
    let d = judge(&connected, &steady(NOTHING, Fields::All, 70), &tab);
    assert_eq!((d.verdict, d.reason), (Verdict::Reclaim, Reason::ConnectedButGpuIdle), "{}", d.message);
}

#[test]
fn restore_autostop_reports_the_ttl_to_set_back() {
    let p = Policy { restore_autostop: Some(StdDuration::from_secs(8 * 3600)), ..policy() };
    let g = steady(MATMUL, Fields::All, 40);
    let mut off = ws(mins(1));
    off.ttl_ms = None;
    assert_eq!(judge(&off, &g, &p).restore_ttl_ms, Some(8 * 3_600_000));
    let mut long = ws(mins(1));
    long.ttl_ms = Some(48 * 3_600_000);
    assert_eq!(judge(&long, &g, &p).restore_ttl_ms, Some(8 * 3_600_000));
    let mut fine = ws(mins(1));
    fine.ttl_ms = Some(3_600_000);
    assert_eq!(judge(&fine, &g, &p).restore_ttl_ms, None);
}

fn fleet(idles: &[i64], waiting: usize, p: &Policy) -> (Vec<Decision>, coder_gpu_reclaimer::pass::fleet::FleetOutcome) {
    let mut ds: Vec<Decision> = idles
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let id = format!("0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d{i:02}");
            let w = running_workspace(&id, now() - mins(*m));
            decide(now(), &w, Some(&steady(NOTHING, Fields::All, *m)), p, None)
        })
        .collect();
    for i in 0..waiting {
        ds.push(decide(now(), &pending_workspace(&format!("5d1e2f3a-4b5c-4d6e-8f7a-9b0c1d2e3f{i:02}")), None, p, None));
    }
    let out = apply_fleet_rules(&mut ds, p);
    (ds, out)
}

#[test]
fn contention_reclaims_only_as_many_as_wait_longest_idle_first() {
    let p = Policy { reclaim_when: ReclaimWhen::Contended, max_idle_fraction: 1.0, ..policy() };
    let (ds, out) = fleet(&[40, 55], 1, &p);
    assert_eq!(out.waiting, 1);
    assert_eq!(out.stop_order, vec![1], "the 55-minute idle one");
    assert_eq!((ds[0].verdict, ds[0].reason), (Verdict::Keep, Reason::NoContention));
    let (_, out) = fleet(&[40, 55], 0, &p);
    assert!(out.stop_order.is_empty(), "nobody waits: nothing is reclaimed");
}

#[test]
fn the_cap_and_the_breaker() {
    let p = Policy { max_stops_per_pass: 2, ..policy() };
    // 3 of 8 GPU workspaces idle: under the breaker's 50%, over the cap of 2.
    let mut idles = vec![40, 70, 55];
    idles.extend([0; 5]);
    let (_, out) = fleet(&idles, 0, &p);
    assert_eq!(out.stop_order, vec![1, 2], "longest idle first");
    assert_eq!((out.stop_slots, out.deferred, out.breaker.is_none()), (2, 1, true), "two stop slots, one reclaim deferred");
    // 4 of 5 idle at once: a broken exporter reads as zeros. Nothing is stopped.
    let (ds, out) = fleet(&[40, 41, 42, 43, 0], 0, &policy());
    assert_eq!(ds.iter().filter(|d| d.verdict == Verdict::Reclaim).count(), 4);
    assert!(out.stop_order.is_empty() && out.stop_slots == 0, "no stop build, not even a retry");
    assert!(out.breaker.as_deref().unwrap().starts_with("4 of 5 GPU workspaces are reclaimable at once"));
    // Fewer than 4 GPU workspaces: the breaker does not apply.
    let (_, out) = fleet(&[40, 41, 42], 0, &policy());
    assert_eq!(out.stop_order.len(), 3);
}

fn any_load() -> impl Strategy<Value = SignalValues> {
    let load = prop_oneof![Just(NOTHING), Just(MEMORY_ONLY), Just(ONE_THREAD), Just(MATMUL), Just(PHANTOM)];
    let fields = prop_oneof![Just(Fields::All), Just(Fields::NoSm), Just(Fields::UtilOnly)];
    (load, fields).prop_map(|(l, f)| values(l, f))
}

proptest! {
    /// With any samples, any connection age, any grace and prior warning: a compute-active
    /// sample (a matmul) within `idle_after` means the verdict is not reclaim. (`max_lifetime`
    /// is the one rule that overrides this by design, when the GPU is not active now.)
    #[test]
    fn activity_within_idle_after_is_never_reclaimed(
        loads in proptest::collection::vec(any_load(), 1..80),
        gaps in proptest::collection::vec(20i64..200, 80),
        active_at in 0usize..80,
        last_used_min in 0i64..300,
        idle_after_min in 1i64..120,
        grace_min in 0u64..3,
        warned in any::<bool>(),
        tab_min in proptest::option::of(0u64..240),
    ) {
        let mut samples = loads.clone();
        let active_index = active_at % samples.len();
        samples[active_index] = values(MATMUL, Fields::All);
        let mut at = 0i64;
        let mut points = Vec::new();
        for (i, v) in samples.iter().enumerate().rev() {
            points.push((at, *v, i == active_index));
            at += gaps[i % gaps.len()];
        }
        let active_ago = points.iter().find(|p| p.2).map(|p| p.0).unwrap_or(0);
        prop_assume!(active_ago < idle_after_min * 60);
        let mut p = policy();
        p.thresholds.idle_after = StdDuration::from_secs(idle_after_min as u64 * 60);
        p.thresholds.grace = StdDuration::from_secs(grace_min * 60);
        p.thresholds.connected_idle_after = tab_min.map(|m| p.thresholds.idle_after + StdDuration::from_secs(m * 60));
        let g = gpu(points.iter().rev().map(|(ago, v, _)| (*ago, *v)));
        let prior = warned.then(|| now() - Duration::seconds(1));
        let d = decide(now(), &ws(mins(last_used_min)), Some(&g), &p, prior);
        prop_assert_ne!(d.verdict, Verdict::Reclaim, "{}", d.message);
    }
}

/// `pending_workspace` whose agent was created `ago` and whose template says
/// `connection_timeout` (seconds).
fn starting_workspace(ago: Duration, connection_timeout: i64) -> Workspace {
    crate::common::never_connected_workspace(now() - ago, connection_timeout, ago.num_seconds() > connection_timeout)
}

#[test]
fn a_pod_that_reports_a_gpu_is_never_waiting_but_judged_by_its_gpu() {
    // Past the start-up allowance, a never-connected agent whose pod still reports a fresh GPU
    // (an image that never pulls, a crash-looping entrypoint: kubelet keeps the device) is no
    // demand: it holds a GPU, and an idle one is given back like any other (reference NOTES §16).
    let mut w = starting_workspace(mins(35), 120);
    w.last_used_at = now() - mins(40);
    let d = decide(now(), &w, Some(&steady(NOTHING, Fields::All, 40)), &policy(), None);
    assert_eq!((d.verdict, d.reason), (Verdict::Reclaim, Reason::Idle), "{}", d.message);
    let want = "its agent never connected, but its pod holds a GPU past start_allowance; GPU idle 40m, no connection for 35m";
    assert!(d.message.starts_with(want), "idle since its pod was created, not since the last session: {}", d.message);
    // A long image pull is not stopped for the last session's idleness.
    let mut pulling = starting_workspace(mins(15), 120);
    pulling.last_used_at = now() - mins(40);
    let d = decide(now(), &pulling, Some(&steady(NOTHING, Fields::All, 40)), &policy(), None);
    assert_eq!((d.verdict, d.reason), (Verdict::Keep, Reason::Connected), "{}", d.message);
    // A series that stopped is no GPU: that pod waits.
    let stopped = gpu((10..=40).rev().map(|m| (m * 60, values(NOTHING, Fields::All))));
    let d = decide(now(), &w, Some(&stopped), &policy(), None);
    assert_eq!((d.verdict, d.reason), (Verdict::Waiting, Reason::WaitingForGpu), "{}", d.message);
}

/// Every start passes through agent `connecting` (image pull, container start), and the pod
/// has its GPU from admission on (reference NOTES §15): starting is not waiting.
#[test]
fn starting_is_not_waiting() {
    let p = policy(); // start_allowance 10m
    let fresh = steady(MATMUL, Fields::All, 3);
    // The pod's series stopped 10 minutes ago (stale_after is 2 minutes): not this start's GPU.
    let stale = gpu((10..=13).rev().map(|m| (m * 60, values(NOTHING, Fields::All))));
    // (what, agent created ago, connection timeout, GPU series, verdict, reason)
    type Case<'a> = (&'a str, Duration, i64, &'a [GpuWindow], Verdict, Reason);
    let cases: [Case; 7] = [
        ("3 minutes in, its GPU reports", mins(3), 120, &fresh, Verdict::Keep, Reason::Starting),
        ("9 minutes in: Coder says timeout, still within the allowance", mins(9), 120, &fresh, Verdict::Keep, Reason::Starting),
        ("11 minutes in: past the allowance, judged by its GPU", mins(11), 120, &fresh, Verdict::Keep, Reason::GpuActive),
        ("11 minutes in, the agent may take 30", mins(11), 1800, &fresh, Verdict::Keep, Reason::Starting),
        ("3 minutes in, no GPU series: Pending", mins(3), 120, &[], Verdict::Waiting, Reason::WaitingForGpu),
        ("3 minutes in, only a stale series", mins(3), 120, &stale, Verdict::Waiting, Reason::WaitingForGpu),
        ("just created (Coder's clock a little ahead)", Duration::seconds(-5), 120, &fresh, Verdict::Keep, Reason::Starting),
    ];
    for (what, ago, timeout, g, verdict, reason) in cases {
        let d = decide(now(), &starting_workspace(ago, timeout), Some(g), &p, None);
        assert_eq!((d.verdict, d.reason), (verdict, reason), "{what}: {}", d.message);
    }
    // In contended mode a start that has its GPU is no demand: the idle one stays.
    let p = Policy { reclaim_when: ReclaimWhen::Contended, ..policy() };
    let idle = ws(mins(40));
    let mut ds = vec![
        decide(now(), &idle, Some(&steady(NOTHING, Fields::All, 40)), &p, None),
        decide(now(), &starting_workspace(mins(2), 120), Some(&fresh), &p, None),
    ];
    let out = apply_fleet_rules(&mut ds, &p);
    assert_eq!((out.waiting, out.stop_order.len(), ds[0].reason), (0, 0, Reason::NoContention));
}

/// An agent that lost its pod for good (a bare pod after an eviction, a lost node) stays
/// `disconnected` forever (reference NOTES §15): after `agent_lost_after` it is no demand.
#[test]
fn an_agent_lost_for_good_stops_counting_as_demand() {
    use coder_gpu_reclaimer::coder::types::AgentStatus;
    let p = Policy { reclaim_when: ReclaimWhen::Contended, ..policy() }; // agent_lost_after 1h
    let lost = |ago: Duration| {
        let mut w = ws(mins(90));
        for a in w.latest_build.resources.iter_mut().flat_map(|r| r.agents.iter_mut()) {
            a.status = AgentStatus::Disconnected;
            a.first_connected_at = Some(now() - Duration::hours(3));
            a.last_connected_at = Some(now() - ago);
            a.disconnected_at = Some(now() - ago);
        }
        w
    };
    let idle = steady(NOTHING, Fields::All, 40);
    for (what, ago, g, verdict, reason) in [
        ("evicted 20 minutes ago, waits for a GPU", mins(20), &[][..], Verdict::Waiting, Reason::WaitingForGpu),
        ("gone for 61 minutes", mins(61), &[][..], Verdict::Unknown, Reason::AgentLost),
        ("gone for a day", Duration::hours(24), &[][..], Verdict::Unknown, Reason::AgentLost),
        ("disconnected long, but its GPU still reports: judged by the GPU", mins(61), &idle[..], Verdict::Reclaim, Reason::Idle),
    ] {
        let d = judge(&lost(ago), g, &p);
        assert_eq!((d.verdict, d.reason), (verdict, reason), "{what}: {}", d.message);
    }
    let mut ds = vec![decide(now(), &ws(mins(40)), Some(&idle), &p, None), decide(now(), &lost(mins(61)), None, &p, None)];
    let out = apply_fleet_rules(&mut ds, &p);
    assert_eq!((out.waiting, ds[0].reason), (0, Reason::NoContention), "a lost agent is no demand");
    let mut ds = vec![decide(now(), &ws(mins(40)), Some(&idle), &p, None), decide(now(), &lost(mins(20)), None, &p, None)];
    assert_eq!(apply_fleet_rules(&mut ds, &p).stop_order, vec![0], "a recent eviction is demand");
}

/// Permissions are per organization (reference NOTES §15): a workspace the token may not stop
/// is not judged, but a waiting one is still demand, wherever it is.
#[test]
fn no_stop_permission_skips_but_demand_counts_everywhere() {
    use coder_gpu_reclaimer::pass::decide::without_stop_permission;
    let p = Policy { reclaim_when: ReclaimWhen::Contended, restore_autostop: Some(StdDuration::from_secs(3600)), ..policy() };
    let idle = steady(NOTHING, Fields::All, 40);
    let mut stoppable = decide(now(), &ws(mins(40)), Some(&idle), &p, None);
    let mut forbidden = decide(now(), &ws(mins(40)), Some(&idle), &p, None);
    assert_eq!(forbidden.verdict, Verdict::Reclaim);
    without_stop_permission(&mut forbidden, "research");
    assert_eq!((forbidden.verdict, forbidden.reason, forbidden.restore_ttl_ms), (Verdict::Skip, Reason::NoPermission, None));
    assert!(forbidden.message.contains("\"research\"") && forbidden.message.contains("organization-admin"), "{}", forbidden.message);
    let mut waiting = decide(now(), &pending_workspace(WS_ID), None, &p, None);
    without_stop_permission(&mut waiting, "research");
    assert_eq!(waiting.verdict, Verdict::Waiting, "a waiting workspace stays demand");
    let mut stopped = decide(now(), &ws(mins(40)), None, &p, None);
    stopped.verdict = Verdict::Skip;
    stopped.reason = Reason::NotRunning;
    without_stop_permission(&mut stopped, "research");
    assert_eq!(stopped.reason, Reason::NotRunning);
    stoppable.workspace_id = "the-stoppable-one".into();
    let mut ds = vec![forbidden, waiting, stoppable];
    let out = apply_fleet_rules(&mut ds, &p);
    assert_eq!((out.waiting, out.stop_order.clone()), (1, vec![2]), "the waiter in the other organization frees a GPU here");
}

/// Coder as it really is (reference NOTES §14): prebuilds, Tasks, evicted pods, Coder's clock.
#[test]
fn prebuilds_tasks_evictions_and_coders_clock() {
    use coder_gpu_reclaimer::coder::types::{AgentStatus, PREBUILDS_USER_ID};
    use coder_gpu_reclaimer::pass::decide::{PassFacts, decide_with};
    let p = policy();
    let idle = steady(NOTHING, Fields::All, 40);

    let mut prebuild = ws(mins(40));
    prebuild.is_prebuild = true;
    let mut old_server_prebuild = ws(mins(40));
    old_server_prebuild.owner_id = PREBUILDS_USER_ID.into();
    let mut pending_prebuild = pending_workspace(WS_ID);
    pending_prebuild.is_prebuild = true;
    let mut task = ws(mins(40));
    task.task_id = Some("3f1c2b8a-7d6e-4f5a-9b0c-1d2e3f4a5b6c".into());
    for (what, w, g) in [
        ("idle prebuild", &prebuild, &idle[..]),
        ("prebuild by its owner id (servers without is_prebuild)", &old_server_prebuild, &idle[..]),
        ("Pending prebuild: not a person waiting", &pending_prebuild, &[][..]),
    ] {
        let d = judge(w, g, &p);
        assert_eq!((d.verdict, d.reason), (Verdict::Skip, Reason::Prebuild), "{what}: {}", d.message);
    }
    let d = judge(&task, &idle, &p);
    assert_eq!((d.verdict, d.reason), (Verdict::Skip, Reason::Task), "{}", d.message);
    let d = judge(&task, &idle, &Policy { reclaim_tasks: true, ..policy() });
    assert_eq!(d.verdict, Verdict::Reclaim, "reclaim_tasks = true judges Tasks too");

    // Evicted: the agent had connected and is now disconnected; the old pod's series stopped.
    let mut evicted = ws(mins(40));
    for a in evicted.latest_build.resources.iter_mut().flat_map(|r| r.agents.iter_mut()) {
        a.status = AgentStatus::Disconnected;
    }
    let old_series = gpu((10..=40).rev().map(|m| (m * 60, values(NOTHING, Fields::All))));
    for (what, g) in [("no series at all", &[][..]), ("only the evicted pod's old series", &old_series[..])] {
        let d = judge(&evicted, g, &p);
        assert_eq!((d.verdict, d.reason), (Verdict::Waiting, Reason::WaitingForGpu), "{what}: {}", d.message);
    }
    let d = judge(&evicted, &idle, &p);
    assert_ne!(d.verdict, Verdict::Waiting, "a disconnected agent whose GPU still reports is no waiter (a network blip)");

    // Coder's clock 2 h behind: last_used_at 1 minute ago by Coder's clock reads 2h01m old here.
    let behind = Duration::hours(-2);
    let connected = running_workspace(WS_ID, now() + behind - mins(1));
    let d = decide_with(
        now(),
        &connected,
        Some(&idle),
        &p,
        None,
        PassFacts { coder_offset: behind, gpu_template: true, ..PassFacts::default() },
    );
    assert_eq!((d.verdict, d.reason), (Verdict::Keep, Reason::Connected), "judged by Coder's clock: {}", d.message);
    let d = decide(now(), &connected, Some(&idle), &p, None);
    assert_eq!(d.verdict, Verdict::Reclaim, "without the correction the connected user would be stopped");
    let away = running_workspace(WS_ID, now() + behind - mins(40));
    let d =
        decide_with(now(), &away, Some(&idle), &p, None, PassFacts { coder_offset: behind, gpu_template: true, ..PassFacts::default() });
    assert_eq!((d.verdict, d.reason), (Verdict::Reclaim, Reason::Idle), "a disconnected idle one is still stopped");
}

#[test]
fn prebuilds_are_neither_demand_nor_counted_by_the_breaker() {
    let p = Policy { reclaim_when: ReclaimWhen::Contended, ..policy() };
    let idle = steady(NOTHING, Fields::All, 40);
    let mut pending_prebuild = pending_workspace("11111111-2222-4333-8444-555555555555");
    pending_prebuild.is_prebuild = true;
    let user = ws(mins(40));
    let mut decisions = vec![decide(now(), &user, Some(&idle), &p, None), decide(now(), &pending_prebuild, None, &p, None)];
    let out = apply_fleet_rules(&mut decisions, &p);
    assert_eq!(out.waiting, 0, "a Pending prebuild is not a waiter");
    assert_eq!(out.gpu_workspaces, 1, "the breaker counts people's GPU workspaces only");
    assert!(out.stop_order.is_empty() && decisions[0].reason == Reason::NoContention, "nobody is stopped for a prebuild");
}

/// Readings as real exporters produce them (reference dcgm NOTES §9), each a wrong stop if
/// misread: a shared GPU's per-pod zeros, stuck counters, video work, a power veto, frozen data.
#[test]
fn readings_that_make_a_busy_gpu_look_idle() {
    let p = policy();
    let away = ws(mins(40));
    let with = |f: &dyn Fn(&mut SignalValues), attribution: Attribution| {
        let mut g = gpu((0..=40).rev().map(|m| {
            let mut v = values(MEMORY_ONLY, Fields::All);
            f(&mut v);
            (m * 60, v)
        }));
        g[0].attribution = attribution;
        g
    };
    let set = |pairs: &'static [(Signal, f64)]| move |v: &mut SignalValues| pairs.iter().for_each(|(s, x)| v.set(*s, *x));
    let light = |d: f64, sms: f64| -> Box<dyn Fn(&mut SignalValues)> {
        Box::new(move |v: &mut SignalValues| {
            for (signal, x) in [(Signal::SmActive, d / sms), (Signal::GrEngineActive, d), (Signal::GpuUtil, d), (Signal::FbUsedMib, 302.0)]
            {
                v.set(signal, x);
            }
        })
    };
    type Case = (&'static str, Box<dyn Fn(&mut SignalValues)>, Attribution, Verdict, Reason);
    let (exclusive, shared) = (Attribution::Exclusive, Attribution::Shared);
    let cases: Vec<Case> = vec![
        // Virtual-GPU mode: the pod's own utilization and memory are 0 (no hostPID), the
        // profiling fields the device's 0.8. With the device-level series the sharer reads the
        // device's utilization and memory (`merge_device_level`); without it (behind Prometheus,
        // left out of the store) the zeros prove nothing, and nothing is judged.
        (
            "a sharer, device busy: the device's utilization and memory",
            Box::new(set(&[
                (Signal::SmActive, 0.8),
                (Signal::GrEngineActive, 0.9),
                (Signal::FbUsedMib, 31_420.0),
                (Signal::GpuUtil, 0.87),
            ])),
            shared,
            Verdict::Keep,
            Reason::GpuActive,
        ),
        (
            "a sharer whose device-level series is missing",
            Box::new(set(&[(Signal::SmActive, 0.8), (Signal::GrEngineActive, 0.9), (Signal::FbUsedMib, 0.0), (Signal::GpuUtil, 0.0)])),
            Attribution::DeviceSeriesMissing,
            Verdict::Unknown,
            Reason::NoDeviceSeries,
        ),
        (
            "an exclusive GPU reading 0 % and 0 MiB while the profiling fields compute (virtual-GPU copies, no device series)",
            Box::new(set(&[(Signal::SmActive, 0.8), (Signal::GrEngineActive, 0.9), (Signal::FbUsedMib, 0.0), (Signal::GpuUtil, 0.0)])),
            exclusive,
            Verdict::Unknown,
            Reason::NoDeviceSeries,
        ),
        (
            "utilization and compute on an empty framebuffer: phantom",
            Box::new(set(&[(Signal::SmActive, 0.8), (Signal::GrEngineActive, 0.9), (Signal::FbUsedMib, 0.0), (Signal::GpuUtil, 0.9)])),
            exclusive,
            Verdict::Reclaim,
            Reason::PhantomUtilization,
        ),
        // Issue 34 item 6: a time-sliced GPU without profiling fields whose device-level series
        // reads utilization with no process holding memory: the documented phantom rule.
        (
            "sharers without profiling fields: device utilization on an empty framebuffer",
            Box::new(|v: &mut SignalValues| {
                v.clear(Signal::SmActive);
                v.clear(Signal::GrEngineActive);
                v.set(Signal::GpuUtil, 0.3);
                v.set(Signal::FbUsedMib, 0.0);
            }),
            shared,
            Verdict::Reclaim,
            Reason::PhantomUtilization,
        ),
        (
            "shared GPU, device idle: every sharer is idle",
            Box::new(|v: &mut SignalValues| v.clear(Signal::FbUsedMib)),
            shared,
            Verdict::Reclaim,
            Reason::Idle,
        ),
        (
            "shared GPU, no device-level reading at all",
            Box::new(|v: &mut SignalValues| {
                for s in [Signal::SmActive, Signal::GrEngineActive, Signal::GpuUtil, Signal::FbUsedMib] {
                    v.clear(s);
                }
            }),
            shared,
            Verdict::Unknown,
            Reason::NoGpuData,
        ),
        (
            "GR stuck at 0 while utilization reads 30% (no SM_ACTIVE)",
            Box::new(|v: &mut SignalValues| {
                v.clear(Signal::SmActive);
                v.set(Signal::GpuUtil, 0.3);
            }),
            exclusive,
            Verdict::Unknown,
            Reason::MetricsDisagree,
        ),
        (
            "matmul with SM stuck at 0: the tensor pipes are busy",
            Box::new(set(&[(Signal::SmActive, 0.0), (Signal::GrEngineActive, 1.0), (Signal::GpuUtil, 1.0), (Signal::TensorActive, 0.412)])),
            exclusive,
            Verdict::Unknown,
            Reason::MetricsDisagree,
        ),
        // NOTES §10: DRAM busy with SM at 0 is copy-only work (memcpy, peer-to-peer), not a stuck
        // counter; on MIG (no utilization) a GR stuck at 0 reads the same and is kept the same.
        (
            "copy-only: device memory busy, no kernel",
            Box::new(set(&[(Signal::DramActive, 0.62), (Signal::FbUsedMib, 8_192.0)])),
            exclusive,
            Verdict::Keep,
            Reason::GpuActive,
        ),
        (
            "MIG: no utilization, GR stuck at 0, device memory busy",
            Box::new(|v: &mut SignalValues| {
                v.clear(Signal::SmActive);
                v.clear(Signal::GpuUtil);
                v.set(Signal::DramActive, 0.4);
            }),
            exclusive,
            Verdict::Keep,
            Reason::GpuActive,
        ),
        // NOTES §10: a one-block kernel busy a fraction d of the time reads GR ≈ d, SM ≈ d / SMs
        // (SM ≤ 0.002 for d up to 0.26 on a 132-SM H100, 0.16 on an 80-SM A10G). The one-thread
        // kernel's shape at a lower duty cycle, not a stuck counter: reclaimed like it (it was
        // kept as metrics-disagree).
        ("light periodic kernel on an H100, d = 0.1", light(0.1, 132.0), exclusive, Verdict::Reclaim, Reason::PhantomUtilization),
        ("light periodic kernel on an H100, d = 0.26", light(0.26, 132.0), exclusive, Verdict::Reclaim, Reason::PhantomUtilization),
        ("light periodic kernel on an A10G, d = 0.16", light(0.16, 80.0), exclusive, Verdict::Reclaim, Reason::PhantomUtilization),
        // NOTES §11.5: 160 SMs on a B300; six-decimal printing can put SM × 160 just under GR
        // (GR 0.070000, SM 0.000437: 0.06992), and f32 samples can too (d = 0.1 exactly).
        ("light periodic kernel on a B300, d = 0.1", light(0.1, 160.0), exclusive, Verdict::Reclaim, Reason::PhantomUtilization),
        (
            "light periodic kernel on a B300 as printed: GR 0.070000, SM 0.000437",
            Box::new(set(&[
                (Signal::SmActive, 0.000437),
                (Signal::GrEngineActive, 0.07),
                (Signal::GpuUtil, 0.07),
                (Signal::FbUsedMib, 302.0),
            ])),
            exclusive,
            Verdict::Reclaim,
            Reason::PhantomUtilization,
        ),
        // No kernel keeps GR busy 90% of the time on less than one SM: SM is stuck (DCGM #244).
        (
            "SM stuck at 0 while GR reads 0.9",
            Box::new(set(&[(Signal::SmActive, 0.0), (Signal::GrEngineActive, 0.9), (Signal::GpuUtil, 0.9)])),
            exclusive,
            Verdict::Unknown,
            Reason::MetricsDisagree,
        ),
        (
            "light kernel on a shared GPU: the same phantom shape",
            Box::new(set(&[(Signal::SmActive, 0.00076), (Signal::GrEngineActive, 0.1), (Signal::GpuUtil, 0.1), (Signal::FbUsedMib, 0.0)])),
            shared,
            Verdict::Reclaim,
            Reason::PhantomUtilization,
        ),
        ("video encode only: ENC 61%", Box::new(set(&[(Signal::EncUtil, 0.61)])), exclusive, Verdict::Keep, Reason::GpuActive),
        ("video decode only: DEC 20%", Box::new(set(&[(Signal::DecUtil, 0.2)])), exclusive, Verdict::Keep, Reason::GpuActive),
        (
            "one-thread kernel on an A10G (SM 0.012 is one SM, not a stuck counter)",
            Box::new(set(&[(Signal::SmActive, 0.012), (Signal::GrEngineActive, 1.0), (Signal::GpuUtil, 1.0), (Signal::FbUsedMib, 302.0)])),
            exclusive,
            Verdict::Reclaim,
            Reason::PhantomUtilization,
        ),
    ];
    for (what, f, shared, verdict, reason) in cases {
        let d = judge(&away, &with(&*f, shared), &p);
        assert_eq!((d.verdict, d.reason), (verdict, reason), "{what}: {}", d.message);
    }
    // One sample of GR 0 with utilization is two readings a moment apart, not a stuck counter.
    let mut blip = steady(MEMORY_ONLY, Fields::NoSm, 40);
    blip[0].samples.back_values_mut().unwrap().set(Signal::GpuUtil, 0.3);
    let d = judge(&away, &blip, &p);
    assert_ne!(d.reason, Reason::MetricsDisagree, "{}", d.message);
}

#[test]
fn an_optional_power_veto_keeps_a_gpu_drawing_power() {
    let away = ws(mins(40));
    let g = steady(MEMORY_ONLY, Fields::All, 40); // 89.1 W: a process holds 19 GiB
    let off = judge(&away, &g, &policy());
    assert_eq!(off.reason, Reason::MemoryHeldIdle, "off by default: holding the GPU raises power with no work");
    let on = Policy { active_power_watts: vec![("NVIDIA A10*".into(), 80.0)], ..policy() };
    let mut named = g.clone();
    named[0].model = Some(std::sync::Arc::from("NVIDIA A10G"));
    assert_eq!(judge(&away, &named, &on).reason, Reason::GpuActive, "89.1 W >= 80 W for an A10G");
    named[0].model = Some(std::sync::Arc::from("NVIDIA H100 80GB HBM3"));
    assert_eq!(judge(&away, &named, &on).reason, Reason::MemoryHeldIdle, "the veto is per model");
}

#[test]
fn frozen_readings_are_unknown_per_gpu() {
    let p = policy();
    let away = ws(mins(40));
    let mut alive = GpuWindow::new(GpuKey { uuid: "GPU-alive".into(), gpu_instance: None, pod: None }, Arc::from("x"));
    let mut frozen = GpuWindow::new(GpuKey { uuid: "GPU-frozen".into(), gpu_instance: None, pod: None }, Arc::from("x"));
    for m in (0..=40).rev() {
        let at = now() - mins(m);
        let v = values(NOTHING, Fields::All);
        // An idle GPU draws 24.3 W: its counter rises 1,458 J a minute. The frozen one stopped 5 minutes ago.
        alive.add_reading(at, v, Some(1.0e6 + (40 - m) as f64 * 1_458.0));
        frozen.add_reading(at, v, Some(1.0e6 + (40 - m.max(5)) as f64 * 1_458.0));
        alive.flush();
        frozen.flush();
    }
    let d = judge(&away, std::slice::from_ref(&alive), &p);
    assert_eq!((d.verdict, d.reason), (Verdict::Reclaim, Reason::Idle), "{}", d.message);
    let d = judge(&away, &[alive, frozen], &p);
    assert_eq!((d.verdict, d.reason), (Verdict::Unknown, Reason::FrozenData), "{}", d.message);
    assert!(d.message.contains("GPU-frozen") && d.message.contains("5m"), "{}", d.message);
}

#[test]
fn no_power_veto_for_a_mig_instance() {
    // NOTES §10, exporter #317: every instance reports the whole GPU's power (265.3 W on
    // instances 3 and 4 while only 4 works), so an idle instance would be kept by its sibling.
    let away = ws(mins(40));
    let on = Policy { active_power_watts: vec![("NVIDIA A100*".into(), 150.0)], ..policy() };
    let mut g = steady((0.0, 0.0, 265.3, 0.0, 0.0), Fields::NoSm, 40);
    g[0].model = Some(std::sync::Arc::from("NVIDIA A100-SXM4-80GB"));
    assert_eq!(judge(&away, &g, &on).reason, Reason::GpuActive, "a whole GPU drawing 265 W is kept by the veto");
    std::sync::Arc::make_mut(&mut g[0].key).gpu_instance = Some("3".into());
    let d = judge(&away, &g, &on);
    assert_eq!((d.verdict, d.reason), (Verdict::Reclaim, Reason::Idle), "an idle MIG instance: {}", d.message);
}

/// One GPU observed every `every` seconds for 40 minutes, as the exporter source feeds a window:
/// `energy(seconds since the start)` is the counter in joules, or `None` without one.
fn observed(load: (f64, f64, f64, f64, f64), every: i64, energy: impl Fn(i64) -> Option<f64>) -> Vec<GpuWindow> {
    let mut w = gpu([]).remove(0);
    for t in (0..=40 * 60).step_by(every as usize) {
        w.add_reading(now() - Duration::seconds(40 * 60 - t), values(load, Fields::All), energy(t));
        w.flush();
    }
    vec![w]
}

#[test]
fn frozen_data_needs_an_energy_counter_that_stopped_for_two_collections() {
    let away = ws(mins(40));
    // The measurement: without an energy counter 26% of idle workspaces were never
    // reclaimed, all `frozen-data`. An idle GPU's readings stand still: judged on them.
    let d = judge(&away, &observed(NOTHING, 60, |_| None), &policy());
    assert_eq!((d.verdict, d.reason), (Verdict::Reclaim, Reason::Idle), "no counter: {}", d.message);
    // A 5-minute `-c`: the counter (24.3 W idle) moves once per collection; the last one was
    // 4 minutes ago, longer than frozen_after (3m) but under two collections.
    let steps = |t: i64| Some(1.0e6 + ((t + 240) / 300) as f64 * 24.3 * 300.0);
    let five = Policy { exporter_collect_interval: StdDuration::from_secs(300), ..policy() };
    let d = judge(&away, &observed(NOTHING, 60, steps), &policy());
    assert_eq!(d.reason, Reason::FrozenData, "read as a 30 s exporter, 4 minutes without a rise is frozen: {}", d.message);
    let d = judge(&away, &observed(NOTHING, 60, steps), &five);
    assert_eq!((d.verdict, d.reason), (Verdict::Reclaim, Reason::Idle), "-c 5m: {}", d.message);
    // ...and a counter that stopped for 11 minutes is frozen even so.
    let stopped = |t: i64| steps(t.min(29 * 60));
    let d = judge(&away, &observed(NOTHING, 60, stopped), &five);
    assert_eq!((d.verdict, d.reason), (Verdict::Unknown, Reason::FrozenData), "{}", d.message);
}

#[test]
fn the_energy_counter_counts_under_its_dcgm_4_7_name_in_joules() {
    use coder_gpu_reclaimer::gpu::Point;
    let away = ws(mins(40));
    for (name, per_joule) in [("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1000.0), ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1.0)] {
        let counter = |stop_at: i64| {
            move |t: i64| {
                let mut p = Point::new(now());
                p.add(name, (1.0e6 + t.min(stop_at) as f64 * 24.3) * per_joule);
                p.energy_joules
            }
        };
        let d = judge(&away, &observed(NOTHING, 60, counter(i64::MAX)), &policy());
        assert_eq!(d.reason, Reason::Idle, "{name} rising: {}", d.message);
        let d = judge(&away, &observed(NOTHING, 60, counter(30 * 60)), &policy());
        assert_eq!(d.reason, Reason::FrozenData, "{name} stopped 10 minutes ago: {}", d.message);
    }
}

// Keeping busy work running (`extend_while_busy`): when Coder's deadline moves, and when not.

fn extending() -> Policy {
    let mut p = policy();
    p.thresholds.extend_while_busy = true;
    p
}

/// A disconnected workspace (last used 40 minutes ago) whose start build completed `ran` ago,
/// with Coder's deadline `deadline_in` from now (`None`: autostop off).
fn busy_ws(ran: Duration, deadline_in: Option<Duration>) -> Workspace {
    let mut w = ws(mins(40));
    w.latest_build.job.completed_at = Some(now() - ran);
    w.latest_build.deadline = deadline_in.map(|d| now() + d);
    w
}

fn action(d: &Decision) -> Option<DeadlineAction> {
    d.deadline.as_ref().map(|p| p.action)
}

#[test]
fn a_busy_gpu_with_nobody_connected_keeps_coders_deadline_ahead() {
    let p = extending();
    let extend = |by: Duration| Some(DeadlineAction::Extend { to: now() + by });
    let matmul = steady(MATMUL, Fields::All, 40);
    // Due once the deadline is closer than 30 minutes plus two 60 s intervals.
    for (name, deadline_in, want) in [
        ("10 minutes left", Some(mins(10)), extend(mins(60))),
        ("31 minutes left: inside the margin", Some(mins(31)), extend(mins(60))),
        ("33 minutes left: not yet", Some(mins(33)), Some(DeadlineAction::Ahead)),
        ("2 hours left", Some(Duration::hours(2)), Some(DeadlineAction::Ahead)),
        ("passed a minute ago, not stopped yet: rescued", Some(mins(-1)), extend(mins(60))),
        ("autostop off: nothing to keep", None, None),
    ] {
        let d = judge(&busy_ws(Duration::hours(2), deadline_in), &matmul, &p);
        assert_eq!((d.verdict, d.reason), (Verdict::Keep, Reason::GpuActive), "{name}");
        assert_eq!(action(&d), want, "{name}");
    }
    let d = judge(&busy_ws(Duration::hours(2), Some(mins(10))), &matmul, &p);
    let plan = d.deadline.unwrap();
    assert_eq!((plan.limit, plan.limited_by), (now() - Duration::hours(2) + Duration::hours(24), Limit::ExtendLimit));
    assert_eq!(plan.evidence.sm_active_peak, Some(0.984), "the evidence is the window's SM peak");
    assert_eq!(plan.evidence.gr_engine_active_peak, Some(1.0));
    // Off by default, and per rule.
    assert_eq!(action(&judge(&busy_ws(Duration::hours(2), Some(mins(10))), &matmul, &policy())), None);
    let mut rule = policy();
    rule.rules = vec![Rule { template: Some("gpu-*".into()), extend_while_busy: Some(true), ..Rule::default() }];
    assert_eq!(action(&judge(&busy_ws(Duration::hours(2), Some(mins(10))), &matmul, &rule)), extend(mins(60)));
}

#[test]
fn only_work_the_gpu_itself_shows_is_kept_running() {
    let p = extending();
    let soon = busy_ws(Duration::hours(2), Some(mins(10)));
    let cases = [
        ("matmul", steady(MATMUL, Fields::All, 40), &p, Some(Reason::GpuActive), true),
        ("one-thread kernel, only GR_ENGINE: computing as the decisions read it", steady(ONE_THREAD, Fields::NoSm, 40), &p, None, true),
        ("one-thread kernel with SM_ACTIVE: phantom", steady(ONE_THREAD, Fields::All, 40), &p, Some(Reason::PhantomUtilization), false),
        ("memory held, nothing computing", steady(MEMORY_ONLY, Fields::All, 40), &p, Some(Reason::MemoryHeldIdle), false),
        ("stage 1 phantom", steady(PHANTOM, Fields::UtilOnly, 40), &p, Some(Reason::PhantomUtilization), false),
        ("nothing running", steady(NOTHING, Fields::All, 40), &p, Some(Reason::Idle), false),
    ];
    for (name, g, p, reason, extended) in cases {
        let d = judge(&soon, &g, p);
        if let Some(r) = reason {
            assert_eq!(d.reason, r, "{name}");
        }
        assert_eq!(d.deadline.as_ref().and_then(|p| p.extend_to()).is_some(), extended, "{name}: {d:?}");
    }
    // A power veto keeps a GPU, but a GPU drawing power alone is not kept running.
    let veto = Policy { active_power_watts: vec![("NVIDIA A10*".into(), 80.0)], ..extending() };
    let mut held = steady(MEMORY_ONLY, Fields::All, 40);
    held[0].model = Some(std::sync::Arc::from("NVIDIA A10G"));
    let d = judge(&soon, &held, &veto);
    assert_eq!((d.reason, action(&d)), (Reason::GpuActive, None), "89.1 W keeps it, extends nothing");
    // Readings that could not judge it idle either: one sample, or a gap within the window.
    let one = gpu([(0, values(MATMUL, Fields::All))]);
    assert_eq!(action(&judge(&soon, &one, &p)), None, "one sample: kept, not kept running");
    let gap = gpu((0..=40).rev().filter(|m| !(10..20).contains(m)).map(|m| (m * 60, values(MATMUL, Fields::All))));
    assert_eq!(action(&judge(&soon, &gap, &p)), None, "a 10-minute gap: kept, not kept running");
    // Unknown of any reason: stale readings.
    let stale = gpu((10..=40).rev().map(|m| (m * 60, values(MATMUL, Fields::All))));
    let d = judge(&soon, &stale, &p);
    assert_eq!((d.verdict, action(&d)), (Verdict::Unknown, None), "{}", d.message);
    // Connected: Coder's activity bump keeps the deadline itself, unless the template's bump is
    // 0 (reference coder NOTES §18), when nothing moves it but this service.
    let mut connected = soon.clone();
    connected.last_used_at = now() - Duration::seconds(30);
    let template = |bump: Option<i64>| {
        let schedule = TemplateSchedule { activity_bump_ms: bump, time_til_autostop_notify_ms: None };
        PassFacts { gpu_template: true, template: Some(schedule), ..PassFacts::default() }
    };
    let g = steady(MATMUL, Fields::All, 40);
    // (the template as read, the deadline moved)
    let rows = [(None, false), (Some(template(None)), false), (Some(template(Some(3_600_000))), false), (Some(template(Some(0))), true)];
    for (facts, extended) in rows {
        let d = match facts {
            Some(f) => decide_with(now(), &connected, Some(&g), &p, None, f),
            None => judge(&connected, &g, &p),
        };
        assert_eq!(d.deadline.as_ref().and_then(|p| p.extend_to()).is_some(), extended, "{facts:?}");
    }
}

#[test]
fn prebuilds_tasks_exempt_and_unpermitted_workspaces_are_never_kept_running() {
    use coder_gpu_reclaimer::pass::decide::without_stop_permission;
    let p = extending();
    let g = steady(MATMUL, Fields::All, 40);
    let soon = busy_ws(Duration::hours(2), Some(mins(10)));
    let mut prebuild = soon.clone();
    prebuild.is_prebuild = true;
    let mut task = soon.clone();
    task.task_id = Some("3f1c2b8a-7d6e-4f5a-9b0c-1d2e3f4a5b6c".into());
    let exempt = Policy { rules: vec![Rule { template: Some("*".into()), exempt: true, ..Rule::default() }], ..extending() };
    for (name, w, p) in [("prebuild", &prebuild, &p), ("task", &task, &p), ("exempt", &soon, &exempt)] {
        let d = judge(w, &g, p);
        assert_eq!((d.verdict, action(&d)), (Verdict::Skip, None), "{name}");
    }
    let mut d = judge(&soon, &g, &p);
    assert!(d.deadline.is_some());
    without_stop_permission(&mut d, "research");
    assert_eq!((d.reason, action(&d)), (Reason::NoPermission, None));
}

#[test]
fn extend_limit_and_max_deadline_clamp_then_let_coder_stop_it() {
    let mut p = extending();
    let g = steady(MATMUL, Fields::All, 40);
    let plan = |w: &Workspace, p: &Policy| judge(w, &g, p).deadline.unwrap();
    // extend_limit 24 h after completion: 23 h 20 m ago leaves 40 minutes, 23 h 40 m ago 20.
    let near = plan(&busy_ws(Duration::hours(23) + mins(20), Some(mins(10))), &p);
    assert_eq!((near.action, near.limited_by), (DeadlineAction::Extend { to: now() + mins(40) }, Limit::ExtendLimit));
    let reached = plan(&busy_ws(Duration::hours(23) + mins(40), Some(mins(10))), &p);
    assert_eq!(reached.action, DeadlineAction::LimitReached, "20 minutes is less than Coder accepts");
    // A deadline already at the limit is not moved (and never shortened).
    let at_limit = plan(&busy_ws(Duration::hours(23) + mins(30), Some(mins(30))), &p);
    assert_eq!(at_limit.action, DeadlineAction::LimitReached);
    // max_deadline (the template's autostop requirement) clamps before extend_limit does.
    let mut capped = busy_ws(Duration::hours(2), Some(mins(10)));
    capped.latest_build.max_deadline = Some(now() + mins(45));
    let c = plan(&capped, &p);
    assert_eq!((c.action, c.limited_by, c.limit), (DeadlineAction::Extend { to: now() + mins(45) }, Limit::MaxDeadline, now() + mins(45)));
    capped.latest_build.max_deadline = Some(now() + mins(20));
    assert_eq!(plan(&capped, &p).action, DeadlineAction::LimitReached);
    // extend_by sets how far: 3 h.
    p.thresholds.extend_by = StdDuration::from_secs(3 * 3600);
    assert_eq!(plan(&busy_ws(Duration::hours(2), Some(mins(10))), &p).action, DeadlineAction::Extend { to: now() + Duration::hours(3) });
    // Times are sent in whole seconds.
    let mut fraction = busy_ws(Duration::hours(2), Some(mins(10)));
    fraction.latest_build.max_deadline = Some(now() + mins(50) + Duration::milliseconds(700));
    assert_eq!(plan(&fraction, &extending()).action, DeadlineAction::Extend { to: now() + mins(50) });
}

#[test]
fn extensions_are_ordered_soonest_deadline_first_with_slots_for_the_cap() {
    let mut p = extending();
    p.max_extensions_per_pass = 2;
    let g = steady(MATMUL, Fields::All, 40);
    let mut decisions: Vec<Decision> = [mins(20), mins(5), mins(10)]
        .into_iter()
        .enumerate()
        .map(|(i, left)| {
            let mut w = busy_ws(Duration::hours(2), Some(left));
            w.id = format!("ws-{i}");
            judge(&w, &g, &p)
        })
        .collect();
    let fleet = apply_fleet_rules(&mut decisions, &p);
    assert_eq!((fleet.extend_order, fleet.extension_slots), (vec![1, 2, 0], 2), "every due one, soonest first; two slots");
}

// Contention that is real: GPU templates only, per pool, waiting tasks and exempt workspaces.

#[test]
fn only_a_gpu_templates_workspace_waits_for_a_gpu() {
    use coder_gpu_reclaimer::pass::decide::{PassFacts, decide_with};
    let p = policy();
    let pending = pending_workspace(WS_ID);
    let as_gpu = decide_with(now(), &pending, None, &p, None, PassFacts { gpu_template: true, ..PassFacts::default() });
    assert_eq!((as_gpu.verdict, as_gpu.reason), (Verdict::Waiting, Reason::WaitingForGpu));
    // Not (yet) a GPU template: a CPU workspace starting, or Pending for want of CPU, is no demand.
    let not_gpu = decide_with(now(), &pending, None, &p, None, PassFacts::default());
    assert_eq!((not_gpu.verdict, not_gpu.reason), (Verdict::Skip, Reason::NoGpu));
}

#[test]
fn a_task_or_an_exempt_workspace_that_waits_is_demand_and_is_never_stopped() {
    let p = Policy { rules: vec![Rule { workspace: Some("bob-*".into()), exempt: true, ..Rule::default() }], ..policy() };
    let mut task = pending_workspace(WS_ID);
    task.task_id = Some("3f1c2b8a-7d6e-4f5a-9b0c-1d2e3f4a5b6c".into());
    let exempt = pending_workspace(WS_ID); // bob-gpu
    for (name, w) in [("task", &task), ("exempt", &exempt)] {
        let d = decide(now(), w, None, &p, None);
        assert_eq!((d.verdict, d.reason), (Verdict::Waiting, Reason::WaitingForGpu), "{name}");
    }
    // Running with an idle GPU, they are still never judged.
    let mut idle_task = ws(mins(40));
    idle_task.task_id = task.task_id.clone();
    assert_eq!(decide(now(), &idle_task, Some(&steady(NOTHING, Fields::All, 40)), &p, None).reason, Reason::Task);
}

#[test]
fn in_contended_mode_demand_is_per_pool() {
    // Pools by workspace name: "h100-*" and "a10g-*"; everything else is in the default pool.
    let mut p = Policy { reclaim_when: ReclaimWhen::Contended, ..policy() };
    p.pools = vec!["default".into(), "h100".into(), "a10g".into()];
    p.rules = vec![
        Rule { workspace: Some("h100-*".into()), pool: Some("h100".into()), ..Rule::default() },
        Rule { workspace: Some("a10g-*".into()), pool: Some("a10g".into()), ..Rule::default() },
    ];
    let named = |mut w: Workspace, name: &str, id: &str| {
        w.name = name.into();
        w.id = id.into();
        w
    };
    let idle = steady(NOTHING, Fields::All, 40);
    let decided = |ws: Vec<Workspace>| -> Vec<Decision> {
        ws.iter().map(|w| decide(now(), w, if w.name.contains("idle") { Some(&idle[..]) } else { None }, &p, None)).collect()
    };
    let a10g_idle = named(ws(mins(40)), "a10g-idle", "1");
    let h100_wait = named(pending_workspace(WS_ID), "h100-wait", "2");
    let mut ds = decided(vec![a10g_idle.clone(), h100_wait.clone()]);
    let out = apply_fleet_rules(&mut ds, &p);
    assert_eq!((out.waiting, out.stop_order.len(), ds[0].reason), (1, 0, Reason::NoContention), "an H100 waiter stops no A10G");
    assert!(ds[0].message.ends_with("kept: no workspace is waiting for a GPU in its pool \"a10g\""), "{}", ds[0].message);
    let counts: Vec<(usize, usize)> = out.pools.iter().map(|c| (c.waiting, c.idle)).collect();
    assert_eq!(counts, vec![(0, 0), (1, 0), (0, 1)]);
    // An A10G waiter: one stop, of the A10G pool's longest idle, however many idle elsewhere.
    let default_idle = named(ws(mins(50)), "idle-elsewhere", "3");
    let a10g_wait = named(pending_workspace(WS_ID), "a10g-wait", "4");
    let mut ds = decided(vec![a10g_idle, h100_wait, default_idle, a10g_wait]);
    let out = apply_fleet_rules(&mut ds, &p);
    assert_eq!((out.waiting, out.stop_order.clone()), (2, vec![0]), "{ds:#?}");
    assert_eq!(ds[2].reason, Reason::NoContention, "the default pool's idle one stays: nobody waits there");
}

#[test]
fn behind_prometheus_a_start_waits_only_once_a_complete_step_could_have_shown_its_pod() {
    use coder_gpu_reclaimer::pass::decide::{PassFacts, decide_with};
    // Prometheus answers for complete 60 s steps; dcgm-exporter maps GPUs to pods at its next
    // collection (30 s). A start whose series cannot be in any complete step yet is no demand.
    // (`bind_allowance` 0 here: the volume's share of the wait is `tests/starts.rs`'s.)
    let p = Policy { bind_allowance: StdDuration::ZERO, ..policy() };
    let facts = PassFacts { gpu_template: true, step: Some(StdDuration::from_secs(60)), ..PassFacts::default() };
    for (what, ago, verdict, reason) in [
        ("30 s in: could report at 10:00:00, its first step ends 10:01:00", Duration::seconds(30), Verdict::Keep, Reason::Starting),
        (
            "90 s in: could report at 09:59:00, its first step 09:59-10:00 is complete",
            Duration::seconds(90),
            Verdict::Waiting,
            Reason::WaitingForGpu,
        ),
        ("3 minutes in, no series", mins(3), Verdict::Waiting, Reason::WaitingForGpu),
    ] {
        let d = decide_with(now(), &starting_workspace(ago, 120), None, &p, None, facts);
        assert_eq!((d.verdict, d.reason), (verdict, reason), "{what}: {}", d.message);
    }
    // The exporters are read now, not in steps: a Pending pod waits once one collection could
    // have shown its pod (issue 47: no longer at once).
    let read_now = PassFacts { step: None, ..facts };
    let d = decide_with(now(), &starting_workspace(Duration::seconds(20), 120), None, &p, None, read_now);
    assert_eq!(d.reason, Reason::Starting, "{}", d.message);
    let d = decide_with(now(), &starting_workspace(Duration::seconds(31), 120), None, &p, None, read_now);
    assert_eq!(d.verdict, Verdict::Waiting, "{}", d.message);
}

#[test]
fn a_reclaim_needs_the_energy_counter_to_have_risen_within_the_idle_window() {
    // idle_after 2 minutes against dcgm-exporter's `-c 300000`: the counter moves once per
    // collection, and frozen detection waits for two (10 minutes). An idle A10G draws 24.3 W:
    // 1,458 J a minute, 7,290 J a collection.
    let mut p = policy();
    p.thresholds.idle_after = StdDuration::from_secs(120);
    p.exporter_collect_interval = StdDuration::from_secs(300);
    let away = ws(mins(40));
    // A collection every five minutes, the last one `last_collection_ago` minutes ago; samples
    // every minute.
    let window = |last_collection_ago: i64, energy: bool| {
        let mut w = GpuWindow::new(GpuKey { uuid: "GPU-a10g".into(), gpu_instance: None, pod: None }, Arc::from("x"));
        for m in (0..=40).rev() {
            let collections = (40 - m + last_collection_ago) / 5;
            w.add_reading(now() - mins(m), values(NOTHING, Fields::All), energy.then_some(1.0e6 + collections as f64 * 7_290.0));
            w.flush();
        }
        vec![w]
    };
    let cases = [
        ("last collection a minute ago: the counter rose within the window", 1, true, Verdict::Reclaim, Reason::Idle),
        ("last collection 4 minutes ago: no rise in the last 2 minutes", 4, true, Verdict::Unknown, Reason::FrozenData),
        ("no energy counter (a trimmed counters file): judged on the other readings", 4, false, Verdict::Reclaim, Reason::Idle),
    ];
    for (what, ago, energy, verdict, reason) in cases {
        let d = judge(&away, &window(ago, energy), &p);
        assert_eq!((d.verdict, d.reason), (verdict, reason), "{what}: {}", d.message);
    }
    let d = judge(&away, &window(4, true), &p);
    assert!(d.message.contains("energy counter not risen within the last 2m") && d.message.contains("would be: GPU idle"), "{}", d.message);
}
