//! `backtest`: the policy replayed over a past window (`backtest`), its report written as a
//! table, JSON or one HTML page; a progress line on stderr while history is fetched. Reads
//! Prometheus and Coder only: nothing is stopped, and no actuator exists.

use std::io::{IsTerminal, Write};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::backtest::report::Report;
use crate::backtest::{ConnectionChoice, Plan, Progress};
use crate::cli::{BacktestArgs, BacktestFormat, ConnectionsArg};
use crate::config::{Settings, swept_policies};
use crate::error::Error;
use crate::gpu::{SourceConfig, SourceContext};
use crate::pass::metrics::Metrics;

/// The longest window one backtest replays.
const MAX_WINDOW: chrono::Duration = chrono::Duration::days(92);

/// `backtest`: the report, written to `out` in the format asked for.
pub async fn run(settings: Settings, args: &BacktestArgs, now: DateTime<Utc>, out: &mut dyn Write) -> Result<(), Error> {
    let report = report(settings, args, now).await?;
    let written = match args.output {
        BacktestFormat::Json => serde_json::to_writer_pretty(&mut *out, &report).map_err(std::io::Error::from).and_then(|()| writeln!(out)),
        BacktestFormat::Table => out.write_all(report.table().as_bytes()),
        BacktestFormat::Html => out.write_all(report.html().as_bytes()),
    };
    written.and_then(|()| out.flush()).map_err(|e| Error::runtime(format!("writing the backtest report: {e}")))
}

/// The flags validated, the sources built, the history fetched and replayed: the report (the
/// benchmark measures this, without writing it).
pub async fn report(settings: Settings, args: &BacktestArgs, now: DateTime<Utc>) -> Result<Report, Error> {
    let SourceConfig::Prometheus(prometheus) = &settings.gpu else {
        return Err(Error::config(
            "backtest reads GPU history from Prometheus, and dcgm-exporter keeps none: pass --prometheus-url (or set prometheus_url in --config) to the store that scrapes the exporters",
        ));
    };
    let until = args.until.unwrap_or(now);
    if until > now {
        return Err(Error::config(format!("--until {} is in the future: the history ends now", until.to_rfc3339())));
    }
    let span = crate::duration::chrono(args.since);
    if span > MAX_WINDOW {
        return Err(Error::config("--since: a backtest replays at most 92 days; take a shorter window, e.g. --since 7d"));
    }
    if span < crate::duration::chrono(settings.interval) {
        return Err(Error::config("--since is shorter than one --interval: take a longer window, e.g. --since 7d"));
    }
    let variants = match &args.sweep {
        Some(sweep) => swept_policies(&args.common, sweep, settings.interval)?,
        None => vec![("policy".to_string(), settings.policy.clone())],
    };
    // The source fetches only the steps after the last fetch when that is within its range: a
    // range shorter than a chunk would skip the start of every chunk.
    let chunk = settings.interval * crate::backtest::CHUNK_STEPS;
    let lookback = variants.iter().map(|(_, p)| p.longest_lookback()).max().unwrap_or_default().max(chunk);
    let source = prometheus.build(&SourceContext {
        ownership: &settings.ownership,
        timeout: settings.request_timeout,
        outbound: &settings.outbound,
        lookback,
        step: settings.interval,
        power: variants.iter().any(|(_, p)| !p.active_power_watts.is_empty()),
        max_gpus_per_workspace: variants
            .iter()
            .map(|(_, p)| p.max_gpus_per_workspace)
            .max()
            .unwrap_or(reclaimer_core::gpu::DEFAULT_MAX_GPUS_PER_WORKSPACE),
    })?;
    let coder = crate::app::coder_client(&settings, &Arc::new(Metrics::new()))?;
    let plan = Plan {
        since: until - span,
        until,
        interval: settings.interval,
        regret_window: args.regret_window,
        variants,
        connections: match args.connections {
            ConnectionsArg::Auto => ConnectionChoice::Auto,
            ConnectionsArg::Journal => ConnectionChoice::Journal,
            ConnectionsArg::Coderd => ConnectionChoice::CoderdMetrics,
            ConnectionsArg::None => ConnectionChoice::None,
        },
        journal: args.journal.clone().or_else(|| settings.history_journal.clone()),
        coderd_job: settings.coderd_job.clone(),
    };
    let terminal = std::io::stderr().is_terminal();
    let mut shown_tenth = 0;
    let mut progress = move |p: Progress| {
        let total = (p.until - p.since).num_seconds().max(1) as f64;
        let done = ((p.fetched_until - p.since).num_seconds().max(0) as f64 / total).min(1.0);
        let line = format!(
            "backtest: history fetched to {} ({:.0}%), {} workspaces, {} GPU series in the chunk",
            p.fetched_until.format("%Y-%m-%d %H:%M"),
            done * 100.0,
            p.workspaces,
            p.series
        );
        // On a terminal one line rewritten in place; elsewhere a line per tenth of the window.
        let tenth = (done * 10.0) as i32;
        if terminal {
            eprint!("\r{line}\x1b[K");
        } else if tenth > shown_tenth || done >= 1.0 && shown_tenth < 10 {
            shown_tenth = tenth.max(shown_tenth + i32::from(done >= 1.0));
            eprintln!("{line}");
        }
    };
    let report = crate::backtest::run(&coder, &std::sync::Arc::new(source), plan, &mut progress).await;
    if terminal {
        eprintln!();
    }
    report
}
