//! Runs one task at a time under the worker's concurrency permit; a transport drives each
//! task (a stream's task set, or one QUIC lane) and sends back the [`TaskReply`].

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::FutureExt;
use futures::future::BoxFuture;
use switchyard_core::{
    ActivityContext, ActivityError, ActivityHandler, ActivityTask, TaskId, TaskResult,
};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Starts tasks; every task holds one of `max_concurrency` permits while its handler runs.
#[derive(Clone)]
pub struct TaskRunner {
    activities: Arc<BTreeMap<String, Arc<dyn ActivityHandler>>>,
    permits: Arc<Semaphore>,
    size: Arc<std::sync::Mutex<u32>>,
}

impl std::fmt::Debug for TaskRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskRunner")
            .field("available_permits", &self.permits.available_permits())
            .finish_non_exhaustive()
    }
}

impl TaskRunner {
    /// A runner for `activities`, running at most `max_concurrency` handlers at once.
    pub fn new(
        activities: BTreeMap<String, Arc<dyn ActivityHandler>>,
        max_concurrency: u32,
    ) -> Self {
        Self {
            activities: Arc::new(activities),
            permits: Arc::new(Semaphore::new(permits(max_concurrency))),
            size: Arc::new(std::sync::Mutex::new(max_concurrency)),
        }
    }

    /// The activity types served.
    pub fn activity_types(&self) -> impl Iterator<Item = &str> {
        self.activities.keys().map(String::as_str)
    }

    /// Changes how many handlers may run at once; running handlers keep their permits.
    pub fn resize(&self, max_concurrency: u32) {
        let Ok(mut size) = self.size.lock() else {
            return;
        };
        let (old, new) = (permits(*size), permits(max_concurrency));
        if new > old {
            self.permits.add_permits(new - old);
        } else {
            // Permits held by running handlers are forgotten as they come back.
            let mut owed = old - new;
            owed -= self.permits.forget_permits(owed);
            if owed > 0 {
                let permits = Arc::clone(&self.permits);
                tokio::spawn(async move {
                    if let Ok(taken) = permits.acquire_many_owned(owed_u32(owed)).await {
                        taken.forget();
                    }
                });
            }
        }
        *size = max_concurrency;
    }

    /// Starts `task`: the returned future waits for a permit, runs the handler, and resolves
    /// to its reply. An activity type not served here fails at once, without a permit.
    pub fn start(&self, task: ActivityTask) -> RunningTask {
        let task_id = task.task_id;
        let token = CancellationToken::new();
        let handler = self.activities.get(&task.activity_type).cloned();
        let permits = Arc::clone(&self.permits);
        let cancelled = token.clone();
        let future = async move {
            let Some(handler) = handler else {
                let error = format!("activity type {:?} is not served here", task.activity_type);
                return Some(failure(&ActivityError::fatal(error)));
            };
            if cancelled.is_cancelled() {
                return None;
            }
            // A free permit is taken at once: no wait, and no cancellation waiter to register
            // and drop again.
            let permit = match Arc::clone(&permits).try_acquire_owned() {
                Ok(permit) => Ok(permit),
                Err(_) => tokio::select! {
                    permit = permits.acquire_owned() => permit,
                    () = cancelled.cancelled() => return None,
                },
            };
            // The semaphore is never closed.
            let Ok(_permit) = permit else { return None };
            let input = task.input.clone();
            let context = ActivityContext::new(&task, cancelled);
            let run = AssertUnwindSafe(async move { handler.call(context, input).await });
            Some(match run.catch_unwind().await {
                Ok(Ok(output)) => TaskResult::Success(output),
                Ok(Err(error)) => failure(&error),
                Err(payload) => failure(&ActivityError::fatal(format!(
                    "activity handler panicked: {}",
                    panic_message(payload.as_ref())
                ))),
            })
        };
        RunningTask {
            task_id,
            token,
            future: future.boxed(),
        }
    }
}

/// The text a panic was raised with, when it was raised with text.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "a non-text payload"
    }
}

fn permits(max_concurrency: u32) -> usize {
    usize::try_from(max_concurrency)
        .unwrap_or(Semaphore::MAX_PERMITS)
        .min(Semaphore::MAX_PERMITS)
}

