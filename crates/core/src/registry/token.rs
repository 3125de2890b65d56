//! Proof of admission held by a transport for as long as the worker's connection lives.

use std::sync::Arc;

use super::Inner;
use crate::address::WorkerId;
use crate::events::DisconnectReason;

/// Returned by the admission gate; the worker stays registered while it lives.
///
/// Dropping it deregisters the worker with [`DisconnectReason::Disconnect`];
/// [`RegistrationToken::deregister`] names another reason. Either way the worker leaves once.
#[must_use = "dropping the token deregisters the worker at once"]
pub struct RegistrationToken {
    inner: Arc<Inner>,
    worker: WorkerId,
    done: bool,
}

impl RegistrationToken {
    pub(crate) fn new(inner: Arc<Inner>, worker: WorkerId) -> Self {
        Self {
            inner,
            worker,
            done: false,
        }
    }

    /// The admitted worker's id.
    pub fn worker_id(&self) -> WorkerId {
        self.worker
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
