//! One pass, by step: `evaluate` (the listing and GPU readings into `decide`'s verdicts under
//! the `policy`), act (`actuator`: the one check of the `mode`, each stop followed through
//! `stop_lifecycle`, `audit` lines), and `publish` (the `status` document and its `page`, the
//! `metrics`, the `accounting` of what was given back; texts phrased by `mode`). The order of
//! these modules is stated in ARCHITECTURE.md.

pub mod accounting;
pub mod actuator;
pub mod audit;
pub mod deadline;
pub mod decide;
pub mod evaluate;
pub mod metrics;
pub mod mode;
pub mod page;
pub mod policy;
pub mod publish;
pub mod status;
pub mod stop_lifecycle;
