//! `run`: the service. Binds `--listen` (and `--health-listen`), builds the `Application` and
//! runs passes until SIGTERM or ctrl-c.

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::{Application, Role};
use crate::config::Settings;
use crate::error::Error;

use super::{spawn_signal_handler, token_file_readable};

/// Runs the service until a signal asks it to stop.
pub async fn run(settings: Settings) -> Result<(), Error> {
    let listen = settings.listen;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| Error::config(format!("--listen {listen}: cannot bind ({e}); choose a free address, e.g. --listen 127.0.0.1:9464")))?;
    let bound = listener.local_addr().map_err(|e| Error::runtime(e.to_string()))?;
    let health = match settings.health_listen {
        Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| {
            Error::config(format!("--health-listen {addr}: cannot bind ({e}); choose a free address, e.g. --health-listen 0.0.0.0:9465"))
        })?),
        None => None,
    };
    let health_bound = health.as_ref().and_then(|l| l.local_addr().ok()).map(|a| a.to_string()).unwrap_or_default();
    if let Some(why) = token_file_readable(&settings) {
        tracing::warn!(event = "token_file_readable", "{why}");
    }
    let mode = settings.mode;
    tracing::info!(event = "starting", mode = mode.as_str(), listen = %bound, health_listen = %health_bound, settings = %settings.summary(), "coder-gpu-reclaimer starting");
    let app = Application::build(&settings, Role::Run).await?;
    let (tx, rx) = watch::channel(false);
    spawn_signal_handler(tx);
    app.serve_and_run(listener, health, settings.status_token.clone(), rx).await
}
