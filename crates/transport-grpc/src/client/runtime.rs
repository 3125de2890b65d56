//! One registered stream on the worker side: run tasks, answer pings, honour cancels and drain.

use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use prost::Message;
use switchyard_core::{ActivityTask, TaskId, TaskResult};
use switchyard_proto::v1::{
    self, ActivityResult, CancelAck, CapacityUpdate, Failure, Pong, WorkerDrainRequest,
    WorkerFrame, activity_result, drain_request, gateway_frame::Frame, worker_frame,
};
use switchyard_worker::{ConnectionContext, ConnectionEnd, ReplySink, TaskReply, TaskStarter};
use tokio::sync::mpsc;

use super::DialConfig;
use super::link::{GrpcLinkError, Stream};
use crate::wire;

/// Serves one registered stream until it ends.
///
/// Tasks go to the worker's [`TaskKeeper`](switchyard_worker::TaskKeeper), which runs each
/// handler under the runner's permit and outlives the stream: after a lost stream the runtime
/// resumes the session (the handlers keep running) or lets them go. A handler runs on a
/// runtime task of its own, or, with [`inline_handlers`](super::GrpcWorkerBuilder::inline_handlers),
/// on this loop up to its first wait ([`start`]) and on a task of its own from there. A reply
/// goes onto the stream from
/// the task that finished while the stream has room (the keeper's sink), else through this
/// loop; during a drain every reply comes through this loop, which therefore knows when the
/// drain is complete.
pub(crate) async fn serve(
    stream: Stream,
    settings: &DialConfig,
    context: ConnectionContext<'_>,
) -> ConnectionEnd<GrpcLinkError> {
    let Stream {
        ack,
        outbound,
        mut inbound,
    } = stream;
    let keeper = context.keeper;
    let starter = keeper.starter();
    let serving = Serving {
        outbound,
        max_frame_bytes: frame_limit(&ack, settings),
    };
    let mut sink = Some(keeper.install_sink(Arc::new(StreamReplies {
        outbound: serving.outbound.clone(),
        max_frame_bytes: serving.max_frame_bytes,
    })));
    let lost = |reason: &str| ConnectionEnd::ComeBack {
        reason: reason.to_owned(),
        shutting_down: false,
    };
    let mut draining: Option<ConnectionEnd<GrpcLinkError>> = None;
    // Both waits are made once, outside the frame loop: the loop turns once per frame, and a
    // fresh `cancelled()` or `changed()` each turn costs a lock and a waiter registration.
    let drain_requested = context.handle.drain_requested().clone().cancelled_owned();
    tokio::pin!(drain_requested);
    let mut drain_sent = false;
    let capacity = context.handle.capacity();
    // A resize made while disconnected (or before this stream) is announced first.
    let current = *capacity.borrow();
    let mut announce = (current != context.options.max_concurrency).then_some(current);
    let resized = futures::stream::unfold(capacity, |mut capacity| async move {
        capacity.changed().await.ok()?;
        let max_concurrency = *capacity.borrow_and_update();
        Some((max_concurrency, capacity))
    })
    .fuse();
    tokio::pin!(resized);
    let end = loop {
        if let Some(max_concurrency) = announce.take() {
            tracing::debug!(
                worker = ack.worker_id,
                max_concurrency,
                "announcing capacity"
            );
            let update = worker_frame::Frame::Capacity(CapacityUpdate { max_concurrency });
            if !serving.send(update).await {
                break Some(lost("outbound stream closed"));
            }
        }
        if draining.is_some() && keeper.is_idle() {
            break None;
        }
        tokio::select! {
            // Replies first, then frames, stopping at the first ready branch: a turn taken for
            // either polls nothing else. Neither starves the other: the gateway sends no more
            // tasks than the capacity before their replies went out.
            biased;
            reply = keeper.next_reply() => {
                // The replies that finished meanwhile go in the same turn, instead of one
                // wake-up of this loop each.
                let mut next = Some(reply);
                let mut sent = true;
                while let Some(reply) = next {
                    sent = serving.report(reply).await;
                    next = if sent { keeper.try_next_reply() } else { None };
                }
                if !sent {
                    break Some(lost("outbound stream closed"));
                }
            }
            frame = inbound.message() => match frame {
                Ok(Some(frame)) => match frame.frame {
                    Some(Frame::Task(task)) if settings.inline_handlers => {
                        start(&starter, wire::activity_task(task));
                    }
                    Some(Frame::Task(task)) => keeper.start(wire::activity_task(task)),
                    Some(Frame::Ping(ping)) => {
                        if !serving.send(worker_frame::Frame::Pong(Pong { seq: ping.seq })).await {
                            break Some(lost("outbound stream closed"));
                        }
                    }
                    Some(Frame::Cancel(cancel)) => {
                        tracing::debug!(task = cancel.task_id, reason = ?cancel.reason(),
                            "task cancelled by the gateway");
                        keeper.cancel(TaskId::from_raw(cancel.task_id));
                    }
                    Some(Frame::ResultsAck(ack)) => {
                        keeper.acknowledged(ack.task_ids.into_iter().map(TaskId::from_raw));
                    }
                    Some(Frame::Drain(drain)) => {
                        // From now on every reply wakes this loop, which sees the last one.
                        sink = None;
                        let in_flight = keeper.held();
                        draining = Some(match drain.reason() {
                            drain_request::Reason::ShuttingDown => {
                                tracing::info!(worker = ack.worker_id, in_flight,
                                    "the gateway is shutting down; finishing in-flight tasks, \
                                     then reconnecting");
                                ConnectionEnd::ComeBack {
                                    reason: "the gateway is shutting down".into(),
                                    shutting_down: true,
                                }
                            }
                            drain_request::Reason::Requested
                            | drain_request::Reason::Unspecified => {
                                tracing::info!(worker = ack.worker_id, in_flight,
                                    "drain requested; finishing in-flight tasks, then leaving");
                                ConnectionEnd::Drained
                            }
                        });
                    }
                    Some(Frame::RegisterAck(_)) | None => {
                        tracing::debug!("ignoring an unexpected gateway frame");
                    }
                },
                Ok(None) => break Some(lost("gateway closed the stream")),
                Err(status) if draining.is_some() => {
                    // The gateway gave up waiting (its shutdown grace ended): what is still
                    // running goes back to it, so stop it.
                    tracing::info!(code = %status.code(), message = status.message(),
                        "the gateway ended the stream during the drain");
                    break draining.take();
                }
                Err(status) => break Some(match GrpcLinkError::from_status(status) {
                    // The gate refused something this worker sent (a capacity update): sending
                    // it again unchanged would be refused again.
                    refused @ GrpcLinkError::Refused(_) => ConnectionEnd::Failed(refused),
                    GrpcLinkError::Stream(status) => lost(&format!(
                        "stream ended ({}): {}", status.code(), status.message())),
                    other => ConnectionEnd::Failed(other),
                }),
            },
            () = &mut drain_requested, if !drain_sent => {
                drain_sent = true;
                tracing::info!(worker = ack.worker_id, "asking the gateway to drain this worker");
                let request = worker_frame::Frame::DrainRequest(WorkerDrainRequest {});
                if !serving.send(request).await {
                    break Some(lost("outbound stream closed"));
                }
            }
            Some(max_concurrency) = resized.next() => announce = Some(max_concurrency),
        }
    };
    if let Some(end) = end {
        // The runtime decides whether the tasks outlive the stream (a session) or go.
        return end;
    }
    // Half-close (no sender of the stream may be left), then let the gateway end the stream
    // after it deregisters the worker.
    drop(sink);
    drop(serving);
    let closing = async { while let Ok(Some(_)) = inbound.message().await {} };
    if tokio::time::timeout(settings.keepalive_timeout, closing)
        .await
        .is_err()
    {
        tracing::debug!("gateway kept the stream open after the drain; closing it");
    }
    tracing::info!(worker = ack.worker_id, "drained");
    draining.unwrap_or(ConnectionEnd::Drained)
}

