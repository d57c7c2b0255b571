//! The mode: observe (report only) or enforce (send stop builds), and the texts phrased by it.
//! Whether to act is decided from it in one place, the service's `actuator::acts`:
//! `Application::build` makes the capability to write only where that holds, so observe mode and
//! `plan` hold none (a type fact from there on; who calls `acts` is a text check in
//! `tests/architecture.rs`). Here the mode only chooses words, so that observe mode promises
//! nothing.

use chrono::{DateTime, Duration, Utc};

use crate::duration::human;

/// A deadline as people read it: minutes, in UTC.
pub fn at(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// The words for a busy workspace whose limit leaves no extension: the same in every mode,
/// since Coder stops it.
pub fn limit_reached(coder_deadline: DateTime<Utc>, limited_by: &str) -> String {
    format!("Coder will stop it at {}: {limited_by} reached", at(coder_deadline))
}

/// Observe (report only) or enforce (send stop builds).
// No `PartialEq`: comparing modes does not compile, so the one place that decides by the mode
// (`actuator::acts`) matches on it, and the architecture scan (a text check) finds every match.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    Observe,
    Enforce,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Observe => "observe",
            Mode::Enforce => "enforce",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Mode::Observe => "observe mode: decisions are logged and reported, nothing is stopped (pass --enforce to act)",
            Mode::Enforce => "enforce mode: idle workspaces are stopped with Coder stop builds",
        }
    }

    /// The countdown of a warning, as people read it in the status API and the template's
    /// metadata: only enforce mode promises a stop.
    pub fn countdown(self, left: Duration) -> String {
        match self {
            Mode::Enforce => format!("stops in {} unless it becomes active", human(left)),
            Mode::Observe => format!("would stop in {} unless it becomes active (observe mode: nothing is stopped)", human(left)),
        }
    }

    /// The mode a status document names: `enforce`, or else observe (`plan` and `observe`),
    /// which promises nothing.
    pub fn of_document(name: &str) -> Mode {
        match name {
            "enforce" => Mode::Enforce,
            _ => Mode::Observe,
        }
    }

    /// What the status API, the page and the template's metadata say of a workspace whose GPU
    /// computes with nobody connected (`extend_while_busy`). `to` is where the plan moves Coder's
    /// deadline (the deadline itself while it is far enough ahead), `sent` whether this pass
    /// moved it there. Only enforce mode promises to keep it running.
    pub fn kept_running(self, to: DateTime<Utc>, coder_deadline: DateTime<Utc>, sent: bool) -> String {
        match self {
            Mode::Enforce if sent || to <= coder_deadline => format!("kept running by GPU work until {}", at(to)),
            Mode::Enforce => format!("its GPU computes: Coder's deadline {} is due to be moved (not this pass)", at(coder_deadline)),
            Mode::Observe if to > coder_deadline => {
                format!("would be kept running by GPU work until {} (observe mode: Coder stops it at {})", at(to), at(coder_deadline))
            }
            Mode::Observe => {
                format!("its GPU computes; Coder stops it at {} (observe mode: the deadline is not moved)", at(coder_deadline))
            }
        }
    }

    /// What people read of a reclaim that is Coder's countdown (`countdown_in_coder`): `until` is
    /// Coder's deadline (Coder's clock), `set` whether it is there already (enforce mode, or
    /// Coder's own deadline that is sooner) or would be moved there (observe mode).
    pub fn coder_countdown(self, until: DateTime<Utc>, set: bool) -> String {
        match (self, set) {
            (Mode::Enforce, _) => format!("Coder stops it at {} unless someone uses it (Coder's countdown)", at(until)),
            (Mode::Observe, false) => {
                format!("would start Coder's countdown to {} (observe mode: the deadline is not moved)", at(until))
            }
            (Mode::Observe, true) => format!("Coder stops it at {} (its own deadline; observe mode)", at(until)),
        }
    }

    /// What the status page says of a workspace chosen for a stop.
    pub fn stop_words(self) -> &'static str {
        match self {
            Mode::Enforce => "to be stopped",
            Mode::Observe => "would be stopped (observe mode)",
        }
    }

    /// The status page's countdown column: only enforce mode promises a stop.
    pub fn countdown_heading(self) -> &'static str {
        match self {
            Mode::Enforce => "Stops in",
            Mode::Observe => "Would stop in",
        }
    }

    /// What the status page says of a warned workspace.
    pub fn warned_words(self) -> &'static str {
        match self {
            Mode::Enforce => "warned: stops unless it becomes active",
            Mode::Observe => "warned: would be stopped unless it becomes active (observe mode)",
        }
    }
}
