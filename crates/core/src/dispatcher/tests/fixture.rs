//! What every dispatcher test stands on: a scripted delivery leg and its far end, a registry
//! and dispatcher pair, and the requests and results the tests send.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::delivery::{TransportName, WorkerDelivery};
use crate::dispatcher::*;
use crate::eligibility::Eligibility;
use crate::registration::Registration;
use crate::registry::RegistrationToken;

pub(crate) const NS: &str = "ns";
pub(crate) const ACTIVITY: &str = "work";

/// A delivery leg whose far end the test reads, that can refuse tasks or play disconnected.
pub(crate) struct Leg {
    pub(crate) tx: mpsc::Sender<WorkerMessage>,
    pub(crate) connected: AtomicBool,
    /// Task deliveries still to refuse with `Full`.
    pub(crate) refuse_tasks: AtomicU32,
    /// Largest task frame the leg carries; a task frame is its input plus [`TASK_FRAMING`].
    pub(crate) frame_limit: AtomicUsize,
}

/// Bytes a task frame adds around its input on the test leg.
pub(crate) const TASK_FRAMING: usize = 20;

impl WorkerDelivery for Leg {
    fn transport(&self) -> TransportName {
        TransportName::from_static("test")
    }

    fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    fn registration_carries_capacity(&self) -> bool {
        true
    }

    fn deliver(&self, message: WorkerMessage) -> Result<(), DeliveryError> {
        if let WorkerMessage::Task(task) = &message {
            let size = task.input.len() + TASK_FRAMING;
            let limit = self.frame_limit.load(Ordering::Acquire);
            if size > limit {
                return Err(DeliveryError::TooLarge { size, limit });
            }
        }
        if matches!(message, WorkerMessage::Task(_))
            && self
                .refuse_tasks
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(DeliveryError::Full);
        }
        self.tx.try_send(message).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => DeliveryError::Full,
            mpsc::error::TrySendError::Closed(_) => DeliveryError::Closed,
        })
    }
}

/// The far end of a [`Leg`]: what the gateway sent this worker.
pub(crate) struct TestWorker {
    pub(crate) id: WorkerId,
    pub(crate) token: Option<RegistrationToken>,
    pub(crate) rx: mpsc::Receiver<WorkerMessage>,
    pub(crate) leg: Arc<Leg>,
}

impl TestWorker {
    /// The next task sent to this worker (skipping other messages); fails the test after a
    /// minute of (paused) time.
    pub(crate) async fn task(&mut self) -> ActivityTask {
        let limit = Instant::now() + Duration::from_secs(60);
        loop {
            match tokio::time::timeout_at(limit, self.rx.recv()).await {
                Ok(Some(WorkerMessage::Task(task))) => return task,
                Ok(Some(_)) => {}
                Ok(None) => panic!("worker {} link closed while waiting for a task", self.id),
                Err(_) => panic!("worker {} got no task", self.id),
            }
        }
    }

    /// Everything sent to this worker and not yet read, without waiting.
    pub(crate) fn sent(&mut self) -> Vec<WorkerMessage> {
        std::iter::from_fn(|| self.rx.try_recv().ok()).collect()
    }

    pub(crate) fn leave(&mut self) {
        drop(self.token.take());
    }
}

pub(crate) struct Setup {
    pub(crate) registry: Registry,
    pub(crate) dispatcher: Dispatcher,
}

pub(crate) fn setup() -> Setup {
    setup_with(DispatchConfig::default())
}

pub(crate) fn setup_with(config: DispatchConfig) -> Setup {
    let registry = Registry::default();
    let dispatcher = Dispatcher::new(registry.clone(), config);
    Setup {
        registry,
        dispatcher,
    }
}

pub(crate) fn caller() -> CallerIdentity {
    CallerIdentity::trusted("producer")
}

pub(crate) fn registration(capacity: u32) -> Registration {
    Registration {
        namespaces: BTreeSet::from([NS.to_owned()]),
        activity_types: BTreeSet::from([ACTIVITY.to_owned()]),
        identity: "test-worker".to_owned(),
        max_concurrency: Some(capacity),
        ..Registration::default()
    }
}

pub(crate) fn request(input: &str, timeout: Duration) -> ActivityRequest {
    ActivityRequest {
        namespace: NS.to_owned(),
        task_queue: String::new(),
        activity_type: ACTIVITY.to_owned(),
        node: None,
        input: Bytes::copy_from_slice(input.as_bytes()),
        activity_id: None,
        timeout,
    }
}

pub(crate) fn with_id(mut request: ActivityRequest, id: &str) -> ActivityRequest {
    request.activity_id = Some(id.to_owned());
    request
}

impl Setup {
    pub(crate) async fn worker(&self, capacity: u32) -> TestWorker {
        let (tx, rx) = mpsc::channel(256);
        let leg = Arc::new(Leg {
            tx,
            connected: AtomicBool::new(true),
            refuse_tasks: AtomicU32::new(0),
            frame_limit: AtomicUsize::new(usize::MAX),
        });
        let token = self
            .registry
            .admit(&caller(), registration(capacity), Arc::clone(&leg) as _)
            .await
            .expect("a valid registration is admitted");
        TestWorker {
            id: token.worker_id(),
            token: Some(token),
            rx,
            leg,
        }
    }

    pub(crate) fn spawn(&self, request: ActivityRequest) -> JoinHandle<ActivityOutcome> {
        let dispatcher = self.dispatcher.clone();
        tokio::spawn(async move {
            dispatcher
                .dispatch(&caller(), request)
                .await
                .expect("the dispatch is accepted")
        })
    }

    pub(crate) fn in_flight(&self, worker: &TestWorker) -> u32 {
        self.registry
            .worker(worker.id)
            .map(|w| w.in_flight)
            .expect("worker registered")
    }

    pub(crate) fn eligibility(&self, worker: &TestWorker) -> Eligibility {
        self.registry
            .worker(worker.id)
            .map(|w| w.eligibility)
            .expect("worker registered")
    }

    /// Lets spawned dispatches run until `n` wait parked (bounded; paused time stays put).
    pub(crate) async fn parked(&self, n: usize) {
        for _ in 0..1000 {
            let waiting: usize = self
                .dispatcher
                .unserved_queues()
                .iter()
                .map(|q| q.waiting)
                .sum();
            if waiting == n {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("{n} dispatches never parked");
    }
}

pub(crate) fn success(input: &str) -> TaskResult {
    TaskResult::Success(Bytes::copy_from_slice(input.as_bytes()))
}

pub(crate) fn completed(input: &str) -> ActivityOutcome {
    ActivityOutcome::Completed(Bytes::copy_from_slice(input.as_bytes()))
}
