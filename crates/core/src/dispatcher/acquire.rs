//! Finding a worker for a dispatch: select, or park on the arrival signal until one can take it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::budget::LossBudget;
use super::cancel::Cancel;
use super::overflow::{Forwarded, Offered, OverflowFuture, OverflowOffer};
use super::quota::{HeldInput, ParkedPlace};
use super::unserved::{ParkTicket, UnservedAddress};
use super::{DispatchHooks, Dispatcher};
use crate::address::normalise_task_queue;
use crate::delivery::TransportName;
use crate::outcome::{ActivityOutcome, ActivityRequest, DispatchError};
use crate::registry::{DispatchReservation, PoolWaiter, UnservedReason};
use crate::worker::Worker;

/// How long a parked dispatch keeps its last classification before it takes a new census.
/// Wakes can be frequent (every freed slot of the pool); a census per wake per parked
/// dispatch would cost more than the selection it explains.
const RECLASSIFY_AFTER: Duration = Duration::from_secs(1);

/// How long a dispatch whose offer to the other nodes is out stays off the unserved table.
/// Such an offer is answered within a round trip; listing each one (a census, a ticket in the
/// table and its removal) cost about as much as the offer. One still out this long, or
/// answered "no taker", is listed as any parked dispatch is.
pub(super) const OFFERED_UNLISTED: Duration = Duration::from_millis(250);

/// How long past its deadline a forwarded dispatch waits for the remote node's own
/// `TimedOut` before it ends `TimedOut` itself (the remote outcome crossing the network).
const FORWARD_GRACE: Duration = Duration::from_secs(2);

/// The detail of a dispatch that ended `no_capacity_in_cluster`; `unanswered` when one of its
/// offers got no answer in time, so a node may have started the task.
fn no_capacity_in_cluster(unanswered: bool) -> String {
    let reason = UnservedReason::NoCapacityInCluster;
    if unanswered {
        format!(
            "{reason}: no local worker can take it and no other node of the cluster was heard \
             to take the offer; an offer's answer was lost or late, so a node may have started \
             the task (it was asked to stop it)"
        )
    } else {
        format!(
            "{reason}: no local worker can take it and no other node of the cluster took the \
             offer"
        )
    }
}

/// The pool address a dispatch selects from (task queue normalised, empty node as none).
struct Pool<'a> {
    namespace: &'a str,
    task_queue: &'a str,
    activity_type: &'a str,
    node: Option<&'a str>,
}

/// Why [`Dispatcher::acquire`] found no worker.
pub(super) enum Missed {
    /// The wait ended (deadline, cancel, shutdown) with this outcome, or another node ran the
    /// dispatch and this is its outcome.
    Outcome(ActivityOutcome),
    /// Parking would pass a quota.
    Refused(DispatchError),
}

impl Dispatcher {
    /// Selects and reserves a worker, parking until one can take the dispatch or the wait
    /// ends (deadline, cancel, shutdown).
    ///
    /// The first selection takes no subscription of any kind: most dispatches find a worker
    /// there, and a registry-wide subscription per dispatch is a lock and a list entry on state
    /// every dispatch shares. After a miss the dispatch queues in its pool
    /// ([`crate::PoolWaiter`]) and selects once more before it waits: a change made between the
    /// miss and the queueing is seen by that selection, one made after it wakes the queue (a
    /// release reads the queues under the registry lock the selection takes). The waiter is
    /// armed before each selection, so a woken dispatch that loses the race keeps its place at
    /// the front; every later miss waits for a wake, so a pool that reads as served while
    /// selection finds nobody (a worker on probation, a slot being freed) parks instead of
    /// spinning.
    ///
    /// Parking counts against the parked quotas of the dispatch's namespace and principal
    /// (unless `hooks.durable`); when `refusable`, a dispatch that would pass one is refused
    /// instead of parked.
    pub(super) async fn acquire(
        &self,
        request: &ActivityRequest,
        deadline: Instant,
        cancel: &Cancel,
        held: &HeldInput<'_>,
        refusable: bool,
        hooks: &DispatchHooks,
    ) -> Result<(Worker, DispatchReservation), Missed> {
        let pool = Pool {
            namespace: &request.namespace,
            task_queue: normalise_task_queue(&request.task_queue),
            activity_type: &request.activity_type,
            node: request.node.as_deref().filter(|n| !n.is_empty()),
        };
        if let Some(hit) = self.select(&pool) {
            return Ok(hit);
        }
        // Most dispatches find a worker at the first try: the parked wait's state lives on
        // the heap, only for the dispatches that park, so every dispatch's future stays small.
        Box::pin(self.park(request, &pool, deadline, cancel, held, refusable, hooks)).await
    }

    /// One selection attempt, counted.
    fn select(&self, pool: &Pool<'_>) -> Option<(Worker, DispatchReservation)> {
        self.inner.selections.fetch_add(1, Ordering::Relaxed);
        self.inner.registry.select_and_reserve(
            pool.namespace,
            pool.task_queue,
            pool.activity_type,
            pool.node,
        )
    }

