//! One registered stream on the worker side: run tasks, answer pings, honour cancels and drain.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use switchyard_core::TaskResult;
use switchyard_proto::v1::{
    self, ActivityResult, CancelAck, Failure, Pong, WorkerFrame, activity_result,
    gateway_frame::Frame, worker_frame,
};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::WorkerSettings;
use super::link::Link;
use crate::wire;
use switchyard_core::{ActivityContext, ActivityError};

/// How a stream's session ended.
pub(crate) enum SessionEnd {
    /// The gateway asked for a drain; every task was reported and the stream closed.
    Drained,
    /// The embedder stopped the worker.
    Stopped,
    /// The stream broke or the gateway ended it; the worker should reconnect.
    Lost(String),
}

/// A handler's end: `None` when the task was cancelled before it started.
type Finished = (u64, Option<TaskResult>);

/// Serves one registered stream until it ends.
///
/// Handlers run on their own tasks, each holding a permit of `permits` (shared by every stream
/// of the worker, so handlers left over from a lost stream still count against
/// `max_concurrency` until they stop). Results travel back through this loop, which therefore
/// knows when a drain is complete.
pub(crate) async fn serve(
    link: Link,
    settings: &Arc<WorkerSettings>,
    permits: &Arc<Semaphore>,
    stop: &CancellationToken,
) -> SessionEnd {
    let Link {
        ack,
        outbound,
        mut inbound,
    } = link;
    let mut session = Session {
        settings,
        permits,
        outbound,
        running: HashMap::new(),
        handlers: JoinSet::new(),
    };
    let mut draining = false;
    let end = loop {
        if draining && session.handlers.is_empty() {
            break None;
        }
        tokio::select! {
            () = stop.cancelled() => break Some(SessionEnd::Stopped),
            frame = inbound.message() => match frame {
                Ok(Some(frame)) => match frame.frame {
                    Some(Frame::Task(task)) => session.start(task),
                    Some(Frame::Ping(ping)) => {
                        if !session.send(worker_frame::Frame::Pong(Pong { seq: ping.seq })).await {
                            break Some(SessionEnd::Lost("outbound stream closed".into()));
                        }
                    }
                    Some(Frame::Cancel(cancel)) => {
                        tracing::debug!(task = cancel.task_id, reason = ?cancel.reason(),
                            "task cancelled by the gateway");
                        if let Some(token) = session.running.get(&cancel.task_id) {
                            token.cancel();
                        }
                    }
                    Some(Frame::Drain(_)) => {
                        tracing::info!(worker = ack.worker_id, in_flight = session.handlers.len(),
                            "drain requested; finishing in-flight tasks");
                        draining = true;
                    }
                    Some(Frame::RegisterAck(_)) | None => {
                        tracing::debug!("ignoring an unexpected gateway frame");
                    }
                },
                Ok(None) => break Some(SessionEnd::Lost("gateway closed the stream".into())),
                Err(status) => break Some(SessionEnd::Lost(format!(
                    "stream ended ({}): {}", status.code(), status.message()))),
            },
            Some(joined) = session.handlers.join_next(), if !session.handlers.is_empty() => {
                // Handlers never panic out (they are caught) and are aborted only with the
                // set, so a join error cannot happen while the set is alive.
                let Ok(finished) = joined else { continue };
                if !session.report(finished).await {
                    break Some(SessionEnd::Lost("outbound stream closed".into()));
                }
            }
        }
    };
    if let Some(end) = end {
        session.abandon();
        return end;
    }
    // Half-close, then let the gateway end the stream after it deregisters the worker.
    drop(session);
    let closing = async { while let Ok(Some(_)) = inbound.message().await {} };
    if tokio::time::timeout(settings.keepalive_timeout, closing)
        .await
        .is_err()
    {
        tracing::debug!("gateway kept the stream open after the drain; closing it");
    }
    tracing::info!(worker = ack.worker_id, "drained");
    SessionEnd::Drained
}

struct Session<'a> {
    settings: &'a Arc<WorkerSettings>,
    permits: &'a Arc<Semaphore>,
    outbound: mpsc::Sender<WorkerFrame>,
    /// Cancellation of each task not yet reported.
    running: HashMap<u64, CancellationToken>,
    handlers: JoinSet<Finished>,
}

impl Session<'_> {
    fn start(&mut self, task: v1::ActivityTask) {
        let task = wire::activity_task(task);
        let id = task.task_id.get();
        let token = CancellationToken::new();
        self.running.insert(id, token.clone());
        let handler = self.settings.activities.get(&task.activity_type).cloned();
        let permits = Arc::clone(self.permits);
        self.handlers.spawn(async move {
            let Some(handler) = handler else {
                let error = format!("activity type {:?} is not served here", task.activity_type);
                return (id, Some(failure(&ActivityError::fatal(error))));
            };
            let permit = tokio::select! {
                permit = permits.acquire_owned() => permit,
                () = token.cancelled() => return (id, None),
            };
            // The semaphore is never closed.
            let Ok(_permit) = permit else {
                return (id, None);
            };
            let input = task.input.clone();
            let context = ActivityContext::new(&task, token);
            let run = AssertUnwindSafe(async move { handler.call(context, input).await });
            let result = match run.catch_unwind().await {
                Ok(Ok(output)) => TaskResult::Success(output),
                Ok(Err(error)) => failure(&error),
                Err(_) => failure(&ActivityError::fatal("activity handler panicked")),
            };
            (id, Some(result))
        });
    }

    /// Sends a finished task's result, or its cancel acknowledgement if the gateway cancelled
    /// it. Returns false when the stream is gone.
    async fn report(&mut self, (id, result): Finished) -> bool {
        let cancelled = self.running.remove(&id).is_some_and(|t| t.is_cancelled());
        let frame = match result {
            Some(result) if !cancelled => worker_frame::Frame::Result(ActivityResult {
                task_id: id,
                outcome: Some(match result {
                    TaskResult::Success(output) => activity_result::Outcome::Output(output),
                    TaskResult::Failure { message, retryable } => {
                        activity_result::Outcome::Failure(Failure { message, retryable })
                    }
                }),
            }),
            _ => worker_frame::Frame::CancelAck(CancelAck { task_id: id }),
        };
        self.send(frame).await
    }

    async fn send(&self, frame: worker_frame::Frame) -> bool {
        self.outbound
            .send(WorkerFrame { frame: Some(frame) })
            .await
            .is_ok()
    }

    /// The stream is gone: its tasks go back to the gateway, so stop their handlers.
    fn abandon(&mut self) {
        for token in self.running.values() {
            token.cancel();
        }
        self.handlers.abort_all();
    }
}

fn failure(error: &ActivityError) -> TaskResult {
    TaskResult::Failure {
        message: error.message().to_owned(),
        retryable: error.is_retryable(),
    }
}
