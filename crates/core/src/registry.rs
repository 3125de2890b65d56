//! The connected-worker registry: who is registered, who may take work, and the one selection.
//!
//! One lock guards all of it ([`state::State`]). Selection ([`Registry::select_and_reserve`])
//! chooses and claims a slot in one critical section; listing ([`Registry::workers_for`]) reads
//! the same eligible sets and advances the same cursor. Nothing inserts a worker except the
//! admission gate ([`Registry::admit`]).

mod census;
mod departure;
mod explain;
mod ids;
mod namespaces;
mod reservation;
mod rotation;
mod sessions;
pub(crate) mod state;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
mod token;
mod wakeups;
mod workers;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{Notify, broadcast};
use tokio::time::Instant;

pub use census::{PoolCensus, UnservedReason};
pub use departure::Departure;
pub(crate) use departure::departure as departure_pair;
pub use explain::WorkerExplanation;
pub use ids::{MAX_NODE_NUMBER, NodeNumber, WORKER_ID_NODE_SHIFT};
use namespaces::NamespaceLedger;
pub use namespaces::{DEFAULT_MAX_NAMESPACES_LIVE, DEFAULT_NAMESPACE_IDLE_EXPIRY, NamespaceSeries};
pub use reservation::DispatchReservation;
pub use token::RegistrationToken;
pub use wakeups::PoolWaiter;
pub(crate) use wakeups::shrink_after_drain;

use crate::address::{WorkerId, normalise_task_queue};
use crate::admission::AdmissionAudit;
use crate::arrival::WorkerArrival;
use crate::delivery::{DeliveryError, WorkerDelivery, WorkerMessage};
use crate::eligibility::DispatchExclusion;
use crate::events::{DisconnectReason, WorkerEvent};
use crate::namespace::{InMemoryNamespaceStore, NamespacePolicy, NamespaceStore};
use crate::worker::{Worker, WorkerSnapshot};
use wakeups::{PoolKey, Wake, WakeupTable};
use workers::Slot;

/// Default size of the event broadcast channel; a receiver that lags further loses events.
pub const DEFAULT_EVENT_CAPACITY: usize = 1024;

/// A callback told, outside the registry lock, each time a worker leaves.
pub type DepartureObserver = Arc<dyn Fn(WorkerId, DisconnectReason) + Send + Sync>;

/// The process-wide registry of connected workers; cheap to clone (all clones share state).
#[derive(Clone)]
pub struct Registry {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    state: Mutex<state::State>,
    arrivals: Arc<Notify>,
    wakeups: WakeupTable,
    pub(crate) namespaces: Mutex<NamespaceLedger>,
    events: broadcast::Sender<WorkerEvent>,
    pub(crate) store: Arc<dyn NamespaceStore>,
    pub(crate) policy: NamespacePolicy,
    pub(crate) audit: AdmissionAudit,
    observers: Mutex<Vec<DepartureObserver>>,
    pub(crate) opening_probation: bool,
    pub(crate) max_concurrency_limit: u32,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("workers", &self.inner.lock().workers.len())
            .finish()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::builder().build()
    }
}

/// Builds a [`Registry`].
pub struct RegistryBuilder {
    store: Arc<dyn NamespaceStore>,
    policy: NamespacePolicy,
    event_capacity: usize,
    audit_window: std::time::Duration,
    opening_probation: bool,
    max_concurrency_limit: u32,
    max_namespaces: usize,
    namespace_idle_expiry: std::time::Duration,
    node_number: NodeNumber,
}

impl RegistryBuilder {
    /// The number worker ids are minted under (default [`NodeNumber::NONE`]: ids are the
    /// plain process counter). A cluster node uses the number it holds, so two nodes never
    /// mint the same id; [`Registry::set_node_number`] sets it after the build.
    pub fn node_number(mut self, number: NodeNumber) -> Self {
        self.node_number = number;
        self
    }

    /// The most namespaces with live state (workers or dispatches) at once (default
    /// [`DEFAULT_MAX_NAMESPACES_LIVE`]; at least 1). A registration into a new namespace past
    /// it is refused with [`crate::AdmissionError::NamespaceLimit`].
    pub fn max_namespaces(mut self, limit: usize) -> Self {
        self.max_namespaces = limit.max(1);
        self
    }

