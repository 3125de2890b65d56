//! Tasks over raw generated clients (no SDK): the wire contract alone serves tasks; results a
//! worker does not hold are refused without closing its stream; a stream reset mid-task sends
//! the task to another worker.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use switchyard_core::{ActivityOutcome, DisconnectReason, RefusedCounts, WorkerEvent};
use switchyard_proto::v1::{ActivityResult, Failure, activity_result, gateway_frame, worker_frame};
use tonic::Code;

use crate::support;
use crate::support::{
    Gateway, RawStream, TRUSTED_TOKEN, dispatch, frame, open, register, request, success,
};

async fn worker(gateway: &Gateway, activities: &[&str]) -> (RawStream, switchyard_core::WorkerId) {
    let mut client = gateway.raw_client().await;
    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    let id = stream
        .register(register(&["ns"], activities, Some(4)))
        .await;
    stream.until_eligible(&gateway.core, id).await;
    (stream, id)
}

async fn next_task(stream: &mut RawStream) -> switchyard_proto::v1::ActivityTask {
    match stream.next_non_ping().await {
        Ok(Some(gateway_frame::Frame::Task(task))) => task,
        other => panic!("expected a task, got {other:?}"),
    }
}

#[tokio::test]
async fn raw_generated_client_serves_tasks_from_the_wire_contract() {
    let gateway = Gateway::start().await;
    let (mut stream, _) = worker(&gateway, &["echo"]).await;

    let outcome = dispatch(&gateway.core, request("ns", "echo", b"hello"));
    let task = next_task(&mut stream).await;
    assert_eq!(task.namespace, "ns");
    assert_eq!(task.task_queue, "default");
    assert_eq!(task.activity_type, "echo");
    assert_eq!(task.input, Bytes::from_static(b"hello"));
    assert_eq!(task.attempt, 1);
    let now_ms = u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    assert!(task.deadline_unix_ms > now_ms, "deadline is in the future");
    stream.send(success(task.task_id, b"olleh")).await;
    assert_eq!(
        outcome.await.unwrap(),
        ActivityOutcome::Completed(Bytes::from_static(b"olleh"))
    );

    let outcome = dispatch(&gateway.core, request("ns", "echo", b"again"));
    let task = next_task(&mut stream).await;
    stream
        .send(frame(worker_frame::Frame::Result(ActivityResult {
            task_id: task.task_id,
            outcome: Some(activity_result::Outcome::Failure(Failure {
                message: "disk full".into(),
                retryable: true,
            })),
        })))
        .await;
    assert_eq!(
        outcome.await.unwrap(),
        ActivityOutcome::Failed {
            message: "disk full".into(),
            retryable: true
        }
    );
}

#[tokio::test]
async fn results_for_unknown_or_foreign_tasks_are_refused_and_the_stream_stays_open() {
    let gateway = Gateway::start().await;
    // Distinct activity types make the task placement deterministic.
    let (mut holder, _) = worker(&gateway, &["hold"]).await;
    let (mut thief, thief_id) = worker(&gateway, &["other"]).await;

    let held = dispatch(&gateway.core, request("ns", "hold", b""));
    let task = next_task(&mut holder).await;
    thief.send(success(task.task_id, b"stolen")).await;
    thief.send(success(987_654, b"invented")).await;

    // Frames of one stream are handled in order: the thief's own task completing proves its
    // stream survived both refusals and that they were processed.
    let own = dispatch(&gateway.core, request("ns", "other", b""));
    let own_task = next_task(&mut thief).await;
    thief.send(success(own_task.task_id, b"mine")).await;
    assert_eq!(
        own.await.unwrap(),
        ActivityOutcome::Completed(Bytes::from_static(b"mine"))
    );
    assert_eq!(
        gateway.core.dispatcher().refused(),
        RefusedCounts {
            unknown: 1,
            foreign: 1,
            late: 0
        }
    );
    assert!(gateway.core.registry().is_registered(thief_id));

    holder.send(success(task.task_id, b"real")).await;
    assert_eq!(
        held.await.unwrap(),
        ActivityOutcome::Completed(Bytes::from_static(b"real"))
    );
}

#[tokio::test]
async fn a_result_without_outcome_closes_the_stream() {
    let gateway = Gateway::start().await;
    let (mut stream, _) = worker(&gateway, &["echo"]).await;
    stream
        .send(frame(worker_frame::Frame::Result(ActivityResult {
            task_id: 5,
            outcome: None,
        })))
        .await;
    let status = stream.closing_status().await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "result for task 5 carries neither output nor failure"
    );
}

#[tokio::test]
async fn a_stream_reset_mid_task_sends_the_task_to_another_worker() {
    let gateway = Gateway::start().await;
    let mut events = gateway.core.registry().subscribe_events();
    let (mut a, a_id) = worker(&gateway, &["work"]).await;
    let (mut b, b_id) = worker(&gateway, &["work"]).await;

    let outcome = dispatch(&gateway.core, request("ns", "work", b"job"));
    let (holder, holder_id, mut survivor, first) = tokio::select! {
        task = next_task(&mut a) => (a, a_id, b, task),
        task = next_task(&mut b) => (b, b_id, a, task),
    };
    assert_eq!(first.attempt, 1);
    // Reset: dropping both halves of an unfinished call cancels its HTTP/2 stream; the
    // connection itself stays up.
    let RawStream { send, recv, .. } = holder;
    drop(recv);
    drop(send);

    let again = next_task(&mut survivor).await;
    assert_eq!(again.input, Bytes::from_static(b"job"));
    assert_eq!(again.attempt, 2);
    assert_ne!(again.task_id, first.task_id);
    survivor.send(success(again.task_id, b"done")).await;
    assert_eq!(
        outcome.await.unwrap(),
        ActivityOutcome::Completed(Bytes::from_static(b"done"))
    );

    assert_eq!(
        support::disconnected(&mut events, holder_id).await,
        DisconnectReason::Disconnect
    );
    let mut later = 0;
    while let Ok(event) = events.try_recv() {
        if matches!(event, WorkerEvent::Disconnected { worker, .. } if worker == holder_id) {
            later += 1;
        }
    }
    assert_eq!(later, 0, "the worker is deregistered exactly once");
    assert!(!gateway.core.registry().is_registered(holder_id));
}

#[tokio::test]
async fn a_worker_core_lets_go_has_its_stream_closed_with_unavailable() {
    let gateway = Gateway::start().await;
    let (mut stream, id) = worker(&gateway, &["echo"]).await;
    assert!(
        gateway
            .core
            .registry()
            .deregister(id, DisconnectReason::Timeout)
    );
    let status = stream.closing_status().await;
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.message(),
        format!("worker {id} was deregistered: timeout")
    );
}
