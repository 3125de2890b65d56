//! The server's delivery leg for one worker stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use prost::Message;
use switchyard_core::{DeliveryError, IdSet, TransportName, WorkerDelivery, WorkerMessage};
use tokio::sync::{Notify, mpsc};

use crate::outbound::QueuedFrame;
use crate::wire;

/// The name this transport registers its workers under.
pub const TRANSPORT: TransportName = TransportName::from_static("grpc");

/// Why the gateway asked a worker to finish and leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Farewell {
    /// An operator's (or the worker's own) drain: final.
    Drain,
    /// The gateway is stopping: the worker should come back later.
    ShuttingDown,
}

/// Pushes core's messages into one stream's bounded outbound queue, never waiting.
///
/// The queue is sized from the worker's stated capacity plus control headroom, so a worker
/// that reads its stream never sees `Full`; one that stops reading fills it and core stops
/// choosing it. A frame whose encoding exceeds the stream's message size limit is refused as
/// `TooLarge` before it is queued: tonic would otherwise fail the whole stream on it.
///
/// The leg also remembers which pushed tasks the worker has not answered yet and whether it
/// was asked to leave, so the stream can end the stream once a drained worker holds nothing.
pub(crate) struct GrpcDelivery {
    frames: mpsc::Sender<QueuedFrame>,
    max_frame_bytes: usize,
    closed: AtomicBool,
    state: Mutex<LegState>,
    changed: Notify,
}

#[derive(Default)]
struct LegState {
    /// Tasks pushed and not yet answered by a result or a cancel acknowledgement (ids the
    /// gateway numbered, so the cheap id hash is safe).
    held: IdSet<u64>,
    /// The last drain or shutdown notice queued.
    farewell: Option<Farewell>,
}

