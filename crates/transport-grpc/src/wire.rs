//! Conversions between the `switchyard.v1` worker frames and core's types, for both ends.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use switchyard_core::{
    ActivityTask, CancelReason, Node, Registration, TaskId, TaskResult, WorkerId, WorkerMessage,
};
use switchyard_proto::v1::{
    self, ActivityResult, CancelActivity, DrainRequest, Failure, GatewayFrame, LivenessPing,
    RegisterAck, RegisterWorker, activity_result, cancel_activity, drain_request, gateway_frame,
    worker_frame,
};

use crate::status::SessionError;

/// The transport-neutral registration a `register` frame asks for.
pub(crate) fn registration(frame: RegisterWorker) -> Registration {
    Registration {
        namespaces: frame.namespaces.into_iter().collect(),
        task_queue: frame.task_queue,
        node: Node::new(frame.node),
        activity_types: frame.activity_types.into_iter().collect(),
        identity: frame.identity,
        max_concurrency: frame.max_concurrency,
        // No session until the gRPC protocol carries resume (issue 16).
        reconnect_grace: std::time::Duration::ZERO,
    }
}

/// The first frame of an accepted stream; `max_frame_bytes` is the stream's message size limit,
/// the same both ways.
pub(crate) fn register_ack(
    worker: WorkerId,
    task_queue: &str,
    ping_interval: Duration,
    max_frame_bytes: usize,
) -> GatewayFrame {
    let max_frame_bytes = u32::try_from(max_frame_bytes).unwrap_or(u32::MAX);
    frame(gateway_frame::Frame::RegisterAck(RegisterAck {
        worker_id: worker.get(),
        task_queue: task_queue.to_owned(),
        ping_interval_ms: u32::try_from(ping_interval.as_millis()).unwrap_or(u32::MAX),
        max_gateway_frame_bytes: max_frame_bytes,
        max_worker_frame_bytes: max_frame_bytes,
        ..RegisterAck::default()
    }))
}

/// The frame carrying `message`; `None` for a message this protocol version has no frame for.
pub(crate) fn gateway_frame(message: WorkerMessage) -> Option<GatewayFrame> {
    let inner = match message {
        WorkerMessage::Task(task) => gateway_frame::Frame::Task(v1::ActivityTask {
            task_id: task.task_id.get(),
            namespace: task.namespace,
            task_queue: task.task_queue,
            activity_type: task.activity_type,
            input: task.input,
            attempt: task.attempt,
            deadline_unix_ms: unix_ms(task.deadline),
        }),
        WorkerMessage::Ping { seq } => gateway_frame::Frame::Ping(LivenessPing { seq }),
        WorkerMessage::Cancel { task_id, reason } => gateway_frame::Frame::Cancel(CancelActivity {
            task_id: task_id.get(),
            reason: cancel_reason(reason).into(),
        }),
        WorkerMessage::Drain => drain(drain_request::Reason::Requested),
        WorkerMessage::ShuttingDown => drain(drain_request::Reason::ShuttingDown),
        _ => return None,
    };
    Some(frame(inner))
}

fn drain(reason: drain_request::Reason) -> gateway_frame::Frame {
    gateway_frame::Frame::Drain(DrainRequest {
        reason: reason.into(),
    })
}

fn frame(inner: gateway_frame::Frame) -> GatewayFrame {
    GatewayFrame { frame: Some(inner) }
}

fn cancel_reason(reason: CancelReason) -> cancel_activity::Reason {
    match reason {
        CancelReason::Requested => cancel_activity::Reason::Requested,
        CancelReason::DeadlineExceeded => cancel_activity::Reason::DeadlineExceeded,
        CancelReason::ShuttingDown => cancel_activity::Reason::ShuttingDown,
        CancelReason::CallerGone => cancel_activity::Reason::CallerGone,
        CancelReason::DrainDeadline => cancel_activity::Reason::DrainDeadline,
        _ => cancel_activity::Reason::Unspecified,
    }
}

/// The task id and result a `result` frame reports.
pub(crate) fn task_result(frame: ActivityResult) -> Result<(TaskId, TaskResult), SessionError> {
    let task = TaskId::from_raw(frame.task_id);
    let result = match frame.outcome {
        Some(activity_result::Outcome::Output(output)) => TaskResult::Success(output),
        Some(activity_result::Outcome::Failure(Failure { message, retryable })) => {
            TaskResult::Failure { message, retryable }
        }
        None => return Err(SessionError::ResultWithoutOutcome { task }),
    };
    Ok((task, result))
}

/// A short name for a worker frame, for refusal messages.
pub(crate) fn worker_frame_name(frame: Option<&worker_frame::Frame>) -> &'static str {
    match frame {
        Some(worker_frame::Frame::Register(_)) => "register",
        Some(worker_frame::Frame::Result(_)) => "result",
        Some(worker_frame::Frame::Pong(_)) => "pong",
        Some(worker_frame::Frame::CancelAck(_)) => "cancel_ack",
        Some(worker_frame::Frame::DrainRequest(_)) => "drain_request",
        Some(worker_frame::Frame::Capacity(_)) => "capacity",
        Some(worker_frame::Frame::Resume(_)) => "resume",
        None => "an empty frame",
    }
}

