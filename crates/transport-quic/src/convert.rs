//! The one mapping between wire messages and core types, used by both ends.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use switchyard_core::{
    ActivityTask, AdmissionError, CancelReason, Node, RefusalKind, Registration, ResumeRequest,
    SessionGrant, TaskId, TaskResult, WorkerId,
};
use switchyard_proto::v1::quic_result::Outcome;
use switchyard_proto::v1::{
    Failure, QuicCancelReason, QuicRegister, QuicResult, QuicResume, QuicTask,
};

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

/// Refuses a `protocol_version` other than the one this crate speaks.
fn check_version(version: u32) -> Result<(), (ErrorCode, String)> {
    if version == PROTOCOL_VERSION {
        return Ok(());
    }
    Err((
        ErrorCode::UnsupportedVersion,
        format!(
            "protocol_version {version} is not supported; this gateway speaks {PROTOCOL_VERSION}"
        ),
    ))
}

/// A registration frame as core's transport-neutral request, capacity left unknown; a
/// resumable worker gets a session of `grace` (none when it is zero).
pub(crate) fn registration(
    register: QuicRegister,
    grace: Duration,
) -> Result<Registration, (ErrorCode, String)> {
    check_version(register.protocol_version)?;
    Ok(Registration {
        namespaces: register.namespaces.into_iter().collect(),
        task_queue: register.task_queue,
        node: Node::new(register.node),
        activity_types: register.activity_types.into_iter().collect(),
        identity: register.identity,
        max_concurrency: None,
        reconnect_grace: if register.resumable {
            grace
        } else {
            Duration::ZERO
        },
    })
}

/// A resume frame as core's request. The secret goes to core as sent: a wrong length is a
/// wrong secret, refused by core like any other.
pub(crate) fn resume_request(resume: QuicResume) -> Result<ResumeRequest, (ErrorCode, String)> {
    check_version(resume.protocol_version)?;
    let tasks = |ids: Vec<u64>| ids.into_iter().map(TaskId::from_raw).collect();
    Ok(ResumeRequest {
        session_id: WorkerId::from_raw(resume.session_id),
        secret: resume.resume_secret.to_vec(),
        running: tasks(resume.running_task_ids),
        unacked: tasks(resume.unacked_task_ids),
    })
}

/// The session fields of `registered`: `(session_id, resume_secret, reconnect_grace_ms)`, all
/// empty without a session.
pub(crate) fn grant(grant: Option<&SessionGrant>) -> (u64, Bytes, u32) {
    grant.map_or((0, Bytes::new(), 0), |grant| {
        (
            grant.session_id.get(),
            Bytes::copy_from_slice(grant.secret.as_bytes()),
            u32::try_from(grant.grace.as_millis()).unwrap_or(u32::MAX),
        )
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
            resumable: false,
        };
        let grace = Duration::from_secs(15);
        let registration = registration(register.clone(), grace).unwrap();
        assert_eq!(registration.max_concurrency, None);
        assert_eq!(registration.node, None);
        assert_eq!(registration.namespaces.len(), 2);
        let refused = super::registration(
            QuicRegister {
                protocol_version: 2,
                ..register
            },
            grace,
        );
        assert_eq!(refused.unwrap_err().0, ErrorCode::UnsupportedVersion);
    }

    #[test]
    fn only_a_resumable_registration_gets_the_grace() {
        let register = |resumable| QuicRegister {
            protocol_version: PROTOCOL_VERSION,
            namespaces: vec!["a".into()],
            activity_types: vec!["x".into()],
            resumable,
            ..QuicRegister::default()
        };
        let grace = Duration::from_secs(15);
        assert_eq!(
            registration(register(true), grace).unwrap().reconnect_grace,
            grace
        );
        // Control: the same worker without `resumable` gets no session.
        assert_eq!(
            registration(register(false), grace)
                .unwrap()
                .reconnect_grace,
            Duration::ZERO
        );
        assert_eq!(
            registration(register(true), Duration::ZERO)
                .unwrap()
                .reconnect_grace,
            Duration::ZERO,
            "a gateway without a grace grants none"
        );
    }

    #[test]
    fn a_resume_frame_becomes_core_s_request_and_checks_the_version() {
        let resume = QuicResume {
            protocol_version: PROTOCOL_VERSION,
            auth_token: String::new(),
            session_id: 7,
            resume_secret: Bytes::from_static(&[1; 32]),
            running_task_ids: vec![3, 4],
            unacked_task_ids: vec![5],
            redundancy: 0,
        };
        let request = resume_request(resume.clone()).unwrap();
        assert_eq!(request.session_id, WorkerId::from_raw(7));
        assert_eq!(request.secret, vec![1; 32]);
        assert_eq!(
            request.running,
            vec![TaskId::from_raw(3), TaskId::from_raw(4)]
        );
        assert_eq!(request.unacked, vec![TaskId::from_raw(5)]);
        let refused = resume_request(QuicResume {
            protocol_version: 2,
            ..resume
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
        assert_eq!(
            refusal_code(&AdmissionError::UnknownNamespace {
                namespace: "n".into()
            }),
            ErrorCode::NamespaceUnknown
        );
        assert_eq!(
            refusal_code(&AdmissionError::PlacementViolated {
                namespace: "n".into(),
                node: None,
                required: Vec::new(),
            }),
            ErrorCode::PlacementRefused
        );
        for unavailable in [
            AdmissionError::Store(switchyard_core::StoreError("disk".into())),
            AdmissionError::PrincipalWorkerLimit {
                principal: "p".into(),
                limit: 1,
            },
            AdmissionError::NamespaceLimit { limit: 1 },
        ] {
            assert_eq!(
                refusal_code(&unavailable),
                ErrorCode::Unavailable,
                "{unavailable}"
            );
        }
        assert_eq!(
            refusal_code(&AdmissionError::ShuttingDown),
            ErrorCode::ShuttingDown
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
