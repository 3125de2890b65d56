//! `switchyard bench --cluster N`: the load run against N `switchyard serve` nodes joined over
//! NATS, each its own process, beside one lone node for comparison.
//!
//! Three phases, each the same load run (`--workers`, `--capacity`, `--tasks`, ...) through the
//! producer API of one node:
//! - `single`: a node without `[cluster]`, its workers connected to it;
//! - `local`: node 1 of the cluster with the workers connected to it (the local path, which
//!   must cost what a lone node costs and send nothing to NATS);
//! - `cross`: the producer on node 1, the workers spread over nodes 2..N (every dispatch is
//!   forwarded over NATS); it starts once node 1 holds no worker of the `local` phase (a
//!   gRPC worker stopped without a drain stays registered, suspended, for the reconnect grace).
//!
//! Each phase reports the JSON of a load run plus the NATS messages it caused, read from the
//! NATS server's `/varz` before and after. Every process is killed when the run ends, fails or
//! is interrupted (SIGINT/SIGTERM); each wait is bounded.

mod cpu;
mod nodes;
mod varz;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use switchyard_proto::v1 as pb;

use super::args::{BenchArgs, Via};
use super::report::LoadReport;
use super::target::Target;
use super::{ACTIVITY, READY_DEADLINE, drive, system, workers};
use crate::cmd::Failure;
use nodes::{Nats, Node, NodeSpec, Scratch};
use varz::Traffic;

/// Most single dispatches a phase sends before it measures, to bring the path up (the worker
/// nodes' offer subscriptions); each waits up to [`WARM_UP_TIMEOUT`].
const WARM_UP_TRIES: u32 = 10;
/// The deadline of one warm-up dispatch.
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long NATS must take in nothing before a phase is measured.
const SETTLE_QUIET: Duration = Duration::from_millis(300);
/// Longest wait for that quiet; past it the phase is measured anyway.
const SETTLE_DEADLINE: Duration = Duration::from_secs(5);

/// One phase of a cluster run.
#[derive(Debug, Serialize)]
struct PhaseReport<'a> {
    /// The node the producer dispatched through.
    producer_node: String,
    /// The nodes the workers connected to, one per worker.
    worker_nodes: Vec<String>,
    /// Workers registered on the producer's node as the measured run started, suspended
    /// ones included: the phase's own workers there, and none in `cross`.
    producer_node_workers: u32,
    /// The load run's figures, as `switchyard bench` prints them.
    #[serde(flatten)]
    load: LoadReport<'a>,
    /// NATS traffic during the measured phase.
    #[serde(flatten)]
    traffic: Option<Traffic>,
    /// CPU microseconds per dispatch of each process the phase used: `bench` (producer and
    /// workers), the nodes by name, and `nats-server` when this run started it.
    cpu_us_per_dispatch_by_process: BTreeMap<String, f64>,
}

/// The result of `switchyard bench --cluster N`.
#[derive(Debug, Serialize)]
struct ClusterReport<'a> {
    /// Always `"cluster"`.
    mode: &'static str,
    /// Nodes in the cluster.
    nodes: u32,
    /// The NATS server's version (from `/varz`), when its monitor is known.
    nats_version: Option<String>,
    /// Worker threads of each node's runtime (`--node-worker-threads` resolved on this
    /// machine); `null` when the nodes inherited the bench's environment.
    node_worker_threads: Option<u16>,
    /// A lone node (no `[cluster]`), workers on it.
    single: PhaseReport<'a>,
    /// Node 1 of the cluster, workers on it.
    local: PhaseReport<'a>,
    /// Producer on node 1, workers on nodes 2..N.
    cross: PhaseReport<'a>,
}

/// Runs the cluster bench; the processes it started are gone when this returns.
pub(crate) async fn run(args: &BenchArgs, nodes: u32) -> Result<String, Failure> {
    let scratch = Scratch::create()?;
    let result = tokio::select! {
        result = measure(args, nodes, &scratch) => result,
        () = crate::cmd::serve::shutdown_signal() => {
            Err(Failure::runtime("interrupted; the nodes and nats-server are stopped"))
        }
    };
    drop(scratch);
    result
}

