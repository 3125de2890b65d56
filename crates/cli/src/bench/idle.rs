//! `--idle-workers K`: K idle workers, alternating gRPC and QUIC, each on its own connection;
//! the memory they cost the gateway and the time until all K are eligible.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::args::{BenchArgs, BenchTransport};
use super::report::IdleReport;
use super::target::Target;
use super::workers::{self, Counters, Profile, Wire};
use super::{READY_DEADLINE, system};
use crate::cmd::Failure;

/// Activity type the idle workers register (never dispatched).
const IDLE_ACTIVITY: &str = "idle";
/// Connects in progress at once: enough to keep the gateway's accept loops busy without a
/// thundering herd of handshakes timing each other out.
const CONNECTS_AT_ONCE: usize = 64;
/// How long the connect phase may take in all.
const CONNECT_DEADLINE: Duration = Duration::from_secs(300);
/// Connect attempts per idle worker: like a real worker, one whose connect failed tries again;
/// every retry is counted in the report, with the first reason.
const ATTEMPTS: u32 = 3;

/// Retries made during the connect phase, and why the first one was needed.
#[derive(Default)]
pub(super) struct Retries {
    pub(super) count: AtomicU32,
    pub(super) first_reason: Mutex<Option<String>>,
}

/// Connects one worker, trying up to [`ATTEMPTS`] times.
pub(super) async fn start_retrying(
    target: &Target,
    wire: Wire,
    profile: &Profile<'_>,
    counters: Arc<Counters>,
    retries: &Retries,
) -> Result<workers::Running, Failure> {
    let mut attempt = 1;
    loop {
        match workers::start(target, wire, profile, Arc::clone(&counters)).await {
            Err(failure) if attempt < ATTEMPTS => {
                attempt += 1;
                retries.count.fetch_add(1, Ordering::Relaxed);
                retries
                    .first_reason
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get_or_insert(failure.message);
                // Back off a little, as a reconnecting worker would.
                tokio::time::sleep(Duration::from_millis(250) * attempt).await;
            }
            result => return result,
        }
    }
}

/// Connects the idle workers, waits until all are eligible, measures, and disconnects them.
pub(crate) async fn run(args: &BenchArgs, target: &Target, count: u32) -> Result<String, Failure> {
    let rss_before = target.rss_bytes();
    let profile = Profile {
        activity: IDLE_ACTIVITY,
        capacity: 1,
        service_time: Duration::ZERO,
        redundancy: switchyard_transport_quic::Redundancy::Off,
        link: args.quic_link(),
        executions: std::sync::Arc::default(),
    };
    let retries = Retries::default();
    let started = Instant::now();
    let connects = futures::stream::iter(0..count)
        .map(|index| {
            let wire = Wire::nth(BenchTransport::Mixed, index);
            start_retrying(target, wire, &profile, Arc::default(), &retries)
        })
        .buffer_unordered(CONNECTS_AT_ONCE)
        .collect::<Vec<_>>();
    let connected = tokio::time::timeout(CONNECT_DEADLINE, connects)
        .await
        .map_err(|_| Failure::runtime("connecting the idle workers took over 300 s"))?;
    let mut running = Vec::with_capacity(connected.len());
    let mut first_failure = None;
    for result in connected {
        match result {
            Ok(worker) => running.push(worker),
            Err(failure) => {
                first_failure.get_or_insert(failure);
            }
        }
    }
    if let Some(failure) = first_failure {
        let reached = running.len();
        workers::stop_all(running).await;
        return Err(Failure::runtime(format!(
            "{reached} of {count} idle workers connected; first failure: {}",
            failure.message
        )));
    }
    let last_connect = Instant::now();
    let ready = target
        .wait_eligible(IDLE_ACTIVITY, count, READY_DEADLINE)
        .await;
    let eligible_at = Instant::now();
    let rss_connected = target.rss_bytes();
    workers::stop_all(running).await;
    ready?;

    let grpc_workers = count.div_ceil(2);
    let rss_per_worker = match (rss_before, rss_connected) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before) as f64 / f64::from(count)),
        _ => None,
    };
    let report = IdleReport {
        mode: "idle",
        parameters: args,
        idle_workers: count,
        grpc_workers,
        quic_workers: count - grpc_workers,
        time_to_eligible_s: eligible_at.duration_since(started).as_secs_f64(),
        eligible_after_last_connect_s: eligible_at.duration_since(last_connect).as_secs_f64(),
        rss_before_bytes: rss_before,
        rss_connected_bytes: rss_connected,
        rss_per_worker_bytes: rss_per_worker,
        gateway_peak_rss_bytes: target.peak_rss_bytes(),
        rss_includes_bench: target.shares_process(),
        connect_retries: retries.count.load(Ordering::Relaxed),
        first_retry_reason: retries
            .first_reason
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
        load_average_1m: system::load_average(),
    };
    serde_json::to_string(&report).map_err(|error| Failure::runtime(error.to_string()))
}
