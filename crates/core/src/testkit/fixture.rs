//! One check's world: a fresh core with short liveness, the transport's gateway over it, and
//! helpers that wait on events instead of sleeping.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::conformance_config;
use super::handler::Handler;
use super::harness::{ConformanceWorker, HarnessError, TransportHarness, WorkerSpec};
use super::probe::Probe;
use crate::address::WorkerId;
use crate::eligibility::Eligibility;
use crate::events::WorkerEvent;
use crate::handle::Core;
use crate::outcome::{ActivityOutcome, ActivityRequest};
use crate::registration::{CallerIdentity, Registration};
use crate::registry::Registry;

/// Longest the kit waits for any one expected event; generous for loaded CI machines, and only
/// ever reached when the transport fails the check.
pub(crate) const STEP: Duration = Duration::from_secs(10);

/// Namespace, task queue and activity type every check uses.
pub(crate) const NAMESPACE: &str = "conformance";
pub(crate) const TASK_QUEUE: &str = "kit";
pub(crate) const ACTIVITY: &str = "echo";

/// What a check returns: `Err` carries the sentence naming what the transport got wrong.
pub(crate) type Verdict = Result<(), String>;

/// Fails the check with a formatted sentence unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}
pub(crate) use ensure;

/// A fresh core and gateway for one check.
pub(crate) struct Fixture<'h, H: TransportHarness> {
    harness: &'h H,
    pub(crate) core: Core,
    gateway: H::Gateway,
    events: broadcast::Receiver<WorkerEvent>,
}

/// The caller every check dispatches as.
pub(crate) fn producer() -> CallerIdentity {
    CallerIdentity::trusted("conformance-producer")
}

/// The caller every check's valid workers connect as.
pub(crate) fn worker_caller() -> CallerIdentity {
    CallerIdentity::trusted("conformance-worker")
}

/// The registration every check's workers start from.
pub(crate) fn registration(capacity: u32) -> Registration {
    Registration {
        namespaces: BTreeSet::from([NAMESPACE.to_owned()]),
        task_queue: TASK_QUEUE.to_owned(),
        node: None,
        activity_types: BTreeSet::from([ACTIVITY.to_owned()]),
        identity: "conformance-worker".to_owned(),
        max_concurrency: Some(capacity),
        reconnect_grace: std::time::Duration::ZERO,
    }
}

/// The reconnect grace a check asks for when it wants its worker to have a session.
pub(crate) const SESSION_GRACE: Duration = Duration::from_secs(5);

/// [`registration`] asking for a session of [`SESSION_GRACE`].
pub(crate) fn session_registration(capacity: u32) -> Registration {
    Registration {
        reconnect_grace: SESSION_GRACE,
        ..registration(capacity)
    }
}

/// The worker an event is about.
pub(crate) fn event_worker(event: &WorkerEvent) -> WorkerId {
    match event {
        WorkerEvent::Connected { worker, .. }
        | WorkerEvent::Disconnected { worker, .. }
        | WorkerEvent::Excluded { worker, .. }
        | WorkerEvent::ProbationPassed { worker }
        | WorkerEvent::Recovered { worker }
        | WorkerEvent::Suspended { worker, .. }
        | WorkerEvent::Resumed { worker }
        | WorkerEvent::CapacityAnnounced { worker, .. } => *worker,
    }
}

/// A dispatch request to the kit's pool.
pub(crate) fn request(input: impl Into<Bytes>, timeout: Duration) -> ActivityRequest {
    ActivityRequest {
        namespace: NAMESPACE.to_owned(),
        task_queue: TASK_QUEUE.to_owned(),
        activity_type: ACTIVITY.to_owned(),
        node: None,
        input: input.into(),
        activity_id: None,
        timeout,
    }
}

impl<'h, H: TransportHarness> Fixture<'h, H> {
    pub(crate) async fn start(harness: &'h H) -> Result<Self, String> {
        let core = Core::start(Registry::builder(), conformance_config());
        let events = core.registry().subscribe_events();
        let gateway = harness
            .start(core.clone())
            .await
            .map_err(|error| format!("the harness could not start its gateway: {error}"))?;
        Ok(Self {
            harness,
            core,
            gateway,
            events,
        })
    }

    pub(crate) fn registry(&self) -> &Registry {
        self.core.registry()
    }

    /// Whether the transport under test keeps sessions across a broken link.
    pub(crate) fn supports_resume(&self) -> bool {
        self.harness.supports_resume()
    }

    /// Connects a worker as `caller` with `registration`, without waiting for eligibility.
    pub(crate) async fn try_connect(
        &self,
        caller: CallerIdentity,
        registration: Registration,
        handler: Handler,
    ) -> Result<H::Worker, HarnessError> {
        let spec = WorkerSpec {
            caller,
            registration,
            handler,
        };
        match tokio::time::timeout(STEP, self.harness.connect(&self.gateway, spec)).await {
            Ok(result) => result,
            Err(_) => Err(HarnessError::Transport(
                format!("connect did not resolve within {STEP:?}").into(),
            )),
        }
    }

