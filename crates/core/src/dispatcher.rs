//! The one dispatcher: turns an [`ActivityRequest`] into exactly one [`ActivityOutcome`].
//!
//! A dispatch selects and reserves a worker through the registry, hands the task to the
//! worker's delivery leg and waits for one [`Signal`](table::Signal). With no worker it parks
//! on the registry's arrival subscription and is listed in [`Dispatcher::unserved_queues`].
//! Results come back through [`Dispatcher::complete`] only; a lost worker's tasks are delivered
//! again, within the transport-loss budget.
//!
//! A task's reservation (its slot, counted in the registry's in-flight count) lives in the
//! pending-task table from delivery until the worker answers, acknowledges a cancel, or
//! leaves: a dispatch that ends early (cancel, deadline, shutdown, caller gone) stops waiting
//! at once but leaves the slot taken, so capacity is never over-committed to a worker still
//! running the task.

mod acquire;
mod budget;
mod cancel;
mod config;
mod hooks;
mod local_batch;
mod overflow;
pub(crate) mod quota;
mod reclaim;
mod table;
#[cfg(test)]
pub(crate) mod tests;
mod unserved;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use config::{
    DEFAULT_MAX_HELD_INPUT_BYTES, DEFAULT_MAX_INPUT_BYTES, DEFAULT_MAX_PARKED, DispatchConfig,
};
pub use hooks::{DeliveredHook, DispatchHooks, ParkedHook};
pub use local_batch::{BatchCancel, LocalBatch, LocalEntry, LocalPool, LocalStart};
pub use overflow::{Forwarded, Offered, Overflow, OverflowFuture, OverflowOffer};
pub use unserved::{UnservedAddress, UnservedQueue};

use crate::address::{WorkerId, normalise_task_queue};
use crate::admission::MAX_NAME_BYTES;
use crate::delivery::{ActivityTask, CancelReason, DeliveryError, TaskId, WorkerMessage};
use crate::metrics::DispatchMetrics;
use crate::outcome::{
    ActivityOutcome, ActivityRequest, CancelError, CompletionRefused, DispatchError, TaskResult,
};
use crate::registration::CallerIdentity;
use crate::registry::Registry;
use crate::throttle::KeyedThrottle;
use acquire::Missed;
use budget::LossBudget;
use cancel::Cancel;
use quota::{HeldInput, LOG_WINDOW, QuotaBook};
use table::{PendingTask, Signal, TaskTable};
use unserved::UnservedBook;

/// Longest pause after repeated delivery failures before selecting again.
const MAX_DELIVERY_BACKOFF: Duration = Duration::from_millis(100);

/// Refused completions, by kind, since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RefusedCounts {
    /// Results for tasks that were not pending.
    pub unknown: u64,
    /// Results from a worker that did not hold the task.
    pub foreign: u64,
    /// Results for a dispatch that ended (deadline, cancel) while its worker's session was
    /// suspended, sent after the worker resumed: the slot is freed, the producer already had
    /// its outcome. (A result for a dispatch that ended while its worker was connected stands
    /// in for the cancel acknowledgement instead, counted by
    /// [`Dispatcher::results_after_cancel`].)
    pub late: u64,
}

/// The process-wide dispatcher; cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

struct Inner {
    /// This dispatcher, for the reclaim timers it starts (they must not keep it alive).
    weak_self: Weak<Inner>,
    registry: Registry,
    config: DispatchConfig,
    tasks: Mutex<TaskTable>,
    next_task: AtomicU64,
    /// Dispatches in flight that carry an activity id, with their cancel handles.
    activities: Mutex<HashMap<ActivityIdKey, CancellationToken>>,
    unserved: Arc<UnservedBook>,
    quotas: QuotaBook,
    /// Throttles the reclaim WARN (one a minute, with what it kept quiet).
    reclaim_log: Mutex<KeyedThrottle>,
    shutting_down: AtomicBool,
    /// Fired when shutdown starts: parked dispatches end at once.
    stop_parked: CancellationToken,
    /// Fired when the shutdown grace ends: every dispatch still waiting ends.
    stop_all: CancellationToken,
    task_ended: Notify,
    refused_unknown: AtomicU64,
    refused_foreign: AtomicU64,
    refused_late: AtomicU64,
    results_after_cancel: AtomicU64,
    /// Selection attempts since start (each parked dispatch tries once per wake).
    selections: AtomicU64,
    /// The series every dispatch writes.
    metrics: DispatchMetrics,
    /// Other nodes a dispatch is offered to after a local miss; unset outside a cluster.
    overflow: OnceLock<Arc<dyn Overflow>>,
    /// Runs once between a selection and the tracking of its task: tests land a shutdown in
    /// that window, which threads reach only by chance.
    #[cfg(test)]
    after_selection: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

/// How a dispatch's wait for its worker ended.
enum Ending {
    /// The worker answered or was lost.
    Signal(Result<Signal, oneshot::error::RecvError>),
    /// The dispatch stops early: send the worker this cancel reason and end with this outcome.
    Stop(CancelReason, ActivityOutcome),
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

