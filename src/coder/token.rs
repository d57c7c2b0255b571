//! The owner session token: read from the environment or a file, never printed. `Debug` and
//! `Display` are redacted, so it cannot leak through logs, errors or `--help`.

use std::fmt;
use std::path::Path;

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
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
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
    fn rejects_empty_and_inner_whitespace_but_trims_newlines() {
        assert!(SessionToken::new("  \n").is_err());
        assert!(SessionToken::new("a b").is_err());
        assert_eq!(SessionToken::new("id-secret\n").unwrap().expose(), "id-secret");
        assert_eq!(SessionToken::new("nodash").unwrap().key_id(), None);
    }
}
