//! A durable dispatcher over a memory store, on the dispatcher tests' registry and workers.

use std::sync::Arc;
use std::time::Duration;

use crate::dispatcher::tests::fixture::{self, Setup};
use crate::durable::{
    DispatchId, DispatchStore, DurableConfig, DurableDispatcher, MemoryDispatchStore,
    MemoryStoreLimits, StoredDispatch,
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

    /// Stops like a gateway going away: the durable dispatcher, then the dispatcher with no
    /// grace, then waits for every driver to end.
    pub(super) async fn stop(self) {
        self.durable.shutdown();
        self.setup.dispatcher.shutdown(Duration::ZERO).await;
        self.durable.drivers_ended().await;
    }
}
