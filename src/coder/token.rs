//! The owner session token: read from the environment or a file, never printed. `Debug` and
//! `Display` are redacted, so it cannot leak through logs, errors or `--help`. A token read
//! from a file is re-read when the file changes (Kubernetes swaps a mounted Secret in place)
//! and after a 401, so a rotated token takes effect without a restart.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

/// How to get a token that may do what this service needs, after "create one" or "create a new
/// one": written for a missing token, a rejected one (401) and one authcheck denies read or stop.
/// Other messages word their own advice: per organization (give its user the organization-admin
/// role there), on expiry (create a new one, update the Secret), and short hints ("set it to an
/// owner token", "use an owner's token").
pub const TOKEN_ADVICE: &str = "as an owner (or an organization admin, for its organization) with no --scope: \
`coder tokens create --name gpu-reclaimer --lifetime 168h`, and update CODER_SESSION_TOKEN or the token file";

#[derive(Clone, PartialEq, Eq)]
pub struct SessionToken(String);

impl SessionToken {
    /// Validates shape only: Coder tokens are `<key id>-<secret>`.
    pub fn new(raw: &str) -> Result<Self, String> {
        let token = raw.trim();
        if token.is_empty() {
            return Err("the session token is empty".into());
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("the session token contains whitespace or control characters".into());
        }
        Ok(SessionToken(token.to_string()))
    }

    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = crate::http::read_secret_file(path).map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
        Self::new(&text).map_err(|e| format!("{e} (in {})", path.display()))
    }

    /// The API key id: the part before the first `-` (`GET /api/v2/users/me/keys/{id}`).
    pub fn key_id(&self) -> Option<&str> {
        self.0.split_once('-').map(|(id, _)| id).filter(|id| !id.is_empty())
    }

    /// The secret, for the one header that needs it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

/// Where the client's token comes from: fixed (the environment), or a file that may change.
#[derive(Debug)]
pub struct TokenSource {
    current: RwLock<SessionToken>,
    file: Option<PathBuf>,
}

impl TokenSource {
    pub fn fixed(token: SessionToken) -> Self {
        TokenSource { current: RwLock::new(token), file: None }
    }

    /// `token` was read from `path` (at start-up, by the settings).
    pub fn file(token: SessionToken, path: PathBuf) -> Self {
        TokenSource { current: RwLock::new(token), file: Some(path) }
    }

    pub fn current(&self) -> SessionToken {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Re-reads the file. `Ok(true)` when it holds a new token (now current); `Ok(false)` when
    /// unchanged or not from a file; an unreadable or empty file (mid-rotation) keeps the
    /// current token and says why.
    pub fn reload(&self) -> Result<bool, String> {
        let Some(path) = &self.file else { return Ok(false) };
        let fresh = SessionToken::from_file(path)?;
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        if *current == fresh {
            return Ok(false);
        }
        *current = fresh;
        Ok(true)
    }

    pub fn from_file(&self) -> bool {
        self.file.is_some()
    }
}

impl fmt::Debug for SessionToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionToken(<redacted>)")
    }
}

impl fmt::Display for SessionToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_formats_the_secret() {
        let t = SessionToken::new("abcDEF1234-s3cr3tvalue").unwrap();
        assert!(!format!("{t:?} {t}").contains("s3cr3t"));
        assert_eq!(t.key_id(), Some("abcDEF1234"));
    }

    #[test]
    fn a_token_file_is_reread_when_it_changes() {
        let path = std::env::temp_dir().join(format!("cgr-token-{}", std::process::id()));
        std::fs::write(&path, "key0000001-first\n").unwrap();
        let source = TokenSource::file(SessionToken::from_file(&path).unwrap(), path.clone());
        assert_eq!(source.reload(), Ok(false));
        std::fs::write(&path, "key0000002-second\n").unwrap();
        assert_eq!(source.reload(), Ok(true));
        assert_eq!(source.current().key_id(), Some("key0000002"));
        std::fs::write(&path, "").unwrap();
        assert!(source.reload().is_err(), "an empty file mid-rotation is an error...");
        assert_eq!(source.current().key_id(), Some("key0000002"), "...and the current token stays");
        std::fs::remove_file(&path).ok();
        assert_eq!(TokenSource::fixed(SessionToken::new("a-b").unwrap()).reload(), Ok(false));
    }

    #[test]
    fn rejects_empty_and_inner_whitespace_but_trims_newlines() {
        assert!(SessionToken::new("  \n").is_err());
        assert!(SessionToken::new("a b").is_err());
        assert_eq!(SessionToken::new("id-secret\n").unwrap().expose(), "id-secret");
        assert_eq!(SessionToken::new("nodash").unwrap().key_id(), None);
    }
}
