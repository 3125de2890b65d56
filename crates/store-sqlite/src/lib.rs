//! Switchyard's embedded durable-dispatch store: a [`DispatchStore`] on one SQLite file.
//!
//! [`SqliteStore::open`] takes the store's lock file, checks the file is a Switchyard store of
//! a schema this build reads ([`OpenError`] says precisely what is wrong otherwise), and starts
//! the one writer thread. Writes are group-committed in WAL mode, fsynced per batch with
//! [`Synchronous::Full`] (the default); reads run on their own connections.
//!
//! The file is plain SQLite: `sqlite3 dispatches.sqlite3 'SELECT state, count(*) FROM
//! dispatches GROUP BY state'` inspects it (times are nanoseconds since the Unix epoch).
//!
//! [`DispatchStore`]: switchyard_core::DispatchStore
#![forbid(unsafe_code)]

mod backlog;
mod codec;
mod fold;
mod hold;
mod inbox;
mod insert;
mod lock;
mod open_error;
mod ops;
mod options;
mod purge;
mod reads;
mod schema;
mod statements;
mod store;
mod sync;
#[cfg(test)]
mod test_ops;
mod writer;

pub use lock::LockHolder;
pub use open_error::OpenError;
pub use options::{SqliteOptions, Synchronous};
pub use store::SqliteStore;
