//! coder-gpu-reclaimer: gives idle GPUs back on Kubernetes clusters that run Coder.
//! See ARCHITECTURE.md for the map of modules and the invariants they keep.

pub mod app;
pub mod cli;
pub mod coder;
pub mod commands;
pub mod config;
pub mod duration;
pub mod error;
pub mod gpu;
pub mod http;
pub mod json_read;
pub mod json_split;
pub mod pass;
pub mod retry;
pub mod serve;
