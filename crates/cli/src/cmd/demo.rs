//! `switchyard demo`: a gateway, one gRPC worker and one QUIC worker (the Rust SDKs, over
//! real loopback sockets), a few thousand dispatches through the producer API, and a report.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use futures::StreamExt;
use hdrhistogram::Histogram;
use switchyard_gateway::{ConfigDuration, Gateway, LogSection};
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_proto::v1::dispatch_stream_reply::Result as StreamResult;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::Failure;
use super::behaviour::{ActivitySpec, Behaviour, WorkerStats};
use super::client::{ClientArgs, connect};
use super::table::render;
use super::worker::{WorkerSetup, grpc_worker, quic_worker, read_ca};

const NAMESPACE: &str = "demo";
const ACTIVITY: &str = "echo";

/// `switchyard demo`.
#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    /// Dispatches to run.
    #[arg(long, default_value_t = 4000)]
    pub(crate) tasks: u32,
    /// Dispatches the producer keeps in flight at once (default: the two workers' capacity,
    /// so nothing waits for a slot).
    #[arg(long, default_value_t = 16)]
    pub(crate) in_flight: usize,
    /// Capacity of each worker.
    #[arg(long, default_value_t = 8)]
    pub(crate) capacity: u32,
    /// Milliseconds each task takes in the worker.
    #[arg(long, default_value_t = 1)]
    pub(crate) task_ms: u64,
}

/// One worker of the demo and its counters.
struct DemoWorker {
    id: String,
    transport: &'static str,
    stats: Arc<WorkerStats>,
}

pub(crate) async fn demo(args: DemoArgs) -> Result<(), Failure> {
    if args.tasks == 0 || args.in_flight == 0 || args.capacity == 0 {
        return Err(Failure::usage(
            "--tasks, --in-flight and --capacity must be at least 1",
        ));
    }
    let _ = switchyard_gateway::init_logging(&LogSection {
        // The report is the output; parked-at-capacity warnings would only bury it.
        filter: "error".to_owned(),
        ..LogSection::default()
    });
    let data_dir = std::env::temp_dir().join(format!("switchyard-demo-{}", std::process::id()));
    let result = run(&args, &data_dir).await;
    let _ = std::fs::remove_dir_all(&data_dir);
    result
}

async fn run(args: &DemoArgs, data_dir: &std::path::Path) -> Result<(), Failure> {
    let mut config = super::in_process_config(data_dir);
    config.liveness.ping_interval = ConfigDuration::millis(500);
    config.shutdown.drain_timeout = ConfigDuration::secs(5);
    let gateway = Gateway::builder(config)
        .start()
        .await
        .map_err(|error| Failure::runtime(format!("gateway: {error}")))?;
    let outcome = drive(args, &gateway).await;
    gateway.shutdown().await;
    outcome
}

async fn drive(args: &DemoArgs, gateway: &Gateway) -> Result<(), Failure> {
    let grpc_addr = gateway
        .addr("grpc")
        .ok_or_else(|| Failure::runtime("no gRPC listener"))?;
    let quic_addr = gateway
        .addr("quic")
        .ok_or_else(|| Failure::runtime("no QUIC listener"))?;
    let ca_path = gateway
        .tls()
        .dev_ca_path()
        .ok_or_else(|| Failure::runtime("the demo needs development TLS material"))?;
    let ca_pem = read_ca(ca_path)?;
    let endpoint = format!("https://127.0.0.1:{}", grpc_addr.port());
    println!("gateway: API and gRPC workers on {grpc_addr}, QUIC workers on {quic_addr}");

    let namespaces = [NAMESPACE.to_owned()];
    let activities = [ActivitySpec {
        name: ACTIVITY.to_owned(),
        behaviour: Behaviour::Sleep(args.task_ms),
    }];
    let setup = |stats: Arc<WorkerStats>| WorkerSetup {
        namespaces: &namespaces,
        task_queue: "",
        node: None,
        activities: &activities,
        capacity: args.capacity,
        ca_pem: &ca_pem,
        identity: None,
        token: None,
        stats,
    };
    let grpc_stats = Arc::new(WorkerStats::default());
    let grpc = grpc_worker(&endpoint, &setup(Arc::clone(&grpc_stats))).await?;
    let quic_stats = Arc::new(WorkerStats::default());
    let quic = quic_worker(quic_addr, "localhost", &setup(Arc::clone(&quic_stats))).await?;
    let workers = [
        DemoWorker {
            id: grpc.worker_id().to_string(),
            transport: "grpc",
            stats: grpc_stats,
        },
        DemoWorker {
            id: quic.worker_id().to_string(),
            transport: "quic",
            stats: quic_stats,
        },
    ];
    let grpc_stop = grpc.shutdown_token();
    let quic_handle = quic.handle();
    let grpc_task = tokio::spawn(grpc.run());
    let quic_task = tokio::spawn(quic.run());

    wait_until_both_eligible(gateway).await?;
    let client_args = ClientArgs {
        endpoint: endpoint.clone(),
        ca: Some(ca_path.to_owned()),
        token: None,
        data_dir: None,
        cert: None,
        key: None,
    };
    let mut client = connect(&client_args).await?;
    let started = Instant::now();
    let (latency, completed) = dispatch_all(&mut client, args).await?;
    let elapsed = started.elapsed();

    // Draining is always supported over QUIC.
    let _ = quic_handle.drain();
    grpc_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), grpc_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), quic_task).await;

    report(&workers, args, &latency, completed, elapsed);
    if completed == u64::from(args.tasks) {
        Ok(())
    } else {
        Err(Failure::runtime(format!(
            "{} of {} dispatches did not complete",
            u64::from(args.tasks) - completed,
            args.tasks
        )))
    }
}

