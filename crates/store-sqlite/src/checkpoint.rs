//! The WAL checkpoint on a thread and connection of its own, so no commit waits for one.
//!
//! SQLite's automatic checkpoint runs inside the commit that passes `wal_autocheckpoint`
//! pages, on the writer's thread: every caller of that batch waits while the log is copied
//! into the database file (and, with `synchronous = FULL`, the file fsynced). The store turns
//! it off on the writer's connection; the writer counts its commits here instead, and every
//! [`CHECKPOINT_EVERY`] commits this thread runs a passive checkpoint, which never blocks the
//! writer (frames committed meanwhile wait for the next one).

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use rusqlite::Connection;

/// Commits between two checkpoints.
pub(crate) const CHECKPOINT_EVERY: u64 = 64;

#[derive(Debug, Default)]
struct State {
    /// Commits since the last checkpoint started.
    due: u64,
    closed: bool,
}

/// What the writer tells the checkpointer.
#[derive(Debug, Default)]
pub(crate) struct Checkpoints {
    state: Mutex<State>,
    wake: Condvar,
}

impl Checkpoints {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A counter and a flag, consistent after any panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The writer committed a transaction.
    pub(crate) fn committed(&self) {
        let mut state = self.lock();
        state.due = state.due.saturating_add(1);
        if state.due == CHECKPOINT_EVERY {
            drop(state);
            self.wake.notify_one();
        }
    }

    /// Ends the checkpointer after the checkpoint it is running, if any.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_one();
    }

    /// Blocks until a checkpoint is due (`true`) or the store closes (`false`).
    fn wait_due(&self) -> bool {
        let mut state = self.lock();
        loop {
            if state.closed {
                return false;
            }
            if state.due >= CHECKPOINT_EVERY {
                state.due = 0;
                return true;
            }
            state = self
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The checkpointer's loop, on `conn`, until [`close`](Self::close).
    pub(crate) fn run(&self, conn: &Connection) {
        while self.wait_due() {
            if let Err(err) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                tracing::debug!(%err, "WAL checkpoint failed; the next one retries");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_due_every_so_many_commits_and_close_ends_the_wait() {
        let checkpoints = Checkpoints::default();
        for _ in 1..CHECKPOINT_EVERY {
            checkpoints.committed();
        }
        assert_eq!(checkpoints.lock().due, CHECKPOINT_EVERY - 1);
        checkpoints.committed();
        assert!(checkpoints.wait_due(), "due after CHECKPOINT_EVERY commits");
        assert_eq!(checkpoints.lock().due, 0, "counting starts again");
        // Control: with nothing due, only the close ends the wait.
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| checkpoints.wait_due());
            checkpoints.close();
            assert!(!waiter.join().expect("waiter"));
        });
    }
}
