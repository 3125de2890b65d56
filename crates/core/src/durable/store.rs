//! The [`DispatchStore`] seam: where durable dispatches are kept.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::record::{
    BacklogCensus, Completion, DispatchFilter, DispatchId, NewDispatch, OutcomeRecord, Recorded,
    StoredDispatch,
};
use crate::address::WorkerId;

/// Keeps durable dispatches: one record per [`DispatchId`], one outcome per record.
///
/// Writes that the producer is told about ([`record`](Self::record) and
/// [`complete`](Self::complete)) return only once they would survive a crash of the process
/// (and, as configured, of the machine); the others ([`park`](Self::park),
/// [`claim`](Self::claim), [`extend`](Self::extend), [`release`](Self::release)) may be lost by
/// a crash, which costs at most a repeated attempt number or a parked reason. Implementations
/// batch writes (group commit); every method may be called from many tasks at once. A state
/// note (`park`, `claim`, `release`) for a finished dispatch changes nothing: one may land
/// after the outcome.
///
/// The dispatcher keeps what is running in memory and uses the store for what must outlive
/// it, so a store that leases claims (a replicated log with acknowledgement deadlines) says so
/// ([`leases_claims`](Self::leases_claims)) and keeps them alive through
/// [`extend`](Self::extend).
#[async_trait]
pub trait DispatchStore: Send + Sync + std::fmt::Debug + 'static {
    /// Records a new dispatch, refusing it when a bound would be passed; with an idempotency
    /// key already used in the namespace (and not yet deleted), records nothing and returns
    /// the first dispatch's id.
    async fn record(&self, dispatch: NewDispatch) -> Result<Recorded, DispatchStoreError>;

    /// [`record`](Self::record) for a dispatch delivered while it records (a keyless durable
    /// `Dispatch` or `Submit`, see [`orders_writes`](Self::orders_writes)): the store may hold
    /// the record back a short while so that an outcome sent meanwhile is written with it,
    /// answering, as `record`, once the record is committed. The dispatch is shared with its
    /// driver, which runs it meanwhile: a store that keeps it until its write needs no copy.
    /// Default: [`record`](Self::record) of a copy.
    async fn record_before_outcome(
        &self,
        dispatch: Arc<NewDispatch>,
    ) -> Result<Recorded, DispatchStoreError> {
        self.record(Arc::unwrap_or_clone(dispatch)).await
    }

    /// Notes that `id` waits for a worker, and why ([`UnservedReason`](crate::UnservedReason)
    /// label).
    async fn park(&self, id: &DispatchId, reason: &str) -> Result<(), DispatchStoreError>;

    /// Notes that `id` was delivered to `worker` as delivery number `attempt`.
    async fn claim(
        &self,
        id: &DispatchId,
        worker: WorkerId,
        attempt: u32,
    ) -> Result<(), DispatchStoreError>;

    /// Keeps `id`'s claim alive while its worker runs it; called only by a store that
    /// [leases claims](Self::leases_claims).
    async fn extend(&self, id: &DispatchId) -> Result<(), DispatchStoreError>;

    /// Records `id`'s one outcome at `at`; the first outcome recorded wins.
    async fn complete(
        &self,
        id: &DispatchId,
        outcome: &OutcomeRecord,
        at: SystemTime,
    ) -> Result<Completion, DispatchStoreError>;

    /// Puts a claimed or parked `id` back to queued, not to be selected before `delay` has
    /// passed.
    async fn release(&self, id: &DispatchId, delay: Duration) -> Result<(), DispatchStoreError>;

    /// Every dispatch not finished (queued, parked, running), oldest submission first: what a
    /// restart resumes.
    async fn unfinished(&self) -> Result<Vec<StoredDispatch>, DispatchStoreError>;

    /// One dispatch, if it is recorded and not yet deleted.
    async fn get(&self, id: &DispatchId) -> Result<Option<StoredDispatch>, DispatchStoreError>;

    /// Dispatches matching `filter`, oldest submission first, at most `filter.limit`.
    async fn list(
        &self,
        filter: &DispatchFilter,
    ) -> Result<Vec<StoredDispatch>, DispatchStoreError>;

    /// Backlog per pool address at `now`: waiting and running counts, oldest waiting age.
    async fn census(&self, now: SystemTime) -> Result<Vec<BacklogCensus>, DispatchStoreError>;

    /// Deletes dispatches finished before `finished_before`; returns how many.
    async fn purge(&self, finished_before: SystemTime) -> Result<u64, DispatchStoreError>;

    /// Waits up to `wait` for `id`'s outcome to be recorded, by this process or another one
    /// sharing the store, and returns the finished row; `None` when none was recorded within
    /// the wait. What `AwaitOutcome` does for a dispatch no driver runs here. Default: `None`
    /// at once, for a store no other process writes to (its dispatches all run here).
    async fn await_recorded(
        &self,
        _id: &DispatchId,
        _wait: Duration,
    ) -> Result<Option<StoredDispatch>, DispatchStoreError> {
        Ok(None)
    }

    /// The outcomes other processes sharing this store record from now on, each as its
    /// finished row, for this process's watchers; `None` (the default): no other process
    /// writes to it. Called once, at start.
    fn recorded_elsewhere(&self) -> Option<mpsc::Receiver<StoredDispatch>> {
        None
    }

    /// True when one task's writes are applied in the order that task first polled them (it
    /// polls the earlier one first whenever both are woken), so a [`complete`](Self::complete)
    /// called while the dispatch's [`record`](Self::record) is still committing lands after
    /// the record. The durable dispatcher then delivers a durable `Dispatch` without an idempotency key while its
    /// record commits (the outcome still waits for both). Default `false`: it delivers only
    /// after the record returned.
    fn orders_writes(&self) -> bool {
        false
    }

    /// True when a claim lapses unless [extended](Self::extend) while its worker runs it: the
    /// driver of a running dispatch then extends it every 30 s. Default `false`: a claim lasts
    /// until its dispatch is completed or released, and the driver keeps no timer for it.
    fn leases_claims(&self) -> bool {
        false
    }
}

/// Why a store refused or failed an operation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchStoreError {
    /// The namespace already has `limit` dispatches recorded and not finished.
    #[error("`store.max_queued_per_namespace` ({limit}) reached for namespace {namespace:?}")]
    QueueFull {
        /// The namespace.
        namespace: String,
        /// The configured bound.
        limit: u64,
    },
    /// The store already holds `limit` bytes.
    #[error("`store.max_bytes` ({limit}) reached: the store holds {size} bytes")]
    StoreFull {
        /// Its size now, in bytes.
        size: u64,
        /// The configured bound, in bytes.
        limit: u64,
    },
    /// The file system holding the store has no space left; nothing was recorded.
    #[error("no space left on the file system holding the store ({path}); nothing was recorded")]
    DiskFull {
        /// The store's file.
        path: String,
    },
    /// The idempotency key is longer than the limit or empty.
    #[error("idempotency_key: {problem}")]
    InvalidKey {
        /// What is wrong with it.
        problem: String,
    },
    /// This node's configuration does not take durable dispatches; `setting` would.
    #[error("durable dispatches are refused here: {reason}; set {setting}")]
    Refused {
        /// The setting that would allow them (`key = value`).
        setting: String,
        /// Why this configuration refuses them.
        reason: String,
    },
    /// The store failed to read or write (I/O error, a closed writer).
    #[error("dispatch store unavailable: {detail}")]
    Unavailable {
        /// What failed.
        detail: String,
    },
}
