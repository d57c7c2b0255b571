//! The pure half of a pass: the policy, `decide` and the fleet rules, the judgment a pass keeps
//! between passes (`judge`, which `run` and `backtest` share), the deadline plan, a stop's
//! lifecycle, the audit vocabulary (what a line says, for its writer and its readers), the
//! mode's texts, a blind GPU source (`blind`), who is starting or waiting for a GPU (`starts`), and GPUs held outside Coder's running workspaces (`outside`). The steps that do I/O (evaluate, act, publish) are the service crate's `pass`.

pub mod audit;
pub mod blind;
pub mod countdown;
pub mod deadline;
pub mod decide;
pub mod fleet;
pub mod judge;
pub mod mode;
pub mod outside;
pub mod policy;
pub mod starts;
pub mod stop_lifecycle;
