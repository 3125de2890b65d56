//! The worker's side of one lane: runs the lane's task while still reading the lane, so a
//! cancel reaches the running handler and pings are answered during long tasks.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use quinn::{Connection, RecvStream, SendStream};
use switchyard_proto::v1::{
    Failure, QuicCancel, QuicCancelAck, QuicLaneDown, QuicLaneUp, QuicPing, QuicPong, QuicResult,
    QuicTask, quic_lane_down, quic_lane_up, quic_result,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Handler;
use super::unwind::CatchUnwind;
use crate::convert;
use crate::fault::{Fault, close_connection};
use crate::frame::{FrameError, FrameReader, encode_frame};
use crate::outbox::{Item, Outbox, StreamOut};
use crate::protocol::ErrorCode;
use switchyard_core::{ActivityContext, ActivityError, ActivityFuture};

/// What every lane of a session shares.
pub(crate) struct LaneContext {
    /// The connection's writer, shared by its lanes.
    pub(crate) outbox: Outbox,
    /// The registration the lanes belong to, for logs.
    pub(crate) worker: switchyard_core::WorkerId,
    pub(crate) handlers: Arc<HashMap<String, Handler>>,
    /// The gateway's `max_lane_frame_bytes`, in force in both directions.
    pub(crate) frame_limit: u32,
}

/// The lane's task, while it runs.
struct Running {
    task_id: u64,
    cancellation: CancellationToken,
    cancelled: bool,
    future: CatchUnwind<ActivityFuture>,
}

/// Serves a lane the gateway opened, on its own task, until the gateway retires it, the
/// connection ends, or `stop` fires (the session was dropped: the lane lets go of the
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
    let mut running: Option<Running> = None;
    loop {
        let up = tokio::select! {
            down = frames.next::<QuicLaneDown>() => {
                let down = down.map_err(|error| Fault::read(error, &name))?;
                let Some(down) = down else {
                    if let Some(task) = &running {
                        // The gateway finishes a busy lane only right before it closes the
                        // connection: nobody will take the task's result any more.
                        tracing::debug!(task = task.task_id, "{name} finished while its task ran: the gateway is closing");
                        task.cancellation.cancel();
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
                                format!("task {} arrived on {name} while task {} ran on it", task.task_id, busy.task_id),
                            ));
                        }
                        running = Some(start(task, context));
                        None
                    }
                    Some(quic_lane_down::Frame::Ping(QuicPing { seq })) => {
                        Some(quic_lane_up::Frame::Pong(QuicPong { seq }))
                    }
                    Some(quic_lane_down::Frame::Cancel(QuicCancel { task_id, .. })) => {
                        // A cancel for a task that already ended crossed its result: nothing to do.
                        if let Some(task) = running.as_mut().filter(|t| t.task_id == task_id) {
                            task.cancelled = true;
                            task.cancellation.cancel();
                        }
                        None
                    }
                    None => return Err(Fault::empty(&name)),
                }
            }
            outcome = run(&mut running), if running.is_some() => {
                running.take().map(|task| ending(task, outcome))
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
async fn run(running: &mut Option<Running>) -> Result<Result<Bytes, ActivityError>, String> {
    match running {
        Some(task) => (&mut task.future).await,
        None => std::future::pending().await,
    }
}

fn start(task: QuicTask, context: &LaneContext) -> Running {
    let cancellation = CancellationToken::new();
    let activity = ActivityContext::new(
        &switchyard_core::ActivityTask {
            task_id: switchyard_core::TaskId::from_raw(task.task_id),
            namespace: task.namespace,
            task_queue: task.task_queue,
            activity_type: task.activity_type,
            input: task.input.clone(),
            attempt: task.attempt,
            deadline: convert::from_unix_ms(task.deadline_unix_ms),
        },
        cancellation.clone(),
    );
    let future: ActivityFuture = match context.handlers.get(activity.activity_type()) {
        Some(handler) => handler.call(activity, task.input),
        None => {
            let error = ActivityError::fatal(format!(
                "activity type {:?} is not served by this worker",
                activity.activity_type()
            ));
            Box::pin(std::future::ready(Err(error)))
        }
    };
    Running {
        task_id: task.task_id,
        cancellation,
        cancelled: false,
        future: CatchUnwind(future),
    }
}

/// The frame that ends a task: an acknowledgement once cancelled, else its result.
fn ending(
    task: Running,
    outcome: Result<Result<Bytes, ActivityError>, String>,
) -> quic_lane_up::Frame {
    if task.cancelled {
        return quic_lane_up::Frame::CancelAck(QuicCancelAck {
            task_id: task.task_id,
        });
    }
    let outcome = match outcome {
        Ok(Ok(output)) => quic_result::Outcome::Output(output),
        Ok(Err(error)) => quic_result::Outcome::Failure(Failure {
            message: error.message().to_owned(),
            retryable: error.is_retryable(),
        }),
        Err(panic) => quic_result::Outcome::Failure(Failure {
            message: format!("activity panicked: {panic}"),
            retryable: false,
        }),
    };
    quic_lane_up::Frame::Result(QuicResult {
        task_id: task.task_id,
        outcome: Some(outcome),
    })
}

/// Encodes an answer; an output too large for the gateway becomes a failure saying so.
fn encode_up(up: quic_lane_up::Frame, limit: u32) -> Result<Bytes, Fault> {
    let task_id = match &up {
        quic_lane_up::Frame::Result(result) => Some(result.task_id),
        _ => None,
    };
    match (
        encode_frame(&QuicLaneUp { frame: Some(up) }, limit),
        task_id,
    ) {
        (Ok(frame), _) => Ok(frame),
        (Err(FrameError::TooLarge { len, max }), Some(task_id)) => {
            let failure = QuicLaneUp {
                frame: Some(quic_lane_up::Frame::Result(QuicResult {
                    task_id,
                    outcome: Some(quic_result::Outcome::Failure(Failure {
                        message: format!(
                            "result of {len} bytes exceeds the gateway's lane frame limit of {max} bytes"
                        ),
                        retryable: false,
                    })),
                })),
            };
            encode_frame(&failure, limit)
                .map_err(|error| Fault::close(ErrorCode::Internal, error.to_string()))
        }
        (Err(error), _) => Err(Fault::close(ErrorCode::Internal, error.to_string())),
    }
}
