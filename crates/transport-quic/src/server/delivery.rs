//! One worker connection as core sees it: the [`WorkerDelivery`] leg over its lanes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use quinn::Connection;
use switchyard_core::{DeliveryError, TaskId, TransportName, WorkerDelivery, WorkerMessage};
use switchyard_proto::v1::{
    QuicCancel, QuicControlDown, QuicDatagramDown, QuicDrain, QuicDrainReason, QuicHeld,
    QuicLaneDown, QuicPing, quic_control_down, quic_lane_down,
};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::acks::Acks;
use super::lanes::{Ending, FinishError, Finished, LaneId, LaneSink, LaneTable};
use crate::convert;
use crate::fault::{Fault, close_connection};
use crate::frame::{FrameError, encode_frame};
use crate::outbox::{Item, Outbox, StreamOut};
use crate::protocol::ErrorCode;
use crate::redundancy::RedundancyCounters;

/// Frames a blocked lane may hold back before it refuses more (pings then go elsewhere).
pub(crate) const LANE_QUEUE: usize = 8;
/// Control frames queued toward the worker (only drains travel this way after registration).
pub(crate) const CONTROL_QUEUE: usize = 4;

/// A control frame queued toward the worker, boxed: a tokio channel allocates its first block
/// of 32 slots when it is created, so queuing frames inline (128 bytes each) cost every
/// connection 4 KiB for the drain it almost never sends; boxed, the block is 256 bytes.
pub(crate) type QueuedControl = Box<QuicControlDown>;

/// Longest a close waits for the frames queued before it to reach the worker (and, at
/// shutdown, for the cancels of the tasks still held to be queued); a dead peer cannot hold
/// the close longer.
pub(crate) const FLUSH_PATIENCE: Duration = Duration::from_secs(1);

/// The transport name core sees for QUIC workers.
pub const TRANSPORT: TransportName = TransportName::from_static("quic");

/// Shared state of one worker connection: its lanes, its control queue, and whether it lives.
pub(crate) struct QuicDelivery {
    conn: Connection,
    outbox: Outbox,
    lanes: Mutex<LaneTable<LaneOut>>,
    control: mpsc::Sender<QueuedControl>,
    connected: AtomicBool,
    lane_frame_limit: u32,
    /// The listener's counters when datagram redundancy is in force on this connection.
    copies: Option<Arc<RedundancyCounters>>,
    /// Fired once when a drain finds (or leaves) no task held.
    pub(crate) drained: Notify,
    /// Set by an operator's (or the worker's own) drain, which is final.
    final_drain: AtomicBool,
    /// Woken whenever a cancel is queued or a task ends, for a close waiting on them.
    changed: Notify,
    /// Set once a close waits on `changed`: before that nobody listens, and waking a `Notify`
    /// takes its lock, which every result would pay.
    flushing: AtomicBool,
    /// Cancelled when the server asks for a flushed close.
    closing: CancellationToken,
    /// The results to acknowledge, when the worker understands `results_ack`.
    acks: Option<Acks>,
}

impl QuicDelivery {
    /// A delivery over `conn`; with `copies`, small tasks are also sent as datagrams; with
    /// `acks`, processed results are acknowledged (`results_ack`).
    pub(crate) fn new(
        conn: Connection,
        lane_frame_limit: u32,
        copies: Option<Arc<RedundancyCounters>>,
        acks: bool,
    ) -> (Self, mpsc::Receiver<QueuedControl>) {
        let (control, control_rx) = mpsc::channel(CONTROL_QUEUE);
        let closer = conn.clone();
        let outbox = Outbox::spawn(Arc::new(move |fault| {
            if let Fault::Close { code, reason } = fault {
                tracing::warn!(%code, %reason, "closing worker connection");
                close_connection(&closer, code, &reason);
            }
        }));
        let delivery = Self {
            conn,
            outbox,
            lanes: Mutex::new(LaneTable::new(1)),
            control,
            connected: AtomicBool::new(true),
            lane_frame_limit,
            copies,
            drained: Notify::new(),
            final_drain: AtomicBool::new(false),
            changed: Notify::new(),
            flushing: AtomicBool::new(false),
            closing: CancellationToken::new(),
            acks: acks.then(Acks::default),
        };
        (delivery, control_rx)
    }

    pub(crate) fn lanes(&self) -> MutexGuard<'_, LaneTable<LaneOut>> {
        // Table operations cannot panic part-way, so a poisoned lock still guards valid data.
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The write side of a new lane, queued through this connection's outbox.
    pub(crate) fn lane_out(&self, out: Arc<StreamOut>) -> LaneOut {
        LaneOut {
            out,
            outbox: self.outbox.clone(),
        }
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.conn
    }

