//! The bench's workers: SDK workers that echo their input after the service time, each over
//! its own connection, counting how many tasks they hold at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use rustls_pki_types::pem::PemObject;
use switchyard_transport_grpc::{ActivityContext, GrpcWorker, WorkerOptions};
use switchyard_transport_quic::{
    ClientTls, ConnectionConfig, QuicWorker, Redundancy, WORKER_KEEP_ALIVE,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::args::{BenchArgs, BenchTransport};
use super::executions::{ExecutionCounts, Executions};
use super::target::Target;
use super::{ACTIVITY, NAMESPACE};
use crate::cmd::Failure;

/// How long stopped workers get to close their connections.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A worker's wire transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wire {
    /// gRPC to the API port.
    Grpc,
    /// QUIC to the QUIC port.
    Quic,
}

impl Wire {
    /// The wire of the `index`-th worker of a fleet.
    pub(crate) fn nth(transport: BenchTransport, index: u32) -> Self {
        match transport {
            BenchTransport::Grpc => Self::Grpc,
            BenchTransport::Quic => Self::Quic,
            BenchTransport::Mixed if index % 2 == 0 => Self::Grpc,
            BenchTransport::Mixed => Self::Quic,
        }
    }
}

/// Tasks one worker served and the most it held at once.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    served: AtomicU64,
    running: AtomicU32,
    peak: AtomicU32,
}

/// Counts one running task for as long as it lives.
struct Holding<'a>(&'a Counters);

impl<'a> Holding<'a> {
    fn start(counters: &'a Counters) -> Self {
        let now = counters.running.fetch_add(1, Ordering::Relaxed) + 1;
        counters.peak.fetch_max(now, Ordering::Relaxed);
        Self(counters)
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Relaxed);
        self.0.served.fetch_add(1, Ordering::Relaxed);
    }
}

/// The activity body: hold the task for the service time, then echo the input.
async fn serve(counters: Arc<Counters>, service_time: Duration, input: Bytes) -> Bytes {
    let _holding = Holding::start(&counters);
    if !service_time.is_zero() {
        tokio::time::sleep(service_time).await;
    }
    input
}

/// One running worker and how to stop it.
pub(crate) struct Running {
    stop: StopHandle,
    task: JoinHandle<()>,
}

enum StopHandle {
    Grpc(CancellationToken),
    Quic(switchyard_transport_quic::QuicWorkerHandle),
}

impl Running {
    fn stop(&self) {
        match &self.stop {
            StopHandle::Grpc(token) => token.cancel(),
            StopHandle::Quic(handle) => {
                // Draining is always supported over QUIC.
                let _ = handle.drain();
            }
        }
    }
}

/// What a worker registers.
pub(crate) struct Profile<'a> {
    /// Activity type it serves.
    pub(crate) activity: &'a str,
    /// Its capacity.
    pub(crate) capacity: u32,
    /// How long each task takes.
    pub(crate) service_time: Duration,
    /// QUIC workers ask the gateway for this redundancy.
    pub(crate) redundancy: Redundancy,
    /// QUIC workers' link settings (congestion control, fairness and ACK frequency; the
    /// keep-alive is the bench's own).
    pub(crate) link: ConnectionConfig,
    /// Where the handlers record the tasks they run.
    pub(crate) executions: Arc<Executions>,
}

/// Connects and starts one worker.
pub(crate) async fn start(
    target: &Target,
    wire: Wire,
    profile: &Profile<'_>,
    counters: Arc<Counters>,
) -> Result<Running, Failure> {
    let service_time = profile.service_time;
    let executions = Arc::clone(&profile.executions);
    // One set of options for either transport: the same namespaces, capacity, token and
    // handler (which counts its executions for the duplicate figure).
    let mut options = WorkerOptions::default();
    options.namespaces([NAMESPACE]);
    options.max_concurrency = profile.capacity;
    options.token.clone_from(&target.token);
    options.activity(
        profile.activity,
        move |ctx: ActivityContext, input: Bytes| {
            executions
                .record(super::executions::dispatch_of(&input).unwrap_or(ctx.task_id().get()));
            let counters = Arc::clone(&counters);
            async move { Ok(serve(counters, service_time, input).await) }
        },
    );
    match wire {
        Wire::Grpc => {
            // The bench's handler only sleeps (an `.await`) before it answers, so it may run
            // on the reader up to that wait, as the baselines' workers answer in their loops.
            let worker = GrpcWorker::builder(target.endpoint())
                .options(options)
                .inline_handlers(true)
                .tls(target.client_tls())
                .connect()
                .await
                .map_err(|error| Failure::runtime(format!("gRPC worker: {error}")))?;
            let stop = StopHandle::Grpc(worker.shutdown_token());
            let task = tokio::spawn(async move {
                let _ = worker.run().await;
            });
            Ok(Running { stop, task })
        }
        Wire::Quic => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_pki_types::CertificateDer::pem_slice_iter(target.ca_pem.as_bytes()) {
                let cert = cert.map_err(|error| Failure::runtime(format!("CA: {error}")))?;
                roots
                    .add(cert)
                    .map_err(|error| Failure::runtime(format!("CA: {error}")))?;
            }
            let tls = ClientTls::new(roots).map_err(|error| Failure::runtime(error.to_string()))?;
            let worker = QuicWorker::builder(target.quic_addr, &target.server_name)
                .options(options)
                .tls(tls)
                .redundancy(profile.redundancy)
                .connection(ConnectionConfig {
                    keep_alive_interval: Some(WORKER_KEEP_ALIVE),
                    ..profile.link.clone()
                })
                .connect()
                .await
                .map_err(|error| Failure::runtime(format!("QUIC worker: {error}")))?;
            let stop = StopHandle::Quic(worker.handle());
            let task = tokio::spawn(async move {
                let _ = worker.run().await;
            });
            Ok(Running { stop, task })
        }
    }
}

