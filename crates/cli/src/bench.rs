//! `switchyard bench`: an end-to-end load generator.
//!
//! It starts a gateway in-process (or drives one at `--connect`), connects W workers through
//! the Rust SDKs, each over its own real socket, and runs N dispatches with at most P
//! outstanding through the producer API (`--via unary|stream`) or straight into core's
//! dispatcher (`--via core`, which separates the producer API's cost from the rest). It prints
//! one JSON object on stdout. Everything is bounded: N and K are capped, every wait has a
//! deadline, and each dispatch carries a timeout.
//!
//! `--durable` makes every dispatch durable: recorded in the gateway's store before it runs,
//! its outcome recorded before it is returned (`--via stream` and `unary` set `durable` on each
//! request; `--via submit` submits and reads outcomes from `WatchOutcomes`, see
//! `bench/submit.rs`); `--store` picks the in-process gateway's store.
//!
//! `--scenario tenant-fairness` measures what parked work in one tenant's pool costs another
//! tenant's dispatch rate (see `bench/fairness.rs`).
//!
//! `--cluster N` starts N `switchyard serve` nodes joined over NATS in their own processes and
//! measures the local and the cross-node path beside a lone node (see `bench/cluster.rs`).
//!
//! `--idle-workers K` instead connects K idle workers (alternating gRPC and QUIC) and reports
//! the memory each costs and how long all K took to register and become eligible.

mod args;
mod cluster;
mod drive;
mod executions;
mod fairness;
mod idle;
mod report;
mod submit;
mod system;
mod target;
mod workers;

use std::time::{Duration, Instant};

use crate::cmd::Failure;

pub(crate) use args::BenchArgs;

use args::{Scenario, Via};
use report::LoadReport;
use target::Target;

/// Namespace every bench worker serves and every dispatch uses.
const NAMESPACE: &str = "bench";
/// Activity type of the load phase.
const ACTIVITY: &str = "work";
/// How long workers get to connect and become eligible.
const READY_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `switchyard bench`.
pub(crate) async fn bench(args: BenchArgs) -> Result<(), Failure> {
    args.validate()?;
    let _ = switchyard_gateway::init_logging(&switchyard_gateway::LogSection {
        // The JSON object is the output; warnings would only interleave with it on a terminal.
        filter: "error".to_owned(),
        ..switchyard_gateway::LogSection::default()
    });
    if let Some(nodes) = args.cluster {
        let report = cluster::run(&args, nodes).await?;
        println!("{report}");
        return Ok(());
    }
    let target = Target::start(&args).await?;
    let result = match (args.idle_workers, args.workers_only) {
        _ if args.scenario == Scenario::TenantFairness => fairness::run(&args, &target).await,
        (Some(count), _) => idle::run(&args, &target, count).await,
        (None, Some(seconds)) => serve_workers(&args, &target, seconds).await,
        (None, None) => load(&args, &target).await,
    };
    target.stop().await;
    let report = result?;
    println!("{report}");
    Ok(())
}

/// The load phase: connect the workers, wait until they are eligible, run N dispatches.
async fn load(args: &BenchArgs, target: &Target) -> Result<String, Failure> {
    let fleet = if args.external_workers {
        workers::Fleet::empty()
    } else {
        workers::Fleet::connect(args, target).await?
    };
    let ready = target
        .wait_eligible(ACTIVITY, args.workers, READY_DEADLINE)
        .await;
    if let Err(failure) = ready {
        fleet.stop().await;
        return Err(failure);
    }
    let cpu_before = system::busy_ticks();
    let started = Instant::now();
    let run = match args.via {
        Via::Stream => drive::stream(args, target).await,
        Via::Unary => drive::unary(args, target).await,
        Via::Core => drive::core(args, target).await,
        Via::Submit => submit::run(args, target).await,
    };
    let elapsed = started.elapsed();
    let cpu_after = system::busy_ticks();
    let peaks = fleet.peaks();
    let served = fleet.served();
    let executions = fleet.executions();
    fleet.stop().await;
    let run = run?;
    let stored_dispatches = target.finished_durable_dispatches().await;
    let mut report = LoadReport::new(args, elapsed, &run.latency, run.outcomes, peaks, served);
    report.executions = executions;
    report.cpu_us_per_dispatch =
        system::cpu_us_per_dispatch(cpu_before, cpu_after, u64::from(args.tasks));
    report.gateway_peak_rss_bytes = target.peak_rss_bytes();
    report.rss_includes_bench = target.shares_process();
    report.load_average_1m = system::load_average();
    report.stored_dispatches = stored_dispatches;
    serde_json::to_string(&report).map_err(|error| Failure::runtime(error.to_string()))
}

/// `--workers-only`: serve as the worker side of a split run until a signal or the deadline.
async fn serve_workers(args: &BenchArgs, target: &Target, seconds: u64) -> Result<String, Failure> {
    let fleet = workers::Fleet::connect(args, target).await?;
    tokio::select! {
        () = crate::cmd::serve::shutdown_signal() => {}
        () = tokio::time::sleep(Duration::from_secs(seconds)) => {}
    }
    let report = report::WorkersReport {
        mode: "workers",
        parameters: args,
        peak_in_flight_per_worker: fleet.peaks(),
        served_per_worker: fleet.served(),
        executions: fleet.executions(),
        datagram_copies: fleet.copies(),
    };
    fleet.stop().await;
    serde_json::to_string(&report).map_err(|error| Failure::runtime(error.to_string()))
}
