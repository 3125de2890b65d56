//! Every way `worker.proto` says a registered stream ends, checked over a real socket: a drain
//! delivers its `drain` frame and then ends cleanly; a shutdown says "come back later" and ends
//! UNAVAILABLE; the shutdown cancel reaches a busy worker before the end; an oversized frame is
//! RESOURCE_EXHAUSTED and a malformed one INVALID_ARGUMENT; a cancel at a drain deadline says
//! so; an identity over 255 bytes is refused.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use switchyard_core::{ActivityOutcome, CancelReason, DisconnectReason, MAX_NAME_BYTES, WorkerId};
use switchyard_proto::v1::{
    ActivityResult, CancelAck, RegisterWorker, activity_result, cancel_activity, drain_request,
    gateway_frame, worker_frame,
};
use switchyard_transport_grpc::GrpcServerConfig;
use tonic::Code;

use crate::support;
use crate::support::{
    Gateway, RawBytesStream, RawStream, TRUSTED_TOKEN, dispatch, frame, open, register, request,
};

async fn worker(gateway: &Gateway) -> (RawStream, WorkerId) {
    let mut client = gateway.raw_client().await;
    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    let id = stream.register(register(&["ns"], &["work"], Some(2))).await;
    stream.until_eligible(&gateway.core, id).await;
    (stream, id)
}

fn drain_reason(
    frame: Result<Option<gateway_frame::Frame>, tonic::Status>,
) -> drain_request::Reason {
    match frame {
        Ok(Some(gateway_frame::Frame::Drain(drain))) => drain.reason(),
        other => panic!("expected a drain frame, got {other:?}"),
    }
}

#[tokio::test]
async fn an_idle_drain_delivers_the_drain_frame_then_ends_the_stream_cleanly() {
    let gateway = Gateway::start().await;
    let mut events = gateway.core.registry().subscribe_events();
    let (mut stream, id) = worker(&gateway).await;
    assert!(gateway.core.registry().drain_worker(id));
    assert_eq!(
        drain_reason(stream.next_non_ping().await),
        drain_request::Reason::Requested
    );
    // The worker never half-closes: the gateway ends the stream of a drained worker that holds
    // nothing, after the drain frame, with OK.
    assert!(matches!(stream.next_non_ping().await, Ok(None)));
    assert_eq!(
        support::disconnected(&mut events, id).await,
        DisconnectReason::Drained
    );
}

#[tokio::test]
async fn a_shutdown_tells_an_idle_worker_to_come_back_and_ends_unavailable() {
    let gateway = Gateway::start().await;
    let (mut stream, _) = worker(&gateway).await;
    let core = gateway.core.clone();
    let shutdown = tokio::spawn(async move { core.shutdown(Duration::from_secs(5)).await });
    assert_eq!(
        drain_reason(stream.next_non_ping().await),
        drain_request::Reason::ShuttingDown
    );
    let status = stream.closing_status().await;
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.message(),
        "the gateway is shutting down; reconnect later"
    );
    support::within("the shutdown", shutdown).await.unwrap();
}

#[tokio::test]
async fn the_shutdown_cancel_reaches_a_busy_worker_every_time() {
    for round in 0..20 {
        let gateway = Gateway::start().await;
        let (mut stream, _) = worker(&gateway).await;
        let outcome = dispatch(&gateway.core, request("ns", "work", b"slow"));
        let task = match stream.next_non_ping().await {
            Ok(Some(gateway_frame::Frame::Task(task))) => task,
            other => panic!("round {round}: expected a task, got {other:?}"),
        };
        let core = gateway.core.clone();
        let shutdown = tokio::spawn(async move { core.shutdown(Duration::from_millis(50)).await });
        assert_eq!(
            drain_reason(stream.next_non_ping().await),
            drain_request::Reason::ShuttingDown,
            "round {round}"
        );
        match stream.next_non_ping().await {
            Ok(Some(gateway_frame::Frame::Cancel(cancel))) => {
                assert_eq!(cancel.task_id, task.task_id, "round {round}");
                assert_eq!(
                    cancel.reason(),
                    cancel_activity::Reason::ShuttingDown,
                    "round {round}"
                );
            }
            other => panic!("round {round}: expected the shutdown cancel, got {other:?}"),
        }
        stream
            .send(frame(worker_frame::Frame::CancelAck(CancelAck {
                task_id: task.task_id,
            })))
            .await;
        let status = stream.closing_status().await;
        assert_eq!(status.code(), Code::Unavailable, "round {round}");
        assert_eq!(
            outcome.await.unwrap(),
            ActivityOutcome::ShuttingDown,
            "round {round}"
        );
        support::within("the shutdown", shutdown).await.unwrap();
    }
}

