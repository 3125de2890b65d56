//! Real workers built with the Rust SDKs of both transports, connected to a [`TestGateway`]
//! over loopback with TLS, whose handlers answer with the name of the transport that ran them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use switchyard_core::WorkerId;
use switchyard_transport_grpc::{
    ActivityContext as GrpcContext, GrpcWorker, GrpcWorkerBuilder, WorkerError as GrpcWorkerError,
};
use switchyard_transport_quic::{
    ActivityContext as QuicContext, QuicWorker, QuicWorkerBuilder, WorkerError,
};
use tokio_util::sync::CancellationToken;

use crate::TestGateway;

/// What every SDK worker of a test is: where it serves, what it runs, how fast.
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    /// Namespaces served.
    pub namespaces: Vec<String>,
    /// Activity type run; its handler answers with the transport name.
    pub activity: String,
    /// Capacity.
    pub capacity: u32,
    /// How long each task takes.
    pub task_time: Duration,
    /// Bearer token of its principal, if any.
    pub token: Option<String>,
}

impl WorkerSpec {
    /// A worker of `namespace` running `activity` instantly, capacity 4, no token.
    pub fn new(namespace: &str, activity: &str) -> Self {
        Self {
            namespaces: vec![namespace.to_owned()],
            activity: activity.to_owned(),
            capacity: 4,
            task_time: Duration::ZERO,
            token: None,
        }
    }
}

/// A running SDK worker: its id, how many tasks it finished, and how to stop it.
#[derive(Debug)]
pub struct RunningWorker {
    /// Its id.
    pub id: WorkerId,
    /// Tasks its handler finished.
    pub served: Arc<AtomicU64>,
    stop: Stop,
    /// The worker's run loop.
    pub task: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
enum Stop {
    Grpc(CancellationToken),
    Quic(switchyard_transport_quic::QuicWorkerHandle),
}

impl RunningWorker {
    /// Tasks finished so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Stops the worker (gRPC: drops its stream; QUIC: asks to be drained).
    pub fn stop(&self) {
        match &self.stop {
            Stop::Grpc(token) => token.cancel(),
            Stop::Quic(handle) => {
                // Draining is always supported over QUIC.
                let _ = handle.drain();
            }
        }
    }
}

async fn handle(label: &'static str, delay: Duration, served: &AtomicU64) -> Bytes {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    served.fetch_add(1, Ordering::Relaxed);
    Bytes::from_static(label.as_bytes())
}

fn grpc_builder(
    gateway: &TestGateway,
    spec: &WorkerSpec,
    served: Arc<AtomicU64>,
) -> GrpcWorkerBuilder {
    let addr = gateway.gateway().addr("grpc").expect("grpc listens");
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(gateway.ca_pem()));
    let delay = spec.task_time;
    let mut builder = GrpcWorker::builder(format!("https://127.0.0.1:{}", addr.port()))
        .namespaces(spec.namespaces.clone())
        .max_concurrency(spec.capacity)
        .tls(tls)
        .activity(spec.activity.clone(), move |_: GrpcContext, _: Bytes| {
            let served = Arc::clone(&served);
            async move { Ok(handle("grpc", delay, &served).await) }
        });
    if let Some(token) = &spec.token {
        builder = builder.token(token.clone());
    }
    builder
}

fn quic_builder(
    gateway: &TestGateway,
    spec: &WorkerSpec,
    served: Arc<AtomicU64>,
) -> QuicWorkerBuilder {
    let addr = gateway.gateway().addr("quic").expect("quic listens");
    let delay = spec.task_time;
    let mut builder = QuicWorker::builder(addr, "localhost")
        .namespaces(spec.namespaces.clone())
        .max_concurrency(spec.capacity)
        .tls(gateway.quic_tls())
        .activity(spec.activity.clone(), move |_: QuicContext, _: Bytes| {
            let served = Arc::clone(&served);
            async move { Ok(handle("quic", delay, &served).await) }
        });
    if let Some(token) = &spec.token {
        builder = builder.token(token.clone());
    }
    builder
}

/// Connects a gRPC SDK worker; the error is the SDK's when registration is refused.
pub async fn grpc_worker(
    gateway: &TestGateway,
    spec: &WorkerSpec,
) -> Result<RunningWorker, GrpcWorkerError> {
    let served = Arc::new(AtomicU64::new(0));
    let worker = grpc_builder(gateway, spec, Arc::clone(&served))
        .connect()
        .await?;
    let id = worker.worker_id();
    let stop = worker.shutdown_token();
    let task = tokio::spawn(async move {
        let _ = worker.run().await;
    });
    Ok(RunningWorker {
        id,
        served,
        stop: Stop::Grpc(stop),
        task,
    })
}

/// Connects a QUIC SDK worker; the error is the SDK's when registration is refused.
pub async fn quic_worker(
    gateway: &TestGateway,
    spec: &WorkerSpec,
) -> Result<RunningWorker, WorkerError> {
    let served = Arc::new(AtomicU64::new(0));
    let worker = quic_builder(gateway, spec, Arc::clone(&served))
        .connect()
        .await?;
    let id = worker.worker_id();
    let handle = worker.handle();
    let task = tokio::spawn(async move {
        let _ = worker.run().await;
    });
    Ok(RunningWorker {
        id,
        served,
        stop: Stop::Quic(handle),
        task,
    })
}

/// Waits (up to 15 s) until `count` workers of the pool can take `activity`.
pub async fn wait_eligible(gateway: &TestGateway, namespace: &str, activity: &str, count: usize) {
    let registry = gateway.gateway().core().registry();
    tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            // Taken before the read, so a change between the read and the await is not missed.
            let arrival = registry.worker_arrival();
            if registry.pool_census(namespace, "", activity, None).eligible >= count {
                return;
            }
            arrival.await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{count} eligible workers expected: {}",
            registry
                .pool_census(namespace, "", activity, None)
                .describe()
                .unwrap_or_default()
        )
    });
}
