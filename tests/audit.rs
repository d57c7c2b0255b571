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
    // completed stops have no `resumed` of their own: their 2 GPUs give back until the period ends.
    let until = start + Duration::days(1);
    let report = summarize(&path, start - Duration::days(1), until).unwrap();
    let t = &report.total;
    // Two stops: the service's own (`stop_sent`) and Coder's at the end of a countdown (`countdown_done`).
    let counts = (t.stops, t.would_stops, t.deadline_extensions, t.would_extend, t.autostops_averted, t.countdowns_averted);
    assert_eq!(counts, (2, 1, 1, 1, 1, 1), "{t:?}");
    // Both completed stops give back their 2 GPUs until the period ends.
    let done = |kind| written.iter().find(|e| e.event == kind).unwrap().time;
    let seconds = (until - done(AuditKind::StopDone)) + (until - done(AuditKind::CountdownDone));
    let hours = 2.0 * seconds.num_seconds() as f64 / 3600.0;
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

/// `report` bounds what it reads from a line (issue 42): a forged `stop_done` claiming 2^40 GPUs
/// at a price of 1e300 counts at most 64 GPUs, and no money; names with terminal escape
/// sequences are written out in the table.
#[test]
fn a_forged_line_cannot_inflate_the_report_or_drive_the_terminal() {
    let dir = Scratch::of("audit-forged", []);
    let path = dir.0.join("audit.jsonl");
    let log = AuditLog::open(&path).unwrap();
    let done = at("2026-11-25T10:00:00Z");
    let mut forged = event(AuditKind::StopDone, done, 1);
    forged.gpus = Some(1 << 40);
    forged.gpu_hour_price = Some(1e300);
    forged.currency = Some("USD".into());
    forged.owner = "eve\u{1b}[2J\u{1b}[H".into();
    assert!(log.append(&forged));
    let report = summarize(&path, done, done + Duration::hours(1)).unwrap();
    assert_eq!(report.total.gpu_hours_given_back, 64.0, "at most 64 GPUs for the hour");
    assert_eq!(report.total.cost_given_back, None, "an implausible price counts no money");
    let table = report.table();
    assert!(!table.contains('\u{1b}') && table.contains("eve\\u{1b}[2J"), "{table}");
}

/// The audit log rotates by size (issue 42): past its bound the file becomes `<path>.1` and a new
/// one begins, so a volume never fills and stops all reclaiming; the reader (recovery, `report`)
/// reads the older half first, so a stop sent before the rotation and done after it is one stop,
/// given back across both halves.
#[test]
fn the_audit_log_rotates_by_size_and_both_halves_read_back_in_order() {
    let dir = Scratch::of("audit-rotate", []);
    let path = dir.0.join("audit.jsonl");
    let log = AuditLog::open_bounded(&path, 4096).unwrap();
    let t0 = at("2026-11-25T10:00:00Z");
    let mut written = 0;
    for n in 0..40 {
        assert!(log.append(&event(AuditKind::WouldStop, t0 + Duration::minutes(n), n as usize)));
        written += 1;
    }
    let (now, old) = (std::fs::metadata(&path).unwrap().len(), std::fs::metadata(dir.0.join("audit.jsonl.1")).unwrap().len());
    assert!(now <= 4096 && old <= 4096, "each half within the bound: {now}, {old}");
    let mut times = Vec::new();
    read_records(&path, |r| times.push(r.time)).unwrap();
    assert!(times.len() < written && times.len() >= 8, "the two newest halves: {} of {written}", times.len());
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "the older half first");
    assert_eq!(times.last(), Some(&(t0 + Duration::minutes(39))), "the newest line last");
    // A stop done in the older half and resumed in the newer: given back across the rotation.
    let log = AuditLog::open_bounded(&path, 1).unwrap();
    let mut done = event(AuditKind::StopDone, t0 + Duration::hours(1), 99);
    done.gpu_seconds_given_back = None;
    let resumed = AuditEvent { event: AuditKind::Resumed, time: done.time + Duration::minutes(30), ..done.clone() };
    assert!(log.append(&done) && log.append(&resumed), "each line alone past the bound: a rotation between them");
    let report = summarize(&path, done.time, resumed.time + Duration::hours(1)).unwrap();
    assert_eq!(report.total.gpu_hours_given_back, 1.0, "2 GPUs for 30 minutes, read across both halves");
}
