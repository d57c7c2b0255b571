//! `report`: reads the audit log and sums it up for the weekly message to management: stops per
//! template and owner, GPU-hours given back (from each `resumed` line, and stops not yet resumed
//! counted until the end of the period), and would-stops in observe mode. Reads a file only.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::BufRead;
use std::path::Path;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// The fields of an audit line the report reads (the rest are ignored).
#[derive(Debug, Deserialize)]
struct Line {
    time: DateTime<Utc>,
    event: String,
    #[serde(default)]
    workspace_id: String,
    #[serde(default)]
    owner: String,
    #[serde(default)]
    template: String,
    #[serde(default)]
    gpus: Option<u64>,
    #[serde(default)]
    gpu_seconds_given_back: Option<i64>,
}

/// One row: a template and an owner.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Row {
    pub template: String,
    pub owner: String,
    /// Stop builds sent (enforce mode).
    pub stops: u64,
    /// Stops that would have been sent (observe mode).
    pub would_stops: u64,
    pub gpu_hours_given_back: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditReport {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub rows: Vec<Row>,
    pub total: Row,
    /// Lines that were not audit events (skipped).
    pub unreadable_lines: usize,
}

/// Sums up the audit log over `since..until`.
pub fn summarize(path: &Path, since: DateTime<Utc>, until: DateTime<Utc>) -> Result<AuditReport, Error> {
    let file = std::fs::File::open(path).map_err(|e| {
        Error::config(format!("--audit-log {}: cannot read it ({e}); pass the file `run --audit-log` writes", path.display()))
    })?;
    let mut rows: BTreeMap<(String, String), Row> = BTreeMap::new();
    let mut unreadable = 0;
    // A stop not yet resumed gives back until the end of the period.
    let mut open: BTreeMap<String, (String, String, DateTime<Utc>, u64)> = BTreeMap::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line.map_err(|e| Error::runtime(format!("--audit-log {}: reading failed ({e})", path.display())))?;
        if line.trim().is_empty() {
            continue;
        }
        let Ok(l) = serde_json::from_str::<Line>(&line) else {
            unreadable += 1;
            continue;
        };
        let key = (l.template.clone(), l.owner.clone());
        let in_period = l.time >= since && l.time <= until;
        match l.event.as_str() {
            "stop_sent" if in_period => rows.entry(key).or_default().stops += 1,
            "would_stop" if in_period => rows.entry(key).or_default().would_stops += 1,
            "stop_done" => {
                open.insert(l.workspace_id.clone(), (l.template, l.owner, l.time, l.gpus.unwrap_or(0)));
            }
            "resumed" => {
                if let Some((_, _, stopped, _)) = open.remove(&l.workspace_id) {
                    // Only the part inside the period counts.
                    let (from, to) = (stopped.max(since), l.time.min(until));
                    let whole = (l.time - stopped).num_seconds().max(1) as f64;
                    let given = l.gpu_seconds_given_back.unwrap_or(0) as f64;
                    if to > from {
                        rows.entry(key).or_default().gpu_hours_given_back += given * (to - from).num_seconds() as f64 / whole / 3600.0;
                    }
                }
            }
            _ => {}
        }
    }
    for (_, (template, owner, stopped, gpus)) in open {
        let from = stopped.max(since);
        if until > from {
            rows.entry((template, owner)).or_default().gpu_hours_given_back += (until - from).num_seconds() as f64 * gpus as f64 / 3600.0;
        }
    }
    let mut total = Row { template: "(all)".into(), owner: "(all)".into(), ..Row::default() };
    let rows: Vec<Row> = rows
        .into_iter()
        .filter(|(_, r)| r.stops > 0 || r.would_stops > 0 || r.gpu_hours_given_back > 0.0)
        .map(|((template, owner), r)| {
            total.stops += r.stops;
            total.would_stops += r.would_stops;
            total.gpu_hours_given_back += r.gpu_hours_given_back;
            Row { template, owner, gpu_hours_given_back: round2(r.gpu_hours_given_back), ..r }
        })
        .collect();
    total.gpu_hours_given_back = round2(total.gpu_hours_given_back);
    Ok(AuditReport { since, until, rows, total, unreadable_lines: unreadable })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

impl AuditReport {
    /// An aligned table for people.
    pub fn table(&self) -> String {
        let mut out =
            format!("GPU reclaim report, {} to {}\n\n", self.since.format("%Y-%m-%d %H:%M UTC"), self.until.format("%Y-%m-%d %H:%M UTC"));
        let _ = writeln!(out, "{:<24} {:<16} {:>6} {:>12} {:>12}", "TEMPLATE", "OWNER", "STOPS", "WOULD-STOPS", "GPU-HOURS");
        for r in self.rows.iter().chain(std::iter::once(&self.total)) {
            let _ =
                writeln!(out, "{:<24} {:<16} {:>6} {:>12} {:>12.2}", r.template, r.owner, r.stops, r.would_stops, r.gpu_hours_given_back);
        }
        if self.unreadable_lines > 0 {
            let _ = writeln!(out, "\n{} line(s) were not audit events and were skipped", self.unreadable_lines);
        }
        out
    }

    /// CSV with a header row (the total last).
    pub fn csv(&self) -> String {
        let mut out = String::from("template,owner,stops,would_stops,gpu_hours_given_back\n");
        let field = |s: &str| if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() };
        for r in self.rows.iter().chain(std::iter::once(&self.total)) {
            let _ = writeln!(out, "{},{},{},{},{:.2}", field(&r.template), field(&r.owner), r.stops, r.would_stops, r.gpu_hours_given_back);
        }
        out
    }
}
