//! The mode: observe (report only) or enforce (send stop builds), and the texts phrased by it.
//! Whether to act is decided from it in the actuator alone (`actuator::acts`); here the mode
//! only chooses words, so that observe mode promises nothing.

use chrono::Duration;

use crate::duration::human;

/// Observe (report only) or enforce (send stop builds).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
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

    /// What the status page says of a workspace chosen for a stop.
    pub fn stop_words(self) -> &'static str {
        match self {
            Mode::Enforce => "to be stopped",
            Mode::Observe => "would be stopped (observe mode)",
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
