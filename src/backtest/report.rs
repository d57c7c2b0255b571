//! The backtest's report: its shape (`Report`, written as JSON with `docs/backtest.md`'s
//! schema), the table for people, and one self-contained HTML page (inline CSS and SVG: a chart
//! of GPU-hours given back against regretted stops per swept value, the top workspaces and
//! templates, the sources and their gaps). Every string from Coder is escaped on the page.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reclaimer_core::backtest::replay::{Replay, SimulatedStop, Totals};
use serde::Serialize;

use crate::duration::human;

fn human_std(d: Duration) -> String {
    human(crate::duration::chrono(d))
}
use crate::pass::page::escape;

/// The report's schema version (`docs/backtest.md`).
pub const SCHEMA_VERSION: u32 = 1;

/// How many workspaces and templates the top lists hold.
const TOP: usize = 10;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema_version: u32,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    #[serde(serialize_with = "seconds")]
    pub interval: Duration,
    #[serde(serialize_with = "seconds")]
    pub regret_window: Duration,
    /// Passes replayed per policy.
    pub passes: u64,
    /// Workspaces read from Coder (named by a GPU series or the journal).
    pub workspaces: usize,
    /// GPU-hours the workspaces' GPUs reported over the window (steps with a reading).
    pub gpu_hours_reported: f64,
    /// No connection source: stops and GPU-hours given back are upper bounds.
    pub upper_bound: bool,
    pub gpu_source: SourceReport,
    pub connections: SourceReport,
    pub notes: Vec<String>,
    pub variants: Vec<VariantReport>,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_secs())
}

/// A source of history: which, what it held, and where it had gaps.
#[derive(Debug, Clone, Serialize)]
pub struct SourceReport {
    pub name: String,
    pub detail: String,
    pub gaps: Vec<String>,
}

/// One policy's (one swept value's) outcome.
#[derive(Debug, Clone, Serialize)]
pub struct VariantReport {
    pub label: String,
    #[serde(flatten)]
    pub totals: Totals,
    /// Passes in which the circuit breaker refused every stop.
    pub breaker_passes: u64,
    /// Reclaims the stop cap left for a later pass, summed over passes.
    pub deferred: u64,
    /// `countdown_in_coder`: Coder's countdowns the history shows a use within (not stopped).
    pub countdowns_averted: u64,
    /// Workspace-passes per verdict.
    pub verdicts: BTreeMap<String, u64>,
    pub top_workspaces: Vec<Top>,
    pub top_templates: Vec<Top>,
    /// Every simulated stop, in time order.
    pub stops: Vec<SimulatedStop>,
}

/// A workspace (`owner/name`) or a template, by GPU-hours given back.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Top {
    pub name: String,
    pub stops: usize,
    pub gpu_hours_given_back: f64,
    pub regretted: usize,
}

fn top(stops: &[SimulatedStop], name: impl Fn(&SimulatedStop) -> String) -> Vec<Top> {
    let mut by: HashMap<String, Top> = HashMap::new();
    for s in stops {
        let n = name(s);
        let t = by.entry(n.clone()).or_insert(Top { name: n, stops: 0, gpu_hours_given_back: 0.0, regretted: 0 });
        t.stops += 1;
        t.gpu_hours_given_back += s.gpu_hours_given_back;
        t.regretted += usize::from(s.regret.is_some());
    }
    let mut out: Vec<Top> = by.into_values().collect();
    out.sort_by(|a, b| b.gpu_hours_given_back.total_cmp(&a.gpu_hours_given_back).then_with(|| a.name.cmp(&b.name)));
    out.truncate(TOP);
    out
}

impl VariantReport {
    pub fn from_replay(replay: Replay) -> Self {
        let verdicts = replay.verdicts().map(|(k, v)| (k.to_string(), v)).collect();
        let stops = replay.stops.into_vec();
        VariantReport {
            label: replay.label,
            totals: Totals::of(&stops),
            breaker_passes: replay.breaker_passes,
            deferred: replay.deferred,
            countdowns_averted: replay.countdowns_averted,
            verdicts,
            top_workspaces: top(&stops, |s| format!("{}/{}", s.who.owner, s.who.workspace)),
            top_templates: top(&stops, |s| s.who.template.clone()),
            stops,
        }
    }
}

fn hours(h: f64) -> String {
    format!("{h:.1}")
}

