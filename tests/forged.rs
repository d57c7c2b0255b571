//! Forged series move no deadline (issue 42), table-tested on a clock passed in: where the metrics
//! store can be written (a VictoriaMetrics import, a Pushgateway with `honor_labels`,
//! remote-write), busy series naming a pod must not keep Coder's autostop away from it. An
//! extension needs the same provenance as a stop: never for a workspace outside `gpu_templates`
//! when set, never on a twin, and never on a GPU whose `UUID` appeared mid-session (a copy with a
//! fresh UUID is a second device the pod never had: `unknown`). The other cases (a template
//! learned from one series, a 1 MB `instance`, an over-cap pod among 1,000) are in
//! `tests/starts.rs` and `tests/sources.rs`.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use coder_gpu_reclaimer::coder::types::Workspace;
use coder_gpu_reclaimer::gpu::signals::{Signal, SignalValues};
use coder_gpu_reclaimer::gpu::window::{GpuWindow, Windows};
use coder_gpu_reclaimer::gpu::{Attribution, GpuKey, GpuSeries, Point};
use coder_gpu_reclaimer::pass::decide::{PassFacts, Reason, Verdict, decide_with};
use coder_gpu_reclaimer::pass::policy::Policy;

use crate::common::{WS_ID, running_workspace};

fn now() -> DateTime<Utc> {
    // After the fixtures' builds (16:01), on a minute's end.
    DateTime::parse_from_rfc3339("2026-11-29T18:00:00Z").unwrap().with_timezone(&Utc)
}

/// The seed's busy matmul: SM_ACTIVE 0.984 on an A10G.
fn busy() -> SignalValues {
    SignalValues::default()
        .with(Signal::GpuUtil, 1.0)
        .with(Signal::FbUsedMib, 850.0)
        .with(Signal::PowerWatts, 299.2)
        .with(Signal::GrEngineActive, 1.0)
        .with(Signal::SmActive, 0.984)
}

const POD: &str = "7d9f8b6c5d-x2x9k";

fn key(uuid: &str) -> GpuKey {
    GpuKey { uuid: uuid.into(), gpu_instance: None, pod: Some(format!("coder-{WS_ID}-{POD}")) }
}

/// One GPU busy every minute over the last 40.
fn busy_gpu() -> Vec<GpuWindow> {
    let mut w = GpuWindow::new(key("GPU-585834da-1c2b-4d5e-8f90-a1b2c3d4e5f6"), Arc::from("http://10.0.0.7:9400/metrics"));
    for m in (0..=40).rev() {
        w.push(coder_gpu_reclaimer::gpu::window::GpuSample { at: now() - Duration::minutes(m), values: busy() });
    }
    vec![w]
}

/// Nobody connected for 40 minutes, the start 2 hours ago, Coder's deadline 10 minutes away.
fn unattended(template: &str) -> Workspace {
    let mut w = running_workspace(WS_ID, now() - Duration::minutes(40));
    w.template_name = template.into();
    w.latest_build.job.completed_at = Some(now() - Duration::hours(2));
    w.latest_build.deadline = Some(now() + Duration::minutes(10));
    w
}

fn extending(gpu_templates: &[&str]) -> Policy {
    let mut p = Policy::defaults(StdDuration::from_secs(60));
    p.thresholds.extend_while_busy = true;
    p.gpu_templates = gpu_templates.iter().map(|t| t.to_string()).collect();
    p
}

