//! coder-gpu-reclaimer: gives idle GPUs back on Kubernetes clusters that run Coder.
//! See ARCHITECTURE.md for the map of modules and the invariants they keep. What is pure
//! (models, readings, windows, policy, decisions) is the `reclaimer_core` crate, re-exported at
//! the same paths (`duration`, `json_read` here; the rest inside `coder`, `gpu` and `pass`).

pub mod app;
pub mod backtest;
pub mod cli;
pub mod coder;
pub mod commands;
pub mod config;
pub mod error;
pub mod gpu;
pub mod http;
pub mod json_split;
pub mod logging;
pub mod pass;
pub mod retry;
pub mod serve;

pub use reclaimer_core::{duration, json_read};

/// The allocator of every process that runs the service (the binary, its benches and tests):
/// jemalloc with one arena, freed pages handed back to the kernel within 50 ms
/// (`.cargo/config.toml`). With glibc's two arenas (`MALLOC_ARENA_MAX=2`) the peak grew from
/// pass to pass while the heap did not (README, "Speed and size").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
