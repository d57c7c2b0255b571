//! Start-up against Coder, shared by `run`, `plan`, `check` and the demo: log Coder's version,
//! confirm the token's user is an owner (only owners may stop other users' workspaces), and
//! read the token's expiry.

use chrono::{DateTime, Utc};

use crate::coder::{CoderClient, ErrorKind, SessionToken};
use crate::error::Error;

#[derive(Debug, Clone)]
pub struct Identity {
    pub coder_version: String,
    /// The token's user: stop builds it initiated are this service's own.
    pub user_id: String,
    pub username: String,
    pub token_expires_at: Option<DateTime<Utc>>,
}

/// Warn when the token expires within this.
pub const EXPIRY_WARNING: chrono::Duration = chrono::Duration::hours(48);

/// A wrong token (expired, not an owner) is a configuration error (exit 2): the operator must
/// fix it. An unreachable or failing Coder is a runtime error (exit 1): it may pass.
pub async fn confirm_owner(coder: &CoderClient, token: &SessionToken) -> Result<Identity, Error> {
    let classify = |e: crate::coder::CoderError| match e.kind {
        ErrorKind::Unauthorized | ErrorKind::NoPermission => Error::Config(e.to_string()),
        _ => Error::Runtime(e.to_string()),
    };
    let info = coder.buildinfo().await.map_err(classify)?;
    let me = coder.me().await.map_err(classify)?;
    if !me.is_owner() {
        return Err(Error::Config(format!(
            "the session token belongs to {:?}, who is not an owner: only owners may stop other users' workspaces; create the token as a user with the owner role (`coder tokens create --lifetime 168h`)",
            me.username
        )));
    }
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
                "the owner token expires soon: create a new one (owner tokens last at most CODER_MAX_ADMIN_TOKEN_LIFETIME, 7 days by default) and update the Secret"
            );
        }
    }
    tracing::info!(event = "coder_connected", coder_version = %info.version, user = %me.username, token_expires_at = ?token_expires_at, "connected to Coder as an owner");
    Ok(Identity { coder_version: info.version, user_id: me.id, username: me.username, token_expires_at })
}
