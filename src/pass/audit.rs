//! Where stop events go besides the logs: the audit trail (`AuditLog`: one JSON line per change
//! of a stop's state (see `stop_lifecycle`), per would-stop, TTL restore, resumed workspace and
//! deadline extension, appended and synced at once: `--audit-log`), its reader (`read_records`)
//! and the webhook (`Notifier`: a JSON event on each warning, each stop sent or that would be, and
//! each abandoned stop, Slack-compatible `text`: `--notify-webhook`). Coder itself cannot message
//! another user. What a line says (`AuditKind`, `AuditEvent`, `AuditRecord`) is the core crate's
//! `pass::audit`, re-exported here, so the writer and every reader spell events alike.
//!
//! Both writers are capabilities: `Outputs::open` makes them, `Application::build` calls it once
//! and moves them into the actuator. The texts say "would" whenever the event's kind is an
//! observe-mode one, so no text promises a stop that cannot happen. Webhook failures are logged
//! and never block a stop.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use reqwest::Url;
use serde::Serialize;

pub use reclaimer_core::pass::audit::*;

use crate::error::Error;
use crate::http::{Outbound, redact_webhook};

/// Where a full log goes: `<path>.1` (the audit log's and the history journal's older half).
pub fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".1");
    PathBuf::from(name)
}

/// The audit log's bound: past it the file becomes `<path>.1` (the previous one dropped) and a
/// new one begins, so the two hold at most 512 MiB and a 1 GiB volume (the manifest's claim,
/// with the history journal beside it) never fills. At about 400 bytes a line that is over a
/// million events per half; recovery and `report` read both halves.
pub const AUDIT_LOG_MAX_BYTES: u64 = 256 << 20;

pub struct AuditLog {
    path: PathBuf,
    /// The file, and how many bytes it holds (`max_bytes` bounds it).
    file: Mutex<(File, u64)>,
    max_bytes: u64,
    /// A regular file (synced after each line); a device or pipe is only written.
    regular: bool,
    /// The latest append failed (a full or read-only volume): readiness fails until one works.
    failing: std::sync::atomic::AtomicBool,
}

/// Opens `path` for appending (and reading, with `read`), creating it with mode 0600, never
/// through a symbolic link (`O_NOFOLLOW`: a link planted where the file goes cannot redirect the
/// service's writes; opening one fails, naming the path), and resets an existing file that others
/// may read to 0600.
pub fn open_private(path: &Path, read: bool) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.create(true).append(true).read(read);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
        // A device is the operator's explicit choice (`/dev/stdout` is a link to /proc).
        if !path.starts_with("/dev") {
            options.custom_flags(libc::O_NOFOLLOW);
        }
    }
    let file = options.open(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = file.metadata()?;
        if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(file)
}

impl AuditLog {
    /// Opens (creating, mode 0600) the file for appending. A last line cut short (the process
    /// died mid-write, the volume filled) is ended first, so it does not swallow the next
    /// event. Fails at start-up, not at the first stop.
    pub fn open(path: &Path) -> Result<Self, Error> {
        Self::open_bounded(path, AUDIT_LOG_MAX_BYTES)
    }

    /// `open`, rotating at `max_bytes` (tests use a small bound).
    pub fn open_bounded(path: &Path, max_bytes: u64) -> Result<Self, Error> {
        let cannot = |e: std::io::Error| {
            Error::config(format!("--audit-log {}: cannot open it for appending ({e}); fix the path or its permissions", path.display()))
        };
        // Owners, reasons and messages are nobody else's business: an existing log too.
        let mut file = open_private(path, true).map_err(cannot)?;
        let meta = file.metadata().map_err(cannot)?;
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
            file: Mutex::new((file, len)),
            max_bytes,
            regular: meta.is_file(),
            failing: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Appends one whole line and syncs it to disk (`sync_data`). `false` when it could not be
    /// written: logged, counted, and readiness fails until a write works again.
    pub fn append(&self, event: &AuditEvent) -> bool {
        let Ok(mut line) = serde_json::to_string(event) else { return false };
        line.push('\n');
        let mut guard = match self.file.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        // After a failed write part of a line may be on disk: end it before the next one.
        if self.failing.load(std::sync::atomic::Ordering::Relaxed) {
            line.insert(0, '\n');
        }
        let (file, held) = &mut *guard;
        if self.regular && *held > 0 && *held + line.len() as u64 > self.max_bytes {
            match self.rotate() {
                Ok(new) => (*file, *held) = (new, 0),
                Err(e) => {
                    tracing::error!(event = "audit_rotate_failed", path = %self.path.display(), error = %e, "cannot rotate the audit log; appending past its bound");
                }
            }
        }
        let written = file.write_all(line.as_bytes()).and_then(|()| if self.regular { file.sync_data() } else { Ok(()) });
        if written.is_ok() {
            *held += line.len() as u64;
        }
        self.failing.store(written.is_err(), std::sync::atomic::Ordering::Relaxed);
        match written {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(event = "audit_write_failed", path = %self.path.display(), error = %e, "cannot append to the audit log");
                false
            }
        }
    }

    /// `<path>` becomes `<path>.1` (the previous `.1` dropped) and a new `<path>` is opened.
    fn rotate(&self) -> std::io::Result<File> {
        let old = rotated(&self.path);
        std::fs::rename(&self.path, &old)?;
        // Without a new file, the old one goes back: appends continue where they were.
        let file = open_private(&self.path, true).inspect_err(|_| {
            let _ = std::fs::rename(&old, &self.path);
        })?;
        tracing::info!(event = "audit_rotated", path = %self.path.display(), "the audit log reached its bound ({} MiB): the older half is now {}", self.max_bytes >> 20, old.display());
        Ok(file)
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
        let mut guard = match self.file.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        let (file, held) = &mut *guard;
        let ok = file.write_all(b"\n").and_then(|()| if self.regular { file.sync_data() } else { Ok(()) }).is_ok();
        *held += u64::from(ok);
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

/// Reads every audit line of `path` in order, calling `on` with each record; returns how many
/// lines were not audit records (too long, not JSON). A missing file is an error.
pub fn read_records(path: &Path, mut on: impl FnMut(AuditRecord)) -> std::io::Result<usize> {
    let what = ("audit_line_too_long", "the audit log", "an audit line");
    // The older half first (`<path>.1`, when the log has rotated), then the file itself.
    let older = rotated(path);
    let skipped = match read_json_lines(&older, MAX_LINE, what, &mut on) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e),
    };
    Ok(skipped + read_json_lines(path, MAX_LINE, what, on)?)
}

/// Reads a file of JSON lines (the audit log, the history journal) as it streams, each line held
/// with a bound: `on` gets every line that reads as a `T`; a line longer than `max_line` is
/// skipped and logged with its number, as `too_long`'s event naming the file and what a line is
/// (`("audit_line_too_long", "the audit log", "an audit line")`). Returns how many lines were
/// not a `T`.
pub fn read_json_lines<T: serde::de::DeserializeOwned>(
    path: &Path,
    max_line: usize,
    too_long: (&'static str, &'static str, &'static str),
    mut on: impl FnMut(T),
) -> std::io::Result<usize> {
    let (too_long_event, what, a_line) = too_long;
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
            if !too_long && buf.len() + part.len() <= max_line {
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
                event = too_long_event,
                line = number,
                path = %path.display(),
                "line {number} of {what} is longer than {max_line} bytes: not {a_line}, skipped"
            );
            unreadable += 1;
            continue;
        }
        let line = String::from_utf8_lossy(&buf);
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<T>(&line) {
            Ok(r) => on(r),
            Err(_) => unreadable += 1,
        }
    }
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