    pub(crate) fn lane_frame_limit(&self) -> u32 {
        self.lane_frame_limit
    }

    /// The listener's counters, when datagram redundancy is in force on this connection.
    pub(crate) fn copies(&self) -> Option<&Arc<RedundancyCounters>> {
        self.copies.as_ref()
    }

    /// Ends a lane's task and wakes the drain when it was the last one. The lane copy of a
    /// result a datagram already brought comes back as a [`Finished::duplicate`].
    pub(crate) fn finish(
        &self,
        lane: LaneId,
        task: TaskId,
        ending: Ending,
    ) -> Result<Finished, FinishError> {
        let finished = self.lanes().finish(lane, task, ending)?;
        if finished.duplicate {
            if let Some(copies) = &self.copies {
                copies.lane_copy_dropped();
            }
            return Ok(finished);
        }
        self.ended(finished);
        Ok(finished)
    }

    /// Ends a lane's task from a datagram copy of its result; `None` when the copy is stale.
    pub(crate) fn finish_copy(&self, lane: LaneId, seq: u64, task: TaskId) -> Option<Finished> {
        let finished = self.lanes().finish_copy(lane, seq, task)?;
        self.ended(finished);
        Some(finished)
    }

    /// Puts `task`, which the worker already holds from before a resume, on an idle lane
    /// with a `held` frame, so that its result or cancel acknowledgement comes back there.
    pub(crate) fn hold(&self, task: TaskId) -> Result<LaneId, DeliveryError> {
        let frame = self.lane_frame(quic_lane_down::Frame::Held(QuicHeld {
            task_id: task.get(),
        }))?;
        self.lanes().assign(task, frame)
    }

    /// The result of `task` was processed (applied or refused): it joins the next
    /// `results_ack`, when the worker understands them.
    pub(crate) fn processed(&self, task: TaskId) {
        if let Some(acks) = &self.acks {
            acks.processed(task);
        }
    }

    /// The ids of the next `results_ack` once one is due; never resolves when the worker
    /// does not understand them. Cancel-safe.
    pub(crate) async fn next_results_ack(&self) -> Vec<TaskId> {
        match &self.acks {
            Some(acks) => acks.next_frame().await,
            None => std::future::pending().await,
        }
    }

    fn ended(&self, finished: Finished) {
        self.wake_flush();
        if finished.drain_complete {
            self.drained.notify_one();
        }
    }

    /// Wakes a close waiting for the tasks held to end or be cancelled, if one waits.
    ///
    /// Callers change the lane table first; [`QuicDelivery::flush`] sets `flushing` before it
    /// looks at the table, under the table's lock, so a change it does not see wakes it.
    fn wake_flush(&self) {
        if self.flushing.load(Ordering::Acquire) {
            self.changed.notify_waiters();
        }
    }

    /// Closes the connection with `code` and a reason phrase naming the problem.
    pub(crate) fn close(&self, code: ErrorCode, reason: &str) {
        close_connection(&self.conn, code, reason);
    }

    /// The code a finished drain closes with: `DRAINED` (final) after an operator's or the
    /// worker's own drain, else `SHUTTING_DOWN` (come back later). A final drain wins.
    pub(crate) fn drain_close(&self) -> (ErrorCode, &'static str) {
        if self.final_drain.load(Ordering::Acquire) {
            (
                ErrorCode::Drained,
                "drained: every task the worker held has ended",
            )
        } else {
            (
                ErrorCode::ShuttingDown,
                "the gateway is shutting down; reconnect later",
            )
        }
    }

    /// Asks the connection's driver to close with `SHUTTING_DOWN` once what was queued toward
    /// the worker has reached it.
    pub(crate) fn close_when_flushed(&self) {
        self.closing.cancel();
    }

    /// Resolves once [`QuicDelivery::close_when_flushed`] was called.
    pub(crate) async fn closing(&self) {
        self.closing.cancelled().await;
    }

