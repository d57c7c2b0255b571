//! One vocabulary for the audit line: every kind the service writes, written by the real writer
//! (`AuditLog`), is read back by the one reader (`read_records`) under the same names, field by
//! field, and counted by `report` where the report counts it.

use chrono::{DateTime, Duration, Utc};
use coder_gpu_reclaimer::commands::report::summarize;
use coder_gpu_reclaimer::pass::audit::{AuditEvent, AuditKind, AuditLog, Extension, read_records};

use crate::common::Scratch;

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
}

/// An event of `kind` with every field the writer may write set, distinct per kind.
fn event(kind: AuditKind, time: DateTime<Utc>, n: usize) -> AuditEvent {
    AuditEvent {
        time,
        event: kind,
        mode: if kind.as_str().starts_with("would") { "observe" } else { "enforce" },
        workspace_id: format!("0b7c1a2e-1f4d-4c9e-9d3b-{n:012}"),
        workspace: format!("ws-{n}"),
        owner: "alice".into(),
        template: "gpu-a10g".into(),
        reason: "idle",
        message: format!("line {n}: GPU idle 41m"),
        gpu_idle_seconds: Some(2460),
        connection_idle_seconds: 2280,
        build_id: Some(format!("11111111-0000-4000-8000-{n:012}")),
        stop_at: Some(time + Duration::minutes(10)),
        attempts: Some(1),
        gpus: Some(2),
        gpu_seconds_given_back: Some(7200),
        gpu_hour_price: Some(0.75),
        currency: Some("USD".into()),
        extension: Some(Extension {
            deadline_from: time,
            deadline_to: time + Duration::hours(2),
            deadline_limit: time + Duration::hours(24),
            limited_by: "extend_limit",
            sm_active_peak: Some(0.4),
            gr_engine_active_peak: Some(0.9),
        }),
    }
}

#[test]
fn every_kind_written_is_read_back_under_the_same_names() {
    let dir = Scratch::of("audit-vocabulary", []);
    let path = dir.0.join("audit.jsonl");
    let log = AuditLog::open(&path).unwrap();
    let start = at("2026-11-25T10:00:00Z");
    let written: Vec<AuditEvent> =
        AuditKind::ALL.iter().enumerate().map(|(n, kind)| event(*kind, start + Duration::minutes(n as i64), n)).collect();
    for e in &written {
        assert!(log.append(e), "{:?} written", e.event);
    }
    let mut read = Vec::new();
    let unreadable = read_records(&path, |r| read.push(r)).unwrap();
    assert_eq!(unreadable, 0);
    assert_eq!(read.len(), AuditKind::ALL.len(), "one record per line written");
    for (w, r) in written.iter().zip(&read) {
        assert_eq!(r.kind(), Some(w.event), "the reader names the kind the writer wrote ({})", r.event);
        assert_eq!(r.event, w.event.as_str());
        assert_eq!(
            (r.time, &r.workspace_id, &r.workspace, &r.owner, &r.template, r.reason.as_str(), &r.message),
            (w.time, &w.workspace_id, &w.workspace, &w.owner, &w.template, w.reason, &w.message),
            "{:?}",
            w.event
        );
        assert_eq!(
            (&r.build_id, r.gpus, r.gpu_seconds_given_back, r.gpu_hour_price, &r.currency),
            (&w.build_id, w.gpus, w.gpu_seconds_given_back, w.gpu_hour_price, &w.currency),
            "{:?}",
            w.event
        );
    }
    // Every kind has one spelling, and no two kinds share it.
    let names: std::collections::BTreeSet<&str> = AuditKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(names.len(), AuditKind::ALL.len());

    // The report counts each kind it reports on once. Each line is another workspace's, so the
    // completed stop has no `resumed` of its own: its 2 GPUs give back until the period ends.
    let until = start + Duration::days(1);
    let report = summarize(&path, start - Duration::days(1), until).unwrap();
    let t = &report.total;
    assert_eq!((t.stops, t.would_stops, t.deadline_extensions, t.would_extend, t.autostops_averted), (1, 1, 1, 1, 1), "{t:?}");
    let done = written.iter().find(|e| e.event == AuditKind::StopDone).unwrap().time;
    let hours = 2.0 * (until - done).num_seconds() as f64 / 3600.0;
    assert_eq!(t.gpu_hours_given_back, (hours * 100.0).round() / 100.0, "{t:?}");
}

#[test]
fn a_resumed_stop_gives_back_its_gpus_for_the_time_it_was_stopped() {
    let dir = Scratch::of("audit-given-back", []);
    let path = dir.0.join("audit.jsonl");
    let log = AuditLog::open(&path).unwrap();
    let done = at("2026-11-25T10:00:00Z");
    let resumed = done + Duration::minutes(90);
    let mut stop_done = event(AuditKind::StopDone, done, 1);
    stop_done.gpu_seconds_given_back = None;
    // A forged resumed line claims far more than 2 GPUs for 90 minutes.
    let back = AuditEvent { event: AuditKind::Resumed, time: resumed, gpu_seconds_given_back: Some(1 << 40), ..stop_done.clone() };
    assert!(log.append(&stop_done) && log.append(&back));
    let whole = summarize(&path, done - Duration::hours(1), resumed + Duration::hours(1)).unwrap();
    assert_eq!(whole.total.gpu_hours_given_back, 3.0, "2 GPUs x 1.5 h");
    let half = summarize(&path, done + Duration::minutes(45), resumed + Duration::hours(1)).unwrap();
    assert_eq!(half.total.gpu_hours_given_back, 1.5, "only the part inside the period");
    assert_eq!(whole.total.cost_given_back, Some(2.25), "priced at 0.75 a GPU-hour");
}
