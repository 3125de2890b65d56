//! The worker's side of one lane: hands the tasks, held tasks and cancels it reads to the
//! worker's keeper (straight from the lane's task), answers pings at once, and carries the
//! replies of its tasks.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prost::Message;
use quinn::{Connection, RecvStream, SendStream};
use switchyard_core::{IdMap, TaskId, TaskResult};
use switchyard_proto::v1::{
    Failure, QuicCancel, QuicCancelAck, QuicDatagramDown, QuicDatagramUp, QuicLaneDown, QuicLaneUp,
    QuicPing, QuicPong, QuicResult, QuicTask, quic_lane_down, quic_lane_up, quic_result,
};
use switchyard_worker::{InlineTask, TaskReply, TaskStarter};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::connection::{Replies, lock};
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
    lanes: Mutex<IdMap<u64, mpsc::Sender<TaskCopy>>>,
    counters: Arc<RedundancyCounters>,
}

impl LaneCopyRouter {
    pub(crate) fn new(counters: Arc<RedundancyCounters>) -> Self {
        Self {
            lanes: Mutex::default(),
            counters,
        }
    }

    fn lanes(&self) -> MutexGuard<'_, IdMap<u64, mpsc::Sender<TaskCopy>>> {
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
    /// Starts and cancels the tasks the lanes read on the worker's keeper.
    pub(crate) tasks: TaskStarter,
    /// The lanes of the connection's tasks, and the replies waiting for theirs.
    pub(crate) replies: Arc<Mutex<Replies>>,
    /// The gateway's `max_lane_frame_bytes`, in force in both directions.
    pub(crate) frame_limit: u32,
    /// The datagram copies of tasks, when the gateway enabled datagram redundancy.
    pub(crate) copies: Option<Arc<LaneCopyRouter>>,
}

/// Where a task's reply goes: its lane, and its number there (for the result's datagram copy).
#[derive(Clone)]
pub(crate) struct Route {
    /// The lane's write side.
    pub(crate) out: Arc<StreamOut>,
    /// The lane's index.
    pub(crate) lane: u64,
    /// The task's number on the lane.
    pub(crate) seq: u64,
}

