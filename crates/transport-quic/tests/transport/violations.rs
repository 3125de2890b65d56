//! Frames no well-behaved worker sends close the connection with their documented code.

use std::time::Duration;

use switchyard_auth::AllowAll;
use switchyard_core::ActivityOutcome;
use switchyard_core::WorkerEvent;
use switchyard_proto::v1::{
    QuicCancelAck, QuicCapabilities, QuicDrainRequest, QuicResult, quic_control_up, quic_lane_up,
    quic_result,
};
use switchyard_transport_quic::{ErrorCode, FrameLimits, QuicServerConfig};

use crate::support::{Gateway, Raw, event, eventually, register_frame};

/// A raw worker registered for `work` whose announced `capacity` the gateway has taken.
async fn with_capacity(gateway: &Gateway, capacity: u32) -> (Raw, switchyard_core::WorkerId) {
    let mut events = gateway.registry().subscribe_events();
    let mut raw = Raw::connect(gateway).await;
    let registered = raw.register(register_frame(&["work"])).await;
    raw.announce(capacity).await;
    let worker = switchyard_core::WorkerId::from_raw(registered.worker_id);
    event(
        &mut events,
        "capacity announced",
        |e| matches!(e, WorkerEvent::CapacityAnnounced { worker: w, .. } if *w == worker),
    )
    .await;
    (raw, worker)
}

