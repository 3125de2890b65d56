//! Why a configuration was refused at start.

use std::path::PathBuf;

use super::env_var_for;

/// A configuration that cannot be used; every variant names the key or the source at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("cannot read configuration file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The configuration file is not valid TOML.
    #[error("configuration file {}{}: {message}", path.display(),
        line.map(|line| format!(" line {line}")).unwrap_or_default())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
        /// Where, when known.
        line: Option<usize>,
    },
    /// An environment variable with the `SWITCHYARD_` prefix names no key.
    #[error("environment variable {name} names no configuration key (see docs/configuration.md)")]
    UnknownEnvVar {
        /// The variable.
        name: String,
    },
    /// A flag or override names no key.
    #[error("{origin} names no configuration key {key:?}")]
    UnknownKey {
        /// The key.
        key: String,
        /// Where it came from.
        origin: String,
    },
    /// A key has a value the gateway cannot use.
    #[error("{key} (env {env}): {problem}")]
    Invalid {
        /// The dotted key, with an index for list entries (`principals[1].token`).
        key: String,
        /// The environment variable that sets it.
        env: String,
        /// What is wrong.
        problem: String,
    },
    /// The configuration would expose the gateway without authentication.
    #[error("refusing to start: {key} (env {env}) {reason}")]
    Insecure {
        /// The key whose value is unsafe.
        key: String,
        /// The environment variable that sets it.
        env: String,
        /// Why it is unsafe and how to fix it.
        reason: String,
    },
}

impl ConfigError {
    /// An [`ConfigError::Invalid`] for `key` (a dotted path, possibly with list indexes).
    pub(crate) fn invalid(key: &str, problem: String) -> Self {
        Self::Invalid {
            key: key.to_owned(),
            env: env_var_of_path(key),
            problem,
        }
    }

    /// An [`ConfigError::Insecure`] for `key`.
    pub(crate) fn insecure(key: &str, reason: String) -> Self {
        Self::Insecure {
            key: key.to_owned(),
            env: env_var_of_path(key),
            reason,
        }
    }

    /// The dotted key at fault, when the error is about one key.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::UnknownKey { key, .. }
            | Self::Invalid { key, .. }
            | Self::Insecure { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// The variable that sets the key holding `path`: a list entry's path (`principals[0].token`)
/// is set through the whole list's variable.
fn env_var_of_path(path: &str) -> String {
    let key = path.split('[').next().unwrap_or(path);
    env_var_for(key)
}