    fn lock_activities(&self) -> MutexGuard<'_, HashMap<ActivityIdKey, CancellationToken>> {
        self.activities
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn ended(&self) {
        if self.shutting_down.load(Ordering::Acquire) {
            self.task_ended.notify_waiters();
        }
    }

    /// Ends the caller's wait on `task` and asks the worker to stop it, over the delivery the
    /// task went out on. The slot stays held until the worker acknowledges, answers or leaves.
    /// False when the wait had already ended (the worker answered or left first).
    fn abandon(&self, task: TaskId, reason: CancelReason) -> bool {
        let delivery = self.lock_tasks().detach(task, Instant::now(), reason);
        let Some(delivery) = delivery else {
            return false;
        };
        self.schedule_reclaim(task);
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
        true
    }

    /// Ends every tracked dispatch still waiting for its worker `ShuttingDown`, with a cancel
    /// to the worker; the slots stay held until the workers acknowledge, answer or leave.
    fn stop_tracked(&self) {
        let reason = CancelReason::ShuttingDown;
        let detached = self.lock_tasks().detach_every(Instant::now(), reason);
        if detached.is_empty() {
            return;
        }
        for (task, delivery, signal) in detached {
            self.schedule_reclaim(task);
            let _ = signal.send(Signal::ShuttingDown);
            match delivery.deliver(WorkerMessage::Cancel {
                task_id: task,
                reason,
            }) {
                Ok(()) | Err(DeliveryError::Closed) => {}
                Err(error) => tracing::warn!(task = %task, %error,
                    "cancel not delivered; the slot stays held until the worker answers or leaves"),
            }
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

/// Checks a request: namespace and activity type present, every name bounded, the input within
/// what a worker leg carries.
fn validate(request: &ActivityRequest, config: &DispatchConfig) -> Result<(), DispatchError> {
    if request.input.len() > config.max_input_bytes {
        return Err(DispatchError::InputTooLarge {
            size: request.input.len(),
            limit: config.max_input_bytes,
        });
    }
    let names = [
        ("namespace", Some(&request.namespace), true),
        ("activity_type", Some(&request.activity_type), true),
        ("task_queue", Some(&request.task_queue), false),
        ("node", request.node.as_ref(), false),
        ("activity_id", request.activity_id.as_ref(), true),
    ];
    for (field, value, required) in names {
        let Some(value) = value else { continue };
        let problem = if required && value.is_empty() {
            "empty".to_owned()
        } else if value.len() > MAX_NAME_BYTES {
            format!(
                "{} bytes, more than the limit of {MAX_NAME_BYTES}",
                value.len()
            )
        } else {
            continue;
        };
        return Err(DispatchError::Invalid { field, problem });
    }
    Ok(())
}

/// Removes a pending task when the dispatch future stops waiting for any reason, including
/// being dropped by its caller (which also sends the worker a cancel).
struct PendingGuard<'a> {
    inner: &'a Inner,
    task: TaskId,
}

impl PendingGuard<'_> {
    /// Lets go without abandoning, once the wait ended with its signal (sent or dropped): the
    /// table has nothing left to detach, and the busiest path skips its lock and clock read.
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        let _ = self.inner.abandon(self.task, CancelReason::CallerGone);
    }
}

/// Holds an activity id for the life of its dispatch.
/// `(namespace, dispatching principal, activity id)`: an activity id is unique per principal
/// within a namespace, so one principal's ids neither collide with nor reveal another's.
type ActivityIdKey = (String, String, String);

struct ActivityGuard<'a> {
    inner: &'a Inner,
    key: Option<ActivityIdKey>,
}

