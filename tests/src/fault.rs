//! Workers and links the fault-injection tests break on purpose: SDK workers of either
//! transport whose handler counts how many tasks run at once ([`Gauge`]) and can be killed
//! without a goodbye. The loopback relays that freeze a link come from
//! `switchyard-test-support` (re-exported by this crate).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use switchyard_core::WorkerId;
use switchyard_transport_grpc::{ActivityContext as GrpcContext, GrpcWorker};
use switchyard_transport_quic::{ActivityContext as QuicContext, QuicWorker};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::TestGateway;

/// Counts a worker's handlers: how many run now, the most that ever ran at once, how many
/// finished. Shared by every handler of one worker.
#[derive(Debug, Default)]
pub struct Gauge {
    running: AtomicU32,
    peak: AtomicU32,
    finished: AtomicU64,
    started: Notify,
}

impl Gauge {
    /// The most handlers that ran at once.
    pub fn peak(&self) -> u32 {
        self.peak.load(Ordering::SeqCst)
    }

    /// Handlers running now.
    pub fn running(&self) -> u32 {
        self.running.load(Ordering::SeqCst)
    }

    /// Handlers that returned.
    pub fn finished(&self) -> u64 {
        self.finished.load(Ordering::SeqCst)
    }

    /// Waits (up to `limit`) until at least `count` handlers run at once.
    pub async fn wait_running(&self, count: u32, limit: Duration) -> bool {
        tokio::time::timeout(limit, async {
            loop {
                let started = self.started.notified();
                if self.running() >= count {
                    return;
                }
                started.await;
            }
        })
        .await
        .is_ok()
    }

    async fn run(&self, input: Bytes, work: &Work) -> Bytes {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.started.notify_waiters();
        match work {
            Work::For(time) if !time.is_zero() => tokio::time::sleep(*time).await,
            Work::For(_) => tokio::task::yield_now().await,
            Work::Until(release) => release.cancelled().await,
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        self.finished.fetch_add(1, Ordering::SeqCst);
        input
    }
}

/// What a fault worker's handler does with each task before echoing its input.
#[derive(Clone, Debug)]
pub enum Work {
    /// Takes this long.
    For(Duration),
    /// Holds the task until the token is cancelled.
    Until(CancellationToken),
}

/// How a fault worker is built.
#[derive(Clone, Debug)]
pub struct FaultSpec {
    /// Namespace served.
    pub namespace: String,
    /// Activity type run (echoes its input).
    pub activity: String,
    /// Advertised capacity.
    pub capacity: u32,
    /// What each task does.
    pub work: Work,
}

/// A running fault worker.
#[derive(Debug)]
pub struct FaultWorker {
    /// Its id.
    pub id: WorkerId,
    /// Its handlers' counts.
    pub gauge: Arc<Gauge>,
    run: JoinHandle<()>,
}

impl FaultWorker {
    /// Kills the worker as a crashed process would: its run loop is aborted and the
    /// connection dropped with it, without a drain or any goodbye frame.
    pub fn kill(&self) {
        self.run.abort();
    }
}

impl Drop for FaultWorker {
    fn drop(&mut self) {
        self.run.abort();
    }
}

/// Connects a gRPC SDK fault worker to `addr` (the gateway's gRPC port or a relay in front).
pub async fn grpc_fault_worker(
    gateway: &TestGateway,
    addr: SocketAddr,
    spec: &FaultSpec,
) -> FaultWorker {
    let gauge = Arc::new(Gauge::default());
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(gateway.ca_pem()));
    let (handler_gauge, work) = (Arc::clone(&gauge), spec.work.clone());
    let worker = GrpcWorker::builder(format!("https://127.0.0.1:{}", addr.port()))
        .namespaces(vec![spec.namespace.clone()])
        .max_concurrency(spec.capacity)
        .tls(tls)
        .activity(
            spec.activity.clone(),
            move |_: GrpcContext, input: Bytes| {
                let (gauge, work) = (Arc::clone(&handler_gauge), work.clone());
                async move { Ok(gauge.run(input, &work).await) }
            },
        )
        .connect()
        .await
        .expect("gRPC fault worker registers");
    let id = worker.worker_id();
    let run = tokio::spawn(async move {
        let _ = worker.run().await;
    });
    FaultWorker { id, gauge, run }
}

/// Connects a QUIC SDK fault worker to `addr` (the gateway's QUIC port or a relay in front).
pub async fn quic_fault_worker(
    gateway: &TestGateway,
    addr: SocketAddr,
    spec: &FaultSpec,
) -> FaultWorker {
    let gauge = Arc::new(Gauge::default());
    let (handler_gauge, work) = (Arc::clone(&gauge), spec.work.clone());
    let worker = QuicWorker::builder(addr, "localhost")
        .namespaces(vec![spec.namespace.clone()])
        .max_concurrency(spec.capacity)
        .tls(gateway.quic_tls())
        .activity(
            spec.activity.clone(),
            move |_: QuicContext, input: Bytes| {
                let (gauge, work) = (Arc::clone(&handler_gauge), work.clone());
                async move { Ok(gauge.run(input, &work).await) }
            },
        )
        .connect()
        .await
        .expect("QUIC fault worker registers");
    let id = worker.worker_id();
    let run = tokio::spawn(async move {
        let _ = worker.run().await;
    });
    FaultWorker { id, gauge, run }
}

/// A small deterministic generator (xorshift64*) so a fault schedule replays from its seed.
#[derive(Clone, Debug)]
pub struct Seeded(u64);

impl Seeded {
    /// Starts from `seed` (zero is replaced, xorshift cannot leave it).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next value below `bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % bound
    }
}

/// Whether the long variants run (`SWITCHYARD_LONG_TESTS=1`).
pub fn long_tests() -> bool {
    std::env::var("SWITCHYARD_LONG_TESTS").is_ok_and(|v| v == "1")
}
