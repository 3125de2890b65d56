//! The registry's data, guarded by one lock: workers, rotations, exclusions and departures.
//!
//! Every change that can alter a worker's standing goes through [`State::refresh`], which
//! re-derives [`Eligibility`] and moves the worker in or out of its rotations' eligible sets;
//! [`State::claim_next`] and [`State::listing`] read those sets and move the one cursor.

use std::collections::HashMap;
use std::num::NonZeroU32;

use tokio::time::Instant;

use super::departure::DepartureSender;
use super::rotation::{Members, Rotation};
use super::workers::{Slot, WorkerEntry, WorkerTable};
use crate::address::{ActivityKey, Node, WorkerId};
use crate::eligibility::{DispatchExclusion, Eligibility};
use crate::worker::Worker;

/// One `(namespace, task queue)` pool: its head count and a rotation per activity type.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    /// Registered workers in the pool, whatever they run.
    pub(crate) workers: usize,
    pub(crate) rotations: HashMap<String, Rotation>,
}

/// How many `(activity key, node)` departure records the registry keeps before forgetting the
/// oldest, so caller-chosen names cannot grow it without bound.
const DEPARTURE_MEMORY: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) workers: WorkerTable,
    /// namespace → task queue → activity type → rotation; nested so lookups borrow `&str`.
    pub(crate) pools: HashMap<String, HashMap<String, Queue>>,
    pub(crate) exclusions: HashMap<WorkerId, DispatchExclusion>,
    /// When the last worker serving a key on a node left.
    pub(crate) departures: HashMap<ActivityKey, HashMap<Option<Node>, Instant>>,
    /// Set once the gateway started shutting down: no worker is admitted any more.
    pub(crate) closed: bool,
    /// The number new worker ids are minted under ([`super::ids`]); only ever rises.
    pub(crate) node_number: super::ids::NodeNumber,
}

impl State {
    /// A fresh id, larger than every id this registry minted before (the counter rises and
    /// the node number never falls). Called under the registry lock, so ids rise in admission
    /// order within one registry (the liveness watermark relies on it).
    pub(crate) fn mint_id(&mut self) -> WorkerId {
        super::ids::compose(self.node_number, super::ids::next_counter())
    }

    pub(crate) fn rotation(
        &self,
        namespace: &str,
        task_queue: &str,
        activity: &str,
    ) -> Option<&Rotation> {
        self.queue(namespace, task_queue)?.rotations.get(activity)
    }

    pub(crate) fn queue(&self, namespace: &str, task_queue: &str) -> Option<&Queue> {
        self.pools.get(namespace)?.get(task_queue)
    }

    /// The standing of a registered worker, ignoring which dispatch asks. A worker not yet
    /// announced stands as not connected: its transport has not told it it is registered.
    pub(crate) fn standing(&self, entry: &WorkerEntry) -> Eligibility {
        Eligibility::derive(
            entry.is_suspended(),
            entry.announced && entry.delivery.is_connected(),
            entry.draining,
            self.exclusions.get(&entry.id).copied(),
            entry.capacity,
            entry.pending_capacity,
            entry.in_flight,
        )
    }

    /// Chooses the next eligible, connected worker of the key in turn (on `node` when given),
    /// claims one of its slots and moves the cursor past it.
    pub(crate) fn claim_next(
        &mut self,
        namespace: &str,
        task_queue: &str,
        activity: &str,
        node: Option<&str>,
    ) -> Option<(Worker, Slot)> {
        let Self { pools, workers, .. } = self;
        let rotation = pools
            .get_mut(namespace)?
            .get_mut(task_queue)?
            .rotations
            .get_mut(activity)?;
        let (id, slot) = rotation.in_turn(node).find(|(_, slot)| {
            workers
                .at(*slot)
                .is_some_and(|entry| entry.delivery.is_connected())
        })?;
        rotation.advance(id);
        let entry = workers.at_mut(slot)?;
        entry.in_flight += 1;
        let worker = entry.worker.clone();
        self.refresh(slot);
        Some((worker, slot))
    }

    /// Frees one slot claimed on the worker `id` at `slot`; returns whether that made the
    /// worker selectable again, `None` when the slot's worker has left (nothing freed).
    pub(crate) fn release(&mut self, id: WorkerId, slot: Slot) -> Option<bool> {
        let entry = self.workers.at_mut(slot)?;
        if entry.id != id {
            return None;
        }
        entry.in_flight = entry.in_flight.saturating_sub(1);
        Some(self.refresh(slot))
    }

    /// The eligible, connected workers of the key in turn; the cursor moves past the first.
    pub(crate) fn listing(
        &mut self,
        namespace: &str,
        task_queue: &str,
        activity: &str,
        node: Option<&str>,
    ) -> Vec<Worker> {
        let Self { pools, workers, .. } = self;
        let Some(rotation) = pools
            .get_mut(namespace)
            .and_then(|queues| queues.get_mut(task_queue))
            .and_then(|queue| queue.rotations.get_mut(activity))
        else {
            return Vec::new();
        };
        let listed: Vec<Worker> = rotation
            .in_turn(node)
            .filter_map(|(_, slot)| workers.at(slot))
            .filter(|entry| entry.delivery.is_connected())
            .map(|entry| entry.worker.clone())
            .collect();
        if let Some(first) = listed.first() {
            rotation.advance(first.id());
        }
        listed
    }

