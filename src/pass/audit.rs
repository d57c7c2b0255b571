//! Where stop events go besides the logs: the audit trail (one JSON line per change of a stop's
//! state (see `stop_lifecycle`), per would-stop, TTL restore and resumed workspace, appended
//! and flushed at once: `--audit-log`) and the webhook
//! (a JSON event on each warning, each stop sent or that would be, and each abandoned stop,
//! Slack-compatible `text`: `--notify-webhook`). Coder
//! itself cannot message another user. Only the actuator calls these; the texts say "would"
//! whenever the event's kind is an observe-mode one, so no text promises a stop that cannot
//! happen. Webhook failures are logged and never block a stop.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::Url;
use serde::Serialize;

use crate::coder::types::Workspace;
use crate::duration::human;
use crate::error::Error;
use crate::http::{Outbound, redact_webhook};
use crate::pass::decide::Decision;

/// What happened. The observe-mode kinds (`would_*`) are what enforce mode would have done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    /// A grace period began: the stop follows unless the workspace becomes active.
    Warn,
    WouldWarn,
    /// Written and synced before the stop's POST: a stop is never sent without its line. After
    /// a restart, one with no `stop_sent` after it is checked against Coder's builds.
    StopSending,
    /// The stop announced by `stop_sending` was not sent after all (another build was active,
    /// or after a restart no such build is found): it closes the `stop_sending` line.
    StopNotSent,
    StopSent,
    WouldStop,
    /// A provisioner took the stop build.
    StopRunning,
    /// The stop build stayed pending past `stop_timeout` (once per idle episode).
    StopStuck,
    /// The stop was refused, or its build failed on its own: tried again after a back-off.
    StopFailed,
    /// coderd's job reaper failed the stop build (no provisioner took it in 30 minutes, or it hung).
    StopReaped,
    /// A person canceled the stop build: not sent again in this idle episode.
    StopCanceled,
    /// The workspace was used after its stop was sent and no provisioner had taken the stop yet:
    /// this service withdrew it (sent again after 30 minutes unless the workspace is started
    /// again).
    StopWithdrawn,
    /// Every attempt to stop failed; nothing more is tried until the workspace's next build.
    StopAbandoned,
    RestoreTtl,
    /// The stop build succeeded: the workspace's GPUs are free.
    StopDone,
    /// A workspace this service stopped runs again: the GPUs it gave back, for how long.
    Resumed,
    /// Coder's autostop deadline was moved because the GPU computes with nobody connected.
    DeadlineExtended,
    /// Observe mode: the deadline would have been moved (once per build).
    WouldExtend,
    /// The deadline Coder had before the first extension passed while the GPU still computed:
    /// without the extension Coder's autostop would have stopped the work (once per build).
    AutostopAverted,
}

