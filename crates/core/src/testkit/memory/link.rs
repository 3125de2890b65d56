//! The link: two bounded channels standing in for a connection, and the gateway's delivery leg.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{mpsc, oneshot};

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

/// The gateway's delivery leg for one worker: a bounded queue it never waits on.
pub(super) struct MemoryDelivery {
    to_worker: mpsc::Sender<WorkerMessage>,
    /// Set when the link is cut, before the worker's end of the queue is dropped.
    severed: Arc<AtomicBool>,
    carries_capacity: bool,
}

impl MemoryDelivery {
    pub(super) fn new(
        to_worker: mpsc::Sender<WorkerMessage>,
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
            .try_send(message)
            .map_err(|error| match error {
                mpsc::error::TrySendError::Full(_) => DeliveryError::Full,
                mpsc::error::TrySendError::Closed(_) => DeliveryError::Closed,
            })
    }
}