    /// Connects a worker of `capacity` running `handler` (observed by the returned probe) and
    /// waits until selection may choose it.
    pub(crate) async fn worker(
        &self,
        capacity: u32,
        handler: Handler,
    ) -> Result<(H::Worker, Probe), String> {
        let probe = Probe::new();
        let worker = self.worker_with(capacity, &probe, handler).await?;
        Ok((worker, probe))
    }

    /// Like [`Fixture::worker`], observed by a probe the caller made (so the handler can read it).
    pub(crate) async fn worker_with(
        &self,
        capacity: u32,
        probe: &Probe,
        handler: Handler,
    ) -> Result<H::Worker, String> {
        self.registered_worker(registration(capacity), probe, handler)
            .await
    }

    /// Like [`Fixture::worker_with`], registering `registration`.
    pub(crate) async fn registered_worker(
        &self,
        registration: Registration,
        probe: &Probe,
        handler: Handler,
    ) -> Result<H::Worker, String> {
        let worker = self
            .try_connect(worker_caller(), registration, probe.wrap(handler))
            .await
            .map_err(|error| format!("a valid worker was not admitted: {error}"))?;
        self.wait_eligible(worker.worker_id()).await?;
        Ok(worker)
    }

    /// Waits (on the registry's arrival signal, never by polling on a timer) until `worker`
    /// is eligible: admitted, capacity known, opening probation lifted by answered pings.
    pub(crate) async fn wait_eligible(&self, worker: WorkerId) -> Verdict {
        self.wait_for_registry(STEP, |registry| {
            registry
                .worker(worker)
                .is_some_and(|w| w.eligibility == Eligibility::Eligible)
        })
        .await
        .then_some(())
        .ok_or_else(|| {
            let standing = self.registry().worker(worker).map_or_else(
                || "not registered".to_owned(),
                |w| w.eligibility.to_string(),
            );
            format!(
                "worker {worker} was not eligible within {STEP:?} (still {standing}); does the \
                 runtime answer pings?"
            )
        })
    }

    /// Waits until `condition` holds, re-checking on every registry wake; false after `limit`.
    pub(crate) async fn wait_for_registry(
        &self,
        limit: Duration,
        condition: impl Fn(&Registry) -> bool,
    ) -> bool {
        let until = Instant::now() + limit;
        // Bounded twice: by the deadline, and by a count far above the wakes a check causes.
        for _ in 0..100_000 {
            let arrival = self.registry().worker_arrival();
            if condition(self.registry()) {
                return true;
            }
            if tokio::time::timeout_at(until, arrival).await.is_err() {
                return condition(self.registry());
            }
        }
        false
    }

    /// Consumes worker events until one matches `wanted`; false after [`STEP`].
    pub(crate) async fn wait_event(&mut self, wanted: impl Fn(&WorkerEvent) -> bool) -> bool {
        let until = Instant::now() + STEP;
        loop {
            match tokio::time::timeout_at(until, self.events.recv()).await {
                Ok(Ok(event)) if wanted(&event) => return true,
                Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => return false,
            }
        }
    }

    /// The next event about `worker` (skipping events about others); `None` after [`STEP`].
    pub(crate) async fn next_event_of(&mut self, worker: WorkerId) -> Option<WorkerEvent> {
        let until = Instant::now() + STEP;
        loop {
            match tokio::time::timeout_at(until, self.events.recv()).await {
                Ok(Ok(event)) if event_worker(&event) == worker => return Some(event),
                Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => return None,
            }
        }
    }

    /// Waits until no worker is registered (a refused worker of a transport that announces
    /// capacity after registering leaves as its connection closes); false after [`STEP`].
    pub(crate) async fn wait_empty(&mut self) -> bool {
        let until = Instant::now() + STEP;
        while !self.registry().is_empty() {
            match tokio::time::timeout_at(until, self.events.recv()).await {
                Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => {
                    return self.registry().is_empty();
                }
            }
        }
        true
    }

    /// Dispatches `request` as the kit's producer; a refusal fails the check.
    pub(crate) async fn dispatch(
        &self,
        request: ActivityRequest,
    ) -> Result<ActivityOutcome, String> {
        dispatch(self.core.clone(), request).await
    }

    /// Starts `request` on its own task, so a check can act while it is in flight.
    pub(crate) fn spawn_dispatch(
        &self,
        request: ActivityRequest,
    ) -> tokio::task::JoinHandle<Result<ActivityOutcome, String>> {
        tokio::spawn(dispatch(self.core.clone(), request))
    }
}

async fn dispatch(core: Core, request: ActivityRequest) -> Result<ActivityOutcome, String> {
    let limit = request.timeout + STEP;
    match tokio::time::timeout(limit, core.dispatcher().dispatch(&producer(), request)).await {
        Ok(Ok(outcome)) => Ok(outcome),
        Ok(Err(error)) => Err(format!("dispatch refused: {error}")),
        Err(_) => Err(format!("dispatch gave no outcome within {limit:?}")),
    }
}

/// Awaits a spawned dispatch within [`STEP`] beyond its own timeout.
pub(crate) async fn join(
    handle: tokio::task::JoinHandle<Result<ActivityOutcome, String>>,
) -> Result<ActivityOutcome, String> {
    handle
        .await
        .map_err(|error| format!("dispatch task failed: {error}"))?
}
