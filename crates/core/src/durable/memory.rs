//! [`MemoryDispatchStore`]: a [`DispatchStore`] in the gateway's memory.
//!
//! It survives nothing (a restart loses it); it serves `store.backend = "memory"` and tests,
//! and is the reference the other stores are held to: the same bounds, the same first outcome
//! wins, the same idempotency per namespace.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::record::{
    BacklogCensus, Completion, DispatchFilter, DispatchId, DispatchState, NewDispatch,
    OutcomeRecord, Recorded, StoredDispatch, check_idempotency_key,
};
use super::store::{DispatchStore, DispatchStoreError};
use crate::address::WorkerId;
use crate::registry::shrink_after_drain;

/// The bounds of a [`MemoryDispatchStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryStoreLimits {
    /// Unfinished dispatches one namespace may hold (`store.max_queued_per_namespace`).
    pub max_queued_per_namespace: u64,
    /// Input bytes all held dispatches may add up to, finished ones included until they are
    /// purged (`store.max_bytes`).
    pub max_bytes: u64,
}

impl Default for MemoryStoreLimits {
    fn default() -> Self {
        Self {
            max_queued_per_namespace: 100_000,
            max_bytes: 1 << 30,
        }
    }
}

#[derive(Debug, Default)]
struct Rows {
    /// Rows by id, with their submission sequence number.
    rows: HashMap<DispatchId, (u64, StoredDispatch)>,
    /// Ids in submission order.
    order: BTreeMap<u64, DispatchId>,
    next_seq: u64,
    /// `(namespace, idempotency key)` → the id recorded with it.
    keys: HashMap<(String, String), DispatchId>,
    /// Unfinished rows per namespace.
    unfinished: HashMap<String, u64>,
    /// Input bytes of every row held.
    bytes: u64,
}

impl Rows {
    /// Changes the state of an unfinished row; finished or unknown rows are left alone.
    fn update(&mut self, id: &DispatchId, change: impl FnOnce(&mut StoredDispatch)) {
        if let Some((_, row)) = self.rows.get_mut(id)
            && !matches!(row.state, DispatchState::Finished { .. })
        {
            change(row);
        }
    }

    fn in_order(&self) -> impl Iterator<Item = &StoredDispatch> {
        self.order
            .values()
            .filter_map(|id| self.rows.get(id).map(|(_, row)| row))
    }
}

