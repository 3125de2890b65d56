//! Per-`(pool, activity type)` membership, eligible sets and the one round-robin cursor.
//!
//! Eligibility is maintained incrementally (a worker enters or leaves the eligible sets when its
//! standing changes), so choosing the next worker is a range lookup in an ordered set: its cost
//! does not grow with the number of workers at capacity, and only logarithmically with pool size.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use crate::address::{Node, WorkerId};

/// The workers of one activity key and whose turn it is.
#[derive(Debug, Default)]
pub(crate) struct Rotation {
    /// Every registered worker serving the key.
    pub(crate) members: BTreeSet<WorkerId>,
    /// Members currently eligible, in id order (the rotation order).
    eligible: BTreeSet<WorkerId>,
    /// The same, per advertised node, for pinned lookups.
    eligible_by_node: HashMap<Node, BTreeSet<WorkerId>>,
    /// The worker chosen last, shared by pinned and unpinned lookups.
    cursor: Option<WorkerId>,
}

impl Rotation {
    pub(crate) fn join(&mut self, id: WorkerId) {
        self.members.insert(id);
    }

    pub(crate) fn leave(&mut self, id: WorkerId, node: Option<&Node>) {
        self.members.remove(&id);
        self.set_eligible(id, node, false);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub(crate) fn set_eligible(&mut self, id: WorkerId, node: Option<&Node>, eligible: bool) {
        if eligible {
            self.eligible.insert(id);
            if let Some(node) = node {
                self.eligible_by_node
                    .entry(node.clone())
                    .or_default()
                    .insert(id);
            }
        } else {
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

    /// Eligible workers (optionally only those on `node`) in rotation order, starting after the
    /// cursor and wrapping around.
    pub(crate) fn in_turn<'a>(&'a self, node: Option<&str>) -> impl Iterator<Item = WorkerId> + 'a {
        let set = match node {
            None => Some(&self.eligible),
            Some(node) => self.eligible_by_node.get(node),
        };
        let cursor = self.cursor;
        set.into_iter().flat_map(move |set| {
            // Ids start at 1, so `..=0` is the empty wrap-around when nothing was chosen yet.
            let start = cursor.map_or(Bound::Unbounded, Bound::Excluded);
            let wrap_end = cursor.unwrap_or(WorkerId::from_raw(0));
            set.range((start, Bound::Unbounded))
                .chain(set.range(..=wrap_end))
                .copied()
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

    #[test]
    fn turn_order_starts_after_cursor_and_wraps() {
        let mut r = Rotation::default();
        for n in [1, 2, 3] {
            r.join(id(n));
            r.set_eligible(id(n), None, true);
        }
        assert_eq!(
            r.in_turn(None).collect::<Vec<_>>(),
            vec![id(1), id(2), id(3)]
        );
        r.advance(id(2));
        assert_eq!(
            r.in_turn(None).collect::<Vec<_>>(),
            vec![id(3), id(1), id(2)]
        );
        r.set_eligible(id(3), None, false);
        assert_eq!(r.in_turn(None).collect::<Vec<_>>(), vec![id(1), id(2)]);
    }

    #[test]
    fn node_sets_follow_eligibility() {
        let mut r = Rotation::default();
        let n1 = Node::new("n1");
        r.join(id(1));
        r.set_eligible(id(1), n1.as_ref(), true);
        assert_eq!(r.in_turn(Some("n1")).collect::<Vec<_>>(), vec![id(1)]);
        assert_eq!(r.in_turn(Some("n2")).count(), 0);
        r.leave(id(1), n1.as_ref());
        assert_eq!(r.in_turn(Some("n1")).count(), 0);
        assert!(r.is_empty());
    }
}
