//! The history journal (`--history-journal`, off by default): after each pass, one JSON line
//! per change of a running workspace (`reclaimer_core::history`: first seen or rebuilt, its
//! `last_used_at` moved, its agent changed, no longer running), so that a later backtest knows
//! when workspaces were in use; Coder keeps only the latest `last_used_at`. Bounded: past
//! `max_bytes` the file is renamed to `<path>.1` (the previous `.1` dropped) and a new one begun,
//! so the two hold at most twice the bound. A failed write is logged once and costs nothing else:
//! the journal is evidence for later, never a reason to hold a pass.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use reclaimer_core::coder::types::Workspace;
use reclaimer_core::history::{JournalLine, Tracker};

use crate::error::Error;
use crate::pass::audit::read_json_lines;

/// The default bound of one journal file (`history_journal_max_mib`): 10,000 busy workspaces (each
/// one's `last_used_at` moving every minute) fill it in about 47 minutes, so the two halves hold
/// about an hour and a half of them; a fleet of 500 about a day and a half. Raise it to keep more.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

pub struct Journal {
    path: PathBuf,
    /// `None` after a rotation could not open the new file: nothing is written (the bound holds)
    /// until a later pass opens it.
    file: Option<File>,
    written: u64,
    max_bytes: u64,
    tracker: Tracker,
    /// A failure was logged and no write has worked since (each failure is logged once).
    failing: bool,
}

impl Journal {
    /// Opens (creating, mode 0600, never through a symbolic link; an existing file is reset to
    /// 0600) `path` for appending. Fails at start-up, not at the first pass.
    pub fn open(path: &Path, max_bytes: usize) -> Result<Self, Error> {
        let file = open_append(path).map_err(|e| {
            Error::config(format!(
                "--history-journal {}: cannot open it for appending ({e}); choose a writable path, e.g. on the audit log's volume",
                path.display()
            ))
        })?;
        let written = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(Journal {
            path: path.to_path_buf(),
            file: Some(file),
            written,
            max_bytes: max_bytes as u64,
            tracker: Tracker::default(),
            failing: false,
        })
    }

    /// Writes the changes one pass saw. One pass's lines go to one file: a first pass over a
    /// fleet larger than the bound writes them whole, and the next pass rotates.
    pub fn record<'a>(&mut self, now: DateTime<Utc>, workspaces: impl Iterator<Item = &'a Workspace>) {
        let lines = self.tracker.changes(now, workspaces);
        let mut text = Vec::new();
        for line in &lines {
            if serde_json::to_writer(&mut text, line).is_ok() {
                text.push(b'\n');
            }
        }
        if text.is_empty() {
            return;
        }
        let full = self.written > 0 && self.written + text.len() as u64 > self.max_bytes;
        let written = match (full, self.file.take()) {
            (false, Some(file)) => Ok(file),
            // Full, or the last rotation left no file: rotate (or open again) first.
            (_, _) => self.rotate(),
        }
        .and_then(|mut file| {
            let result = file.write_all(&text).and_then(|()| file.flush());
            self.file = Some(file);
            result
        });
        match written {
            Ok(()) => {
                self.written += text.len() as u64;
                self.failing = false;
            }
            Err(e) if !self.failing => {
                self.failing = true;
                tracing::warn!(event = "journal_write_failed", path = %self.path.display(), error = %e, "cannot write the history journal; its lines are lost until a write works again (stops are not affected)");
            }
            Err(_) => {}
        }
    }

    /// `<path>` becomes `<path>.1` (when it is there) and a new `<path>` begins.
    fn rotate(&mut self) -> std::io::Result<File> {
        let old = rotated(&self.path);
        match std::fs::rename(&self.path, &old) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let file = open_append(&self.path)?;
        self.written = 0;
        tracing::info!(event = "journal_rotated", path = %self.path.display(), "the history journal reached its bound: the older half is now {}", old.display());
        Ok(file)
    }
}

/// Where a full journal goes: `<path>.1` (as the audit log's older half).
pub use crate::pass::audit::rotated;

fn open_append(path: &Path) -> std::io::Result<File> {
    crate::pass::audit::open_private(path, false)
}

/// The longest journal line read back; real ones are under 1 KB.
const MAX_LINE: usize = 64 << 10;

/// Every line of the journal at `path` and its older half (`<path>.1` first), in order, read as
/// they stream (`audit::read_json_lines`); returns how many lines were not journal lines.
pub fn read_lines(path: &Path, mut on: impl FnMut(JournalLine)) -> std::io::Result<usize> {
    let mut unreadable = 0;
    for file in [rotated(path), path.to_path_buf()] {
        match read_json_lines(&file, MAX_LINE, ("journal_line_too_long", "the history journal", "a journal line"), &mut on) {
            Ok(n) => unreadable += n,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && file != path => {}
            Err(e) => return Err(e),
        }
    }
    Ok(unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_journal_rotates_and_both_halves_read_back_in_order() {
        let dir = std::env::temp_dir().join(format!("journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.jsonl");
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(rotated(&path));
        let text = include_str!("../../tests/fixtures/coder/workspaces_running.json");
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let mut fleet: Vec<Workspace> = serde_json::from_value(v["workspaces"].clone()).unwrap();
        let mut journal = Journal::open(&path, 2048).unwrap();
        let t0: DateTime<Utc> = "2026-11-25T10:00:00Z".parse().unwrap();
        for minute in 0..40 {
            fleet[0].last_used_at = t0 + chrono::Duration::minutes(minute);
            journal.record(t0 + chrono::Duration::minutes(minute), fleet.iter());
        }
        let (now, old) = (std::fs::metadata(&path).unwrap().len(), std::fs::metadata(rotated(&path)).unwrap().len());
        assert!(now <= 2048 && old <= 2048, "each half within the bound: {now}, {old}");
        let mut read = Vec::new();
        assert_eq!(read_lines(&path, |l| read.push(l)).unwrap(), 0);
        let times: Vec<_> = read.iter().map(|l| l.time).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "the older half first");
        assert_eq!(read.last().unwrap().last_used_at, Some(t0 + chrono::Duration::minutes(39)), "the newest line last");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The journal never writes through a symbolic link planted where it goes, and an existing
    /// file others may read is made 0600 (issue 42).
    #[cfg(unix)]
    #[test]
    fn the_journal_follows_no_link_and_keeps_its_file_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("journal-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (target, link) = (dir.join("elsewhere"), dir.join("history.jsonl"));
        std::fs::write(&target, "").unwrap();
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = Journal::open(&link, 2048).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("--history-journal") && e.contains("cannot open it"), "{e}");
        let open = dir.join("open.jsonl");
        std::fs::write(&open, "").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        Journal::open(&open, 2048).unwrap();
        assert_eq!(std::fs::metadata(&open).unwrap().permissions().mode() & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A device named on purpose (`/dev/stdout`, itself a link into /proc) still opens.
    #[cfg(unix)]
    #[test]
    fn a_device_named_on_purpose_opens() {
        assert!(crate::pass::audit::open_private(Path::new("/dev/null"), false).is_ok());
        assert!(crate::pass::audit::open_private(Path::new("/dev/stdout"), false).is_ok());
    }
}
