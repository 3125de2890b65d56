//! Duplicate executions, counted inside the workers' handlers: every handler records what it
//! runs, across the whole fleet, so a dispatch run twice shows up as `executions - distinct`.
//!
//! What is recorded is the producer's dispatch number when the input carries one ([`tag`]: a
//! re-dispatched task gets a new task id, so only the dispatch number catches a dispatch run
//! again after a worker was lost), else the task id (which still catches one delivery run
//! twice).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

/// Task ids remembered in the bitmap window: one bit each, so recording is one atomic `or` and
/// costs the handlers (this runs inside every handler of the benchmark's own workers) next to
/// nothing. Ids outside the window go to a bounded set; beyond its bound executions are still
/// counted but no longer checked for duplicates (the report says how many went unchecked).
const WINDOW: u64 = 1 << 22;

/// How far below the first id seen the window starts (ids arrive slightly out of order).
const WINDOW_MARGIN: u64 = 1 << 16;

/// Most ids remembered outside the window.
const MAX_OUTSIDE: usize = 1 << 20;

/// The 8 bytes a tagged input starts with; the dispatch number follows (little endian).
const TAG: &[u8; 8] = b"sy-disp#";

/// `input` tagged with dispatch number `dispatch` (its first 16 bytes replaced); unchanged when
/// it is shorter than 16 bytes.
pub(crate) fn tag(input: &bytes::Bytes, dispatch: u64) -> bytes::Bytes {
    if input.len() < 16 {
        return input.clone();
    }
    let mut tagged = bytes::BytesMut::from(&input[..]);
    tagged[..8].copy_from_slice(TAG);
    tagged[8..16].copy_from_slice(&dispatch.to_le_bytes());
    tagged.freeze()
}

/// The dispatch number a [`tag`]ged input carries.
pub(crate) fn dispatch_of(input: &[u8]) -> Option<u64> {
    let number = input.strip_prefix(TAG.as_slice())?.get(..8)?;
    Some(u64::from_le_bytes(number.try_into().ok()?))
}

/// The task ids the fleet's handlers ran.
#[derive(Debug)]
pub(crate) struct Executions {
    /// The first id of the window; `u64::MAX` until the first record.
    base: AtomicU64,
    bits: Box<[AtomicU64]>,
    outside: Mutex<HashSet<u64>>,
    executions: AtomicU64,
    duplicates: AtomicU64,
    untracked: AtomicU64,
}

impl Default for Executions {
    fn default() -> Self {
        Self {
            base: AtomicU64::new(u64::MAX),
            bits: (0..WINDOW / 64).map(|_| AtomicU64::new(0)).collect(),
            outside: Mutex::default(),
            executions: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            untracked: AtomicU64::new(0),
        }
    }
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
        let first = task.saturating_sub(WINDOW_MARGIN);
        let base =
            match self
                .base
                .compare_exchange(u64::MAX, first, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => first,
                Err(base) => base,
            };
        let seen_before = match task.checked_sub(base).filter(|offset| *offset < WINDOW) {
            Some(offset) => {
                let word = usize::try_from(offset / 64).unwrap_or(usize::MAX);
                let bit = 1u64 << (offset % 64);
                match self.bits.get(word) {
                    Some(word) => word.fetch_or(bit, Ordering::Relaxed) & bit != 0,
                    None => self.outside(task),
                }
            }
            None => self.outside(task),
        };
        if seen_before {
            self.duplicates.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records `task` in the bounded set for ids outside the window; true if it was there.
    fn outside(&self, task: u64) -> bool {
        let mut seen = self.outside.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.contains(&task) {
            return true;
        }
        if seen.len() < MAX_OUTSIDE {
            seen.insert(task);
        } else {
            self.untracked.fetch_add(1, Ordering::Relaxed);
        }
        false
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

    #[test]
    fn ids_outside_the_window_are_checked_too() {
        let executions = Executions::default();
        let first = 10 * WINDOW;
        executions.record(first);
        // Far above the window, and below its start: both go to the bounded set.
        for task in [first + 2 * WINDOW, 1, first + 2 * WINDOW, 1] {
            executions.record(task);
        }
        // Control: a new id in the window is not a duplicate.
        executions.record(first + 1);
        assert_eq!(executions.counts().duplicate_executions, 2);
        assert_eq!(executions.counts().executions, 6);
    }

    #[test]
    fn a_dispatch_run_again_under_a_new_task_id_is_one_duplicate() {
        let input = bytes::Bytes::from(vec![0x5a; 64]);
        let (first, again) = (tag(&input, 7), tag(&input, 7));
        assert_eq!(dispatch_of(&first), Some(7));
        let executions = Executions::default();
        executions.record(dispatch_of(&first).unwrap_or(100));
        executions.record(dispatch_of(&again).unwrap_or(200));
        assert_eq!(executions.counts().duplicate_executions, 1);
        // Control: another dispatch is not a duplicate, and a short input carries no number.
        executions.record(dispatch_of(&tag(&input, 8)).unwrap_or(300));
        assert_eq!(executions.counts().duplicate_executions, 1);
        assert_eq!(
            dispatch_of(&tag(&bytes::Bytes::from_static(b"short"), 9)),
            None
        );
    }
}