impl GrpcDelivery {
    /// A leg pushing into `frames`, refusing frames larger than `max_frame_bytes` encoded.
    pub(crate) fn new(frames: mpsc::Sender<QueuedFrame>, max_frame_bytes: usize) -> Self {
        Self {
            frames,
            max_frame_bytes,
            closed: AtomicBool::new(false),
            state: Mutex::new(LegState::default()),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LegState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the stream as ended; later deliveries are refused as `Closed`.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// The worker answered `task` (a result or a cancel acknowledgement).
    ///
    /// The stream is woken only once a farewell was queued: before that no answer can make
    /// one due, and a wake-up per result would turn the stream's loop once more for each.
    pub(crate) fn answered(&self, task: u64) {
        let mut state = self.lock();
        if state.held.remove(&task) && state.farewell.is_some() {
            drop(state);
            self.changed.notify_one();
        }
    }

    /// The farewell to end the stream with: a drain or shutdown notice was queued and the
    /// worker holds no unanswered task.
    pub(crate) fn farewell_due(&self) -> Option<Farewell> {
        let state = self.lock();
        state.farewell.filter(|_| state.held.is_empty())
    }

    /// The drain or shutdown notice queued, if any.
    pub(crate) fn farewell(&self) -> Option<Farewell> {
        self.lock().farewell
    }

    /// Queues a `results_ack` for `tasks`, or hands them back when the queue is full or
    /// closed.
    pub(crate) fn push_results_ack(&self, tasks: Vec<u64>) -> Result<(), Vec<u64>> {
        match self.frames.try_reserve() {
            Ok(permit) if self.is_connected() => {
                permit.send(Box::new(wire::results_ack(tasks)));
                Ok(())
            }
            _ => Err(tasks),
        }
    }

    /// Resolves after a notice is queued, or a task answered once one was (or at once if that
    /// happened since the last call): the moment to check [`GrpcDelivery::farewell_due`]
    /// again.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }
}

impl WorkerDelivery for GrpcDelivery {
    fn transport(&self) -> TransportName {
        TRANSPORT
    }

    fn is_connected(&self) -> bool {
        !self.closed.load(Ordering::Acquire) && !self.frames.is_closed()
    }

    fn registration_carries_capacity(&self) -> bool {
        true
    }

    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        if !self.is_connected() {
            return Err(DeliveryError::Closed);
        }
        let farewell = match message {
            WorkerMessage::Drain => Some(Farewell::Drain),
            WorkerMessage::ShuttingDown => Some(Farewell::ShuttingDown),
            _ => None,
        };
        let task = match &message {
            WorkerMessage::Task(task) => Some(task.task_id.get()),
            _ => None,
        };
        let frame = wire::gateway_frame(message).ok_or(DeliveryError::Unsupported("message"))?;
        let size = frame.encoded_len();
        if size > self.max_frame_bytes {
            return Err(DeliveryError::TooLarge {
                size,
                limit: self.max_frame_bytes,
            });
        }
        // Held before it is queued, so an answer racing the push always finds it; one lock
        // for both (`try_send` never waits).
        let mut state = self.lock();
        if let Some(task) = task {
            state.held.insert(task);
        }
        let queued = self
            .frames
            .try_send(Box::new(frame))
            .map_err(|error| match error {
                mpsc::error::TrySendError::Full(_) => DeliveryError::Full,
                mpsc::error::TrySendError::Closed(_) => DeliveryError::Closed,
            });
        match (queued, task) {
            (Err(error), Some(task)) => {
                // Under the same lock as its insertion: no notice came in between.
                state.held.remove(&task);
                return Err(error);
            }
            (Err(error), None) => return Err(error),
            (Ok(()), _) => {}
        }
        if let Some(farewell) = farewell {
            // A final drain is never downgraded to a shutdown notice.
            if state.farewell != Some(Farewell::Drain) {
                state.farewell = Some(farewell);
            }
            drop(state);
            self.changed.notify_one();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use bytes::Bytes;
    use switchyard_core::{ActivityTask, TaskId};

    use super::*;

    const LIMIT: usize = 1024;

    fn task(id: u64, input: usize) -> WorkerMessage {
        WorkerMessage::Task(ActivityTask {
            task_id: TaskId::from_raw(id),
            namespace: "ns".into(),
            task_queue: "default".into(),
            activity_type: "echo".into(),
            input: Bytes::from(vec![7; input]),
            attempt: 1,
            deadline: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        })
    }

    /// The encoded size of a task frame carrying `input` bytes.
    fn task_frame_len(input: usize) -> usize {
        wire::gateway_frame(task(1, input))
            .map(|frame| frame.encoded_len())
            .unwrap_or_default()
    }

    #[test]
    fn full_queue_and_closed_stream_are_typed_refusals() {
        let (tx, mut rx) = mpsc::channel(1);
        let leg = GrpcDelivery::new(tx, LIMIT);
        assert_eq!(leg.deliver(WorkerMessage::Ping { seq: 1 }), Ok(()));
        assert_eq!(
            leg.deliver(WorkerMessage::Ping { seq: 2 }),
            Err(DeliveryError::Full)
        );
        assert!(rx.try_recv().is_ok());
        leg.close();
        assert!(!leg.is_connected());
        let cancel = WorkerMessage::Cancel {
            task_id: TaskId::from_raw(1),
            reason: switchyard_core::CancelReason::Requested,
        };
        assert_eq!(leg.deliver(cancel), Err(DeliveryError::Closed));
    }

    #[test]
    fn dropped_receiver_reads_as_disconnected() {
        let (tx, rx) = mpsc::channel(4);
        let leg = GrpcDelivery::new(tx, LIMIT);
        drop(rx);
        assert!(!leg.is_connected());
        assert_eq!(
            leg.deliver(WorkerMessage::Drain),
            Err(DeliveryError::Closed)
        );
        assert_eq!(leg.farewell(), None);
    }

    #[test]
    fn frame_over_the_limit_is_refused_and_never_queued() {
        let (tx, mut rx) = mpsc::channel(4);
        let leg = GrpcDelivery::new(tx, LIMIT);
        // Find the largest input whose frame fits exactly.
        let fits = (0..LIMIT).rev().find(|n| task_frame_len(*n) <= LIMIT);
        let Some(fits) = fits else {
            panic!("some input fits in {LIMIT} bytes");
        };
        assert_eq!(leg.deliver(task(1, fits)), Ok(()), "control: at the limit");
        assert!(rx.try_recv().is_ok());
        let over = task_frame_len(fits + 1);
        assert!(over > LIMIT);
        assert_eq!(
            leg.deliver(task(2, fits + 1)),
            Err(DeliveryError::TooLarge {
                size: over,
                limit: LIMIT
            })
        );
        assert!(rx.try_recv().is_err(), "nothing was queued");
        assert!(leg.is_connected(), "the leg is unharmed");
        leg.answered(1);
        assert_eq!(leg.lock().held.len(), 0, "the refused task is not held");
    }

    #[test]
    fn farewell_is_due_once_every_task_is_answered() {
        let (tx, _rx) = mpsc::channel(8);
        let leg = GrpcDelivery::new(tx, LIMIT);
        leg.deliver(task(1, 4)).unwrap();
        assert_eq!(leg.farewell_due(), None, "no notice yet");
        leg.deliver(WorkerMessage::ShuttingDown).unwrap();
        assert_eq!(leg.farewell(), Some(Farewell::ShuttingDown));
        assert_eq!(leg.farewell_due(), None, "task 1 still held");
        leg.answered(1);
        assert_eq!(leg.farewell_due(), Some(Farewell::ShuttingDown));
    }

    #[test]
    fn a_final_drain_is_not_downgraded_by_a_shutdown() {
        let (tx, _rx) = mpsc::channel(8);
        let leg = GrpcDelivery::new(tx, LIMIT);
        leg.deliver(WorkerMessage::Drain).unwrap();
        leg.deliver(WorkerMessage::ShuttingDown).unwrap();
        assert_eq!(leg.farewell_due(), Some(Farewell::Drain));
    }

    #[tokio::test]
    async fn an_answer_wakes_the_stream_only_once_a_farewell_is_queued() {
        let (tx, _rx) = mpsc::channel(8);
        let leg = GrpcDelivery::new(tx, LIMIT);
        leg.deliver(task(1, 4)).unwrap();
        leg.deliver(task(2, 4)).unwrap();
        let changed = leg.changed();
        tokio::pin!(changed);
        leg.answered(1);
        assert!(
            futures::poll!(changed.as_mut()).is_pending(),
            "no farewell queued: an answer cannot make one due"
        );
        leg.deliver(WorkerMessage::Drain).unwrap();
        changed.as_mut().await;
        assert_eq!(leg.farewell_due(), None, "task 2 still held");
        changed.set(leg.changed());
        assert!(futures::poll!(changed.as_mut()).is_pending());
        leg.answered(2);
        // Control: after the notice the last answer does wake the stream.
        changed.await;
        assert_eq!(leg.farewell_due(), Some(Farewell::Drain));
    }

    #[tokio::test]
    async fn a_queued_notice_wakes_the_stream() {
        let (tx, _rx) = mpsc::channel(8);
        let leg = GrpcDelivery::new(tx, LIMIT);
        let changed = leg.changed();
        tokio::pin!(changed);
        assert!(futures::poll!(changed.as_mut()).is_pending());
        leg.deliver(WorkerMessage::Drain).unwrap();
        changed.await;
    }
}
