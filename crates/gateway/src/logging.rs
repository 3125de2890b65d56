//! Log output: `tracing` events filtered like `RUST_LOG`, as text or JSON lines.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::MakeWriterExt;

use crate::config::{LogFormat, LogSection};

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The filter does not parse.
    #[error("log.filter (env SWITCHYARD_LOG_FILTER): {0}")]
    Filter(String),
    /// A global subscriber is already installed.
    #[error("a tracing subscriber is already installed")]
    AlreadyInstalled,
}

/// Installs the process-wide subscriber, writing to stderr. `RUST_LOG`, when set, wins over
/// `log.filter`. Text is coloured only when stderr is a terminal and `NO_COLOR` is unset, so a
/// log redirected to a file or a pipe holds no escape codes.
pub fn init(section: &LogSection) -> Result<(), LogError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(text) if !text.is_empty() => text,
        _ => section.filter.clone(),
    };
    let filter =
        EnvFilter::try_new(&filter).map_err(|error| LogError::Filter(error.to_string()))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour_wanted())
        .with_writer(std::io::stderr.with_max_level(tracing::Level::TRACE));
    let installed = match section.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|_| LogError::AlreadyInstalled)
}

/// True when stderr is a terminal and `NO_COLOR` (<https://no-color.org>) is not set.
fn colour_wanted() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
    !no_color && std::io::IsTerminal::is_terminal(&std::io::stderr())
}
