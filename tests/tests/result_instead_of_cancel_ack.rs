//! A worker that answers a cancelled task with its result instead of a `cancel_ack` (which
//! `worker.proto` allows) frees its slot the same way and is not counted as a refused result.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use switchyard_core::RefusedCounts;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_tests::{RawGrpcWorker, TestGateway, counter, raw_registration, success};

const NS: &str = "answers";
const PATIENCE: Duration = Duration::from_secs(10);

fn request(activity_id: &str) -> pb::DispatchRequest {
    pb::DispatchRequest {
        namespace: NS.to_owned(),
        activity_type: "work".to_owned(),
        input: Bytes::from_static(b"x"),
        activity_id: activity_id.to_owned(),
        timeout_ms: 30_000,
        ..pb::DispatchRequest::default()
    }
}

async fn next_task(worker: &mut RawGrpcWorker) -> pb::ActivityTask {
    loop {
        match tokio::time::timeout(PATIENCE, worker.next_frame()).await {
            Ok(Ok(Some(pb::gateway_frame::Frame::Task(task)))) => return task,
            Ok(Ok(Some(_))) => {}
            other => panic!("expected a task, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_instead_of_a_cancel_ack_frees_the_slot_and_is_not_refused() {
    let gateway = TestGateway::start(|config| config.quic.enabled = false).await;
    let dispatcher = gateway.gateway().core().dispatcher().clone();
    let mut worker = RawGrpcWorker::open(&gateway).await.expect("call opens");
    worker.register(raw_registration(NS, "work", 1)).await;
    let mut client = gateway.client(None).await;

    let mut producer = client.clone();
    let first = tokio::spawn(async move { producer.dispatch(request("job-1")).await });
    let task = next_task(&mut worker).await;
    client
        .cancel(pb::CancelDispatchRequest {
            namespace: NS.to_owned(),
            activity_id: "job-1".to_owned(),
            ..pb::CancelDispatchRequest::default()
        })
        .await
        .expect("cancelled");
    let first = first.await.expect("joined").expect("OK reply").into_inner();
    assert!(matches!(
        first.outcome.and_then(|o| o.outcome),
        Some(Outcome::Cancelled(_))
    ));
    loop {
        match tokio::time::timeout(PATIENCE, worker.next_frame()).await {
            Ok(Ok(Some(pb::gateway_frame::Frame::Cancel(cancel)))) => {
                assert_eq!(cancel.task_id, task.task_id);
                break;
            }
            Ok(Ok(Some(_))) => {}
            other => panic!("expected the cancel, got {other:?}"),
        }
    }
    // The worker finished anyway and answers with the result, not a cancel_ack.
    worker.send(success(task.task_id, b"finished anyway")).await;

    // Control: the worker's only slot is free again, so the next dispatch reaches it.
    let mut producer = client.clone();
    let second = tokio::spawn(async move { producer.dispatch(request("job-2")).await });
    let next = next_task(&mut worker).await;
    worker.send(success(next.task_id, b"second")).await;
    let second = second
        .await
        .expect("joined")
        .expect("OK reply")
        .into_inner();
    assert!(matches!(
        second.outcome.and_then(|o| o.outcome),
        Some(Outcome::Completed(done)) if done.output == "second"
    ));
    assert_eq!(
        dispatcher.refused(),
        RefusedCounts::default(),
        "a well-behaved worker trips no refusal"
    );
    assert_eq!(dispatcher.results_after_cancel(), 1);
    // And on /metrics (the only test of this file, so the process's recorder counts it alone).
    let ops = gateway.gateway().ops_addr().expect("an ops listener");
    assert_eq!(
        counter(ops, "switchyard_results_after_cancel_total", "")
            .await
            .expect("/metrics"),
        1
    );
}
