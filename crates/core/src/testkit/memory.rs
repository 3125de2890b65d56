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
//! Workers that ask for a session get one: [`MemoryWorker::break_link`] cuts the link while the
//! worker lives on, and its runtime resumes through [`Core::resume`], keeping its running
//! tasks and re-sending results the gateway never acknowledged.
//!
//! [`MemoryHarness`] plugs the two into the conformance kit; it can also make the link
//! announce capacity after registration, like a transport whose registration frame cannot
//! carry it, or grant no sessions, like a transport whose reconnect grace is zero.

mod connection;
mod dial;
mod link;
mod runtime;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

pub use link::TRANSPORT;

use super::handler::Handler;
use super::harness::{BoxError, ConformanceWorker, HarnessError, TransportHarness, WorkerSpec};
use crate::address::WorkerId;
use crate::admission::AdmissionError;
use crate::handle::Core;
use crate::registration::{CallerIdentity, Registration};
use dial::{Dialer, Policy};
use runtime::{Runtime, Shared, Stats};

/// The gateway side of the in-memory transport over one [`Core`]; dropping it closes every
/// link it serves.
pub struct MemoryGateway {
    core: Core,
    policy: Policy,
    stopped: CancellationToken,
    _stop_on_drop: DropGuard,
}

impl std::fmt::Debug for MemoryGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryGateway")
            .field("policy", &self.policy)
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

    /// A gateway whose reconnect grace is zero: a worker asking for a session gets none, and
    /// a broken link deregisters it as it always did.
    pub fn without_sessions(mut self) -> Self {
        self.policy.grants_sessions = false;
        self
    }

    /// A broken gateway, for the kit's own controls: it keeps a worker's link open after core
    /// has let the worker go, as a transport that ignores the token's departure would.
    pub fn ignoring_departures(mut self) -> Self {
        self.policy.ignores_departures = true;
        self
    }

    /// A broken worker runtime, for the kit's own controls: a resuming worker reports no task
    /// it runs and no result it sent, so it lets go of everything it held and the gateway
    /// dispatches those tasks again.
    pub fn forgetting_tasks_on_resume(mut self) -> Self {
        self.policy.forgets_tasks_on_resume = true;
        self
    }

    fn build(core: Core, announces_capacity: bool) -> Self {
        let stopped = CancellationToken::new();
        Self {
            core,
            policy: Policy {
                announces_capacity,
                ignores_departures: false,
                grants_sessions: true,
                forgets_tasks_on_resume: false,
            },
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
    /// closes the link and is returned as the gate gave it. A registration with a non-zero
    /// `reconnect_grace` asks for a session.
    pub async fn connect(
        &self,
        caller: &CallerIdentity,
        registration: Registration,
        handler: Handler,
    ) -> Result<MemoryWorker, AdmissionError> {
        let capacity = registration.max_concurrency.unwrap_or(0);
        let dialer = Dialer {
            core: self.core.clone(),
            caller: caller.clone(),
            registration,
            policy: self.policy,
            stopped: self.stopped.clone(),
        };
        let opened = dialer.register().await?;
        let shared = Arc::new(Shared::new(opened.worker, &opened.link));
        let stats = Arc::new(Stats::default());
        let frozen = CancellationToken::new();
        let runtime = Runtime::new(
            capacity,
            handler,
            frozen.clone(),
            Arc::clone(&stats),
            Arc::clone(&shared),
            dialer,
        );
        let runtime = tokio::spawn(runtime.run(opened.link, opened.session));
        Ok(MemoryWorker {
            shared,
            frozen,
            runtime,
            stats,
        })
    }
}

/// A worker at the far end of a memory link; dropping it closes the link.
pub struct MemoryWorker {
    shared: Arc<Shared>,
    frozen: CancellationToken,
    runtime: JoinHandle<()>,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for MemoryWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryWorker")
            .field("id", &self.id())
            .finish_non_exhaustive()
    }
}

