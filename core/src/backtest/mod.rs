//! The backtest's pure half: what really happened to each workspace (`timeline`: builds, kept
//! compactly by `builds`, moments of use, agent states, coderd's repeating gauges) and the replay of a policy over it pass by
//! pass through `run`'s own `Judge` (`replay`: simulated stops, GPU-hours given back, regret).
//! The service crate fetches the history and writes the report.

pub mod builds;
pub mod replay;
pub mod timeline;
