//! The worker's side of one lane: runs the lane's task while still reading the lane, so a
//! cancel reaches the running handler and pings are answered during long tasks.

use std::sync::Arc;

use bytes::Bytes;
use prost::Message;
use quinn::{Connection, RecvStream, SendStream};
use switchyard_core::TaskResult;
use switchyard_proto::v1::{
    Failure, QuicCancel, QuicCancelAck, QuicLaneDown, QuicLaneUp, QuicPing, QuicPong, QuicResult,
    QuicTask, quic_lane_down, quic_lane_up, quic_result,
};
use switchyard_worker::{RunningTask, TaskReply, TaskRunner};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::convert;
use crate::fault::{Fault, close_connection};
use crate::frame::{FrameReader, encode_frame};
use crate::outbox::{Item, Outbox, StreamOut};
use crate::protocol::ErrorCode;

/// What every lane of a connection shares.
pub(crate) struct LaneContext {
    /// The connection's writer, shared by its lanes.
    pub(crate) outbox: Outbox,
    /// The registration the lanes belong to, for logs.
    pub(crate) worker: switchyard_core::WorkerId,
    /// Runs the lanes' tasks under the worker's permits.
    pub(crate) runner: TaskRunner,
    /// The gateway's `max_lane_frame_bytes`, in force in both directions.
    pub(crate) frame_limit: u32,
}

/// Serves a lane the gateway opened, on its own task, until the gateway retires it, the
/// connection ends, or `stop` fires (the connection was dropped: the lane lets go of the
/// connection so that dropping a worker closes it).
pub(crate) fn spawn(
    conn: Connection,
    send: SendStream,
    recv: RecvStream,
    context: Arc<LaneContext>,
    stop: CancellationToken,
) {
    let lane = send.id().index();
    let context_worker = context.worker;
    tokio::spawn(
        async move {
            let served = tokio::select! {
                served = serve(send, recv, &context) => served,
                () = stop.cancelled() => Err(Fault::Gone),
            };
            match served {
                Ok(()) | Err(Fault::Gone) => tracing::trace!("lane ended"),
                Err(Fault::Close { code, reason }) => {
                    tracing::warn!(%code, %reason, "closing the gateway connection");
                    close_connection(&conn, code, &reason);
                }
            }
        }
        .instrument(tracing::debug_span!("lane", worker = %context_worker, lane)),
    );
}

struct LaneName(u64);

impl std::fmt::Display for LaneName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "lane {}", self.0)
    }
}

async fn serve(send: SendStream, recv: RecvStream, context: &LaneContext) -> Result<(), Fault> {
    let name = LaneName(send.id().index());
    let out = StreamOut::new(send);
    let mut frames = FrameReader::new(recv, context.frame_limit);
    let mut running: Option<RunningTask> = None;
    loop {
        let up = tokio::select! {
            down = frames.next::<QuicLaneDown>() => {
                let down = down.map_err(|error| Fault::read(error, &name))?;
                let Some(down) = down else {
                    if let Some(task) = &running {
                        // The gateway finishes a busy lane only right before it closes the
                        // connection: nobody will take the task's result any more.
                        tracing::debug!(task = %task.task_id(), "{name} finished while its task ran: the gateway is closing");
                        task.cancel();
                    }
                    // Retired: answer the gateway's FIN with ours.
                    context.outbox.push(&out, Item::Finish);
                    return Ok(());
                };
                match down.frame {
                    Some(quic_lane_down::Frame::Task(task)) => {
                        if let Some(busy) = &running {
                            return Err(Fault::close(
                                ErrorCode::ProtocolViolation,
                                format!("task {} arrived on {name} while task {} ran on it", task.task_id, busy.task_id()),
                            ));
                        }
                        running = Some(context.runner.start(activity_task(task)));
                        None
                    }
                    Some(quic_lane_down::Frame::Ping(QuicPing { seq })) => Some(Reply::Pong(seq)),
                    Some(quic_lane_down::Frame::Cancel(QuicCancel { task_id, .. })) => {
                        // A cancel for a task that already ended crossed its result: nothing to do.
                        if let Some(task) = running.as_ref().filter(|t| t.task_id().get() == task_id) {
                            task.cancel();
                        }
                        None
                    }
                    None => return Err(Fault::empty(&name)),
                }
            }
            reply = run(&mut running), if running.is_some() => {
                running = None;
                Some(reply)
            }
        };
        if let Some(up) = up {
            let frame = encode_up(up, context.frame_limit)?;
            if !context.outbox.push(&out, Item::Frame(frame)) {
                return Err(Fault::Gone);
            }
        }
    }
}

/// Runs the lane's task to its end; never resolves while there is none.
async fn run(running: &mut Option<RunningTask>) -> Reply {
    match running {
        Some(task) => Reply::Task(task.await),
        None => std::future::pending().await,
    }
}

/// What the lane sends up.
enum Reply {
    /// A pong.
    Pong(u64),
    /// A task's end.
    Task(TaskReply),
}

fn activity_task(task: QuicTask) -> switchyard_core::ActivityTask {
    switchyard_core::ActivityTask {
        task_id: switchyard_core::TaskId::from_raw(task.task_id),
        namespace: task.namespace,
        task_queue: task.task_queue,
        activity_type: task.activity_type,
        input: task.input,
        attempt: task.attempt,
        deadline: convert::from_unix_ms(task.deadline_unix_ms),
    }
}

/// The wire frame of a reply.
fn frame(reply: Reply) -> QuicLaneUp {
    let frame = match reply {
        Reply::Pong(seq) => quic_lane_up::Frame::Pong(QuicPong { seq }),
        Reply::Task(TaskReply::CancelAck { task_id }) => {
            quic_lane_up::Frame::CancelAck(QuicCancelAck {
                task_id: task_id.get(),
            })
        }
        Reply::Task(TaskReply::Result { task_id, result }) => {
            quic_lane_up::Frame::Result(QuicResult {
                task_id: task_id.get(),
                outcome: Some(match result {
                    TaskResult::Success(output) => quic_result::Outcome::Output(output),
                    TaskResult::Failure { message, retryable } => {
                        quic_result::Outcome::Failure(Failure { message, retryable })
                    }
                }),
            })
        }
    };
    QuicLaneUp { frame: Some(frame) }
}

/// Encodes a reply; a result too large for the gateway becomes the runtime's failure saying so.
fn encode_up(reply: Reply, limit: u32) -> Result<Bytes, Fault> {
    let reply = match reply {
        Reply::Task(task) => {
            let size = frame(Reply::Task(task.clone())).encoded_len();
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            Reply::Task(task.within_limit(size, limit))
        }
        pong => pong,
    };
    encode_frame(&frame(reply), limit)
        .map_err(|error| Fault::close(ErrorCode::Internal, error.to_string()))
}
