//! coder-gpu-reclaimer: gives idle GPUs back on Kubernetes clusters that run Coder.
//! See ARCHITECTURE.md for the map of modules and the invariants they keep.

pub mod cli;
pub mod coder;
pub mod config;
pub mod decide;
pub mod gpu;
pub mod policy;
pub mod retry;
