//! A claimed dispatch slot on one worker; dropping it frees the slot.

use std::sync::Arc;

use super::Inner;
use super::workers::Slot;
use crate::address::WorkerId;

/// One slot of one worker's advertised capacity, held from selection until the task ends.
///
/// The worker's in-flight count is exactly the number of live reservations on it, so a task
/// that owns one reservation can never be counted twice.
#[must_use = "dropping a reservation frees the slot at once"]
pub struct DispatchReservation {
    inner: Arc<Inner>,
    worker: WorkerId,
    slot: Slot,
}

impl DispatchReservation {
    pub(super) fn new(inner: Arc<Inner>, worker: WorkerId, slot: Slot) -> Self {
        Self {
            inner,
            worker,
            slot,
        }
    }

    /// The worker whose slot this is.
    pub fn worker(&self) -> WorkerId {
        self.worker
    }
}

impl Drop for DispatchReservation {
    fn drop(&mut self) {
        self.inner.release(self.worker, self.slot);
    }
}

impl std::fmt::Debug for DispatchReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchReservation")
            .field("worker", &self.worker)
            .finish()
    }
}
