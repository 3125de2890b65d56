//! The in-memory transport: channels for a link, the smallest complete transport.
//!
//! [`MemoryGateway`] is the gateway side: it admits each worker through the one gate with a
//! [`WorkerDelivery`](crate::WorkerDelivery) that queues into a bounded channel, and serves
//! the worker's frames (pongs, results, cancel acknowledgements, capacity, goodbye) by handing
//! each to the matching [`Core`] entry point. [`MemoryWorker`] is the far end: a runtime that
//! answers pings itself, runs a [`Handler`] per task, fires a task's cancellation when a cancel
//! arrives and acknowledges it, finishes its tasks on drain and says goodbye. It counts, on the
//! worker side, the most tasks it ever held at once.
//!
//! [`MemoryHarness`] plugs the two into the conformance kit; it can also make the link
//! announce capacity after registration, like a transport whose registration frame cannot
//! carry it.

mod connection;
mod link;
mod runtime;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

pub use link::TRANSPORT;

use super::handler::Handler;
use super::harness::{BoxError, ConformanceWorker, HarnessError, TransportHarness, WorkerSpec};
use crate::address::WorkerId;
use crate::admission::AdmissionError;
use crate::handle::Core;
use crate::registration::{CallerIdentity, Registration};
use link::{Frame, MemoryDelivery};
use runtime::Stats;

/// The gateway side of the in-memory transport over one [`Core`]; dropping it closes every
/// link it serves.
pub struct MemoryGateway {
    core: Core,
    announces_capacity: bool,
    ignores_departures: bool,
    stopped: CancellationToken,
    _stop_on_drop: DropGuard,
}

impl std::fmt::Debug for MemoryGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryGateway")
            .field("announces_capacity", &self.announces_capacity)
            .finish_non_exhaustive()
    }
}

impl MemoryGateway {
    /// A gateway whose registrations carry capacity.
    pub fn new(core: Core) -> Self {
        Self::build(core, false)
    }

    /// A gateway whose registrations carry no capacity: each worker announces it in a frame
    /// after registering, and is not dispatched to until it has.
    pub fn announcing_capacity(core: Core) -> Self {
        Self::build(core, true)
    }

    /// A broken gateway, for the kit's own controls: it keeps a worker's link open after core
    /// has let the worker go, as a transport that ignores the token's departure would.
    pub fn ignoring_departures(mut self) -> Self {
        self.ignores_departures = true;
        self
    }

    fn build(core: Core, announces_capacity: bool) -> Self {
        let stopped = CancellationToken::new();
        Self {
            core,
            announces_capacity,
            ignores_departures: false,
            _stop_on_drop: stopped.clone().drop_guard(),
            stopped,
        }
    }

    /// The core workers are admitted into.
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// Connects a worker running `handler` and registers it as `caller`.
    ///
    /// Resolves once the worker is admitted and its capacity settled; a refusal of either
    /// closes the link and is returned as the gate gave it.
    pub async fn connect(
        &self,
        caller: &CallerIdentity,
        registration: Registration,
        handler: Handler,
    ) -> Result<MemoryWorker, AdmissionError> {
        let (to_worker, inbox) = mpsc::channel(link::TO_WORKER);
        let (outbox, frames) = mpsc::channel(link::TO_GATEWAY);
        let severed = Arc::new(AtomicBool::new(false));
        let capacity = registration.max_concurrency;
        let registration = Registration {
            max_concurrency: if self.announces_capacity {
                None
            } else {
                capacity
            },
            ..registration
        };
        let delivery =
            MemoryDelivery::new(to_worker, Arc::clone(&severed), !self.announces_capacity);
        let token = self
            .core
            .registry()
            .admit(caller, registration, Arc::new(delivery))
            .await?;
        let id = token.worker_id();
        tokio::spawn(connection::serve(
            self.core.clone(),
            token,
            frames,
            self.stopped.child_token(),
            (!self.ignores_departures).then(|| Arc::clone(&severed)),
        ));
        let stats = Arc::new(Stats::default());
        let frozen = CancellationToken::new();
        let runtime = tokio::spawn(runtime::run(
            capacity.unwrap_or(0),
            handler,
            inbox,
            outbox.clone(),
            frozen.clone(),
            Arc::clone(&stats),
        ));
        let worker = MemoryWorker {
            id,
            severed,
            frozen,
            runtime,
            stats,
        };
        if let (true, Some(max_concurrency)) = (self.announces_capacity, capacity) {
            let (reply, answer) = oneshot::channel();
            let announced = outbox
                .send(Frame::Capabilities {
                    max_concurrency,
                    reply,
                })
                .await;
            match (announced, answer.await) {
                (Ok(()), Ok(Ok(()))) => {}
                (_, Ok(Err(refusal))) => return Err(refusal),
                _ => return Err(AdmissionError::UnknownWorker),
            }
        }
        Ok(worker)
    }
}

