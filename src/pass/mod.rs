//! One pass, by step: `evaluate` (the listing and GPU readings into `decide`'s verdicts under
//! the `policy`), the actuator (`actuator`, following each stop through `stop_lifecycle`, writing
//! `audit` lines, phrasing by `mode`), and `report` (the `status` document and `page`, the
//! `metrics`, the `accounting` of what was given back). The order of these modules is stated in
//! ARCHITECTURE.md.

pub mod accounting;
pub mod actuator;
pub mod audit;
pub mod decide;
pub mod evaluate;
pub mod metrics;
pub mod mode;
pub mod page;
pub mod policy;
pub mod report;
pub mod status;
pub mod stop_lifecycle;