/// What a lane read that the keeper acts on (pings are answered by the lane itself).
enum LaneEvent {
    /// A task to start; its reply goes to `route`.
    Task(Route, switchyard_core::ActivityTask),
    /// After a resume: a task the worker already holds now answers on `route`.
    Held(Route, TaskId),
    /// The gateway cancels a task.
    Cancel(TaskId),
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
                served = serve(&conn, send, recv, &context) => served,
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

/// Reads a lane: tasks (by lane or by datagram copy, each started once) start on the keeper
/// with their route noted, held tasks learn their route, cancels reach their handler; pings are
/// answered here. The tasks run on the worker's keeper, outside the lane, so a lane (or
/// connection) ending stops none.
async fn serve(
    conn: &Connection,
    send: SendStream,
    recv: RecvStream,
    context: &LaneContext,
) -> Result<(), Fault> {
    let index = send.id().index();
    let name = LaneName(index);
    let out = StreamOut::new(send);
    let mut frames = FrameReader::new(recv, context.frame_limit);
    let mut numbers = LaneCopies::default();
    let (_joined, mut copies) = match &context.copies {
        Some(router) => {
            let (guard, rx) = router.join(index);
            (Some(guard), Some(rx))
        }
        None => (None, None),
    };
    let route = |seq| Route {
        out: Arc::clone(&out),
        lane: index,
        seq,
    };
    // The lane's task runs here, inline, while the lane lives: a task of its own per task would
    // cost a spawn and a wake-up each. Should the lane end first, it moves onto a task of its
    // own (see `InlineTask`), so no handler stops with its lane.
    let mut inline: Option<InlineTask> = None;
    // The last task routed to this lane (read here, by copy, or held after a resume): the lane
    // is busy until its reply has gone out.
    let mut last_task: Option<TaskId> = None;
    loop {
        let event = tokio::select! {
            () = run_inline(&mut inline), if inline.is_some() => {
                inline = None;
                None
            }
            down = frames.next::<QuicLaneDown>() => {
                let down = down.map_err(|error| Fault::read(error, &name))?;
                let Some(down) = down else {
                    // Retired, or the gateway closing: answer its FIN with ours. A task still
                    // running is the keeper's: the runtime resumes or lets go of it.
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
                        Some(LaneEvent::Task(route(seq), activity_task(task)))
                    }
                    Some(quic_lane_down::Frame::Held(held)) => {
                        // A held task counts as the lane's task for numbering, as on the gateway.
                        let (seq, _) = numbers.lane_task();
                        Some(LaneEvent::Held(route(seq), TaskId::from_raw(held.task_id)))
                    }
                    Some(quic_lane_down::Frame::Ping(QuicPing { seq })) => {
                        let pong = QuicLaneUp {
                            frame: Some(quic_lane_up::Frame::Pong(QuicPong { seq })),
                        };
                        let frame = encode_frame(&pong, context.frame_limit)
                            .map_err(|error| Fault::close(ErrorCode::Internal, error.to_string()))?;
                        if !context.outbox.push(&out, Item::Frame(frame)) {
                            return Err(Fault::Gone);
                        }
                        None
                    }
                    Some(quic_lane_down::Frame::Cancel(QuicCancel { task_id, .. })) => {
                        Some(LaneEvent::Cancel(TaskId::from_raw(task_id)))
                    }
                    None => return Err(Fault::empty(&name)),
                }
            }
            Some((seq, task)) = next_copy(&mut copies) => {
                let Some(router) = &context.copies else { continue };
                // The lane's task still running makes any copy early.
                let busy =
                    last_task.is_some_and(|task| lock(&context.replies).awaits_reply(task));
                if numbers.datagram_task(seq, busy) == CopyVerdict::Start {
                    router.counters.used();
                    Some(LaneEvent::Task(route(seq), activity_task(task)))
                } else {
                    router.counters.dropped();
                    None
                }
            }
        };
        if let Some(event) = event {
            match &event {
                LaneEvent::Task(_, task) => last_task = Some(task.task_id),
                LaneEvent::Held(_, task) => last_task = Some(*task),
                LaneEvent::Cancel(_) => {}
            }
            act(conn, context, event, &mut inline)?;
        }
    }
}

/// Acts on what the lane read: a task starts on the keeper (its route noted first, as its
/// reply may come at once), a held task learns its route, a cancel reaches its handler.
fn act(
    conn: &Connection,
    context: &LaneContext,
    event: LaneEvent,
    inline: &mut Option<InlineTask>,
) -> Result<(), Fault> {
    // The replies' lock is let go before the keeper is called: the keeper writes replies
    // (through the connection's sink) under its own lock, and takes this one then.
    let ready = match event {
        LaneEvent::Task(route, task) => {
            let ready = lock(&context.replies).route(task.task_id, route);
            // The gateway sends a lane's next task only after the last one's reply; should one
            // come early anyway, it gets a runtime task of its own.
            match inline {
                None => *inline = context.tasks.start_inline(task),
                Some(_) => context.tasks.start(task),
            }
            ready
        }
        LaneEvent::Held(route, task) => lock(&context.replies).route(task, route),
        LaneEvent::Cancel(task) => {
            context.tasks.cancel(task);
            None
        }
    };
    match ready {
        Some((route, reply)) => write_reply(conn, context, &route, reply),
        None => Ok(()),
    }
}

/// Runs the lane's inline task to its end; never resolves while there is none.
async fn run_inline(inline: &mut Option<InlineTask>) {
    match inline {
        Some(task) => task.await,
        None => std::future::pending().await,
    }
}

