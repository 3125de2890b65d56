//! Durable dispatch: accepted work that survives a gateway restart.
//!
//! A durable dispatch is recorded in a [`DispatchStore`] before it is acknowledged (`Submit`
//! returns its [`DispatchId`] only once the record is committed), runs through the one
//! [`Dispatcher`](crate::Dispatcher) like any other dispatch, and has exactly one outcome
//! recorded per id, whatever the number of executions. Execution is at-least-once: a gateway
//! that dies while a worker runs the task dispatches it again after the restart, with the
//! attempt number one higher.
//!
//! The store is a narrow trait so that an embedded SQLite file (the default), memory, or a
//! replicated log can sit behind the same dispatcher: [`DispatchStore::record`],
//! [`park`](DispatchStore::park), [`claim`](DispatchStore::claim),
//! [`extend`](DispatchStore::extend), [`complete`](DispatchStore::complete),
//! [`release`](DispatchStore::release), [`census`](DispatchStore::census), plus the reads a
//! restart and the operator API need. Ephemeral dispatches that find a worker at once never
//! touch it.
//!
//! [`DurableDispatcher`] runs durable dispatches over any store: one driver per unfinished
//! dispatch through [`Dispatcher::dispatch_with`](crate::Dispatcher::dispatch_with), the
//! outcome recorded before anyone hears it. [`MemoryDispatchStore`] is the store that keeps
//! nothing across a restart (`store.backend = "memory"`, tests).

mod dispatcher;
mod driver;
mod early;
mod live;
mod memory;
mod notes;
mod record;
mod store;
#[cfg(test)]
mod tests;
mod watch;

pub use dispatcher::{
    Awaited, DurableConfig, DurableDispatcher, LookupError, SubmitError, Submitted,
};
pub use memory::{MemoryDispatchStore, MemoryStoreLimits};
pub use record::{
    BacklogCensus, Completion, DispatchFilter, DispatchId, DispatchState,
    MAX_IDEMPOTENCY_KEY_BYTES, NewDispatch, OutcomeRecord, Recorded, StoredDispatch,
    check_idempotency_key,
};
pub use store::{DispatchStore, DispatchStoreError};
pub use watch::{OutcomeWatch, WatchEvent};