/// A worker at the far end of a memory link; dropping it closes the link.
pub struct MemoryWorker {
    id: WorkerId,
    severed: Arc<AtomicBool>,
    frozen: CancellationToken,
    runtime: JoinHandle<()>,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for MemoryWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryWorker")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl MemoryWorker {
    /// The id the gateway gave it.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// Tasks it holds now (received and not yet answered).
    pub fn held(&self) -> u32 {
        self.stats.held.load(Ordering::Acquire)
    }

    /// The most tasks it ever held at once.
    pub fn peak_held(&self) -> u32 {
        self.stats.peak_held.load(Ordering::Acquire)
    }

    /// Tasks that arrived while it already held its capacity (answered with a failure).
    pub fn overcommits(&self) -> u32 {
        self.stats.overcommits.load(Ordering::Acquire)
    }

    /// True once the runtime has stopped (link closed, drain finished, severed).
    pub fn is_finished(&self) -> bool {
        self.runtime.is_finished()
    }

    /// Cuts the link abruptly: the gateway's leg reports closed at once and its connection
    /// task sees the link end; running handlers are dropped without an answer.
    pub fn sever(&self) {
        self.severed.store(true, Ordering::Release);
        self.runtime.abort();
    }

    /// Stops reading and answering (pings included) while keeping the link open.
    pub fn freeze(&self) {
        self.frozen.cancel();
    }
}

impl Drop for MemoryWorker {
    fn drop(&mut self) {
        self.runtime.abort();
    }
}

impl ConformanceWorker for MemoryWorker {
    fn worker_id(&self) -> WorkerId {
        self.id
    }

    fn sever(&self) {
        MemoryWorker::sever(self);
    }

    fn freeze(&self) {
        MemoryWorker::freeze(self);
    }
}

/// Runs the conformance kit over the in-memory transport.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryHarness {
    announces_capacity: bool,
}

impl MemoryHarness {
    /// Registrations carry capacity.
    pub fn new() -> Self {
        Self::default()
    }

    /// Workers announce capacity after registering (see [`MemoryGateway::announcing_capacity`]).
    pub fn announcing_capacity() -> Self {
        Self {
            announces_capacity: true,
        }
    }
}

#[async_trait]
impl TransportHarness for MemoryHarness {
    type Gateway = MemoryGateway;
    type Worker = MemoryWorker;

    async fn start(&self, core: Core) -> Result<MemoryGateway, BoxError> {
        Ok(MemoryGateway::build(core, self.announces_capacity))
    }

    async fn connect(
        &self,
        gateway: &MemoryGateway,
        spec: WorkerSpec,
    ) -> Result<MemoryWorker, HarnessError> {
        gateway
            .connect(&spec.caller, spec.registration, spec.handler)
            .await
            .map_err(|refusal| HarnessError::Refused {
                kind: refusal.kind(),
                message: refusal.to_string(),
            })
    }
}
