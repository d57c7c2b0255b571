//! The status page at `/`: the status document as one server-rendered HTML page with no external
//! assets and no build chain (inline CSS, inline SVG sparklines, a small inline script that
//! reloads every 30 s). A fleet summary first, then one row per GPU workspace, the reclaims
//! first, its verdict in words phrased by the mode (`Mode::stop_words`, `Mode::warned_words`:
//! only enforce mode promises a stop), then the recent stops. The countdown column holds a warned
//! row's time left to its `stop_at` (other rows show `-`); its heading is the mode's
//! (`Mode::countdown_heading`): "Would stop in" in observe mode, where nothing is stopped.
//! Every string from Coder is escaped; nothing secret is on it (the document holds no token, and
//! URLs are not shown).

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use crate::duration::human;
use crate::pass::decide::{Reason, Verdict};
use crate::pass::mode::Mode;
use crate::pass::status::{StatusDocument, WorkspaceStatus};

/// HTML-escapes text for element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The order rows are shown in: the reclaims first, then the warned.
fn rank(v: Verdict) -> u8 {
    match v {
        Verdict::Reclaim => 0,
        Verdict::Warn => 1,
        Verdict::Waiting => 2,
        Verdict::Unknown => 3,
        Verdict::Keep => 4,
        Verdict::Skip => 5,
    }
}

/// A verdict and its reason in words.
fn in_words(w: &WorkspaceStatus, mode: Mode) -> String {
    let stop = |why: &str| format!("{}: {why}", mode.stop_words());
    let words = match (w.verdict, w.reason) {
        (Verdict::Reclaim, Reason::PhantomUtilization) => return stop("utilization without real GPU work"),
        (Verdict::Reclaim, Reason::MemoryHeldIdle) => return stop("GPU memory held, nothing computing"),
        (Verdict::Reclaim, Reason::ConnectedButGpuIdle) => return stop("GPU idle behind an open connection"),
        (Verdict::Reclaim, Reason::MaxLifetime) => return stop("past its maximum lifetime"),
        (Verdict::Reclaim, _) => return stop("GPU idle, nobody connected"),
        (Verdict::Warn, _) => mode.warned_words(),
        (Verdict::Waiting, _) => "waiting for a GPU",
        (Verdict::Unknown, Reason::AgentLost) => "unknown: its agent is gone (pod lost?), not counted as waiting",
        (Verdict::Unknown, Reason::FrozenData) => "unknown: the exporter's readings are frozen",
        (Verdict::Unknown, Reason::MetricsDisagree) => "unknown: GPU counters contradict each other",
        (Verdict::Unknown, Reason::NoDeviceSeries) => "unknown: the GPU's device-level series is missing",
        (Verdict::Unknown, Reason::TooManyGpuSeries) => "unknown: more GPU series name it than it can have",
        (Verdict::Unknown, Reason::GpuChanged) => "unknown: a GPU it cannot have appeared",
        (Verdict::Unknown, Reason::SampleGap) => "unknown: a gap in GPU readings",
        (Verdict::Unknown, Reason::StaleData) => "unknown: GPU readings are stale",
        (Verdict::Unknown, _) => "unknown: not enough GPU data",
        (Verdict::Keep, Reason::GpuActive) => "kept: the GPU is computing",
        (Verdict::Keep, Reason::Connected) => "kept: someone is connected",
        (Verdict::Keep, Reason::WarmingUp) => "kept: still watching the GPU",
        (Verdict::Keep, Reason::Starting) => "kept: starting (not counted as waiting for a GPU)",
        (Verdict::Keep, Reason::NoContention) => "kept: nobody waits for a GPU",
        (Verdict::Keep, _) => "kept: not idle long enough",
        (Verdict::Skip, Reason::NoPermission) => "not judged: the token may not stop it in its organization",
        (Verdict::Skip, _) => "not judged",
    };
    words.to_string()
}

/// A small inline SVG of compute activity over the window (0..=100 per sample).
fn sparkline(activity: &[u8]) -> String {
    const W: f64 = 132.0;
    const H: f64 = 24.0;
    if activity.is_empty() {
        return r##"<svg class="spark" width="132" height="24" role="img" aria-label="no GPU data"><line x1="0" y1="23" x2="132" y2="23" stroke="#bbb" stroke-dasharray="3 3"/></svg>"##.into();
    }
    let n = activity.len().max(2) - 1;
    let points: Vec<String> = activity
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{:.1},{:.1}", i as f64 * W / n as f64, H - 1.0 - f64::from(*a) / 100.0 * (H - 2.0)))
        .collect();
    let last = activity.last().copied().unwrap_or(0);
    format!(
        r#"<svg class="spark" width="132" height="24" role="img" aria-label="compute activity, now {last}%"><polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/></svg>"#,
        if last >= 5 { "#2b7a3d" } else { "#b0563c" },
        points.join(" ")
    )
}

