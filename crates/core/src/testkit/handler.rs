//! The activity handler a conformance check gives to a worker, and what it receives.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::outcome::TaskResult;

/// One task as a kit handler sees it.
#[derive(Clone, Debug)]
pub struct TaskCall {
    /// The activity type the task was dispatched for.
    pub activity_type: String,
    /// The producer's input bytes, unchanged.
    pub input: Bytes,
    /// Fired by the worker runtime when the gateway sends a cancel for this task.
    pub cancelled: CancellationToken,
}

/// The future a [`Handler`] returns.
pub type HandlerFuture = Pin<Box<dyn Future<Output = TaskResult> + Send>>;

/// An activity handler: an async function from a [`TaskCall`] to a [`TaskResult`].
///
/// A harness adapts it to its transport's worker runtime: it builds a [`TaskCall`] for every
/// task the runtime starts (firing `cancelled` when a cancel for the task arrives), awaits the
/// handler and sends back what it returns. `TaskResult::Failure` maps to the runtime's activity
/// error with the same message and retryable flag.
#[derive(Clone)]
pub struct Handler(Arc<dyn Fn(TaskCall) -> HandlerFuture + Send + Sync>);

impl Handler {
    /// Wraps an async function.
    pub fn new<F, Fut>(handler: F) -> Self
    where
        F: Fn(TaskCall) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = TaskResult> + Send + 'static,
    {
        Self(Arc::new(move |call| Box::pin(handler(call))))
    }

    /// A handler that returns its input as its output.
    pub fn echo() -> Self {
        Self::new(|call: TaskCall| async move { TaskResult::Success(call.input) })
    }

    /// Runs the handler for one task.
    pub fn call(&self, call: TaskCall) -> HandlerFuture {
        (self.0)(call)
    }
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler").finish_non_exhaustive()
    }
}
