//! The writer's statements, each taken from the connection's statement cache once per batch.
//!
//! `prepare_cached` keys its cache by the statement's text: every use trims, hashes and
//! compares the whole text and copies it into a fresh key, out of the cache and back in. A
//! batch of hundreds of writes uses a handful of statements, so [`Statements`] takes each one
//! at its first use in the batch and keeps it until the batch ends, when it goes back to the
//! cache for the next batch.

use rusqlite::{CachedStatement, Connection};

/// A statement the writer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sql {
    /// The first dispatch recorded with an idempotency key in a namespace.
    FindKey,
    /// A new row, queued or already finished ([`insert`](crate::insert)).
    Insert,
    /// [`ROWS_PER_INSERT`](crate::insert::ROWS_PER_INSERT) new rows, returning the ids
    /// inserted.
    InsertMany,
    /// An unfinished row finished, returning its namespace.
    Complete,
    /// The outcome of a finished row.
    ReadOutcome,
    /// A state note: parked.
    Park,
    /// A state note: delivered.
    Claim,
    /// A state note: queued again.
    Release,
    /// A window of rows in `seq` order, as the purge judges them ([`crate::purge`]).
    PurgeScan,
    /// One row deleted by `seq`.
    PurgeRow,
    /// The bytes of the store's pages in use (pages freed by deletes are reused, so they
    /// count as free).
    BytesInUse,
}

impl Sql {
    /// How many statements there are.
    const COUNT: usize = 11;

    /// Its text.
    pub(crate) fn text(self) -> &'static str {
        match self {
            Self::FindKey => {
                "SELECT id FROM dispatches WHERE namespace = ?1 AND idempotency_key = ?2"
            }
            Self::Insert => crate::insert::INSERT_ONE.as_str(),
            Self::InsertMany => crate::insert::INSERT_MANY.as_str(),
            Self::Complete => {
                "UPDATE dispatches SET state = 'finished', finished_at_ns = ?2, worker = NULL, \
                 parked_reason = NULL, not_before_ns = NULL, outcome_kind = ?3, \
                 outcome_output = ?4, outcome_message = ?5, outcome_retryable = ?6, \
                 outcome_reason = ?7, outcome_attempts = ?8, attempts = max(attempts, ?9) \
                 WHERE id = ?1 AND state <> 'finished' RETURNING namespace"
            }
            Self::ReadOutcome => {
                "SELECT outcome_kind, outcome_output, outcome_message, outcome_retryable, \
                 outcome_reason, outcome_attempts FROM dispatches WHERE id = ?1"
            }
            Self::Park => {
                "UPDATE dispatches SET state = 'parked', parked_reason = ?2, worker = NULL, \
                 not_before_ns = NULL WHERE id = ?1 AND state <> 'finished'"
            }
            Self::Claim => {
                "UPDATE dispatches SET state = 'running', worker = ?2, \
                 attempts = max(attempts, ?3), parked_reason = NULL, not_before_ns = NULL \
                 WHERE id = ?1 AND state <> 'finished'"
            }
            Self::Release => {
                "UPDATE dispatches SET state = 'queued', not_before_ns = ?2, worker = NULL, \
                 parked_reason = NULL WHERE id = ?1 AND state <> 'finished'"
            }
            Self::PurgeScan => {
                "SELECT seq, submitted_at_ns, finished_at_ns FROM dispatches WHERE seq > ?1 \
                 ORDER BY seq LIMIT ?2"
            }
            Self::PurgeRow => "DELETE FROM dispatches WHERE seq = ?1",
            Self::BytesInUse => {
                "SELECT (c.page_count - f.freelist_count) * s.page_size \
                 FROM pragma_page_count() c, pragma_freelist_count() f, pragma_page_size() s"
            }
        }
    }
}

/// The statements of one batch, on its transaction's connection: each taken from the cache at
/// its first use and kept, bound afresh by every use, until the batch drops them (before its
/// commit, which the borrow of the connection enforces).
pub(crate) struct Statements<'c> {
    conn: &'c Connection,
    taken: [Option<CachedStatement<'c>>; Sql::COUNT],
    /// Statements taken from the cache so far.
    lookups: usize,
}

impl<'c> Statements<'c> {
    /// None taken yet, on `conn`.
    pub(crate) fn new(conn: &'c Connection) -> Self {
        Self {
            conn,
            taken: Default::default(),
            lookups: 0,
        }
    }

    /// `sql`, prepared: from the cache at its first use in the batch, then the same one.
    pub(crate) fn get(&mut self, sql: Sql) -> rusqlite::Result<&mut CachedStatement<'c>> {
        let slot = &mut self.taken[sql as usize];
        let statement = match slot.take() {
            Some(statement) => statement,
            None => {
                self.lookups += 1;
                self.conn.prepare_cached(sql.text())?
            }
        };
        Ok(slot.insert(statement))
    }

    /// Statements taken from the cache so far (once each per batch).
    #[cfg(test)]
    pub(crate) fn lookups(&self) -> usize {
        self.lookups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: [Sql; Sql::COUNT] = [
        Sql::FindKey,
        Sql::Insert,
        Sql::InsertMany,
        Sql::Complete,
        Sql::ReadOutcome,
        Sql::Park,
        Sql::Claim,
        Sql::Release,
        Sql::PurgeScan,
        Sql::PurgeRow,
        Sql::BytesInUse,
    ];

    #[test]
    fn every_statement_has_a_slot_of_its_own_and_prepares_against_the_schema() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = crate::schema::open_writer(
            &dir.path().join("s.sqlite3"),
            crate::options::Synchronous::Full,
        )
        .expect("open");
        let mut slots: Vec<usize> = EVERY.iter().map(|&sql| sql as usize).collect();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots, (0..Sql::COUNT).collect::<Vec<_>>());
        let mut statements = Statements::new(&conn);
        for sql in EVERY {
            assert!(statements.get(sql).is_ok(), "{}", sql.text());
        }
        assert_eq!(statements.lookups(), Sql::COUNT);
    }

    #[test]
    fn a_statement_is_looked_up_once_per_batch_however_often_it_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = crate::schema::open_writer(
            &dir.path().join("s.sqlite3"),
            crate::options::Synchronous::Full,
        )
        .expect("open");
        let mut statements = Statements::new(&conn);
        for _ in 0..100 {
            let size: u64 = statements
                .get(Sql::BytesInUse)
                .expect("prepare")
                .query_row([], |row| row.get(0))
                .expect("size");
            assert!(size > 0);
        }
        assert_eq!(statements.lookups(), 1, "one look-up for 100 runs");
        drop(statements);
        // Control: a next batch takes it from the cache again (once).
        let mut next = Statements::new(&conn);
        next.get(Sql::BytesInUse).expect("prepare");
        next.get(Sql::BytesInUse).expect("prepare");
        assert_eq!(next.lookups(), 1);
    }
}
