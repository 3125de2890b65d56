//! The frames each side sends, and their conversions to and from core's types.

use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use switchyard_core::{
    ActivityTask, CancelReason, Node, Registration, TaskId, TaskResult, WorkerMessage,
};

use super::DecodeError;
use super::codec::{base64_bytes, base64_option, decimal};

/// What a worker sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum WorkerFrame {
    /// The first frame: who the worker is and what it serves.
    Register(RegisterFrame),
    /// The answer to a ping.
    Pong {
        #[serde(with = "decimal")]
        seq: u64,
    },
    /// A task's result.
    Result(ResultFrame),
    /// A cancelled task stopped without a result.
    CancelAck {
        #[serde(with = "decimal")]
        task_id: u64,
    },
    /// A frame type from a later protocol revision.
    #[serde(other)]
    Unknown,
}

impl WorkerFrame {
    /// The frame's `type`, for error messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Register(_) => "register",
            Self::Pong { .. } => "pong",
            Self::Result(_) => "result",
            Self::CancelAck { .. } => "cancel_ack",
            Self::Unknown => "an unknown type",
        }
    }
}

/// What the gateway sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum GatewayFrame {
    /// The worker passed the admission gate.
    Registered {
        #[serde(with = "decimal")]
        worker_id: u64,
        task_queue: String,
        ping_interval_ms: u64,
    },
    /// The registration was refused; a close with `code` follows.
    Refused { code: u16, message: String },
    /// Run this task.
    Task(TaskFrame),
    /// Answer with a pong carrying the same `seq`.
    Ping {
        #[serde(with = "decimal")]
        seq: u64,
    },
    /// Stop this task.
    Cancel {
        #[serde(with = "decimal")]
        task_id: u64,
        reason: String,
    },
    /// Finish in-flight work, take no more, then close; `reason` says whether to come back.
    Drain {
        /// [`DRAIN_REQUESTED`] (final) or [`DRAIN_SHUTTING_DOWN`] (reconnect later); absent
        /// reads as requested.
        #[serde(default = "requested")]
        reason: String,
    },
    /// A frame type from a later protocol revision.
    #[serde(other)]
    Unknown,
}

/// The drain reason of an operator's (or the worker's own) drain: final, do not come back.
pub(crate) const DRAIN_REQUESTED: &str = "requested";
/// The drain reason of a gateway that is shutting down: finish, then reconnect later.
pub(crate) const DRAIN_SHUTTING_DOWN: &str = "shutting_down";

fn requested() -> String {
    DRAIN_REQUESTED.to_owned()
}

/// The `register` frame. Every field defaults, so a missing one reaches the admission gate as
/// empty and is refused there by name, like on every other transport.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RegisterFrame {
    #[serde(default)]
    pub(crate) namespaces: Vec<String>,
    #[serde(default)]
    pub(crate) task_queue: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) node: Option<String>,
    #[serde(default)]
    pub(crate) activity_types: Vec<String>,
    #[serde(default)]
    pub(crate) identity: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) token: Option<String>,
}

impl fmt::Debug for RegisterFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisterFrame")
            .field("namespaces", &self.namespaces)
            .field("task_queue", &self.task_queue)
            .field("node", &self.node)
            .field("activity_types", &self.activity_types)
            .field("identity", &self.identity)
            .field("max_concurrency", &self.max_concurrency)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl RegisterFrame {
    /// The transport-neutral registration, and the bearer token if the frame carried one.
    pub(crate) fn into_registration(self) -> (Registration, Option<String>) {
        let registration = Registration {
            namespaces: self.namespaces.into_iter().collect::<BTreeSet<_>>(),
            task_queue: self.task_queue,
            node: self.node.and_then(Node::new),
            activity_types: self.activity_types.into_iter().collect(),
            identity: self.identity,
            max_concurrency: self.max_concurrency,
            // This example protocol has no resume: a lost socket is a departed worker.
            reconnect_grace: std::time::Duration::ZERO,
        };
        (registration, self.token)
    }
}

/// The `task` frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TaskFrame {
    #[serde(with = "decimal")]
    pub(crate) task_id: u64,
    pub(crate) namespace: String,
    pub(crate) task_queue: String,
    pub(crate) activity_type: String,
    #[serde(with = "base64_bytes")]
    pub(crate) input: Bytes,
    pub(crate) attempt: u32,
    pub(crate) deadline_unix_ms: u64,
}

