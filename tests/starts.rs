//! Who waits for a GPU (issue 47), table-tested on a clock passed in: a first start whose pod is
//! still binding its volume is `starting` until one exporter collection plus `bind_allowance`
//! after its agent was created (exporters read directly, and behind Prometheus from the same
//! moment); a template's CPU variant (a `gpu_parameters` build parameter says no GPU) is
//! `skip`/`no-gpu`, never demand and never a teacher of GPU templates. In `contended` mode each
//! false waiter would stop an idle GPU. Facts: reference coder NOTES §12, §15, §19.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use coder_gpu_reclaimer::coder::types::{AgentStatus, BuildParameter, Workspace};
use coder_gpu_reclaimer::gpu::signals::{Signal, SignalValues};
use coder_gpu_reclaimer::gpu::window::{GpuSample, GpuWindow};
use coder_gpu_reclaimer::gpu::{Attribution, GpuKey, GpuSeries, Point};
use coder_gpu_reclaimer::pass::decide::{PassFacts, Reason, Verdict, decide_with};
use coder_gpu_reclaimer::pass::fleet::apply_fleet_rules;
use coder_gpu_reclaimer::pass::judge::{Judge, PassContext};
use coder_gpu_reclaimer::pass::policy::{Policy, ReclaimWhen};

use crate::common::{WS_ID, never_connected_workspace, running_workspace};

fn now() -> DateTime<Utc> {
    // After the fixtures' builds (16:01), on a minute's end.
    DateTime::parse_from_rfc3339("2026-11-29T18:00:00Z").unwrap().with_timezone(&Utc)
}

fn secs(s: i64) -> Duration {
    Duration::seconds(s)
}

/// The defaults: `exporter_collect_interval` 30 s, `bind_allowance` 30 s.
fn policy() -> Policy {
    Policy::defaults(StdDuration::from_secs(60))
}

fn idle_reading() -> SignalValues {
    SignalValues::default().with(Signal::GpuUtil, 0.0).with(Signal::FbUsedMib, 0.0).with(Signal::SmActive, 0.0)
}

/// One GPU of the test workspace's pod, sampled at these seconds ago.
fn gpu(secs_ago: impl IntoIterator<Item = i64>) -> Vec<GpuWindow> {
    let key = GpuKey {
        uuid: "GPU-585834da-1c2b-4d5e-8f90-a1b2c3d4e5f6".into(),
        gpu_instance: None,
        pod: Some(format!("coder-{WS_ID}-7d9f8b6c5d-x2x9k")),
    };
    let mut w = GpuWindow::new(key, Arc::from("http://10.0.0.7:9400/metrics"));
    for s in secs_ago {
        w.push(GpuSample { at: now() - secs(s), values: idle_reading() });
    }
    vec![w]
}

/// A series of one GPU of `ws`'s pod, as a source reports it.
fn series_of(ws: &Workspace, uuid: &str, points: Vec<Point>) -> GpuSeries {
    GpuSeries {
        key: GpuKey { uuid: uuid.into(), gpu_instance: None, pod: Some(format!("coder-{}-7d9f8b6c5d-x2x9k", ws.id)) },
        workspace_id: Some(ws.id.as_str().into()),
        namespace: Some("coder".into()),
        model: Some("NVIDIA A10G".into()),
        source: Arc::from("http://10.0.0.7:9400/metrics"),
        attribution: Attribution::Exclusive,
        real_pod_uid: false,
        points,
    }
}

fn starting(created_ago: Duration, timeout: bool) -> Workspace {
    never_connected_workspace(now() - created_ago, 120, timeout)
}

fn parameter(name: &str, value: &str) -> BuildParameter {
    BuildParameter { name: name.into(), value: value.into() }
}

fn judged(
    ws: &Workspace,
    g: &[GpuWindow],
    p: &Policy,
    step: Option<u64>,
    cpu_variant: Option<&BuildParameter>,
) -> (Verdict, Reason, String) {
    let facts = PassFacts { gpu_template: true, step: step.map(StdDuration::from_secs), cpu_variant, ..PassFacts::default() };
    let d = decide_with(now(), ws, Some(g), p, None, facts);
    (d.verdict, d.reason, d.message)
}