    /// After a first miss: takes a parked place (or refuses), queues in the pool's waiters,
    /// selects again, then once per wake until a worker takes the dispatch or the wait ends.
    /// It is listed in the unserved table once it waits, unless its offer to the other nodes
    /// is out and younger than [`OFFERED_UNLISTED`]. A pool with no local worker at all
    /// queues no waiter and selects no more while that offer is out: it does so when the offer
    /// comes back untaken or has been out [`OFFERED_UNLISTED`].
    #[allow(clippy::too_many_arguments)]
    async fn park(
        &self,
        request: &ActivityRequest,
        pool: &Pool<'_>,
        deadline: Instant,
        cancel: &Cancel,
        held: &HeldInput<'_>,
        refusable: bool,
        hooks: &DispatchHooks,
    ) -> Result<(Worker, DispatchReservation), Missed> {
        if hooks.local_only {
            return Err(Missed::Outcome(self.unserved_now(request)));
        }
        let registry = &self.inner.registry;
        let quotas = &self.inner.quotas;
        // A durable dispatch waits outside the parked quotas: the dispatch store bounds it.
        let _parked: Option<ParkedPlace<'_>> = if hooks.durable {
            None
        } else if refusable {
            Some(
                quotas
                    .park(&self.inner.config, held)
                    .map_err(Missed::Refused)?,
            )
        } else {
            Some(quotas.park_unrefused(held))
        };
        let mut waiting: Option<PoolWaiter> = None;
        let mut ticket: Option<ParkTicket> = None;
        let mut classified_at: Option<Instant> = None;
        let mut told: Option<UnservedReason> = None;
        // The loop's first pass queues the waiter and selects again at once, for what changed
        // between the miss and the queueing.
        let mut wait = false;
        // Durable dispatches stay on their node unless every node reads the same store.
        let overflow = self
            .inner
            .overflow
            .get()
            .filter(|overflow| !hooks.durable || overflow.carries_durable());
        // Each offer comes with the capacity hint it waits on if nobody takes it, taken as
        // the offer leaves: an announcement heard while the offer is out still wakes it.
        let offer = || {
            overflow
                .map(|overflow| {
                    let hint = overflow.capacity_hint(request);
                    let offered = overflow.offer(OverflowOffer {
                        request,
                        deadline,
                        attempt_offset: hooks.attempt_offset,
                    });
                    (offered, hint)
                })
                .unzip()
        };
        let (mut offering, mut offer_hint): (
            Option<OverflowFuture<Offered>>,
            Option<OverflowFuture<()>>,
        ) = offer();
        // With no local worker at all in the pool, nothing local can free a slot: while the
        // first offer is out the dispatch waits on it alone, without a pool waiter or a second
        // selection. An arrival meanwhile is seen when the offer comes back untaken or has been
        // out for `OFFERED_UNLISTED`, whichever is first.
        let mut waiting_deferred = offering.is_some()
            && !registry.has_compatible_workers(
                pool.namespace,
                pool.task_queue,
                pool.activity_type,
                pool.node,
            );
        let mut hint: Option<OverflowFuture<()>> = None;
        let mut no_taker = false;
        // An offer went unanswered: a node may have started the task (see `Offered`).
        let mut unanswered = false;
        let mut losses =
            LossBudget::new(self.inner.config.loss_budget, self.inner.config.loss_window);
        let mut forwarded: u32 = 0;
        // Off the unserved table while the first offer is out (see `OFFERED_UNLISTED`); one
        // timer serves that and the deadline, for every pass of the loop.
        let mut unlisted = offering.is_some();
        let timer = tokio::time::sleep_until(if unlisted {
            deadline.min(Instant::now() + OFFERED_UNLISTED)
        } else {
            deadline
        });
        tokio::pin!(timer);
        loop {
            if wait {
                if unlisted && (offering.is_none() || no_taker) {
                    unlisted = false;
                    timer.as_mut().reset(deadline);
                }
                if waiting_deferred && !(unlisted && offering.is_some()) {
                    // The deferral is over: queue in the pool and look once more, for a worker
                    // that arrived while the offer was out.
                    waiting_deferred = false;
                    let waiter = waiting.insert(registry.pool_waiter(
                        pool.namespace,
                        pool.task_queue,
                        pool.activity_type,
                        pool.node,
                    ));
                    waiter.arm();
                    if let Some(hit) = self.select(pool) {
                        return Ok(hit);
                    }
                }
                let now = Instant::now();
                if !unlisted
                    && classified_at
                        .is_none_or(|at| now.saturating_duration_since(at) >= RECLASSIFY_AFTER)
                {
                    let census = registry.pool_census(
                        pool.namespace,
                        pool.task_queue,
                        pool.activity_type,
                        pool.node,
                    );
                    let reason = match census.classify() {
                        _ if no_taker => UnservedReason::NoCapacityInCluster,
                        Some(reason) => reason,
                        None => UnservedReason::OnProbation,
                    };
                    if let Some(parked) = &hooks.on_parked
                        && told != Some(reason)
                    {
                        parked(reason);
                        told = Some(reason);
                    }
                    match &ticket {
                        Some(ticket) => ticket.reclassify(reason, &census),
                        None => {
                            let address = UnservedAddress {
                                namespace: request.namespace.clone(),
                                task_queue: pool.task_queue.to_owned(),
                                activity_type: request.activity_type.clone(),
                                node: pool.node.map(str::to_owned),
                            };
                            ticket = Some(self.inner.unserved.park(address, reason, &census));
                        }
                    }
                    classified_at = Some(now);
                }
                tokio::select! {
                    () = woken(&mut waiting) => {}
                    offered = settle(&mut offering) => {
                        offering = None;
                        match offered {
                            Offered::NoTaker | Offered::Unanswered => {
                                unanswered |= matches!(offered, Offered::Unanswered);
                                hint = offer_hint.take();
                                if !no_taker {
                                    no_taker = true;
                                    classified_at = None;
                                }
                            }
                            Offered::Taken(remote) => {
                                forwarded += 1;
                                match self.forwarded(remote, deadline, cancel).await {
                                    Forwarded::Outcome(outcome) => {
                                        return Err(Missed::Outcome(outcome));
                                    }
                                    Forwarded::Lost if !losses.record(Instant::now()) => {
                                        return Err(Missed::Outcome(
                                            ActivityOutcome::TransportLost {
                                                transport: TransportName::from_static("cluster"),
                                                attempts: forwarded,
                                            },
                                        ));
                                    }
                                    Forwarded::Lost => (offering, offer_hint) = offer(),
                                }
                            }
                        }
                        continue;
                    }
                    () = settle(&mut hint) => {
                        hint = None;
                        (offering, offer_hint) = offer();
                        continue;
                    }
                    () = &mut timer => {
                        if unlisted && Instant::now() < deadline {
                            // The offer is out longer than a round trip: list the dispatch.
                            unlisted = false;
                            timer.as_mut().reset(deadline);
                            continue;
                        }
                        let outcome = if no_taker {
                            let reason = UnservedReason::NoCapacityInCluster;
                            ActivityOutcome::Unserved {
                                reason,
                                detail: no_capacity_in_cluster(unanswered),
                            }
                        } else {
                            self.unserved_now(request)
                        };
                        return Err(Missed::Outcome(outcome));
                    }
                    () = cancel.cancelled() => {
                        return Err(Missed::Outcome(ActivityOutcome::Cancelled));
                    }
                    () = self.inner.stop_parked.cancelled() => {
                        return Err(Missed::Outcome(ActivityOutcome::ShuttingDown));
                    }
                }
            }
            wait = true;
            if waiting_deferred {
                continue;
            }
            waiting
                .get_or_insert_with(|| {
                    registry.pool_waiter(
                        pool.namespace,
                        pool.task_queue,
                        pool.activity_type,
                        pool.node,
                    )
                })
                .arm();
            if let Some(hit) = self.select(pool) {
                return Ok(hit);
            }
        }
    }

    /// Waits for the end of a dispatch another node took: its outcome, its loss, or this
    /// dispatch stopping (dropping `remote` cancels the remote task).
    async fn forwarded(
        &self,
        remote: OverflowFuture<Forwarded>,
        deadline: Instant,
        cancel: &Cancel,
    ) -> Forwarded {
        tokio::select! {
            // An end already in the answer registers no timer and no shutdown wait.
            biased;
            ended = remote => ended,
            () = cancel.cancelled() => Forwarded::Outcome(ActivityOutcome::Cancelled),
            () = self.inner.stop_all.cancelled() => Forwarded::Outcome(ActivityOutcome::ShuttingDown),
            () = tokio::time::sleep_until(deadline + FORWARD_GRACE) => {
                Forwarded::Outcome(ActivityOutcome::TimedOut)
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

/// Resolves once `waiter` was woken; never without one.
async fn woken(waiter: &mut Option<PoolWaiter>) {
    match waiter {
        Some(waiter) => waiter.woken().await,
        None => std::future::pending().await,
    }
}

/// Resolves with `future`'s output, or never when there is none.
async fn settle<T>(future: &mut Option<OverflowFuture<T>>) -> T {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/cluster.md`: a forwarded dispatch whose outcome is lost ends `timed_out` 2 s after
    /// its deadline; one whose offer is out stays off the unserved table for up to 250 ms.
    #[test]
    fn the_forwarding_waits_are_the_documented_ones() {
        assert_eq!(FORWARD_GRACE, Duration::from_secs(2));
        assert_eq!(OFFERED_UNLISTED, Duration::from_millis(250));
    }
}