#[tokio::test]
async fn a_cancel_at_a_drain_deadline_names_the_drain_deadline() {
    let gateway = Gateway::start().await;
    let (mut stream, id) = worker(&gateway).await;
    let outcome = dispatch(&gateway.core, request("ns", "work", b"slow"));
    let task = match stream.next_non_ping().await {
        Ok(Some(gateway_frame::Frame::Task(task))) => task,
        other => panic!("expected a task, got {other:?}"),
    };
    assert!(gateway.core.registry().drain_worker(id));
    assert_eq!(
        drain_reason(stream.next_non_ping().await),
        drain_request::Reason::Requested
    );
    let cancelled = gateway
        .core
        .dispatcher()
        .cancel_held_by(id, CancelReason::DrainDeadline);
    assert_eq!(cancelled, 1);
    match stream.next_non_ping().await {
        Ok(Some(gateway_frame::Frame::Cancel(cancel))) => {
            assert_eq!(cancel.task_id, task.task_id);
            assert_eq!(cancel.reason(), cancel_activity::Reason::DrainDeadline);
        }
        other => panic!("expected the deadline cancel, got {other:?}"),
    }
    assert_eq!(outcome.await.unwrap(), ActivityOutcome::Cancelled);
    // Control: the drained worker still holds the task until it acknowledges, then it is let go.
    assert!(gateway.core.registry().is_registered(id));
    stream
        .send(frame(worker_frame::Frame::CancelAck(CancelAck {
            task_id: task.task_id,
        })))
        .await;
    assert!(matches!(stream.next_non_ping().await, Ok(None)));
}

#[tokio::test]
async fn an_oversized_frame_ends_the_stream_resource_exhausted_naming_the_limit() {
    let limit = 64 * 1024;
    let gateway = Gateway::builder()
        .config(GrpcServerConfig {
            max_message_bytes: limit,
            ..GrpcServerConfig::default()
        })
        .start()
        .await;
    let mut stream = RawBytesStream::open(&gateway).await;
    let ack = stream
        .register_ack(register(&["ns"], &["work"], Some(1)))
        .await;
    // The acknowledgement states the limits the stream is held to.
    assert_eq!(ack.max_worker_frame_bytes, u32::try_from(limit).unwrap());
    assert_eq!(ack.max_gateway_frame_bytes, u32::try_from(limit).unwrap());
    let id = WorkerId::from_raw(ack.worker_id);
    let result = |len: usize| {
        frame(worker_frame::Frame::Result(ActivityResult {
            task_id: 1,
            outcome: Some(activity_result::Outcome::Output(Bytes::from(vec![0; len]))),
        }))
    };
    // Control: a frame just under the limit is only a refused result; the stream stays open.
    stream.send(result(limit - 64)).await;
    stream.send(result(limit + 1)).await;
    let status = stream.closing_status().await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().starts_with("frame too large: "),
        "{status:?}"
    );
    assert!(status.message().contains(&limit.to_string()), "{status:?}");
    assert_eq!(gateway.core.dispatcher().refused().unknown, 1);
    assert!(!gateway.core.registry().is_registered(id));
}

#[tokio::test]
async fn a_malformed_frame_ends_the_stream_invalid_argument() {
    let gateway = Gateway::start().await;
    let mut stream = RawBytesStream::open(&gateway).await;
    let id = stream.register(register(&["ns"], &["work"], Some(1))).await;
    // A truncated varint tag: not a protobuf message at all.
    stream
        .send_raw(Bytes::from_static(&[0xFF, 0xFF, 0xFF]))
        .await;
    let status = stream.closing_status().await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with("malformed frame: "),
        "{status:?}"
    );
    assert!(!gateway.core.registry().is_registered(id));
}

#[tokio::test]
async fn an_identity_over_255_bytes_is_refused_invalid_argument() {
    let gateway = Gateway::start().await;
    let registration = |identity: String| {
        frame(worker_frame::Frame::Register(RegisterWorker {
            namespaces: vec!["ns".into()],
            activity_types: vec!["work".into()],
            identity,
            max_concurrency: Some(1),
            ..RegisterWorker::default()
        }))
    };
    let mut client = gateway.raw_client().await;
    // Control: exactly at the limit registers.
    let mut at_limit = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    at_limit
        .register(registration("i".repeat(MAX_NAME_BYTES)))
        .await;
    let mut over = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    over.send(registration("i".repeat(MAX_NAME_BYTES + 1)))
        .await;
    let status = over.closing_status().await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("identity"), "{status:?}");
    assert!(status.message().contains("255"), "{status:?}");
}