/// Starts `task`, running its handler here up to its first wait: a handler that answers at
/// once (an echo, a cached answer) then costs no runtime task and no wake-up of its own, and
/// its reply goes out through the keeper's sink before the next frame is read. One that waits
/// goes on on a runtime task of its own, as every handler did before; only its first step
/// (up to its first `.await` that is not ready) runs on the reader.
fn start(starter: &TaskStarter, task: ActivityTask) {
    // `None`: the task is already held, and is not started twice.
    if let Some(mut inline) = starter.start_inline(task) {
        // Polled once with a no-op waker; dropped unfinished, it moves onto a runtime task,
        // which polls it again with a waker of its own.
        let _finished = (&mut inline).now_or_never();
    }
}

/// The largest frame the worker sends: the gateway's stated limit, within the worker's own.
fn frame_limit(ack: &v1::RegisterAck, settings: &DialConfig) -> usize {
    let stated = usize::try_from(ack.max_worker_frame_bytes).unwrap_or(usize::MAX);
    // 0: a gateway that states no limit.
    match stated {
        0 => settings.max_message_bytes,
        stated => stated.min(settings.max_message_bytes),
    }
}

struct Serving {
    outbound: mpsc::Sender<WorkerFrame>,
    /// Largest encoded frame the gateway accepts on this stream.
    max_frame_bytes: usize,
}

