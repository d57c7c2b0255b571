//! One pass, by step: `evaluate` (the listing and GPU readings into `decide`'s verdicts under
//! the `policy`), act (`actuator`: the one check of the `mode`, each stop followed through
//! `stop_lifecycle`, `audit` lines), and `publish` (the `status` document and its `page`, the
//! `metrics`, the `accounting` of what was given back; texts phrased by `mode`). The order of
//! these modules is stated in ARCHITECTURE.md. The pure ones (`policy`, `decide`, `deadline`,
//! `stop_lifecycle`, `mode`, and the audit vocabulary inside `audit`) are the core crate's
//! `pass`, re-exported here at the same paths.

pub mod accounting;
pub mod actuator;
pub mod audit;
pub mod evaluate;
pub mod journal;
pub mod metrics;
pub mod page;
pub mod publish;
pub mod status;

pub use reclaimer_core::pass::{deadline, decide, fleet, judge, mode, outside, policy, starts, stop_lifecycle};