/// A first start's pod reports no GPU until its volume is bound, it is admitted and the exporter
/// has collected once: within `exporter_collect_interval + bind_allowance` of its agent's
/// creation that is `starting`, after it (or once its agent is `timeout`) a pod waiting for a GPU.
#[test]
fn a_start_whose_pod_may_still_bind_its_volume_is_not_waiting() {
    let none: Vec<GpuWindow> = Vec::new();
    let stale = gpu([600, 540, 480]); // the previous pod's GPU, gone 8 minutes ago
    let no_bind = Policy { bind_allowance: StdDuration::ZERO, ..policy() };
    let slow_exporter = Policy { exporter_collect_interval: StdDuration::from_secs(60), ..policy() };
    // (what, agent created ago, timeout, series, policy, Prometheus step, verdict, reason)
    type Case<'a> = (&'a str, i64, bool, &'a [GpuWindow], &'a Policy, Option<u64>, Verdict, Reason);
    let p = policy();
    let cases: [Case; 11] = [
        ("5 s in: the volume is being provisioned", 5, false, &none, &p, None, Verdict::Keep, Reason::Starting),
        ("59 s in: within 30 s + 30 s", 59, false, &none, &p, None, Verdict::Keep, Reason::Starting),
        ("61 s in: past it, Pending", 61, false, &none, &p, None, Verdict::Waiting, Reason::WaitingForGpu),
        ("20 s in, only the previous pod's stale series", 20, false, &stale, &p, None, Verdict::Keep, Reason::Starting),
        ("20 s in, but Coder says timeout", 20, true, &none, &p, None, Verdict::Waiting, Reason::WaitingForGpu),
        ("bind_allowance 0: 29 s in, one collection", 29, false, &none, &no_bind, None, Verdict::Keep, Reason::Starting),
        ("bind_allowance 0: 31 s in", 31, false, &none, &no_bind, None, Verdict::Waiting, Reason::WaitingForGpu),
        ("a 60 s collection: 89 s in", 89, false, &none, &slow_exporter, None, Verdict::Keep, Reason::Starting),
        // Behind Prometheus (60 s steps, `now` on a step's end): no complete step has begun
        // since 90 s ago + 60 s, so none can show the pod; 150 s ago + 60 s is a step's start.
        ("Prometheus: 90 s in", 90, false, &none, &p, Some(60), Verdict::Keep, Reason::Starting),
        ("Prometheus: 150 s in", 150, false, &none, &p, Some(60), Verdict::Waiting, Reason::WaitingForGpu),
        ("Prometheus, bind_allowance 0: 90 s in", 90, false, &none, &no_bind, Some(60), Verdict::Waiting, Reason::WaitingForGpu),
    ];
    for (what, ago, timeout, g, p, step, verdict, reason) in cases {
        let (v, r, message) = judged(&starting(secs(ago), timeout), g, p, step, None);
        assert_eq!((v, r), (verdict, reason), "{what}: {message}");
    }
    let (_, _, message) = judged(&starting(secs(20), false), &none, &p, None, None);
    assert!(message.contains("its pod reports no GPU yet") && message.contains("for 60s"), "{message}");
}

/// In `contended` mode the binding start is no demand, so the idle GPU stays; a minute later,
/// still without a GPU, it is a waiter and the idle GPU goes to it.
#[test]
fn a_binding_start_stops_nothing_until_it_really_waits() {
    let p = Policy { reclaim_when: ReclaimWhen::Contended, ..policy() };
    let idle_ws = running_workspace("1c1d2e3f-0000-4000-8000-000000000001", now() - Duration::minutes(40));
    let idle = gpu((0..=40).rev().map(|m| m * 60));
    for (ago, stops) in [(10, 0), (45, 0), (75, 1)] {
        let mut ds = vec![
            decide_with(now(), &idle_ws, Some(&idle), &p, None, PassFacts { gpu_template: true, ..PassFacts::default() }),
            decide_with(now(), &starting(secs(ago), false), Some(&[]), &p, None, PassFacts { gpu_template: true, ..PassFacts::default() }),
        ];
        let out = apply_fleet_rules(&mut ds, &p);
        assert_eq!(out.stop_order.len(), stops, "{ago} s after its agent was created: {:?}", ds[1]);
    }
}

