//! The one mapping between wire messages and core types, used by both ends.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use switchyard_core::{
    ActivityTask, AdmissionError, CancelReason, Node, RefusalKind, Registration, TaskId, TaskResult,
};
use switchyard_proto::v1::quic_result::Outcome;
use switchyard_proto::v1::{Failure, QuicCancelReason, QuicRegister, QuicResult, QuicTask};

use crate::protocol::{ErrorCode, PROTOCOL_VERSION};

/// Milliseconds since the Unix epoch; instants before it read as 0.
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

/// The instant `ms` milliseconds after the Unix epoch.
pub(crate) fn from_unix_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_millis(ms))
        .unwrap_or(UNIX_EPOCH)
}

/// A registration frame as core's transport-neutral request, capacity left unknown.
pub(crate) fn registration(register: QuicRegister) -> Result<Registration, (ErrorCode, String)> {
    if register.protocol_version != PROTOCOL_VERSION {
        return Err((
            ErrorCode::UnsupportedVersion,
            format!(
                "protocol_version {} is not supported; this gateway speaks {PROTOCOL_VERSION}",
                register.protocol_version
            ),
        ));
    }
    Ok(Registration {
        namespaces: register.namespaces.into_iter().collect(),
        task_queue: register.task_queue,
        node: Node::new(register.node),
        activity_types: register.activity_types.into_iter().collect(),
        identity: register.identity,
        max_concurrency: None,
        // No session until the QUIC protocol carries resume (issue 16).
        reconnect_grace: std::time::Duration::ZERO,
    })
}

/// The close code for an admission refusal; the reason phrase is the refusal's `Display`.
pub(crate) fn refusal_code(error: &AdmissionError) -> ErrorCode {
    match error {
        AdmissionError::ZeroCapacity | AdmissionError::CapacityAboveLimit { .. } => {
            return ErrorCode::CapacityRefused;
        }
        // Not final: the worker comes back once the gateway is (re)started.
        AdmissionError::ShuttingDown => return ErrorCode::ShuttingDown,
        _ => {}
    }
    match error.kind() {
        RefusalKind::Invalid => ErrorCode::RegistrationInvalid,
        RefusalKind::Unauthorised => ErrorCode::NamespaceNotGranted,
        RefusalKind::NotFound => ErrorCode::NamespaceUnknown,
        RefusalKind::Placement => ErrorCode::PlacementRefused,
        _ => ErrorCode::Unavailable,
    }
}

/// A core task as its wire frame.
pub(crate) fn task(task: &ActivityTask) -> QuicTask {
    QuicTask {
        task_id: task.task_id.get(),
        namespace: task.namespace.clone(),
        task_queue: task.task_queue.clone(),
        activity_type: task.activity_type.clone(),
        input: task.input.clone(),
        attempt: task.attempt,
        deadline_unix_ms: unix_ms(task.deadline),
    }
}

/// A core cancel reason as its wire enum value.
pub(crate) fn cancel_reason(reason: CancelReason) -> QuicCancelReason {
    match reason {
        CancelReason::DeadlineExceeded => QuicCancelReason::DeadlineExceeded,
        CancelReason::ShuttingDown => QuicCancelReason::ShuttingDown,
        CancelReason::CallerGone => QuicCancelReason::CallerGone,
        CancelReason::DrainDeadline => QuicCancelReason::DrainDeadline,
        _ => QuicCancelReason::Requested,
    }
}

/// A result frame as core's result; `None` when it sets no outcome.
pub(crate) fn result(result: QuicResult) -> Option<(TaskId, TaskResult)> {
    let outcome = match result.outcome? {
        Outcome::Output(output) => TaskResult::Success(output),
        Outcome::Failure(Failure { message, retryable }) => {
            TaskResult::Failure { message, retryable }
        }
    };
    Some((TaskId::from_raw(result.task_id), outcome))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn registration_never_carries_capacity_and_checks_the_version() {
        let register = QuicRegister {
            protocol_version: PROTOCOL_VERSION,
            namespaces: vec!["a".into(), "b".into()],
            task_queue: String::new(),
            node: String::new(),
            activity_types: vec!["x".into()],
            identity: "w".into(),
            auth_token: "t".into(),
            redundancy: 0,
        };
        let registration = registration(register.clone()).unwrap();
        assert_eq!(registration.max_concurrency, None);
        assert_eq!(registration.node, None);
        assert_eq!(registration.namespaces.len(), 2);
        let refused = super::registration(QuicRegister {
            protocol_version: 2,
            ..register
        });
        assert_eq!(refused.unwrap_err().0, ErrorCode::UnsupportedVersion);
    }

    #[test]
    fn refusals_map_by_kind_and_the_capacity_rule_has_its_own_code() {
        assert_eq!(
            refusal_code(&AdmissionError::ZeroCapacity),
            ErrorCode::CapacityRefused
        );
        assert_eq!(
            refusal_code(&AdmissionError::CapacityAboveLimit {
                max_concurrency: 2,
                limit: 1
            }),
            ErrorCode::CapacityRefused
        );
        assert_eq!(
            refusal_code(&AdmissionError::Empty {
                field: "namespaces"
            }),
            ErrorCode::RegistrationInvalid
        );
        assert_eq!(
            refusal_code(&AdmissionError::NamespaceNotGranted {
                principal: "p".into(),
                namespace: "n".into()
            }),
            ErrorCode::NamespaceNotGranted
        );
    }

    #[test]
    fn every_cancel_reason_has_its_own_wire_value() {
        assert_eq!(
            cancel_reason(CancelReason::DrainDeadline),
            QuicCancelReason::DrainDeadline
        );
        assert_eq!(
            cancel_reason(CancelReason::Requested),
            QuicCancelReason::Requested
        );
        assert_eq!(
            cancel_reason(CancelReason::ShuttingDown),
            QuicCancelReason::ShuttingDown
        );
        assert_eq!(
            cancel_reason(CancelReason::DeadlineExceeded),
            QuicCancelReason::DeadlineExceeded
        );
        assert_eq!(
            cancel_reason(CancelReason::CallerGone),
            QuicCancelReason::CallerGone
        );
    }

    #[test]
    fn result_without_outcome_is_refused() {
        assert_eq!(
            result(QuicResult {
                task_id: 4,
                outcome: None
            }),
            None
        );
        assert_eq!(
            result(QuicResult {
                task_id: 4,
                outcome: Some(Outcome::Output(Bytes::from_static(b"ok")))
            }),
            Some((
                TaskId::from_raw(4),
                TaskResult::Success(Bytes::from_static(b"ok"))
            ))
        );
    }

    #[test]
    fn deadlines_survive_the_wire_to_the_millisecond() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(from_unix_ms(unix_ms(at)), at);
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
    }
}