    /// Delivers what was queued toward the worker before a close, until `deadline` at most:
    /// waits for every task held to be cancelled or ended (so their cancels are queued too),
    /// finishes every lane after its queued frames, and waits for the worker to acknowledge
    /// them. The delivery refuses every later message.
    pub(crate) async fn flush(&self, deadline: Instant) {
        self.flushing.store(true, Ordering::Release);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.lanes().settled() {
                break;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                break;
            }
        }
        self.connected.store(false, Ordering::Release);
        let sinks = self.lanes().close();
        let outs: Vec<Arc<StreamOut>> = sinks.iter().map(|sink| Arc::clone(&sink.out)).collect();
        // Dropping a sink queues its lane's FIN after the frames queued before.
        drop(sinks);
        let acknowledged = async {
            for out in &outs {
                out.settled().await;
            }
        };
        if tokio::time::timeout_at(deadline, acknowledged)
            .await
            .is_err()
        {
            tracing::debug!("the worker did not acknowledge every lane before the close");
        }
    }

    /// Marks the delivery gone: core stops selecting it and every lane sink is dropped.
    pub(crate) fn disconnect(&self) {
        self.connected.store(false, Ordering::Release);
        drop(self.lanes().close());
    }

    /// Encodes a lane frame; one larger than the lane frame limit is refused as `TooLarge`
    /// (it is never written, and the connection is unharmed).
    fn lane_frame(&self, frame: quic_lane_down::Frame) -> Result<Bytes, DeliveryError> {
        encode_frame(&QuicLaneDown { frame: Some(frame) }, self.lane_frame_limit).map_err(|error| {
            match error {
                FrameError::TooLarge { len, max } => DeliveryError::TooLarge {
                    size: usize::try_from(len).unwrap_or(usize::MAX),
                    limit: usize::try_from(max).unwrap_or(usize::MAX),
                },
                _ => DeliveryError::Unsupported("a lane frame that does not encode"),
            }
        })
    }

    /// Queues a `drain` with `reason` on the control stream and fences the lanes.
    fn drain(&self, reason: QuicDrainReason) -> Result<(), DeliveryError> {
        let drain = QuicControlDown {
            frame: Some(quic_control_down::Frame::Drain(QuicDrain {
                reason: reason.into(),
            })),
        };
        self.control
            .try_send(Box::new(drain))
            .map_err(|error| match error {
                mpsc::error::TrySendError::Full(_) => DeliveryError::Full,
                mpsc::error::TrySendError::Closed(_) => DeliveryError::Closed,
            })?;
        if self.lanes().start_drain() {
            self.drained.notify_one();
        }
        Ok(())
    }
}

impl WorkerDelivery for QuicDelivery {
    fn transport(&self) -> TransportName {
        TRANSPORT
    }

    fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    fn registration_carries_capacity(&self) -> bool {
        false
    }

    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        if !self.is_connected() {
            return Err(DeliveryError::Closed);
        }
        // Encoding happens on the caller's thread, outside the table lock.
        match message {
            WorkerMessage::Task(task) => {
                let wire = convert::task(&task);
                let copy = self.copies.is_some().then(|| wire.clone());
                let frame = self.lane_frame(quic_lane_down::Frame::Task(wire))?;
                let (lane, seq) = {
                    let mut lanes = self.lanes();
                    let lane = lanes.assign(task.task_id, frame)?;
                    (lane, lanes.task_seq(lane))
                };
                if let (Some(copies), Some(task)) = (&self.copies, copy) {
                    let copy = QuicDatagramDown {
                        lane: lane.index(),
                        seq,
                        task: Some(task),
                    };
                    copies.send_copy(&self.conn, &copy);
                }
                Ok(())
            }
            WorkerMessage::Ping { seq } => {
                let frame = self.lane_frame(quic_lane_down::Frame::Ping(QuicPing { seq }))?;
                self.lanes().ping(frame).map(drop)
            }
            WorkerMessage::Cancel { task_id, reason } => {
                let frame = self.lane_frame(quic_lane_down::Frame::Cancel(QuicCancel {
                    task_id: task_id.get(),
                    reason: convert::cancel_reason(reason).into(),
                }))?;
                self.lanes().cancel(task_id, frame)?;
                self.wake_flush();
                Ok(())
            }
            WorkerMessage::Drain => {
                self.final_drain.store(true, Ordering::Release);
                self.drain(QuicDrainReason::Requested)
            }
            // A final drain under way stays final: the worker must not come back.
            WorkerMessage::ShuttingDown if self.final_drain.load(Ordering::Acquire) => Ok(()),
            WorkerMessage::ShuttingDown => self.drain(QuicDrainReason::ShuttingDown),
            _ => Err(DeliveryError::Unsupported("an unknown message kind")),
        }
    }
}

/// A lane's sink in the table: frames go through the connection's outbox; dropping it (the
/// lane retired, or the connection gone) finishes the stream after what was queued.
pub(crate) struct LaneOut {
    out: Arc<StreamOut>,
    outbox: Outbox,
}

impl LaneSink for LaneOut {
    fn push(&self, frame: Bytes) -> Result<(), DeliveryError> {
        if self.out.held_back() >= LANE_QUEUE {
            return Err(DeliveryError::Full);
        }
        if self.outbox.push(&self.out, Item::Frame(frame)) {
            Ok(())
        } else {
            Err(DeliveryError::Closed)
        }
    }
}

impl Drop for LaneOut {
    fn drop(&mut self) {
        self.outbox.push(&self.out, Item::Finish);
    }
}