#[test]
fn which_build_parameters_say_no_gpu() {
    let p = policy();
    for (name, value, cpu) in [
        ("gpu_count", "0", true),
        ("GPU_Count", "0", true),
        ("gpu_type", "None", true),
        ("gpus", "", true),
        ("gpu", " false ", true),
        ("num_gpus", "0", true),
        ("gpu_count", "1", false),
        ("gpu_type", "nvidia-a10g", false),
        ("gpu", "true", false),
        ("cpu_cores", "0", false),
        ("gpu_count", "00", false), // not a value the common templates write; read as a GPU, kept
    ] {
        let params = [parameter("region", "eu"), parameter(name, value)];
        assert_eq!(p.cpu_variant(&params).is_some(), cpu, "{name} = {value:?}");
    }
    let off = Policy { gpu_parameters: Vec::new(), ..policy() };
    assert_eq!(off.cpu_variant(&[parameter("gpu_count", "0")]), None, "gpu_parameters = [] turns it off");
    let own = Policy { gpu_parameters: vec!["accelerator".into()], ..policy() };
    assert!(own.cpu_variant(&[parameter("accelerator", "none")]).is_some());
    assert_eq!(own.cpu_variant(&[parameter("gpu_count", "0")]), None, "only the names configured");
}

/// A start of a template's CPU variant waits for no GPU, however long its agent takes; a GPU
/// variant's start of the same template still does. Without series it is `no-gpu`, also once
/// connected and with `gpu_templates` naming its template (not `no-gpu-data`).
#[test]
fn a_cpu_variant_is_never_waiting() {
    use coder_gpu_reclaimer::pass::decide::decide;
    let cpu = parameter("gpu_count", "0");
    let p = policy();
    let (v, r, message) = judged(&starting(Duration::minutes(5), true), &[], &p, None, Some(&cpu));
    assert_eq!((v, r), (Verdict::Skip, Reason::NoGpu), "{message}");
    assert!(message.contains("\"gpu_count\" = \"0\""), "the message names the parameter: {message}");
    let (v, r, message) = judged(&starting(Duration::minutes(5), true), &[], &p, None, None);
    assert_eq!((v, r), (Verdict::Waiting, Reason::WaitingForGpu), "the GPU variant: {message}");
    // Evicted: an agent that lost its connection, of a CPU variant, is no demand either.
    let mut lost = running_workspace(WS_ID, now() - Duration::minutes(30));
    for a in lost.latest_build.resources.iter_mut().flat_map(|r| r.agents.iter_mut()) {
        a.status = AgentStatus::Disconnected;
        a.first_connected_at = Some(now() - Duration::hours(2));
        a.disconnected_at = Some(now() - Duration::minutes(5));
    }
    assert_eq!(judged(&lost, &[], &p, None, Some(&cpu)).1, Reason::NoGpu);
    assert_eq!(judged(&lost, &[], &p, None, None).1, Reason::WaitingForGpu);
    // Connected, no series, its template named a GPU template: a CPU variant has no GPU data to miss.
    let named = Policy { gpu_templates: vec!["*".into()], ..policy() };
    let connected = running_workspace(WS_ID, now() - Duration::minutes(30));
    let (v, r, message) = judged(&connected, &[], &named, None, Some(&cpu));
    assert_eq!((v, r), (Verdict::Skip, Reason::NoGpu), "{message}");
    assert_eq!(decide(now(), &connected, Some(&[]), &named, None).reason, Reason::NoGpuData, "the GPU variant misses its data");
    // Contended: the CPU variant is no demand, the idle GPU stays.
    let contended = Policy { reclaim_when: ReclaimWhen::Contended, ..policy() };
    let idle_ws = running_workspace("1c1d2e3f-0000-4000-8000-000000000001", now() - Duration::minutes(40));
    let facts = PassFacts { gpu_template: true, ..PassFacts::default() };
    for (variant, stops) in [(Some(&cpu), 0), (None, 1)] {
        let mut ds = vec![
            decide_with(now(), &idle_ws, Some(&gpu((0..=40).rev().map(|m| m * 60))), &contended, None, facts),
            decide_with(
                now(),
                &starting(Duration::minutes(5), true),
                Some(&[]),
                &contended,
                None,
                PassFacts { cpu_variant: variant, ..facts },
            ),
        ];
        assert_eq!(apply_fleet_rules(&mut ds, &contended).stop_order.len(), stops, "{variant:?}: {:?}", ds[1]);
    }
}