/// Stops workers and waits (bounded) for their connections to close.
pub(crate) async fn stop_all(workers: Vec<Running>) {
    for worker in &workers {
        worker.stop();
    }
    let tasks = workers.into_iter().map(|worker| worker.task);
    let _ = tokio::time::timeout(STOP_GRACE, futures::future::join_all(tasks)).await;
}

/// The load phase's W workers.
pub(crate) struct Fleet {
    workers: Vec<Running>,
    counters: Vec<Arc<Counters>>,
    executions: Arc<Executions>,
}

impl Fleet {
    /// Connects `--workers` workers of `--transport`.
    pub(crate) async fn connect(args: &BenchArgs, target: &Target) -> Result<Self, Failure> {
        let profile = Profile {
            activity: ACTIVITY,
            capacity: args.capacity,
            service_time: Duration::from_micros(args.service_time_us),
            redundancy: args.redundancy.library(),
            link: args.quic_link(),
            executions: Arc::default(),
        };
        let mut fleet = Self {
            workers: Vec::new(),
            counters: Vec::new(),
            executions: Arc::clone(&profile.executions),
        };
        // Like a real worker, one whose connect failed tries again (on a loaded machine a
        // handshake now and then misses the registration deadline).
        let retries = super::idle::Retries::default();
        for index in 0..args.workers {
            let counters = Arc::new(Counters::default());
            let wire = Wire::nth(args.transport, index);
            match super::idle::start_retrying(
                target,
                wire,
                &profile,
                Arc::clone(&counters),
                &retries,
            )
            .await
            {
                Ok(worker) => {
                    fleet.workers.push(worker);
                    fleet.counters.push(counters);
                }
                Err(failure) => {
                    fleet.stop().await;
                    return Err(failure);
                }
            }
        }
        Ok(fleet)
    }

    /// A fleet of none, for a producer whose workers run elsewhere.
    pub(crate) fn empty() -> Self {
        Self {
            workers: Vec::new(),
            counters: Vec::new(),
            executions: Arc::default(),
        }
    }

    /// What the fleet's handlers ran, duplicates included.
    pub(crate) fn executions(&self) -> ExecutionCounts {
        self.executions.counts()
    }

    /// The QUIC workers' datagram copies, summed: `[sent, used, dropped, lane copies dropped]`.
    pub(crate) fn copies(&self) -> [u64; 4] {
        let mut sum = [0; 4];
        for worker in &self.workers {
            if let StopHandle::Quic(handle) = &worker.stop {
                let stats = handle.redundancy_stats();
                for (total, value) in sum.iter_mut().zip([
                    stats.copies_sent,
                    stats.copies_used,
                    stats.copies_dropped,
                    stats.lane_copies_dropped,
                ]) {
                    *total += value;
                }
            }
        }
        sum
    }

    /// The most tasks each worker held at once.
    pub(crate) fn peaks(&self) -> Vec<u32> {
        self.counters
            .iter()
            .map(|c| c.peak.load(Ordering::Relaxed))
            .collect()
    }

    /// Tasks each worker served.
    pub(crate) fn served(&self) -> Vec<u64> {
        self.counters
            .iter()
            .map(|c| c.served.load(Ordering::Relaxed))
            .collect()
    }

    /// Stops every worker.
    pub(crate) async fn stop(self) {
        stop_all(self.workers).await;
    }
}