/// Waits (bounded) until the pool has both workers eligible: registered, probation lifted,
/// and the QUIC worker's capacity announced.
async fn wait_until_both_eligible(gateway: &Gateway) -> Result<(), Failure> {
    let registry = gateway.core().registry();
    let deadline = Instant::now() + Duration::from_secs(15);
    while registry.pool_census(NAMESPACE, "", ACTIVITY, None).eligible < 2 {
        if Instant::now() > deadline {
            let census = registry.pool_census(NAMESPACE, "", ACTIVITY, None);
            return Err(Failure::runtime(format!(
                "workers not eligible after 15 s: {}",
                census.describe().unwrap_or_default()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Runs every dispatch over one `DispatchStream`, keeping `in_flight` outstanding; returns
/// the latency histogram (microseconds) and how many completed.
async fn dispatch_all(
    client: &mut super::client::ApiClient,
    args: &DemoArgs,
) -> Result<(Histogram<u64>, u64), Failure> {
    let (requests, outbound) = mpsc::channel(args.in_flight);
    let mut replies = client
        .dispatch_stream(ReceiverStream::new(outbound))
        .await
        .map_err(|status| Failure::status(&status))?
        .into_inner();
    let mut sent_at: HashMap<u64, Instant> = HashMap::new();
    let mut next: u64 = 0;
    let total = u64::from(args.tasks);
    let send = |id: u64| pb::DispatchStreamRequest {
        correlation_id: id,
        request: Some(pb::DispatchRequest {
            namespace: NAMESPACE.to_owned(),
            activity_type: ACTIVITY.to_owned(),
            input: Bytes::from(id.to_be_bytes().to_vec()),
            timeout_ms: 30_000,
            ..pb::DispatchRequest::default()
        }),
    };
    while next < total && sent_at.len() < args.in_flight {
        sent_at.insert(next, Instant::now());
        requests
            .send(send(next))
            .await
            .map_err(|_| Failure::runtime("stream closed"))?;
        next += 1;
    }
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
        .map_err(|error| Failure::runtime(error.to_string()))?;
    let mut completed = 0;
    let mut answered = 0;
    while answered < total {
        let Some(reply) = replies.next().await else {
            return Err(Failure::runtime("the dispatch stream ended early"));
        };
        let reply = reply.map_err(|status| Failure::status(&status))?;
        answered += 1;
        if let Some(at) = sent_at.remove(&reply.correlation_id) {
            let micros = u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX);
            let _ = latency.record(micros.max(1));
        }
        if let Some(StreamResult::Outcome(pb::DispatchOutcome {
            outcome: Some(Outcome::Completed(_)),
        })) = reply.result
        {
            completed += 1;
        }
        if next < total {
            sent_at.insert(next, Instant::now());
            requests
                .send(send(next))
                .await
                .map_err(|_| Failure::runtime("stream closed"))?;
            next += 1;
        }
    }
    Ok((latency, completed))
}

fn report(
    workers: &[DemoWorker],
    args: &DemoArgs,
    latency: &Histogram<u64>,
    completed: u64,
    elapsed: Duration,
) {
    let rows: Vec<Vec<String>> = workers
        .iter()
        .map(|w| {
            vec![
                w.id.clone(),
                w.transport.to_owned(),
                w.stats.served().to_string(),
                format!("{} / {}", w.stats.peak(), args.capacity),
            ]
        })
        .collect();
    println!();
    print!(
        "{}",
        render(
            &[
                "WORKER",
                "TRANSPORT",
                "TASKS SERVED",
                "PEAK IN-FLIGHT / CAPACITY"
            ],
            &rows
        )
    );
    let ms = |quantile: f64| latency.value_at_quantile(quantile) as f64 / 1000.0;
    println!();
    println!(
        "{completed} of {} dispatches completed in {:.2} s ({:.0}/s), {} in flight at a time, \
         {} ms per task",
        args.tasks,
        elapsed.as_secs_f64(),
        completed as f64 / elapsed.as_secs_f64().max(f64::EPSILON),
        args.in_flight,
        args.task_ms
    );
    println!(
        "dispatch latency: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        ms(0.5),
        ms(0.9),
        ms(0.99),
        latency.max() as f64 / 1000.0
    );
}
