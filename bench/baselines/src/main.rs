//! The baselines docs/benchmarks.md compares `switchyard bench` against (see
//! `bench/baselines.sh`), each under the same shape of load — W workers with C slots each, P
//! tasks outstanding, a payload of B bytes echoed back, N tasks — and each printing one JSON
//! object with the bench's field names:
//! - `nats`: NATS request/reply, W workers in one queue group, each on its own connection;
//! - `echo`: a raw tonic bidi stream, one hop (push a task, get the echo), one stream per
//!   producer connection;
//! - `relay`: a raw tonic two-hop relay (producer → relay → worker → relay → producer) over
//!   long-lived bidi streams, with no gateway logic: round-robin over W workers, each holding
//!   at most C tasks;
//! - `unary`: a raw tonic unary echo, P calls at once over `--connections` connections.
//!
//! The tonic ones run server and clients in this process over loopback, plaintext HTTP/2
//! (the gateway's listeners speak TLS). Bounded: N is capped, every wait has a deadline and
//! the run as a whole has one.

mod echo;
mod load;
mod nats;
mod relay;
mod system;

/// The generated wire types and services of `proto/baseline.proto`.
mod wire {
    #![allow(missing_docs, unreachable_pub, clippy::all)]
    tonic::include_proto!("baseline");
}

use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use serde::Serialize;

/// Most tasks one run may ask for.
const MAX_TASKS: u32 = 20_000_000;
/// Most producer connections one run may open.
const MAX_CONNECTIONS: u32 = 64;
/// Bytes of the task number at the start of each NATS payload.
const ID_BYTES: usize = 8;

/// Which baseline to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Baseline {
    /// NATS request/reply with a queue group.
    Nats,
    /// Raw tonic bidi stream, one hop.
    Echo,
    /// Raw tonic two-hop relay over long-lived bidi streams.
    Relay,
    /// Raw tonic unary echo.
    Unary,
}

/// Flags, with the same names and defaults as `switchyard bench`.
#[derive(Parser, Debug, Clone, Serialize)]
#[command(about = "Baselines for switchyard bench: NATS request/reply and raw tonic")]
struct Args {
    /// Which baseline.
    baseline: Baseline,
    /// nats-server address (`nats` only).
    #[arg(long, default_value = "127.0.0.1:4222")]
    server: String,
    /// Workers, each over its own connection (`nats`, `relay`).
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Tasks each worker holds at once (`nats`, `relay`).
    #[arg(long, default_value_t = 64)]
    capacity: u32,
    /// Tasks to run.
    #[arg(long, default_value_t = 200_000)]
    tasks: u32,
    /// Tasks outstanding at once (sent, echo not yet received).
    #[arg(long, default_value_t = 256)]
    outstanding: u32,
    /// Producer connections the outstanding tasks are spread over (`echo`: one stream on
    /// each; `relay`: one producer stream on each; `unary`: calls round-robin).
    #[arg(long, default_value_t = 1)]
    connections: u32,
    /// Payload bytes per task (at least 8), echoed back.
    #[arg(long, default_value_t = 64)]
    payload: usize,
    /// Microseconds each task takes in the worker (`nats`, `relay`).
    #[arg(long, default_value_t = 0)]
    service_time_us: u64,
    /// Seconds the whole run may take.
    #[arg(long, default_value_t = 600)]
    deadline_secs: u64,
}

/// What the run measured.
#[derive(Debug, Serialize)]
struct Report<'a> {
    mode: &'static str,
    parameters: &'a Args,
    elapsed_s: f64,
    tasks_per_sec: f64,
    p50_us: u64,
    p90_us: u64,
    p99_us: u64,
    p999_us: u64,
    max_us: u64,
    /// Echoes received (one per task).
    replies: u64,
    /// Whole-machine busy CPU time over the run divided by the tasks (nats-server included).
    cpu_us_per_dispatch: Option<f64>,
    load_average_1m: Option<f64>,
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(report) => {
            println!("{report}");
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("baseline: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn validate(args: &Args) -> Result<(), Failure> {
    for (name, value, max) in [
        ("--workers", args.workers, 10_000),
        ("--capacity", args.capacity, 100_000),
        ("--tasks", args.tasks, MAX_TASKS),
        ("--outstanding", args.outstanding, 1_000_000),
        ("--connections", args.connections, MAX_CONNECTIONS),
    ] {
        if value == 0 || value > max {
            return Err(format!("{name} {value}: must be 1..={max}").into());
        }
    }
    if args.connections > args.outstanding {
        return Err(format!(
            "--connections {}: at most --outstanding ({})",
            args.connections, args.outstanding
        )
        .into());
    }
    if args.payload < ID_BYTES {
        return Err(format!("--payload {}: at least {ID_BYTES} bytes", args.payload).into());
    }
    Ok(())
}

async fn run(args: &Args) -> Result<String, Failure> {
    validate(args)?;
    let deadline = Instant::now() + Duration::from_secs(args.deadline_secs);
    let measured = match args.baseline {
        Baseline::Nats => nats::run(args, deadline).await?,
        Baseline::Echo => echo::stream(args, deadline).await?,
        Baseline::Relay => relay::run(args, deadline).await?,
        Baseline::Unary => echo::unary(args, deadline).await?,
    };
    let latency = &measured.run.latency;
    let seconds = measured.elapsed.as_secs_f64();
    let report = Report {
        mode: match args.baseline {
            Baseline::Nats => "nats",
            Baseline::Echo => "echo",
            Baseline::Relay => "relay",
            Baseline::Unary => "unary",
        },
        parameters: args,
        elapsed_s: seconds,
        tasks_per_sec: measured.run.replies as f64 / seconds.max(f64::EPSILON),
        p50_us: latency.value_at_quantile(0.5),
        p90_us: latency.value_at_quantile(0.9),
        p99_us: latency.value_at_quantile(0.99),
        p999_us: latency.value_at_quantile(0.999),
        max_us: latency.max(),
        replies: measured.run.replies,
        cpu_us_per_dispatch: system::cpu_us_per_dispatch(
            measured.cpu_before,
            measured.cpu_after,
            u64::from(args.tasks),
        ),
        load_average_1m: system::load_average(),
    };
    Ok(serde_json::to_string(&report)?)
}