impl From<ActivityTask> for TaskFrame {
    fn from(task: ActivityTask) -> Self {
        let deadline_unix_ms = task.deadline.duration_since(UNIX_EPOCH).map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        });
        Self {
            task_id: task.task_id.get(),
            namespace: task.namespace,
            task_queue: task.task_queue,
            activity_type: task.activity_type,
            input: task.input,
            attempt: task.attempt,
            deadline_unix_ms,
        }
    }
}

impl TryFrom<TaskFrame> for ActivityTask {
    type Error = DecodeError;

    fn try_from(frame: TaskFrame) -> Result<Self, DecodeError> {
        let deadline = UNIX_EPOCH
            .checked_add(Duration::from_millis(frame.deadline_unix_ms))
            .ok_or(DecodeError::DeadlineOutOfRange {
                task_id: frame.task_id,
                deadline_unix_ms: frame.deadline_unix_ms,
            })?;
        Ok(Self {
            task_id: TaskId::from_raw(frame.task_id),
            namespace: frame.namespace,
            task_queue: frame.task_queue,
            activity_type: frame.activity_type,
            input: frame.input,
            attempt: frame.attempt,
            deadline,
        })
    }
}

/// The `result` frame: exactly one of `output` and `failure`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ResultFrame {
    #[serde(with = "decimal")]
    pub(crate) task_id: u64,
    #[serde(
        default,
        with = "base64_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) output: Option<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) failure: Option<FailureFrame>,
}

/// How an activity failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FailureFrame {
    #[serde(default)]
    pub(crate) message: String,
    #[serde(default)]
    pub(crate) retryable: bool,
}

impl ResultFrame {
    /// The frame reporting `result` for `task`.
    pub(crate) fn new(task: TaskId, result: TaskResult) -> Self {
        let (output, failure) = match result {
            TaskResult::Success(output) => (Some(output), None),
            TaskResult::Failure { message, retryable } => {
                (None, Some(FailureFrame { message, retryable }))
            }
        };
        Self {
            task_id: task.get(),
            output,
            failure,
        }
    }

    /// The task and its result, refusing a frame with both or neither outcome.
    pub(crate) fn into_result(self) -> Result<(TaskId, TaskResult), DecodeError> {
        let task = TaskId::from_raw(self.task_id);
        match (self.output, self.failure) {
            (Some(output), None) => Ok((task, TaskResult::Success(output))),
            (None, Some(FailureFrame { message, retryable })) => {
                Ok((task, TaskResult::Failure { message, retryable }))
            }
            _ => Err(DecodeError::ResultShape {
                task_id: self.task_id,
            }),
        }
    }
}

impl GatewayFrame {
    /// The frame carrying `message`; `None` for a message kind this protocol does not know.
    pub(crate) fn from_message(message: WorkerMessage) -> Option<Self> {
        Some(match message {
            WorkerMessage::Task(task) => Self::Task(task.into()),
            WorkerMessage::Drain => Self::Drain {
                reason: DRAIN_REQUESTED.to_owned(),
            },
            WorkerMessage::ShuttingDown => Self::Drain {
                reason: DRAIN_SHUTTING_DOWN.to_owned(),
            },
            WorkerMessage::Ping { seq } => Self::Ping { seq },
            WorkerMessage::Cancel { task_id, reason } => Self::Cancel {
                task_id: task_id.get(),
                reason: cancel_reason(reason).to_owned(),
            },
            _ => return None,
        })
    }
}

/// The wire word for a cancel reason.
fn cancel_reason(reason: CancelReason) -> &'static str {
    match reason {
        CancelReason::Requested => "requested",
        CancelReason::DeadlineExceeded => "deadline_exceeded",
        CancelReason::ShuttingDown => "shutting_down",
        CancelReason::CallerGone => "caller_gone",
        CancelReason::DrainDeadline => "drain_deadline",
        _ => "other",
    }
}

