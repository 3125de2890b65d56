//! What a worker runs: activity handlers, the context they get, and how they fail.
//!
//! They know no transport: every worker SDK (gRPC, QUIC, or an integrator's) runs the same
//! handlers, so switching a worker between transports changes only how it connects.

use std::future::Future;
use std::pin::Pin;
use std::time::SystemTime;

use crate::delivery::{ActivityTask, TaskId};
use bytes::Bytes;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// What a handler knows about the task it runs.
#[derive(Clone, Debug)]
pub struct ActivityContext {
    task_id: TaskId,
    namespace: String,
    task_queue: String,
    activity_type: String,
    attempt: u32,
    deadline: SystemTime,
    cancellation: CancellationToken,
}

impl ActivityContext {
    /// The context of `task`, cancelled through `cancellation`.
    pub fn new(task: &ActivityTask, cancellation: CancellationToken) -> Self {
        Self {
            task_id: task.task_id,
            namespace: task.namespace.clone(),
            task_queue: task.task_queue.clone(),
            activity_type: task.activity_type.clone(),
            attempt: task.attempt,
            deadline: task.deadline,
            cancellation,
        }
    }

    /// The gateway's id for this delivery of the task.
    pub fn task_id(&self) -> TaskId {
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

    /// Delivery number: 1, plus one per earlier delivery lost with its worker.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the producer stops waiting for the result.
    pub fn deadline(&self) -> SystemTime {
        self.deadline
    }

    /// Fired when the gateway cancels the task or the worker loses its stream; a handler that
    /// sees it should stop, since its result will not be used.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancellation
    }

    /// True once the task is cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancellation.is_cancelled()
    }

    /// Resolves when the task is cancelled.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancellation.cancelled()
    }
}

/// An activity's failure, reported to the producer with its message and retry hint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ActivityError {
    message: String,
    retryable: bool,
}

impl ActivityError {
    /// A failure that running the activity again may cure.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
        }
    }

    /// A failure that running the activity again will not cure.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
        }
    }

    /// The message given to the producer.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether a retry may succeed.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }
}

/// The future a handler returns.
pub type ActivityFuture = Pin<Box<dyn Future<Output = Result<Bytes, ActivityError>> + Send>>;

/// Runs one activity type; implemented for every `Fn(ActivityContext, Bytes) -> impl Future`
/// returning `Result<Bytes, ActivityError>`, so an `async fn` is a handler.
pub trait ActivityHandler: Send + Sync + 'static {
    /// Runs the activity on `input`.
    fn call(&self, context: ActivityContext, input: Bytes) -> ActivityFuture;
}

impl<F, Fut> ActivityHandler for F
where
    F: Fn(ActivityContext, Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Bytes, ActivityError>> + Send + 'static,
{
    fn call(&self, context: ActivityContext, input: Bytes) -> ActivityFuture {
        Box::pin(self(context, input))
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    async fn shout(_: ActivityContext, input: Bytes) -> Result<Bytes, ActivityError> {
        Ok(Bytes::from(input.to_ascii_uppercase()))
    }

    #[tokio::test]
    async fn async_fn_is_a_handler_and_sees_cancellation() {
        let task = ActivityTask {
            task_id: TaskId::from_raw(1),
            namespace: "ns".into(),
            task_queue: "q".into(),
            activity_type: "shout".into(),
            input: Bytes::new(),
            attempt: 1,
            deadline: UNIX_EPOCH,
        };
        let token = CancellationToken::new();
        let context = ActivityContext::new(&task, token.clone());
        let handler: Box<dyn ActivityHandler> = Box::new(shout);
        let output = handler
            .call(context.clone(), Bytes::from_static(b"hi"))
            .await;
        assert_eq!(output, Ok(Bytes::from_static(b"HI")));
        assert!(!context.is_cancelled());
        token.cancel();
        assert!(context.is_cancelled());
    }
}