/// A raw worker registered with capacity 1, its probation passed; returns its first lane.
async fn registered(gateway: &Gateway) -> (Raw, crate::support::RawLane) {
    let (mut raw, _) = with_capacity(gateway, 1).await;
    // Dispatch once so the test holds lane 0's write side.
    let dispatch = gateway.dispatch("work", b"x");
    let answer = async {
        let (lane, task) = raw.next_task().await;
        lane.send(quic_lane_up::Frame::Result(QuicResult {
            task_id: task.task_id,
            outcome: Some(quic_result::Outcome::Output("ok".into())),
        }))
        .await;
        lane
    };
    let (_, lane) = tokio::join!(dispatch, answer);
    (raw, lane)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_control_frame_closes_with_frame_too_large_before_registering() {
    let gateway = Gateway::start().await;
    let mut raw = Raw::connect(&gateway).await;
    // Only the prefix is sent: the gateway must refuse it without waiting for the body.
    raw.send_control_bytes(&(1u32 << 20).to_be_bytes()).await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::FrameTooLarge);
    assert_eq!(
        reason,
        "control stream: frame of 1048576 bytes exceeds the limit of 65536 bytes"
    );
    assert!(gateway.registry().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_lane_frame_closes_with_frame_too_large() {
    let config = QuicServerConfig {
        frames: FrameLimits {
            lane: 1024,
            ..FrameLimits::default()
        },
        ..QuicServerConfig::default()
    };
    let gateway = Gateway::with(config, AllowAll).await;
    let (raw, lane) = registered(&gateway).await;
    lane.send_bytes(&1025u32.to_be_bytes()).await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::FrameTooLarge);
    assert_eq!(
        reason,
        format!(
            "lane {}: frame of 1025 bytes exceeds the limit of 1024 bytes",
            lane.index
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_control_frame_closes_with_malformed_frame() {
    let gateway = Gateway::start().await;
    let mut raw = Raw::connect(&gateway).await;
    // Field 1 with wire type 7, which does not exist.
    raw.send_control_bytes(&[0, 0, 0, 2, 0x0f, 0x01]).await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::MalformedFrame);
    assert!(
        reason.starts_with("control stream: frame body does not decode"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_lane_envelope_closes_with_malformed_frame() {
    let gateway = Gateway::start().await;
    let (raw, lane) = registered(&gateway).await;
    lane.send_bytes(&[0, 0, 0, 0]).await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::MalformedFrame);
    assert!(
        reason.ends_with("frame envelope carries no message"),
        "{reason}"
    );
}

/// A variant this gateway does not know (a field number no envelope has) decodes as an unknown
/// field, so the envelope carries no variant: malformed, as the spec says, not ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_envelope_with_an_unknown_variant_closes_with_malformed_frame() {
    let gateway = Gateway::start().await;
    let (raw, lane) = registered(&gateway).await;
    // Field 99, varint 1: tag (99 << 3) = 792 = 0x98 0x06.
    lane.send_bytes(&[0, 0, 0, 3, 0x98, 0x06, 0x01]).await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::MalformedFrame);
    assert!(
        reason.ends_with("frame envelope carries no message"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_for_an_unknown_task_closes_with_unknown_task() {
    let gateway = Gateway::start().await;
    let (raw, lane) = registered(&gateway).await;
    lane.send(quic_lane_up::Frame::Result(QuicResult {
        task_id: 999_999,
        outcome: Some(quic_result::Outcome::Output("forged".into())),
    }))
    .await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::UnknownTask);
    assert_eq!(
        reason,
        format!("result: lane {} holds no task, not task 999999", lane.index)
    );
    assert_eq!(
        gateway.core.dispatcher().refused().unknown,
        0,
        "refused at the lane, before core"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_ack_without_a_cancel_is_a_protocol_violation() {
    let gateway = std::sync::Arc::new(Gateway::start().await);
    let (mut raw, _) = registered(&gateway).await;
    let dispatch = tokio::spawn({
        let gateway = std::sync::Arc::clone(&gateway);
        async move { gateway.dispatch("work", b"x").await }
    });
    let (lane, task) = raw.next_task().await;
    lane.send(quic_lane_up::Frame::CancelAck(QuicCancelAck {
        task_id: task.task_id,
    }))
    .await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::ProtocolViolation);
    assert_eq!(
        reason,
        format!("cancel_ack: task {} was not cancelled", task.task_id)
    );
    // With its only worker gone the dispatch waits for another; it is not needed further.
    dispatch.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_ack_never_cancelled_is_a_protocol_violation_even_on_another_lane() {
    let gateway = std::sync::Arc::new(Gateway::start().await);
    let (mut raw, _) = with_capacity(&gateway, 2).await;
    let dispatches: Vec<_> = (0..2)
        .map(|_| {
            let gateway = std::sync::Arc::clone(&gateway);
            tokio::spawn(async move { gateway.dispatch("work", b"x").await })
        })
        .collect();
    let (first_lane, first) = raw.next_task().await;
    let (second_lane, _) = raw.next_task().await;
    assert_ne!(first_lane.index, second_lane.index);
    // Two rules apply (wrong lane, never cancelled): the one about the task wins.
    second_lane
        .send(quic_lane_up::Frame::CancelAck(QuicCancelAck {
            task_id: first.task_id,
        }))
        .await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::ProtocolViolation, "{reason}");
    assert_eq!(
        reason,
        format!("cancel_ack: task {} was not cancelled", first.task_id)
    );
    for dispatch in dispatches {
        dispatch.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_twice_is_a_protocol_violation() {
    let gateway = Gateway::start().await;
    let (mut raw, _) = registered(&gateway).await;
    raw.send_control(quic_control_up::Frame::Register(register_frame(&["work"])))
        .await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::ProtocolViolation);
    assert_eq!(reason, "register sent twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_on_an_admitted_connection_is_a_protocol_violation() {
    let gateway = Gateway::start().await;
    let (mut raw, _) = registered(&gateway).await;
    raw.send_control(quic_control_up::Frame::Resume(
        switchyard_proto::v1::QuicResume {
            protocol_version: 1,
            session_id: 1,
            ..switchyard_proto::v1::QuicResume::default()
        },
    ))
    .await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::ProtocolViolation);
    assert_eq!(reason, "resume after the connection was admitted");
}

/// One connection carries one worker: besides `register` twice on the control stream (above),
/// the worker has no credit for a second stream on which to register another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_worker_cannot_open_a_second_stream() {
    let gateway = Gateway::start().await;
    let (raw, _) = registered(&gateway).await;
    // With credit, opening a stream is local and immediate; without, it waits for credit the
    // gateway never grants.
    let second = tokio::time::timeout(Duration::from_millis(300), raw.conn.open_bi()).await;
    assert!(second.is_err(), "a second stream was opened");
    assert_eq!(gateway.registry().len(), 1);
    // Control: a new connection opens its one stream at once.
    let fresh = Raw::connect(&gateway).await;
    drop(fresh);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_before_registration_are_a_protocol_violation_and_register_nothing() {
    let gateway = Gateway::start().await;
    let (mut bystander, _) = registered(&gateway).await;
    let early = [
        quic_control_up::Frame::Capabilities(QuicCapabilities { max_concurrency: 4 }),
        quic_control_up::Frame::DrainRequest(QuicDrainRequest {}),
    ];
    for frame in early {
        let mut raw = Raw::connect(&gateway).await;
        raw.send_control(frame).await;
        let (code, reason) = raw.closed().await;
        assert_eq!(code, ErrorCode::ProtocolViolation);
        assert_eq!(reason, "the first control frame must be register or resume");
        assert_eq!(
            gateway.registry().len(),
            1,
            "only the bystander is registered"
        );
    }
    // The bystander still takes and answers work.
    serves(&gateway, &mut bystander, b"after").await;
}

/// Dispatches `input` to `raw` (the only eligible worker), answers it `ok` and checks the
/// dispatch completed with that.
async fn serves(gateway: &Gateway, raw: &mut Raw, input: &'static [u8]) {
    let dispatch = gateway.dispatch("work", input);
    let answer = async {
        let (lane, task) = raw.next_task().await;
        assert_eq!(task.input.as_ref(), input);
        lane.send(quic_lane_up::Frame::Result(QuicResult {
            task_id: task.task_id,
            outcome: Some(quic_result::Outcome::Output("ok".into())),
        }))
        .await;
    };
    let (outcome, ()) = tokio::join!(dispatch, answer);
    assert!(
        matches!(outcome, ActivityOutcome::Completed(ref output) if output.as_ref() == b"ok"),
        "{outcome:?}"
    );
}

/// Lanes and the control stream are the gateway's to end: a worker that finishes (FIN) or
/// resets its side of one while the gateway still uses it breaks the protocol, and the reason
/// names the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_ending_a_stream_the_gateway_still_uses_is_a_protocol_violation() {
    let gateway = Gateway::start().await;

    let (raw, lane) = registered(&gateway).await;
    lane.finish().await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::ProtocolViolation);
    assert_eq!(
        reason,
        format!(
            "the worker finished lane {}, which the gateway had not retired",
            lane.index
        )
    );

    let (raw, lane) = registered(&gateway).await;
    lane.reset(7).await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::ProtocolViolation);
    assert_eq!(
        reason,
        format!("lane {} was reset by the peer (code 7)", lane.index)
    );

    let (mut raw, _lane) = registered(&gateway).await;
    raw.finish_control();
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::ProtocolViolation);
    assert_eq!(reason, "the worker finished the control stream");

    // Control: a worker that leaves its streams open keeps serving.
    let (mut bystander, _lane) = registered(&gateway).await;
    serves(&gateway, &mut bystander, b"still").await;
}

/// A `result` must carry an output or a failure. Sent for a task the lane does not hold, it is
/// still `MALFORMED_FRAME`: decoding is checked before the task it names (`UNKNOWN_TASK` in
/// the test above, where the same frame carries an outcome).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_with_no_outcome_closes_with_malformed_frame_before_its_task_is_looked_up() {
    let gateway = Gateway::start().await;
    let (raw, lane) = registered(&gateway).await;
    lane.send(quic_lane_up::Frame::Result(QuicResult {
        task_id: 999_999,
        outcome: None,
    }))
    .await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::MalformedFrame);
    assert_eq!(
        reason,
        format!(
            "lane {}: result sets neither output nor failure",
            lane.index
        )
    );
}

/// A worker that neither answers nor acknowledges the cancels of ended tasks has each slot
/// reclaimed after `dispatch.cancel_ack_timeout`; at `dispatch.max_unresponsive_tasks`
/// reclaims it is closed `DEREGISTERED`, the reason ending `unresponsive`. Control: a worker
/// that acknowledges its cancels stays through two such rounds, each longer than the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_ignoring_its_cancels_is_closed_deregistered_unresponsive() {
    let mut core = switchyard_core::CoreConfig::default();
    core.dispatch.cancel_ack_timeout = Duration::from_millis(200);
    core.dispatch.max_unresponsive_tasks = 2;
    let gateway = std::sync::Arc::new(Gateway::with_core(core).await);
    for acknowledges in [true, false] {
        let (mut raw, worker) = with_capacity(&gateway, 2).await;
        // A first task, dispatched with a long deadline, waits out the probation: the worker
        // is eligible once it is served.
        serves(&gateway, &mut raw, b"warm").await;
        let rounds = if acknowledges { 2 } else { 1 };
        for _ in 0..rounds {
            held_past_their_deadlines(&gateway, &mut raw, acknowledges).await;
        }
        if acknowledges {
            // Both rounds outlasted the timeout: unacknowledged, the first round's reclaims
            // would have closed the worker during the second.
            serves(&gateway, &mut raw, b"after").await;
            let snapshot = gateway.registry().worker(worker).expect("still registered");
            assert_eq!(snapshot.unresponsive, 0);
            raw.conn.close(quinn::VarInt::from_u32(0), b"done");
            eventually("the control worker is removed", || {
                gateway.registry().worker(worker).is_none()
            })
            .await;
        } else {
            let (code, reason) = raw.closed().await;
            assert_eq!(code, ErrorCode::Deregistered, "{reason}");
            assert!(reason.ends_with("unresponsive"), "{reason}");
            eventually("the worker is removed", || {
                gateway.registry().worker(worker).is_none()
            })
            .await;
        }
    }
}