fn owed_u32(owed: usize) -> u32 {
    u32::try_from(owed).unwrap_or(u32::MAX)
}

fn failure(error: &ActivityError) -> TaskResult {
    TaskResult::Failure {
        message: error.message().to_owned(),
        retryable: error.is_retryable(),
    }
}

/// One started task; poll it to run it. Resolves to its result, or to a cancel-ack once
/// [`RunningTask::cancel`] was called.
pub struct RunningTask {
    task_id: TaskId,
    token: CancellationToken,
    future: BoxFuture<'static, Option<TaskResult>>,
}

impl std::fmt::Debug for RunningTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningTask")
            .field("task_id", &self.task_id)
            .field("cancelled", &self.token.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl RunningTask {
    /// The task's id.
    pub fn task_id(&self) -> TaskId {
        self.task_id
    }

    /// Fires the handler's cancellation token; the task then ends with a cancel-ack.
    pub fn cancel(&self) {
        self.token.cancel();
    }

    /// The task's cancellation token, for a transport that cancels it from elsewhere.
    pub fn canceller(&self) -> CancellationToken {
        self.token.clone()
    }
}

impl Future for RunningTask {
    type Output = TaskReply;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<TaskReply> {
        let result = std::task::ready!(self.future.poll_unpin(cx));
        let task_id = self.task_id;
        Poll::Ready(match result {
            Some(result) if !self.token.is_cancelled() => TaskReply::Result { task_id, result },
            _ => TaskReply::CancelAck { task_id },
        })
    }
}

/// What a worker sends back when a task ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskReply {
    /// The task's result.
    Result {
        /// The task.
        task_id: TaskId,
        /// Its result.
        result: TaskResult,
    },
    /// The gateway's cancel was honoured; no result follows.
    CancelAck {
        /// The task.
        task_id: TaskId,
    },
}

