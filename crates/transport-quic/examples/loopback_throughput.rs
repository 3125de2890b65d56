//! Indicative throughput of the QUIC transport on loopback: a gateway core, W SDK workers of
//! capacity C running an echo handler, and N dispatches straight into core's dispatcher with
//! at most P outstanding. Prints one JSON line. Not a benchmark suite: one run, one machine.
//!
//! ```sh
//! cargo run --release -p switchyard-transport-quic --features self-signed \
//!     --example loopback_throughput -- --workers 4 --capacity 64 --tasks 200000 --outstanding 256
//! ```
//!
//! `--baseline core` replaces the QUIC workers with in-process ones that answer through a
//! channel, to tell core's own cost per dispatch from the transport's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use switchyard_core::{
    ActivityOutcome, ActivityRequest, CallerIdentity, Core, CoreConfig, DeliveryError,
    Registration, RegistrationToken, Registry, TaskResult, TransportName, WorkerDelivery,
    WorkerMessage,
};
use switchyard_transport_quic::{
    ActivityContext, ActivityError, CongestionControl, ConnectionConfig, QuicServer,
    QuicServerConfig, QuicWorker, SelfSigned,
};
use tokio::sync::mpsc;

struct Args {
    workers: usize,
    capacity: u32,
    tasks: u64,
    outstanding: usize,
    payload: usize,
    congestion: CongestionControl,
    baseline: bool,
}

