//! Finding a worker for a dispatch: select, or park on the arrival signal until one can take it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Dispatcher;
use super::unserved::{ParkTicket, UnservedAddress};
use crate::address::normalise_task_queue;
use crate::outcome::{ActivityOutcome, ActivityRequest};
use crate::registry::{DispatchReservation, UnservedReason};
use crate::worker::Worker;

/// How long a parked dispatch keeps its last classification before it takes a new census.
/// Wakes can be frequent (every freed slot in the registry); a census per wake per parked
/// dispatch would cost more than the selection it explains.
const RECLASSIFY_AFTER: Duration = Duration::from_secs(1);

impl Dispatcher {
    /// Selects and reserves a worker, parking until one can take the dispatch or the wait
    /// ends (deadline, cancel, shutdown).
    ///
    /// The arrival subscription is taken before each selection, so a wake between a miss and
    /// the wait is not lost; every miss waits for a wake, so a pool that reads as served while
    /// selection finds nobody (a worker on probation, a slot being freed) parks instead of
    /// spinning.
    pub(super) async fn acquire(
        &self,
        request: &ActivityRequest,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<(Worker, DispatchReservation), ActivityOutcome> {
        let registry = &self.inner.registry;
        let task_queue = normalise_task_queue(&request.task_queue);
        let node = request.node.as_deref().filter(|n| !n.is_empty());
        let mut ticket: Option<ParkTicket> = None;
        let mut classified_at: Option<Instant> = None;
        loop {
            let arrival = registry.worker_arrival();
            self.inner.selections.fetch_add(1, Ordering::Relaxed);
            if let Some(hit) = registry.select_and_reserve(
                &request.namespace,
                task_queue,
                &request.activity_type,
                node,
            ) {
                return Ok(hit);
            }
            let now = Instant::now();
            if classified_at.is_none_or(|at| now.saturating_duration_since(at) >= RECLASSIFY_AFTER)
            {
                let census = registry.pool_census(
                    &request.namespace,
                    task_queue,
                    &request.activity_type,
                    node,
                );
                let reason = census.classify().unwrap_or(UnservedReason::OnProbation);
                match &ticket {
                    Some(ticket) => ticket.reclassify(reason, &census),
                    None => {
                        let address = UnservedAddress {
                            namespace: request.namespace.clone(),
                            task_queue: task_queue.to_owned(),
                            activity_type: request.activity_type.clone(),
                            node: node.map(str::to_owned),
                        };
                        ticket = Some(self.inner.unserved.park(address, reason, &census));
                    }
                }
                classified_at = Some(now);
            }
            tokio::select! {
                () = arrival => {}
                () = tokio::time::sleep_until(deadline) => return Err(self.unserved_now(request)),
                () = cancel.cancelled() => return Err(ActivityOutcome::Cancelled),
                () = self.inner.stop_parked.cancelled() => {
                    return Err(ActivityOutcome::ShuttingDown);
                }
            }
        }
    }

    /// The `Unserved` outcome for a dispatch whose deadline passed before any worker took it.
    pub(super) fn unserved_now(&self, request: &ActivityRequest) -> ActivityOutcome {
        let node = request.node.as_deref().filter(|n| !n.is_empty());
        let census = self.inner.registry.pool_census(
            &request.namespace,
            &request.task_queue,
            &request.activity_type,
            node,
        );
        // Served at this instant means a worker freed up just as the deadline passed.
        let reason = census.classify().unwrap_or(UnservedReason::AllAtCapacity);
        let detail = census
            .describe()
            .unwrap_or_else(|| reason.as_str().to_owned());
        ActivityOutcome::Unserved { reason, detail }
    }
}
