//! A durable dispatcher over a memory store, on the dispatcher tests' registry and workers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use crate::address::WorkerId;
use crate::dispatcher::tests::fixture::{self, Setup};
use crate::durable::{
    BacklogCensus, Completion, DispatchFilter, DispatchId, DispatchStore, DispatchStoreError,
    DurableConfig, DurableDispatcher, MemoryDispatchStore, MemoryStoreLimits, NewDispatch,
    OutcomeRecord, Recorded, StoredDispatch,
};
use crate::outcome::ActivityRequest;
use crate::registration::CallerIdentity;
use crate::role::Role;

pub(super) use crate::dispatcher::tests::fixture::{ACTIVITY, NS, completed, request, success};

/// A gateway's durable half: registry, dispatcher, store, durable dispatcher.
pub(super) struct Gateway {
    pub(super) setup: Setup,
    pub(super) store: Arc<MemoryDispatchStore>,
    pub(super) durable: DurableDispatcher,
    /// Claims extended, when the store is wrapped (see [`start_slow`]).
    pub(super) extends: Arc<AtomicUsize>,
    /// Rows read by id (`get`), when the store is wrapped.
    pub(super) gets: Arc<AtomicUsize>,
}

pub(super) fn memory() -> Arc<MemoryDispatchStore> {
    Arc::new(MemoryDispatchStore::new(MemoryStoreLimits::default()))
}

/// A gateway started over `store` (a restart when the store already holds dispatches).
pub(super) async fn start(store: Arc<MemoryDispatchStore>) -> Gateway {
    start_with(store, DurableConfig::default()).await
}

pub(super) async fn start_with(store: Arc<MemoryDispatchStore>, config: DurableConfig) -> Gateway {
    start_on_with(fixture::setup(), store, config).await
}

/// A gateway over `setup`'s dispatcher.
pub(super) async fn start_on(setup: Setup, store: Arc<MemoryDispatchStore>) -> Gateway {
    start_on_with(setup, store, DurableConfig::default()).await
}

/// A gateway whose store loses every state note (`park`, `claim`): its rows lag behind
/// the dispatcher, as a store's may.
pub(super) async fn start_lagging(store: Arc<MemoryDispatchStore>) -> Gateway {
    start_wrapped(store, true, false, false, true).await
}

/// A gateway whose store takes a turn of the scheduler before it records, as a store that
/// commits on another thread does.
pub(super) async fn start_slow(store: Arc<MemoryDispatchStore>) -> Gateway {
    start_wrapped(store, false, true, false, true).await
}

/// [`start_slow`] on a store that does not lease claims.
pub(super) async fn start_slow_unleased(store: Arc<MemoryDispatchStore>) -> Gateway {
    start_wrapped(store, false, true, false, false).await
}

/// A gateway whose store never finishes a claim.
pub(super) async fn start_stalling(store: Arc<MemoryDispatchStore>) -> Gateway {
    start_wrapped(store, false, false, true, true).await
}

async fn start_wrapped(
    store: Arc<MemoryDispatchStore>,
    drop_notes: bool,
    slow_record: bool,
    stall_claims: bool,
    leases_claims: bool,
) -> Gateway {
    let setup = fixture::setup();
    let extends = Arc::new(AtomicUsize::new(0));
    let gets = Arc::new(AtomicUsize::new(0));
    let lagging = Arc::new(Wrapped {
        gets: Arc::clone(&gets),
        inner: Arc::clone(&store),
        drop_notes,
        slow_record,
        stall_claims,
        leases_claims,
        extends: Arc::clone(&extends),
    });
    let durable =
        DurableDispatcher::start(setup.dispatcher.clone(), lagging, DurableConfig::default())
            .await
            .expect("the memory store reads");
    Gateway {
        setup,
        store,
        durable,
        extends,
        gets,
    }
}

