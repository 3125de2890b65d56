//! `--scenario tenant-fairness`: tenant B's sequential dispatch rate alone, then while tenant A
//! holds `--parked` dispatches parked in its own namespace (a pool no worker serves), then the
//! gateway's memory once A's dispatches are gone.
//!
//! B dispatches one at a time through the producer API to the bench's workers; A's dispatches
//! go straight into core's dispatcher (in-process gateway only), so the figure isolates what
//! parked work costs another tenant in core rather than what 100,000 API calls cost the host.
//! Bounded: each B phase stops at `--tasks` dispatches (at most 5,000) or 5 s, parking at 120 s.

use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use serde::Serialize;
use switchyard_core::{ActivityRequest, CallerIdentity};
use switchyard_proto::v1 as pb;
use tokio::task::JoinSet;

use super::args::BenchArgs;
use super::target::Target;
use super::{ACTIVITY, NAMESPACE, READY_DEADLINE, system, workers};
use crate::cmd::Failure;

/// Most B dispatches in one phase.
const PHASE_TASKS: u32 = 5_000;
/// Longest B phase.
const PHASE_TIME: Duration = Duration::from_secs(5);
/// Longest wait for A's dispatches to park, or to leave.
const PARK_DEADLINE: Duration = Duration::from_secs(120);
/// Tenant A's namespace; no worker serves it.
const TENANT_A: &str = "tenant-a";
/// How long after A's dispatches are gone the memory is measured again.
const SETTLE: Duration = Duration::from_secs(10);
/// The ratio of loaded to baseline rate the scenario aims for.
const TARGET_RATIO: f64 = 0.8;

/// One phase of tenant B's sequential dispatches.
#[derive(Debug, Serialize)]
struct Phase {
    dispatches: u64,
    elapsed_s: f64,
    per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    /// CPU time of this process (gateway, workers and bench) per B dispatch: less sensitive
    /// to other load on a shared machine than the rate.
    process_cpu_us_per_dispatch: Option<f64>,
}

/// The scenario's JSON object.
#[derive(Debug, Serialize)]
struct FairnessReport<'a> {
    mode: &'static str,
    parameters: &'a BenchArgs,
    parked: u32,
    alone: Phase,
    while_parked: Phase,
    after: Phase,
    ratio: f64,
    target_ratio: f64,
    meets_target: bool,
    rss_before_bytes: Option<u64>,
    rss_parked_bytes: Option<u64>,
    rss_after_cancel_bytes: Option<u64>,
    rss_settled_bytes: Option<u64>,
    rss_includes_bench: bool,
    load_average_1m: Option<f64>,
}

