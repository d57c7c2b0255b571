//! The one integration-test binary. Each module is one area; `common` holds shared helpers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod accounting;
mod alerts;
mod architecture;
mod busy_work;
mod cli;
mod coder_client;
mod coder_world;
mod common;
mod contention;
mod contract;
mod dashboard;
mod decide;
mod deploy;
mod e2e;
mod expo;
mod fakes;
mod gpu_world;
mod hostile;
mod page;
mod pipeline;
mod prometheus_world;
mod readings;
mod sources;
mod status_schema;
mod trust;
