//! The registry's data, guarded by one lock: workers, rotations, exclusions and departures.
//!
//! Every change that can alter a worker's standing goes through [`State::refresh`], which
//! re-derives [`Eligibility`] and moves the worker in or out of its rotations' eligible sets.

use std::collections::{BTreeSet, HashMap};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use tokio::time::Instant;

use super::rotation::Rotation;
use crate::address::{ActivityKey, Node, WorkerId};
use crate::eligibility::{DispatchExclusion, Eligibility};
use crate::worker::Worker;

/// Activity types of one `(namespace, task queue)` pool.
pub(crate) type QueueRotations = HashMap<String, Rotation>;

/// The mutable facts about one registered worker.
#[derive(Debug)]
pub(crate) struct WorkerEntry {
    pub(crate) worker: Worker,
    pub(crate) capacity: Option<NonZeroU32>,
    pub(crate) in_flight: u32,
    pub(crate) draining: bool,
    pub(crate) connected_at: SystemTime,
    /// Whether the worker currently sits in its rotations' eligible sets.
    selectable: bool,
}

/// How many `(activity key, node)` departure records the registry keeps before forgetting the
/// oldest, so caller-chosen names cannot grow it without bound.
const DEPARTURE_MEMORY: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) workers: HashMap<WorkerId, WorkerEntry>,
    /// namespace → task queue → activity type → rotation; nested so lookups borrow `&str`.
    pub(crate) pools: HashMap<String, HashMap<String, QueueRotations>>,
    pub(crate) exclusions: HashMap<WorkerId, DispatchExclusion>,
    /// When the last worker serving a key on a node left.
    pub(crate) departures: HashMap<ActivityKey, HashMap<Option<Node>, Instant>>,
}

impl State {
    /// A fresh id, larger than every id this process minted before. Called under the
    /// registry lock, so ids also rise in admission order within one registry (the liveness
    /// watermark relies on it).
    pub(crate) fn mint_id(&mut self) -> WorkerId {
        // Process-wide rather than per registry: a worker id is never reused in a process, even
        // by a second registry (tests, an embedding that runs two gateways).
        static NEXT_WORKER_ID: AtomicU64 = AtomicU64::new(1);
        WorkerId::from_raw(NEXT_WORKER_ID.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn rotation(
        &self,
        namespace: &str,
        task_queue: &str,
        activity: &str,
    ) -> Option<&Rotation> {
        self.pools.get(namespace)?.get(task_queue)?.get(activity)
    }

    pub(crate) fn rotation_mut(
        &mut self,
        namespace: &str,
        task_queue: &str,
        activity: &str,
    ) -> Option<&mut Rotation> {
        self.pools
            .get_mut(namespace)?
            .get_mut(task_queue)?
            .get_mut(activity)
    }

    pub(crate) fn queue(&self, namespace: &str, task_queue: &str) -> Option<&QueueRotations> {
        self.pools.get(namespace)?.get(task_queue)
    }

    /// The standing of a registered worker, ignoring which dispatch asks.
    pub(crate) fn standing(&self, entry: &WorkerEntry) -> Eligibility {
        Eligibility::derive(
            entry.worker.delivery().is_connected(),
            entry.draining,
            self.exclusions.get(&entry.worker.id()).copied(),
            entry.capacity,
            entry.in_flight,
        )
    }

    pub(crate) fn insert(&mut self, worker: Worker, capacity: Option<NonZeroU32>) {
        let id = worker.id();
        for namespace in worker.namespaces() {
            let queue = self
                .pools
                .entry(namespace.clone())
                .or_default()
                .entry(worker.task_queue().to_owned())
                .or_default();
            for activity in worker.activity_types() {
                queue.entry(activity.clone()).or_default().join(id);
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
        let entry = WorkerEntry {
            worker,
            capacity,
            in_flight: 0,
            draining: false,
            connected_at: SystemTime::now(),
            selectable: false,
        };
        self.workers.insert(id, entry);
        self.refresh(id);
    }

    /// Removes a worker from every rotation, pruning empty ones, and records departures.
    pub(crate) fn remove(&mut self, id: WorkerId, now: Instant) -> Option<WorkerEntry> {
        let entry = self.workers.remove(&id)?;
        self.exclusions.remove(&id);
        let worker = &entry.worker;
        for namespace in worker.namespaces() {
            let Some(queues) = self.pools.get_mut(namespace.as_str()) else {
                continue;
            };
            if let Some(queue) = queues.get_mut(worker.task_queue()) {
                for activity in worker.activity_types() {
                    if let Some(rotation) = queue.get_mut(activity.as_str()) {
                        rotation.leave(id, worker.node());
                        if rotation.is_empty() {
                            queue.remove(activity.as_str());
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
                if queue.is_empty() {
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

    /// Re-derives a worker's standing and updates its rotations' eligible sets if it changed.
    /// Returns true when the worker became selectable.
    pub(crate) fn refresh(&mut self, id: WorkerId) -> bool {
        let Some(entry) = self.workers.get(&id) else {
            return false;
        };
        let selectable = self.standing(entry).is_eligible();
        if selectable == entry.selectable {
            return false;
        }
        let worker = entry.worker.clone();
        for namespace in worker.namespaces() {
            for activity in worker.activity_types() {
                if let Some(rotation) = self.rotation_mut(namespace, worker.task_queue(), activity)
                {
                    rotation.set_eligible(id, worker.node(), selectable);
                }
            }
        }
        if let Some(entry) = self.workers.get_mut(&id) {
            entry.selectable = selectable;
        }
        selectable
    }

    /// Every worker id of a `(namespace, task queue)` pool, whatever activity it serves.
    pub(crate) fn pool_members(&self, namespace: &str, task_queue: &str) -> BTreeSet<WorkerId> {
        self.queue(namespace, task_queue)
            .map(|queue| {
                queue
                    .values()
                    .flat_map(|r| r.members.iter().copied())
                    .collect()
            })
            .unwrap_or_default()
    }
}
