//! Proof of admission held by a transport for as long as the worker's connection lives.

use std::sync::Arc;

use super::Inner;
use super::departure::Departure;
use crate::address::WorkerId;
use crate::events::DisconnectReason;
use crate::session::SessionGrant;

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
/// Dropping it deregisters the worker with [`DisconnectReason::Disconnect`] (a session worker
/// is suspended instead, see [`RegistrationToken::session`]); [`RegistrationToken::deregister`]
/// names another reason. Either way the worker leaves once.
#[must_use = "dropping the token deregisters the worker at once"]
pub struct RegistrationToken {
    inner: Arc<Inner>,
    worker: WorkerId,
    departure: Departure,
    /// The worker's session and the generation of the connection this token stands for.
    session: Option<(SessionGrant, u64)>,
    done: bool,
}

impl RegistrationToken {
    pub(crate) fn new(inner: Arc<Inner>, worker: WorkerId, departure: Departure) -> Self {
        Self {
            inner,
            worker,
            departure,
            session: None,
            done: false,
        }
    }

    /// The same token for generation `generation` of a worker with session `grant`.
    pub(crate) fn with_session(mut self, grant: SessionGrant, generation: u64) -> Self {
        self.session = Some((grant, generation));
        self
    }

    /// The worker's session, for the transport's acknowledgement; `None` when it registered
    /// without one (not resumable, or the transport's grace is zero).
    pub fn session(&self) -> Option<&SessionGrant> {
        self.session.as_ref().map(|(grant, _)| grant)
    }

    /// Ends this connection of the worker with `reason`: a session worker whose connection was
    /// lost (`Disconnect`) is suspended, anything else leaves; a token a resume replaced does
    /// nothing.
    fn end(&self, reason: DisconnectReason) -> bool {
        match &self.session {
            Some((_, generation)) => self
                .inner
                .connection_ended(self.worker, *generation, reason),
            None => self.inner.deregister(self.worker, reason),
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
        self.inner.announce(
            self.worker,
            self.session.as_ref().map(|(_, generation)| *generation),
        )
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
    /// timed out by the liveness prober). A session worker's `Disconnect` (its connection was
    /// lost, no drain under way) suspends it instead, for its reconnect grace; a token that a
    /// resume replaced does nothing.
    pub fn deregister(mut self, reason: DisconnectReason) -> bool {
        self.done = true;
        self.end(reason)
    }
}

impl Drop for RegistrationToken {
    fn drop(&mut self) {
        if !self.done {
            self.end(DisconnectReason::Disconnect);
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
