//! The worker's side of one lane: runs the lane's task while still reading the lane, so a
//! cancel reaches the running handler and pings are answered during long tasks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use prost::Message;
use quinn::{Connection, RecvStream, SendStream};
use switchyard_core::TaskResult;
use switchyard_proto::v1::{
    Failure, QuicCancel, QuicCancelAck, QuicDatagramDown, QuicDatagramUp, QuicLaneDown, QuicLaneUp,
    QuicPing, QuicPong, QuicResult, QuicTask, quic_lane_down, quic_lane_up, quic_result,
};
use switchyard_worker::{RunningTask, TaskReply, TaskRunner};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::convert;
use crate::fault::{Fault, close_connection};
use crate::frame::{FrameReader, decode, encode_frame};
use crate::outbox::{Item, Outbox, StreamOut};
use crate::protocol::ErrorCode;
use crate::redundancy::{CopyVerdict, LaneCopies, RedundancyCounters};

/// Datagram copies waiting for their lane's task to take them; more are dropped (the lane
/// copy still brings the task).
const COPY_QUEUE: usize = 4;

/// A task copy that arrived by datagram: its number on the lane, and the task.
type TaskCopy = (u64, QuicTask);

/// Routes datagram copies of tasks to the lanes being served, and counts them.
pub(crate) struct LaneCopyRouter {
    lanes: Mutex<HashMap<u64, mpsc::Sender<TaskCopy>>>,
    counters: Arc<RedundancyCounters>,
}

impl LaneCopyRouter {
    pub(crate) fn new(counters: Arc<RedundancyCounters>) -> Self {
        Self {
            lanes: Mutex::default(),
            counters,
        }
    }

    fn lanes(&self) -> MutexGuard<'_, HashMap<u64, mpsc::Sender<TaskCopy>>> {
        // Map operations cannot panic part-way.
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers lane `index` for copies until the returned guard is dropped.
    fn join(self: &Arc<Self>, index: u64) -> (LaneCopyGuard, mpsc::Receiver<TaskCopy>) {
        let (tx, rx) = mpsc::channel(COPY_QUEUE);
        self.lanes().insert(index, tx);
        let guard = LaneCopyGuard {
            router: Arc::clone(self),
            index,
        };
        (guard, rx)
    }

    /// Hands a copy to its lane; a lane not (yet) visible or with a full queue drops it.
    fn route(&self, copy: QuicDatagramDown) -> Result<(), Fault> {
        let QuicDatagramDown { lane, seq, task } = copy;
        let Some(task) = task else {
            return Err(Fault::close(
                ErrorCode::MalformedFrame,
                format!("datagram: a copy for lane {lane} carries no task"),
            ));
        };
        let sent = self
            .lanes()
            .get(&lane)
            .is_some_and(|tx| tx.try_send((seq, task)).is_ok());
        if !sent {
            self.counters.dropped();
        }
        Ok(())
    }
}

/// Removes a lane from the router when its serving ends.
struct LaneCopyGuard {
    router: Arc<LaneCopyRouter>,
    index: u64,
}

impl Drop for LaneCopyGuard {
    fn drop(&mut self) {
        self.router.lanes().remove(&self.index);
    }
}

/// Reads the gateway's datagram copies until the connection ends or `stop` fires; a
/// malformed one closes the connection as a malformed lane frame would.
pub(crate) fn spawn_copy_reader(
    conn: Connection,
    router: Arc<LaneCopyRouter>,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            let payload = tokio::select! {
                payload = conn.read_datagram() => match payload {
                    Ok(payload) => payload,
                    Err(_) => return,
                },
                () = stop.cancelled() => return,
            };
            let routed = decode::<QuicDatagramDown>(payload)
                .map_err(|error| {
                    Fault::close(ErrorCode::MalformedFrame, format!("datagram: {error}"))
                })
                .and_then(|copy| router.route(copy));
            if let Err(Fault::Close { code, reason }) = routed {
                tracing::warn!(%code, %reason, "closing the gateway connection");
                close_connection(&conn, code, &reason);
                return;
            }
        }
    });
}

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
    /// The datagram copies of tasks, when the gateway enabled datagram redundancy.
    pub(crate) copies: Option<Arc<LaneCopyRouter>>,
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
                served = serve(conn.clone(), send, recv, &context) => served,
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