impl MemoryWorker {
    /// The id the gateway gave it (a new one if, its link broken, it had to register afresh).
    pub fn id(&self) -> WorkerId {
        self.shared.worker()
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

    /// Cuts the link abruptly and ends the worker: the gateway's leg reports closed at once
    /// and its connection task sees the link end; running handlers are dropped without an
    /// answer.
    pub fn sever(&self) {
        self.shared.cut();
        self.runtime.abort();
    }

    /// Cuts the link abruptly but keeps the worker: its handlers keep running and its
    /// runtime reconnects, resuming its session if it has one, else registering afresh.
    pub fn break_link(&self) {
        self.shared.cut();
        self.shared.breaks.notify_one();
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
        self.id()
    }

    fn sever(&self) {
        MemoryWorker::sever(self);
    }

    fn freeze(&self) {
        MemoryWorker::freeze(self);
    }

    fn break_link(&self) {
        MemoryWorker::break_link(self);
    }
}

/// Runs the conformance kit over the in-memory transport.
#[derive(Clone, Copy, Debug)]
pub struct MemoryHarness {
    announces_capacity: bool,
    sessions: bool,
}

impl Default for MemoryHarness {
    fn default() -> Self {
        Self {
            announces_capacity: false,
            sessions: true,
        }
    }
}

impl MemoryHarness {
    /// Registrations carry capacity; workers that ask for a session get one.
    pub fn new() -> Self {
        Self::default()
    }

    /// Workers announce capacity after registering (see [`MemoryGateway::announcing_capacity`]).
    pub fn announcing_capacity() -> Self {
        Self {
            announces_capacity: true,
            ..Self::default()
        }
    }

    /// The gateway grants no sessions (see [`MemoryGateway::without_sessions`]); the harness
    /// declares resume unsupported, so the kit checks the fallback.
    pub fn without_sessions(self) -> Self {
        Self {
            sessions: false,
            ..self
        }
    }
}

#[async_trait]
impl TransportHarness for MemoryHarness {
    type Gateway = MemoryGateway;
    type Worker = MemoryWorker;

