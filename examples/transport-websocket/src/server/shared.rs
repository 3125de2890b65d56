//! State every connection of one listener shares, and how a session learns that core let its
//! worker go.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use switchyard_core::{Core, DisconnectReason, WorkerId};
use tokio_util::sync::CancellationToken;

use crate::config::WsServerConfig;
use switchyard_auth::Authenticate;

/// What every connection of one [`WsServer`](crate::WsServer) reads.
pub(crate) struct Shared {
    pub(crate) core: Core,
    pub(crate) config: WsServerConfig,
    pub(crate) auth: Arc<dyn Authenticate>,
    pub(crate) tls: Option<tokio_rustls::TlsAcceptor>,
    /// Cancelled when the listener stops accepting: no new connection or registration is
    /// taken; registered workers stay. A child of `stop`.
    pub(crate) accepting: CancellationToken,
    /// Cancelled when the listener closes; every session closes with 1001.
    pub(crate) stop: CancellationToken,
    /// Open sessions by worker, to close the socket of a worker core deregistered.
    evictions: Mutex<HashMap<WorkerId, Arc<Eviction>>>,
}

/// Fired when core deregisters a worker (a liveness timeout), with the reason.
#[derive(Default)]
pub(crate) struct Eviction {
    pub(crate) fired: CancellationToken,
    pub(crate) reason: OnceLock<DisconnectReason>,
}

impl Shared {
    pub(crate) fn new(
        core: Core,
        auth: Arc<dyn Authenticate>,
        config: WsServerConfig,
        stop: CancellationToken,
    ) -> Arc<Self> {
        let tls = config.tls.clone().map(tokio_rustls::TlsAcceptor::from);
        let shared = Arc::new(Self {
            core,
            config,
            auth,
            tls,
            accepting: stop.child_token(),
            stop,
            evictions: Mutex::new(HashMap::new()),
        });
        // Core keeps its observers for its own lifetime; the weak reference lets this listener
        // go away before core does.
        let weak: Weak<Self> = Arc::downgrade(&shared);
        shared
            .core
            .registry()
            .observe_departures(Arc::new(move |worker, reason| {
                if let Some(shared) = weak.upgrade() {
                    shared.evicted(worker, reason);
                }
            }));
        shared
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<WorkerId, Arc<Eviction>>> {
        self.evictions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts watching for core letting `worker` go.
    pub(crate) fn watch(&self, worker: WorkerId) -> Arc<Eviction> {
        let eviction = Arc::new(Eviction::default());
        self.lock().insert(worker, Arc::clone(&eviction));
        eviction
    }

    /// Stops watching `worker` (its session is ending on its own).
    pub(crate) fn unwatch(&self, worker: WorkerId) {
        self.lock().remove(&worker);
    }

    fn evicted(&self, worker: WorkerId, reason: DisconnectReason) {
        let Some(eviction) = self.lock().remove(&worker) else {
            return;
        };
        let _ = eviction.reason.set(reason);
        eviction.fired.cancel();
    }
}
