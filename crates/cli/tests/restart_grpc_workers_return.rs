//! A restarted gateway gets its gRPC workers back by themselves: `switchyard serve` (a config
//! file, loopback, a temporary data directory) with a `switchyard worker --transport grpc`
//! process and an SDK worker in this process; after SIGTERM, and after `kill -9`, a new gateway
//! on the same port and data directory has both registered again and serving within 5 s of
//! being ready. The real binary, loopback only.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "durable_support/harness.rs"]
mod harness;

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use harness::{PATIENCE, Process, Site, switchyard};
use switchyard_proto::v1 as pb;
use switchyard_transport_grpc::{ActivityContext, ActivityError, Backoff, GrpcWorker};
use tokio::time::Instant;

/// How soon after the new gateway is ready both workers must be back and serving.
const BACK_WITHIN: Duration = Duration::from_secs(5);
const CLI_ACTIVITY: &str = "cli-echo";
const SDK_ACTIVITY: &str = "sdk-echo";

async fn echo(_: ActivityContext, input: Bytes) -> Result<Bytes, ActivityError> {
    Ok(input)
}

fn unix_ms(at: SystemTime) -> u64 {
    u64::try_from(at.duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// Polls until a worker for each activity is registered (connected at or after `since`) and
/// one dispatch to each completes, or `deadline` passes.
async fn both_serving(site: &Site, since: SystemTime, deadline: Instant) -> Vec<u64> {
    let since = unix_ms(since);
    loop {
        assert!(
            Instant::now() < deadline,
            "the workers were not back and serving in time"
        );
        if let Some(ids) = try_both_serving(site, since).await {
            return ids;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn try_both_serving(site: &Site, since: u64) -> Option<Vec<u64>> {
    let mut client = site.producer().await?.0;
    let workers = client
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .ok()?
        .into_inner()
        .workers;
    let mut ids = Vec::new();
    for activity in [CLI_ACTIVITY, SDK_ACTIVITY] {
        let worker = workers.iter().find(|w| {
            w.activity_types.iter().any(|a| a == activity) && w.connected_since_unix_ms >= since
        })?;
        ids.push(worker.worker_id);
    }
    for activity in [CLI_ACTIVITY, SDK_ACTIVITY] {
        let reply = client
            .dispatch(pb::DispatchRequest {
                namespace: "default".into(),
                activity_type: activity.into(),
                input: Bytes::from_static(b"ping"),
                timeout_ms: 2_000,
                ..pb::DispatchRequest::default()
            })
            .await
            .ok()?
            .into_inner();
        let completed = matches!(
            reply.outcome.and_then(|o| o.outcome),
            Some(pb::dispatch_outcome::Outcome::Completed(done)) if done.output == Bytes::from_static(b"ping")
        );
        if !completed {
            return None;
        }
    }
    Some(ids)
}

/// The fleet of the scenario: a CLI worker process and an SDK worker task.
struct Fleet {
    cli: Process,
    sdk: tokio::task::JoinHandle<Result<(), switchyard_transport_grpc::WorkerError>>,
    sdk_stop: tokio_util::sync::CancellationToken,
}

async fn fleet(site: &Site) -> Fleet {
    let mut cli = Process::spawn(
        Command::new(switchyard())
            .args(["worker", "--transport", "grpc"])
            .arg("--activity")
            .arg(format!("{CLI_ACTIVITY}=echo"))
            .arg("--endpoint")
            .arg(format!("https://127.0.0.1:{}", site.port))
            .arg("--data-dir")
            .arg(&site.data_dir)
            .env_remove("SWITCHYARD_TOKEN")
            .env_remove("RUST_LOG"),
    );
    cli.line_containing("connected over grpc").await;
    let worker = GrpcWorker::builder(format!("https://localhost:{}", site.port))
        .namespaces(["default"])
        .activity(SDK_ACTIVITY, echo)
        .tls(site.client_tls())
        .backoff(Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(1),
        })
        .connect()
        .await
        .expect("the SDK worker registers");
    let sdk_stop = worker.shutdown_token();
    let sdk = tokio::spawn(worker.run());
    Fleet { cli, sdk, sdk_stop }
}

/// Runs the scenario, ending the first gateway with `end` (SIGTERM or SIGKILL).
async fn restart_and_expect_the_fleet_back(end: &str) {
    let site = Site::new();
    let mut first = site.serve().await;
    let mut fleet = fleet(&site).await;
    both_serving(&site, UNIX_EPOCH, Instant::now() + PATIENCE).await;

    first.signal(end);
    let status = first.exit().await;
    if end == "TERM" {
        assert!(
            status.success(),
            "the gateway stops cleanly on SIGTERM: {status:?}"
        );
    }
    // Control: nothing is registered anywhere between the two gateways.
    assert!(site.producer().await.is_none(), "the old gateway is gone");
    assert!(!fleet.sdk.is_finished(), "the SDK worker keeps trying");
    assert!(
        fleet.cli.running(),
        "the CLI worker keeps trying; stderr: {}",
        fleet.cli.stderr()
    );

    let restarted_at = SystemTime::now();
    let _second = site.serve().await;
    let ready = Instant::now();
    let ids = both_serving(&site, restarted_at, ready + BACK_WITHIN).await;
    assert_eq!(ids.len(), 2);

    assert!(
        fleet.cli.stderr().contains("lost the gateway"),
        "the CLI says it lost the gateway; stderr: {}",
        fleet.cli.stderr()
    );
    assert!(
        fleet.cli.stderr().contains("reconnecting"),
        "the CLI says it is reconnecting"
    );
    // Ctrl-C (SIGINT) is the worker's own final stop: exit 0.
    fleet.cli.signal("INT");
    let cli = fleet.cli.exit().await;
    assert!(cli.success(), "the CLI worker exits 0 on Ctrl-C: {cli:?}");
    fleet.sdk_stop.cancel();
    tokio::time::timeout(PATIENCE, &mut fleet.sdk)
        .await
        .expect("the SDK worker stops")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigterm_and_a_restart_grpc_workers_return_and_serve() {
    restart_and_expect_the_fleet_back("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_and_a_restart_grpc_workers_return_and_serve() {
    restart_and_expect_the_fleet_back("KILL").await;
}
