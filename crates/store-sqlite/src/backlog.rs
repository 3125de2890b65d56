//! Unfinished dispatches per namespace, as the writer counts them for
//! `max_queued_per_namespace`.
//!
//! Counting the rows of a namespace at every `record` would read its whole backlog each time;
//! the writer, the only one who changes rows, keeps the counts instead. Changes made inside a
//! batch stay pending until the batch commits, and are dropped if it rolls back.

use std::collections::HashMap;

use rusqlite::Connection;

/// The count per namespace at open, read from the pool index.
pub(crate) const LOAD: &str =
    "SELECT namespace, count(*) FROM dispatches WHERE state <> 'finished' GROUP BY namespace";

/// Unfinished dispatches per namespace: committed counts plus the open batch's changes.
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    committed: HashMap<String, u64>,
    pending: HashMap<String, u64>,
}

impl Backlog {
    /// Counts the unfinished rows of a store.
    pub(crate) fn load(conn: &Connection) -> rusqlite::Result<Self> {
        let mut statement = conn.prepare(LOAD)?;
        let committed = statement
            .query_map([], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, u64>(1)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(Self {
            committed,
            pending: HashMap::new(),
        })
    }

    /// Unfinished dispatches in `namespace`, the open batch included.
    pub(crate) fn unfinished(&self, namespace: &str) -> u64 {
        self.pending
            .get(namespace)
            .or_else(|| self.committed.get(namespace))
            .copied()
            .unwrap_or(0)
    }

    /// One more unfinished dispatch in `namespace` (recorded in the open batch).
    pub(crate) fn add(&mut self, namespace: &str) {
        let count = self.unfinished(namespace) + 1;
        self.pending.insert(namespace.to_owned(), count);
    }

    /// One fewer (finished in the open batch).
    pub(crate) fn remove(&mut self, namespace: &str) {
        let count = self.unfinished(namespace).saturating_sub(1);
        self.pending.insert(namespace.to_owned(), count);
    }

    /// The open batch committed: its changes count from now on.
    pub(crate) fn commit(&mut self) {
        for (namespace, count) in self.pending.drain() {
            if count == 0 {
                self.committed.remove(&namespace);
            } else {
                self.committed.insert(namespace, count);
            }
        }
    }

    /// The open batch rolled back: forget its changes.
    pub(crate) fn roll_back(&mut self) {
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_counts_once_committed_and_not_at_all_when_rolled_back() {
        let mut backlog = Backlog::default();
        backlog.add("ns");
        backlog.add("ns");
        assert_eq!(
            backlog.unfinished("ns"),
            2,
            "the open batch sees its own changes"
        );
        backlog.commit();
        assert_eq!(backlog.unfinished("ns"), 2);

        backlog.add("ns");
        backlog.remove("other");
        backlog.roll_back();
        assert_eq!(
            backlog.unfinished("ns"),
            2,
            "a rolled-back record still counted"
        );
        assert_eq!(backlog.unfinished("other"), 0);

        backlog.remove("ns");
        backlog.remove("ns");
        backlog.commit();
        assert_eq!(backlog.unfinished("ns"), 0);
        assert!(
            backlog.committed.is_empty(),
            "empty namespaces are forgotten"
        );
    }
}