/// Two dispatches to `raw` (capacity 2) whose 500 ms deadlines pass while it holds them; the
/// gateway cancels both, and `raw` acknowledges the cancels or not.
async fn held_past_their_deadlines(
    gateway: &std::sync::Arc<Gateway>,
    raw: &mut Raw,
    acknowledges: bool,
) {
    let dispatches: Vec<_> = (0..2)
        .map(|_| {
            let gateway = std::sync::Arc::clone(gateway);
            tokio::spawn(async move {
                gateway
                    .dispatch_with(crate::support::request(
                        "work",
                        b"x",
                        Duration::from_millis(500),
                    ))
                    .await
            })
        })
        .collect();
    let mut lanes = Vec::new();
    for _ in 0..2 {
        lanes.push(raw.next_task().await);
    }
    for dispatch in dispatches {
        let outcome = dispatch.await.unwrap();
        assert!(matches!(outcome, ActivityOutcome::TimedOut), "{outcome:?}");
    }
    for _ in 0..2 {
        let (_, cancel) = tokio::time::timeout(crate::support::PATIENCE, raw.cancels.recv())
            .await
            .expect("a cancel")
            .expect("the lanes are read");
        if acknowledges {
            let (lane, _) = lanes
                .iter()
                .find(|(_, task)| task.task_id == cancel.task_id)
                .expect("the cancel names a held task");
            lane.send(quic_lane_up::Frame::CancelAck(QuicCancelAck {
                task_id: cancel.task_id,
            }))
            .await;
        }
    }
}