    /// How long a namespace with no worker and no dispatch keeps its per-namespace series and
    /// minted store record (default [`DEFAULT_NAMESPACE_IDLE_EXPIRY`]).
    pub fn namespace_idle_expiry(mut self, expiry: std::time::Duration) -> Self {
        self.namespace_idle_expiry = expiry;
        self
    }

    /// Admit new workers on [`DispatchExclusion::OpeningProbation`] (default: false). A
    /// liveness prober that lifts probation must be running when this is on.
    pub fn opening_probation(mut self, on: bool) -> Self {
        self.opening_probation = on;
        self
    }

    /// The namespace store the gate consults (default: an empty in-memory store).
    pub fn namespace_store(mut self, store: Arc<dyn NamespaceStore>) -> Self {
        self.store = store;
        self
    }

    /// What to do with unknown namespaces (default: [`NamespacePolicy::Open`]).
    pub fn namespace_policy(mut self, policy: NamespacePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Size of the event broadcast channel (default [`DEFAULT_EVENT_CAPACITY`]).
    pub fn event_capacity(mut self, capacity: usize) -> Self {
        self.event_capacity = capacity.max(1);
        self
    }

    /// How long an identical refusal stays quiet in the logs after it was logged once
    /// (default 60 s).
    pub fn audit_window(mut self, window: std::time::Duration) -> Self {
        self.audit_window = window;
        self
    }

    /// The most slots one worker may state, on every transport, at registration or in an
    /// announcement (default [`crate::DEFAULT_MAX_CONCURRENCY_LIMIT`]; at least 1). More is
    /// refused with [`crate::AdmissionError::CapacityAboveLimit`].
    pub fn max_concurrency_limit(mut self, limit: u32) -> Self {
        self.max_concurrency_limit = limit.max(1);
        self
    }

    /// Builds the registry.
    pub fn build(self) -> Registry {
        let (events, _) = broadcast::channel(self.event_capacity);
        Registry {
            inner: Arc::new(Inner {
                state: Mutex::new(state::State {
                    node_number: self.node_number,
                    ..state::State::default()
                }),
                arrivals: Arc::new(Notify::new()),
                wakeups: WakeupTable::default(),
                namespaces: Mutex::new(NamespaceLedger::new(
                    self.max_namespaces,
                    self.namespace_idle_expiry,
                )),
                events,
                store: self.store,
                policy: self.policy,
                audit: AdmissionAudit::new(self.audit_window),
                observers: Mutex::new(Vec::new()),
                opening_probation: self.opening_probation,
                max_concurrency_limit: self.max_concurrency_limit,
            }),
        }
    }
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, state::State> {
        // Nothing panics while holding the lock, and every mutation keeps the state consistent
        // step by step, so a poisoned lock still guards valid data.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn wake(&self) {
        self.arrivals.notify_waiters();
    }

    /// Wakes the selections parked on the pools `worker` serves (and registry-wide
    /// [`WorkerArrival`] subscribers); parked selections of other pools are not touched.
    pub(crate) fn wake_pools(&self, worker: &Worker, how: Wake) {
        self.wakeups.lock().wake_pools(worker, how);
        self.wake();
    }

    pub(crate) fn ledger(&self) -> MutexGuard<'_, NamespaceLedger> {
        self.namespaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn emit(&self, event: WorkerEvent) {
        // No receiver is not an error: events are for whoever listens.
        let _ = self.events.send(event);
    }

    /// Frees one slot of `worker` (no-op once the worker has left) and wakes, per pool of the
    /// worker, the first selection parked there: one freed slot, one waiter. Registry-wide
    /// [`WorkerArrival`] subscribers are woken only when the slot made the worker selectable
    /// again (a worker that already had a free slot is not what a selection that just missed
    /// waits for), so the busiest path wakes nobody while no selection is parked.
    pub(crate) fn release(&self, worker: WorkerId, slot: Slot) {
        let (reopened, parked_on) = {
            let mut state = self.lock();
            let Some(reopened) = state.release(worker, slot) else {
                return;
            };
            // Read under the registry lock: a selection that missed queued itself before its
            // (locked) selection, so a release after that miss sees it queued. With nothing
            // queued anywhere the pools are not looked at (the busy path of an unparked load).
            let parked_on = self
                .wakeups
                .any_queued()
                .then(|| state.workers.get(worker).map(|e| e.worker.clone()))
                .flatten();
            (reopened, parked_on)
        };
        if let Some(worker) = parked_on {
            self.wakeups.lock().wake_pools(&worker, Wake::One);
        }
        if reopened {
            self.wake();
        }
    }

    /// Fences `worker` out of selection and tells it `message` (a drain or the shutdown).
    /// A worker not yet announced is told when it is: nothing reaches a worker before its
    /// transport's acknowledgement. Returns false for an unknown id.
    fn fence_and_tell(&self, worker: WorkerId, message: WorkerMessage) -> bool {
        let delivery = {
            let mut state = self.lock();
            let Some(entry) = state.workers.get_mut(worker) else {
                return false;
            };
            entry.draining = true;
            if !entry.announced {
                entry.deferred = Some(message);
                state.refresh_id(worker);
                return true;
            }
            let delivery = Arc::clone(entry.worker.delivery());
            state.refresh_id(worker);
            delivery
        };
        self.tell(worker, delivery.as_ref(), message);
        true
    }

    /// Delivers a drain or shutdown `message` to a fenced worker.
    fn tell(&self, worker: WorkerId, delivery: &dyn WorkerDelivery, message: WorkerMessage) {
        if !delivery.supports_drain() {
            tracing::error!(worker = %worker, transport = %delivery.transport(),
                "transport has no drain channel; deregistering the worker instead");
            self.deregister(worker, DisconnectReason::Drained);
            return;
        }
        let delivered = match delivery.deliver(message) {
            Err(DeliveryError::Unsupported(_)) => delivery.deliver(WorkerMessage::Drain),
            other => other,
        };
        match delivered {
            Ok(()) => tracing::info!(worker = %worker, "drain requested"),
            Err(DeliveryError::Closed) => {
                // A suspended session cannot hear the drain; draining it is letting it go.
                let suspended = self
                    .lock()
                    .workers
                    .get(worker)
                    .is_some_and(workers::WorkerEntry::is_suspended);
                let reason = if suspended {
                    DisconnectReason::Drained
                } else {
                    DisconnectReason::Disconnect
                };
                self.deregister(worker, reason);
            }
            Err(error) => {
                tracing::warn!(worker = %worker, %error, "drain request not delivered; worker stays fenced");
            }
        }
    }

    /// Announces an admitted worker: it becomes dispatchable, `Connected` (then the capacity
    /// it stated, if any) is emitted for it, and parked selections wake. False if it already
    /// was announced or has left.
    pub(crate) fn announce(&self, worker: WorkerId, generation: Option<u64>) -> bool {
        let announced = {
            let mut state = self.lock();
            let Some(entry) = state.workers.get_mut(worker) else {
                return false;
            };
            if entry.announced {
                return false;
            }
            // A token of an older connection cannot announce a newer one.
            let current = entry.session.as_ref().map(|session| session.generation);
            if generation.is_some() && generation != current {
                return false;
            }
            entry.announced = true;
            let resumed = entry.session.as_mut().and_then(|session| {
                std::mem::take(&mut session.resuming).then(|| Arc::clone(&session.leg))
            });
            // The resumed connection becomes current (what waited for its acknowledgement, owed
            // cancels first, goes out in order) before its standing is derived again.
            if let Some(leg) = &resumed {
                leg.commit();
            }
            let announced = (entry.worker.clone(), entry.capacity, entry.deferred.take());
            state.refresh_id(worker);
            (announced, resumed)
        };
        let ((announced, capacity, deferred), resumed) = announced;
        if resumed.is_some() {
            // The same worker on a new connection: watchers already saw it connect.
            tracing::debug!(worker = %worker, "resumed worker announced");
            self.emit(WorkerEvent::Resumed { worker });
            if let Some(message) = deferred {
                self.tell(worker, announced.delivery().as_ref(), message);
            }
            self.wake_pools(&announced, Wake::All);
            return true;
        }
        tracing::debug!(worker = %worker, "worker announced");
        self.emit(WorkerEvent::Connected {
            worker,
            transport: announced.transport().clone(),
            namespaces: announced.namespaces().clone(),
            task_queue: announced.task_queue().to_owned(),
            node: announced.node().cloned(),
        });
        // A capacity stated in the registration (or announced before the worker was) is
        // announced like a later announcement, so watchers see one `CapacityAnnounced` per
        // worker, after its `Connected`, whatever its transport.
        if let Some(capacity) = capacity {
            self.emit(WorkerEvent::CapacityAnnounced {
                worker,
                capacity: capacity.get(),
            });
        }
        if let Some(message) = deferred {
            self.tell(worker, announced.delivery().as_ref(), message);
        }
        self.wake_pools(&announced, Wake::All);
        true
    }

    /// The registered workers whose transport has announced them, the ones the prober pings.
    pub(crate) fn announced_workers(&self) -> Vec<WorkerId> {
        self.lock()
            .workers
            .entries()
            .filter(|entry| entry.announced && !entry.is_suspended())
            .map(|entry| entry.id)
            .collect()
    }

    pub(crate) fn deregister(&self, worker: WorkerId, reason: DisconnectReason) -> bool {
        let removed = {
            let mut state = self.lock();
            // A suspended worker is not pinged, so silence is no verdict on it; its grace decides.
            let suspended = state
                .workers
                .get(worker)
                .is_some_and(workers::WorkerEntry::is_suspended);
            if suspended && reason == DisconnectReason::Timeout {
                return false;
            }
            state.remove(worker, Instant::now())
        };
        let Some(entry) = removed else { return false };
        self.farewell(entry, reason);
        true
    }

    /// Everything that follows a worker's removal from the state: the namespace ledger, the
    /// log line and metrics, its transport's departure, the event and the observers.
    fn farewell(&self, entry: workers::WorkerEntry, reason: DisconnectReason) {
        let worker = entry.id;
        if entry.is_suspended() {
            metrics::gauge!(crate::metrics::WORKERS_SUSPENDED).decrement(1.0);
        }
        let w = &entry.worker;
        self.ledger()
            .left(w.namespaces(), w.transport(), Instant::now());
        tracing::info!(worker = %worker, transport = %w.transport(), reason = reason.as_str(),
            in_flight = entry.in_flight, "worker deregistered");
        metrics::counter!(crate::metrics::WORKER_DEPARTURES_TOTAL, "reason" => reason.as_str())
            .increment(1);
        if let Some(departure) = &entry.departure {
            departure.depart(reason);
        }
        self.emit(WorkerEvent::Disconnected { worker, reason });
        let observers = self
            .observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for observer in observers {
            observer(worker, reason);
        }
    }
}

impl Registry {
    /// Starts building a registry.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder {
            store: Arc::new(InMemoryNamespaceStore::new()),
            policy: NamespacePolicy::Open,
            event_capacity: DEFAULT_EVENT_CAPACITY,
            audit_window: std::time::Duration::from_secs(60),
            opening_probation: false,
            max_concurrency_limit: crate::DEFAULT_MAX_CONCURRENCY_LIMIT,
            max_namespaces: DEFAULT_MAX_NAMESPACES_LIVE,
            namespace_idle_expiry: DEFAULT_NAMESPACE_IDLE_EXPIRY,
            node_number: NodeNumber::NONE,
        }
    }

    /// Mints the ids of workers admitted from now on under `number`; refused (false, nothing
    /// changed) when `number` is below the current one, since ids rise in admission order.
    pub fn set_node_number(&self, number: NodeNumber) -> bool {
        let mut state = self.inner.lock();
        if number < state.node_number {
            return false;
        }
        state.node_number = number;
        true
    }

    /// The number worker ids are minted under now.
    pub fn node_number(&self) -> NodeNumber {
        self.inner.lock().node_number
    }

    /// Chooses the next eligible worker of `(namespace, task_queue, activity_type)` in
    /// round-robin order (only workers on `node` when given) and claims one of its slots.
    ///
    /// Choice and claim happen under one lock, so concurrent callers never claim more slots
    /// than a worker advertised. Dropping the reservation frees the slot.
    pub fn select_and_reserve(
        &self,
        namespace: &str,
        task_queue: &str,
        activity_type: &str,
        node: Option<&str>,
    ) -> Option<(Worker, DispatchReservation)> {
        let task_queue = normalise_task_queue(task_queue);
        let (worker, slot) =
            self.inner
                .lock()
                .claim_next(namespace, task_queue, activity_type, node)?;
        let reservation = DispatchReservation::new(Arc::clone(&self.inner), worker.id(), slot);
        Some((worker, reservation))
    }

    /// The eligible workers of `(namespace, task_queue, activity_type)` (on `node` when given)
    /// in rotation order, starting with the one whose turn it is; the cursor moves past it.
    pub fn workers_for(
        &self,
        namespace: &str,
        task_queue: &str,
        activity_type: &str,
        node: Option<&str>,
    ) -> Vec<Worker> {
        let task_queue = normalise_task_queue(task_queue);
        self.inner
            .lock()
            .listing(namespace, task_queue, activity_type, node)
    }

    /// A place, in arrival order, in the queue of selections parked on `(namespace,
    /// task_queue, activity_type)` (for workers on `node` when given); see [`PoolWaiter`].
    pub fn pool_waiter(
        &self,
        namespace: &str,
        task_queue: &str,
        activity_type: &str,
        node: Option<&str>,
    ) -> PoolWaiter {
        let key = PoolKey {
            namespace: namespace.to_owned(),
            task_queue: normalise_task_queue(task_queue).to_owned(),
            activity_type: activity_type.to_owned(),
        };
        PoolWaiter::new(self.inner.wakeups.clone(), key, node.map(str::to_owned))
    }

    /// A subscription that resolves on the next wake after this call (see [`WorkerArrival`]).
    pub fn worker_arrival(&self) -> WorkerArrival {
        WorkerArrival::new(Arc::clone(&self.inner.arrivals))
    }

    /// Sets the capacity of a worker whose transport announces it after registration, under
    /// the gate's capacity rule ([`Registry::check_announced_capacity`]). Growing wakes parked
    /// selections; shrinking below the in-flight count cancels nothing.
    pub fn set_advertised_capacity(
        &self,
        worker: WorkerId,
        max_concurrency: u32,
    ) -> Result<(), crate::AdmissionError> {
        let capacity = self.check_announced_capacity(worker, max_concurrency)?;
        let (announced, subject) = {
            let mut state = self.inner.lock();
            let entry = state
                .workers
                .get_mut(worker)
                .ok_or(crate::AdmissionError::UnknownWorker)?;
            entry.capacity = Some(capacity);
            entry.pending_capacity = None;
            let announced = entry.announced;
            let subject = entry.worker.clone();
            state.refresh_id(worker);
            (announced, subject)
        };
        tracing::debug!(worker = %worker, capacity = capacity.get(), "capacity announced");
        // A worker not yet announced gets its capacity event with its `Connected`.
        if announced {
            self.inner.emit(WorkerEvent::CapacityAnnounced {
                worker,
                capacity: capacity.get(),
            });
        }
        self.inner.wake_pools(&subject, Wake::All);
        Ok(())
    }

    /// Records that `worker` announced `announced` slots that its connection cannot carry yet
    /// (a transport that must open a stream per slot, waiting for the worker's permission), so
    /// operators see that instead of an unannounced capacity; the next
    /// [`Registry::set_advertised_capacity`] replaces it. The announcement passes the same
    /// capacity rule first.
    pub fn set_pending_capacity(
        &self,
        worker: WorkerId,
        announced: u32,
    ) -> Result<(), crate::AdmissionError> {
        let announced = self.check_announced_capacity(worker, announced)?;
        let mut state = self.inner.lock();
        if let Some(entry) = state.workers.get_mut(worker) {
            entry.pending_capacity = Some(announced);
        }
        Ok(())
    }

    /// Replaces the whole map of liveness exclusions (workers absent from `exclusions` are no
    /// longer excluded); wakes parked selections if that changed any worker's exclusion.
    pub fn set_dispatch_ineligible(&self, exclusions: HashMap<WorkerId, DispatchExclusion>) {
        self.publish_verdicts(exclusions, None);
    }

    /// Like [`Registry::set_dispatch_ineligible`], for a prober whose view of the registry
    /// ends at `newest_known`: workers admitted after it keep the exclusion they have (their
    /// opening probation), so a verdict computed before they arrived cannot clear it.
    pub fn publish_verdicts(
        &self,
        exclusions: HashMap<WorkerId, DispatchExclusion>,
        newest_known: Option<WorkerId>,
    ) {
        let mut changed = Vec::new();
        let mut touched_workers = Vec::new();
        let mut reopened = false;
        {
            let mut state = self.inner.lock();
            let previous = std::mem::take(&mut state.exclusions);
            // The prober knows no worker before its transport announces it, so a worker not yet
            // announced keeps its exclusion (its opening probation) whatever its id.
            let unannounced =
                |id: &WorkerId| state.workers.get(*id).is_some_and(|entry| !entry.announced);
            let kept: Vec<(WorkerId, DispatchExclusion)> = previous
                .iter()
                .filter(|(id, _)| {
                    newest_known.is_some_and(|newest| **id > newest) || unannounced(id)
                })
                .map(|(id, exclusion)| (*id, *exclusion))
                .collect();
            state.exclusions = exclusions
                .into_iter()
                .filter(|(id, _)| newest_known.is_none_or(|newest| *id <= newest))
                .chain(kept)
                .filter(|(id, _)| state.workers.contains(*id))
                .collect();
            let mut touched: Vec<WorkerId> = previous
                .keys()
                .chain(state.exclusions.keys())
                .copied()
                .collect();
            touched.sort_unstable();
            touched.dedup();
            for id in touched {
                let before = previous.get(&id).copied();
                let after = state.exclusions.get(&id).copied();
                let standing_changed = before != after;
                if standing_changed {
                    changed.push((id, before, after));
                }
                let reopened_now = state.refresh_id(id);
                reopened |= reopened_now;
                if standing_changed || reopened_now {
                    if let Some(entry) = state.workers.get(id) {
                        touched_workers.push(entry.worker.clone());
                    }
                }
            }
        }
        let wake = reopened || !changed.is_empty();
        for (worker, before, after) in changed {
            if let Some(event) = crate::events::standing_change(worker, before, after) {
                self.inner.emit(event);
            }
        }
        // The prober publishes every round: a round that changed nobody's standing wakes nobody.
        // A change does wake, even one that excludes, so parked dispatches re-read their reason.
        if wake {
            let mut wakeups = self.inner.wakeups.lock();
            for worker in &touched_workers {
                wakeups.wake_pools(worker, Wake::All);
            }
            drop(wakeups);
            self.inner.wake();
        }
    }

    /// Counts one more reclaimed task against `worker` (it neither answered nor acknowledged
    /// an ended task in time); returns its new count, `None` once it has left.
    pub(crate) fn mark_unresponsive(&self, worker: WorkerId) -> Option<u32> {
        let mut state = self.inner.lock();
        let entry = state.workers.get_mut(worker)?;
        entry.unresponsive = entry.unresponsive.saturating_add(1);
        Some(entry.unresponsive)
    }

    /// The current liveness exclusions.
    pub fn dispatch_exclusions(&self) -> HashMap<WorkerId, DispatchExclusion> {
        self.inner.lock().exclusions.clone()
    }

    /// Removes a worker, with a reason; emits one [`WorkerEvent::Disconnected`]. Returns false
    /// if it was not registered (deregistration is idempotent). A session worker found silent
    /// (`Timeout`) is suspended instead, for its reconnect grace, and its transport told to
    /// close the connection; a suspended one is not timed out again.
    pub fn deregister(&self, worker: WorkerId, reason: DisconnectReason) -> bool {
        if reason == DisconnectReason::Timeout {
            return self.inner.timed_out(worker);
        }
        self.inner.deregister(worker, reason)
    }

    /// Fences a worker out of selection, then asks its transport to drain it (final: the
    /// worker should not come back). A transport with no drain channel gets the worker
    /// deregistered instead. Returns false for an unknown id.
    pub fn drain_worker(&self, worker: WorkerId) -> bool {
        self.inner.fence_and_tell(worker, WorkerMessage::Drain)
    }

    /// Drains every registered worker; returns how many were asked.
    pub fn broadcast_drain(&self) -> usize {
        let ids: Vec<WorkerId> = self.inner.lock().workers.ids().collect();
        ids.into_iter().filter(|id| self.drain_worker(*id)).count()
    }

    /// Stops admitting workers ([`crate::AdmissionError::ShuttingDown`]), then fences every
    /// registered worker and tells it the gateway is stopping ([`WorkerMessage::ShuttingDown`]):
    /// finish in-flight work, then reconnect later. A leg that cannot carry that message is
    /// sent an ordinary drain. Returns how many were told.
    pub fn broadcast_shutdown(&self) -> usize {
        let ids: Vec<WorkerId> = {
            let mut state = self.inner.lock();
            state.closed = true;
            state.workers.ids().collect()
        };
        ids.into_iter()
            .filter(|id| self.inner.fence_and_tell(*id, WorkerMessage::ShuttingDown))
            .count()
    }

    /// True while `worker` is registered.
    pub fn is_registered(&self, worker: WorkerId) -> bool {
        self.inner.lock().workers.contains(worker)
    }

    /// The registered worker with this id.
    pub fn worker(&self, worker: WorkerId) -> Option<WorkerSnapshot> {
        let state = self.inner.lock();
        state
            .workers
            .get(worker)
            .map(|entry| snapshot(&state, entry))
    }

    /// The delivery legs of those of `items`' workers still registered, each beside its
    /// item, looked up under one lock (what a liveness round sends its pings through).
    pub(crate) fn deliveries_of<T>(
        &self,
        items: Vec<(WorkerId, T)>,
    ) -> Vec<(WorkerId, T, Arc<dyn WorkerDelivery>)> {
        let state = self.inner.lock();
        items
            .into_iter()
            .filter_map(|(worker, item)| {
                let entry = state.workers.get(worker)?;
                Some((worker, item, Arc::clone(&entry.delivery)))
            })
            .collect()
    }

    /// Every registered worker, ordered by id.
    pub fn workers(&self) -> Vec<WorkerSnapshot> {
        let state = self.inner.lock();
        let mut all: Vec<WorkerSnapshot> = state
            .workers
            .entries()
            .map(|entry| snapshot(&state, entry))
            .collect();
        all.sort_by_key(|s| s.worker.id());
        all
    }

    /// How many workers are registered.
    pub fn len(&self) -> usize {
        self.inner.lock().workers.len()
    }

    /// True when no worker is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Subscribes to worker events. A receiver that falls more than the channel's capacity
    /// behind gets `Lagged` and loses the oldest events.
    pub fn subscribe_events(&self) -> broadcast::Receiver<WorkerEvent> {
        self.inner.events.subscribe()
    }

    /// Registers a callback run (outside the lock) every time a worker leaves; the dispatcher
    /// uses it to re-dispatch the worker's tasks.
    pub fn observe_departures(&self, observer: DepartureObserver) {
        self.inner
            .observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(observer);
    }

    /// `switchyard_workers_connected{namespace, transport}` as of `now`: every namespace with
    /// workers or dispatches, and idle ones (at 0) until `namespace_idle_expiry` passes.
    pub fn namespace_series(&self, now: Instant) -> Vec<NamespaceSeries> {
        self.inner.ledger().series(now)
    }

    /// Namespaces the registry holds state for (live, or idle and not yet forgotten).
    pub fn namespaces_listed(&self) -> usize {
        self.inner.ledger().len()
    }

    /// Counts a dispatch running in `namespace` until the guard drops, so the namespace is
    /// not forgotten under it; a namespace the registry does not list is not added.
    pub fn namespace_in_use<'a>(&'a self, namespace: &'a str) -> NamespaceInUse<'a> {
        let counted = self.inner.ledger().dispatch_started(namespace);
        NamespaceInUse {
            inner: counted.then_some((&*self.inner, namespace)),
        }
    }

    /// The admission audit shared by every transport.
    pub fn admission_audit(&self) -> &AdmissionAudit {
        &self.inner.audit
    }
}

fn snapshot(state: &state::State, entry: &workers::WorkerEntry) -> WorkerSnapshot {
    WorkerSnapshot {
        worker: entry.worker.clone(),
        capacity: entry.capacity.map(NonZeroU32::get),
        in_flight: entry.in_flight,
        eligibility: state.standing(entry),
        connected_at: entry.connected_at,
        unresponsive: entry.unresponsive,
        suspended_for: entry
            .session
            .as_ref()
            .and_then(|session| session.suspended_until)
            .map(|until| until.saturating_duration_since(Instant::now())),
    }
}

/// A dispatch running in a namespace, counted until dropped (see
/// [`Registry::namespace_in_use`]).
#[must_use = "the namespace counts as in use only while the guard lives"]
pub struct NamespaceInUse<'a> {
    inner: Option<(&'a Inner, &'a str)>,
}

impl Drop for NamespaceInUse<'_> {
    fn drop(&mut self) {
        if let Some((inner, namespace)) = self.inner.take() {
            inner.ledger().dispatch_ended(namespace, Instant::now());
        }
    }
}

impl std::fmt::Debug for NamespaceInUse<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceInUse").finish_non_exhaustive()
    }
}
