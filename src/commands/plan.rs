//! `plan`: one pass in observe mode, its decisions written as a table or JSON; never acts.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::app::{Application, Role};
use crate::cli::OutputFormat;
use crate::config::Settings;
use crate::error::Error;

/// `plan`: one pass in observe mode, its status document written to `out` (JSON or a table).
/// The service's state is dropped before the document is written, and JSON is written as it is
/// produced: at 10,000 workspaces the document is about 9 MB of text, not held twice.
pub async fn run(
    settings: Settings,
    output: OutputFormat,
    sample_for: Option<Duration>,
    out: &mut dyn std::io::Write,
) -> Result<(), Error> {
    let mut app = Application::build(&settings, Role::Plan).await?;
    let sampling = app.evaluator.source().samples_between_passes();
    // Behind Prometheus a discovered job is read once two answers name it (`jobs`): the first
    // here, the second in the one pass.
    if let Some(prom) = app.evaluator.source().prometheus() {
        prom.jobs().await;
    }
    let sample_for = sample_for.unwrap_or(Duration::from_secs(15));
    // One sample every 5 s: the default 15 s gives the 3 samples min_samples asks for.
    let step = Duration::from_secs(5);
    if sampling && !sample_for.is_zero() {
        app.evaluator.learn_running().await.map_err(|e| Error::runtime(e.to_string()))?;
        eprintln!("sampling the exporters for {} before deciding...", humantime::format_duration(sample_for));
        let mut waited = Duration::ZERO;
        while waited < sample_for {
            app.evaluator.sample().await;
            app.evaluator.flush_samples();
            let nap = step.min(sample_for - waited);
            tokio::time::sleep(nap).await;
            waited += nap;
        }
    }
    let (_tx, rx) = watch::channel(false);
    app.pass(&rx).await.map_err(|e| Error::runtime(e.to_string()))?;
    let published = app.state.status();
    drop(app);
    let mut doc = Arc::try_unwrap(published).map_or_else(|shared| shared.doc.clone(), |published| published.doc);
    doc.mode = "plan";
    let idle_after = settings.policy.thresholds.idle_after;
    if sampling && sample_for < idle_after {
        doc.notes.push(format!(
            "history is short: {} of samples against idle_after {}, so idle GPUs show as warming-up or unknown here; `run` builds the history, or use --prometheus-url",
            humantime::format_duration(sample_for),
            humantime::format_duration(idle_after)
        ));
    }
    let written = match output {
        OutputFormat::Json => serde_json::to_writer_pretty(&mut *out, &doc).map_err(std::io::Error::from).and_then(|()| writeln!(out)),
        OutputFormat::Table => out.write_all(doc.table().as_bytes()),
    };
    written.and_then(|()| out.flush()).map_err(|e| Error::runtime(format!("writing the plan: {e}")))
}