/// The pass asks for the parameters of a start that may wait (not of one whose pod reports a
/// GPU, nor twice), remembers the answer by build, and learns a template as a GPU template only
/// from two workspaces' series over two passes (issue 42: never from one series), never from a
/// CPU variant's.
#[test]
fn the_judge_reads_a_starts_parameters_once_and_learns_templates_from_two_workspaces() {
    let mut judge = Judge::new(policy(), StdDuration::from_secs(60));
    let at = |pass: i64| now() + Duration::minutes(pass);
    let series = |ws: &Workspace, uuid: &str, pass: i64| {
        series_of(ws, uuid, vec![Point { at: at(pass), values: idle_reading(), energy_joules: None }])
    };
    let mut a = running_workspace("1c1d2e3f-0000-4000-8000-000000000001", now() - Duration::minutes(40));
    let mut b = running_workspace("1c1d2e3f-0000-4000-8000-000000000002", now() - Duration::minutes(40));
    let mut cpu_ws = starting(Duration::minutes(5), true);
    for w in [&mut a, &mut b, &mut cpu_ws] {
        w.template_name = "ml".into();
    }
    let listing = vec![a.clone(), b.clone(), cpu_ws.clone()];
    // (pass, the workspaces with a series, learned after it)
    for (pass, with_series, learned) in [(0, vec![&a], false), (1, vec![&a], false), (2, vec![&a, &b], true)] {
        let mut p = judge.begin(&listing, PassContext::default());
        for (i, w) in with_series.iter().enumerate() {
            let s = series(w, &format!("GPU-{i}"), pass);
            p.merge(&s, &s.points);
        }
        let wanted = p.parameters_wanted(at(pass));
        assert_eq!(wanted.len(), usize::from(learned), "pass {pass}: a start of a GPU template only: {wanted:?}");
        p.decide(at(pass), &Default::default(), |_| Some(true));
        assert_eq!(judge.learned_gpu_templates().len(), usize::from(learned), "pass {pass}");
    }
    let mut p = judge.begin(&listing, PassContext::default());
    assert_eq!(p.parameters_wanted(at(3)), vec![cpu_ws.latest_build.id.clone()], "only the start without a GPU");
    p.know_build_parameters(&cpu_ws.latest_build.id, &[parameter("gpu_count", "0")]);
    assert_eq!(p.parameters_wanted(at(3)), Vec::<String>::new(), "read once per build");
    let judgement = p.decide(at(3), &Default::default(), |_| Some(true));
    assert_eq!((judgement.decisions[2].verdict, judgement.decisions[2].reason), (Verdict::Skip, Reason::NoGpu));
    // Series naming two CPU variants' pods, pass after pass, teach nothing about their template.
    let (mut c, mut d) = (cpu_ws.clone(), cpu_ws.clone());
    (c.id, d.id) = ("1c1d2e3f-0000-4000-8000-00000000000c".into(), "1c1d2e3f-0000-4000-8000-00000000000d".into());
    d.latest_build.id = "7a7a7a7a-0000-4000-8000-00000000000d".into();
    for w in [&mut c, &mut d] {
        w.template_name = "cpu-notebook".into();
    }
    let listing = vec![c.clone(), d.clone()];
    for pass in 4..8 {
        let mut p = judge.begin(&listing, PassContext::default());
        for w in [&c, &d] {
            p.know_build_parameters(&w.latest_build.id, &[parameter("gpu_type", "none")]);
            let s = series(w, &format!("GPU-{}", w.id), pass);
            p.merge(&s, &s.points);
        }
        p.decide(at(pass), &Default::default(), |_| Some(true));
    }
    assert_eq!(judge.learned_gpu_templates(), vec!["ml".to_string()]);
}