    pub(crate) fn insert(
        &mut self,
        worker: Worker,
        capacity: Option<NonZeroU32>,
        departure: DepartureSender,
        session: Option<(
            crate::session::SessionGrant,
            std::sync::Arc<crate::session::SessionLeg>,
        )>,
    ) {
        let id = worker.id();
        let mut entry = WorkerEntry::new(worker.clone(), capacity);
        entry.departure = Some(departure);
        entry.session = session.map(|(grant, leg)| super::sessions::SessionState {
            grant,
            leg,
            generation: 0,
            suspended_until: None,
            resuming: false,
        });
        let slot = self.workers.insert(entry);
        for namespace in worker.namespaces() {
            let queue = self
                .pools
                .entry(namespace.clone())
                .or_default()
                .entry(worker.task_queue().to_owned())
                .or_default();
            queue.workers += 1;
            for activity in worker.activity_types() {
                queue
                    .rotations
                    .entry(activity.clone())
                    .or_default()
                    .join(id, slot);
                let key =
                    ActivityKey::new(namespace.as_str(), worker.task_queue(), activity.as_str());
                if let Some(nodes) = self.departures.get_mut(&key) {
                    nodes.remove(&worker.node().cloned());
                    if nodes.is_empty() {
                        self.departures.remove(&key);
                    }
                }
            }
        }
        self.refresh(slot);
    }

    /// Removes a worker from every rotation, pruning empty ones, and records departures.
    pub(crate) fn remove(&mut self, id: WorkerId, now: Instant) -> Option<WorkerEntry> {
        let (_, entry) = self.workers.remove(id)?;
        self.exclusions.remove(&id);
        let worker = &entry.worker;
        for namespace in worker.namespaces() {
            let Some(queues) = self.pools.get_mut(namespace.as_str()) else {
                continue;
            };
            if let Some(queue) = queues.get_mut(worker.task_queue()) {
                queue.workers = queue.workers.saturating_sub(1);
                for activity in worker.activity_types() {
                    if let Some(rotation) = queue.rotations.get_mut(activity.as_str()) {
                        rotation.leave(id, worker.node());
                        if rotation.is_empty() {
                            queue.rotations.remove(activity.as_str());
                        }
                    }
                    let key = ActivityKey::new(
                        namespace.as_str(),
                        worker.task_queue(),
                        activity.as_str(),
                    );
                    self.departures
                        .entry(key)
                        .or_default()
                        .insert(worker.node().cloned(), now);
                }
                if queue.workers == 0 {
                    queues.remove(worker.task_queue());
                }
            }
            if queues.is_empty() {
                self.pools.remove(namespace.as_str());
            }
        }
        self.forget_old_departures();
        Some(entry)
    }

    fn forget_old_departures(&mut self) {
        if self.departures.len() <= DEPARTURE_MEMORY {
            return;
        }
        let mut ages: Vec<Instant> = self
            .departures
            .values()
            .filter_map(|nodes| nodes.values().max().copied())
            .collect();
        ages.sort_unstable();
        let Some(cutoff) = ages.get(ages.len() / 2).copied() else {
            return;
        };
        self.departures
            .retain(|_, nodes| nodes.values().any(|at| *at > cutoff));
    }

    /// Re-derives the standing of the worker `id` and updates its rotations' eligible sets if
    /// it changed. Returns true when the worker became selectable.
    pub(crate) fn refresh_id(&mut self, id: WorkerId) -> bool {
        self.workers.slot(id).is_some_and(|slot| self.refresh(slot))
    }

    /// [`State::refresh_id`] for a worker known by its slot.
    pub(crate) fn refresh(&mut self, slot: Slot) -> bool {
        let Some(entry) = self.workers.at(slot) else {
            return false;
        };
        let selectable = self.standing(entry).is_eligible();
        if selectable == entry.selectable {
            return false;
        }
        let worker = entry.worker.clone();
        let eligible_slot = selectable.then_some(slot);
        for namespace in worker.namespaces() {
            let Some(queue) = self
                .pools
                .get_mut(namespace.as_str())
                .and_then(|queues| queues.get_mut(worker.task_queue()))
            else {
                continue;
            };
            for activity in worker.activity_types() {
                if let Some(rotation) = queue.rotations.get_mut(activity.as_str()) {
                    rotation.set_eligible(worker.id(), eligible_slot, worker.node());
                }
            }
        }
        if let Some(entry) = self.workers.at_mut(slot) {
            entry.selectable = selectable;
        }
        selectable
    }

    /// Every worker of a `(namespace, task queue)` pool, whatever activity it serves.
    pub(crate) fn pool_members(&self, namespace: &str, task_queue: &str) -> Members {
        self.queue(namespace, task_queue)
            .map(|queue| {
                queue
                    .rotations
                    .values()
                    .flat_map(|r| r.members.iter().map(|(id, slot)| (*id, *slot)))
                    .collect()
            })
            .unwrap_or_default()
    }
}