/// Runs the scenario; see the module docs.
pub(crate) async fn run(args: &BenchArgs, target: &Target) -> Result<String, Failure> {
    let core = target.core().cloned().ok_or_else(|| {
        Failure::usage("--scenario tenant-fairness needs the in-process gateway (no --connect)")
    })?;
    let fleet = workers::Fleet::connect(args, target).await?;
    if let Err(failure) = target
        .wait_eligible(ACTIVITY, args.workers, READY_DEADLINE)
        .await
    {
        fleet.stop().await;
        return Err(failure);
    }
    let result = async {
        let mut api = target.api().await?;
        let input = Bytes::from(vec![b'x'; args.payload]);
        let alone = sequential(&mut api, args, &input).await?;
        let rss_before = target.rss_bytes();

        let mut parked = JoinSet::new();
        let caller = CallerIdentity::trusted(TENANT_A);
        for i in 0..args.parked {
            let dispatcher = core.dispatcher().clone();
            let caller = caller.clone();
            let request = ActivityRequest {
                namespace: TENANT_A.to_owned(),
                task_queue: String::new(),
                activity_type: "nobody-serves-this".to_owned(),
                node: None,
                input: input.clone(),
                activity_id: Some(format!("a-{i}")),
                timeout: Duration::from_secs(3600),
            };
            parked.spawn(async move { dispatcher.dispatch(&caller, request).await });
        }
        let waiting = |core: &switchyard_core::Core| -> usize {
            core.dispatcher()
                .unserved_queues()
                .iter()
                .filter(|q| q.address.namespace == TENANT_A)
                .map(|q| q.waiting)
                .sum()
        };
        let started = Instant::now();
        while waiting(&core) < args.parked as usize {
            if started.elapsed() > PARK_DEADLINE || parked.try_join_next().is_some() {
                return Err(Failure::runtime(format!(
                    "only {} of {} tenant-a dispatches parked (a refused one ends at once)",
                    waiting(&core),
                    args.parked
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let rss_parked = target.rss_bytes();
        let while_parked = sequential(&mut api, args, &input).await?;

        parked.abort_all();
        while parked.join_next().await.is_some() {}
        drop(parked);
        let started = Instant::now();
        while waiting(&core) > 0 && started.elapsed() < PARK_DEADLINE {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let rss_after_cancel = target.rss_bytes();
        // jemalloc returns freed pages over its decay time (10 s), as the arena sees activity:
        // wait that long, then run B once more and measure.
        tokio::time::sleep(SETTLE).await;
        let after = sequential(&mut api, args, &input).await?;
        let rss_after = target.rss_bytes();
        let ratio = if alone.per_sec > 0.0 {
            while_parked.per_sec / alone.per_sec
        } else {
            0.0
        };
        let report = FairnessReport {
            mode: "tenant-fairness",
            parameters: args,
            parked: args.parked,
            alone,
            while_parked,
            after,
            ratio,
            target_ratio: TARGET_RATIO,
            meets_target: ratio >= TARGET_RATIO,
            rss_before_bytes: rss_before,
            rss_parked_bytes: rss_parked,
            rss_after_cancel_bytes: rss_after_cancel,
            rss_settled_bytes: rss_after,
            rss_includes_bench: target.shares_process(),
            load_average_1m: system::load_average(),
        };
        serde_json::to_string(&report).map_err(|error| Failure::runtime(error.to_string()))
    }
    .await;
    fleet.stop().await;
    result
}

/// Tenant B's dispatches, one after another, until the phase's count or time runs out.
async fn sequential(
    api: &mut super::target::Api,
    args: &BenchArgs,
    input: &Bytes,
) -> Result<Phase, Failure> {
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
        .map_err(|error| Failure::runtime(format!("histogram: {error}")))?;
    let limit = args.tasks.min(PHASE_TASKS);
    let cpu_before = system::process_ticks();
    let started = Instant::now();
    let mut dispatches = 0u64;
    while dispatches < u64::from(limit) && started.elapsed() < PHASE_TIME {
        let sent = Instant::now();
        let request = pb::DispatchRequest {
            namespace: NAMESPACE.to_owned(),
            activity_type: ACTIVITY.to_owned(),
            input: input.clone(),
            timeout_ms: 30_000,
            ..pb::DispatchRequest::default()
        };
        let reply = tokio::time::timeout(Duration::from_secs(60), api.dispatch(request))
            .await
            .map_err(|_| Failure::runtime("no dispatch reply for 60 s"))?
            .map_err(|status| Failure::status(&status))?;
        if !matches!(
            reply.into_inner().outcome.and_then(|o| o.outcome),
            Some(pb::dispatch_outcome::Outcome::Completed(_))
        ) {
            return Err(Failure::runtime("a tenant-b dispatch did not complete"));
        }
        let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
        let _ = latency.record(micros.clamp(1, 60_000_000));
        dispatches += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(Phase {
        dispatches,
        elapsed_s: elapsed,
        per_sec: if elapsed > 0.0 {
            dispatches as f64 / elapsed
        } else {
            0.0
        },
        p50_us: latency.value_at_quantile(0.5),
        p99_us: latency.value_at_quantile(0.99),
        process_cpu_us_per_dispatch: system::cpu_us_per_dispatch(
            cpu_before,
            system::process_ticks(),
            dispatches,
        ),
    })
}
