//! Coder's REST API as values: the serde models and `read_workspace` (`types`), a job's tags
//! (`job_tags`), and a build's parameter values (`BuildParameter`, re-exported there). The
//! client that fetches them is the service crate's `coder`.

pub mod job_tags;
pub mod types;

use serde::{Deserialize, Serialize};

/// One of a build's parameter values (`codersdk.WorkspaceBuildParameter`, from
/// `GET /api/v2/workspacebuilds/{id}/parameters`; every build stores the values it was built
/// with, a new build copying the previous build's: reference coder NOTES §19).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct BuildParameter {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: String,
}
