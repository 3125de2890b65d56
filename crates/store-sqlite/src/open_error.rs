//! [`OpenError`]: why a store could not be opened.

/// Why [`SqliteStore::open`](crate::SqliteStore::open) refused a store; every message names the
/// store's path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The store's directory or file cannot be written.
    #[error("store {path}: not writable: {detail}")]
    NotWritable {
        /// The store's file.
        path: String,
        /// What could not be written, and the system's reason.
        detail: String,
    },
    /// The file is not an SQLite database, or it is corrupt.
    #[error("store {path}: not an SQLite database, or corrupt ({detail})")]
    NotADatabase {
        /// The store's file.
        path: String,
        /// SQLite's reason.
        detail: String,
    },
    /// The file is another application's SQLite database.
    #[error(
        "store {path}: an SQLite database of another application \
         (application_id {found:#010x}, a Switchyard store has {expected:#010x})"
    )]
    Foreign {
        /// The store's file.
        path: String,
        /// The `application_id` found in it.
        found: u32,
        /// A Switchyard store's `application_id`.
        expected: u32,
    },
    /// The store was written by a newer version, with a schema this build cannot read.
    #[error(
        "store {path}: written by a newer version of Switchyard \
         (found schema {found}, this build reads up to {supported})"
    )]
    NewerSchema {
        /// The store's file.
        path: String,
        /// The schema version found.
        found: i64,
        /// The newest schema version this build reads.
        supported: i64,
    },
    /// Another gateway holds the store's lock file.
    #[error("store {path}: locked by another gateway ({holder}); lock file {lock_path}")]
    Locked {
        /// The store's file.
        path: String,
        /// The lock file beside it.
        lock_path: String,
        /// Who holds it, as its lock file says.
        holder: String,
    },
    /// Any other failure of SQLite or of the system.
    #[error("store {path}: {detail}")]
    Failed {
        /// The store's file.
        path: String,
        /// What failed.
        detail: String,
    },
}
