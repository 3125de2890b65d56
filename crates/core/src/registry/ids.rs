//! Worker ids that stay unique across the nodes of a cluster.
//!
//! A worker id is `(node number << WORKER_ID_NODE_SHIFT) | counter`: the counter is
//! process-wide and never reused, the node number is one the node holds exclusively among the
//! live nodes of its cluster (`switchyard-cluster` claims it). Outside a cluster the number is 0
//! and ids are the plain counter, as they always were. The widths keep every id below 2^53, so
//! a JSON reader that parses numbers as doubles (the console) reads it exactly.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::address::WorkerId;

/// How far the node number is shifted left in a worker id: the counter's width in bits.
pub const WORKER_ID_NODE_SHIFT: u32 = 40;

/// The largest node number (13 bits, so that ids stay below 2^53).
pub const MAX_NODE_NUMBER: u16 = (1 << 13) - 1;

/// The number a node mints its worker ids under; 0 (the default) outside a cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeNumber(u16);

impl NodeNumber {
    /// No number: ids are the plain process counter.
    pub const NONE: Self = Self(0);

    /// The number `raw`; `None` above [`MAX_NODE_NUMBER`].
    pub const fn new(raw: u16) -> Option<Self> {
        if raw <= MAX_NODE_NUMBER {
            Some(Self(raw))
        } else {
            None
        }
    }

    /// The raw number.
    pub const fn get(self) -> u16 {
        self.0
    }

    /// The number `id` was minted under.
    pub const fn of(id: WorkerId) -> Self {
        // The shift leaves at most 64 - 40 = 24 bits; ids minted here hold at most 13 of them.
        Self(((id.get() >> WORKER_ID_NODE_SHIFT) & MAX_NODE_NUMBER as u64) as u16)
    }
}

impl std::fmt::Display for NodeNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The id of the `counter`th worker of a process minted under `node`.
pub(crate) fn compose(node: NodeNumber, counter: u64) -> WorkerId {
    let counter = counter & ((1 << WORKER_ID_NODE_SHIFT) - 1);
    WorkerId::from_raw((u64::from(node.0) << WORKER_ID_NODE_SHIFT) | counter)
}

/// The next value of the process-wide counter: never reused in a process, even by a second
/// registry (tests, an embedding that runs two gateways).
pub(crate) fn next_counter() -> u64 {
    static NEXT_WORKER_ID: AtomicU64 = AtomicU64::new(1);
    NEXT_WORKER_ID.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_zero_mints_todays_ids() {
        assert_eq!(compose(NodeNumber::NONE, 7), WorkerId::from_raw(7));
        assert_eq!(NodeNumber::of(WorkerId::from_raw(7)), NodeNumber::NONE);
    }

    #[test]
    fn two_numbers_never_mint_the_same_id() {
        let (one, two) = (
            NodeNumber::new(1).expect("in range"),
            NodeNumber::new(2).expect("in range"),
        );
        // The same counter under two numbers: different ids, each naming its number.
        for counter in [1, 2, 1 << 20, (1 << WORKER_ID_NODE_SHIFT) - 1] {
            let (a, b) = (compose(one, counter), compose(two, counter));
            assert_ne!(a, b, "counter {counter}");
            assert_eq!(NodeNumber::of(a), one);
            assert_eq!(NodeNumber::of(b), two);
        }
        // Control: one number and one counter is one id.
        assert_eq!(compose(one, 5), compose(one, 5));
    }

    #[test]
    fn ids_stay_below_two_to_the_53() {
        let top = NodeNumber::new(MAX_NODE_NUMBER).expect("in range");
        let id = compose(top, (1 << WORKER_ID_NODE_SHIFT) - 1);
        assert!(id.get() < 1 << 53, "{id}");
        assert_eq!(NodeNumber::new(MAX_NODE_NUMBER + 1), None, "out of range");
    }

    #[test]
    fn a_higher_number_mints_higher_ids() {
        let low = compose(NodeNumber::new(1).expect("in range"), 1 << 30);
        let high = compose(NodeNumber::new(2).expect("in range"), 1);
        assert!(high > low, "ids keep rising when the number rises");
    }

    /// `docs/cluster.md`, "Worker ids": the node's number above bit 40, numbers up to 8191,
    /// and node 1's first worker is 1099511627777.
    #[test]
    fn the_id_layout_is_the_documented_one() {
        let one = NodeNumber::new(1).expect("a node number");
        assert_eq!(compose(one, 1), WorkerId::from_raw(1_099_511_627_777));
        assert_eq!(MAX_NODE_NUMBER, 8191);
        assert!(NodeNumber::new(8191).is_some());
        assert!(NodeNumber::new(8192).is_none(), "above 13 bits");
    }
}
