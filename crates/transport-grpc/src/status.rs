//! Why a worker stream ends, and the one mapping from that to a gRPC status.

use std::time::Duration;

use switchyard_core::{
    AdmissionError, DisconnectReason, RefusalKind, ResumeRefused, TaskId, WorkerId,
};
use tonic::{Code, Status};

use switchyard_auth::AuthError;

/// Why the gateway ends a worker stream (or refuses it) with a status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The caller could not be authenticated.
    #[error(transparent)]
    Unauthenticated(#[from] AuthError),
    /// No frame arrived within the registration deadline.
    #[error("no register frame within the registration deadline of {deadline:?}")]
    RegistrationDeadline {
        /// The configured deadline.
        deadline: Duration,
    },
    /// The first frame was neither `register` nor `resume`.
    #[error("the first frame must be register or resume, got {got}")]
    NotRegisteredFirst {
        /// The frame that came first.
        got: &'static str,
    },
    /// A second `register` on a stream already registered.
    #[error("second register frame on one stream (already registered as worker {worker})")]
    DoubleRegistration {
        /// The worker the stream is registered as.
        worker: WorkerId,
    },
    /// A result with neither `output` nor `failure`.
    #[error("result for task {task} carries neither output nor failure")]
    ResultWithoutOutcome {
        /// The task quoted.
        task: TaskId,
    },
    /// The admission gate refused the registration.
    #[error(transparent)]
    Refused(#[from] AdmissionError),
    /// A frame could not be decoded (not protobuf, or a name that is not UTF-8).
    #[error("malformed frame: {reason}")]
    MalformedFrame {
        /// What the decoder said.
        reason: String,
    },
    /// A frame was larger than the configured maximum message size.
    #[error("frame too large: {reason}")]
    FrameTooLarge {
        /// What the decoder said (it names the size and the limit).
        reason: String,
    },
    /// The connection already carries as many worker streams as the gateway allows.
    #[error("`grpc.max_workers_per_connection` ({limit}) reached on this connection")]
    ConnectionWorkerLimit {
        /// The cap.
        limit: usize,
    },
    /// The gateway is shutting down; the worker should reconnect later.
    #[error("the gateway is shutting down; reconnect later")]
    ShuttingDown,
    /// The session refused a `resume`; its message starts with `resume refused: <reason>`.
    #[error(transparent)]
    ResumeRefused(#[from] ResumeRefused),
    /// A newer stream resumed this stream's session.
    #[error("superseded by a resumed connection")]
    Superseded,
    /// Core deregistered the worker while its stream was open.
    #[error("worker {worker} was deregistered: {}", reason.as_str())]
    Deregistered {
        /// The worker.
        worker: WorkerId,
        /// Why core let it go.
        reason: DisconnectReason,
    },
}

impl SessionError {
    /// The refusal for a status the inbound stream failed with, when the worker's own bytes
    /// caused it (a frame that does not decode, or one over the size limit); `None` when the
    /// stream simply broke (reset, connection lost), which needs no answer.
    /// True when the worker broke the protocol (or a rule the gateway enforces on its frames):
    /// it leaves at once, never suspended, whatever its session.
    pub(crate) fn is_fault(&self) -> bool {
        matches!(
            self,
            Self::NotRegisteredFirst { .. }
                | Self::DoubleRegistration { .. }
                | Self::ResultWithoutOutcome { .. }
                | Self::MalformedFrame { .. }
                | Self::FrameTooLarge { .. }
                | Self::Refused(_)
                | Self::ConnectionWorkerLimit { .. }
        )
    }

    pub(crate) fn from_inbound(status: &Status) -> Option<Self> {
        let reason = status.message().to_owned();
        match status.code() {
            Code::Internal if reason.contains("decode") => Some(Self::MalformedFrame { reason }),
            Code::OutOfRange | Code::ResourceExhausted => Some(Self::FrameTooLarge { reason }),
            _ => None,
        }
    }

    /// The status the stream ends with; its message is this error's sentence.
    pub fn status(&self) -> Status {
        match self {
            Self::Refused(error) => admission_status(error),
            Self::ResumeRefused(refusal) => resume_status(refusal),
            Self::Superseded => Status::aborted(self.to_string()),
            Self::Unauthenticated(_) => Status::unauthenticated(self.to_string()),
            Self::RegistrationDeadline { .. } => Status::deadline_exceeded(self.to_string()),
            Self::NotRegisteredFirst { .. }
            | Self::DoubleRegistration { .. }
            | Self::ResultWithoutOutcome { .. }
            | Self::MalformedFrame { .. } => Status::invalid_argument(self.to_string()),
            Self::FrameTooLarge { .. } | Self::ConnectionWorkerLimit { .. } => {
                Status::resource_exhausted(self.to_string())
            }
            Self::Deregistered { .. } | Self::ShuttingDown => Status::unavailable(self.to_string()),
        }
    }
}

/// The status for a registration refused by the admission gate: validation and capacity are
/// INVALID_ARGUMENT, namespace authorisation PERMISSION_DENIED, an unknown namespace under a
/// closed policy NOT_FOUND, placement FAILED_PRECONDITION, a store failure UNAVAILABLE, a quota
/// RESOURCE_EXHAUSTED. The message is the gate's own sentence.
pub fn admission_status(error: &AdmissionError) -> Status {
    let code = match error.kind() {
        RefusalKind::Invalid => Code::InvalidArgument,
        RefusalKind::Unauthorised => Code::PermissionDenied,
        RefusalKind::NotFound => Code::NotFound,
        RefusalKind::Placement => Code::FailedPrecondition,
        RefusalKind::Unavailable => Code::Unavailable,
        RefusalKind::Exhausted => Code::ResourceExhausted,
        // A family added to core after this transport: say so rather than guess.
        _ => Code::Unknown,
    };
    Status::new(code, error.to_string())
}

/// The status for a refused resume: an unknown session NOT_FOUND, a wrong secret or principal
/// PERMISSION_DENIED, a draining session FAILED_PRECONDITION, a gateway shutting down
/// UNAVAILABLE, too many task ids INVALID_ARGUMENT. The message is core's sentence, which
/// starts with `resume refused: <label>`.
fn resume_status(refusal: &ResumeRefused) -> Status {
    let code = match refusal {
        ResumeRefused::UnknownSession { .. } => Code::NotFound,
        ResumeRefused::WrongSecret { .. } | ResumeRefused::WrongPrincipal { .. } => {
            Code::PermissionDenied
        }
        ResumeRefused::Draining { .. } => Code::FailedPrecondition,
        ResumeRefused::ShuttingDown => Code::Unavailable,
        ResumeRefused::TooManyTasks { .. } => Code::InvalidArgument,
        // A refusal added to core after this transport: say so rather than guess.
        _ => Code::Unknown,
    };
    Status::new(code, refusal.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_family_has_its_code_and_the_gate_sentence() {
        let cases = [
            (AdmissionError::ZeroCapacity, Code::InvalidArgument),
            (
                AdmissionError::Empty {
                    field: "namespaces",
                },
                Code::InvalidArgument,
            ),
            (
                AdmissionError::NamespaceNotGranted {
                    principal: "p".into(),
                    namespace: "n".into(),
                },
                Code::PermissionDenied,
            ),
            (
                AdmissionError::UnknownNamespace {
                    namespace: "n".into(),
                },
                Code::NotFound,
            ),
            (
                AdmissionError::PlacementViolated {
                    namespace: "n".into(),
                    node: None,
                    required: Vec::new(),
                },
                Code::FailedPrecondition,
            ),
        ];
        for (error, code) in cases {
            let status = SessionError::from(error.clone()).status();
            assert_eq!(status.code(), code, "{error}");
            assert_eq!(status.message(), error.to_string());
        }
    }

    #[test]
    fn protocol_violations_are_invalid_argument() {
        let status = SessionError::NotRegisteredFirst { got: "pong" }.status();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "the first frame must be register or resume, got pong"
        );
        let deadline = SessionError::RegistrationDeadline {
            deadline: Duration::from_millis(50),
        };
        assert_eq!(deadline.status().code(), Code::DeadlineExceeded);
    }

    #[test]
    fn each_resume_refusal_has_its_code_and_names_its_reason() {
        let session_id = WorkerId::from_raw(4);
        let cases = [
            (ResumeRefused::UnknownSession { session_id }, Code::NotFound),
            (
                ResumeRefused::WrongSecret { session_id },
                Code::PermissionDenied,
            ),
            (
                ResumeRefused::WrongPrincipal { session_id },
                Code::PermissionDenied,
            ),
            (
                ResumeRefused::Draining { session_id },
                Code::FailedPrecondition,
            ),
            (ResumeRefused::ShuttingDown, Code::Unavailable),
            (
                ResumeRefused::TooManyTasks {
                    field: "running",
                    count: 2,
                    limit: 1,
                },
                Code::InvalidArgument,
            ),
        ];
        for (refusal, code) in cases {
            let status = SessionError::from(refusal.clone()).status();
            assert_eq!(status.code(), code, "{refusal}");
            let prefix = format!("resume refused: {}", refusal.label());
            assert!(
                status.message().starts_with(&prefix),
                "{}",
                status.message()
            );
        }
        // Control: the superseded stream is told apart from a refusal.
        let superseded = SessionError::Superseded.status();
        assert_eq!(superseded.code(), Code::Aborted);
        assert_eq!(superseded.message(), "superseded by a resumed connection");
    }
}
