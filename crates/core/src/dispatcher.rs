//! The one dispatcher: turns an [`ActivityRequest`] into exactly one [`ActivityOutcome`].
//!
//! A dispatch selects and reserves a worker through the registry, hands the task to the
//! worker's delivery leg and waits for one [`Signal`](table::Signal). With no worker it parks
//! on the registry's arrival subscription and is listed in [`Dispatcher::unserved_queues`].
//! Results come back through [`Dispatcher::complete`] only; a lost worker's tasks are delivered
//! again, within the transport-loss budget.

mod config;
mod table;
mod unserved;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use config::DispatchConfig;
pub use unserved::{UnservedAddress, UnservedQueue};

use crate::address::{WorkerId, normalise_task_queue};
use crate::delivery::{ActivityTask, CancelReason, DeliveryError, TaskId, WorkerMessage};
use crate::outcome::{
    ActivityOutcome, ActivityRequest, CancelError, CompletionRefused, DispatchError, TaskResult,
};
use crate::registration::CallerIdentity;
use crate::registry::{DispatchReservation, Registry, UnservedReason};
use crate::worker::Worker;
use table::{PendingTask, Signal, TaskTable};
use unserved::{ParkTicket, UnservedBook};

/// How long a parked dispatch keeps its last classification before it looks again.
const RECLASSIFY_AFTER: Duration = Duration::from_secs(1);
/// Longest pause after repeated delivery failures before selecting again.
const MAX_DELIVERY_BACKOFF: Duration = Duration::from_millis(100);

/// Refused completions, by kind, since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RefusedCounts {
    /// Results for tasks that were not pending.
    pub unknown: u64,
    /// Results from a worker that did not hold the task.
    pub foreign: u64,
    /// Results after the dispatch ended.
    pub late: u64,
}

/// The process-wide dispatcher; cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    config: DispatchConfig,
    tasks: Mutex<TaskTable>,
    next_task: AtomicU64,
    /// `(namespace, activity id)` of dispatches in flight, with their cancel handles.
    activities: Mutex<std::collections::HashMap<(String, String), CancellationToken>>,
    unserved: Arc<UnservedBook>,
    shutting_down: AtomicBool,
    /// Fired when shutdown starts: parked dispatches end at once.
    stop_parked: CancellationToken,
    /// Fired when the shutdown grace ends: every dispatch still waiting ends.
    stop_all: CancellationToken,
    task_ended: Notify,
    refused_unknown: AtomicU64,
    refused_foreign: AtomicU64,
    refused_late: AtomicU64,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("pending", &self.inner.lock_tasks().len())
            .finish()
    }
}

impl Inner {
    fn lock_tasks(&self) -> MutexGuard<'_, TaskTable> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_activities(
        &self,
    ) -> MutexGuard<'_, std::collections::HashMap<(String, String), CancellationToken>> {
        self.activities
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn ended(&self) {
        if self.shutting_down.load(Ordering::Acquire) {
            self.task_ended.notify_waiters();
        }
    }

    /// Ends the caller's wait on `task` and asks the worker to stop it. The slot stays held
    /// until the worker acknowledges, answers or leaves.
    fn abandon(&self, task: TaskId, reason: CancelReason) {
        let delivery = self.lock_tasks().detach(task);
        let Some(delivery) = delivery else { return };
        match delivery.deliver(WorkerMessage::Cancel {
            task_id: task,
            reason,
        }) {
            Ok(()) => tracing::debug!(task = %task, reason = reason.as_str(), "cancel sent"),
            Err(DeliveryError::Closed) => {}
            Err(error) => tracing::warn!(task = %task, %error,
                "cancel not delivered; the slot stays held until the worker answers or leaves"),
        }
        self.ended();
    }

    fn worker_lost(&self, worker: WorkerId) {
        let lost = self.lock_tasks().worker_lost(worker);
        if lost.is_empty() {
            return;
        }
        tracing::info!(worker = %worker, tasks = lost.len(), "worker lost with tasks pending");
        for mut pending in lost {
            if let Some(signal) = pending.signal.take() {
                let _ = signal.send(Signal::WorkerLost(pending.delivery.transport()));
            }
        }
        self.ended();
    }
}

/// Removes a pending task when the dispatch future stops waiting for any reason, including
/// being dropped by its caller (which also sends the worker a cancel).
struct PendingGuard<'a> {
    inner: &'a Inner,
    task: TaskId,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.inner.abandon(self.task, CancelReason::CallerGone);
    }
}

/// Holds an activity id for the life of its dispatch.
struct ActivityGuard<'a> {
    inner: &'a Inner,
    key: Option<(String, String)>,
}

impl Drop for ActivityGuard<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.inner.lock_activities().remove(&key);
        }
    }
}