impl Drop for ActivityGuard<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut activities = self.inner.lock_activities();
            activities.remove(&key);
            crate::registry::shrink_after_drain(&mut activities);
        }
    }
}

impl Dispatcher {
    /// A dispatcher over `registry`; it re-dispatches the tasks of every worker that leaves.
    pub fn new(registry: Registry, config: DispatchConfig) -> Self {
        let inner = Arc::new_cyclic(|weak_self| Inner {
            weak_self: weak_self.clone(),
            registry: registry.clone(),
            config,
            tasks: Mutex::new(TaskTable::default()),
            next_task: AtomicU64::new(1),
            activities: Mutex::new(HashMap::new()),
            unserved: Arc::new(UnservedBook::default()),
            quotas: QuotaBook::new(registry.clone()),
            reclaim_log: Mutex::new(KeyedThrottle::new(LOG_WINDOW)),
            shutting_down: AtomicBool::new(false),
            stop_parked: CancellationToken::new(),
            stop_all: CancellationToken::new(),
            task_ended: Notify::new(),
            refused_unknown: AtomicU64::new(0),
            refused_foreign: AtomicU64::new(0),
            refused_late: AtomicU64::new(0),
            results_after_cancel: AtomicU64::new(0),
            selections: AtomicU64::new(0),
            metrics: DispatchMetrics::new(),
            overflow: OnceLock::new(),
            #[cfg(test)]
            after_selection: Mutex::new(None),
        });
        let weak = Arc::downgrade(&inner);
        registry.observe_departures(Arc::new(move |worker, _reason| {
            if let Some(inner) = weak.upgrade() {
                inner.worker_lost(worker);
            }
        }));
        Self { inner }
    }

    /// Runs `hook` once, the next time a dispatch has selected a worker and not yet tracked
    /// its task.
    #[cfg(test)]
    pub(crate) fn after_next_selection(&self, hook: impl FnOnce() + Send + 'static) {
        if let Ok(mut slot) = self.inner.after_selection.lock() {
            *slot = Some(Box::new(hook));
        }
    }

    /// Installs the nodes a dispatch that misses locally is offered to (see [`Overflow`]);
    /// false, changing nothing, when one is already installed.
    pub fn set_overflow(&self, overflow: Arc<dyn Overflow>) -> bool {
        self.inner.overflow.set(overflow).is_ok()
    }