/// A [`DispatchStore`] in memory, bounded by [`MemoryStoreLimits`].
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use switchyard_core::{
///     DispatchId, DispatchStore, MemoryDispatchStore, MemoryStoreLimits, NewDispatch, Recorded,
/// };
///
/// # tokio_test_block(async {
/// let store = MemoryDispatchStore::new(MemoryStoreLimits::default());
/// let now = SystemTime::now();
/// let dispatch = NewDispatch {
///     id: DispatchId::generate(),
///     namespace: "payments".into(),
///     task_queue: "default".into(),
///     activity_type: "charge".into(),
///     node: None,
///     input: "order 7".into(),
///     principal: "shop".into(),
///     idempotency_key: Some("order-7".into()),
///     submitted_at: now,
///     deadline: now + Duration::from_secs(60),
/// };
/// let first = store.record(dispatch.clone()).await?;
/// let again = store.record(NewDispatch { id: DispatchId::generate(), ..dispatch }).await?;
/// assert!(matches!(first, Recorded::New(_)));
/// assert_eq!(again, Recorded::Existing(first.id().clone()));
/// # Ok::<(), switchyard_core::DispatchStoreError>(())
/// # });
/// # fn tokio_test_block<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Debug)]
pub struct MemoryDispatchStore {
    limits: MemoryStoreLimits,
    rows: Mutex<Rows>,
}

impl MemoryDispatchStore {
    /// An empty store bounded by `limits`.
    pub fn new(limits: MemoryStoreLimits) -> Self {
        Self {
            limits,
            rows: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Rows> {
        self.rows.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn input_bytes(dispatch: &NewDispatch) -> u64 {
    u64::try_from(dispatch.input.len()).unwrap_or(u64::MAX)
}

#[async_trait]
impl DispatchStore for MemoryDispatchStore {
    async fn record(&self, dispatch: NewDispatch) -> Result<Recorded, DispatchStoreError> {
        if let Some(key) = &dispatch.idempotency_key {
            check_idempotency_key(key)?;
        }
        let mut rows = self.lock();
        if let Some(key) = &dispatch.idempotency_key
            && let Some(id) = rows.keys.get(&(dispatch.namespace.clone(), key.clone()))
        {
            return Ok(Recorded::Existing(id.clone()));
        }
        let queued = rows
            .unfinished
            .get(&dispatch.namespace)
            .copied()
            .unwrap_or(0);
        if queued >= self.limits.max_queued_per_namespace {
            return Err(DispatchStoreError::QueueFull {
                namespace: dispatch.namespace,
                limit: self.limits.max_queued_per_namespace,
            });
        }
        let bytes = input_bytes(&dispatch);
        if rows.bytes.saturating_add(bytes) > self.limits.max_bytes {
            return Err(DispatchStoreError::StoreFull {
                size: rows.bytes,
                limit: self.limits.max_bytes,
            });
        }
        let id = dispatch.id.clone();
        if rows.rows.contains_key(&id) {
            return Err(DispatchStoreError::Unavailable {
                detail: format!("dispatch id {id} is already recorded"),
            });
        }
        if let Some(key) = &dispatch.idempotency_key {
            rows.keys
                .insert((dispatch.namespace.clone(), key.clone()), id.clone());
        }
        *rows
            .unfinished
            .entry(dispatch.namespace.clone())
            .or_default() += 1;
        rows.bytes += bytes;
        let seq = rows.next_seq;
        rows.next_seq += 1;
        rows.order.insert(seq, id.clone());
        let row = StoredDispatch {
            dispatch,
            state: DispatchState::Queued { not_before: None },
            attempts: 0,
        };
        rows.rows.insert(id.clone(), (seq, row));
        Ok(Recorded::New(id))
    }

    async fn park(&self, id: &DispatchId, reason: &str) -> Result<(), DispatchStoreError> {
        self.lock().update(id, |row| {
            row.state = DispatchState::Parked {
                reason: reason.to_owned(),
            };
        });
        Ok(())
    }

    async fn claim(
        &self,
        id: &DispatchId,
        worker: WorkerId,
        attempt: u32,
    ) -> Result<(), DispatchStoreError> {
        self.lock().update(id, |row| {
            row.state = DispatchState::Running { worker, attempt };
            row.attempts = row.attempts.max(attempt);
        });
        Ok(())
    }

    async fn extend(&self, _id: &DispatchId) -> Result<(), DispatchStoreError> {
        // Nothing leases a claim in memory.
        Ok(())
    }

    async fn complete(
        &self,
        id: &DispatchId,
        outcome: &OutcomeRecord,
        at: SystemTime,
    ) -> Result<Completion, DispatchStoreError> {
        let mut rows = self.lock();
        let Some((_, row)) = rows.rows.get_mut(id) else {
            return Ok(Completion::Unknown);
        };
        if let DispatchState::Finished { outcome, .. } = &row.state {
            return Ok(Completion::AlreadyFinished(outcome.clone()));
        }
        row.state = DispatchState::Finished {
            outcome: outcome.clone(),
            at,
        };
        let namespace = row.dispatch.namespace.clone();
        if let Some(count) = rows.unfinished.get_mut(&namespace) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                rows.unfinished.remove(&namespace);
            }
        }
        Ok(Completion::Recorded)
    }

    async fn release(&self, id: &DispatchId, delay: Duration) -> Result<(), DispatchStoreError> {
        let not_before = (!delay.is_zero()).then(|| SystemTime::now() + delay);
        self.lock().update(id, |row| {
            row.state = DispatchState::Queued { not_before };
        });
        Ok(())
    }

    async fn unfinished(&self) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
        let rows = self.lock();
        Ok(rows
            .in_order()
            .filter(|row| !matches!(row.state, DispatchState::Finished { .. }))
            .cloned()
            .collect())
    }

    async fn get(&self, id: &DispatchId) -> Result<Option<StoredDispatch>, DispatchStoreError> {
        Ok(self.lock().rows.get(id).map(|(_, row)| row.clone()))
    }

    async fn list(
        &self,
        filter: &DispatchFilter,
    ) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
        let rows = self.lock();
        let limit = if filter.limit == 0 {
            usize::MAX
        } else {
            filter.limit
        };
        Ok(rows
            .in_order()
            .filter(|row| filter.admits(row))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn census(&self, now: SystemTime) -> Result<Vec<BacklogCensus>, DispatchStoreError> {
        Ok(BacklogCensus::tally(self.lock().in_order(), now))
    }

    async fn purge(&self, finished_before: SystemTime) -> Result<u64, DispatchStoreError> {
        let mut rows = self.lock();
        let expired: Vec<DispatchId> = rows
            .rows
            .iter()
            .filter(|(_, (_, row))| {
                matches!(row.state, DispatchState::Finished { at, .. } if at < finished_before)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            if let Some((seq, row)) = rows.rows.remove(id) {
                rows.order.remove(&seq);
                rows.bytes = rows.bytes.saturating_sub(input_bytes(&row.dispatch));
                if let Some(key) = row.dispatch.idempotency_key {
                    rows.keys.remove(&(row.dispatch.namespace, key));
                }
            }
        }
        shrink_after_drain(&mut rows.rows);
        shrink_after_drain(&mut rows.keys);
        Ok(u64::try_from(expired.len()).unwrap_or(u64::MAX))
    }

    /// Every write finishes on its first poll.
    fn orders_writes(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::ActivityOutcome;

    fn dispatch(namespace: &str, input: &str, key: Option<&str>) -> NewDispatch {
        let now = SystemTime::now();
        NewDispatch {
            id: DispatchId::generate(),
            namespace: namespace.to_owned(),
            task_queue: "default".to_owned(),
            activity_type: "work".to_owned(),
            node: None,
            input: input.to_owned().into(),
            principal: "p".to_owned(),
            idempotency_key: key.map(str::to_owned),
            submitted_at: now,
            deadline: now + Duration::from_secs(60),
        }
    }

    fn outcome(text: &str) -> OutcomeRecord {
        OutcomeRecord::from(&ActivityOutcome::Completed(text.to_owned().into()))
    }

    fn store(max_queued_per_namespace: u64, max_bytes: u64) -> MemoryDispatchStore {
        MemoryDispatchStore::new(MemoryStoreLimits {
            max_queued_per_namespace,
            max_bytes,
        })
    }

    #[tokio::test]
    async fn the_queue_bound_counts_unfinished_dispatches_per_namespace() {
        let store = store(2, u64::MAX);
        let first = store.record(dispatch("a", "1", None)).await.expect("room");
        store.record(dispatch("a", "2", None)).await.expect("room");
        let refused = store.record(dispatch("a", "3", None)).await;
        assert_eq!(
            refused,
            Err(DispatchStoreError::QueueFull {
                namespace: "a".to_owned(),
                limit: 2
            })
        );
        assert!(
            refused
                .expect_err("refused")
                .to_string()
                .contains("`store.max_queued_per_namespace` (2)")
        );
        store
            .record(dispatch("b", "1", None))
            .await
            .expect("b has its own bound");
        // Control: once one finishes, there is room again.
        store
            .complete(first.id(), &outcome("done"), SystemTime::now())
            .await
            .expect("completes");
        store
            .record(dispatch("a", "3", None))
            .await
            .expect("room again");
    }

    #[tokio::test]
    async fn the_size_bound_counts_input_bytes_until_the_rows_are_purged() {
        let store = store(100, 10);
        let first = store
            .record(dispatch("a", "123456", None))
            .await
            .expect("room");
        let refused = store.record(dispatch("a", "12345", None)).await;
        assert_eq!(
            refused,
            Err(DispatchStoreError::StoreFull { size: 6, limit: 10 })
        );
        store
            .record(dispatch("a", "1234", None))
            .await
            .expect("fits exactly");
        let done = SystemTime::now();
        store
            .complete(first.id(), &outcome("done"), done)
            .await
            .expect("completes");
        // A finished row still holds its bytes...
        assert!(store.record(dispatch("a", "1", None)).await.is_err());
        // ...until it is purged (control: the same record then fits).
        assert_eq!(store.purge(done + Duration::from_secs(1)).await, Ok(1));
        store
            .record(dispatch("a", "1", None))
            .await
            .expect("room after purge");
    }

    #[tokio::test]
    async fn the_first_outcome_wins() {
        let store = store(100, u64::MAX);
        let id = store.record(dispatch("a", "x", None)).await.expect("room");
        let id = id.id();
        assert_eq!(
            store
                .complete(id, &outcome("first"), SystemTime::now())
                .await,
            Ok(Completion::Recorded)
        );
        assert_eq!(
            store
                .complete(id, &outcome("second"), SystemTime::now())
                .await,
            Ok(Completion::AlreadyFinished(outcome("first")))
        );
        // A finished row ignores late state notes.
        store.claim(id, WorkerId::from_raw(1), 3).await.expect("ok");
        let row = store.get(id).await.expect("reads").expect("kept");
        assert_eq!(row.state.label(), "finished");
        assert_eq!(
            store
                .complete(&DispatchId::generate(), &outcome("x"), SystemTime::now())
                .await,
            Ok(Completion::Unknown)
        );
    }

    #[tokio::test]
    async fn idempotency_keys_are_per_namespace_and_freed_by_the_purge() {
        let store = store(100, u64::MAX);
        let first = store
            .record(dispatch("a", "x", Some("k")))
            .await
            .expect("room");
        assert_eq!(
            store.record(dispatch("a", "y", Some("k"))).await,
            Ok(Recorded::Existing(first.id().clone()))
        );
        // Control: the same key in another namespace is another dispatch.
        assert!(matches!(
            store.record(dispatch("b", "x", Some("k"))).await,
            Ok(Recorded::New(_))
        ));
        let done = SystemTime::now();
        store
            .complete(first.id(), &outcome("done"), done)
            .await
            .expect("completes");
        store
            .purge(done + Duration::from_secs(1))
            .await
            .expect("purges");
        assert!(matches!(
            store.record(dispatch("a", "x", Some("k"))).await,
            Ok(Recorded::New(_))
        ));
        let long = "k".repeat(crate::durable::MAX_IDEMPOTENCY_KEY_BYTES + 1);
        let refused = store.record(dispatch("a", "x", Some(&long))).await;
        assert_eq!(
            refused.map_err(|e| e.to_string()),
            Err("idempotency_key: 257 bytes, longer than the limit of 256".to_owned())
        );
        assert!(matches!(
            store.record(dispatch("a", "x", Some(""))).await,
            Err(DispatchStoreError::InvalidKey { .. })
        ));
    }

    #[tokio::test]
    async fn purge_removes_only_rows_finished_before_the_cutoff() {
        let store = store(100, u64::MAX);
        let old = store
            .record(dispatch("a", "old", None))
            .await
            .expect("room");
        let recent = store
            .record(dispatch("a", "recent", None))
            .await
            .expect("room");
        let open = store
            .record(dispatch("a", "open", None))
            .await
            .expect("room");
        let t0 = SystemTime::now();
        store
            .complete(old.id(), &outcome("o"), t0)
            .await
            .expect("ok");
        store
            .complete(recent.id(), &outcome("r"), t0 + Duration::from_secs(10))
            .await
            .expect("ok");
        assert_eq!(store.purge(t0 + Duration::from_secs(5)).await, Ok(1));
        assert_eq!(store.get(old.id()).await, Ok(None));
        assert!(store.get(recent.id()).await.expect("reads").is_some());
        assert!(store.get(open.id()).await.expect("reads").is_some());
        let unfinished = store.unfinished().await.expect("reads");
        assert_eq!(unfinished.len(), 1);
        assert_eq!(&unfinished[0].dispatch.id, open.id());
    }

    #[tokio::test]
    async fn census_counts_waiting_and_running_per_pool_and_list_filters() {
        let store = store(100, u64::MAX);
        let waiting = dispatch("a", "w", None);
        let submitted = waiting.submitted_at;
        store.record(waiting).await.expect("room");
        let running = store.record(dispatch("a", "r", None)).await.expect("room");
        store
            .claim(running.id(), WorkerId::from_raw(1), 1)
            .await
            .expect("ok");
        let census = store
            .census(submitted + Duration::from_secs(7))
            .await
            .expect("reads");
        assert_eq!(census.len(), 1);
        assert_eq!((census[0].waiting, census[0].running), (1, 1));
        assert_eq!(census[0].oldest_waiting, Some(Duration::from_secs(7)));
        let filter = DispatchFilter {
            state: Some("running".to_owned()),
            ..DispatchFilter::default()
        };
        let listed = store.list(&filter).await.expect("reads");
        assert_eq!(listed.len(), 1);
        assert_eq!(&listed[0].dispatch.id, running.id());
        let limited = DispatchFilter {
            limit: 1,
            ..DispatchFilter::default()
        };
        let first = store.list(&limited).await.expect("reads");
        assert_eq!(first.len(), 1);
        assert_eq!(&*first[0].dispatch.input, b"w", "oldest submission first");
    }
}
