//! A store that keeps what it holds but records no new durable dispatch: a cluster node
//! without a store the other nodes read.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use switchyard_core::{
    BacklogCensus, Completion, DispatchFilter, DispatchId, DispatchStore, DispatchStoreError,
    NewDispatch, OutcomeRecord, Recorded, StoredDispatch, WorkerId,
};

/// Wraps a node's own store: [`record`](DispatchStore::record) answers `refusal`, everything
/// else goes to the inner store, so dispatches it already holds still resume, run and answer
/// `AwaitOutcome`.
#[derive(Debug)]
pub(crate) struct RefusingNewDispatches {
    inner: std::sync::Arc<dyn DispatchStore>,
    refusal: DispatchStoreError,
}

impl RefusingNewDispatches {
    /// `inner`, refusing every new record with `refusal`.
    pub(crate) fn new(
        inner: std::sync::Arc<dyn DispatchStore>,
        refusal: DispatchStoreError,
    ) -> Self {
        Self { inner, refusal }
    }
}

#[async_trait]
impl DispatchStore for RefusingNewDispatches {
    async fn record(&self, _dispatch: NewDispatch) -> Result<Recorded, DispatchStoreError> {
        Err(self.refusal.clone())
    }

    async fn park(&self, id: &DispatchId, reason: &str) -> Result<(), DispatchStoreError> {
        self.inner.park(id, reason).await
    }

    async fn claim(
        &self,
        id: &DispatchId,
        worker: WorkerId,
        attempt: u32,
    ) -> Result<(), DispatchStoreError> {
        self.inner.claim(id, worker, attempt).await
    }

    async fn extend(&self, id: &DispatchId) -> Result<(), DispatchStoreError> {
        self.inner.extend(id).await
    }

    async fn complete(
        &self,
        id: &DispatchId,
        outcome: &OutcomeRecord,
        at: SystemTime,
    ) -> Result<Completion, DispatchStoreError> {
        self.inner.complete(id, outcome, at).await
    }

    async fn release(&self, id: &DispatchId, delay: Duration) -> Result<(), DispatchStoreError> {
        self.inner.release(id, delay).await
    }

    async fn unfinished(&self) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
        self.inner.unfinished().await
    }

    async fn get(&self, id: &DispatchId) -> Result<Option<StoredDispatch>, DispatchStoreError> {
        self.inner.get(id).await
    }

    async fn list(
        &self,
        filter: &DispatchFilter,
    ) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
        self.inner.list(filter).await
    }

    async fn census(&self, now: SystemTime) -> Result<Vec<BacklogCensus>, DispatchStoreError> {
        self.inner.census(now).await
    }

    async fn purge(&self, finished_before: SystemTime) -> Result<u64, DispatchStoreError> {
        self.inner.purge(finished_before).await
    }

    // `false`: a durable `Dispatch` must not be delivered before its (refused) record returns.
    fn orders_writes(&self) -> bool {
        false
    }

    fn leases_claims(&self) -> bool {
        self.inner.leases_claims()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use bytes::Bytes;
    use switchyard_core::{MemoryDispatchStore, MemoryStoreLimits};

    use super::*;

    fn dispatch() -> NewDispatch {
        NewDispatch {
            id: DispatchId::generate(),
            namespace: "default".to_owned(),
            task_queue: "default".to_owned(),
            activity_type: "echo".to_owned(),
            node: None,
            input: Bytes::from_static(b"x"),
            principal: "shop".to_owned(),
            idempotency_key: None,
            submitted_at: SystemTime::now(),
            deadline: SystemTime::now() + Duration::from_secs(60),
        }
    }

    fn refusal() -> DispatchStoreError {
        DispatchStoreError::Refused {
            setting: "store.backend = \"jetstream\"".to_owned(),
            reason: "test".to_owned(),
        }
    }

    #[tokio::test]
    async fn new_records_are_refused_while_held_dispatches_still_resume() {
        let inner = Arc::new(MemoryDispatchStore::new(MemoryStoreLimits::default()));
        let held = dispatch();
        inner.record(held.clone()).await.unwrap();
        let store = RefusingNewDispatches::new(inner.clone(), refusal());
        assert_eq!(store.record(dispatch()).await, Err(refusal()));
        let unfinished = store.unfinished().await.unwrap();
        assert_eq!(unfinished.len(), 1, "only the held dispatch");
        assert_eq!(unfinished[0].dispatch.id, held.id);
        // Control: the inner store alone records the same dispatch.
        assert!(inner.record(dispatch()).await.is_ok());
        assert!(
            !store.orders_writes(),
            "nothing is delivered before a refused record"
        );
    }
}
