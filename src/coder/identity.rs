//! What the token is, shared by `run`, `plan`, `check` and the demo, and re-asked whenever the
//! token changes (and daily): Coder's version, the token's user, what the token may do
//! (`POST /api/v2/authcheck`, which honours the token's scope and organization roles, unlike
//! the role names of `users/me`), and when it expires.

use chrono::{DateTime, Utc};

use crate::coder::token::TOKEN_ADVICE;
use crate::coder::{CoderClient, CoderError, ErrorKind};
use crate::error::Error;

#[derive(Debug, Clone)]
pub struct Identity {
    pub coder_version: String,
    /// The token's user: stop builds it initiated are this service's own.
    pub user_id: String,
    pub username: String,
    pub token_expires_at: Option<DateTime<Utc>>,
    pub permissions: Permissions,
}

/// What the token may do to workspaces, in any organization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permissions {
    pub read: bool,
    pub stop: bool,
}

impl Identity {
    /// Why this token cannot read every workspace, if it cannot.
    pub fn cannot_read(&self) -> Option<String> {
        (!self.permissions.read).then(|| {
            format!(
                "the token of {:?} may not read workspaces (authcheck: workspace read = false): create one {TOKEN_ADVICE}",
                self.username
            )
        })
    }

    /// Why this token cannot stop workspaces, if it cannot.
    pub fn cannot_stop(&self) -> Option<String> {
        (!self.permissions.stop).then(|| {
            format!(
                "the token of {:?} may not stop workspaces (authcheck: workspace stop = false; a member, a template admin, or a token whose --scope leaves out workspace:stop): create one {TOKEN_ADVICE}",
                self.username
            )
        })
    }
}

/// Warn when the token expires within this.
pub const EXPIRY_WARNING: chrono::Duration = chrono::Duration::hours(48);

/// A wrong token (expired, revoked) is a configuration error (exit 2): the operator must fix it.
/// An unreachable or failing Coder is a runtime error (exit 1): it may pass.
fn config_or_runtime(e: CoderError) -> Error {
    match e.kind {
        ErrorKind::Unauthorized | ErrorKind::NoPermission => Error::Config(e.to_string()),
        _ => Error::Runtime(e.to_string()),
    }
}

/// Asks Coder who the token is and what it may do. Refusing to run for missing permissions is
/// the caller's decision (it depends on the mode: `actuator::require_permissions`).
pub async fn connect(coder: &CoderClient) -> Result<Identity, Error> {
    let info = coder.buildinfo().await.map_err(config_or_runtime)?;
    let me = coder.me().await.map_err(config_or_runtime)?;
    let permissions = match coder.authcheck(&["read", "stop"], "workspace").await {
        Ok(answers) => {
            Permissions { read: answers.get("read").copied().unwrap_or(false), stop: answers.get("stop").copied().unwrap_or(false) }
        }
        Err(e) => return Err(config_or_runtime(e)),
    };
    let token = coder.token();
    let token_expires_at = match token.key_id() {
        Some(id) => match coder.api_key(id).await {
            Ok(key) => Some(key.expires_at),
            Err(e) => {
                tracing::warn!(event = "token_expiry_unknown", error = %e, "cannot read the token's expiry");
                None
            }
        },
        None => None,
    };
    if let Some(exp) = token_expires_at {
        let left = exp - Utc::now();
        if left < EXPIRY_WARNING {
            tracing::warn!(
                event = "token_expiring",
                expires_at = %exp,
                hours_left = left.num_hours(),
                "the token expires soon: create a new one (owner tokens last at most CODER_MAX_ADMIN_TOKEN_LIFETIME, 7 days by default) and update the Secret; a token file is picked up without a restart"
            );
        }
    }
    tracing::info!(event = "coder_connected", coder_version = %info.version, user = %me.username, may_stop = permissions.stop, token_expires_at = %token_expires_at.map_or_else(|| "unknown".to_string(), |t| t.to_rfc3339()), "connected to Coder");
    Ok(Identity { coder_version: info.version, user_id: me.id, username: me.username, token_expires_at, permissions })
}
