//! Configuration: a TOML file, overridden by `SWITCHYARD_...` environment variables, overridden
//! by command-line flags, checked once at start.
//!
//! The key list is not written down twice: it is read off the serialised defaults, so every
//! field of [`GatewayConfig`] is a key, every key has an environment variable (the dotted path
//! in upper case with `_` for `.`, after `SWITCHYARD_`), and an error names both. Values from
//! the environment and flags are read as the key's type: text as is, numbers and booleans
//! parsed, lists and tables as TOML inline values (`["a", "b"]`, `[{ name = "x" }]`).

pub(crate) mod cluster;
mod duration;
mod error;
#[cfg(test)]
mod overrides;
mod sections;
mod validate;

use std::path::Path;

pub use cluster::ClusterSection;
pub use duration::{ConfigDuration, DurationSyntax};
pub use error::ConfigError;
pub use sections::{
    CongestionName, DEFAULT_STORE_FILE, DispatchSection, DurabilityName, GatewayConfig,
    GrpcSection, LivenessSection, LogFormat, LogSection, NamespacePolicyName, NamespaceSection,
    NamespacesSection, OpsSection, PrincipalSection, QuicSection, RedundancyName, ReflectionName,
    RegistrySection, RetryName, RoleName, ShutdownSection, StoreBackendName, StoreSection,
    SynchronousName, TlsSection,
};

/// Prefix of every configuration environment variable.
pub const ENV_PREFIX: &str = "SWITCHYARD_";

/// Environment variables with the prefix that belong to the command-line client, not to the
/// gateway's configuration; the loader leaves them alone.
pub const CLIENT_ENV_VARS: &[&str] = &[
    "SWITCHYARD_ENDPOINT",
    "SWITCHYARD_TOKEN",
    "SWITCHYARD_CA",
    "SWITCHYARD_CLIENT_CERT",
    "SWITCHYARD_CLIENT_KEY",
];

/// The environment variable that overrides `key` (`grpc.listen` → `SWITCHYARD_GRPC_LISTEN`).
pub fn env_var_for(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.replace('.', "_").to_ascii_uppercase())
}

/// Every configuration key, as a dotted path, in file order.
pub fn keys() -> Vec<String> {
    let mut keys = Vec::new();
    collect_leaves(&defaults_table(), "", &mut keys);
    keys
}

/// A value given for one key from outside the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    /// The dotted key.
    pub key: String,
    /// The value as text.
    pub value: String,
    /// Where it came from, for error messages (`flag --grpc-listen`).
    pub origin: String,
}

impl Override {
    /// A value given by a command-line flag.
    pub fn flag(key: &str, flag: &str, value: impl Into<String>) -> Self {
        Self {
            key: key.to_owned(),
            value: value.into(),
            origin: format!("flag --{flag}"),
        }
    }
}

impl GatewayConfig {
    /// Loads the configuration: defaults, then `file` (if any), then every `SWITCHYARD_...`
    /// variable of `env`, then `flags`; then checks it as a whole.
    pub fn load<I>(file: Option<&Path>, env: I, flags: &[Override]) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let defaults = defaults_table();
        let mut merged = defaults.clone();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            let table: toml::Table =
                toml::from_str(&text).map_err(|error| ConfigError::Syntax {
                    path: path.to_owned(),
                    message: error.message().to_owned(),
                    line: line_of(&text, error.span().map(|span| span.start)),
                })?;
            merge(&mut merged, table);
        }
        let mut env: Vec<(String, String)> = env
            .into_iter()
            .filter(|(name, _)| name.starts_with(ENV_PREFIX))
            .filter(|(name, _)| !CLIENT_ENV_VARS.contains(&name.as_str()))
            .collect();
        env.sort();
        let leaves = keys();
        for (name, value) in env {
            let key = leaves
                .iter()
                .find(|key| env_var_for(key) == name)
                .ok_or_else(|| ConfigError::UnknownEnvVar { name: name.clone() })?;
            let origin = format!("env {name}");
            apply(&mut merged, &defaults, key, &value, &origin)?;
        }
        for flag in flags {
            apply(&mut merged, &defaults, &flag.key, &flag.value, &flag.origin)?;
        }
        let config: GatewayConfig = serde_path_to_error::deserialize(toml::Value::Table(merged))
            .map_err(|error| {
                let key = error.path().to_string();
                // The TOML error repeats the key on a second line; the first line is the news.
                let message = error.into_inner().to_string();
                let first_line = message.lines().next().unwrap_or_default().to_owned();
                ConfigError::invalid(&key, first_line)
            })?;
        validate::validate(&config)?;
        Ok(config)
    }

    /// The configuration with no file, no environment and no flags.
    pub fn development() -> Self {
        Self::default()
    }
}

fn defaults_table() -> toml::Table {
    // The defaults are plain data of known shape; serialising them cannot fail, and an empty
    // table would only make every key unknown (caught by the key-list test).
    toml::Table::try_from(GatewayConfig::default()).unwrap_or_default()
}

fn collect_leaves(table: &toml::Table, prefix: &str, keys: &mut Vec<String>) {
    for (name, value) in table {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        match value {
            toml::Value::Table(inner) => collect_leaves(inner, &path, keys),
            _ => keys.push(path),
        }
    }
}

fn merge(into: &mut toml::Table, from: toml::Table) {
    for (name, value) in from {
        match (into.get_mut(&name), value) {
            (Some(toml::Value::Table(existing)), toml::Value::Table(inner)) => {
                merge(existing, inner);
            }
            (_, value) => {
                into.insert(name, value);
            }
        }
    }
}

/// Sets `key` in `merged` from `text`, typed like the key's default.
fn apply(
    merged: &mut toml::Table,
    defaults: &toml::Table,
    key: &str,
    text: &str,
    origin: &str,
) -> Result<(), ConfigError> {
    let Some(default) = lookup(defaults, key) else {
        return Err(ConfigError::UnknownKey {
            key: key.to_owned(),
            origin: origin.to_owned(),
        });
    };
    let value = match default {
        toml::Value::String(_) => toml::Value::String(text.to_owned()),
        _ => parse_inline(text).ok_or_else(|| ConfigError::Invalid {
            key: key.to_owned(),
            env: env_var_for(key),
            problem: format!("{origin}: {text:?} is not a valid {}", default.type_str()),
        })?,
    };
    let mut table = merged;
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            table.insert(part.to_owned(), value);
            break;
        }
        let entry = table
            .entry(part.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(inner) = entry else {
            return Err(ConfigError::invalid(
                part,
                "expected a table of keys".to_owned(),
            ));
        };
        table = inner;
    }
    Ok(())
}

fn lookup<'a>(table: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let mut parts = key.split('.');
    let mut value = table.get(parts.next()?)?;
    for part in parts {
        value = value.as_table()?.get(part)?;
    }
    Some(value)
}

fn parse_inline(text: &str) -> Option<toml::Value> {
    let table: toml::Table = toml::from_str(&format!("value = {text}")).ok()?;
    table.get("value").cloned()
}

fn line_of(text: &str, offset: Option<usize>) -> Option<usize> {
    let offset = offset?;
    Some(text.get(..offset)?.matches('\n').count() + 1)
}

#[cfg(test)]
mod tests;
