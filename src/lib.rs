//! coder-gpu-reclaimer: gives idle GPUs back on Kubernetes clusters that run Coder.
//! See ARCHITECTURE.md for the map of modules and the invariants they keep.

pub mod accounting;
pub mod actuator;
pub mod app;
pub mod audit;
pub mod audit_report;
pub mod cli;
pub mod coder;
pub mod commands;
pub mod config;
pub mod decide;
pub mod demo;
pub mod duration;
pub mod error;
pub mod evaluate;
pub mod gpu;
pub mod http;
pub mod json_split;
pub mod metrics;
pub mod mode;
pub mod page;
pub mod policy;
pub mod report;
pub mod retry;
pub mod serve;
pub mod startup;
pub mod status;
pub mod stop_lifecycle;