/// The next datagram copy for this lane; never resolves without datagram redundancy.
async fn next_copy(copies: &mut Option<mpsc::Receiver<TaskCopy>>) -> Option<TaskCopy> {
    match copies {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn activity_task(task: QuicTask) -> switchyard_core::ActivityTask {
    switchyard_core::ActivityTask {
        task_id: TaskId::from_raw(task.task_id),
        namespace: task.namespace,
        task_queue: task.task_queue,
        activity_type: task.activity_type,
        input: task.input,
        attempt: task.attempt,
        deadline: convert::from_unix_ms(task.deadline_unix_ms),
    }
}

/// The wire frame of a task's reply.
fn frame(reply: TaskReply) -> QuicLaneUp {
    let frame = match reply {
        TaskReply::CancelAck { task_id } => quic_lane_up::Frame::CancelAck(QuicCancelAck {
            task_id: task_id.get(),
        }),
        TaskReply::Result { task_id, result } => quic_lane_up::Frame::Result(QuicResult {
            task_id: task_id.get(),
            outcome: Some(match result {
                TaskResult::Success(output) => quic_result::Outcome::Output(output),
                TaskResult::Failure { message, retryable } => {
                    quic_result::Outcome::Failure(Failure { message, retryable })
                }
            }),
        }),
    };
    QuicLaneUp { frame: Some(frame) }
}

/// Writes `reply` on its lane (a result too large for the gateway becomes the runtime's
/// failure saying so), with its datagram copy when redundancy is in force.
pub(crate) fn write_reply(
    conn: &Connection,
    context: &LaneContext,
    route: &Route,
    reply: TaskReply,
) -> Result<(), Fault> {
    let limit = usize::try_from(context.frame_limit).unwrap_or(usize::MAX);
    let mut up = frame(reply);
    let size = up.encoded_len();
    if size > limit {
        // Only a result can be too large: it becomes the failure saying so, which keeps
        // nothing of the result but its id (the frame is built twice only then).
        if let Some(quic_lane_up::Frame::Result(result)) = up.frame {
            let too_large = TaskReply::Result {
                task_id: TaskId::from_raw(result.task_id),
                result: TaskResult::Success(Default::default()),
            };
            up = frame(too_large.within_limit(size, limit));
        }
    }
    let bytes = encode_frame(&up, context.frame_limit)
        .map_err(|error| Fault::close(ErrorCode::Internal, error.to_string()))?;
    if !context.outbox.push(&route.out, Item::Frame(bytes)) {
        return Err(Fault::Gone);
    }
    if let (Some(router), Some(quic_lane_up::Frame::Result(result))) = (&context.copies, up.frame) {
        let copy = QuicDatagramUp {
            lane: route.lane,
            seq: route.seq,
            result: Some(result),
        };
        router.counters.send_copy(conn, &copy);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(lane: u64, seq: u64) -> QuicDatagramDown {
        QuicDatagramDown {
            lane,
            seq,
            task: Some(QuicTask {
                task_id: seq,
                ..QuicTask::default()
            }),
        }
    }

    #[test]
    fn a_lane_queues_at_most_copy_queue_copies_and_the_rest_are_dropped() {
        let router = Arc::new(LaneCopyRouter::new(Arc::default()));
        let (_guard, mut copies) = router.join(1);
        for seq in 0..COPY_QUEUE as u64 + 2 {
            assert!(router.route(copy(1, seq)).is_ok());
        }
        assert_eq!(COPY_QUEUE, 4);
        assert_eq!(
            router.counters.snapshot().copies_dropped,
            2,
            "past the queue"
        );
        let queued: Vec<u64> = std::iter::from_fn(|| copies.try_recv().ok())
            .map(|(seq, _)| seq)
            .collect();
        assert_eq!(queued, [0, 1, 2, 3], "the first four kept, in order");

        // Control: once the lane took them there is room again.
        assert!(router.route(copy(1, 9)).is_ok());
        assert_eq!(router.counters.snapshot().copies_dropped, 2);
        assert_eq!(copies.try_recv().map(|(seq, _)| seq).ok(), Some(9));

        // A lane nobody serves drops its copy; a copy without a task closes the connection.
        assert!(router.route(copy(7, 0)).is_ok());
        assert_eq!(router.counters.snapshot().copies_dropped, 3);
        let empty = QuicDatagramDown {
            lane: 1,
            seq: 10,
            task: None,
        };
        assert!(matches!(
            router.route(empty),
            Err(Fault::Close {
                code: ErrorCode::MalformedFrame,
                ..
            })
        ));
    }
}
