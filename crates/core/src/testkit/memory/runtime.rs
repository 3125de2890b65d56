//! The worker runtime at the far end of a memory link: answers pings itself, runs handlers,
//! stops cancelled tasks, drains, and counts what it holds.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::link::Frame;
use crate::delivery::{TaskId, WorkerMessage};
use crate::outcome::TaskResult;
use crate::testkit::handler::{Handler, TaskCall};

/// Worker-side counters, read by tests through [`super::MemoryWorker`].
#[derive(Debug, Default)]
pub(super) struct Stats {
    /// Tasks received and not yet answered.
    pub(super) held: AtomicU32,
    /// The most tasks ever held at once.
    pub(super) peak_held: AtomicU32,
    /// Tasks that arrived while the worker already held its capacity (refused, never run).
    pub(super) overcommits: AtomicU32,
}

/// What a finished handler hands back to the runtime loop.
struct Finished {
    task: TaskId,
    result: TaskResult,
    cancelled: bool,
}

/// Runs until the gateway closes the link, the worker finishes a drain, or it is aborted.
///
/// A task beyond `capacity` is answered with a retryable failure at once and counted: the
/// runtime never runs more than its capacity and never hides a gateway that over-delivers.
pub(super) async fn run(
    capacity: u32,
    handler: Handler,
    mut inbox: mpsc::Receiver<WorkerMessage>,
    outbox: mpsc::Sender<Frame>,
    frozen: CancellationToken,
    stats: Arc<Stats>,
) {
    let mut running: JoinSet<Finished> = JoinSet::new();
    let mut cancels: HashMap<TaskId, CancellationToken> = HashMap::new();
    let mut draining = false;
    loop {
        if draining && running.is_empty() {
            let _ = outbox.send(Frame::Goodbye).await;
            return;
        }
        let frame = tokio::select! {
            biased;
            () = frozen.cancelled() => {
                // Stop reading and answering, but keep both ends of the link (and the running
                // handlers) alive until the worker handle is dropped.
                std::future::pending::<()>().await;
                return;
            }
            Some(joined) = running.join_next(), if !running.is_empty() => {
                let Ok(finished) = joined else { continue };
                cancels.remove(&finished.task);
                stats.held.fetch_sub(1, Ordering::AcqRel);
                if finished.cancelled {
                    Frame::CancelAck { task: finished.task }
                } else {
                    Frame::Result { task: finished.task, result: finished.result }
                }
            }
            message = inbox.recv() => match message {
                None => return,
                Some(WorkerMessage::Ping { seq }) => Frame::Pong { seq },
                Some(WorkerMessage::Task(task)) => {
                    let held = stats.held.load(Ordering::Acquire);
                    if held >= capacity {
                        stats.overcommits.fetch_add(1, Ordering::AcqRel);
                        Frame::Result {
                            task: task.task_id,
                            result: TaskResult::Failure {
                                message: format!("worker over capacity: holds {held} of {capacity}"),
                                retryable: true,
                            },
                        }
                    } else {
                        let held = stats.held.fetch_add(1, Ordering::AcqRel) + 1;
                        stats.peak_held.fetch_max(held, Ordering::AcqRel);
                        let cancelled = CancellationToken::new();
                        cancels.insert(task.task_id, cancelled.clone());
                        let handler = handler.clone();
                        running.spawn(async move {
                            let call = TaskCall {
                                activity_type: task.activity_type,
                                input: task.input,
                                cancelled: cancelled.clone(),
                            };
                            let result = handler.call(call).await;
                            Finished { task: task.task_id, result, cancelled: cancelled.is_cancelled() }
                        });
                        continue;
                    }
                }
                Some(WorkerMessage::Cancel { task_id, .. }) => {
                    if let Some(cancelled) = cancels.get(&task_id) {
                        cancelled.cancel();
                    }
                    continue;
                }
                Some(WorkerMessage::Drain | WorkerMessage::ShuttingDown) => {
                    draining = true;
                    continue;
                }
            },
        };
        if outbox.send(frame).await.is_err() {
            return;
        }
    }
}
