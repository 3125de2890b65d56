//! Duplicate executions, counted inside the workers' handlers: every handler records the task
//! id it runs, across the whole fleet, so a task run twice (re-dispatched after a link blip,
//! or delivered twice) shows up as `executions - distinct`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

/// Most task ids remembered; beyond it executions are still counted but no longer checked for
/// duplicates (the report says how many went unchecked), so memory stays bounded.
const MAX_TRACKED: usize = 2_000_000;

/// The task ids the fleet's handlers ran.
#[derive(Debug, Default)]
pub(crate) struct Executions {
    seen: Mutex<HashSet<u64>>,
    executions: AtomicU64,
    duplicates: AtomicU64,
    untracked: AtomicU64,
}

/// What the fleet's handlers ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct ExecutionCounts {
    /// Handler runs.
    pub(crate) executions: u64,
    /// Runs of a task id that had already run (on this or another worker).
    pub(crate) duplicate_executions: u64,
    /// Runs not checked for duplicates, past the memory bound.
    pub(crate) untracked_executions: u64,
}

impl Executions {
    /// A handler started running `task`.
    pub(crate) fn record(&self, task: u64) {
        self.executions.fetch_add(1, Ordering::Relaxed);
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.contains(&task) {
            self.duplicates.fetch_add(1, Ordering::Relaxed);
        } else if seen.len() < MAX_TRACKED {
            seen.insert(task);
        } else {
            self.untracked.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts so far.
    pub(crate) fn counts(&self) -> ExecutionCounts {
        ExecutionCounts {
            executions: self.executions.load(Ordering::Relaxed),
            duplicate_executions: self.duplicates.load(Ordering::Relaxed),
            untracked_executions: self.untracked.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_run_twice_is_one_duplicate() {
        let executions = Executions::default();
        for task in [1, 2, 3] {
            executions.record(task);
        }
        assert_eq!(executions.counts().duplicate_executions, 0);
        executions.record(2);
        assert_eq!(
            executions.counts(),
            ExecutionCounts {
                executions: 4,
                duplicate_executions: 1,
                untracked_executions: 0
            }
        );
    }
}
