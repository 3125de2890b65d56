//! The `switchyard` binary: the gateway (`serve`), a self-contained `demo`, and a client for the
//! producer/operator API.
//!
//! Exit codes: 0 success; 1 failure at run time (cannot connect, call refused, gateway
//! failed); 2 usage or configuration error; 3 `dispatch` (or `outcome`) ran but the activity did
//! not complete successfully (failed, timed out, cancelled, unserved, transport lost, shutting
//! down); 4 `outcome` found the durable dispatch not finished within `--wait`.
#![forbid(unsafe_code)]

mod bench;
mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cmd::demo::DemoArgs;
use cmd::durable::{DispatchesArgs, OutcomeArgs, SubmitArgs};
use cmd::inspect::{DispatchArgs, DrainArgs, EventsArgs, PoolArgs, UnservedArgs, WorkersArgs};
use cmd::serve::ServeArgs;
use cmd::worker::WorkerArgs;

/// jemalloc rather than the system allocator: the dispatch path allocates small buffers per
/// task on several threads, where glibc's malloc took ~11% of a loopback bench's CPU (perf);
/// see docs/benchmarks.md for the A/B figures. Feature `jemalloc` (default).
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const AFTER_HELP: &str = "\
Exit codes:
  0  success
  1  failure at run time (cannot connect, call refused, gateway failed)
  2  usage or configuration error
  3  `dispatch` or `outcome`: the activity did not complete successfully
  4  `outcome`: the durable dispatch has no outcome yet (not finished within --wait)

Default ports (all on 127.0.0.1): 7700 TCP producer API + gRPC workers, 7701 UDP QUIC workers,
7702 TCP operations HTTP. Configuration keys and their SWITCHYARD_... variables are listed in
docs/configuration.md.";

/// Switchyard: a multi-transport worker gateway.
#[derive(Debug, Parser)]
#[command(name = "switchyard", version, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway until SIGINT or SIGTERM (works with no configuration, on loopback).
    Serve(ServeArgs),
    /// Start a gateway, a gRPC and a QUIC worker, run a few thousand dispatches, print a report.
    Demo(DemoArgs),
    /// Run a ready-made worker (echo, sleep or fail activities) over gRPC or QUIC.
    Worker(WorkerArgs),
    /// Run one activity and print its outcome (exit code 3 when it did not complete).
    Dispatch(DispatchArgs),
    /// Record a durable dispatch (it survives a gateway restart) and print its id at once.
    Submit(SubmitArgs),
    /// Print a durable dispatch's outcome (exit code 3 when it did not complete, 4 when it has
    /// none yet).
    Outcome(OutcomeArgs),
    /// List durable dispatches, filtered by pool and state.
    Dispatches(DispatchesArgs),
    /// List the connected workers.
    Workers(WorkersArgs),
    /// Show a pool's census and why each worker can or cannot take an activity.
    Pool(PoolArgs),
    /// List the queues where dispatches wait for a worker, and why.
    Unserved(UnservedArgs),
    /// Drain a worker (or every worker on a node) and follow its progress.
    Drain(DrainArgs),
    /// Print worker events as they happen.
    Events(EventsArgs),
    /// Measure throughput, latency and memory: a gateway, SDK workers and N dispatches; prints
    /// one JSON object.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("switchyard: cannot start the async runtime: {error}");
            return ExitCode::from(cmd::EXIT_RUNTIME);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => cmd::serve::serve(args).await,
            Command::Demo(args) => cmd::demo::demo(args).await,
            Command::Worker(args) => cmd::worker::worker(args).await,
            Command::Dispatch(args) => cmd::inspect::dispatch(args).await,
            Command::Submit(args) => cmd::durable::submit(args).await,
            Command::Outcome(args) => cmd::durable::outcome(args).await,
            Command::Dispatches(args) => cmd::durable::dispatches(args).await,
            Command::Workers(args) => cmd::inspect::workers(args).await,
            Command::Pool(args) => cmd::inspect::pool(args).await,
            Command::Unserved(args) => cmd::inspect::unserved(args).await,
            Command::Drain(args) => cmd::inspect::drain(args).await,
            Command::Events(args) => cmd::inspect::events(args).await,
            Command::Bench(args) => bench::bench(args).await,
        }
    });
    cmd::exit(result)
}
