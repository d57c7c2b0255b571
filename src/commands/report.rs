//! `report`: reads the audit log and sums it up for the weekly message to management: stops per
//! template and owner, GPU-hours given back (a completed stop's GPUs from its `stop_done` line
//! to its `resumed` line, or to the end of the period; `gpu_seconds_given_back`, the formula the
//! service's own accounting uses), would-stops in observe mode, and the deadlines moved
//! and autostops averted for busy GPU work (`extend_while_busy`); with prices in the
//! log (`gpu_hour_price`), the money given back too. Reads a file only.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::cli::{ReportArgs, ReportFormat};
use crate::error::Error;
use crate::pass::audit::{AuditKind, gpu_seconds_given_back};

/// `report`: the audit log over `--since` before `--until` (default `now`), written to `out` as
/// the format asks.
pub fn run(args: &ReportArgs, now: DateTime<Utc>, out: &mut dyn std::io::Write) -> Result<(), Error> {
    let until = args.until.unwrap_or(now);
    let since = until - crate::duration::chrono(args.since);
    let report = summarize(&args.audit_log, since, until)?;
    let text = match args.output {
        ReportFormat::Table => report.table(),
        ReportFormat::Csv => report.csv(),
        ReportFormat::Json => serde_json::to_string_pretty(&report).map_err(|e| Error::runtime(e.to_string()))? + "\n",
    };
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(|e| Error::runtime(format!("writing the report: {e}")))
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
    /// Coder autostop deadlines moved while the GPU computed (`deadline_extended`), and builds
    /// whose deadline would have been moved (observe mode, once per build).
    pub deadline_extensions: u64,
    pub would_extend: u64,
    /// Builds that ran past the deadline Coder had set because their GPU computed.
    pub autostops_averted: u64,
    /// Coder's countdowns someone came back within (`countdown_averted`): warnings that saved
    /// someone's work.
    pub countdowns_averted: u64,
    pub gpu_hours_given_back: f64,
    /// The given-back GPU-hours priced at what they cost when stopped (priced stops only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_given_back: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditReport {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub rows: Vec<Row>,
    pub total: Row,
    /// The currency of `cost_given_back` (the newest priced line's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
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
    let mut currency = None;
    // A stop not yet resumed gives back until the end of the period.
    let mut open: BTreeMap<String, ((String, String), Stopped)> = BTreeMap::new();
    let give_back = |rows: &mut BTreeMap<(String, String), Row>, key: (String, String), gpu_hours: f64, price: Option<f64>| {
        if gpu_hours <= 0.0 {
            return;
        }
        let row = rows.entry(key).or_default();
        row.gpu_hours_given_back += gpu_hours;
        if let Some(p) = price {
            row.cost_given_back = Some(row.cost_given_back.unwrap_or(0.0) + gpu_hours * p);
        }
    };
    // A stop is counted once per stop build: a line written again for the same build (found
    // after a restart, a lost reply) is the same stop.
    let mut counted: std::collections::HashSet<(String, String)> = std::collections::HashSet::new();
    drop(file);
    let read = crate::pass::audit::read_records(path, |l| {
        let key = (l.template.clone(), l.owner.clone());
        let in_period = l.time >= since && l.time <= until;
        match l.kind() {
            Some(AuditKind::StopSent) if in_period => {
                let first = l.build_id.as_ref().is_none_or(|b| counted.insert((l.workspace_id.clone(), b.clone())));
                if first {
                    rows.entry(key).or_default().stops += 1;
                }
            }
            Some(AuditKind::WouldStop) if in_period => rows.entry(key).or_default().would_stops += 1,
            Some(AuditKind::DeadlineExtended) if in_period => rows.entry(key).or_default().deadline_extensions += 1,
            Some(AuditKind::WouldExtend) if in_period => rows.entry(key).or_default().would_extend += 1,
            Some(AuditKind::AutostopAverted) if in_period => rows.entry(key).or_default().autostops_averted += 1,
            Some(AuditKind::CountdownAverted) if in_period => rows.entry(key).or_default().countdowns_averted += 1,
            Some(kind @ (AuditKind::StopDone | AuditKind::CountdownDone)) => {
                // Coder's stop at the end of a countdown is a reclaim (once per stop build).
                let first = l.build_id.as_ref().is_none_or(|b| counted.insert((l.workspace_id.clone(), b.clone())));
                if kind == AuditKind::CountdownDone && in_period && first {
                    rows.entry(key.clone()).or_default().stops += 1;
                }
                if l.gpu_hour_price.is_some() && l.currency.is_some() {
                    currency.clone_from(&l.currency);
                }
                // Bounded as the service writes them: no pod has more GPUs than a workspace may
                // (`MAX_GPUS_PER_WORKSPACE`), and a price is a finite, plausible number.
                let gpus = l.gpus.unwrap_or(0).min(crate::gpu::MAX_GPUS_PER_WORKSPACE as u64);
                let price = l.gpu_hour_price.filter(|p| p.is_finite() && (0.0..=MAX_GPU_HOUR_PRICE).contains(p));
                let stopped = Stopped { at: l.time, gpus, price };
                open.insert(l.workspace_id.clone(), (key, stopped));
            }
            Some(AuditKind::Resumed) => {
                if let Some((_, stopped)) = open.remove(&l.workspace_id) {
                    // Only the part inside the period counts, and no more than its GPUs for the
                    // time it was stopped: the line's own figure is not trusted (a forged or
                    // corrupted one could claim more).
                    let given = gpu_seconds_given_back(stopped.gpus, stopped.at.max(since), l.time.min(until));
                    give_back(&mut rows, key, given / 3600.0, stopped.price);
                }
            }
            _ => {}
        }
    })
    .map_err(|e| Error::runtime(format!("--audit-log {}: reading failed ({e})", path.display())))?;
    unreadable += read;
    for (_, (key, stopped)) in open {
        let given = gpu_seconds_given_back(stopped.gpus, stopped.at.max(since), until);
        give_back(&mut rows, key, given / 3600.0, stopped.price);
    }
    let mut total = Row { template: "(all)".into(), owner: "(all)".into(), ..Row::default() };
    let rows: Vec<Row> = rows
        .into_iter()
        .filter(|(_, r)| {
            r.stops + r.would_stops + r.deadline_extensions + r.would_extend + r.autostops_averted + r.countdowns_averted > 0
                || r.gpu_hours_given_back > 0.0
        })
        .map(|((template, owner), r)| {
            total.stops += r.stops;
            total.would_stops += r.would_stops;
            total.deadline_extensions += r.deadline_extensions;
            total.would_extend += r.would_extend;
            total.autostops_averted += r.autostops_averted;
            total.countdowns_averted += r.countdowns_averted;
            total.gpu_hours_given_back += r.gpu_hours_given_back;
            if let Some(c) = r.cost_given_back {
                total.cost_given_back = Some(total.cost_given_back.unwrap_or(0.0) + c);
            }
            Row {
                template,
                owner,
                gpu_hours_given_back: round2(r.gpu_hours_given_back),
                cost_given_back: r.cost_given_back.map(round2),
                ..r
            }
        })
        .collect();
    total.gpu_hours_given_back = round2(total.gpu_hours_given_back);
    total.cost_given_back = total.cost_given_back.map(round2);
    Ok(AuditReport { since, until, rows, total, currency, unreadable_lines: unreadable })
}