async fn serve(
    conn: Connection,
    send: SendStream,
    recv: RecvStream,
    context: &LaneContext,
) -> Result<(), Fault> {
    let index = send.id().index();
    let name = LaneName(index);
    let out = StreamOut::new(send);
    let mut frames = FrameReader::new(recv, context.frame_limit);
    let mut running: Option<RunningTask> = None;
    // The running task's number on this lane, which its result's datagram copy quotes.
    let mut running_seq = 0;
    let mut numbers = LaneCopies::default();
    let (_joined, mut copies) = match &context.copies {
        Some(router) => {
            let (guard, rx) = router.join(index);
            (Some(guard), Some(rx))
        }
        None => (None, None),
    };
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
                        let (seq, verdict) = numbers.lane_task();
                        if verdict == CopyVerdict::Drop {
                            // Its datagram copy came first and started it.
                            if let Some(router) = &context.copies {
                                router.counters.lane_copy_dropped();
                            }
                            continue;
                        }
                        if let Some(busy) = &running {
                            return Err(Fault::close(
                                ErrorCode::ProtocolViolation,
                                format!("task {} arrived on {name} while task {} ran on it", task.task_id, busy.task_id()),
                            ));
                        }
                        running = Some(context.runner.start(activity_task(task)));
                        running_seq = seq;
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
                    Some(quic_lane_down::Frame::Held(held)) => {
                        return Err(Fault::close(
                            ErrorCode::ProtocolViolation,
                            format!("held task {} on {name}, but this connection resumed nothing", held.task_id),
                        ));
                    }
                    None => return Err(Fault::empty(&name)),
                }
            }
            reply = run(&mut running), if running.is_some() => {
                running = None;
                Some(reply)
            }
            Some((seq, task)) = next_copy(&mut copies) => {
                let Some(router) = &context.copies else { continue };
                if running.is_none() && numbers.datagram_task(seq) == CopyVerdict::Start {
                    router.counters.used();
                    running = Some(context.runner.start(activity_task(task)));
                    running_seq = seq;
                } else {
                    router.counters.dropped();
                }
                None
            }
        };
        if let Some(up) = up {
            let (frame, up) = encode_up(up, context.frame_limit)?;
            if !context.outbox.push(&out, Item::Frame(frame)) {
                return Err(Fault::Gone);
            }
            if let (Some(router), Some(quic_lane_up::Frame::Result(result))) =
                (&context.copies, up.frame)
            {
                let copy = QuicDatagramUp {
                    lane: index,
                    seq: running_seq,
                    result: Some(result),
                };
                router.counters.send_copy(&conn, &copy);
            }
        }
    }
}

/// The next datagram copy for this lane; never resolves without datagram redundancy.
async fn next_copy(copies: &mut Option<mpsc::Receiver<TaskCopy>>) -> Option<TaskCopy> {
    match copies {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
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

/// Encodes a reply, handing back the message too; a result too large for the gateway becomes
/// the runtime's failure saying so.
fn encode_up(reply: Reply, limit: u32) -> Result<(Bytes, QuicLaneUp), Fault> {
    let reply = match reply {
        Reply::Task(task) => {
            let size = frame(Reply::Task(task.clone())).encoded_len();
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            Reply::Task(task.within_limit(size, limit))
        }
        pong => pong,
    };
    let up = frame(reply);
    let bytes = encode_frame(&up, limit)
        .map_err(|error| Fault::close(ErrorCode::Internal, error.to_string()))?;
    Ok((bytes, up))
}
