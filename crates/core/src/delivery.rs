//! The seam between core and a transport: the [`WorkerDelivery`] trait and what it carries.

use std::borrow::Cow;
use std::fmt;
use std::time::SystemTime;

use bytes::Bytes;

/// Names a transport (`"grpc"`, `"quic"`, or any name an integrator picks).
///
/// An open identifier rather than an enum, so adding a transport edits nothing in core.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransportName(Cow<'static, str>);

impl TransportName {
    /// A name known at compile time.
    pub const fn from_static(name: &'static str) -> Self {
        Self(Cow::Borrowed(name))
    }

    /// A name built at run time.
    pub fn new(name: impl Into<String>) -> Self {
        Self(Cow::Owned(name.into()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TransportName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Identifies one delivery of one task to one worker; unique for the life of the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(u64);

impl TaskId {
    /// Wraps a raw id, as decoded from the wire.
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw number, as carried on the wire.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One task pushed to a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivityTask {
    /// Id the worker must quote in its result.
    pub task_id: TaskId,
    /// Namespace the task was dispatched in.
    pub namespace: String,
    /// Task queue the task was dispatched in (normalised, never empty).
    pub task_queue: String,
    /// Activity type to run.
    pub activity_type: String,
    /// Opaque input bytes from the producer.
    pub input: Bytes,
    /// Delivery number of this dispatch: 1, plus one for each re-delivery after a lost worker.
    pub attempt: u32,
    /// Wall-clock instant after which the producer no longer waits for a result.
    pub deadline: SystemTime,
}

/// Why the gateway asks a worker to stop a running task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelReason {
    /// The producer cancelled the dispatch.
    Requested,
    /// The dispatch deadline passed.
    DeadlineExceeded,
    /// The gateway is shutting down and the grace period ended.
    ShuttingDown,
    /// The producer went away (its call was dropped).
    CallerGone,
    /// An operator's (or the worker's own) drain passed its deadline with the task still held.
    DrainDeadline,
}

impl CancelReason {
    /// A short lowercase word for logs and wire messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requested => "requested",
            Self::DeadlineExceeded => "deadline exceeded",
            Self::ShuttingDown => "shutting down",
            Self::CallerGone => "caller gone",
            Self::DrainDeadline => "drain deadline",
        }
    }
}

/// A message core asks a transport to push to one worker.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerMessage {
    /// Run this task.
    Task(ActivityTask),
    /// Finish in-flight work, take no more, then close; final: the worker should not return.
    Drain,
    /// The gateway is stopping: take no more work, finish what is in flight within the
    /// shutdown grace, and reconnect (with backoff) once the connection closes. Unlike
    /// [`WorkerMessage::Drain`] it is not final; the close that follows says "come back later".
    ShuttingDown,
    /// Liveness probe; the worker runtime echoes `seq` back.
    Ping {
        /// Sequence number to echo.
        seq: u64,
    },
    /// Stop the named task.
    Cancel {
        /// The task to stop.
        task_id: TaskId,
        /// Why.
        reason: CancelReason,
    },
}

/// Why a transport could not accept a message for a worker.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryError {
    /// The connection is gone.
    #[error("worker connection closed")]
    Closed,
    /// The per-worker queue is full (the worker is not reading).
    #[error("worker queue full")]
    Full,
    /// This transport has no way to carry the message (for example no drain frame).
    #[error("transport cannot carry {0}")]
    Unsupported(&'static str),
    /// The message, encoded, would exceed the largest frame the worker leg carries. The
    /// connection is unharmed: the message was never written.
    #[error("frame of {size} bytes exceeds the worker leg's limit of {limit} bytes")]
    TooLarge {
        /// Encoded size of the refused frame, in bytes.
        size: usize,
        /// The largest frame the leg carries, in bytes.
        limit: usize,
    },
}

/// The delivery leg of one connected worker, implemented by each transport.
///
/// Core holds it as `Arc<dyn WorkerDelivery>` and never learns the wire format. [`deliver`]
/// is synchronous by design: it must hand the message to a bounded queue (or refuse it) without
/// waiting, so no selection or dispatch can ever block on a slow peer.
///
/// [`deliver`]: WorkerDelivery::deliver
///
/// # Examples
///
/// The smallest possible transport leg, queueing into a bounded tokio channel:
///
/// ```
/// use switchyard_core::{DeliveryError, TransportName, WorkerDelivery, WorkerMessage};
/// use tokio::sync::mpsc;
///
/// struct ChannelLeg(mpsc::Sender<WorkerMessage>);
///
/// impl WorkerDelivery for ChannelLeg {
///     fn transport(&self) -> TransportName {
///         TransportName::from_static("channel")
///     }
///     fn is_connected(&self) -> bool {
///         !self.0.is_closed()
///     }
///     fn registration_carries_capacity(&self) -> bool {
///         true
///     }
///     fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
///         self.0.try_send(message).map_err(|error| match error {
///             mpsc::error::TrySendError::Full(_) => DeliveryError::Full,
///             mpsc::error::TrySendError::Closed(_) => DeliveryError::Closed,
///         })
///     }
/// }
///
/// let (tx, _rx) = mpsc::channel(8);
/// let leg: std::sync::Arc<dyn WorkerDelivery> = std::sync::Arc::new(ChannelLeg(tx));
/// assert!(leg.is_connected());
/// ```
pub trait WorkerDelivery: Send + Sync + 'static {
    /// The transport this leg belongs to.
    fn transport(&self) -> TransportName;

    /// False once the connection is known to be gone.
    fn is_connected(&self) -> bool;

    /// True when this transport's registration frame carries `max_concurrency`; false when the
    /// worker announces capacity in a later frame (the worker is then not dispatched to until
    /// it does).
    fn registration_carries_capacity(&self) -> bool;

    /// True when the transport can carry [`WorkerMessage::Drain`]; a transport without it has
    /// its workers deregistered when drained.
    fn supports_drain(&self) -> bool {
        true
    }

    /// Queues `message` for the worker without waiting.
    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError>;
}
