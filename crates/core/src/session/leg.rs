//! The delivery leg core keeps for a session worker: connections come and go beneath it.

use std::sync::{Arc, PoisonError, RwLock};

use crate::delivery::{DeliveryError, TransportName, WorkerDelivery, WorkerMessage};

/// The most messages held for a resumed connection before its acknowledgement is out.
const MAX_STAGED_MESSAGES: usize = 4096;

/// Wraps the leg of a session worker's current connection. Every holder (the registry entry,
/// the worker handle, each pending task) keeps this one leg, so a resume swaps the connection
/// in one place; while suspended it is disconnected and refuses every message as `Closed`.
///
/// A resumed connection is first staged: until its transport has the acknowledgement on the
/// wire ([`SessionLeg::commit`]) tasks are refused as `Closed` (their dispatch selects again)
/// and every other message waits, in order, so nothing overtakes the acknowledgement.
pub(crate) struct SessionLeg {
    transport: TransportName,
    carries_capacity: bool,
    supports_drain: bool,
    current: RwLock<Option<Arc<dyn WorkerDelivery>>>,
    staged: std::sync::Mutex<Option<Staged>>,
}

/// A resumed connection waiting for its acknowledgement, with what waits for it.
struct Staged {
    delivery: Arc<dyn WorkerDelivery>,
    waiting: Vec<WorkerMessage>,
}

impl SessionLeg {
    /// A session leg over the first connection's `delivery`.
    pub(crate) fn new(delivery: Arc<dyn WorkerDelivery>) -> Self {
        Self {
            transport: delivery.transport(),
            carries_capacity: delivery.registration_carries_capacity(),
            supports_drain: delivery.supports_drain(),
            current: RwLock::new(Some(delivery)),
            staged: std::sync::Mutex::new(None),
        }
    }

    fn lock_staged(&self) -> std::sync::MutexGuard<'_, Option<Staged>> {
        self.staged.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn current(&self) -> Option<Arc<dyn WorkerDelivery>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Detaches the connection (and any staged one): the worker is suspended.
    pub(crate) fn detach(&self) {
        *self.lock_staged() = None;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Stages a resumed connection's `delivery`: the connection it replaces (if still up) gets
    /// nothing more, and nothing reaches the new one until [`SessionLeg::commit`].
    pub(crate) fn stage(&self, delivery: Arc<dyn WorkerDelivery>) {
        let mut staged = self.lock_staged();
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = None;
        *staged = Some(Staged {
            delivery,
            waiting: Vec::new(),
        });
    }

    /// Puts `first` ahead of everything waiting for the staged connection, replacing what an
    /// earlier call put there. Nothing happens when no connection is staged.
    pub(crate) fn stage_first(&self, first: Vec<WorkerMessage>) {
        if let Some(staged) = self.lock_staged().as_mut() {
            let later = std::mem::take(&mut staged.waiting);
            staged.waiting = first;
            staged.waiting.extend(later);
        }
    }

    /// Makes the staged connection current and hands it, in order, what waited for it.
    /// False when nothing was staged.
    pub(crate) fn commit(&self) -> bool {
        let mut staged = self.lock_staged();
        let Some(Staged { delivery, waiting }) = staged.take() else {
            return false;
        };
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&delivery));
        // Still under the staging lock, so nothing sent meanwhile can overtake these.
        for message in waiting {
            if let Err(error) = delivery.deliver(message) {
                tracing::debug!(%error, "message held for a resumed connection not delivered");
            }
        }
        true
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
        if let Some(delivery) = self.current() {
            return delivery.deliver(message);
        }
        let mut staged = self.lock_staged();
        // Committed between the two looks: deliver as usual.
        if let Some(delivery) = self.current() {
            drop(staged);
            return delivery.deliver(message);
        }
        match staged.as_mut() {
            None => Err(DeliveryError::Closed),
            // A task would reach the worker before it learns it resumed: select again.
            Some(_) if matches!(message, WorkerMessage::Task(_)) => Err(DeliveryError::Closed),
            Some(held) if held.waiting.len() >= MAX_STAGED_MESSAGES => Err(DeliveryError::Full),
            Some(held) => {
                held.waiting.push(message);
                Ok(())
            }
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
        leg.stage(second.clone());
        assert!(!leg.is_connected(), "staged, not yet acknowledged");
        leg.deliver(WorkerMessage::Ping { seq: 2 }).unwrap();
        leg.stage_first(vec![WorkerMessage::Ping { seq: 1 }]);
        assert!(
            second.0.lock().unwrap().is_empty(),
            "nothing before the commit"
        );
        assert!(leg.commit());
        assert!(leg.is_connected());
        leg.deliver(WorkerMessage::Ping { seq: 3 }).unwrap();
        assert_eq!(
            first.0.lock().unwrap().len(),
            1,
            "the old connection got only the first"
        );
        assert_eq!(
            *second.0.lock().unwrap(),
            vec![
                WorkerMessage::Ping { seq: 1 },
                WorkerMessage::Ping { seq: 2 },
                WorkerMessage::Ping { seq: 3 }
            ],
            "held messages first, in order"
        );
        assert!(!leg.commit(), "nothing staged any more");
        assert_eq!(leg.transport().as_str(), "recording");
    }
}
