//! One registered stream on the worker side: run tasks, answer pings, honour cancels and drain.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use prost::Message;
use switchyard_core::TaskResult;
use switchyard_proto::v1::{
    self, ActivityResult, CancelAck, Failure, Pong, WorkerFrame, activity_result, drain_request,
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
    /// The gateway asked for a final drain; every task was reported and the stream closed.
    Drained,
    /// The gateway is shutting down; every task was reported. Reconnect later.
    ShuttingDown,
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
        max_frame_bytes: frame_limit(&ack, settings),
        running: HashMap::new(),
        handlers: JoinSet::new(),
    };
    let mut draining: Option<SessionEnd> = None;
    let end = loop {
        if draining.is_some() && session.handlers.is_empty() {
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
                    Some(Frame::Drain(drain)) => {
                        let in_flight = session.handlers.len();
                        draining = Some(match drain.reason() {
                            drain_request::Reason::ShuttingDown => {
                                tracing::info!(worker = ack.worker_id, in_flight,
                                    "the gateway is shutting down; finishing in-flight tasks, \
                                     then reconnecting");
                                SessionEnd::ShuttingDown
                            }
                            drain_request::Reason::Requested
                            | drain_request::Reason::Unspecified => {
                                tracing::info!(worker = ack.worker_id, in_flight,
                                    "drain requested; finishing in-flight tasks, then leaving");
                                SessionEnd::Drained
                            }
                        });
                    }
                    Some(Frame::RegisterAck(_)) | None => {
                        tracing::debug!("ignoring an unexpected gateway frame");
                    }
                },
                Ok(None) => break Some(SessionEnd::Lost("gateway closed the stream".into())),
                Err(status) if draining.is_some() => {
                    // The gateway gave up waiting (its shutdown grace ended): what is still
                    // running goes back to it, so stop it.
                    tracing::info!(code = %status.code(), message = status.message(),
                        "the gateway ended the stream during the drain");
                    break draining.take();
                }
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
    draining.unwrap_or(SessionEnd::Drained)
}

/// The largest frame the worker sends: the gateway's stated limit, within the worker's own.
fn frame_limit(ack: &v1::RegisterAck, settings: &WorkerSettings) -> usize {
    let stated = usize::try_from(ack.max_worker_frame_bytes).unwrap_or(usize::MAX);
    // 0: a gateway that states no limit.
    match stated {
        0 => settings.max_message_bytes,
        stated => stated.min(settings.max_message_bytes),
    }
}

struct Session<'a> {
    settings: &'a Arc<WorkerSettings>,
    permits: &'a Arc<Semaphore>,
    outbound: mpsc::Sender<WorkerFrame>,
    /// Largest encoded frame the gateway accepts on this stream.
    max_frame_bytes: usize,
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
        self.send(within_limit(frame, self.max_frame_bytes)).await
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

/// `frame`, or when it is a result too large for the gateway, a non-retryable failure saying
/// so: sent as is, it would end the stream with RESOURCE_EXHAUSTED.
fn within_limit(frame: worker_frame::Frame, limit: usize) -> worker_frame::Frame {
    let worker_frame::Frame::Result(result) = &frame else {
        return frame;
    };
    let size = WorkerFrame {
        frame: Some(frame.clone()),
    }
    .encoded_len();
    if size <= limit {
        return frame;
    }
    tracing::warn!(
        task = result.task_id,
        size,
        limit,
        "result too large for the gateway; failing it"
    );
    worker_frame::Frame::Result(ActivityResult {
        task_id: result.task_id,
        outcome: Some(activity_result::Outcome::Failure(Failure {
            message: format!(
                "result of {size} bytes exceeds the gateway's frame limit of {limit} bytes"
            ),
            retryable: false,
        })),
    })
}

fn failure(error: &ActivityError) -> TaskResult {
    TaskResult::Failure {
        message: error.message().to_owned(),
        retryable: error.is_retryable(),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn output(task_id: u64, len: usize) -> worker_frame::Frame {
        worker_frame::Frame::Result(ActivityResult {
            task_id,
            outcome: Some(activity_result::Outcome::Output(Bytes::from(vec![1; len]))),
        })
    }

    #[test]
    fn a_result_over_the_limit_becomes_a_final_failure_naming_it() {
        let fits = WorkerFrame {
            frame: Some(output(5, 100)),
        }
        .encoded_len();
        assert_eq!(
            within_limit(output(5, 100), fits),
            output(5, 100),
            "control"
        );
        let worker_frame::Frame::Result(result) = within_limit(output(5, 101), fits) else {
            panic!("still a result");
        };
        assert_eq!(result.task_id, 5);
        let Some(activity_result::Outcome::Failure(failure)) = result.outcome else {
            panic!("a failure");
        };
        assert!(!failure.retryable);
        assert_eq!(
            failure.message,
            format!(
                "result of {} bytes exceeds the gateway's frame limit of {fits} bytes",
                fits + 1
            )
        );
    }

    #[test]
    fn other_frames_pass_whatever_their_size() {
        let pong = worker_frame::Frame::Pong(Pong { seq: 1 });
        assert_eq!(within_limit(pong.clone(), 0), pong);
    }
}