    /// The registry this dispatcher selects from.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Runs one activity on a worker of its pool and returns its one outcome.
    ///
    /// Refused up front (no outcome) when a required name is empty or any name is longer than
    /// [`MAX_NAME_BYTES`], the caller is not granted the namespace, its input would pass a
    /// held-bytes quota, or the caller already has a dispatch with this activity id in flight
    /// in the namespace (another principal's ids are not seen); refused when it would park
    /// past a parked quota ([`DispatchError::QuotaExceeded`]).
    ///
    /// (A plain function returning [`Dispatcher::dispatch_with`]'s future: an `async fn`
    /// layer would keep its own copy of `request` beside the one it passes on.)
    pub fn dispatch<'a>(
        &'a self,
        caller: &'a CallerIdentity,
        request: ActivityRequest,
    ) -> impl Future<Output = Result<ActivityOutcome, DispatchError>> + 'a {
        self.dispatch_with(caller, request, DispatchHooks::default())
    }

    /// [`Dispatcher::dispatch`], telling `hooks` when the task is delivered or parks, with
    /// attempts counted from `hooks.attempt_offset`; a `hooks.durable` dispatch is exempt
    /// from the parked-count and held-bytes quotas.
    ///
    /// (An `async move` block rather than an `async fn`: the block keeps `request` and `hooks`
    /// once, where an `async fn` also copies its arguments into locals, and every dispatch's
    /// future is copied whole into its caller's task.)
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn would hold request and hooks twice"
    )]
    pub fn dispatch_with<'a>(
        &'a self,
        caller: &'a CallerIdentity,
        request: ActivityRequest,
        mut hooks: DispatchHooks,
    ) -> impl Future<Output = Result<ActivityOutcome, DispatchError>> + 'a {
        async move {
            self.check(caller, &request)?;
            let held = self.inner.quotas.hold(
                &self.inner.config,
                &request.namespace,
                &caller.principal,
                request.input.len(),
                hooks.durable,
            )?;
            let (cancel, _activity) =
                self.claim_activity_id(caller, &request, hooks.cancel.take())?;
            let started = Instant::now();
            let span = tracing::debug_span!("dispatch", namespace = %request.namespace,
                activity_type = %request.activity_type,
                activity_id = request.activity_id.as_deref());
            let outcome = if self.inner.shutting_down.load(Ordering::Acquire) {
                ActivityOutcome::ShuttingDown
            } else {
                self.run(&request, &cancel, &held, &hooks)
                    .instrument(span)
                    .await?
            };
            self.inner.metrics.ended(&outcome, started.elapsed());
            Ok(outcome)
        }
    }

    /// Checks what [`Dispatcher::dispatch`] checks before it starts, without starting
    /// anything: every name present and bounded, the input within
    /// [`DispatchConfig::max_input_bytes`], the caller granted the namespace.
    pub fn check(
        &self,
        caller: &CallerIdentity,
        request: &ActivityRequest,
    ) -> Result<(), DispatchError> {
        validate(request, &self.inner.config)?;
        if !caller.grant.allows(&request.namespace) {
            return Err(DispatchError::NamespaceNotGranted {
                principal: caller.principal.clone(),
                namespace: request.namespace.clone(),
            });
        }
        Ok(())
    }

    /// Claims the request's activity id, if it has one; returns what cancels the dispatch:
    /// the caller's `token`, with an activity id a token of its own if the caller gave none.
    fn claim_activity_id(
        &self,
        caller: &CallerIdentity,
        request: &ActivityRequest,
        token: Option<CancellationToken>,
    ) -> Result<(Cancel, ActivityGuard<'_>), DispatchError> {
        let Some(id) = &request.activity_id else {
            let guard = ActivityGuard {
                inner: &self.inner,
                key: None,
            };
            return Ok((Cancel::new(token), guard));
        };
        let key = (
            request.namespace.clone(),
            caller.principal.clone(),
            id.clone(),
        );
        let mut activities = self.inner.lock_activities();
        if activities.contains_key(&key) {
            return Err(DispatchError::DuplicateActivityId {
                namespace: key.0,
                activity_id: key.2,
            });
        }
        let token = token.unwrap_or_default();
        activities.insert(key.clone(), token.clone());
        let guard = ActivityGuard {
            inner: &self.inner,
            key: Some(key),
        };
        Ok((Cancel::new(Some(token)), guard))
    }

    /// Selects, delivers and waits until the one outcome; `Err` only when a worker leg refuses
    /// the task as too large to carry (the dispatch then ends at once, no worker harmed).
    async fn run(
        &self,
        request: &ActivityRequest,
        cancel: &Cancel,
        held: &HeldInput<'_>,
        hooks: &DispatchHooks,
    ) -> Result<ActivityOutcome, DispatchError> {
        let timeout = request.timeout.min(self.inner.config.max_timeout);
        let deadline = Instant::now() + timeout;
        let wall_deadline = SystemTime::now() + timeout;
        let mut budget =
            LossBudget::new(self.inner.config.loss_budget, self.inner.config.loss_window);
        let mut deliveries: u32 = 0;
        let mut failed_deliveries: u32 = 0;
        loop {
            // Only a dispatch no worker has taken yet may be refused for parking.
            let refusable = deliveries == 0;
            let (worker, reservation) = match self
                .acquire(request, deadline, cancel, held, refusable, hooks)
                .await
            {
                Ok(hit) => hit,
                Err(Missed::Outcome(outcome)) => return Ok(outcome),
                Err(Missed::Refused(error)) => return Err(error),
            };
            #[cfg(test)]
            {
                let hook = self
                    .inner
                    .after_selection
                    .lock()
                    .ok()
                    .and_then(|mut h| h.take());
                if let Some(hook) = hook {
                    hook();
                }
            }
            let task = TaskId::from_raw(self.inner.next_task.fetch_add(1, Ordering::Relaxed));
            let (signal, mut wait) = oneshot::channel();
            let replaced = self.inner.lock_tasks().insert(
                task,
                PendingTask::new(
                    Arc::clone(worker.delivery()),
                    reservation,
                    Some(signal.into()),
                    worker.has_session(),
                ),
            );
            drop(replaced);
            let guard = PendingGuard {
                inner: &self.inner,
                task,
            };
            // Once shutdown has begun no task goes out: shutdown counts the tasks in this table
            // before it stops waiting, so a task tracked after that count must not reach a
            // worker, which would run it while its dispatch ends `ShuttingDown`.
            if self.inner.shutting_down.load(Ordering::Acquire) {
                let removed = self.inner.lock_tasks().remove(task);
                drop(removed);
                guard.disarm();
                self.inner.ended();
                return Ok(ActivityOutcome::ShuttingDown);
            }
            // A worker that left between selection and tracking was never seen holding this
            // task by the departure observer; forget the attempt (nothing was delivered).
            let delivered = if self.inner.registry.is_registered(worker.id()) {
                worker.delivery().deliver(WorkerMessage::Task(ActivityTask {
                    task_id: task,
                    namespace: request.namespace.clone(),
                    task_queue: normalise_task_queue(&request.task_queue).to_owned(),
                    activity_type: request.activity_type.clone(),
                    input: request.input.clone(),
                    attempt: hooks.attempt_offset.saturating_add(deliveries + 1),
                    deadline: wall_deadline,
                }))
            } else {
                Err(DeliveryError::Closed)
            };
            if let Err(error) = delivered {
                // Attempt-neutral: the task never reached the worker.
                let removed = self.inner.lock_tasks().remove(task);
                drop(removed);
                drop(guard);
                if let DeliveryError::TooLarge { size, limit } = error {
                    // No other worker would fare better than the leg's limit allows; the
                    // worker itself is unharmed, the frame was never written.
                    tracing::info!(worker = %worker.id(), size, limit,
                        "task refused by the worker leg as too large");
                    let framing = size.saturating_sub(request.input.len());
                    return Err(DispatchError::InputTooLarge {
                        size: request.input.len(),
                        limit: limit.saturating_sub(framing),
                    });
                }
                tracing::debug!(worker = %worker.id(), %error, "delivery refused; selecting again");
                failed_deliveries += 1;
                if failed_deliveries > 1 {
                    // Every eligible worker refusing in turn (queues full): back off a little
                    // rather than cycling through them at full speed.
                    let pause = Duration::from_millis(1 << failed_deliveries.min(7))
                        .min(MAX_DELIVERY_BACKOFF);
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = tokio::time::sleep_until(deadline) => return Ok(self.unserved_now(request)),
                        () = cancel.cancelled() => return Ok(ActivityOutcome::Cancelled),
                        () = self.inner.stop_all.cancelled() => return Ok(ActivityOutcome::ShuttingDown),
                    }
                }
                continue;
            }
            failed_deliveries = 0;
            deliveries += 1;
            let attempt = hooks.attempt_offset.saturating_add(deliveries);
            tracing::trace!(worker = %worker.id(), task = %task, attempt, "task delivered");
            if let Some(delivered) = &hooks.on_delivered {
                delivered(worker.id(), attempt);
            }
            let ending = tokio::select! {
                signal = &mut wait => Ending::Signal(signal),
                () = tokio::time::sleep_until(deadline) => {
                    Ending::Stop(CancelReason::DeadlineExceeded, ActivityOutcome::TimedOut)
                }
                () = cancel.cancelled() => {
                    Ending::Stop(CancelReason::Requested, ActivityOutcome::Cancelled)
                }
                // No wait on `stop_all` here: at the end of the grace shutdown ends every
                // tracked wait itself (`Signal::ShuttingDown`), so the dispatches in flight do
                // not each register on, and poll, one token shared by every thread.
            };
            let ended = match ending {
                Ending::Signal(signal) => signal,
                Ending::Stop(reason, outcome) => {
                    if self.inner.abandon(task, reason) {
                        return Ok(outcome);
                    }
                    // The worker's answer got in first and is already in the channel: a result
                    // decides the outcome; a loss does not resurrect a stopped dispatch.
                    match wait.await {
                        Ok(Signal::Result(result)) => Ok(Signal::Result(result)),
                        _ => return Ok(outcome),
                    }
                }
            };
            // The entry left the table with the signal, so the guard has nothing to abandon.
            guard.disarm();
            match ended {
                Ok(Signal::Result(TaskResult::Success(output))) => {
                    return Ok(ActivityOutcome::Completed(output));
                }
                Ok(Signal::Result(TaskResult::Failure { message, retryable })) => {
                    return Ok(ActivityOutcome::Failed { message, retryable });
                }
                Ok(Signal::Cancelled) => return Ok(ActivityOutcome::Cancelled),
                Ok(Signal::ShuttingDown) => return Ok(ActivityOutcome::ShuttingDown),
                Ok(Signal::Unreached) => {
                    // Not a loss: the worker resumed without the task, which never ran.
                    tracing::debug!(
                        attempts = deliveries,
                        "task never reached its resumed worker; dispatching again"
                    );
                }
                Ok(Signal::WorkerLost(transport)) => {
                    if !budget.record(Instant::now()) {
                        tracing::warn!(%transport, attempts = deliveries,
                            "transport-loss budget exhausted");
                        return Ok(ActivityOutcome::TransportLost {
                            transport,
                            attempts: deliveries,
                        });
                    }
                    tracing::debug!(%transport, attempts = deliveries, "worker lost; dispatching again");
                }
                // The table never drops a signal without sending; treat it as a loss anyway.
                Err(_) => {
                    return Ok(ActivityOutcome::TransportLost {
                        transport: worker.transport().clone(),
                        attempts: deliveries,
                    });
                }
            }
        }
    }

    /// Cancels every dispatch `worker` holds: each ends `Cancelled` at once and the worker is
    /// sent a cancel per task; the slots stay held until it acknowledges, answers or leaves.
    /// Returns how many dispatches were cancelled (used when a drain passes its deadline).
    pub fn cancel_held_by(&self, worker: WorkerId, reason: CancelReason) -> usize {
        let detached = self
            .inner
            .lock_tasks()
            .detach_all(worker, Instant::now(), reason);
        let count = detached.len();
        for (task, delivery, signal) in detached {
            self.inner.schedule_reclaim(task);
            let _ = signal.send(Signal::Cancelled);
            if let Err(error) = delivery.deliver(WorkerMessage::Cancel {
                task_id: task,
                reason,
            }) {
                tracing::debug!(worker = %worker, task = %task, %error, "cancel not delivered");
            }
        }
        if count > 0 {
            tracing::info!(worker = %worker, tasks = count, reason = reason.as_str(),
                "cancelled every task the worker held");
            self.inner.ended();
        }
        count
    }

    /// The single entry point for results: hands `result` to the dispatch waiting for `task`.
    ///
    /// Refused (and counted) when the task is not pending, is held by another worker, or its
    /// dispatch ended while the worker's session was suspended (`late`; the slot is freed); a
    /// refusal never reaches any caller. A result for a task whose dispatch already ended
    /// (cancelled, timed out, its caller gone) is the worker answering instead of acknowledging
    /// the cancel: accepted the same way as a `cancel_ack` (the slot is freed), counted in
    /// [`Dispatcher::results_after_cancel`], never as a refusal.
    pub fn complete(
        &self,
        worker: WorkerId,
        task: TaskId,
        result: TaskResult,
    ) -> Result<(), CompletionRefused> {
        let taken = self.inner.lock_tasks().take_for_result(worker, task);
        let taken = taken.and_then(|pending| {
            if pending.late {
                // The dispatch ended while the worker's connection was gone; the slot is free.
                drop(pending);
                return Err(CompletionRefused::Late { task });
            }
            Ok(pending)
        });
        let outcome = taken.map(|mut pending| {
            let signal = pending.signal.take();
            // Free the slot before the caller hears back, so its next dispatch finds it free.
            drop(pending);
            // No signal, or a caller that stopped listening this instant: the dispatch ended
            // and its cancel is on its way (or crossed this result on the wire).
            let delivered =
                signal.is_some_and(|signal| signal.send(Signal::Result(result)).is_ok());
            if !delivered {
                self.inner
                    .results_after_cancel
                    .fetch_add(1, Ordering::Relaxed);
                metrics::counter!(crate::metrics::RESULTS_AFTER_CANCEL_TOTAL).increment(1);
                tracing::debug!(worker = %worker, task = %task,
                    "result for an ended dispatch taken as its cancel acknowledgement");
            }
        });
        if let Err(refusal) = &outcome {
            self.count_refusal(refusal);
            tracing::debug!(worker = %worker, task = %task, %refusal, "result refused");
        }
        self.inner.ended();
        outcome
    }

    /// Squares the tasks core holds for a resumed `worker` with what it reported (`running`
    /// and `unacked`, see [`crate::ResumeRequest`]): returns the reported tasks it still holds,
    /// and the cancels to send again for those whose dispatch ended meanwhile. Held tasks the
    /// worker did not report never reached it: their dispatches select a worker again at once
    /// (a new attempt, not a transport loss), or, when already ended, free their slots.
    pub(crate) fn reconcile_resumed(
        &self,
        worker: WorkerId,
        running: &[TaskId],
        unacked: &[TaskId],
    ) -> (Vec<TaskId>, Vec<(TaskId, CancelReason)>) {
        let reported: std::collections::HashSet<TaskId> =
            running.iter().chain(unacked).copied().collect();
        let reconciled = self
            .inner
            .lock_tasks()
            .reconcile(worker, &reported, Instant::now());
        if !reconciled.unreached.is_empty() {
            tracing::info!(worker = %worker, tasks = reconciled.unreached.len(),
                "tasks never reached the resumed worker; dispatching them again");
        }
        for mut pending in reconciled.unreached {
            if let Some(signal) = pending.signal.take() {
                let _ = signal.send(Signal::Unreached);
            }
        }
        // The cancels go out with the announcement; from then the worker has
        // `cancel_ack_timeout` to answer them, as if they had been sent the first time.
        for (task, _) in &reconciled.cancels {
            self.inner.schedule_reclaim(*task);
        }
        self.inner.ended();
        (reconciled.held, reconciled.cancels)
    }

    /// Results that arrived for a dispatch that had already ended and were taken as the cancel
    /// acknowledgement, since start.
    pub fn results_after_cancel(&self) -> u64 {
        self.inner.results_after_cancel.load(Ordering::Relaxed)
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

    /// Cancels the caller's in-flight dispatch with this activity id: it ends `Cancelled` at
    /// once and the worker holding it (if any) is sent a cancel. An operator of the namespace
    /// ([`CallerIdentity::operates`]) cancels every principal's dispatch with the id; anyone
    /// else reaches only its own, and another principal's is [`CancelError::NotFound`], the
    /// same answer as an id nobody uses.
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
        let tokens: Vec<CancellationToken> = {
            let activities = self.inner.lock_activities();
            if caller.operates(namespace) {
                activities
                    .iter()
                    .filter(|((ns, _, id), _)| ns == namespace && id == activity_id)
                    .map(|(_, token)| token.clone())
                    .collect()
            } else {
                let key = (
                    namespace.to_owned(),
                    caller.principal.clone(),
                    activity_id.to_owned(),
                );
                activities.get(&key).cloned().into_iter().collect()
            }
        };
        if !tokens.is_empty() {
            tokens.iter().for_each(CancellationToken::cancel);
            return Ok(());
        }
        Err(CancelError::NotFound {
            namespace: namespace.to_owned(),
            activity_id: activity_id.to_owned(),
        })
    }

    /// Addresses with parked dispatches, with reason, census and how many wait.
    pub fn unserved_queues(&self) -> Vec<UnservedQueue> {
        self.inner.unserved.list(&self.inner.registry)
    }

    /// Tasks delivered and not yet let go by their worker (including cancelled ones whose
    /// worker has not acknowledged).
    pub fn pending_tasks(&self) -> usize {
        self.inner.lock_tasks().len()
    }

    /// Selection attempts since start.
    #[cfg(test)]
    pub(crate) fn selections(&self) -> u64 {
        self.inner.selections.load(Ordering::Relaxed)
    }

    /// Unserved episodes that logged their WARN since start.
    #[cfg(test)]
    pub(crate) fn unserved_warnings(&self) -> u64 {
        self.inner.unserved.warnings()
    }

    /// The largest input a dispatch accepts ([`DispatchConfig::max_input_bytes`]).
    pub fn max_input_bytes(&self) -> usize {
        self.inner.config.max_input_bytes
    }

    /// The longest timeout a dispatch may ask for ([`DispatchConfig::max_timeout`]).
    pub fn max_timeout(&self) -> Duration {
        self.inner.config.max_timeout
    }

    /// True once [`Dispatcher::shutdown`] has started.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::Acquire)
    }

    /// Refuses new dispatches (`ShuttingDown`), ends parked ones, tells every worker the gateway
    /// is stopping ([`WorkerMessage::ShuttingDown`]: not a final drain), waits up to `grace` for
    /// tasks in flight to finish, then ends the rest `ShuttingDown`.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.shutting_down.store(true, Ordering::Release);
        self.inner.stop_parked.cancel();
        let drained = self.inner.registry.broadcast_shutdown();
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
        self.inner.stop_tracked();
    }
}