async fn start_on_with(
    setup: Setup,
    store: Arc<MemoryDispatchStore>,
    config: DurableConfig,
) -> Gateway {
    let durable = DurableDispatcher::start(
        setup.dispatcher.clone(),
        Arc::clone(&store) as Arc<dyn DispatchStore>,
        config,
    )
    .await
    .expect("the memory store reads");
    Gateway {
        setup,
        store,
        durable,
        extends: Arc::default(),
        gets: Arc::default(),
    }
}

/// A producer that may only dispatch (and see its own dispatches) in [`NS`].
pub(super) fn producer(name: &str) -> CallerIdentity {
    CallerIdentity::granted(name, [NS]).with_roles([Role::Producer])
}

/// An operator of [`NS`].
pub(super) fn operator(name: &str) -> CallerIdentity {
    CallerIdentity::granted(name, [NS]).with_roles([Role::Operator])
}

pub(super) fn work(input: &str) -> ActivityRequest {
    request(input, Duration::from_secs(60))
}

impl Gateway {
    /// Submits `input` as `caller`, with no idempotency key.
    pub(super) async fn submit(&self, caller: &CallerIdentity, input: &str) -> DispatchId {
        self.durable
            .submit(caller, work(input), None)
            .await
            .expect("the submission is recorded")
            .id
    }

    /// The store's row for `id`.
    pub(super) async fn row(&self, id: &DispatchId) -> StoredDispatch {
        self.store
            .get(id)
            .await
            .expect("the memory store reads")
            .expect("the dispatch is recorded")
    }

    /// Lets the drivers run until `get` reports `id` in `state` (bounded; paused time stays
    /// put).
    pub(super) async fn until_state(&self, caller: &CallerIdentity, id: &DispatchId, state: &str) {
        for _ in 0..1000 {
            let row = self.durable.get(caller, id).await.expect("visible");
            if row.state.label() == state {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("dispatch {id} never reached {state}");
    }

    /// Lets the drivers write what they heard until the store's row of `id` is `state`
    /// (bounded).
    pub(super) async fn until_row(&self, id: &DispatchId, state: &str) {
        for _ in 0..1000 {
            if self.row(id).await.state.label() == state {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("dispatch {id}'s row never reached {state}");
    }

    /// Stops like a gateway going away: the durable dispatcher, then the dispatcher with no
    /// grace, then waits for every driver to end.
    pub(super) async fn stop(self) {
        self.durable.shutdown();
        self.setup.dispatcher.shutdown(Duration::ZERO).await;
        self.durable.drivers_ended().await;
    }
}

/// A memory store that may drop `park` and `claim`, and may yield before it records.
#[derive(Debug)]
struct Wrapped {
    inner: Arc<MemoryDispatchStore>,
    drop_notes: bool,
    slow_record: bool,
    /// Claims never finish.
    stall_claims: bool,
    /// What [`DispatchStore::leases_claims`] says.
    leases_claims: bool,
    extends: Arc<AtomicUsize>,
    gets: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl DispatchStore for Wrapped {
    async fn record(&self, dispatch: NewDispatch) -> Result<Recorded, DispatchStoreError> {
        if self.slow_record {
            tokio::task::yield_now().await;
        }
        self.inner.record(dispatch).await
    }
    async fn park(&self, id: &DispatchId, reason: &str) -> Result<(), DispatchStoreError> {
        if self.drop_notes {
            return Ok(());
        }
        self.inner.park(id, reason).await
    }
    async fn claim(
        &self,
        id: &DispatchId,
        worker: WorkerId,
        attempt: u32,
    ) -> Result<(), DispatchStoreError> {
        if self.stall_claims {
            std::future::pending::<()>().await;
        }
        if self.drop_notes {
            return Ok(());
        }
        self.inner.claim(id, worker, attempt).await
    }
    async fn extend(&self, id: &DispatchId) -> Result<(), DispatchStoreError> {
        self.extends.fetch_add(1, Ordering::Relaxed);
        self.inner.extend(id).await
    }
    fn leases_claims(&self) -> bool {
        self.leases_claims
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
        self.gets.fetch_add(1, Ordering::Relaxed);
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
    async fn purge(&self, before: SystemTime) -> Result<u64, DispatchStoreError> {
        self.inner.purge(before).await
    }
}