impl Serving {
    /// Sends a finished task's result, or its cancel acknowledgement. Returns false when the
    /// stream is gone.
    async fn report(&self, reply: TaskReply) -> bool {
        let frame = reply_frame(reply, self.max_frame_bytes);
        self.outbound.send(frame).await.is_ok()
    }

    async fn send(&self, frame: worker_frame::Frame) -> bool {
        self.outbound
            .send(WorkerFrame { frame: Some(frame) })
            .await
            .is_ok()
    }
}

/// The stream's [`ReplySink`]: puts a finished task's reply on the stream from the task itself
/// while the stream has room; a full stream leaves it to the loop, which waits for room.
struct StreamReplies {
    outbound: mpsc::Sender<WorkerFrame>,
    max_frame_bytes: usize,
}

impl ReplySink for StreamReplies {
    fn try_write(&self, reply: &TaskReply) -> bool {
        let frame = reply_frame(reply.clone(), self.max_frame_bytes);
        self.outbound.try_send(frame).is_ok()
    }
}

/// The frame of a finished task's reply; a result too large for the gateway becomes the
/// runtime's failure saying so.
fn reply_frame(reply: TaskReply, max_frame_bytes: usize) -> WorkerFrame {
    let size = WorkerFrame {
        frame: Some(frame(reply.clone())),
    }
    .encoded_len();
    let reply = reply.within_limit(size, max_frame_bytes);
    WorkerFrame {
        frame: Some(frame(reply)),
    }
}

/// The wire frame of a reply.
fn frame(reply: TaskReply) -> worker_frame::Frame {
    match reply {
        TaskReply::Result { task_id, result } => worker_frame::Frame::Result(ActivityResult {
            task_id: task_id.get(),
            outcome: Some(match result {
                TaskResult::Success(output) => activity_result::Outcome::Output(output),
                TaskResult::Failure { message, retryable } => {
                    activity_result::Outcome::Failure(Failure { message, retryable })
                }
            }),
        }),
        TaskReply::CancelAck { task_id } => worker_frame::Frame::CancelAck(CancelAck {
            task_id: task_id.get(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::{Duration, SystemTime};

    use bytes::Bytes;
    use switchyard_core::{ActivityContext, ActivityHandler};
    use switchyard_worker::{TaskKeeper, TaskRunner};

    use super::*;

    fn keeper() -> TaskKeeper {
        let mut activities: BTreeMap<String, Arc<dyn ActivityHandler>> = BTreeMap::new();
        let echo = |_: ActivityContext, input: Bytes| async move { Ok(input) };
        let slow = |_: ActivityContext, input: Bytes| async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(input)
        };
        activities.insert("echo".into(), Arc::new(echo));
        activities.insert("slow".into(), Arc::new(slow));
        TaskKeeper::new(TaskRunner::new(activities, 4))
    }

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

    fn result(id: u64) -> Option<TaskReply> {
        Some(TaskReply::Result {
            task_id: TaskId::from_raw(id),
            result: TaskResult::Success(Bytes::from_static(b"in")),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_that_answers_at_once_answers_before_the_reader_goes_on() {
        let keeper = keeper();
        start(&keeper.starter(), task(1, "echo"));
        assert_eq!(
            keeper.try_next_reply(),
            result(1),
            "no runtime task had to run"
        );
        assert!(keeper.is_idle());
        // Control: started on a runtime task of its own, the same handler has not answered
        // until that task runs.
        keeper.start(task(2, "echo"));
        assert_eq!(keeper.try_next_reply(), None);
        tokio::task::yield_now().await;
        assert_eq!(keeper.try_next_reply(), result(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_that_waits_goes_on_without_its_reader() {
        let keeper = keeper();
        start(&keeper.starter(), task(3, "slow"));
        assert_eq!(keeper.try_next_reply(), None, "still waiting");
        assert_eq!(keeper.held(), 1);
        // Nobody polls the reader's copy again: the handler finishes on its own task.
        let reply = tokio::time::timeout(Duration::from_secs(5), keeper.next_reply()).await;
        assert_eq!(reply.ok(), result(3));
    }
}
