//! Coder's writes, as a capability: `CoderActions` is the only way to send a stop build, move an autostop deadline or set a TTL (and every future write). `CoderClient` only
//! reads. `Application::build` makes the one `CoderActions` of a run and moves it into the
//! actuator; the evaluator, `publish`, `check` and `plan` hold a `CoderClient` and cannot act.
//! It is not `Clone`, so no second holder appears by accident.

use std::fmt;
use std::ops::Deref;

use reqwest::Method;

use super::types::{CreateWorkspaceBuildRequest, PutExtendWorkspaceRequest, Time, Transition, UpdateWorkspaceTtlRequest, WorkspaceBuild};
use super::{CoderClient, CoderError, ErrorKind, StopOutcome, encode_path};
use crate::retry::RetryPolicy;

/// The right to change Coder's state, and the client it writes with. It reads too (`Deref`), so
/// its holder needs no second client.
pub struct CoderActions {
    client: CoderClient,
}

impl fmt::Debug for CoderActions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoderActions").field("client", &self.client).finish()
    }
}

impl Deref for CoderActions {
    type Target = CoderClient;

    fn deref(&self) -> &CoderClient {
        &self.client
    }
}

impl CoderActions {
    /// Writes through `client` (its token, retries and observer). Made once, by
    /// `Application::build` (tests make their own).
    pub fn new(client: CoderClient) -> Self {
        CoderActions { client }
    }

    /// `POST /api/v2/workspaces/{id}/builds {"transition":"stop"}`. 201 queues the build; 409 means
    /// a build is already active, which is a normal outcome.
    pub async fn stop_workspace(&self, workspace_id: &str) -> Result<StopOutcome, CoderError> {
        let path = format!("/api/v2/workspaces/{}/builds", encode_path(workspace_id));
        let body = CreateWorkspaceBuildRequest { transition: Transition::Stop };
        // One attempt only: a POST whose reply was lost may have created the build, and Coder
        // queues a second stop on a stopped workspace. The actuator reads the latest build
        // instead of retrying blindly.
        let endpoint = "POST /api/v2/workspaces/{workspace}/builds";
        match self.client.call_with::<WorkspaceBuild>(RetryPolicy::none(), Method::POST, endpoint, path, Some(&body)).await {
            Ok(build) => Ok(StopOutcome::Queued(Box::new(build))),
            Err(CoderError { kind: ErrorKind::Conflict, message, .. }) => Ok(StopOutcome::BuildActive(message)),
            Err(e) => Err(e),
        }
    }

    /// `PUT /api/v2/workspaces/{id}/extend {"deadline": t}` (200 `Deadline updated to <t>.`):
    /// moves the running start build's autostop deadline. One attempt (the actuator's client
    /// retries nothing: the ledger asks again next pass); a 400 or 409 (less than 30 minutes ahead, past `max_deadline`, not started, manual
    /// shutdown, a prebuild; reference NOTES §16) is final.
    pub async fn extend_deadline(&self, workspace_id: &str, deadline: Time) -> Result<(), CoderError> {
        let path = format!("/api/v2/workspaces/{}/extend", encode_path(workspace_id));
        let body = PutExtendWorkspaceRequest { deadline };
        self.client
            .call::<serde::de::IgnoredAny>(Method::PUT, "PUT /api/v2/workspaces/{workspace}/extend", path, Some(&body))
            .await
            .map(|_| ())
    }

    /// `PUT /api/v2/workspaces/{id}/ttl {"ttl_ms": n}` (204). `None` disables autostop.
    pub async fn set_ttl(&self, workspace_id: &str, ttl_ms: Option<i64>) -> Result<(), CoderError> {
        let path = format!("/api/v2/workspaces/{}/ttl", encode_path(workspace_id));
        let body = UpdateWorkspaceTtlRequest { ttl_ms };
        self.client
            .call::<serde::de::IgnoredAny>(Method::PUT, "PUT /api/v2/workspaces/{workspace}/ttl", path, Some(&body))
            .await
            .map(|_| ())
    }
}