impl AuditKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditKind::Warn => "warn",
            AuditKind::WouldWarn => "would_warn",
            AuditKind::StopSending => "stop_sending",
            AuditKind::StopNotSent => "stop_not_sent",
            AuditKind::StopSent => "stop_sent",
            AuditKind::WouldStop => "would_stop",
            AuditKind::StopRunning => "stop_running",
            AuditKind::StopStuck => "stop_stuck",
            AuditKind::StopFailed => "stop_failed",
            AuditKind::StopReaped => "stop_reaped",
            AuditKind::StopCanceled => "stop_canceled",
            AuditKind::StopWithdrawn => "stop_withdrawn",
            AuditKind::StopAbandoned => "stop_abandoned",
            AuditKind::RestoreTtl => "restore_ttl",
            AuditKind::StopDone => "stop_done",
            AuditKind::Resumed => "resumed",
            AuditKind::DeadlineExtended => "deadline_extended",
            AuditKind::WouldExtend => "would_extend",
            AuditKind::AutostopAverted => "autostop_averted",
        }
    }

    /// Every kind, in the order `as_str` lists them.
    pub const ALL: [AuditKind; 19] = [
        AuditKind::Warn,
        AuditKind::WouldWarn,
        AuditKind::StopSending,
        AuditKind::StopNotSent,
        AuditKind::StopSent,
        AuditKind::WouldStop,
        AuditKind::StopRunning,
        AuditKind::StopStuck,
        AuditKind::StopFailed,
        AuditKind::StopReaped,
        AuditKind::StopCanceled,
        AuditKind::StopWithdrawn,
        AuditKind::StopAbandoned,
        AuditKind::RestoreTtl,
        AuditKind::StopDone,
        AuditKind::Resumed,
        AuditKind::DeadlineExtended,
        AuditKind::WouldExtend,
        AuditKind::AutostopAverted,
    ];

    /// The kind an audit line names (`event`), as the writer wrote it.
    pub fn named(text: &str) -> Option<AuditKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }

    /// The sentence a person reads, e.g. in Slack.
    fn headline(self, e: &AuditEvent) -> String {
        let left = e.stop_at.map(|t| human(t - e.time));
        match (self, left) {
            (AuditKind::Warn, Some(left)) => format!("will be stopped in {left} to free its GPU unless it becomes active"),
            (AuditKind::Warn, None) => "will be stopped to free its GPU unless it becomes active".into(),
            (AuditKind::WouldWarn, Some(left)) => {
                format!("would be stopped in {left} to free its GPU (observe mode: nothing is stopped)")
            }
            (AuditKind::WouldWarn, None) => "would be stopped to free its GPU (observe mode: nothing is stopped)".into(),
            (AuditKind::StopSending, _) => "is being stopped to free its GPU".into(),
            (AuditKind::StopNotSent, _) => "was not stopped after all".into(),
            (AuditKind::StopSent, _) => "was stopped to free its GPU".into(),
            (AuditKind::WouldStop, _) => "would be stopped to free its GPU (observe mode: nothing was stopped)".into(),
            (AuditKind::StopRunning, _) => "is being stopped".into(),
            (AuditKind::StopStuck, _) => "has a stop build that no provisioner takes".into(),
            (AuditKind::StopFailed, _) => "could not be stopped this time; the reclaimer tries again later".into(),
            (AuditKind::StopReaped, _) => {
                "had its stop build failed by Coder's job reaper (no provisioner took it); it keeps its GPU for now".into()
            }
            (AuditKind::StopCanceled, _) => "had its stop canceled by a person; it is not stopped again while it stays idle".into(),
            (AuditKind::StopWithdrawn, _) => {
                "was used again before its stop build started: the reclaimer withdrew the stop; start the workspace again to reconnect"
                    .into()
            }
            (AuditKind::StopAbandoned, _) => "could not be stopped; the reclaimer gave up until its next build".into(),
            (AuditKind::RestoreTtl, _) => "had its autostop TTL set back".into(),
            (AuditKind::StopDone, _) => "is stopped; its GPU is free".into(),
            (AuditKind::Resumed, _) => "runs again".into(),
            (AuditKind::DeadlineExtended, _) => match &e.extension {
                Some(x) => format!("is kept running by its GPU work until {}", crate::pass::mode::at(x.deadline_to)),
                None => "is kept running by its GPU work".into(),
            },
            (AuditKind::WouldExtend, _) => {
                "would be kept running by its GPU work (observe mode: Coder's autostop deadline is not moved)".into()
            }
            (AuditKind::AutostopAverted, _) => "passed its original autostop deadline while its GPU computes".into(),
        }
    }
}

/// One event about one workspace.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AuditEvent {
    pub time: DateTime<Utc>,
    pub event: AuditKind,
    /// `observe` or `enforce`.
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// GPUs the workspace held (stops).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u64>,
    /// GPU-seconds given back, from the stop until it ran again (`resumed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_seconds_given_back: Option<i64>,
    /// The price of one of its GPU-hours when it was stopped (`gpu_hour_price`), and its currency:
    /// the `report` subcommand prices what was given back with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_hour_price: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// A deadline extension (or would-be one): the deadlines and the GPU evidence.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub extension: Option<Extension>,
}

/// What an extension moved and why (`deadline_extended`, `would_extend`, `autostop_averted`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Extension {
    /// Coder's deadline before (for `autostop_averted`: the one before the first extension).
    pub deadline_from: DateTime<Utc>,
    pub deadline_to: DateTime<Utc>,
    /// The latest the service extends to, and what sets it (`extend_limit`, `max_deadline`).
    pub deadline_limit: DateTime<Utc>,
    pub limited_by: &'static str,
    /// The peaks of the window the decision read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sm_active_peak: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gr_engine_active_peak: Option<f64>,
}

impl AuditEvent {
    pub fn new(event: AuditKind, time: DateTime<Utc>, mode: &'static str, ws: &Workspace, d: &Decision) -> Self {
        AuditEvent {
            time,
            event,
            mode,
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
            attempts: None,
            gpus: None,
            gpu_seconds_given_back: None,
            gpu_hour_price: None,
            currency: None,
            extension: None,
        }
    }

