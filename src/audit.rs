//! The audit trail and notifications: one JSON line per stop or would-stop, appended and
//! flushed at once (`--audit-log`), and a JSON event POSTed on each warning and stop
//! (`--notify-webhook`, Slack-compatible `text`). Coder itself cannot message another user.
//! Webhook failures are logged and never block a stop.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::coder::types::Workspace;
use crate::decide::Decision;
use crate::metrics::Mode;

/// One stop, would-stop or warning.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AuditEvent {
    pub time: DateTime<Utc>,
    /// `would_stop`, `stop_sent`, `warn`, `restore_ttl`, `would_restore_ttl`.
    pub event: &'static str,
    pub mode: &'static str,
    pub workspace_id: String,
    pub workspace: String,
    pub owner: String,
    pub template: String,
    pub reason: &'static str,
    pub message: String,
    pub gpu_idle_seconds: Option<i64>,
    pub connection_idle_seconds: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_at: Option<DateTime<Utc>>,
}

impl AuditEvent {
    pub fn new(event: &'static str, time: DateTime<Utc>, mode: Mode, ws: &Workspace, d: &Decision) -> Self {
        AuditEvent {
            time,
            event,
            mode: mode.as_str(),
            workspace_id: ws.id.clone(),
            workspace: ws.name.clone(),
            owner: ws.owner_name.clone(),
            template: ws.template_name.clone(),
            reason: d.reason.as_str(),
            message: d.message.clone(),
            gpu_idle_seconds: d.gpu_idle.map(|g| g.num_seconds()),
            connection_idle_seconds: d.connection_idle.num_seconds(),
            build_id: None,
            stop_at: d.stop_at,
        }
    }
}

pub struct AuditLog {
    path: PathBuf,
    file: Mutex<File>,
}

impl AuditLog {
    /// Opens (creating) the file for appending. Fails at start-up, not at the first stop.
    pub fn open(path: &Path) -> Result<Self, String> {
        let file =
            OpenOptions::new().create(true).append(true).open(path).map_err(|e| {
                format!("--audit-log {}: cannot open it for appending ({e}); fix the path or its permissions", path.display())
            })?;
        Ok(AuditLog { path: path.to_path_buf(), file: Mutex::new(file) })
    }

    pub fn append(&self, event: &AuditEvent) {
        let Ok(mut line) = serde_json::to_string(event) else { return };
        line.push('\n');
        let mut file = match self.file.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Err(e) = file.write_all(line.as_bytes()).and_then(|_| file.flush()) {
            tracing::error!(event = "audit_write_failed", path = %self.path.display(), error = %e, "cannot append to the audit log");
        }
    }
}

#[derive(Clone)]
pub struct Notifier {
    http: reqwest::Client,
    url: String,
}

#[derive(Serialize)]
struct WebhookBody<'a> {
    text: String,
    #[serde(flatten)]
    event: &'a AuditEvent,
}

impl Notifier {
    pub fn new(url: &str) -> Result<Self, String> {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!("--notify-webhook {url:?} is not an http(s) URL: pass e.g. https://hooks.slack.com/services/..."));
        }
        let http =
            reqwest::Client::builder().timeout(Duration::from_secs(5)).build().map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Notifier { http, url: url.to_string() })
    }

    /// Fire and forget: runs in its own task so a slow webhook never delays a stop.
    pub fn send(&self, event: &AuditEvent) {
        let what = match event.event {
            "warn" => "will be stopped to free its GPU",
            "stop_sent" => "was stopped to free its GPU",
            _ => "would be stopped to free its GPU (observe mode)",
        };
        let text = format!("Workspace {}/{} {what}: {}", event.owner, event.workspace, event.message);
        let Ok(body) = serde_json::to_vec(&WebhookBody { text, event }) else { return };
        let (http, url) = (self.http.clone(), self.url.clone());
        tokio::spawn(async move {
            let result = http.post(&url).header("Content-Type", "application/json").body(body).send().await;
            match result {
                Ok(r) if r.status().is_success() => {}
                Ok(r) => {
                    tracing::warn!(event = "notify_failed", status = r.status().as_u16(), "the notification webhook refused the event")
                }
                Err(e) => tracing::warn!(event = "notify_failed", error = %e, "the notification webhook is unreachable"),
            }
        });
    }
}