impl Dispatcher {
    /// A dispatcher over `registry`; it re-dispatches the tasks of every worker that leaves.
    pub fn new(registry: Registry, config: DispatchConfig) -> Self {
        let inner = Arc::new(Inner {
            registry: registry.clone(),
            config,
            tasks: Mutex::new(TaskTable::default()),
            next_task: AtomicU64::new(1),
            activities: Mutex::new(std::collections::HashMap::new()),
            unserved: Arc::new(UnservedBook::default()),
            shutting_down: AtomicBool::new(false),
            stop_parked: CancellationToken::new(),
            stop_all: CancellationToken::new(),
            task_ended: Notify::new(),
            refused_unknown: AtomicU64::new(0),
            refused_foreign: AtomicU64::new(0),
            refused_late: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&inner);
        registry.observe_departures(Arc::new(move |worker, _reason| {
            if let Some(inner) = weak.upgrade() {
                inner.worker_lost(worker);
            }
        }));
        Self { inner }
    }

    /// The registry this dispatcher selects from.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Runs one activity on a worker of its pool and returns its one outcome.
    ///
    /// Refused up front (no outcome) when a field is empty, the caller is not granted the
    /// namespace, or the activity id is already in flight in the namespace.
    pub async fn dispatch(
        &self,
        caller: &CallerIdentity,
        request: ActivityRequest,
    ) -> Result<ActivityOutcome, DispatchError> {
        for (field, value) in [
            ("namespace", &request.namespace),
            ("activity_type", &request.activity_type),
        ] {
            if value.is_empty() {
                return Err(DispatchError::Invalid {
                    field,
                    problem: "empty".to_owned(),
                });
            }
        }
        if !caller.grant.allows(&request.namespace) {
            return Err(DispatchError::NamespaceNotGranted {
                principal: caller.principal.clone(),
                namespace: request.namespace.clone(),
            });
        }
        let cancel = CancellationToken::new();
        let _activity = self.claim_activity_id(&request, &cancel)?;
        let started = Instant::now();
        let span = tracing::debug_span!("dispatch", namespace = %request.namespace,
            activity_type = %request.activity_type, activity_id = request.activity_id.as_deref());
        let outcome = if self.inner.shutting_down.load(Ordering::Acquire) {
            ActivityOutcome::ShuttingDown
        } else {
            self.run(&request, &cancel).instrument(span).await
        };
        metrics::counter!("switchyard_dispatches_total", "outcome" => outcome.label()).increment(1);
        metrics::histogram!("switchyard_dispatch_latency_seconds")
            .record(started.elapsed().as_secs_f64());
        Ok(outcome)
    }

    fn claim_activity_id(
        &self,
        request: &ActivityRequest,
        cancel: &CancellationToken,
    ) -> Result<ActivityGuard<'_>, DispatchError> {
        let Some(id) = &request.activity_id else {
            return Ok(ActivityGuard {
                inner: &self.inner,
                key: None,
            });
        };
        let key = (request.namespace.clone(), id.clone());
        let mut activities = self.inner.lock_activities();
        if activities.contains_key(&key) {
            return Err(DispatchError::DuplicateActivityId {
                namespace: key.0,
                activity_id: key.1,
            });
        }
        activities.insert(key.clone(), cancel.clone());
        Ok(ActivityGuard {
            inner: &self.inner,
            key: Some(key),
        })
    }

