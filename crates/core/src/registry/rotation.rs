//! Per-`(pool, activity type)` membership, eligible sets and the one round-robin cursor.
//!
//! Eligibility is maintained incrementally (a worker enters or leaves the eligible sets when its
//! standing changes), so choosing the next worker is one ordered-map range step: its cost does
//! not grow with the number of workers at capacity, and only logarithmically with pool size.
//! Every set maps a worker's id (the rotation order) to its slot in the worker table.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use super::workers::Slot;
use crate::address::{Node, WorkerId};

/// Workers in rotation order, each with its slot.
pub(crate) type Members = BTreeMap<WorkerId, Slot>;

/// The workers of one activity key and whose turn it is.
#[derive(Debug, Default)]
pub(crate) struct Rotation {
    /// Every registered worker serving the key.
    pub(crate) members: Members,
    /// Members currently eligible.
    eligible: Members,
    /// The same, per advertised node, for pinned lookups.
    eligible_by_node: HashMap<Node, Members>,
    /// The worker chosen last, shared by pinned and unpinned lookups.
    cursor: Option<WorkerId>,
}

impl Rotation {
    pub(crate) fn join(&mut self, id: WorkerId, slot: Slot) {
        self.members.insert(id, slot);
    }

    pub(crate) fn leave(&mut self, id: WorkerId, node: Option<&Node>) {
        self.members.remove(&id);
        self.set_eligible(id, None, node);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Puts the worker in the eligible sets (`Some(slot)`) or takes it out (`None`).
    pub(crate) fn set_eligible(&mut self, id: WorkerId, slot: Option<Slot>, node: Option<&Node>) {
        match slot {
            Some(slot) => {
                self.eligible.insert(id, slot);
                if let Some(node) = node {
                    self.eligible_by_node
                        .entry(node.clone())
                        .or_default()
                        .insert(id, slot);
                }
            }
            None => {
                self.eligible.remove(&id);
                if let Some(node) = node {
                    if let Some(set) = self.eligible_by_node.get_mut(node) {
                        set.remove(&id);
                        if set.is_empty() {
                            self.eligible_by_node.remove(node);
                        }
                    }
                }
            }
        }
    }

    /// Eligible workers (optionally only those on `node`) in rotation order, starting after the
    /// cursor and wrapping around.
    pub(crate) fn in_turn<'a>(
        &'a self,
        node: Option<&str>,
    ) -> impl Iterator<Item = (WorkerId, Slot)> + 'a {
        let set = match node {
            None => Some(&self.eligible),
            Some(node) => self.eligible_by_node.get(node),
        };
        let cursor = self.cursor;
        set.into_iter().flat_map(move |set| {
            let (after, through) = match cursor {
                Some(cursor) => (Bound::Excluded(cursor), Bound::Included(cursor)),
                // Nothing chosen yet: the first pass covers everything and the wrap is empty.
                None => (Bound::Unbounded, Bound::Excluded(WorkerId::from_raw(0))),
            };
            // The wrap-around range is looked up only once the first one runs out, so the
            // common case costs one descent of the tree.
            let wrap = std::iter::once(through)
                .flat_map(move |through| set.range((Bound::Unbounded, through)));
            set.range((after, Bound::Unbounded))
                .chain(wrap)
                .map(|(id, slot)| (*id, *slot))
        })
    }

    /// Records that `id` was chosen, so the next lookup starts after it.
    pub(crate) fn advance(&mut self, id: WorkerId) {
        self.cursor = Some(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> WorkerId {
        WorkerId::from_raw(n)
    }

    fn ids(rotation: &Rotation, node: Option<&str>) -> Vec<WorkerId> {
        rotation.in_turn(node).map(|(id, _)| id).collect()
    }

    /// Builds a rotation whose workers `1..=n` sit in slots `n-1..=0` (reverse order), so a
    /// mix-up of ids and slots shows.
    fn rotation(n: u64, node: Option<&Node>) -> (Rotation, HashMap<WorkerId, Slot>) {
        let mut r = Rotation::default();
        let mut slots = HashMap::new();
        let mut table = super::super::workers::WorkerTable::default();
        for k in (1..=n).rev() {
            let slot = table.insert(crate::registry::workers::WorkerEntry::new(
                crate::worker::Worker::new(
                    id(k),
                    ["ns".to_owned()].into(),
                    "q".to_owned(),
                    node.cloned(),
                    ["a".to_owned()].into(),
                    String::new(),
                    String::new(),
                    crate::registry::testing::TestLeg::new().0,
                ),
                None,
            ));
            slots.insert(id(k), slot);
            r.join(id(k), slot);
            r.set_eligible(id(k), Some(slot), node);
        }
        (r, slots)
    }

    #[test]
    fn turn_order_starts_after_the_cursor_and_wraps() {
        let (mut r, slots) = rotation(3, None);
        assert_eq!(ids(&r, None), vec![id(1), id(2), id(3)]);
        assert!(
            r.in_turn(None).all(|(id, slot)| slots[&id] == slot),
            "slots travel with ids"
        );
        r.advance(id(2));
        assert_eq!(ids(&r, None), vec![id(3), id(1), id(2)]);
        r.set_eligible(id(3), None, None);
        assert_eq!(ids(&r, None), vec![id(1), id(2)]);
        r.advance(id(9));
        assert_eq!(
            ids(&r, None),
            vec![id(1), id(2)],
            "a departed cursor still orders"
        );
    }

    #[test]
    fn node_sets_follow_eligibility_and_membership() {
        let n1 = Node::new("n1");
        let (mut r, _) = rotation(1, n1.as_ref());
        assert_eq!(ids(&r, Some("n1")), vec![id(1)]);
        assert!(ids(&r, Some("n2")).is_empty());
        r.leave(id(1), n1.as_ref());
        assert!(ids(&r, Some("n1")).is_empty());
        assert!(
            r.eligible_by_node.is_empty(),
            "an emptied node set is pruned"
        );
        assert!(r.is_empty());
    }
}
