//! The subcommands of the `switchyard` binary and how they end (exit codes).

pub(crate) mod behaviour;
pub(crate) mod client;
pub(crate) mod demo;
pub(crate) mod durable;
pub(crate) mod inspect;
pub(crate) mod serve;
pub(crate) mod table;
pub(crate) mod worker;

use std::process::ExitCode;

/// Exit code: success.
pub(crate) const EXIT_OK: u8 = 0;
/// Exit code: a failure at run time (cannot connect, call refused, gateway failed).
pub(crate) const EXIT_RUNTIME: u8 = 1;
/// Exit code: a usage or configuration error.
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit code: `dispatch` ran but the activity did not complete successfully.
pub(crate) const EXIT_NOT_COMPLETED: u8 = 3;
/// Exit code: `outcome` found the durable dispatch not finished within `--wait`.
pub(crate) const EXIT_PENDING: u8 = 4;

/// A command that did not succeed, with the code the process exits with.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }

    pub(crate) fn runtime(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_RUNTIME,
            message: message.into(),
        }
    }

    pub(crate) fn not_completed(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_NOT_COMPLETED,
            message: message.into(),
        }
    }

    pub(crate) fn status(status: &tonic::Status) -> Self {
        Self::runtime(format!("{:?}: {}", status.code(), status.message()))
    }
}

/// Prints a failure and turns a command's result into the process exit code.
pub(crate) fn exit(result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(failure) => {
            eprintln!("switchyard: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// The configuration of a gateway started inside this process (`demo`, `bench`): every
/// listener on an ephemeral loopback port, its TLS material in `data_dir`.
pub(crate) fn in_process_config(data_dir: &std::path::Path) -> switchyard_gateway::GatewayConfig {
    let mut config = switchyard_gateway::GatewayConfig::default();
    for listen in [
        &mut config.grpc.listen,
        &mut config.quic.listen,
        &mut config.ops.listen,
    ] {
        listen.set_port(0);
    }
    config.tls.data_dir = data_dir.display().to_string();
    config
}
