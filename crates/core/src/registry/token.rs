//! Proof of admission held by a transport for as long as the worker's connection lives.

use std::sync::Arc;

use super::Inner;
use super::departure::Departure;
use crate::address::WorkerId;
use crate::events::DisconnectReason;

/// Returned by the admission gate; the worker stays registered while it lives.
///
/// A worker admitted with [`Registry::admit_unannounced`](crate::Registry::admit_unannounced)
/// is registered but not yet announced: it is counted and listed, but not dispatched to, not
/// pinged, and no `Connected` event has gone out. The transport calls
/// [`RegistrationToken::announce`] once its acknowledgement is on the wire, so nothing core
/// sends can overtake it.
///
/// [`RegistrationToken::departed`] resolves when core lets the worker go, with the reason:
/// the transport closes its connection then, with no map of its own.
///
/// Dropping it deregisters the worker with [`DisconnectReason::Disconnect`];
/// [`RegistrationToken::deregister`] names another reason. Either way the worker leaves once.
#[must_use = "dropping the token deregisters the worker at once"]
pub struct RegistrationToken {
    inner: Arc<Inner>,
    worker: WorkerId,
    departure: Departure,
    done: bool,
}

impl RegistrationToken {
    pub(crate) fn new(inner: Arc<Inner>, worker: WorkerId, departure: Departure) -> Self {
        Self {
            inner,
            worker,
            departure,
            done: false,
        }
    }

    /// The admitted worker's id.
    pub fn worker_id(&self) -> WorkerId {
        self.worker
    }

    /// Announces the worker: from now on it may be dispatched to and pinged, and `Connected`
    /// is emitted. Call it once the transport's acknowledgement is on its way to the worker.
    /// Returns false if it was already announced or has left.
    pub fn announce(&self) -> bool {
        self.inner.announce(self.worker)
    }

    /// Resolves when core lets the worker go (deregistration by anyone, liveness timeout,
    /// drain), with the reason; at once if it has already left. Cancel-safe.
    pub async fn departed(&self) -> DisconnectReason {
        self.departure.departed().await
    }

    /// A handle on the same departure, for a task that does not hold the token.
    pub fn departure(&self) -> Departure {
        self.departure.clone()
    }

    /// Deregisters now with `reason`; returns false if it had already left (for example,
    /// timed out by the liveness prober).
    pub fn deregister(mut self, reason: DisconnectReason) -> bool {
        self.done = true;
        self.inner.deregister(self.worker, reason)
    }
}

impl Drop for RegistrationToken {
    fn drop(&mut self) {
        if !self.done {
            self.inner
                .deregister(self.worker, DisconnectReason::Disconnect);
        }
    }
}

impl std::fmt::Debug for RegistrationToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrationToken")
            .field("worker", &self.worker)
            .finish()
    }
}
