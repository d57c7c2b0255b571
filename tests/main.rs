//! The one integration-test binary. Each module is one area; `common` holds shared helpers.

mod common;
mod cli;
mod coder_client;
mod contract;
mod decide;
mod e2e;
mod expo;
mod fakes;
mod reclaim;
mod sources;