#[test]
fn busy_series_move_a_deadline_only_with_provenance() {
    let gpus = busy_gpu();
    // (what, template, gpu_templates, twinned, a GPU appeared mid-session, verdict, reason, moved)
    type Case<'a> = (&'a str, &'a str, &'a [&'a str], bool, bool, Verdict, Reason, bool);
    let cases: [Case; 6] = [
        ("a GPU template's busy GPU: moved", "gpu-a10g", &["gpu-*"], false, false, Verdict::Keep, Reason::GpuActive, true),
        ("a CPU workspace with busy series, gpu_templates set", "cpu-small", &["gpu-*"], false, false, Verdict::Skip, Reason::NoGpu, false),
        ("gpu_templates unset: every template, as learned", "cpu-small", &[], false, false, Verdict::Keep, Reason::GpuActive, true),
        ("a twin (two targets report the GPU)", "gpu-a10g", &["gpu-*"], true, false, Verdict::Keep, Reason::GpuActive, false),
        ("a twin, gpu_templates unset", "cpu-small", &[], true, false, Verdict::Keep, Reason::GpuActive, false),
        ("a GPU with a fresh UUID appeared mid-session", "gpu-a10g", &["gpu-*"], false, true, Verdict::Unknown, Reason::GpuChanged, false),
    ];
    for (what, template, templates, twinned, changed, verdict, reason, moved) in cases {
        let p = extending(templates);
        let facts = PassFacts {
            gpu_template: p.is_gpu_template(template),
            twinned,
            gpu_changed_at: changed.then(|| now() - Duration::minutes(5)),
            ..PassFacts::default()
        };
        let d = decide_with(now(), &unattended(template), Some(&gpus), &p, None, facts);
        assert_eq!((d.verdict, d.reason), (verdict, reason), "{what}: {}", d.message);
        assert_eq!(d.deadline.as_ref().and_then(|plan| plan.extend_to()).is_some(), moved, "{what}: {}", d.message);
        if twinned {
            assert!(
                d.message.ends_with("its deadline is not moved: one of its GPUs is reported by two scrape targets (a twin)"),
                "{}",
                d.message
            );
        }
    }
}

/// A series with a fresh `UUID` naming a pod whose GPU has been read for a while is a device the
/// pod never had; the GPUs of one pod arriving in one scrape (or a step or two apart) are not.
#[test]
fn a_fresh_uuid_on_a_pod_mid_session_is_a_copy() {
    let series = |uuid: &str, from_min: i64| GpuSeries {
        key: key(uuid),
        workspace_id: Some(WS_ID.into()),
        namespace: Some("coder".into()),
        model: Some("NVIDIA A10G".into()),
        source: Arc::from("http://prometheus:9090"),
        attribution: Attribution::Exclusive,
        real_pod_uid: false,
        points: (0..=from_min).rev().map(|m| Point { at: now() - Duration::minutes(m), values: busy(), energy_joules: None }).collect(),
    };
    // (what, the second GPU's first point in minutes ago, flagged)
    for (what, second_from, flagged) in [
        ("both from the pod's first step (a two-GPU pod)", 30, false),
        ("the second a step later (a missed scrape)", 29, false),
        ("the second 10 minutes later: a copy", 20, true),
    ] {
        let mut windows = Windows::new(Duration::minutes(60), StdDuration::from_secs(60));
        windows.record(&series("GPU-aaaaaaaa-0000-4000-8000-000000000001", 30), None, true);
        windows.record(&series("GPU-bbbbbbbb-0000-4000-8000-000000000002", second_from), None, true);
        assert_eq!(windows.changed_at(WS_ID).is_some(), flagged, "{what}");
    }
    // Exporters read directly: both GPUs in one scrape, merged before the pass's flush.
    let mut windows = Windows::new(Duration::minutes(60), StdDuration::from_secs(60));
    let scrape = |uuid: &str| GpuSeries { points: vec![Point { at: now(), values: busy(), energy_joules: None }], ..series(uuid, 0) };
    windows.record(&scrape("GPU-aaaaaaaa-0000-4000-8000-000000000001"), None, false);
    windows.record(&scrape("GPU-bbbbbbbb-0000-4000-8000-000000000002"), None, false);
    windows.flush();
    assert!(windows.changed_at(WS_ID).is_none());
    // A new build is a new session: forgotten.
    let mut windows = Windows::new(Duration::minutes(60), StdDuration::from_secs(60));
    windows.record(&series("GPU-aaaaaaaa-0000-4000-8000-000000000001", 30), None, true);
    windows.record(&series("GPU-cccccccc-0000-4000-8000-000000000003", 5), None, true);
    assert!(windows.changed_at(WS_ID).is_some());
    windows.forget(WS_ID);
    assert!(windows.changed_at(WS_ID).is_none());
    // A GPU of the pod whose window aged out after a long gap comes back as one it had.
    let mut windows = Windows::new(Duration::minutes(5), StdDuration::from_secs(60));
    windows.record(&series("GPU-aaaaaaaa-0000-4000-8000-000000000001", 30), None, true);
    let gone = GpuSeries {
        points: (20..=30).rev().map(|m| Point { at: now() - Duration::minutes(m), values: busy(), energy_joules: None }).collect(),
        ..series("GPU-bbbbbbbb-0000-4000-8000-000000000002", 0)
    };
    windows.record(&gone, None, true);
    windows.prune(now(), |id| id == WS_ID);
    assert_eq!(windows.get(WS_ID).map(<[GpuWindow]>::len), Some(1), "the second GPU's window aged out");
    let back = GpuSeries {
        points: vec![Point { at: now(), values: busy(), energy_joules: None }],
        ..series("GPU-bbbbbbbb-0000-4000-8000-000000000002", 0)
    };
    windows.record(&back, None, true);
    assert!(windows.changed_at(WS_ID).is_none(), "a GPU the pod had is no new one");
}