/// Starts NATS and the nodes, runs the three phases, and prints nothing.
async fn measure(args: &BenchArgs, count: u32, scratch: &Scratch) -> Result<String, Failure> {
    let nats = Nats::start(args, scratch)?;
    let cluster = format!("bench-{}", std::process::id());
    let lone = Node::start(
        args,
        scratch,
        &NodeSpec {
            name: "single",
            cluster: None,
        },
    )
    .await?;
    let mut members = Vec::new();
    for index in 1..=count {
        let name = format!("n{index}");
        let spec = NodeSpec {
            name: &name,
            cluster: Some((&nats.url, &cluster)),
        };
        members.push(Node::start(args, scratch, &spec).await?);
    }
    let (first, others) = members
        .split_first()
        .ok_or_else(|| Failure::usage("--cluster needs at least 2 nodes"))?;
    let nats_version = match nats.monitor {
        Some(monitor) => Some(varz::read(monitor).await?.version),
        None => None,
    };
    let single = phase(args, &nats, &lone, &[&lone]).await?;
    let local = phase(args, &nats, first, &[first]).await?;
    let cross = phase(args, &nats, first, &others.iter().collect::<Vec<_>>()).await?;
    let report = ClusterReport {
        mode: "cluster",
        nodes: count,
        nats_version,
        node_worker_threads: nodes::node_worker_threads(args),
        single,
        local,
        cross,
    };
    serde_json::to_string(&report).map_err(|error| Failure::runtime(error.to_string()))
}

/// One measured load run: `--workers` spread over `worker_nodes`, the producer on `producer`.
async fn phase<'a>(
    args: &'a BenchArgs,
    nats: &Nats,
    producer: &Node,
    worker_nodes: &[&Node],
) -> Result<PhaseReport<'a>, Failure> {
    let placement = place(args.workers, worker_nodes.len());
    let mut fleets = Vec::new();
    for (node, &workers) in worker_nodes.iter().copied().zip(&placement) {
        if workers == 0 {
            continue;
        }
        let share = BenchArgs {
            workers,
            ..args.clone()
        };
        let fleet = workers::Fleet::connect(&share, &node.target).await;
        match fleet {
            Ok(fleet) => fleets.push((node, workers, fleet)),
            Err(failure) => {
                stop(fleets).await;
                return Err(failure);
            }
        }
    }
    let measured = async {
        for (node, workers, _) in &fleets {
            // Each node describes only its own workers.
            node.target
                .wait_eligible(ACTIVITY, *workers, READY_DEADLINE)
                .await?;
        }
        if !worker_nodes.iter().any(|node| node.name == producer.name) {
            // An earlier phase's workers on the producer's node are stopped without a drain
            // (gRPC has none) and keep their sessions for the reconnect grace: until they are
            // gone, every dispatch there would also queue for them and count them.
            producer
                .target
                .wait_no_workers(&producer.name, ACTIVITY, READY_DEADLINE)
                .await?;
        }
        warm_up(&producer.target).await?;
        settle(nats).await?;
        let producer_node_workers =
            Target::node_workers(&mut producer.target.api().await?, &producer.name, ACTIVITY)
                .await?;
        let served_before = served(&fleets);
        let traffic_before = counters(nats).await?;
        let processes = processes(nats, producer, worker_nodes);
        let split_before = cpu::Reading::take(&processes);
        let cpu_before = system::busy_ticks();
        let started = Instant::now();
        let run = match args.via {
            Via::Unary => drive::unary(args, &producer.target).await?,
            _ => drive::stream(args, &producer.target).await?,
        };
        let elapsed = started.elapsed();
        let cpu_after = system::busy_ticks();
        let split_after = cpu::Reading::take(&processes);
        let traffic_after = counters(nats).await?;
        let served_after = served(&fleets);
        let served: Vec<u64> = served_after
            .iter()
            .zip(&served_before)
            .map(|(after, before)| after.saturating_sub(*before))
            .collect();
        let peaks = fleets
            .iter()
            .flat_map(|(_, _, fleet)| fleet.peaks())
            .collect();
        let mut load = LoadReport::new(args, elapsed, &run.latency, run.outcomes, peaks, served);
        load.cpu_us_per_dispatch =
            system::cpu_us_per_dispatch(cpu_before, cpu_after, u64::from(args.tasks));
        load.gateway_peak_rss_bytes = producer.target.peak_rss_bytes();
        load.load_average_1m = system::load_average();
        let traffic = traffic_before
            .zip(traffic_after)
            .map(|(before, after)| Traffic::between(before, after, u64::from(args.tasks)));
        Ok::<_, Failure>(PhaseReport {
            producer_node: producer.name.clone(),
            worker_nodes: worker_nodes
                .iter()
                .zip(&placement)
                .flat_map(|(node, &workers)| (0..workers).map(|_| node.name.clone()))
                .collect(),
            producer_node_workers,
            load,
            traffic,
            cpu_us_per_dispatch_by_process: split_before
                .per_dispatch(&split_after, u64::from(args.tasks)),
        })
    }
    .await;
    stop(fleets).await;
    measured
}

