//! Hung-handler reclaim: a task whose dispatch ended and that its worker neither answered nor
//! acknowledged within `cancel_ack_timeout` gives its slot back, and counts against the worker;
//! a worker at `max_unresponsive_tasks` is drained and deregistered as unresponsive.
//!
//! The decision is plain data ([`super::table::TaskTable::reclaim`], driven by `now`); the
//! driver is one timer per ended task, holding the dispatcher weakly.

use std::sync::PoisonError;

use tokio::time::Instant;

use super::Inner;
use crate::delivery::TaskId;
use crate::events::DisconnectReason;

impl Inner {
    /// Starts the timer after which `task`, if its worker still holds it without answer or
    /// acknowledgement, is reclaimed ([`Inner::reclaim`]).
    pub(super) fn schedule_reclaim(&self, task: TaskId) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime (a dispatch dropped during runtime teardown): nothing will run again.
            return;
        };
        let weak = self.weak_self.clone();
        let timeout = self.config.cancel_ack_timeout;
        runtime.spawn(async move {
            tokio::time::sleep(timeout).await;
            if let Some(inner) = weak.upgrade() {
                inner.reclaim(task, Instant::now());
            }
        });
    }

    /// Frees the slot of an ended task its worker neither answered nor acknowledged within
    /// `cancel_ack_timeout`, and counts it against the worker; a worker reaching
    /// `max_unresponsive_tasks` is drained and deregistered as
    /// [`DisconnectReason::Unresponsive`].
    pub(super) fn reclaim(&self, task: TaskId, now: Instant) {
        let removed = self
            .lock_tasks()
            .reclaim(task, now, self.config.cancel_ack_timeout);
        let Some(pending) = removed else { return };
        let worker = pending.reservation.worker();
        drop(pending);
        metrics::counter!(crate::metrics::TASKS_RECLAIMED_TOTAL).increment(1);
        let Some(count) = self.registry.mark_unresponsive(worker) else {
            return;
        };
        let limit = self.config.max_unresponsive_tasks;
        if self
            .reclaim_log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .allow("dispatch.cancel_ack_timeout", now.into_std())
            .is_some()
        {
            tracing::warn!(worker = %worker, task = %task, unresponsive = count,
                max_unresponsive_tasks = limit,
                timeout_ms = self.config.cancel_ack_timeout.as_millis() as u64,
                "worker neither answered nor acknowledged an ended task within \
                 `dispatch.cancel_ack_timeout`; its slot was reclaimed");
        }
        if count >= limit {
            tracing::warn!(worker = %worker, unresponsive = count,
                "`dispatch.max_unresponsive_tasks` reached; draining and removing the worker");
            self.registry.drain_worker(worker);
            self.registry
                .deregister(worker, DisconnectReason::Unresponsive);
        }
        self.ended();
    }
}