/// `check`'s start grace: behind Prometheus a store that keeps a GPU's samples further apart
/// than `exporter_collect_interval` shows a new pod only that late (FAIL, naming the value to
/// set); an agent `connection_timeout` shorter than the grace is said.
#[test]
fn check_says_whether_the_start_grace_covers_what_the_source_shows() {
    use coder_gpu_reclaimer::commands::check_starts::start_grace;
    let p = policy();
    let (ok, detail) = start_grace(&p, Some(StdDuration::from_secs(15)), &[]);
    assert!(ok && detail.contains("for 60s after its agent's creation") && detail.contains("15s apart, within it"), "{detail}");
    let (ok, detail) = start_grace(&p, Some(StdDuration::from_secs(60)), &[]);
    assert!(!ok && detail.contains("set exporter_collect_interval to 60s"), "{detail}");
    let (ok, detail) = start_grace(&p, None, &[never_connected_workspace(now(), 45, false)]);
    assert!(ok && detail.contains("some agents time out after 45s"), "{detail}");
}

/// The backtest judges a start as `run` does (issue 47): a CPU variant the journal saw in
/// `timeout` is no demand when its build's parameters were read with the history, so the idle
/// workspace of the same template is not stopped in a `contended` replay; without them, it is a
/// waiter and the replay stops the idle one, as `run` would with no answer.
#[test]
fn the_backtest_reads_a_start_as_run_does() {
    use reclaimer_core::backtest::replay::{Chunk, Replay};
    use reclaimer_core::backtest::timeline::WorkspaceTimeline;
    // Its template named: a replay of one pass learns none (`LEARN_FROM`).
    let p = Policy { reclaim_when: ReclaimWhen::Contended, gpu_templates: vec!["gpu-*".into()], ..policy() };
    let idle_ws = running_workspace("1c1d2e3f-0000-4000-8000-000000000001", now() - Duration::hours(2));
    let starting_ws = never_connected_workspace(now() - Duration::minutes(50), 120, true);
    let minutely =
        (0..=45).rev().map(|m| Point { at: now() - Duration::minutes(m), values: idle_reading(), energy_joules: Some(1.0e9 - m as f64) });
    let series = [series_of(&idle_ws, "GPU-1", minutely.collect())];
    let stops = |parameters: Option<Vec<BuildParameter>>| {
        let idle = WorkspaceTimeline::new(idle_ws.clone(), vec![idle_ws.latest_build.clone()]);
        let mut starting = WorkspaceTimeline::new(starting_ws.clone(), vec![starting_ws.latest_build.clone()]);
        starting.agents = vec![(now() - Duration::minutes(45), starting_ws.latest_build.id.to_string(), AgentStatus::Timeout)];
        if let Some(values) = parameters {
            starting.parameters.insert(starting_ws.latest_build.id.to_string(), values);
        }
        let mut replay = Replay::new("policy".into(), p.clone(), StdDuration::from_secs(60), StdDuration::from_secs(3600));
        let timelines = [idle, starting];
        let chunk = Chunk::new(&series, &timelines, None);
        replay.pass(now(), None, &timelines, &chunk, StdDuration::from_secs(60), now() + Duration::hours(1));
        replay.stops.len()
    };
    assert_eq!(stops(Some(vec![parameter("gpu_count", "0")])), 0, "the CPU variant's start is no demand");
    assert_eq!(stops(Some(vec![parameter("gpu_count", "1")])), 1, "the GPU variant's start is");
    assert_eq!(stops(None), 1, "unread: a waiter, as run counts it");
}