/// The processes a phase runs in, by name: this one, the nodes it uses, nats-server.
fn processes(nats: &Nats, producer: &Node, worker_nodes: &[&Node]) -> Vec<(String, u32)> {
    let mut processes = vec![("bench".to_owned(), std::process::id())];
    for node in std::iter::once(producer).chain(worker_nodes.iter().copied()) {
        if !processes.iter().any(|(name, _)| *name == node.name) {
            processes.push((node.name.clone(), node.pid));
        }
    }
    if let Some(pid) = nats.pid {
        processes.push(("nats-server".to_owned(), pid));
    }
    processes
}

/// How many of `workers` connect to each of `nodes` nodes (the first take one more).
fn place(workers: u32, nodes: usize) -> Vec<u32> {
    let nodes_u32 = u32::try_from(nodes).unwrap_or(u32::MAX).max(1);
    (0..nodes_u32)
        .map(|index| workers / nodes_u32 + u32::from(index < workers % nodes_u32))
        .collect()
}

/// Tasks each worker of the phase has served so far.
fn served(fleets: &[(&Node, u32, workers::Fleet)]) -> Vec<u64> {
    fleets
        .iter()
        .flat_map(|(_, _, fleet)| fleet.served())
        .collect()
}

async fn stop(fleets: Vec<(&Node, u32, workers::Fleet)>) {
    for (_, _, fleet) in fleets {
        fleet.stop().await;
    }
}

/// The NATS counters now, when the server's monitor is known.
async fn counters(nats: &Nats) -> Result<Option<varz::Counters>, Failure> {
    match nats.monitor {
        Some(monitor) => Ok(Some(varz::read(monitor).await?.counters)),
        None => Ok(None),
    }
}

/// Waits (up to [`SETTLE_DEADLINE`]) until NATS has taken in no message for
/// [`SETTLE_QUIET`], so the announcements the nodes make when workers connect (a pool's free
/// slots rising from zero, checked every 50 ms) are not counted as the phase's traffic. The
/// server is another process with no event to wait on, so this reads `/varz` at that pace.
async fn settle(nats: &Nats) -> Result<(), Failure> {
    let Some(monitor) = nats.monitor else {
        return Ok(());
    };
    let started = Instant::now();
    let mut last = varz::read(monitor).await?.counters.in_msgs;
    while started.elapsed() < SETTLE_DEADLINE {
        tokio::time::sleep(SETTLE_QUIET).await;
        let now = varz::read(monitor).await?.counters.in_msgs;
        if now == last {
            return Ok(());
        }
        last = now;
    }
    Ok(())
}