fn percent(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

impl Report {
    /// "at most " before a figure that depends on connections, when none were seen.
    fn bound(&self) -> &'static str {
        if self.upper_bound { "at most " } else { "" }
    }

    /// The table for people: the sources, one row per policy, then the first policy's top
    /// workspaces and templates (Coder's names with their control characters written out).
    pub fn table(&self) -> String {
        crate::logging::terminal_safe(self.table_text())
    }

    fn table_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "backtest {} to {}: {} passes every {}, {} workspaces, {} GPU-hours reported",
            self.since.to_rfc3339(),
            self.until.to_rfc3339(),
            self.passes,
            human_std(self.interval),
            self.workspaces,
            hours(self.gpu_hours_reported)
        );
        if self.upper_bound {
            let _ = writeln!(out, "NO CONNECTION SOURCE: the GPU alone is the evidence; stops and GPU-hours are upper bounds");
        }
        for (what, s) in [("GPU readings", &self.gpu_source), ("connections", &self.connections)] {
            let _ = writeln!(out, "{what}: {} ({})", s.name, s.detail);
            for g in &s.gaps {
                let _ = writeln!(out, "  gap: {g}");
            }
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        let _ = writeln!(out);
        let bound = if self.upper_bound { " (upper bound)" } else { "" };
        let _ = writeln!(out, "{:<28} {:>6} {:>16} {:>16} {:>8}", "POLICY", "STOPS", "GPU-H GIVEN BACK", "REGRETTED", "BREAKER");
        for v in &self.variants {
            let regretted = format!("{} ({})", v.totals.regretted, percent(v.totals.regretted_share));
            let _ = writeln!(
                out,
                "{:<28} {:>6} {:>16} {:>16} {:>8}",
                v.label,
                v.totals.stop_count,
                hours(v.totals.gpu_hours_given_back),
                regretted,
                v.breaker_passes
            );
        }
        let _ = writeln!(
            out,
            "regretted: within {} after the stop, a connection, GPU compute or a start by the owner{bound}",
            human_std(self.regret_window)
        );
        for v in self.variants.iter().filter(|v| v.countdowns_averted > 0) {
            let _ = writeln!(out, "{}: {} of Coder's countdowns averted by a return (nothing stopped)", v.label, v.countdowns_averted);
        }
        for v in &self.variants {
            if v.stops.is_empty() {
                continue;
            }
            for (what, list) in [("top workspaces", &v.top_workspaces), ("top templates", &v.top_templates)] {
                let _ = writeln!(out, "\n{}: {what}", v.label);
                for t in list {
                    let _ = writeln!(
                        out,
                        "  {:<40} {:>3} stops {:>8} GPU-h {:>3} regretted",
                        t.name,
                        t.stops,
                        hours(t.gpu_hours_given_back),
                        t.regretted
                    );
                }
            }
            let _ = writeln!(out, "{}: regretted stops", v.label);
            for s in v.stops.iter().filter(|s| s.regret.is_some()) {
                let why = s.regret.map_or(String::new(), |r| format!("{:?} at {}", r.kind, r.at.to_rfc3339()).to_lowercase());
                let _ = writeln!(out, "  {}/{} stopped {}: {why}", s.who.owner, s.who.workspace, s.at.to_rfc3339());
            }
        }
        out
    }

    /// One self-contained page: no external asset, every string from Coder escaped.
    pub fn html(&self) -> String {
        let mut h = String::new();
        let _ = write!(
            h,
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Backtest {} to {}</title>\
<style>body{{font:14px system-ui,sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse;margin:1em 0}}\
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}td.n{{text-align:right}}.warn{{background:#fff3cd;padding:8px;border:1px solid #e0c36a}}\
.gap{{color:#a33}}svg text{{font:12px system-ui,sans-serif}}</style></head><body>",
            self.since.format("%Y-%m-%d %H:%M"),
            self.until.format("%Y-%m-%d %H:%M")
        );
        let _ = write!(
            h,
            "<h1>Backtest</h1><p id=\"window\">{} to {}: {} passes every {}, {} workspaces, {} GPU-hours reported.</p>",
            escape(&self.since.to_rfc3339()),
            escape(&self.until.to_rfc3339()),
            self.passes,
            escape(&human_std(self.interval)),
            self.workspaces,
            hours(self.gpu_hours_reported)
        );
        if self.upper_bound {
            h.push_str("<p class=\"warn\" id=\"upper-bound\">No connection source: the GPU alone is the evidence. Stops and GPU-hours given back are upper bounds.</p>");
        }
        h.push_str("<h2>Per policy</h2>");
        h.push_str(&self.chart());
        let _ = write!(
            h,
            "<table id=\"variants\"><tr><th>Policy</th><th>Stops</th><th>GPU-hours given back</th><th>Regretted</th><th>Breaker passes</th></tr>"
        );
        for v in &self.variants {
            let _ = write!(
                h,
                "<tr><td>{}</td><td class=\"n\">{}{}</td><td class=\"n\">{}{}</td><td class=\"n\">{} ({})</td><td class=\"n\">{}</td></tr>",
                escape(&v.label),
                self.bound(),
                v.totals.stop_count,
                self.bound(),
                hours(v.totals.gpu_hours_given_back),
                v.totals.regretted,
                percent(v.totals.regretted_share),
                v.breaker_passes
            );
        }
        h.push_str("</table>");
        let _ = write!(
            h,
            "<p>A stop is regretted when, within {} after it, the real history shows a connection, GPU compute or a start by its owner.</p>",
            escape(&human_std(self.regret_window))
        );
        for v in self.variants.iter().filter(|v| !v.stops.is_empty()) {
            let _ = write!(h, "<h2>{}</h2>", escape(&v.label));
            for (what, list) in [("Top workspaces", &v.top_workspaces), ("Top templates", &v.top_templates)] {
                let _ =
                    write!(h, "<table class=\"top\"><tr><th>{what}</th><th>Stops</th><th>GPU-hours given back</th><th>Regretted</th></tr>");
                for t in list {
                    let _ = write!(
                        h,
                        "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                        escape(&t.name),
                        t.stops,
                        hours(t.gpu_hours_given_back),
                        t.regretted
                    );
                }
                h.push_str("</table>");
            }
        }
        h.push_str("<h2>Sources</h2><table id=\"sources\"><tr><th>History</th><th>Source</th><th>What it held</th><th>Gaps</th></tr>");
        for (what, s) in [("GPU readings", &self.gpu_source), ("Connections", &self.connections)] {
            let gaps = if s.gaps.is_empty() {
                "none".to_string()
            } else {
                s.gaps.iter().map(|g| format!("<div class=\"gap\">{}</div>", escape(g))).collect()
            };
            let _ = write!(h, "<tr><td>{what}</td><td>{}</td><td>{}</td><td>{gaps}</td></tr>", escape(&s.name), escape(&s.detail));
        }
        h.push_str("</table>");
        for n in &self.notes {
            let _ = write!(h, "<p class=\"note\">{}</p>", escape(n));
        }
        h.push_str("</body></html>\n");
        h
    }

    /// Two bars per policy: GPU-hours given back (left scale) and regretted stops (right scale).
    fn chart(&self) -> String {
        let (w, bar_h, top) = (640.0, 180.0, 20.0);
        let n = self.variants.len().max(1) as f64;
        let max_hours = self.variants.iter().map(|v| v.totals.gpu_hours_given_back).fold(0.0, f64::max).max(1e-9);
        let max_regret = self.variants.iter().map(|v| v.totals.regretted).max().unwrap_or(0).max(1) as f64;
        let slot = w / n;
        let mut svg = format!(
            "<svg id=\"chart\" role=\"img\" aria-label=\"GPU-hours given back and regretted stops per policy\" width=\"{w}\" height=\"{}\" viewBox=\"0 0 {w} {}\">",
            bar_h + top + 40.0,
            bar_h + top + 40.0
        );
        for (i, v) in self.variants.iter().enumerate() {
            let x = i as f64 * slot + slot * 0.15;
            let bw = slot * 0.3;
            let gh = v.totals.gpu_hours_given_back / max_hours * bar_h;
            let rh = v.totals.regretted as f64 / max_regret * bar_h;
            let _ = write!(
                svg,
                "<rect class=\"given-back\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{gh:.1}\" fill=\"#2b7bb9\"><title>{}: {} GPU-hours given back</title></rect>\
<rect class=\"regretted\" x=\"{:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{rh:.1}\" fill=\"#d9534f\"><title>{}: {} regretted stops</title></rect>\
<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                top + bar_h - gh,
                escape(&v.label),
                hours(v.totals.gpu_hours_given_back),
                x + bw,
                top + bar_h - rh,
                escape(&v.label),
                v.totals.regretted,
                x + bw,
                top + bar_h + 16.0,
                escape(&v.label)
            );
        }
        let _ = write!(
            svg,
            "<text x=\"0\" y=\"12\" fill=\"#2b7bb9\">GPU-hours given back (max {})</text><text x=\"{}\" y=\"12\" fill=\"#d9534f\" text-anchor=\"end\">regretted stops (max {})</text></svg>",
            hours(max_hours),
            w,
            max_regret
        );
        svg
    }
}
