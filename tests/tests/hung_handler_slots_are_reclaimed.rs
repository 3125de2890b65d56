//! A worker that answers pings but never answers or acknowledges its tasks: once a dispatch
//! it holds has ended and `dispatch.cancel_ack_timeout` has passed, its slot is free again.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use switchyard_gateway::ConfigDuration;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_tests::{RawGrpcWorker, TestGateway, raw_registration, success};
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

/// Runs one gateway with `cancel_ack_timeout` and returns the outcome of a dispatch sent
/// after a first one timed out on the hung worker, with the worker's unresponsive count.
async fn second_dispatch_after_a_hang(
    cancel_ack_timeout: ConfigDuration,
) -> (Option<Outcome>, u32) {
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
    let workers = client
        .clone()
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .expect("listed")
        .into_inner()
        .workers;
    let unresponsive = workers
        .iter()
        .find(|w| w.worker_id == worker_id)
        .map_or(0, |w| w.unresponsive_tasks);
    serving.abort();
    (second.outcome.and_then(|o| o.outcome), unresponsive)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_handlers_slot_is_reclaimed_after_the_cancel_ack_timeout() {
    let (outcome, unresponsive) = second_dispatch_after_a_hang(ConfigDuration::millis(500)).await;
    assert!(
        matches!(&outcome, Some(Outcome::Completed(done)) if done.output == "served"),
        "the reclaimed slot served the next dispatch: {outcome:?}"
    );
    assert_eq!(unresponsive, 1, "the worker is marked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_reclaim_in_time_the_next_dispatch_parks_unserved() {
    let (outcome, unresponsive) = second_dispatch_after_a_hang(ConfigDuration::secs(3600)).await;
    assert!(
        matches!(&outcome, Some(Outcome::Unserved(_))),
        "the slot stays held: {outcome:?}"
    );
    assert_eq!(unresponsive, 0);
}