/// Milliseconds since the Unix epoch; 0 for instants before it.
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

/// The instant `ms` milliseconds after the Unix epoch.
pub(crate) fn from_unix_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Core's view of a pushed task, as the worker runtime reads it.
pub(crate) fn activity_task(task: v1::ActivityTask) -> ActivityTask {
    ActivityTask {
        task_id: TaskId::from_raw(task.task_id),
        namespace: task.namespace,
        task_queue: task.task_queue,
        activity_type: task.activity_type,
        input: task.input,
        attempt: task.attempt,
        deadline: from_unix_ms(task.deadline_unix_ms),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn task_survives_the_wire_to_the_millisecond() {
        let task = ActivityTask {
            task_id: TaskId::from_raw(42),
            namespace: "ns".into(),
            task_queue: "q".into(),
            activity_type: "echo".into(),
            input: Bytes::from_static(b"in"),
            attempt: 2,
            deadline: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        };
        let Some(GatewayFrame {
            frame: Some(gateway_frame::Frame::Task(wire)),
        }) = gateway_frame(WorkerMessage::Task(task.clone()))
        else {
            panic!("a task becomes a task frame");
        };
        assert_eq!(activity_task(wire), task);
    }

    #[test]
    fn registration_keeps_absent_capacity_apart_from_zero() {
        let frame = RegisterWorker {
            namespaces: vec!["a".into(), "a".into(), "b".into()],
            node: String::new(),
            max_concurrency: None,
            ..RegisterWorker::default()
        };
        let decoded = registration(frame.clone());
        assert_eq!(decoded.namespaces.len(), 2);
        assert_eq!(decoded.node, None);
        assert_eq!(decoded.max_concurrency, None);
        let zero = registration(RegisterWorker {
            max_concurrency: Some(0),
            ..frame
        });
        assert_eq!(zero.max_concurrency, Some(0));
    }

    #[test]
    fn result_without_outcome_is_a_violation() {
        let refused = task_result(ActivityResult {
            task_id: 9,
            outcome: None,
        });
        assert_eq!(
            refused,
            Err(SessionError::ResultWithoutOutcome {
                task: TaskId::from_raw(9)
            })
        );
        let empty_output = task_result(ActivityResult {
            task_id: 9,
            outcome: Some(activity_result::Outcome::Output(Bytes::new())),
        });
        assert_eq!(
            empty_output,
            Ok((TaskId::from_raw(9), TaskResult::Success(Bytes::new())))
        );
    }

    #[test]
    fn cancel_reasons_map_to_their_wire_values() {
        let cases = [
            (CancelReason::Requested, cancel_activity::Reason::Requested),
            (
                CancelReason::DeadlineExceeded,
                cancel_activity::Reason::DeadlineExceeded,
            ),
            (
                CancelReason::ShuttingDown,
                cancel_activity::Reason::ShuttingDown,
            ),
            (
                CancelReason::CallerGone,
                cancel_activity::Reason::CallerGone,
            ),
            (
                CancelReason::DrainDeadline,
                cancel_activity::Reason::DrainDeadline,
            ),
        ];
        for (reason, wire) in cases {
            let Some(GatewayFrame {
                frame: Some(gateway_frame::Frame::Cancel(cancel)),
            }) = gateway_frame(WorkerMessage::Cancel {
                task_id: TaskId::from_raw(3),
                reason,
            })
            else {
                panic!("a cancel becomes a cancel frame");
            };
            assert_eq!(cancel.reason(), wire, "{reason:?}");
        }
    }

    #[test]
    fn shutdown_and_drain_carry_their_drain_reasons() {
        let reason = |message| match gateway_frame(message) {
            Some(GatewayFrame {
                frame: Some(gateway_frame::Frame::Drain(drain)),
            }) => drain.reason(),
            other => panic!("a drain frame, got {other:?}"),
        };
        assert_eq!(
            reason(WorkerMessage::ShuttingDown),
            drain_request::Reason::ShuttingDown
        );
        assert_eq!(
            reason(WorkerMessage::Drain),
            drain_request::Reason::Requested
        );
    }

    #[test]
    fn acknowledgement_states_the_frame_limits() {
        let Some(gateway_frame::Frame::RegisterAck(ack)) =
            register_ack(WorkerId::from_raw(7), "q", Duration::from_secs(2), 4096).frame
        else {
            panic!("an acknowledgement");
        };
        assert_eq!(ack.max_gateway_frame_bytes, 4096);
        assert_eq!(ack.max_worker_frame_bytes, 4096);
        assert_eq!(ack.ping_interval_ms, 2000);
    }
}
