//! The pure core of coder-gpu-reclaimer: what the service knows and decides, as values. Coder's
//! models and the listing's reader (`coder::types`, `json_read`, the ids held inline:
//! `coder_id`), GPU identity, series, the exposition parser, signals and windows (`gpu`), the
//! policy, `decide`, the deadline plan, the stop lifecycle, the audit vocabulary and the mode's
//! texts (`pass`), the history journal's vocabulary (`history`), the backtest's replay over real
//! history (`backtest`), and durations.
//!
//! Nothing here does I/O or reads a clock: the crate depends on no async runtime, HTTP client or
//! logger, chrono comes without its clock, and `clippy.toml` bans `std::env`, `std::fs`,
//! `std::net` and every `now`. The service crate re-exports these modules at the same paths.

pub mod backtest;
pub mod coder;
pub mod coder_id;
pub mod duration;
pub mod gpu;
pub mod history;
pub mod ids;
pub mod json_read;
pub mod ledger;
pub mod pass;
