//! The binary's one error type. Its variant is the exit class, decided where the error is made:
//! `Config` (exit 2) when the operator must change a setting, a token or a permission;
//! `Runtime` (exit 1) when something failed that may pass. Messages name the fix.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// Exit 2: usage or configuration; the message names the setting and the fix.
    Config(String),
    /// Exit 1: a failure at run time.
    Runtime(String),
}

impl Error {
    pub fn config(msg: impl Into<String>) -> Self {
        Error::Config(msg.into())
    }

    pub fn runtime(msg: impl Into<String>) -> Self {
        Error::Runtime(msg.into())
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config(_) => 2,
            Error::Runtime(_) => 1,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Error::Config(m) | Error::Runtime(m) => m,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;