    /// An event rebuilt from its audit line (enforce mode: only enforce mode sends stops).
    pub fn recovered(event: AuditKind, r: &AuditRecord) -> Self {
        AuditEvent {
            time: r.time,
            event,
            mode: "enforce",
            workspace_id: r.workspace_id.clone(),
            workspace: r.workspace.clone(),
            owner: r.owner.clone(),
            template: r.template.clone(),
            reason: stop_reason(&r.reason),
            message: r.message.clone(),
            gpu_idle_seconds: None,
            connection_idle_seconds: 0,
            build_id: r.build_id.clone(),
            stop_at: None,
            attempts: None,
            gpus: r.gpus,
            gpu_seconds_given_back: None,
            gpu_hour_price: r.gpu_hour_price,
            currency: r.currency.clone(),
            extension: None,
        }
    }

    /// "Workspace alice/train was stopped to free its GPU: GPU idle 41m, no connection for 38m".
    pub fn text(&self) -> String {
        format!("Workspace {}/{} {}: {}", self.owner, self.workspace, self.event.headline(self), self.message)
    }
}

pub struct AuditLog {
    path: PathBuf,
    file: Mutex<File>,
    /// A regular file (synced after each line); a device or pipe is only written.
    regular: bool,
    /// The latest append failed (a full or read-only volume): readiness fails until one works.
    failing: std::sync::atomic::AtomicBool,
}

impl AuditLog {
    /// Opens (creating, mode 0600) the file for appending. A last line cut short (the process
    /// died mid-write, the volume filled) is ended first, so it does not swallow the next
    /// event. Fails at start-up, not at the first stop.
    pub fn open(path: &Path) -> Result<Self, Error> {
        let mut options = OpenOptions::new();
        options.create(true).append(true).read(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let cannot = |e: std::io::Error| {
            Error::config(format!("--audit-log {}: cannot open it for appending ({e}); fix the path or its permissions", path.display()))
        };
        let mut file = options.open(path).map_err(cannot)?;
        let meta = file.metadata().map_err(cannot)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            // Owners, reasons and messages are nobody else's business: an existing log too.
            if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
                file.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(cannot)?;
            }
        }
        let len = meta.len();
        if meta.is_file() && len > 0 {
            use std::io::{Read, Seek, SeekFrom};
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(len - 1)).and_then(|_| file.read_exact(&mut last)).map_err(cannot)?;
            if last[0] != b'\n' {
                file.write_all(b"\n").and_then(|()| file.sync_data()).map_err(cannot)?;
                tracing::warn!(event = "audit_torn_line", path = %path.display(), "the audit log's last line was cut short; ended it");
            }
        }
        Ok(AuditLog {
            path: path.to_path_buf(),
            file: Mutex::new(file),
            regular: meta.is_file(),
            failing: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Appends one whole line and syncs it to disk (`sync_data`). `false` when it could not be
    /// written: logged, counted, and readiness fails until a write works again.
    pub fn append(&self, event: &AuditEvent) -> bool {
        let Ok(mut line) = serde_json::to_string(event) else { return false };
        line.push('\n');
        let mut file = match self.file.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        // After a failed write part of a line may be on disk: end it before the next one.
        if self.failing.load(std::sync::atomic::Ordering::Relaxed) {
            line.insert(0, '\n');
        }
        let written = file.write_all(line.as_bytes()).and_then(|()| if self.regular { file.sync_data() } else { Ok(()) });
        self.failing.store(written.is_err(), std::sync::atomic::Ordering::Relaxed);
        match written {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(event = "audit_write_failed", path = %self.path.display(), error = %e, "cannot append to the audit log");
                false
            }
        }
    }

    /// Whether the latest append failed.
    pub fn failing(&self) -> bool {
        self.failing.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// While failing, tries the file again with an empty line (readers skip it), so readiness
    /// comes back once the volume has room, even in a pass with no event to write. `true` when
    /// the log works.
    pub fn probe(&self) -> bool {
        if !self.failing() {
            return true;
        }
        let mut file = match self.file.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        let ok = file.write_all(b"\n").and_then(|()| if self.regular { file.sync_data() } else { Ok(()) }).is_ok();
        self.failing.store(!ok, std::sync::atomic::Ordering::Relaxed);
        ok
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A regular file (not a device or a pipe).
    pub fn is_regular(&self) -> bool {
        self.regular
    }
}

/// One audit line as a reader sees it (`report`, and the service's own recovery after a
/// restart): the fields that say what happened to whose stop, owned.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct AuditRecord {
    pub time: DateTime<Utc>,
    pub event: String,
    #[serde(default)]
    pub workspace_id: String,
    #[serde(default)]
    pub workspace: String,
    #[serde(default)]
    pub owner: String,
    #[serde(default)]
    pub template: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub build_id: Option<String>,
    #[serde(default)]
    pub gpus: Option<u64>,
    #[serde(default)]
    pub gpu_seconds_given_back: Option<i64>,
    #[serde(default)]
    pub gpu_hour_price: Option<f64>,
    #[serde(default)]
    pub currency: Option<String>,
}

/// The longest audit line read; real ones are under 2 KB.
pub const MAX_LINE: usize = 64 << 10;

/// Reads every audit line of `path` in order, calling `on` with each record; returns how many
/// lines were not audit records (too long, not JSON). A missing file is an error.
pub fn read_records(path: &Path, mut on: impl FnMut(AuditRecord)) -> std::io::Result<usize> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(File::open(path)?);
    let mut buf = Vec::new();
    let mut unreadable = 0;
    let mut number = 0usize;
    loop {
        number += 1;
        buf.clear();
        let mut too_long = false;
        let mut any = false;
        loop {
            let chunk = reader.fill_buf()?;
            if chunk.is_empty() {
                break;
            }
            any = true;
            let (part, done) = match chunk.iter().position(|b| *b == b'\n') {
                Some(i) => (&chunk[..i], Some(i + 1)),
                None => (chunk, None),
            };
            if !too_long && buf.len() + part.len() <= MAX_LINE {
                buf.extend_from_slice(part);
            } else {
                too_long = true;
                buf.clear();
            }
            let used = done.unwrap_or(chunk.len());
            reader.consume(used);
            if done.is_some() {
                break;
            }
        }
        if !any {
            return Ok(unreadable);
        }
        if too_long {
            tracing::warn!(
                event = "audit_line_too_long",
                line = number,
                "line {number} of the audit log is longer than {MAX_LINE} bytes: not an audit line, skipped"
            );
            unreadable += 1;
            continue;
        }
        let line = String::from_utf8_lossy(&buf);
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<AuditRecord>(&line) {
            Ok(r) => on(r),
            Err(_) => unreadable += 1,
        }
    }
}

