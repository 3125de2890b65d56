//! Test doubles for the registry and the admission gate: a channel-backed delivery leg and
//! small builders, shared by the registry's and the gate's unit tests.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio::sync::mpsc;

use super::{DispatchReservation, RegistrationToken, Registry};
use crate::address::{Node, WorkerId};
use crate::admission::AdmissionError;
use crate::delivery::{DeliveryError, TransportName, WorkerDelivery, WorkerMessage};
use crate::registration::{CallerIdentity, Registration};

/// Capacity the default test registration states.
pub(crate) const CAPACITY: u32 = 4;

type Hook = Box<dyn Fn(&WorkerMessage) + Send + Sync>;

/// A [`WorkerDelivery`] that queues into a bounded channel, with switches for the transport
/// traits the registry branches on.
pub(crate) struct TestLeg {
    tx: mpsc::Sender<WorkerMessage>,
    connected: AtomicBool,
    carries_capacity: bool,
    supports_drain: bool,
    /// Runs inside `deliver`, before queueing, to observe the registry at that moment.
    hook: Mutex<Option<Hook>>,
}

impl TestLeg {
    /// A leg whose registration carries capacity and which can drain.
    pub(crate) fn new() -> (Arc<Self>, mpsc::Receiver<WorkerMessage>) {
        Self::with(true, true)
    }

    /// A leg whose registration cannot carry capacity (announced later).
    pub(crate) fn announcing() -> (Arc<Self>, mpsc::Receiver<WorkerMessage>) {
        Self::with(false, true)
    }

    /// A leg with no drain channel.
    pub(crate) fn drainless() -> (Arc<Self>, mpsc::Receiver<WorkerMessage>) {
        Self::with(true, false)
    }

    fn with(
        carries_capacity: bool,
        supports_drain: bool,
    ) -> (Arc<Self>, mpsc::Receiver<WorkerMessage>) {
        let (tx, rx) = mpsc::channel(16);
        let leg = Self {
            tx,
            connected: AtomicBool::new(true),
            carries_capacity,
            supports_drain,
            hook: Mutex::new(None),
        };
        (Arc::new(leg), rx)
    }

    /// Makes `is_connected` report `connected`.
    pub(crate) fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::SeqCst);
    }

    /// Runs `hook` on every message, inside `deliver`.
    pub(crate) fn on_deliver(&self, hook: impl Fn(&WorkerMessage) + Send + Sync + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(hook));
    }
}

impl WorkerDelivery for TestLeg {
    fn transport(&self) -> TransportName {
        TransportName::from_static("test")
    }

    fn is_connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst) && !self.tx.is_closed()
    }

    fn registration_carries_capacity(&self) -> bool {
        self.carries_capacity
    }

    fn supports_drain(&self) -> bool {
        self.supports_drain
    }

    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        if let Some(hook) = self.hook.lock().unwrap().as_ref() {
            hook(&message);
        }
        self.tx.try_send(message).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => DeliveryError::Full,
            mpsc::error::TrySendError::Closed(_) => DeliveryError::Closed,
        })
    }
}

/// A registration for `namespaces` / `task_queue` / `node` (empty = none) / `activities`,
/// stating [`CAPACITY`].
pub(crate) fn registration(
    namespaces: &[&str],
    task_queue: &str,
    node: &str,
    activities: &[&str],
) -> Registration {
    Registration {
        namespaces: namespaces.iter().map(|s| (*s).to_owned()).collect(),
        task_queue: task_queue.to_owned(),
        node: Node::new(node),
        activity_types: activities.iter().map(|s| (*s).to_owned()).collect(),
        identity: "test-worker".to_owned(),
        max_concurrency: Some(CAPACITY),
        reconnect_grace: std::time::Duration::ZERO,
    }
}

/// A registered worker: its token, its leg and the leg's receiving end.
pub(crate) struct Admitted {
    pub(crate) token: RegistrationToken,
    pub(crate) leg: Arc<TestLeg>,
    pub(crate) rx: mpsc::Receiver<WorkerMessage>,
}

impl Admitted {
    /// The worker's id.
    pub(crate) fn id(&self) -> WorkerId {
        self.token.worker_id()
    }
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// Runs the gate for `caller` on a fresh default [`TestLeg`], keeping the leg's receiving end
/// alive (a dropped receiver reads as a disconnected worker).
pub(crate) async fn try_admit(
    registry: &Registry,
    caller: &CallerIdentity,
    registration: Registration,
) -> Result<Admitted, AdmissionError> {
    let (leg, rx) = TestLeg::new();
    let token = registry.admit(caller, registration, leg.clone()).await?;
    Ok(Admitted { token, leg, rx })
}

/// Admits `registration` on `leg` for a caller granted everything; no runtime needed, since
/// the in-memory namespace store never suspends.
pub(crate) fn admit_on(
    registry: &Registry,
    registration: Registration,
    (leg, rx): (Arc<TestLeg>, mpsc::Receiver<WorkerMessage>),
) -> Admitted {
    let token = futures::executor::block_on(registry.admit(
        &CallerIdentity::trusted("tester"),
        registration,
        leg.clone(),
    ))
    .unwrap();
    Admitted { token, leg, rx }
}

/// Admits `registration` on a default [`TestLeg`].
pub(crate) fn admit(registry: &Registry, registration: Registration) -> Admitted {
    admit_on(registry, registration, TestLeg::new())
}

/// Selects in `(namespace, task_queue, activity)` on `node`, frees the slot at once, and
/// returns who was chosen.
pub(crate) fn pick(
    registry: &Registry,
    namespace: &str,
    task_queue: &str,
    activity: &str,
    node: Option<&str>,
) -> Option<WorkerId> {
    registry
        .select_and_reserve(namespace, task_queue, activity, node)
        .map(|(worker, _slot)| worker.id())
}

/// Selects and keeps the reservation.
pub(crate) fn hold(
    registry: &Registry,
    namespace: &str,
    task_queue: &str,
    activity: &str,
) -> Option<DispatchReservation> {
    registry
        .select_and_reserve(namespace, task_queue, activity, None)
        .map(|(_, slot)| slot)
}

/// The ids `workers_for` lists, in its order.
pub(crate) fn listed(
    registry: &Registry,
    namespace: &str,
    task_queue: &str,
    activity: &str,
    node: Option<&str>,
) -> Vec<WorkerId> {
    registry
        .workers_for(namespace, task_queue, activity, node)
        .iter()
        .map(crate::Worker::id)
        .collect()
}

/// Polls `future` once with a waker that does nothing: proves readiness without a clock.
pub(crate) fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
}
