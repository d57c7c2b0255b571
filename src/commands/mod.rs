//! The subcommands, one file each: `run`, `plan`, `check`, `report`, `backtest` and `demo`. `main` parses the
//! flags and calls one; `run` and `plan` build the service with `app::Application::build`,
//! `check` builds the clients alone and reports each check as a line instead of failing at the
//! first. What two subcommands share is here: the signal handler and the token file's mode.

pub mod backtest;
pub mod check;
pub mod check_starts;
pub mod demo;
pub mod plan;
pub mod report;
pub mod run;

use tokio::sync::watch;

use crate::config::Settings;

/// Sets `shutdown` to true when SIGTERM or ctrl-c arrives (in a task of its own).
pub fn spawn_signal_handler(shutdown: watch::Sender<bool>) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(event = "signal_setup_failed", error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!(event = "shutdown_requested", "shutting down: no new stops; finishing requests in flight (at most 10 s)");
        let _ = shutdown.send(true);
    });
}

/// Whether the token file can be read by every user of this machine (`run` logs it, `check`
/// prints it): the words, or `None`.
pub fn token_file_readable(settings: &Settings) -> Option<String> {
    let path = settings.token_file.as_deref()?;
    let mode = crate::http::readable_by_others(path)?;
    Some(format!(
        "{} is readable by every user of this machine (mode {mode:o}); chmod 600 it (a Kubernetes Secret volume: defaultMode 0400, with the pod's fsGroup)",
        path.display()
    ))
}
