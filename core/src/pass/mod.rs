//! The pure half of a pass: the policy, `decide` and the fleet rules, the judgment a pass keeps
//! between passes (`judge`, which `run` and `backtest` share), the deadline plan, a stop's
//! lifecycle, the audit vocabulary (what a line says, for its writer and its readers) and the
//! mode's texts. The steps that do I/O (evaluate, act, publish) are the service crate's `pass`.

pub mod audit;
pub mod deadline;
pub mod decide;
pub mod judge;
pub mod mode;
pub mod policy;
pub mod stop_lifecycle;
