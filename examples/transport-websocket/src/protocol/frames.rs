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
    /// Finish in-flight work, take no more, then close.
    Drain,
    /// A frame type from a later protocol revision.
    #[serde(other)]
    Unknown,
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
            WorkerMessage::Drain => Self::Drain,
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
        _ => "other",
    }
}

/// Milliseconds in `interval`, as the `registered` frame carries it.
pub(crate) fn millis(interval: Duration) -> u64 {
    u64::try_from(interval.as_millis()).unwrap_or(u64::MAX)
}
