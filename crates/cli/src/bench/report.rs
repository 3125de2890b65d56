//! The JSON objects `switchyard bench` prints.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::args::BenchArgs;
use super::executions::ExecutionCounts;

/// The result of a load run.
#[derive(Debug, Serialize)]
pub(crate) struct LoadReport<'a> {
    /// Always `"load"`.
    pub(crate) mode: &'static str,
    /// The flags it ran with.
    pub(crate) parameters: &'a BenchArgs,
    /// Wall time of the measured phase (first send to last outcome).
    pub(crate) elapsed_s: f64,
    /// Dispatches ended per second over `elapsed_s`.
    pub(crate) tasks_per_sec: f64,
    /// Latency percentiles, send to outcome, in microseconds.
    pub(crate) p50_us: u64,
    /// 90th percentile.
    pub(crate) p90_us: u64,
    /// 99th percentile.
    pub(crate) p99_us: u64,
    /// 99.9th percentile.
    pub(crate) p999_us: u64,
    /// Slowest dispatch.
    pub(crate) max_us: u64,
    /// The most tasks each worker held at once, counted inside the worker's handler.
    pub(crate) peak_in_flight_per_worker: Vec<u32>,
    /// Tasks each worker ran.
    pub(crate) served_per_worker: Vec<u64>,
    /// Handler runs, and runs of a task that had already run, counted inside the handlers.
    #[serde(flatten)]
    pub(crate) executions: ExecutionCounts,
    /// Dispatches by outcome label (`completed`, `failed`, ..., `refused`).
    pub(crate) outcomes: BTreeMap<&'static str, u64>,
    /// Peak resident memory of the gateway's process, in bytes (null when unknown).
    pub(crate) gateway_peak_rss_bytes: Option<u64>,
    /// True when that process also holds the workers and the load generator.
    pub(crate) rss_includes_bench: bool,
    /// Whole-machine busy CPU time over the measured phase divided by the dispatches.
    pub(crate) cpu_us_per_dispatch: Option<f64>,
    /// One-minute load average when the run ended (the machine may be shared).
    pub(crate) load_average_1m: Option<f64>,
    /// Finished durable dispatches the gateway's store lists for the bench's namespace after
    /// the run, counted up to 1,000 (0 for an ephemeral run; null when the listing failed).
    pub(crate) stored_dispatches: Option<u64>,
}

impl<'a> LoadReport<'a> {
    /// Builds the report from a run's measurements.
    pub(crate) fn new(
        parameters: &'a BenchArgs,
        elapsed: Duration,
        latency: &Histogram<u64>,
        outcomes: BTreeMap<&'static str, u64>,
        peak_in_flight_per_worker: Vec<u32>,
        served_per_worker: Vec<u64>,
    ) -> Self {
        let ended: u64 = outcomes.values().sum();
        let seconds = elapsed.as_secs_f64();
        Self {
            mode: "load",
            parameters,
            elapsed_s: seconds,
            tasks_per_sec: ended as f64 / seconds.max(f64::EPSILON),
            p50_us: latency.value_at_quantile(0.5),
            p90_us: latency.value_at_quantile(0.9),
            p99_us: latency.value_at_quantile(0.99),
            p999_us: latency.value_at_quantile(0.999),
            max_us: latency.max(),
            peak_in_flight_per_worker,
            served_per_worker,
            executions: ExecutionCounts::default(),
            outcomes,
            gateway_peak_rss_bytes: None,
            rss_includes_bench: false,
            cpu_us_per_dispatch: None,
            load_average_1m: None,
            stored_dispatches: None,
        }
    }
}

/// The result of an idle-workers run.
#[derive(Debug, Serialize)]
pub(crate) struct IdleReport<'a> {
    /// Always `"idle"`.
    pub(crate) mode: &'static str,
    /// The flags it ran with.
    pub(crate) parameters: &'a BenchArgs,
    /// Workers connected (alternating gRPC and QUIC).
    pub(crate) idle_workers: u32,
    /// Of those, over gRPC.
    pub(crate) grpc_workers: u32,
    /// Of those, over QUIC.
    pub(crate) quic_workers: u32,
    /// From the first connect until every worker was eligible.
    pub(crate) time_to_eligible_s: f64,
    /// From the last worker's connect returning until every worker was eligible.
    pub(crate) eligible_after_last_connect_s: f64,
    /// Resident memory of the gateway's process before the workers connected, in bytes.
    pub(crate) rss_before_bytes: Option<u64>,
    /// Resident memory with every worker connected and eligible, in bytes.
    pub(crate) rss_connected_bytes: Option<u64>,
    /// `(rss_connected - rss_before) / idle_workers`, in bytes.
    pub(crate) rss_per_worker_bytes: Option<f64>,
    /// Peak resident memory of the gateway's process, in bytes.
    pub(crate) gateway_peak_rss_bytes: Option<u64>,
    /// True when that process also holds the workers (so the figures are upper bounds).
    pub(crate) rss_includes_bench: bool,
    /// Connects that failed and were tried again (each worker gets three attempts).
    pub(crate) connect_retries: u32,
    /// Why the first retried connect failed.
    pub(crate) first_retry_reason: Option<String>,
    /// One-minute load average when the run ended.
    pub(crate) load_average_1m: Option<f64>,
}

/// The counters of a `--workers-only` run.
#[derive(Debug, Serialize)]
pub(crate) struct WorkersReport<'a> {
    /// Always `"workers"`.
    pub(crate) mode: &'static str,
    /// The flags it ran with.
    pub(crate) parameters: &'a BenchArgs,
    /// The most tasks each worker held at once.
    pub(crate) peak_in_flight_per_worker: Vec<u32>,
    /// Tasks each worker ran.
    pub(crate) served_per_worker: Vec<u64>,
    /// Handler runs, and runs of a task that had already run, counted inside the handlers.
    #[serde(flatten)]
    pub(crate) executions: ExecutionCounts,
    /// The QUIC workers' datagram copies: sent (results), used (tasks that arrived first by
    /// datagram), dropped (task copies second or unroutable), lane copies dropped.
    pub(crate) datagram_copies: [u64; 4],
}