fn ago(seconds: Option<i64>) -> String {
    seconds.map_or("-".into(), |s| human(chrono::Duration::seconds(s)))
}

/// Renders the page for `doc` as of `now`.
pub fn render(doc: &StatusDocument, now: DateTime<Utc>) -> String {
    let mode = Mode::of_document(doc.mode);
    let gpu_rows: Vec<&WorkspaceStatus> = {
        let mut rows: Vec<&WorkspaceStatus> =
            doc.workspaces.iter().filter(|w| !(w.verdict == Verdict::Skip && w.gpus.is_empty())).collect();
        rows.sort_by(|a, b| {
            rank(a.verdict).cmp(&rank(b.verdict)).then(b.gpu_idle_seconds.cmp(&a.gpu_idle_seconds)).then(a.name.cmp(&b.name))
        });
        rows
    };
    let count = |f: &dyn Fn(&WorkspaceStatus) -> bool| doc.workspaces.iter().filter(|w| f(w)).map(|w| w.gpus.len().max(1)).sum::<usize>();
    let busy = count(&|w| w.reason == Reason::GpuActive);
    let idle =
        count(&|w| matches!(w.verdict, Verdict::Reclaim | Verdict::Warn) || (w.verdict == Verdict::Keep && w.reason != Reason::GpuActive));
    let unknown = count(&|w| w.verdict == Verdict::Unknown);
    let a = &doc.accounting;
    let mut out = String::with_capacity(4096 + gpu_rows.len() * 900);
    out.push_str(
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>GPU reclaimer</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2329;background:#f6f7f9}
header{background:#1d2329;color:#fff;padding:14px 24px}header h1{font-size:18px;margin:0}header p{margin:4px 0 0;color:#c9d1d9}
main{padding:16px 24px;max-width:1400px}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin-bottom:16px}
.kept{color:#1d4ed8;font-size:12px}
.card{background:#fff;border:1px solid #dde1e6;border-radius:8px;padding:10px 14px;min-width:120px}
.card b{display:block;font-size:22px}.card span{color:#57606a;font-size:12px}
.breaker{background:#fff4e5;border:1px solid #f0b35b;border-radius:8px;padding:10px 14px;margin-bottom:16px}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #dde1e6;border-radius:8px}
th,td{text-align:left;padding:7px 10px;border-bottom:1px solid #eef0f3;vertical-align:middle}
th{font-size:12px;color:#57606a;font-weight:600;background:#fafbfc}
.v{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600}
.v-reclaim{background:#fde2dd;color:#8f2a16}.v-warn{background:#fff0c2;color:#7a5300}.v-waiting{background:#e1ecff;color:#1a4fa0}
.v-unknown{background:#ececec;color:#444}.v-keep{background:#dff3e4;color:#1d6b32}.v-skip{background:#f2f2f2;color:#777}
h2{font-size:15px;margin:20px 0 8px}.why{color:#57606a;font-size:12px}.num{font-variant-numeric:tabular-nums;white-space:nowrap}.empty{padding:24px;color:#57606a}
</style></head><body>"#,
    );
    let _ = write!(
        out,
        r#"<header><h1>GPU reclaimer</h1><p>{} mode &middot; {} workspaces &middot; updated {}</p></header><main>"#,
        escape(doc.mode),
        doc.workspaces.len(),
        doc.generated_at.format("%Y-%m-%d %H:%M:%S UTC")
    );
    let _ = write!(
        out,
        r#"<section class="cards" id="summary"><div class="card"><b id="gpus-busy">{busy}</b><span>GPUs busy</span></div><div class="card"><b id="gpus-idle">{idle}</b><span>GPUs idle</span></div><div class="card"><b id="gpus-unknown">{unknown}</b><span>GPUs unknown</span></div><div class="card"><b id="waiting">{}</b><span>sessions waiting{}</span></div><div class="card"><b>{:.1}</b><span>GPU-hours given back today</span></div><div class="card"><b>{:.1}</b><span>GPU-hours given back, 7 days</span></div><div class="card"><b id="autostops-averted">{}</b><span>autostops averted, 7 days (GPU work kept running)</span></div><div class="card"><b id="countdowns-averted">{}</b><span>countdowns averted, 7 days (someone came back)</span></div></section>"#,
        a.waiting,
        if a.waiting > 0 { format!(", longest {}", human(chrono::Duration::seconds(a.longest_wait_seconds))) } else { String::new() },
        a.gpu_hours_given_back_today,
        a.gpu_hours_given_back_7d,
        a.autostops_averted_7d,
        a.countdowns_averted_7d
    );
    if let Some(c) = &a.cost {
        let cur = escape(&c.currency);
        let _ = write!(
            out,
            r#"<section class="cards" id="cost"><div class="card"><b id="cost-given-back-today">{:.2} {cur}</b><span>given back today</span></div><div class="card"><b>{:.2} {cur}</b><span>given back, 7 days</span></div><div class="card"><b id="cost-idle-today">{:.2} {cur}</b><span>spent on idle GPUs today ({:.1} GPU-hours)</span></div><div class="card"><b>{:.2} {cur}</b><span>spent on idle GPUs, 7 days</span></div></section>"#,
            c.given_back_today, c.given_back_7d, c.idle_today, a.gpu_hours_idle_today, c.idle_7d
        );
    }
    if doc.pools.len() > 1 {
        out.push_str(r#"<section class="cards" id="pools">"#);
        for p in &doc.pools {
            let _ = write!(
                out,
                r#"<div class="card" data-pool="{name}"><b>{} waiting &middot; {} idle</b><span>pool {name}</span></div>"#,
                p.waiting,
                p.idle,
                name = escape(&p.pool)
            );
        }
        out.push_str("</section>");
    }
    for t in &doc.twins {
        let _ = write!(
            out,
            r#"<div class="breaker twin"><b>One GPU, two sources:</b> {} reported by {}: a GPU has one exporter; a second is a copy (forged, or two exporters on one node)</div>"#,
            escape(&t.uuid),
            escape(&t.reported_by.join(", "))
        );
    }
    for n in &doc.no_provisioner {
        let _ = write!(out, r#"<div class="breaker no-provisioner"><b>Stops wait:</b> {}</div>"#, escape(&n.words()));
    }
    for p in &doc.problems {
        let _ = write!(out, r#"<div class="breaker problem"><b>The service cannot see GPUs:</b> {}</div>"#, escape(p));
    }
    for h in &doc.held_outside {
        let _ = write!(out, r#"<div class="breaker held-outside"><b>GPU held outside Coder:</b> {}</div>"#, escape(&h.words()));
    }
    if let Some(b) = &doc.breaker {
        let _ = write!(out, r#"<div class="breaker" id="breaker"><b>Circuit breaker open:</b> {}</div>"#, escape(b));
    }
    if gpu_rows.is_empty() {
        out.push_str(r#"<div class="empty">No GPU workspaces are running.</div>"#);
    } else {
        let _ = write!(
            out,
            r#"<table id="workspaces"><thead><tr><th>Owner</th><th>Workspace</th><th>Template</th><th>Verdict</th><th>GPU idle</th><th>No connection</th><th>{}</th><th>Compute over the window</th></tr></thead><tbody>"#,
            mode.countdown_heading()
        );
        for w in gpu_rows {
            // In observe mode: when enforce mode would stop it.
            let countdown = match (w.verdict, w.stop_at) {
                (Verdict::Warn, Some(t)) => human(t - now),
                _ => "-".into(),
            };
            let _ = write!(
                out,
                r#"<tr data-verdict="{v}" data-id="{id}"><td>{owner}</td><td>{name}</td><td>{template}</td><td><span class="v v-{v}">{v}</span> <span class="why" title="{msg}">{words}</span>{kept}</td><td class="num">{idle}</td><td class="num">{conn}</td><td class="num countdown">{countdown}</td><td>{spark}</td></tr>"#,
                v = w.verdict.as_str(),
                id = escape(&w.id),
                owner = escape(&w.owner),
                name = escape(&w.name),
                template = escape(&w.template),
                msg = escape(&w.message),
                words = in_words(w, mode),
                kept = w.kept_running.as_ref().map_or(String::new(), |k| format!(r#"<br><span class="kept">{}</span>"#, escape(&k.text))),
                idle = ago(w.gpu_idle_seconds),
                conn = ago(Some(w.connection_idle_seconds)),
                spark = sparkline(&w.activity),
            );
        }
        out.push_str("</tbody></table>");
    }
    if !a.recent_stops.is_empty() {
        let priced = a.cost.is_some();
        let _ = write!(
            out,
            r#"<h2>Recently stopped</h2><table id="recent-stops"><thead><tr><th>Owner</th><th>Workspace</th><th>Template</th><th>GPUs</th><th>Stopped</th><th>Runs again</th><th>GPU-hours given back</th>{}</tr></thead><tbody>"#,
            if priced { "<th>Given back</th>" } else { "" }
        );
        for r in &a.recent_stops {
            let cost = match (&a.cost, r.cost_given_back) {
                (Some(c), Some(m)) => format!(r#"<td class="num">{m:.2} {}</td>"#, escape(&c.currency)),
                (Some(_), None) => r#"<td class="num">-</td>"#.into(),
                _ => String::new(),
            };
            let _ = write!(
                out,
                r#"<tr data-id="{id}"><td>{owner}</td><td>{name}</td><td>{template}</td><td class="num">{gpus}</td><td class="num">{stopped} ago</td><td class="num">{resumed}</td><td class="num">{hours:.2}</td>{cost}</tr>"#,
                id = escape(&r.workspace_id),
                owner = escape(&r.owner),
                name = escape(&r.workspace),
                template = escape(&r.template),
                gpus = r.gpus,
                stopped = human(now - r.stopped_at),
                resumed = r.resumed_at.map_or("not yet".into(), |t| format!("after {}", human(t - r.stopped_at))),
                hours = r.gpu_hours_given_back,
            );
        }
        out.push_str("</tbody></table>");
    }
    out.push_str(r#"</main><script>setTimeout(function(){location.reload()},30000)</script></body></html>"#);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_coder_sends() {
        assert_eq!(escape(r#"<script>alert("x")</script>&'"#), "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;");
    }

    fn row(verdict: Verdict, reason: Reason, message: &str) -> WorkspaceStatus {
        WorkspaceStatus {
            id: "w".into(),
            name: "w".into(),
            owner: "o".into(),
            template: "t".into(),
            verdict,
            reason,
            message: message.into(),
            gpu_idle_seconds: Some(600),
            connection_idle_seconds: 600,
            last_used_at: DateTime::UNIX_EPOCH,
            stop_at: Some(DateTime::UNIX_EPOCH),
            deadline: None,
            kept_running: None,
            gpus: Vec::new(),
            activity: Vec::new(),
        }
    }

    #[test]
    fn only_enforce_mode_promises_a_stop() {
        for (verdict, reason) in [(Verdict::Reclaim, Reason::Idle), (Verdict::Reclaim, Reason::MaxLifetime), (Verdict::Warn, Reason::Idle)]
        {
            let w = row(verdict, reason, "");
            let observe = in_words(&w, Mode::of_document("observe"));
            let plan = in_words(&w, Mode::of_document("plan"));
            let enforce = in_words(&w, Mode::of_document("enforce"));
            assert!(
                observe.contains("would be stopped") && !observe.contains("to be stopped") && !observe.contains("stops unless"),
                "{observe}"
            );
            assert_eq!(plan, observe, "plan promises nothing either");
            assert!(!enforce.contains("would"), "{enforce}");
        }
    }

    #[test]
    fn the_page_in_observe_mode_promises_no_stop() {
        for name in ["observe", "plan", "enforce"] {
            let mut doc = StatusDocument::empty(name);
            let left = chrono::Duration::minutes(10);
            doc.workspaces.push(row(Verdict::Warn, Reason::Idle, &Mode::of_document(name).countdown(left)));
            doc.workspaces.push(row(Verdict::Reclaim, Reason::Idle, "GPU idle"));
            let page = render(&doc, DateTime::UNIX_EPOCH);
            // Case matters: the column heading is "Stops in" only where a stop is promised.
            let promises = ["to be stopped", "stops unless", "stops in", "Stops in"].iter().any(|p| page.contains(p));
            assert_eq!(promises, name == "enforce", "{name}: {page}");
            assert_eq!(page.contains("would be stopped"), name != "enforce", "{name}: {page}");
            assert_eq!(page.contains("<th>Would stop in</th>"), name != "enforce", "{name}: {page}");
        }
    }

    #[test]
    fn a_gpu_held_outside_coder_is_a_banner_in_words_people_can_act_on() {
        let mut doc = StatusDocument::empty("enforce");
        doc.held_outside.push(crate::pass::outside::HeldOutside {
            workspace_id: "w".into(),
            workspace: "train<1>".into(),
            owner: "alice".into(),
            template: "gpu".into(),
            transition: "stop",
            job_status: "canceled",
            since: DateTime::UNIX_EPOCH,
        });
        let page = render(&doc, DateTime::UNIX_EPOCH);
        assert!(
            page.contains("<b>GPU held outside Coder:</b> alice/train&lt;1&gt; holds a GPU outside Coder&#39;s running workspaces"),
            "{page}"
        );
        assert!(page.contains("(latest build: stop, canceled)") && page.contains("start and stop it in Coder"), "{page}");
        assert!(!render(&StatusDocument::empty("enforce"), DateTime::UNIX_EPOCH).contains("held outside"));
    }

    #[test]
    fn sparklines_scale_to_the_box() {
        let s = sparkline(&[0, 100]);
        assert!(s.contains("points=\"0.0,23.0 132.0,1.0\""), "{s}");
        assert!(sparkline(&[]).contains("no GPU data"));
    }
}
