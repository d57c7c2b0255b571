//! Coder's REST API as values: the serde models and `read_workspace` (`types`). The client that
//! fetches them is the service crate's `coder`.

pub mod types;
