//! What an activity handler is given and what it returns.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

/// Everything a handler knows about the task it runs, and its cancellation signal.
#[derive(Clone, Debug)]
pub struct ActivityContext {
    pub(crate) task_id: u64,
    pub(crate) namespace: String,
    pub(crate) task_queue: String,
    pub(crate) activity_type: String,
    pub(crate) attempt: u32,
    pub(crate) deadline: SystemTime,
    pub(crate) cancellation: CancellationToken,
}

impl ActivityContext {
    /// The gateway's id for this delivery.
    pub fn task_id(&self) -> u64 {
        self.task_id
    }

    /// The namespace the task was dispatched in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The task queue the task was dispatched in.
    pub fn task_queue(&self) -> &str {
        &self.task_queue
    }

    /// The activity type being run.
    pub fn activity_type(&self) -> &str {
        &self.activity_type
    }

    /// 1 for the first delivery, plus one per re-delivery after a lost worker.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the producer stops waiting for the result.
    pub fn deadline(&self) -> SystemTime {
        self.deadline
    }

    /// Cancelled when the gateway cancels the task (producer cancel, deadline, shutdown).
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancellation
    }

    /// True once the task has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancellation.is_cancelled()
    }

    /// Resolves when the task is cancelled.
    pub async fn cancelled(&self) {
        self.cancellation.cancelled().await;
    }
}

/// An activity's failure, reported to the producer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ActivityError {
    /// What went wrong, for the producer.
    pub message: String,
    /// Whether running the activity again may succeed.
    pub retryable: bool,
}

impl ActivityError {
    /// A failure a retry may fix.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
        }
    }

    /// A failure a retry will not fix.
    pub fn non_retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
        }
    }
}

/// The future a handler returns, boxed.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Bytes, ActivityError>> + Send>>;

/// A registered handler, type-erased.
pub(crate) type Handler = Arc<dyn Fn(ActivityContext, Bytes) -> HandlerFuture + Send + Sync>;

/// Erases a handler's concrete types.
pub(crate) fn erase<F, Fut>(handler: F) -> Handler
where
    F: Fn(ActivityContext, Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Bytes, ActivityError>> + Send + 'static,
{
    Arc::new(move |context, input| Box::pin(handler(context, input)))
}
