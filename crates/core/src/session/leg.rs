//! The delivery leg core keeps for a session worker: connections come and go beneath it.

use std::sync::{Arc, PoisonError, RwLock};

use crate::delivery::{DeliveryError, TransportName, WorkerDelivery, WorkerMessage};

/// Wraps the leg of a session worker's current connection. Every holder (the registry entry,
/// the worker handle, each pending task) keeps this one leg, so a resume swaps the connection
/// in one place; while suspended it is disconnected and refuses every message as `Closed`.
pub(crate) struct SessionLeg {
    transport: TransportName,
    carries_capacity: bool,
    supports_drain: bool,
    current: RwLock<Option<Arc<dyn WorkerDelivery>>>,
}

impl SessionLeg {
    /// A session leg over the first connection's `delivery`.
    pub(crate) fn new(delivery: Arc<dyn WorkerDelivery>) -> Self {
        Self {
            transport: delivery.transport(),
            carries_capacity: delivery.registration_carries_capacity(),
            supports_drain: delivery.supports_drain(),
            current: RwLock::new(Some(delivery)),
        }
    }

    fn current(&self) -> Option<Arc<dyn WorkerDelivery>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Detaches the connection: the worker is suspended.
    pub(crate) fn detach(&self) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Attaches a resumed connection's `delivery`, replacing any other.
    pub(crate) fn attach(&self, delivery: Arc<dyn WorkerDelivery>) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(delivery);
    }
}

impl WorkerDelivery for SessionLeg {
    fn transport(&self) -> TransportName {
        self.transport.clone()
    }

    fn is_connected(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|delivery| delivery.is_connected())
    }

    fn registration_carries_capacity(&self) -> bool {
        self.carries_capacity
    }

    fn supports_drain(&self) -> bool {
        self.supports_drain
    }

    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        match self.current() {
            Some(delivery) => delivery.deliver(message),
            None => Err(DeliveryError::Closed),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    struct Recording(Mutex<Vec<WorkerMessage>>);

    impl WorkerDelivery for Recording {
        fn transport(&self) -> TransportName {
            TransportName::from_static("recording")
        }
        fn is_connected(&self) -> bool {
            true
        }
        fn registration_carries_capacity(&self) -> bool {
            true
        }
        fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
            self.0.lock().unwrap().push(message);
            Ok(())
        }
    }

    #[test]
    fn messages_reach_the_attached_connection_and_none_while_detached() {
        let first = Arc::new(Recording::default());
        let leg = SessionLeg::new(first.clone());
        assert!(leg.is_connected());
        leg.deliver(WorkerMessage::Drain).unwrap();
        leg.detach();
        assert!(!leg.is_connected(), "suspended");
        assert_eq!(
            leg.deliver(WorkerMessage::Drain),
            Err(DeliveryError::Closed)
        );
        let second = Arc::new(Recording::default());
        leg.attach(second.clone());
        assert!(leg.is_connected());
        leg.deliver(WorkerMessage::Ping { seq: 1 }).unwrap();
        assert_eq!(
            first.0.lock().unwrap().len(),
            1,
            "the old connection got only the first"
        );
        assert_eq!(
            *second.0.lock().unwrap(),
            vec![WorkerMessage::Ping { seq: 1 }]
        );
        assert_eq!(leg.transport().as_str(), "recording");
    }
}
