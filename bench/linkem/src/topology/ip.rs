//! Runs iproute2's `ip`, turning a failure into an error that quotes the command.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::topology::TopologyError;

/// Where distributions install `ip`; the first that exists wins, else `ip` from `PATH`.
const IP_CANDIDATES: [&str; 4] = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"];

/// The `ip` binary.
#[derive(Debug, Clone)]
pub(crate) struct Ip {
    program: String,
}

impl Ip {
    pub(crate) fn locate() -> Self {
        let program = IP_CANDIDATES
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("ip");
        Self {
            program: program.to_owned(),
        }
    }

    /// Runs `ip ARGS` and waits for it.
    pub(crate) fn run(&self, args: &[&str]) -> Result<(), TopologyError> {
        let command = format!("{} {}", self.program, args.join(" "));
        tracing::debug!(%command, "running");
        let output = Command::new(&self.program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| TopologyError::Spawn {
                command: command.clone(),
                source,
            })?;
        if output.status.success() {
            return Ok(());
        }
        Err(TopologyError::CommandFailed {
            command,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }

    /// Whether the named network namespace exists.
    pub(crate) fn namespace_exists(name: &str) -> bool {
        Path::new("/run/netns").join(name).exists()
    }
}
