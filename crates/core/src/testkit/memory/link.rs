//! The link: two bounded channels standing in for a connection, and the gateway's delivery leg.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::admission::AdmissionError;
use crate::delivery::{DeliveryError, TaskId, TransportName, WorkerDelivery, WorkerMessage};
use crate::outcome::TaskResult;

/// The in-memory transport's name.
pub const TRANSPORT: TransportName = TransportName::from_static("memory");

/// Messages the gateway may queue for one worker before [`DeliveryError::Full`].
pub(super) const TO_WORKER: usize = 64;
/// Frames a worker may queue for the gateway before its runtime waits.
pub(super) const TO_GATEWAY: usize = 64;

/// What a worker sends the gateway after registering.
#[derive(Debug)]
pub(super) enum Frame {
    /// Capacity, for a link whose registration does not carry it; the gateway answers.
    Capabilities {
        max_concurrency: u32,
        reply: oneshot::Sender<Result<(), AdmissionError>>,
    },
    /// The answer to ping `seq`.
    Pong { seq: u64 },
    /// A task's result.
    Result { task: TaskId, result: TaskResult },
    /// A cancelled task was stopped.
    CancelAck { task: TaskId },
    /// The worker finished draining and is closing.
    Goodbye,
}

/// What the gateway sends a worker: core's messages, and result acknowledgements.
#[derive(Debug)]
pub(super) enum Down {
    /// A message from core (task, cancel, ping, drain).
    Message(WorkerMessage),
    /// The gateway processed the result for this task; the worker may forget it. (A socket
    /// transport batches these; a channel costs nothing per message.)
    ResultsAck(TaskId),
}

/// The worker's end of one link.
pub(super) struct Link {
    pub(super) inbox: mpsc::Receiver<Down>,
    pub(super) outbox: mpsc::Sender<Frame>,
    /// Set when the link is cut: the gateway's leg reports closed and frames still in flight
    /// are lost, as on a broken connection.
    pub(super) severed: Arc<AtomicBool>,
    /// Fired once the gateway's side of the link has ended (it has seen the link go).
    pub(super) closed: CancellationToken,
}

impl Link {
    /// Cuts the link and drops the worker's end; returns what fires once the gateway has seen
    /// the link end.
    pub(super) fn cut(self) -> CancellationToken {
        self.severed.store(true, Ordering::Release);
        self.closed
    }
}

/// The gateway's delivery leg for one worker: a bounded queue it never waits on.
pub(super) struct MemoryDelivery {
    to_worker: mpsc::Sender<Down>,
    /// Set when the link is cut, before the worker's end of the queue is dropped.
    severed: Arc<AtomicBool>,
    carries_capacity: bool,
}

impl MemoryDelivery {
    pub(super) fn new(
        to_worker: mpsc::Sender<Down>,
        severed: Arc<AtomicBool>,
        carries_capacity: bool,
    ) -> Self {
        Self {
            to_worker,
            severed,
            carries_capacity,
        }
    }
}

impl WorkerDelivery for MemoryDelivery {
    fn transport(&self) -> TransportName {
        TRANSPORT
    }

    fn is_connected(&self) -> bool {
        !self.severed.load(Ordering::Acquire) && !self.to_worker.is_closed()
    }

    fn registration_carries_capacity(&self) -> bool {
        self.carries_capacity
    }

    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        if self.severed.load(Ordering::Acquire) {
            return Err(DeliveryError::Closed);
        }
        self.to_worker
            .try_send(Down::Message(message))
            .map_err(|error| match error {
                mpsc::error::TrySendError::Full(_) => DeliveryError::Full,
                mpsc::error::TrySendError::Closed(_) => DeliveryError::Closed,
            })
    }
}
