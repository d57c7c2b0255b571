//! Recovery: where each stop of a previous run stood, read from the audit records it wrote (the
//! service crate reads the file and hands the records in). Stops sent and not finished are
//! followed again; stops done whose workspace has not run since wait for their `resumed` line; a
//! `stop_sending` line with no outcome (the process ended around the POST) is settled against
//! the workspace's latest build at the next pass.

use std::collections::HashMap;

use crate::pass::audit::{AuditEvent, AuditKind, AuditRecord};

/// What `Ledger::recover` found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Stops in flight, followed again.
    pub followed: usize,
    /// Stops done whose workspace may run again (for its `resumed` line).
    pub resumable: usize,
    /// `stop_sending` lines without an outcome, settled at the next pass.
    pub unconfirmed: usize,
    /// Coder's countdowns still running (`countdown_set` with no end after it), followed again.
    pub countdowns: usize,
}

/// Where a workspace's stop stood at its latest stop line.
pub enum OpenStop {
    Sending(AuditEvent),
    InFlight(AuditEvent),
    Done(AuditEvent),
}

/// Each workspace's open stop, oldest record first: each line replaces the last, and a line that
/// closes a stop (resumed, not sent, failed, reaped, canceled, withdrawn, abandoned) removes it.
pub fn open_stops(records: impl IntoIterator<Item = AuditRecord>) -> HashMap<String, OpenStop> {
    let mut by_ws: HashMap<String, OpenStop> = HashMap::new();
    for r in records {
        let Some(kind) = r.kind() else { continue };
        let event = AuditEvent::recovered(kind, &r);
        let open = match kind {
            AuditKind::StopSending => Some(OpenStop::Sending(event)),
            AuditKind::StopSent | AuditKind::StopRunning | AuditKind::StopStuck => Some(OpenStop::InFlight(event)),
            AuditKind::StopDone => Some(OpenStop::Done(event)),
            AuditKind::Resumed
            | AuditKind::StopNotSent
            | AuditKind::StopFailed
            | AuditKind::StopReaped
            | AuditKind::StopCanceled
            | AuditKind::StopWithdrawn
            | AuditKind::StopAbandoned => None,
            _ => continue,
        };
        match open {
            Some(o) => by_ws.insert(r.workspace_id, o),
            None => by_ws.remove(&r.workspace_id),
        };
    }
    by_ws
}
