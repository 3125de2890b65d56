//! The `linkem` command line: run the emulator, clean up after a crash, or run a UDP probe.
#![forbid(unsafe_code)]

mod cli;
mod run;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let outcome = match cli.command {
        None => run::emulate(&cli.run),
        Some(Command::Cleanup(args)) => run::cleanup(&args),
        Some(Command::UdpSink(args)) => run::udp_sink(&args),
        Some(Command::UdpSend(args)) => run::udp_send(&args),
        Some(Command::UdpEcho(args)) => run::udp_echo(&args),
        Some(Command::UdpPing(args)) => run::udp_ping(&args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("linkem: error: {error}");
            ExitCode::FAILURE
        }
    }
}
