//! The server's delivery leg for one worker stream.

use std::sync::atomic::{AtomicBool, Ordering};

use switchyard_core::{DeliveryError, TransportName, WorkerDelivery, WorkerMessage};
use switchyard_proto::v1::GatewayFrame;
use tokio::sync::mpsc;

use crate::wire;

/// The name this transport registers its workers under.
pub const TRANSPORT: TransportName = TransportName::from_static("grpc");

/// Pushes core's messages into one stream's bounded outbound queue, never waiting.
///
/// The queue is sized from the worker's stated capacity plus control headroom, so a worker
/// that reads its stream never sees `Full`; one that stops reading fills it and core stops
/// choosing it.
pub(crate) struct GrpcWorkerDelivery {
    frames: mpsc::Sender<GatewayFrame>,
    closed: AtomicBool,
    drain_requested: AtomicBool,
}

impl GrpcWorkerDelivery {
    pub(crate) fn new(frames: mpsc::Sender<GatewayFrame>) -> Self {
        Self {
            frames,
            closed: AtomicBool::new(false),
            drain_requested: AtomicBool::new(false),
        }
    }

    /// Marks the stream as ended; later deliveries are refused as `Closed`.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// True once a drain request was queued for the worker.
    pub(crate) fn drain_requested(&self) -> bool {
        self.drain_requested.load(Ordering::Acquire)
    }
}

impl WorkerDelivery for GrpcWorkerDelivery {
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
        let is_drain = matches!(message, WorkerMessage::Drain);
        let frame = wire::gateway_frame(message).ok_or(DeliveryError::Unsupported("message"))?;
        self.frames.try_send(frame).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => DeliveryError::Full,
            mpsc::error::TrySendError::Closed(_) => DeliveryError::Closed,
        })?;
        if is_drain {
            self.drain_requested.store(true, Ordering::Release);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use switchyard_core::TaskId;

    use super::*;

    #[test]
    fn full_queue_and_closed_stream_are_typed_refusals() {
        let (tx, mut rx) = mpsc::channel(1);
        let leg = GrpcWorkerDelivery::new(tx);
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
        let leg = GrpcWorkerDelivery::new(tx);
        drop(rx);
        assert!(!leg.is_connected());
        assert_eq!(
            leg.deliver(WorkerMessage::Drain),
            Err(DeliveryError::Closed)
        );
        assert!(!leg.drain_requested());
    }

    #[test]
    fn drain_is_remembered_once_queued() {
        let (tx, _rx) = mpsc::channel(4);
        let leg = GrpcWorkerDelivery::new(tx);
        assert!(!leg.drain_requested());
        leg.deliver(WorkerMessage::Drain).unwrap();
        assert!(leg.drain_requested());
    }
}