/// A stop reason as the decisions name it (`Reason::as_str`), for an event rebuilt from its line.
pub fn stop_reason(text: &str) -> &'static str {
    ["idle", "memory-held-idle", "phantom-utilization", "connected-but-gpu-idle", "max-lifetime"]
        .into_iter()
        .find(|r| *r == text)
        .unwrap_or("idle")
}

#[derive(Clone)]
pub struct Notifier {
    http: reqwest::Client,
    url: Url,
    /// Deliveries not finished yet (shutdown waits for them, a little).
    in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

#[derive(Serialize)]
struct WebhookBody<'a> {
    text: String,
    #[serde(flatten)]
    event: &'a AuditEvent,
}

impl Notifier {
    pub fn new(url: Url, outbound: &Outbound) -> Result<Self, Error> {
        let http = crate::http::client(Duration::from_secs(5), Duration::from_secs(3), outbound)?;
        Ok(Notifier { http, url, in_flight: Default::default() })
    }

    /// At shutdown: waits up to `within` for deliveries still in flight, and says how many were
    /// dropped when some did not finish.
    pub async fn drain(&self, within: Duration) {
        use std::sync::atomic::Ordering;
        let deadline = tokio::time::Instant::now() + within;
        while self.in_flight.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = self.in_flight.load(Ordering::SeqCst);
        if left > 0 {
            tracing::warn!(event = "notify_dropped", count = left, webhook = %redact_webhook(&self.url), "shutting down with webhook deliveries still in flight: they are dropped (the audit log has every event)");
        }
    }

    /// Fire and forget: runs in its own task so a slow webhook never delays a stop.
    pub fn send(&self, event: &AuditEvent) {
        let Ok(body) = serde_json::to_vec(&WebhookBody { text: event.text(), event }) else { return };
        let (http, url, in_flight) = (self.http.clone(), self.url.clone(), self.in_flight.clone());
        in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::spawn(async move {
            // Counted down however the delivery ends.
            struct Done(std::sync::Arc<std::sync::atomic::AtomicUsize>);
            impl Drop for Done {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
            let _done = Done(in_flight);
            let result = http.post(url.clone()).header("Content-Type", "application/json").body(body).send().await;
            match result {
                Ok(r) if r.status().is_success() => {}
                // The webhook URL is a secret (Slack's path is its key): only its host is logged.
                Ok(r) => {
                    tracing::warn!(event = "notify_failed", status = r.status().as_u16(), webhook = %redact_webhook(&url), "the notification webhook refused the event")
                }
                Err(e) => {
                    tracing::warn!(event = "notify_failed", error = %crate::http::error_chain(&e.without_url()), webhook = %redact_webhook(&url), "the notification webhook is unreachable")
                }
            }
        });
    }
}
