//! How a [`SqliteStore`](crate::SqliteStore) is opened: durability, bounds, group commit.

use std::time::Duration;

/// How far each commit is pushed to the disk before it is acknowledged (`PRAGMA synchronous`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Synchronous {
    /// Every commit is fsynced before it is acknowledged: an acknowledged submission survives
    /// a crash of the process and a loss of power.
    #[default]
    Full,
    /// The log is fsynced at checkpoints only: an acknowledged submission survives a crash of
    /// the process, but the last commits before a loss of power or a kernel crash may be lost.
    Normal,
}

impl Synchronous {
    /// Its label in configuration and in SQLite's pragma: `full` or `normal`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Normal => "normal",
        }
    }

    /// The mode named `label` (`full`, `normal`), if any.
    pub fn from_label(label: &str) -> Option<Self> {
        match label {
            "full" => Some(Self::Full),
            "normal" => Some(Self::Normal),
            _ => None,
        }
    }
}

/// Options of [`SqliteStore::open`](crate::SqliteStore::open); [`Default`] gives the values
/// documented on each field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Durability of an acknowledged write; default [`Synchronous::Full`].
    pub synchronous: Synchronous,
    /// Most dispatches recorded and not finished in one namespace; `record` refuses the next
    /// one with `QueueFull`. Default 100,000.
    pub max_queued_per_namespace: u64,
    /// Most bytes the store's pages in use may hold (`(page_count - freelist_count) *
    /// page_size`, so space freed by a purge counts as free); `record` refuses an input that
    /// would pass it with `StoreFull`. Default 1 GiB.
    pub max_bytes: u64,
    /// Most commands the writer commits in one transaction; 0 is taken as 1. Default 512.
    pub max_batch: usize,
    /// Longest the writer waits for more commands after the first of a batch arrived before
    /// it commits. Default 0: the writer commits what is queued at once, and the commands that
    /// arrive while it commits form the next batch (a wait measured slower at 256 outstanding).
    pub max_delay: Duration,
    /// Longest the writer holds back the record of a dispatch delivered while it records (a
    /// durable `Dispatch` without an idempotency key), or a `claim` note, waiting for the
    /// dispatch's outcome to write them with it (one finished row; the claim's attempt in it).
    /// Nothing is answered before a record's commit (the outcome waits for it), so the hold
    /// only delays answers; a crash within it loses a dispatch nobody was told of, which may
    /// have run, or a claim (a repeated attempt number). Zero writes every record and note at
    /// once. Default 10 ms.
    pub hold_for_outcome: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            max_queued_per_namespace: 100_000,
            max_bytes: 1 << 30,
            max_batch: 512,
            max_delay: Duration::ZERO,
            hold_for_outcome: Duration::from_millis(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synchronous_labels_round_trip_and_full_is_the_default() {
        for mode in [Synchronous::Full, Synchronous::Normal] {
            assert_eq!(Synchronous::from_label(mode.label()), Some(mode));
        }
        assert_eq!(Synchronous::from_label("off"), None);
        assert_eq!(SqliteOptions::default().synchronous, Synchronous::Full);
    }

    /// The group commit's bounds as `docs/durability.md` states them: up to 512 commands a
    /// commit, and a record held back up to 10 ms for its outcome.
    #[test]
    fn the_group_commit_defaults_are_the_documented_ones() {
        let defaults = SqliteOptions::default();
        assert_eq!(defaults.max_batch, 512);
        assert_eq!(defaults.hold_for_outcome, Duration::from_millis(10));
    }
}