    async fn run(&self, request: &ActivityRequest, cancel: &CancellationToken) -> ActivityOutcome {
        let timeout = request.timeout.min(self.inner.config.max_timeout);
        let deadline = Instant::now() + timeout;
        let wall_deadline = SystemTime::now() + timeout;
        let mut deliveries: u32 = 0;
        let mut losses: VecDeque<Instant> = VecDeque::new();
        let mut failed_deliveries: u32 = 0;
        loop {
            let (worker, reservation) = match self.acquire(request, deadline, cancel).await {
                Ok(hit) => hit,
                Err(outcome) => return outcome,
            };
            let task = TaskId::from_raw(self.inner.next_task.fetch_add(1, Ordering::Relaxed));
            let (signal, wait) = oneshot::channel();
            let message = WorkerMessage::Task(ActivityTask {
                task_id: task,
                namespace: request.namespace.clone(),
                task_queue: normalise_task_queue(&request.task_queue).to_owned(),
                activity_type: request.activity_type.clone(),
                input: request.input.clone(),
                attempt: deliveries + 1,
                deadline: wall_deadline,
            });
            self.inner.lock_tasks().insert(
                task,
                PendingTask {
                    delivery: Arc::clone(worker.delivery()),
                    reservation,
                    signal: Some(signal),
                },
            );
            let guard = PendingGuard {
                inner: &self.inner,
                task,
            };
            if let Err(error) = worker.delivery().deliver(message) {
                // Attempt-neutral: the task never reached the worker.
                let removed = self.inner.lock_tasks().remove(task);
                drop(removed);
                drop(guard);
                tracing::debug!(worker = %worker.id(), %error, "delivery refused; selecting again");
                failed_deliveries += 1;
                if failed_deliveries > 1 {
                    let pause = Duration::from_millis(1 << failed_deliveries.min(7))
                        .min(MAX_DELIVERY_BACKOFF);
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = tokio::time::sleep_until(deadline) => return self.unserved_now(request),
                        () = cancel.cancelled() => return ActivityOutcome::Cancelled,
                    }
                }
                continue;
            }
            failed_deliveries = 0;
            deliveries += 1;
            tracing::trace!(worker = %worker.id(), task = %task, "task delivered");
            let ended = tokio::select! {
                signal = wait => signal,
                () = tokio::time::sleep_until(deadline) => {
                    self.inner.abandon(task, CancelReason::DeadlineExceeded);
                    return ActivityOutcome::TimedOut;
                }
                () = cancel.cancelled() => {
                    self.inner.abandon(task, CancelReason::Requested);
                    return ActivityOutcome::Cancelled;
                }
                () = self.inner.stop_all.cancelled() => {
                    self.inner.abandon(task, CancelReason::ShuttingDown);
                    return ActivityOutcome::ShuttingDown;
                }
            };
            // The entry left the table with the signal, so the guard has nothing to abandon.
            drop(guard);
            match ended {
                Ok(Signal::Result(TaskResult::Success(output))) => {
                    return ActivityOutcome::Completed(output);
                }
                Ok(Signal::Result(TaskResult::Failure { message, retryable })) => {
                    return ActivityOutcome::Failed { message, retryable };
                }
                Ok(Signal::WorkerLost(transport)) => {
                    let now = Instant::now();
                    losses.push_back(now);
                    while losses.front().is_some_and(|at| {
                        now.saturating_duration_since(*at) > self.inner.config.loss_window
                    }) {
                        losses.pop_front();
                    }
                    if losses.len() > self.inner.config.loss_budget as usize {
                        tracing::warn!(%transport, attempts = deliveries, "transport-loss budget exhausted");
                        return ActivityOutcome::TransportLost {
                            transport,
                            attempts: deliveries,
                        };
                    }
                    tracing::debug!(%transport, attempts = deliveries, "worker lost; dispatching again");
                }
                // The table never drops a signal without sending; treat it as a loss anyway.
                Err(_) => {
                    return ActivityOutcome::TransportLost {
                        transport: worker.transport().clone(),
                        attempts: deliveries,
                    };
                }
            }
        }
    }

    /// Selects and reserves a worker, parking until one can take the dispatch or the wait
    /// ends (deadline, cancel, shutdown).
    async fn acquire(
        &self,
        request: &ActivityRequest,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<(Worker, DispatchReservation), ActivityOutcome> {
        let registry = &self.inner.registry;
        let task_queue = normalise_task_queue(&request.task_queue);
        let node = request.node.as_deref().filter(|n| !n.is_empty());
        let mut ticket: Option<ParkTicket> = None;
        let mut classified_at: Option<Instant> = None;
        loop {
            let arrival = registry.worker_arrival();
            if let Some(hit) = registry.select_and_reserve(
                &request.namespace,
                task_queue,
                &request.activity_type,
                node,
            ) {
                return Ok(hit);
            }
            let now = Instant::now();
            if classified_at.is_none_or(|at| now.saturating_duration_since(at) >= RECLASSIFY_AFTER)
            {
                let census = registry.pool_census(
                    &request.namespace,
                    task_queue,
                    &request.activity_type,
                    node,
                );
                // A census that reads "served" while selection found nobody is a race with a
                // slot or verdict change; it parks like probation rather than spinning.
                let reason = census.classify().unwrap_or(UnservedReason::OnProbation);
                match &ticket {
                    Some(ticket) => ticket.book().reclassify(ticket.address(), reason, census),
                    None => {
                        let address = UnservedAddress {
                            namespace: request.namespace.clone(),
                            task_queue: task_queue.to_owned(),
                            activity_type: request.activity_type.clone(),
                            node: node.map(str::to_owned),
                        };
                        ticket = Some(self.inner.unserved.park(address, reason, census));
                    }
                }
                classified_at = Some(now);
            }
            tokio::select! {
                () = arrival => {}
                () = tokio::time::sleep_until(deadline) => return Err(self.unserved_now(request)),
                () = cancel.cancelled() => return Err(ActivityOutcome::Cancelled),
                () = self.inner.stop_parked.cancelled() => return Err(ActivityOutcome::ShuttingDown),
            }
        }
    }

    /// The `Unserved` outcome for a dispatch whose deadline passed before any worker took it.
    fn unserved_now(&self, request: &ActivityRequest) -> ActivityOutcome {
        let node = request.node.as_deref().filter(|n| !n.is_empty());
        let census = self.inner.registry.pool_census(
            &request.namespace,
            &request.task_queue,
            &request.activity_type,
            node,
        );
        // Served at this instant means a worker freed up just as the deadline passed.
        let reason = census.classify().unwrap_or(UnservedReason::AllAtCapacity);
        let detail = census
            .describe()
            .unwrap_or_else(|| reason.as_str().to_owned());
        ActivityOutcome::Unserved { reason, detail }
    }

    /// The single entry point for results: hands `result` to the dispatch waiting for `task`.
    ///
    /// Refused (and counted) when the task is not pending, is held by another worker, or its
    /// dispatch already ended; a refusal never reaches any caller.
    pub fn complete(
        &self,
        worker: WorkerId,
        task: TaskId,
        result: TaskResult,
    ) -> Result<(), CompletionRefused> {
        let (outcome, removed) = self.inner.lock_tasks().complete(worker, task, result);
        drop(removed);
        if let Err(refusal) = &outcome {
            self.count_refusal(refusal);
            tracing::debug!(worker = %worker, task = %task, %refusal, "result refused");
        }
        self.inner.ended();
        outcome
    }

    /// A worker confirmed it stopped a cancelled task; its slot is freed.
    pub fn cancel_acknowledged(
        &self,
        worker: WorkerId,
        task: TaskId,
    ) -> Result<(), CompletionRefused> {
        let (outcome, removed) = self.inner.lock_tasks().acknowledge_cancel(worker, task);
        drop(removed);
        self.inner.ended();
        outcome
    }

    fn count_refusal(&self, refusal: &CompletionRefused) {
        let (counter, label) = match refusal {
            CompletionRefused::UnknownTask { .. } => (&self.inner.refused_unknown, "unknown"),
            CompletionRefused::NotHeldByWorker { .. } => (&self.inner.refused_foreign, "foreign"),
            CompletionRefused::Late { .. } => (&self.inner.refused_late, "late"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("switchyard_results_refused_total", "reason" => label).increment(1);
    }

    /// Refused results so far, by kind.
    pub fn refused(&self) -> RefusedCounts {
        RefusedCounts {
            unknown: self.inner.refused_unknown.load(Ordering::Relaxed),
            foreign: self.inner.refused_foreign.load(Ordering::Relaxed),
            late: self.inner.refused_late.load(Ordering::Relaxed),
        }
    }

    /// Cancels the in-flight dispatch with this activity id: it ends `Cancelled` at once and
    /// the worker holding it (if any) is sent a cancel.
    pub fn cancel(
        &self,
        caller: &CallerIdentity,
        namespace: &str,
        activity_id: &str,
    ) -> Result<(), CancelError> {
        if !caller.grant.allows(namespace) {
            return Err(CancelError::NamespaceNotGranted {
                principal: caller.principal.clone(),
                namespace: namespace.to_owned(),
            });
        }
        let token = self
            .inner
            .lock_activities()
            .get(&(namespace.to_owned(), activity_id.to_owned()))
            .cloned();
        match token {
            Some(token) => {
                token.cancel();
                Ok(())
            }
            None => Err(CancelError::NotFound {
                namespace: namespace.to_owned(),
                activity_id: activity_id.to_owned(),
            }),
        }
    }

    /// Addresses with parked dispatches, with reason, census and how many wait.
    pub fn unserved_queues(&self) -> Vec<UnservedQueue> {
        self.inner.unserved.list()
    }

    /// Tasks delivered and not yet let go by their worker (including cancelled ones whose
    /// worker has not acknowledged).
    pub fn pending_tasks(&self) -> usize {
        self.inner.lock_tasks().len()
    }

    /// True once [`Dispatcher::shutdown`] has started.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::Acquire)
    }

    /// Refuses new dispatches (`ShuttingDown`), ends parked ones, drains every worker, waits up
    /// to `grace` for tasks in flight to finish, then ends the rest `ShuttingDown`.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.shutting_down.store(true, Ordering::Release);
        self.inner.stop_parked.cancel();
        let drained = self.inner.registry.broadcast_drain();
        tracing::info!(
            workers = drained,
            grace_ms = grace.as_millis() as u64,
            "shutting down"
        );
        let until = Instant::now() + grace;
        loop {
            let ended = self.inner.task_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.inner.lock_tasks().awaited() == 0 {
                break;
            }
            tokio::select! {
                () = ended => {}
                () = tokio::time::sleep_until(until) => break,
            }
        }
        self.inner.stop_all.cancel();
    }
}
