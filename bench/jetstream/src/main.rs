//! The NATS JetStream baseline beside `switchyard bench --durable` (see `bench/durable.sh` and
//! docs/benchmarks.md): a work-queue stream on file storage with one replica; the producer
//! publishes each task and waits for JetStream's publish acknowledgement, W workers pull from
//! one durable consumer with C tasks each in flight, ack each task and reply to the producer.
//! Latency is publish to reply. Prints one JSON object, with the same field names as the
//! switchyard bench where they mean the same thing.
//!
//! Bounded: N is capped, every wait has a deadline and the run as a whole has one.

mod producer;
mod system;
mod worker;

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use clap::Parser;
use serde::Serialize;

/// The stream the baseline creates (and deletes first, so each run starts empty).
const STREAM: &str = "SWITCHYARD_BENCH";
/// The subject tasks are published on.
const TASK_SUBJECT: &str = "switchyard.bench.work";
/// The subject workers reply on.
const REPLY_SUBJECT: &str = "switchyard.bench.reply";
/// The durable pull consumer every worker shares.
const CONSUMER: &str = "workers";
/// Most tasks one run may ask for.
const MAX_TASKS: u32 = 20_000_000;
/// Bytes of the task number at the start of each payload.
const ID_BYTES: usize = 8;

/// Flags, with the same names and defaults as `switchyard bench`.
#[derive(Parser, Debug, Clone, Serialize)]
#[command(about = "NATS JetStream work-queue baseline for switchyard bench --durable")]
struct Args {
    /// nats-server address.
    #[arg(long, default_value = "127.0.0.1:4222")]
    server: String,
    /// Workers, each over its own connection.
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Tasks each worker holds at once.
    #[arg(long, default_value_t = 64)]
    capacity: u32,
    /// Tasks to run.
    #[arg(long, default_value_t = 200_000)]
    tasks: u32,
    /// Tasks outstanding at once (published, reply not yet received).
    #[arg(long, default_value_t = 256)]
    outstanding: u32,
    /// Payload bytes per task (at least 8: the task number), echoed back as the reply.
    #[arg(long, default_value_t = 64)]
    payload: usize,
    /// Microseconds each task takes in the worker.
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
    /// Replies received (one per task when nothing was lost).
    replies: u64,
    /// Publishes JetStream refused or did not acknowledge.
    publish_errors: u64,
    /// Handler runs, summed over workers (more than `tasks` when a task was redelivered).
    executions: u64,
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
            eprintln!("jetstream baseline: {error}");
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
    ] {
        if value == 0 || value > max {
            return Err(format!("{name} {value}: must be 1..={max}").into());
        }
    }
    if args.payload < ID_BYTES {
        return Err(format!("--payload {}: at least {ID_BYTES} bytes", args.payload).into());
    }
    Ok(())
}

async fn run(args: &Args) -> Result<String, Failure> {
    validate(args)?;
    let deadline = Instant::now() + Duration::from_secs(args.deadline_secs);
    let client = async_nats::connect(&args.server).await?;
    let js = jetstream::new(client.clone());
    let _ = js.delete_stream(STREAM).await;
    let stream = js
        .create_stream(stream::Config {
            name: STREAM.to_owned(),
            subjects: vec![TASK_SUBJECT.to_owned()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            num_replicas: 1,
            ..stream::Config::default()
        })
        .await?;
    let capacity = i64::from(args.workers) * i64::from(args.capacity);
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(CONSUMER.to_owned()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            max_ack_pending: capacity,
            ..consumer::pull::Config::default()
        })
        .await?;
    let fleet = worker::Fleet::start(args).await?;
    let cpu_before = system::busy_ticks();
    let started = Instant::now();
    let run = producer::run(args, &client, &js, deadline).await;
    let elapsed = started.elapsed();
    let cpu_after = system::busy_ticks();
    let executions = fleet.stop().await;
    let _ = js.delete_stream(STREAM).await;
    let run = run?;
    let latency = &run.latency;
    let seconds = elapsed.as_secs_f64();
    let report = Report {
        mode: "jetstream",
        parameters: args,
        elapsed_s: seconds,
        tasks_per_sec: run.replies as f64 / seconds.max(f64::EPSILON),
        p50_us: latency.value_at_quantile(0.5),
        p90_us: latency.value_at_quantile(0.9),
        p99_us: latency.value_at_quantile(0.99),
        p999_us: latency.value_at_quantile(0.999),
        max_us: latency.max(),
        replies: run.replies,
        publish_errors: run.publish_errors,
        executions,
        cpu_us_per_dispatch: system::cpu_us_per_dispatch(
            cpu_before,
            cpu_after,
            u64::from(args.tasks),
        ),
        load_average_1m: system::load_average(),
    };
    Ok(serde_json::to_string(&report)?)
}