fn args() -> Result<Args, String> {
    let mut parsed = Args {
        workers: 4,
        capacity: 64,
        tasks: 200_000,
        outstanding: 256,
        payload: 64,
        congestion: CongestionControl::Cubic,
        baseline: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |_| format!("{flag}: bad value {value:?}");
        match flag.as_str() {
            "--workers" => parsed.workers = value.parse().map_err(bad)?,
            "--capacity" => parsed.capacity = value.parse().map_err(bad)?,
            "--tasks" => parsed.tasks = value.parse().map_err(bad)?,
            "--outstanding" => parsed.outstanding = value.parse().map_err(bad)?,
            "--payload" => parsed.payload = value.parse().map_err(bad)?,
            "--congestion" => {
                parsed.congestion = match value.as_str() {
                    "cubic" => CongestionControl::Cubic,
                    "bbr" => CongestionControl::Bbr,
                    _ => return Err(format!("--congestion: cubic or bbr, not {value:?}")),
                }
            }
            "--baseline" if value == "core" => parsed.baseline = true,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(parsed)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let link = ConnectionConfig {
        congestion: args.congestion,
        ..ConnectionConfig::default()
    };
    let ca = SelfSigned::new(["localhost"])?;
    let core = Core::start(Registry::builder(), CoreConfig::default());
    let server = QuicServer::builder(core.clone(), ca.server_tls()?)
        .config(QuicServerConfig {
            listen: "127.0.0.1:0".parse()?,
            connection: link.clone(),
            ..QuicServerConfig::default()
        })
        .bind()
        .await?;
    let mut events = core.registry().subscribe_events();
    let mut tokens = Vec::new();
    for i in 0..args.workers {
        if args.baseline {
            tokens.push(channel_worker(&core, i, args.capacity).await?);
            continue;
        }
        let worker = QuicWorker::builder(server.local_addr(), "localhost")
            .namespaces(["bench"])
            .identity(format!("bench-{i}"))
            .activity("echo", |_ctx: ActivityContext, input: Bytes| async move {
                Ok::<_, ActivityError>(input)
            })
            .max_concurrency(args.capacity)
            .connection(link.clone())
            .tls(ca.client_tls()?)
            .connect()
            .await?;
        tokio::spawn(worker.run());
    }
    // Eligible means capacity announced and probation passed.
    let deadline = Instant::now() + Duration::from_secs(30);
    while core
        .registry()
        .pool_census("bench", "", "echo", None)
        .eligible
        < args.workers
    {
        if Instant::now() > deadline {
            return Err("workers never became eligible".into());
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), events.recv()).await;
    }

    let input = Bytes::from(vec![7u8; args.payload]);
    let issued = Arc::new(AtomicU64::new(0));
    let caller = CallerIdentity::trusted("bench");
    let started = Instant::now();
    let mut drivers = Vec::new();
    for _ in 0..args.outstanding {
        let (core, input, issued, caller) = (
            core.clone(),
            input.clone(),
            Arc::clone(&issued),
            caller.clone(),
        );
        let tasks = args.tasks;
        drivers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut failed = 0u64;
            while issued.fetch_add(1, Ordering::Relaxed) < tasks {
                let request = ActivityRequest {
                    namespace: "bench".into(),
                    task_queue: String::new(),
                    activity_type: "echo".into(),
                    node: None,
                    input: input.clone(),
                    activity_id: None,
                    timeout: Duration::from_secs(30),
                };
                let at = Instant::now();
                match core.dispatcher().dispatch(&caller, request).await {
                    Ok(ActivityOutcome::Completed(_)) => latencies.push(at.elapsed()),
                    _ => failed += 1,
                }
            }
            (latencies, failed)
        }));
    }
    let mut latencies = Vec::with_capacity(args.tasks as usize);
    let mut failed = 0;
    for driver in drivers {
        let (mut own, own_failed) = driver.await?;
        latencies.append(&mut own);
        failed += own_failed;
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    let pct = |p: f64| {
        let index = ((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1));
        latencies.get(index).map_or(0, |d| d.as_micros())
    };
    println!(
        "{{\"transport\":\"{}\",\"workers\":{},\"capacity\":{},\"tasks\":{},\"outstanding\":{},\
         \"payload\":{},\"elapsed_s\":{:.3},\"tasks_per_sec\":{:.0},\"p50_us\":{},\"p90_us\":{},\
         \"p99_us\":{},\"max_us\":{},\"failed\":{}}}",
        if args.baseline { "core-only" } else { "quic" },
        args.workers,
        args.capacity,
        args.tasks,
        args.outstanding,
        args.payload,
        elapsed.as_secs_f64(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        pct(0.50),
        pct(0.90),
        pct(0.99),
        latencies.last().map_or(0, |d| d.as_micros()),
        failed
    );
    server.close();
    drop(tokens);
    Ok(())
}

/// An in-process worker answering every task and ping at once through a channel.
struct ChannelWorker(mpsc::Sender<WorkerMessage>);

impl WorkerDelivery for ChannelWorker {
    fn transport(&self) -> TransportName {
        TransportName::from_static("channel")
    }

    fn is_connected(&self) -> bool {
        !self.0.is_closed()
    }

    fn registration_carries_capacity(&self) -> bool {
        true
    }

    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        self.0.try_send(message).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => DeliveryError::Full,
            mpsc::error::TrySendError::Closed(_) => DeliveryError::Closed,
        })
    }
}

async fn channel_worker(
    core: &Core,
    index: usize,
    capacity: u32,
) -> Result<RegistrationToken, Box<dyn std::error::Error>> {
    let (tx, mut rx) = mpsc::channel(capacity as usize + 64);
    let registration = Registration {
        namespaces: ["bench".to_owned()].into(),
        activity_types: ["echo".to_owned()].into(),
        identity: format!("channel-{index}"),
        max_concurrency: Some(capacity),
        ..Registration::default()
    };
    let token = core
        .registry()
        .admit(
            &CallerIdentity::trusted("bench"),
            registration,
            Arc::new(ChannelWorker(tx)),
        )
        .await?;
    let (core, worker) = (core.clone(), token.worker_id());
    tokio::spawn(async move {
        while let Some(message) = rx.recv().await {
            match message {
                WorkerMessage::Task(task) => {
                    let _ = core.complete(worker, task.task_id, TaskResult::Success(task.input));
                }
                WorkerMessage::Ping { seq } => core.record_pong(worker, seq),
                _ => {}
            }
        }
    });
    Ok(token)
}
