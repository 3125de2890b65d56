//! A worker that answers pings but never answers or acknowledges its tasks: once a dispatch
//! it holds has ended and `dispatch.cancel_ack_timeout` has passed, its slot is free again, and
//! every view an operator reads counts the task against the worker: `ListWorkers`,
//! `ExplainPool`, `DescribePool`'s census, `/v1/workers` and `switchyard_tasks_reclaimed_total`.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use switchyard_gateway::ConfigDuration;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_tests::{RawGrpcWorker, TestGateway, counter, http_get, raw_registration, success};
use tokio::sync::mpsc;

const NS: &str = "hung";

fn request(input: &'static [u8], timeout_ms: u64) -> pb::DispatchRequest {
    pb::DispatchRequest {
        namespace: NS.to_owned(),
        activity_type: "work".to_owned(),
        input: Bytes::from_static(input),
        timeout_ms,
        ..pb::DispatchRequest::default()
    }
}

/// What one run saw after the hang: the second dispatch's outcome and the hung task counted
/// against the worker in each view.
#[derive(Debug)]
struct Seen {
    outcome: Option<Outcome>,
    /// `ListWorkers`' `unresponsive_tasks` for the worker.
    listed: u32,
    /// `ExplainPool`'s `unresponsive_tasks` for the worker.
    explained: u32,
    /// `DescribePool`'s `census.unresponsive` (workers with any).
    census: u32,
    /// `/v1/workers`' `unresponsive_tasks` for the worker.
    http: u64,
    /// `switchyard_tasks_reclaimed_total` on `/metrics`, before the first dispatch and at the
    /// end. The recorder is the process's, shared by both tests of this file; only the first
    /// test reclaims a slot, so the counter moves by its doing alone.
    reclaimed: (u64, u64),
}

async fn reclaimed(ops: std::net::SocketAddr) -> u64 {
    counter(ops, "switchyard_tasks_reclaimed_total", "")
        .await
        .expect("/metrics")
}

/// Runs one gateway with `cancel_ack_timeout` and returns what it shows after a dispatch sent
/// once a first one timed out on the hung worker.
async fn second_dispatch_after_a_hang(cancel_ack_timeout: ConfigDuration) -> Seen {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.dispatch.cancel_ack_timeout = cancel_ack_timeout;
    })
    .await;
    let mut worker = RawGrpcWorker::open(&gateway).await.expect("call opens");
    let worker_id = worker.register(raw_registration(NS, "work", 1)).await;
    let (tasks, mut received) = mpsc::channel(16);
    // The worker's loop: answer pings, pass tasks on, ignore cancels; answer only a task whose
    // input is `answer-me`.
    let serving = tokio::spawn(async move {
        while let Ok(Some(frame)) = worker.next_frame().await {
            if let pb::gateway_frame::Frame::Task(task) = frame {
                if task.input.as_ref() == b"answer-me" {
                    worker.send(success(task.task_id, b"served")).await;
                }
                if tasks.send(task).await.is_err() {
                    return;
                }
            }
        }
    });
    let client = gateway.client(None).await;
    let ops = gateway.gateway().ops_addr().expect("an ops listener");
    let reclaimed_before = reclaimed(ops).await;

    let first = client
        .clone()
        .dispatch(request(b"hang", 300))
        .await
        .expect("an OK reply")
        .into_inner();
    assert!(
        matches!(
            first.outcome.and_then(|o| o.outcome),
            Some(Outcome::TimedOut(_))
        ),
        "the hung task times out"
    );
    let hung = tokio::time::timeout(Duration::from_secs(5), received.recv())
        .await
        .expect("the hung task was delivered")
        .expect("the worker runs");
    assert_eq!(hung.input.as_ref(), b"hang");

    let second = client
        .clone()
        .dispatch(request(b"answer-me", 3_000))
        .await
        .expect("an OK reply")
        .into_inner();
    let listed = client
        .clone()
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .expect("listed")
        .into_inner()
        .workers
        .iter()
        .find(|w| w.worker_id == worker_id)
        .expect("the worker is listed")
        .unresponsive_tasks;
    let explained = client
        .clone()
        .explain_pool(pb::ExplainPoolRequest {
            namespace: NS.to_owned(),
            activity_type: "work".to_owned(),
            ..pb::ExplainPoolRequest::default()
        })
        .await
        .expect("explained")
        .into_inner()
        .workers
        .iter()
        .filter_map(|w| w.worker.as_ref())
        .find(|w| w.worker_id == worker_id)
        .expect("the worker is explained")
        .unresponsive_tasks;
    let census = client
        .clone()
        .describe_pool(pb::DescribePoolRequest {
            namespace: NS.to_owned(),
            activity_type: "work".to_owned(),
            ..pb::DescribePoolRequest::default()
        })
        .await
        .expect("described")
        .into_inner()
        .census
        .expect("a census")
        .unresponsive;
    let (status, body) = http_get(ops, "/v1/workers").await.expect("/v1/workers");
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let http = body["workers"]
        .as_array()
        .expect("a list")
        .iter()
        .find(|w| w["worker_id"] == worker_id)
        .and_then(|w| w["unresponsive_tasks"].as_u64())
        .expect("the worker's unresponsive_tasks");
    let reclaimed = (reclaimed_before, reclaimed(ops).await);
    serving.abort();
    Seen {
        outcome: second.outcome.and_then(|o| o.outcome),
        listed,
        explained,
        census,
        http,
        reclaimed,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_handlers_slot_is_reclaimed_after_the_cancel_ack_timeout() {
    let seen = second_dispatch_after_a_hang(ConfigDuration::millis(500)).await;
    assert!(
        matches!(&seen.outcome, Some(Outcome::Completed(done)) if done.output == "served"),
        "the reclaimed slot served the next dispatch: {seen:?}"
    );
    assert_eq!(
        (
            seen.listed,
            seen.explained,
            seen.census,
            seen.http,
            seen.reclaimed
        ),
        (1, 1, 1, 1, (0, 1)),
        "ListWorkers, ExplainPool, the census, /v1/workers and the counter: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_reclaim_in_time_the_next_dispatch_parks_unserved() {
    let seen = second_dispatch_after_a_hang(ConfigDuration::secs(3600)).await;
    assert!(
        matches!(&seen.outcome, Some(Outcome::Unserved(_))),
        "the slot stays held: {seen:?}"
    );
    // The counter is not compared: the other test may have reclaimed its slot meanwhile.
    assert_eq!(
        (seen.listed, seen.explained, seen.census, seen.http),
        (0, 0, 0, 0),
        "{seen:?}"
    );
}
