//! The refusal statuses `gateway.proto` states for `Dispatch`, each checked over a real socket
//! with its sentence: INVALID_ARGUMENT naming the field (empty, too long), ALREADY_EXISTS for an
//! activity id in flight; and the accepted dispatch next to them as the control.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use switchyard_core::{CallerIdentity, WorkerMessage};
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_tests::{ScriptedTransport, TestGateway, registration};
use tonic::Code;

const PATIENCE: Duration = Duration::from_secs(10);

fn request(activity_id: &str) -> pb::DispatchRequest {
    pb::DispatchRequest {
        namespace: "statuses".to_owned(),
        activity_type: "echo".to_owned(),
        input: Bytes::from_static(b"x"),
        activity_id: activity_id.to_owned(),
        timeout_ms: 30_000,
        ..pb::DispatchRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_stated_dispatch_refusal_has_its_status_and_names_its_rule() {
    let scripted = ScriptedTransport::default();
    let gateway = TestGateway::start_with(
        |config| config.quic.enabled = false,
        |builder| builder.transport(scripted.clone()),
    )
    .await;
    let mut worker = scripted
        .connect(
            &CallerIdentity::trusted("test"),
            registration(&["statuses"], &["echo"], Some(1)),
            true,
        )
        .await
        .expect("admitted");
    let mut client = gateway.client(None).await;

    let empty = client
        .dispatch(pb::DispatchRequest {
            namespace: String::new(),
            ..request("")
        })
        .await
        .expect_err("refused");
    assert_eq!(empty.code(), Code::InvalidArgument);
    assert!(empty.message().contains("namespace"), "{}", empty.message());
    let long = client
        .dispatch(pb::DispatchRequest {
            activity_type: "a".repeat(256),
            ..request("")
        })
        .await
        .expect_err("refused");
    assert_eq!(long.code(), Code::InvalidArgument);
    assert!(
        long.message().contains("activity_type") && long.message().contains("255"),
        "{}",
        long.message()
    );

    // Control: a valid dispatch with an activity id is accepted and held by the worker.
    let mut producer = client.clone();
    let held = tokio::spawn(async move { producer.dispatch(request("job-1")).await });
    let task = tokio::time::timeout(PATIENCE, async {
        loop {
            match worker.next().await {
                Some(WorkerMessage::Task(task)) => return task,
                Some(WorkerMessage::Ping { seq }) => worker.pong(seq),
                Some(_) => {}
                None => panic!("disconnected"),
            }
        }
    })
    .await
    .expect("the worker holds the task");
    let duplicate = client
        .dispatch(request("job-1"))
        .await
        .expect_err("refused while the first is in flight");
    assert_eq!(duplicate.code(), Code::AlreadyExists);
    assert!(
        duplicate.message().contains("job-1"),
        "{}",
        duplicate.message()
    );

    worker.complete(task.task_id, Bytes::from_static(b"done"));
    let reply = held.await.expect("joined").expect("OK reply").into_inner();
    assert!(matches!(
        reply.outcome.and_then(|o| o.outcome),
        Some(Outcome::Completed(_))
    ));
}
