//! What producers send and get back, and what workers report.

use std::time::Duration;

use bytes::Bytes;

use crate::address::WorkerId;
use crate::delivery::{TaskId, TransportName};
use crate::registry::UnservedReason;

/// One activity to run, as a producer asks for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivityRequest {
    /// Namespace to dispatch in; the caller must be granted it.
    pub namespace: String,
    /// Task queue; empty means the default queue.
    pub task_queue: String,
    /// Activity type to run.
    pub activity_type: String,
    /// Run only on workers advertising this node.
    pub node: Option<String>,
    /// Opaque input handed to the activity.
    pub input: Bytes,
    /// Caller-chosen id, unique within the namespace while the dispatch is in flight; needed
    /// to cancel it. A second dispatch with an id already in flight is refused.
    pub activity_id: Option<String>,
    /// How long the caller waits for the outcome, from the call.
    pub timeout: Duration,
}

/// The one terminal outcome of a dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ActivityOutcome {
    /// The activity returned this output.
    Completed(Bytes),
    /// The activity reported a failure.
    Failed {
        /// The activity's message.
        message: String,
        /// Whether it judged a retry may succeed.
        retryable: bool,
    },
    /// The deadline passed while a worker held the task (a cancel was sent).
    TimedOut,
    /// The producer cancelled it.
    Cancelled,
    /// The deadline passed while no worker could take it.
    Unserved {
        /// Why no worker could take it, as classified at the last look.
        reason: UnservedReason,
        /// The operator sentence for that reason.
        detail: String,
    },
    /// Workers holding it were lost more often than the transport-loss budget allows.
    TransportLost {
        /// The transport of the last worker lost.
        transport: TransportName,
        /// How many deliveries were made.
        attempts: u32,
    },
    /// The gateway is shutting down.
    ShuttingDown,
}

impl ActivityOutcome {
    /// A stable lowercase label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Completed(_) => "completed",
            Self::Failed { .. } => "failed",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
            Self::Unserved { .. } => "unserved",
            Self::TransportLost { .. } => "transport_lost",
            Self::ShuttingDown => "shutting_down",
        }
    }
}

/// What a worker reports for a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskResult {
    /// The activity succeeded with this output.
    Success(Bytes),
    /// The activity failed.
    Failure {
        /// Its message.
        message: String,
        /// Whether a retry may succeed.
        retryable: bool,
    },
}

/// A dispatch refused before it started (it has no outcome).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// A required field was empty or malformed.
    #[error("{field}: {problem}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The caller is not granted the namespace.
    #[error("principal {principal:?} is not granted namespace {namespace:?}")]
    NamespaceNotGranted {
        /// The caller.
        principal: String,
        /// The namespace.
        namespace: String,
    },
    /// The input is larger than the workers' legs can carry; nothing was sent to any worker.
    #[error("input is {size} bytes, more than the limit of {limit} bytes a worker can receive")]
    InputTooLarge {
        /// The input's size, in bytes.
        size: usize,
        /// The limit, in bytes.
        limit: usize,
    },
    /// A quota of the namespace or the principal is reached; `limit` is its configuration key.
    #[error("`{limit}` ({value}) reached for {scope}")]
    QuotaExceeded {
        /// The configuration key of the quota (`dispatch.max_parked_per_namespace`, ...).
        limit: &'static str,
        /// The quota's configured value.
        value: u64,
        /// Whose quota: `namespace "x"` or `principal "p"`.
        scope: String,
    },
    /// A dispatch with the same activity id is in flight in the namespace.
    #[error("activity id {activity_id:?} is already in flight in namespace {namespace:?}")]
    DuplicateActivityId {
        /// The namespace.
        namespace: String,
        /// The id.
        activity_id: String,
    },
}

/// A result or acknowledgement a transport handed in that core refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompletionRefused {
    /// No task with that id is pending (never existed, or already ended).
    #[error("task {task} is not pending")]
    UnknownTask {
        /// The task quoted.
        task: TaskId,
    },
    /// The task is pending on another worker.
    #[error("task {task} is not held by worker {worker}")]
    NotHeldByWorker {
        /// The task quoted.
        task: TaskId,
        /// The worker that quoted it.
        worker: WorkerId,
    },
    /// The dispatch ended (deadline, cancel) while the worker's session was suspended; the
    /// result arrived after it resumed. Its slot is freed; the producer already had its
    /// outcome. (A result for a dispatch that ended while its worker was connected stands in
    /// for the cancel acknowledgement instead.)
    #[error("task {task} already ended; result arrived late")]
    Late {
        /// The task quoted.
        task: TaskId,
    },
}

/// Why a cancel found nothing to cancel.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CancelError {
    /// No dispatch with that activity id is in flight in the namespace.
    #[error("no activity {activity_id:?} in flight in namespace {namespace:?}")]
    NotFound {
        /// The namespace.
        namespace: String,
        /// The id.
        activity_id: String,
    },
    /// The caller is not granted the namespace.
    #[error("principal {principal:?} is not granted namespace {namespace:?}")]
    NamespaceNotGranted {
        /// The caller.
        principal: String,
        /// The namespace.
        namespace: String,
    },
}
