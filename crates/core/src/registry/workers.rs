//! The registered workers, stored in dense slots.
//!
//! Rotations carry each worker's slot next to its id, so selection and slot release reach the
//! worker by index, without hashing, and a rotation walking ids in order walks mostly adjacent
//! memory. Lookups by id (deregistration, announcements, verdicts) go through a side index.
//! The slab keeps the high-water mark of registered workers; freed slots are reused.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::SystemTime;

use super::departure::DepartureSender;
use crate::address::WorkerId;
use crate::delivery::{WorkerDelivery, WorkerMessage};
use crate::worker::Worker;

/// Where a worker lives in the [`WorkerTable`]; valid while that worker is registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot(usize);

/// The mutable facts about one registered worker.
///
/// The id and delivery leg are copied out of the shared [`Worker`] so that deriving standing
/// reads only this entry: the slab is dense, the `Worker` allocations are not.
pub(crate) struct WorkerEntry {
    pub(crate) id: WorkerId,
    pub(crate) delivery: Arc<dyn WorkerDelivery>,
    pub(crate) worker: Worker,
    pub(crate) capacity: Option<NonZeroU32>,
    /// Capacity announced that the connection cannot carry yet (see
    /// [`crate::Registry::set_pending_capacity`]).
    pub(crate) pending_capacity: Option<NonZeroU32>,
    pub(crate) in_flight: u32,
    /// Ended tasks it neither answered nor acknowledged in time (their slots were reclaimed).
    pub(crate) unresponsive: u32,
    pub(crate) draining: bool,
    pub(crate) connected_at: SystemTime,
    /// Whether the worker currently sits in its rotations' eligible sets.
    pub(crate) selectable: bool,
    /// Whether its transport has announced it (see [`crate::RegistrationToken::announce`]);
    /// until then it is not dispatched to or pinged.
    pub(crate) announced: bool,
    /// A drain or shutdown asked before the announcement, delivered with it.
    pub(crate) deferred: Option<WorkerMessage>,
    /// Told the reason when the worker leaves (or, for a session, when a resume replaces
    /// this connection).
    pub(crate) departure: Option<DepartureSender>,
    /// The worker's session, when it has one.
    pub(crate) session: Option<super::sessions::SessionState>,
}

impl WorkerEntry {
    /// A freshly admitted worker: nothing in flight, not yet placed in any eligible set.
    pub(crate) fn new(worker: Worker, capacity: Option<NonZeroU32>) -> Self {
        Self {
            id: worker.id(),
            delivery: Arc::clone(worker.delivery()),
            worker,
            capacity,
            pending_capacity: None,
            in_flight: 0,
            unresponsive: 0,
            draining: false,
            connected_at: SystemTime::now(),
            selectable: false,
            announced: false,
            deferred: None,
            departure: None,
            session: None,
        }
    }
}

impl std::fmt::Debug for WorkerEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerEntry")
            .field("id", &self.id)
            .field("capacity", &self.capacity)
            .field("in_flight", &self.in_flight)
            .field("draining", &self.draining)
            .field("selectable", &self.selectable)
            .field("announced", &self.announced)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
pub(crate) struct WorkerTable {
    slots: Vec<Option<WorkerEntry>>,
    free: Vec<Slot>,
    index: HashMap<WorkerId, Slot>,
}

impl WorkerTable {
    /// Stores `entry` (whose id must be new) and returns its slot.
    pub(crate) fn insert(&mut self, entry: WorkerEntry) -> Slot {
        let id = entry.id;
        let reusable = self
            .free
            .pop()
            .and_then(|slot| Some((slot, self.slots.get_mut(slot.0)?)));
        let slot = match reusable {
            Some((slot, place)) => {
                *place = Some(entry);
                slot
            }
            None => {
                let slot = Slot(self.slots.len());
                self.slots.push(Some(entry));
                slot
            }
        };
        self.index.insert(id, slot);
        slot
    }

    /// Removes the worker `id`, freeing its slot.
    pub(crate) fn remove(&mut self, id: WorkerId) -> Option<(Slot, WorkerEntry)> {
        let slot = self.index.remove(&id)?;
        let entry = self.slots.get_mut(slot.0)?.take()?;
        self.free.push(slot);
        Some((slot, entry))
    }

    pub(crate) fn slot(&self, id: WorkerId) -> Option<Slot> {
        self.index.get(&id).copied()
    }

    pub(crate) fn at(&self, slot: Slot) -> Option<&WorkerEntry> {
        self.slots.get(slot.0)?.as_ref()
    }

    pub(crate) fn at_mut(&mut self, slot: Slot) -> Option<&mut WorkerEntry> {
        self.slots.get_mut(slot.0)?.as_mut()
    }

    pub(crate) fn get(&self, id: WorkerId) -> Option<&WorkerEntry> {
        self.at(self.slot(id)?)
    }

    pub(crate) fn get_mut(&mut self, id: WorkerId) -> Option<&mut WorkerEntry> {
        self.at_mut(self.slot(id)?)
    }

    pub(crate) fn contains(&self, id: WorkerId) -> bool {
        self.index.contains_key(&id)
    }

    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    pub(crate) fn ids(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.index.keys().copied()
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = &WorkerEntry> + '_ {
        self.slots.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::testing::TestLeg;

    fn entry(id: u64) -> WorkerEntry {
        let worker = Worker::new(
            WorkerId::from_raw(id),
            ["ns".to_owned()].into(),
            "q".to_owned(),
            None,
            ["a".to_owned()].into(),
            String::new(),
            String::new(),
            TestLeg::new().0,
        );
        WorkerEntry::new(worker, None)
    }

    #[test]
    fn slots_are_reused_and_a_stale_slot_reads_as_empty() {
        let mut table = WorkerTable::default();
        let one = table.insert(entry(1));
        let two = table.insert(entry(2));
        assert_ne!(one, two);
        assert_eq!(
            table.remove(WorkerId::from_raw(1)).map(|(s, _)| s),
            Some(one)
        );
        assert!(table.at(one).is_none(), "a freed slot holds nobody");
        assert!(table.get(WorkerId::from_raw(1)).is_none());

        let three = table.insert(entry(3));
        assert_eq!(three, one, "the freed slot is reused");
        assert_eq!(table.at(three).map(|e| e.id), Some(WorkerId::from_raw(3)));
        assert_eq!(table.len(), 2);
        assert!(
            table.remove(WorkerId::from_raw(1)).is_none(),
            "removal is by id, once"
        );
    }
}