impl TaskReply {
    /// This reply, or, when `size` (its encoded size on the wire) exceeds the gateway's stated
    /// frame `limit`, a non-retryable failure naming both: sent as is, the gateway would end
    /// the connection.
    pub fn within_limit(self, size: usize, limit: usize) -> Self {
        match self {
            Self::Result { task_id, .. } if size > limit => {
                tracing::warn!(task = %task_id, size, limit,
                    "result too large for the gateway; failing it");
                Self::Result {
                    task_id,
                    result: TaskResult::Failure {
                        message: format!(
                            "result of {size} bytes exceeds the gateway's frame limit of \
                             {limit} bytes"
                        ),
                        retryable: false,
                    },
                }
            }
            reply => reply,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use bytes::Bytes;
    use futures::future::{BoxFuture, FutureExt};

    use super::*;

    fn task(id: u64, activity_type: &str) -> ActivityTask {
        ActivityTask {
            task_id: TaskId::from_raw(id),
            namespace: "ns".into(),
            task_queue: "q".into(),
            activity_type: activity_type.into(),
            input: Bytes::from_static(b"in"),
            attempt: 1,
            deadline: SystemTime::UNIX_EPOCH,
        }
    }

    fn runner(max_concurrency: u32) -> TaskRunner {
        let mut activities: BTreeMap<String, Arc<dyn ActivityHandler>> = BTreeMap::new();
        let echo = |_: ActivityContext, input: Bytes| async move { Ok(input) };
        let hold = |ctx: ActivityContext, _: Bytes| async move {
            ctx.cancelled().await;
            Err(ActivityError::retryable("stopped"))
        };
        let boom =
            |_: ActivityContext, _: Bytes| -> BoxFuture<'static, Result<Bytes, ActivityError>> {
                async { panic!("boom") }.boxed()
            };
        activities.insert("echo".into(), Arc::new(echo));
        activities.insert("hold".into(), Arc::new(hold));
        activities.insert("boom".into(), Arc::new(boom));
        TaskRunner::new(activities, max_concurrency)
    }

    fn success(id: u64, output: &'static [u8]) -> TaskReply {
        TaskReply::Result {
            task_id: TaskId::from_raw(id),
            result: TaskResult::Success(Bytes::from_static(output)),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_waits_for_a_permit_while_max_concurrency_handlers_run() {
        let runner = runner(1);
        let holding = tokio::spawn(runner.start(task(1, "hold")).map(|r| r));
        tokio::task::yield_now().await;
        let mut waiting = tokio::spawn(runner.start(task(2, "echo")));
        let early = tokio::time::timeout(Duration::from_secs(60), &mut waiting).await;
        assert!(early.is_err(), "the second task must wait for the permit");
        holding.abort();
        // Control: once the first handler lets go, the waiting task runs.
        assert_eq!(waiting.await.ok(), Some(success(2, b"in")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_task_answers_with_a_cancel_ack() {
        let runner = runner(1);
        let running = runner.start(task(3, "hold"));
        running.cancel();
        assert_eq!(
            running.await,
            TaskReply::CancelAck {
                task_id: TaskId::from_raw(3)
            }
        );
        // Control: an uncancelled task answers with its result.
        assert_eq!(runner.start(task(4, "echo")).await, success(4, b"in"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_cancelled_before_it_starts_never_runs_its_handler() {
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut activities: BTreeMap<String, Arc<dyn ActivityHandler>> = BTreeMap::new();
        let counted = Arc::clone(&ran);
        let count = move |_: ActivityContext, input: Bytes| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move { Ok(input) }
        };
        activities.insert("count".into(), Arc::new(count));
        let runner = TaskRunner::new(activities, 4);
        let cancelled = runner.start(task(8, "count"));
        cancelled.cancel();
        assert_eq!(
            cancelled.await,
            TaskReply::CancelAck {
                task_id: TaskId::from_raw(8)
            }
        );
        assert_eq!(
            ran.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "a permit was free"
        );
        // Control: the same task uncancelled runs its handler at once.
        assert_eq!(runner.start(task(9, "count")).await, success(9, b"in"));
        assert_eq!(ran.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_handler_becomes_a_final_failure() {
        let reply = runner(1).start(task(5, "boom")).await;
        assert_eq!(
            reply,
            TaskReply::Result {
                task_id: TaskId::from_raw(5),
                result: TaskResult::Failure {
                    message: "activity handler panicked: boom".into(),
                    retryable: false,
                },
            }
        );
        // Control: the panic released its permit, so the runner still serves.
        assert_eq!(runner(1).start(task(6, "echo")).await, success(6, b"in"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unserved_activity_type_fails_without_a_permit() {
        let runner = runner(1);
        let _holding = tokio::spawn(runner.start(task(1, "hold")));
        tokio::task::yield_now().await;
        let TaskReply::Result { result, .. } = runner.start(task(7, "nope")).await else {
            panic!("a result");
        };
        assert!(matches!(
            result,
            TaskResult::Failure {
                retryable: false,
                ..
            }
        ));
    }

    #[test]
    fn a_result_over_the_limit_becomes_a_final_failure_naming_it() {
        assert_eq!(
            success(5, b"x").within_limit(100, 100),
            success(5, b"x"),
            "control"
        );
        assert_eq!(
            success(5, b"x").within_limit(101, 100),
            TaskReply::Result {
                task_id: TaskId::from_raw(5),
                result: TaskResult::Failure {
                    message: "result of 101 bytes exceeds the gateway's frame limit of 100 bytes"
                        .into(),
                    retryable: false,
                },
            }
        );
        let ack = TaskReply::CancelAck {
            task_id: TaskId::from_raw(5),
        };
        assert_eq!(ack.clone().within_limit(usize::MAX, 0), ack, "acks pass");
    }

    #[tokio::test(start_paused = true)]
    async fn resizing_up_lets_a_waiting_task_run() {
        let runner = runner(1);
        let _holding = tokio::spawn(runner.start(task(1, "hold")));
        tokio::task::yield_now().await;
        let mut waiting = tokio::spawn(runner.start(task(2, "echo")));
        assert!(
            tokio::time::timeout(Duration::from_secs(1), &mut waiting)
                .await
                .is_err()
        );
        runner.resize(2);
        assert_eq!(waiting.await.ok(), Some(success(2, b"in")));
    }
}