/// The highest price of one GPU-hour a line may carry; a higher one is not counted.
const MAX_GPU_HOUR_PRICE: f64 = 10_000.0;

/// A completed stop, until its workspace runs again.
struct Stopped {
    at: DateTime<Utc>,
    gpus: u64,
    price: Option<f64>,
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

impl AuditReport {
    /// An aligned table for people (Coder's names with their control characters written out).
    pub fn table(&self) -> String {
        crate::logging::terminal_safe(self.table_text())
    }

    fn table_text(&self) -> String {
        let mut out =
            format!("GPU reclaim report, {} to {}\n\n", self.since.format("%Y-%m-%d %H:%M UTC"), self.until.format("%Y-%m-%d %H:%M UTC"));
        let money = self.currency.as_ref().map(|c| format!("{c} GIVEN BACK"));
        let _ = writeln!(
            out,
            "{:<24} {:<16} {:>6} {:>12} {:>12}{} {:>10} {:>17} {:>18}",
            "TEMPLATE",
            "OWNER",
            "STOPS",
            "WOULD-STOPS",
            "GPU-HOURS",
            money.as_ref().map_or(String::new(), |m| format!(" {m:>16}")),
            "EXTENDED",
            "AUTOSTOPS-AVERTED",
            "COUNTDOWNS-AVERTED"
        );
        for r in self.rows.iter().chain(std::iter::once(&self.total)) {
            let cost = match (&money, r.cost_given_back) {
                (Some(_), Some(c)) => format!(" {c:>16.2}"),
                (Some(_), None) => format!(" {:>16}", "-"),
                (None, _) => String::new(),
            };
            let _ = writeln!(
                out,
                "{:<24} {:<16} {:>6} {:>12} {:>12.2}{cost} {:>10} {:>17} {:>18}",
                r.template,
                r.owner,
                r.stops,
                r.would_stops,
                r.gpu_hours_given_back,
                r.deadline_extensions,
                r.autostops_averted,
                r.countdowns_averted
            );
        }
        if self.unreadable_lines > 0 {
            let _ = writeln!(out, "\n{} line(s) were not audit events and were skipped", self.unreadable_lines);
        }
        out
    }

    /// CSV with a header row (the total last).
    pub fn csv(&self) -> String {
        let mut out = String::from("template,owner,stops,would_stops,gpu_hours_given_back");
        if self.currency.is_some() {
            out.push_str(",cost_given_back,currency");
        }
        out.push_str(",deadline_extensions,would_extend,autostops_averted,countdowns_averted\n");
        let field = |s: &str| {
            // A cell a spreadsheet would run as a formula is written as text.
            let s = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) { format!("'{s}") } else { s.to_string() };
            if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s }
        };
        for r in self.rows.iter().chain(std::iter::once(&self.total)) {
            let _ = write!(out, "{},{},{},{},{:.2}", field(&r.template), field(&r.owner), r.stops, r.would_stops, r.gpu_hours_given_back);
            if let Some(c) = &self.currency {
                let _ = write!(out, ",{},{}", r.cost_given_back.map_or(String::new(), |m| format!("{m:.2}")), field(c));
            }
            let _ = write!(out, ",{},{},{},{}", r.deadline_extensions, r.would_extend, r.autostops_averted, r.countdowns_averted);
            out.push('\n');
        }
        out
    }
}