/// Sends single dispatches through `producer` until one completes, so the measured phase does
/// not start while the worker nodes' offer subscriptions are still coming up.
async fn warm_up(producer: &Target) -> Result<(), Failure> {
    let mut api = producer.api().await?;
    let mut last = "none sent";
    for _ in 0..WARM_UP_TRIES {
        let request = drive::wire_request(
            &bytes::Bytes::from_static(b"warm-up"),
            WARM_UP_TIMEOUT,
            false,
        );
        let outcome = api
            .dispatch(request)
            .await
            .map_err(|status| Failure::status(&status))?
            .into_inner()
            .outcome;
        last = drive::wire_label(outcome.as_ref());
        if matches!(
            outcome.and_then(|outcome| outcome.outcome),
            Some(pb::dispatch_outcome::Outcome::Completed(_))
        ) {
            return Ok(());
        }
    }
    Err(Failure::runtime(format!(
        "no warm-up dispatch completed in {WARM_UP_TRIES} tries (the last ended {last})"
    )))
}

#[cfg(test)]
pub(super) mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    /// `switchyard bench` flags as parsed.
    pub(crate) fn args(flags: &[&str]) -> BenchArgs {
        let argv = std::iter::once("bench").chain(flags.iter().copied());
        match Cli::try_parse_from(argv) {
            Ok(cli) => cli.args,
            Err(error) => panic!("{error}"),
        }
    }

    #[test]
    fn workers_spread_over_the_worker_nodes_and_add_up() {
        assert_eq!(place(4, 2), [2, 2]);
        assert_eq!(place(5, 2), [3, 2]);
        assert_eq!(place(1, 3), [1, 0, 0]);
        // Control: one node takes every worker.
        assert_eq!(place(4, 1), [4]);
    }

    #[test]
    fn cluster_refuses_a_node_count_out_of_range_and_flags_it_does_not_use() {
        assert!(args(&["--cluster", "3"]).validate().is_ok());
        for refused in [
            &["--cluster", "1"][..],
            &["--cluster", "9"],
            &["--cluster", "2", "--durable"],
            &["--cluster", "2", "--via", "core"],
            &["--cluster", "2", "--idle-workers", "10"],
        ] {
            let failure = args(refused).validate().err();
            assert!(
                failure
                    .as_ref()
                    .is_some_and(|f| f.code == crate::cmd::EXIT_USAGE),
                "{refused:?}: {failure:?}"
            );
        }
        // Control: the same flags without --cluster are accepted.
        assert!(args(&["--idle-workers", "10"]).validate().is_ok());
    }

    #[test]
    fn node_worker_threads_must_be_1_to_64() {
        let threads = |n: &str| args(&["--cluster", "3", "--node-worker-threads", n]).validate();
        for refused in ["0", "65"] {
            let failure = threads(refused).err().map(|f| f.message);
            assert_eq!(
                failure.as_deref(),
                Some(format!("--node-worker-threads {refused}: must be 1..=64").as_str())
            );
        }
        // Control: the ends of the range are accepted.
        assert!(threads("1").is_ok() && threads("64").is_ok());
    }

    #[test]
    fn a_node_s_share_is_the_cores_over_the_nodes_and_the_bench_at_least_one() {
        use crate::bench::args::NodeThreads;
        assert_eq!(NodeThreads::Share.resolve(2, 3), Some(1));
        assert_eq!(NodeThreads::Share.resolve(16, 3), Some(4));
        assert_eq!(NodeThreads::Share.resolve(9, 2), Some(3));
        assert_eq!(NodeThreads::Share.resolve(1000, 2), Some(64), "capped");
        // Controls: a count is taken as given, `inherit` sets nothing.
        assert_eq!(NodeThreads::Count(2).resolve(2, 3), Some(2));
        assert_eq!(NodeThreads::Inherit.resolve(16, 3), None);
        assert_eq!("share".parse(), Ok(NodeThreads::Share));
        assert_eq!("inherit".parse(), Ok(NodeThreads::Inherit));
        assert_eq!("3".parse(), Ok(NodeThreads::Count(3)));
        assert!("many".parse::<NodeThreads>().is_err());
    }
}