/// Milliseconds in `interval`, as the `registered` frame carries it.
pub(crate) fn millis(interval: Duration) -> u64 {
    u64::try_from(interval.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::protocol::{decode_gateway, decode_worker, encode};

    fn bytes() -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from)
    }

    fn worker_frame() -> impl Strategy<Value = WorkerFrame> {
        let name = "[a-z0-9._-]{0,12}";
        prop_oneof![
            (
                proptest::collection::vec(name, 0..3),
                name,
                proptest::option::of(name),
                proptest::collection::vec(name, 0..3),
                ".{0,16}",
                proptest::option::of(any::<u32>()),
                proptest::option::of(".{0,16}"),
            )
                .prop_map(
                    |(namespaces, task_queue, node, activity_types, identity, cap, token)| {
                        WorkerFrame::Register(RegisterFrame {
                            namespaces,
                            task_queue,
                            node,
                            activity_types,
                            identity,
                            max_concurrency: cap,
                            token,
                        })
                    }
                ),
            any::<u64>().prop_map(|seq| WorkerFrame::Pong { seq }),
            (any::<u64>(), bytes()).prop_map(|(task, output)| {
                WorkerFrame::Result(ResultFrame::new(
                    TaskId::from_raw(task),
                    TaskResult::Success(output),
                ))
            }),
            (any::<u64>(), ".{0,24}", any::<bool>()).prop_map(|(task, message, retryable)| {
                WorkerFrame::Result(ResultFrame::new(
                    TaskId::from_raw(task),
                    TaskResult::Failure { message, retryable },
                ))
            }),
            any::<u64>().prop_map(|task_id| WorkerFrame::CancelAck { task_id }),
        ]
    }

    fn gateway_frame() -> impl Strategy<Value = GatewayFrame> {
        prop_oneof![
            (any::<u64>(), "[a-z]{1,8}", any::<u64>()).prop_map(|(worker_id, task_queue, ms)| {
                GatewayFrame::Registered {
                    worker_id,
                    task_queue,
                    ping_interval_ms: ms,
                }
            }),
            (any::<u16>(), ".{0,40}")
                .prop_map(|(code, message)| GatewayFrame::Refused { code, message }),
            (any::<u64>(), bytes(), any::<u32>(), any::<u64>()).prop_map(
                |(task_id, input, attempt, deadline_unix_ms)| {
                    GatewayFrame::Task(TaskFrame {
                        task_id,
                        namespace: "ns".to_owned(),
                        task_queue: "q".to_owned(),
                        activity_type: "act".to_owned(),
                        input,
                        attempt,
                        deadline_unix_ms,
                    })
                }
            ),
            any::<u64>().prop_map(|seq| GatewayFrame::Ping { seq }),
            (any::<u64>(), "[a-z_]{1,12}")
                .prop_map(|(task_id, reason)| GatewayFrame::Cancel { task_id, reason }),
            "[a-z_]{1,12}".prop_map(|reason| GatewayFrame::Drain { reason }),
        ]
    }

    proptest! {
        #[test]
        fn worker_frames_round_trip(frame in worker_frame()) {
            let text = encode(&frame).unwrap();
            prop_assert_eq!(decode_worker(&text).unwrap(), frame);
        }

        #[test]
        fn gateway_frames_round_trip(frame in gateway_frame()) {
            let text = encode(&frame).unwrap();
            prop_assert_eq!(decode_gateway(&text).unwrap(), frame);
        }

        #[test]
        fn arbitrary_text_never_panics_the_decoders(text in ".{0,200}") {
            let _ = decode_worker(&text);
            let _ = decode_gateway(&text);
        }

        #[test]
        fn damaged_frames_are_errors_or_frames_never_panics(
            frame in worker_frame(),
            cut in any::<prop::sample::Index>(),
        ) {
            let text = encode(&frame).unwrap();
            let mut end = cut.index(text.len() + 1);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let _ = decode_worker(&text[..end]);
        }
    }

    #[test]
    fn ids_are_decimal_strings_and_numbers_are_accepted() {
        let text = encode(&WorkerFrame::Pong { seq: u64::MAX }).unwrap();
        assert_eq!(text, r#"{"type":"pong","seq":"18446744073709551615"}"#);
        let from_number = decode_worker(r#"{"type":"pong","seq":7}"#).unwrap();
        assert_eq!(from_number, WorkerFrame::Pong { seq: 7 });
        assert!(decode_worker(r#"{"type":"pong","seq":"-1"}"#).is_err());
        assert!(decode_worker(r#"{"type":"pong","seq":-1}"#).is_err());
    }

    #[test]
    fn payloads_are_standard_base64_and_bad_base64_is_named() {
        let frame = ResultFrame::new(
            TaskId::from_raw(3),
            TaskResult::Success(Bytes::from_static(b"\x00\xffok")),
        );
        let text = encode(&WorkerFrame::Result(frame)).unwrap();
        assert_eq!(
            text,
            r#"{"type":"result","task_id":"3","output":"AP9vaw=="}"#
        );
        let error =
            decode_worker(r#"{"type":"result","task_id":"3","output":"not base64!"}"#).unwrap_err();
        assert!(error.to_string().contains("base64"), "{error}");
    }

    #[test]
    fn a_result_needs_exactly_one_outcome() {
        let both = r#"{"type":"result","task_id":"1","output":"","failure":{"message":"x"}}"#;
        let neither = r#"{"type":"result","task_id":"1"}"#;
        for text in [both, neither] {
            let WorkerFrame::Result(result) = decode_worker(text).unwrap() else {
                panic!("{text} is a result frame");
            };
            let error = result.into_result().unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("exactly one of output and failure")
            );
        }
        let null_output = r#"{"type":"result","task_id":"1","output":null,"failure":{}}"#;
        let WorkerFrame::Result(result) = decode_worker(null_output).unwrap() else {
            panic!("a result frame");
        };
        assert_eq!(
            result.into_result().unwrap().1,
            TaskResult::Failure {
                message: String::new(),
                retryable: false
            }
        );
    }

    #[test]
    fn unknown_types_and_fields_are_tolerated_but_a_missing_type_is_not() {
        assert_eq!(
            decode_worker(r#"{"type":"telemetry","cpu":0.5}"#).unwrap(),
            WorkerFrame::Unknown
        );
        assert_eq!(
            decode_worker(r#"{"type":"pong","seq":"1","sent_at":12}"#).unwrap(),
            WorkerFrame::Pong { seq: 1 }
        );
        assert!(decode_worker(r#"{"seq":"1"}"#).is_err());
        assert!(decode_worker("[]").is_err());
    }

    #[test]
    fn a_bare_register_frame_reaches_the_gate_empty() {
        let WorkerFrame::Register(register) = decode_worker(r#"{"type":"register"}"#).unwrap()
        else {
            panic!("a register frame");
        };
        let (registration, token) = register.into_registration();
        assert!(registration.namespaces.is_empty());
        assert!(registration.activity_types.is_empty());
        assert_eq!(registration.max_concurrency, None);
        assert_eq!(token, None);
    }

    #[test]
    fn register_debug_redacts_the_token() {
        let register = RegisterFrame {
            token: Some("s3cret".to_owned()),
            ..RegisterFrame::default()
        };
        let printed = format!("{register:?}");
        assert!(!printed.contains("s3cret"));
        assert!(printed.contains("redacted"));
    }

    #[test]
    fn tasks_convert_both_ways_with_millisecond_deadlines() {
        let task = ActivityTask {
            task_id: TaskId::from_raw(9),
            namespace: "ns".to_owned(),
            task_queue: "q".to_owned(),
            activity_type: "act".to_owned(),
            input: Bytes::from_static(b"in"),
            attempt: 2,
            deadline: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        };
        let frame = TaskFrame::from(task.clone());
        assert_eq!(frame.deadline_unix_ms, 1_700_000_000_123);
        assert_eq!(ActivityTask::try_from(frame).unwrap(), task);
    }

    #[test]
    fn every_core_message_has_a_frame() {
        let cancel = WorkerMessage::Cancel {
            task_id: TaskId::from_raw(4),
            reason: CancelReason::DeadlineExceeded,
        };
        assert_eq!(
            GatewayFrame::from_message(cancel),
            Some(GatewayFrame::Cancel {
                task_id: 4,
                reason: "deadline_exceeded".to_owned()
            })
        );
        assert_eq!(
            GatewayFrame::from_message(WorkerMessage::Drain),
            Some(GatewayFrame::Drain {
                reason: "requested".to_owned()
            })
        );
        assert_eq!(
            GatewayFrame::from_message(WorkerMessage::ShuttingDown),
            Some(GatewayFrame::Drain {
                reason: "shutting_down".to_owned()
            })
        );
        let at_deadline = WorkerMessage::Cancel {
            task_id: TaskId::from_raw(4),
            reason: CancelReason::DrainDeadline,
        };
        assert_eq!(
            GatewayFrame::from_message(at_deadline),
            Some(GatewayFrame::Cancel {
                task_id: 4,
                reason: "drain_deadline".to_owned()
            })
        );
        // An older gateway's drain, without a reason, is a requested one.
        assert_eq!(
            super::super::decode_gateway(r#"{"type":"drain"}"#).unwrap(),
            GatewayFrame::Drain {
                reason: "requested".to_owned()
            }
        );
        assert_eq!(
            GatewayFrame::from_message(WorkerMessage::Ping { seq: 5 }),
            Some(GatewayFrame::Ping { seq: 5 })
        );
    }
}