    async fn start(&self, core: Core) -> Result<MemoryGateway, BoxError> {
        let gateway = MemoryGateway::build(core, self.announces_capacity);
        Ok(if self.sessions {
            gateway
        } else {
            gateway.without_sessions()
        })
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

    fn supports_resume(&self) -> bool {
        self.sessions
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use tokio::sync::broadcast;

    use super::*;
    use crate::events::{DisconnectReason, WorkerEvent};
    use crate::outcome::{ActivityOutcome, ActivityRequest, TaskResult};
    use crate::registry::Registry;
    use crate::testkit::TaskCall;
    use crate::testkit::conformance_config;

    const LIMIT: Duration = Duration::from_secs(10);

    fn registration(grace: Duration) -> Registration {
        Registration {
            namespaces: ["mem".to_owned()].into(),
            activity_types: ["hold".to_owned()].into(),
            max_concurrency: Some(1),
            reconnect_grace: grace,
            ..Registration::default()
        }
    }

    fn request() -> ActivityRequest {
        ActivityRequest {
            namespace: "mem".to_owned(),
            task_queue: String::new(),
            activity_type: "hold".to_owned(),
            node: None,
            input: Bytes::from_static(b"in"),
            activity_id: None,
            timeout: LIMIT,
        }
    }

    /// Holds its task until `release`, then echoes it; counts its calls in `started`.
    fn hold(release: CancellationToken, started: tokio::sync::mpsc::Sender<()>) -> Handler {
        Handler::new(move |call: TaskCall| {
            let (release, started) = (release.clone(), started.clone());
            async move {
                let _ = started.send(()).await;
                release.cancelled().await;
                TaskResult::Success(call.input)
            }
        })
    }

    /// The events about `worker` up to and including the first that `last` accepts.
    async fn events_until(
        events: &mut broadcast::Receiver<WorkerEvent>,
        worker: WorkerId,
        last: impl Fn(&WorkerEvent) -> bool,
    ) -> Vec<WorkerEvent> {
        let mut seen = Vec::new();
        for _ in 0..64 {
            let event = tokio::time::timeout(LIMIT, events.recv())
                .await
                .expect("an event within the limit")
                .expect("the event stream is open");
            if crate::testkit::fixture::event_worker(&event) == worker {
                let done = last(&event);
                seen.push(event);
                if done {
                    break;
                }
            }
        }
        seen
    }

    /// What [`break_holding_worker`] saw.
    struct Broken {
        /// The worker's events after the break.
        seen: Vec<WorkerEvent>,
        /// Its id before the break.
        before: WorkerId,
        outcome: ActivityOutcome,
        worker: MemoryWorker,
        events: broadcast::Receiver<WorkerEvent>,
    }

    /// Breaks the link of a worker holding a task, on a gateway with or without sessions.
    async fn break_holding_worker(sessions: bool) -> Broken {
        let core = Core::start(Registry::builder(), conformance_config());
        let mut events = core.registry().subscribe_events();
        let gateway = MemoryGateway::new(core.clone());
        let gateway = if sessions {
            gateway
        } else {
            gateway.without_sessions()
        };
        let release = CancellationToken::new();
        let (started, mut starts) = tokio::sync::mpsc::channel(4);
        let caller = CallerIdentity::trusted("mem-test");
        let worker = gateway
            .connect(
                &caller,
                registration(Duration::from_secs(5)),
                hold(release.clone(), started),
            )
            .await
            .expect("admitted");
        let before = worker.id();
        let _ = events_until(&mut events, before, |event| {
            matches!(event, WorkerEvent::ProbationPassed { .. })
        })
        .await;
        let dispatch = tokio::spawn({
            let core = core.clone();
            async move { core.dispatcher().dispatch(&caller, request()).await }
        });
        starts.recv().await.expect("the task reached the handler");
        worker.break_link();
        let seen = events_until(&mut events, before, |event| {
            matches!(
                event,
                WorkerEvent::Resumed { .. } | WorkerEvent::Disconnected { .. }
            )
        })
        .await;
        release.cancel();
        let outcome = if sessions {
            tokio::time::timeout(LIMIT, dispatch)
                .await
                .expect("an outcome within the limit")
                .expect("the dispatch task ran")
                .expect("dispatched")
        } else {
            // Nobody else serves the pool: the task waits for the re-registered worker.
            dispatch.abort();
            ActivityOutcome::Cancelled
        };
        Broken {
            seen,
            before,
            outcome,
            worker,
            events,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_broken_link_suspends_the_session_then_resumes_it_under_the_same_id() {
        let broken = break_holding_worker(true).await;
        assert!(
            matches!(
                broken.seen.as_slice(),
                [WorkerEvent::Suspended { .. }, WorkerEvent::Resumed { .. }]
            ),
            "events after the break: {:?}",
            broken.seen
        );
        assert_eq!(broken.worker.id(), broken.before, "same worker id");
        assert_eq!(
            broken.outcome,
            ActivityOutcome::Completed(Bytes::from_static(b"in"))
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_sessions_a_broken_link_deregisters_and_the_worker_registers_afresh() {
        let mut broken = break_holding_worker(false).await;
        assert_eq!(
            broken.seen,
            [WorkerEvent::Disconnected {
                worker: broken.before,
                reason: DisconnectReason::Disconnect
            }],
            "control: no suspension without a session"
        );
        // Bounded by the limit on each event; only the fresh registration's events follow.
        let fresh = loop {
            let event = tokio::time::timeout(LIMIT, broken.events.recv())
                .await
                .expect("the worker registers again within the limit")
                .expect("the event stream is open");
            if let WorkerEvent::Connected { worker, .. } = event {
                break worker;
            }
        };
        assert_ne!(fresh, broken.before, "a fresh registration has a new id");
    }
}
