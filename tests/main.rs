//! The one integration-test binary. Each module is one area; `common` holds shared helpers.

// Tests build their own clients and read whole bodies (the service may not: clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

mod accounting;
mod alerts;
mod architecture;
mod audit;
mod backtest;
mod backtest_bounds;
mod backtest_history;
mod busy_work;
mod cli;
mod coder_client;
mod coder_world;
mod common;
mod contention;
mod contract;
mod countdown;
mod dashboard;
mod decide;
mod deploy;
mod e2e;
mod expo;
mod fakes;
mod fences;
mod forged;
mod gpu_world;
mod hostile;
mod jobs;
mod page;
mod pipeline;
mod prometheus_world;
mod readings;
mod sources;
mod starts;
mod status_schema;
mod trust;
