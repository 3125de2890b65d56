//! The gateway's delivery leg for one worker socket.

use std::sync::atomic::{AtomicBool, Ordering};

use switchyard_core::{DeliveryError, TransportName, WorkerDelivery, WorkerMessage};
use tokio::sync::mpsc;

use crate::protocol::GatewayFrame;

/// The name this transport registers its workers under.
pub const TRANSPORT: TransportName = TransportName::from_static("websocket");

/// Pushes core's messages into one socket's bounded queue, never waiting; the socket's writer
/// task serialises and sends them.
///
/// The queue holds the worker's stated capacity plus control headroom, so a worker that reads
/// its socket never sees `Full`; one that stops reading fills it, and core stops choosing it.
pub(crate) struct WsDelivery {
    queue: mpsc::Sender<GatewayFrame>,
    closed: AtomicBool,
    drain_requested: AtomicBool,
}

impl WsDelivery {
    pub(crate) fn new(queue: mpsc::Sender<GatewayFrame>) -> Self {
        Self {
            queue,
            closed: AtomicBool::new(false),
            drain_requested: AtomicBool::new(false),
        }
    }

    /// Marks the socket as ending; later deliveries are refused as `Closed`.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// True once a drain request was queued for the worker.
    pub(crate) fn drain_requested(&self) -> bool {
        self.drain_requested.load(Ordering::Acquire)
    }
}

impl WorkerDelivery for WsDelivery {
    fn transport(&self) -> TransportName {
        TRANSPORT
    }

    fn is_connected(&self) -> bool {
        !self.closed.load(Ordering::Acquire) && !self.queue.is_closed()
    }

    fn registration_carries_capacity(&self) -> bool {
        true
    }

    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        if !self.is_connected() {
            return Err(DeliveryError::Closed);
        }
        let is_drain = matches!(message, WorkerMessage::Drain);
        let frame = GatewayFrame::from_message(message).ok_or(DeliveryError::Unsupported(
            "a message kind newer than this transport",
        ))?;
        self.queue.try_send(frame).map_err(|error| match error {
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
    use switchyard_core::{CancelReason, TaskId};

    use super::*;

    #[test]
    fn full_queue_and_closed_socket_are_typed_refusals() {
        let (tx, mut rx) = mpsc::channel(1);
        let leg = WsDelivery::new(tx);
        assert_eq!(leg.deliver(WorkerMessage::Ping { seq: 1 }), Ok(()));
        assert_eq!(
            leg.deliver(WorkerMessage::Ping { seq: 2 }),
            Err(DeliveryError::Full)
        );
        assert_eq!(rx.try_recv(), Ok(GatewayFrame::Ping { seq: 1 }));
        leg.close();
        assert!(!leg.is_connected());
        let cancel = WorkerMessage::Cancel {
            task_id: TaskId::from_raw(1),
            reason: CancelReason::Requested,
        };
        assert_eq!(leg.deliver(cancel), Err(DeliveryError::Closed));
        assert!(rx.try_recv().is_err(), "nothing is queued after close");
    }

    #[test]
    fn dropped_writer_reads_as_disconnected() {
        let (tx, rx) = mpsc::channel(4);
        let leg = WsDelivery::new(tx);
        assert!(leg.is_connected());
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
        let leg = WsDelivery::new(tx);
        assert!(!leg.drain_requested());
        assert_eq!(leg.deliver(WorkerMessage::Drain), Ok(()));
        assert!(leg.drain_requested());
    }
}
