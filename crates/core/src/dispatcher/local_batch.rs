//! A batch of local-only dispatches of one pool, started together: what a node runs when it
//! takes another node's offer of several dispatches.
//!
//! [`Dispatcher::dispatch_local_batch`] is the narrow entry point. It never parks and never
//! offers anything to other nodes: each dispatch of the batch takes a local worker at once, in
//! the batch's order, or is [`LocalStart::Busy`]. What a batch shares is paid once: one check
//! of the pool's names and of the caller's grant, one held-input quota hold for all the
//! inputs, one pass of selections that stops at the first miss (a miss means the pool has no
//! free slot left, so the rest would miss too), one channel on which every task's end comes
//! back, one timer for the deadlines, and no cancel token at all: a cancel is asked for by
//! index through a [`BatchCancel`], and only then reaches a task.
//!
//! Per dispatch the rules are those of [`Dispatcher::dispatch`]: a slot is reserved by the
//! registry's one selection call (so no worker ever holds more than its capacity and the
//! round-robin cursor moves once per task), the task stays in the pending-task table until the
//! worker answers, acknowledges a cancel or leaves, a worker lost mid-task is replaced by
//! another local worker within the transport-loss budget (none left: `Unserved`), and a
//! dispatch ends exactly once.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::sync::{Notify, mpsc};
use tokio::time::{Instant, Sleep};

use super::Dispatcher;
use super::budget::LossBudget;
use super::table::{PendingTask, Signal, SignalTx};
use crate::address::normalise_task_queue;
use crate::delivery::{ActivityTask, CancelReason, DeliveryError, TaskId, WorkerMessage};
use crate::outcome::{ActivityOutcome, ActivityRequest, DispatchError, TaskResult};
use crate::registration::CallerIdentity;

/// How many times one dispatch of a batch tries a worker whose leg refuses the task (queue
/// full, just closed) before it is answered busy: a batch never waits for a leg to drain.
const DELIVERY_TRIES: u32 = 2;

/// Where the batch's timer rests while no running dispatch has a deadline to watch.
const IDLE_TIMER: Duration = Duration::from_secs(3600);

/// The pool every dispatch of a [`LocalBatch`] runs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalPool {
    /// The namespace.
    pub namespace: String,
    /// The task queue (empty for the default queue).
    pub task_queue: String,
    /// The activity type.
    pub activity_type: String,
    /// Only workers on this node, when given.
    pub node: Option<String>,
}

/// One dispatch of a [`LocalBatch`]: what differs between the dispatches of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalEntry {
    /// The task's input.
    pub input: Bytes,
    /// How long the dispatch may run (capped at [`Dispatcher::max_timeout`]).
    pub timeout: Duration,
    /// Deliveries made before (by the node that offered it): the first here is one more.
    pub attempt_offset: u32,
}

/// How one dispatch of a batch started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalStart {
    /// Delivered to a local worker; its end comes from [`LocalBatch::next`].
    Delivered,
    /// No local worker took it (no free slot, its input too large for the legs, shutting
    /// down): it never ran, and no end follows.
    Busy,
}

/// Cancels dispatches of a [`LocalBatch`] by index, from any task; made before the batch, so
/// a cancel that arrives while the batch starts is not lost.
#[derive(Clone, Debug, Default)]
pub struct BatchCancel {
    shared: Arc<CancelShared>,
}

#[derive(Debug, Default)]
struct CancelShared {
    asked: Mutex<Vec<usize>>,
    notify: Notify,
}

impl BatchCancel {
    /// Asks dispatch `index` of the batch to stop: it ends `Cancelled` (unless its worker's
    /// answer got in first) and its worker is sent a cancel. Nothing for a busy or ended one.
    pub fn cancel(&self, index: usize) {
        self.shared
            .asked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(index);
        self.shared.notify.notify_one();
    }

    fn take(&self) -> Vec<usize> {
        std::mem::take(
            &mut *self
                .shared
                .asked
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }
}

/// Where one dispatch of a batch stands.
enum Slot {
    /// Never delivered, or ended: nothing to wait for.
    Idle,
    /// Delivered; waiting for its task's signal.
    Running(Running),
}

struct Running {
    task: TaskId,
    input: Bytes,
    deadline: Instant,
    wall_deadline: SystemTime,
    attempt_offset: u32,
    deliveries: u32,
    budget: Option<LossBudget>,
    /// Set once the dispatch was stopped (cancel, deadline) while its worker's answer was
    /// already on its way: a result still decides the outcome, anything else ends it so.
    stopped: Option<ActivityOutcome>,
}

/// Local-only dispatches of one pool started together by
/// [`Dispatcher::dispatch_local_batch`]; yields each delivered one's end once.
///
/// Dropping it stops every dispatch still running (as a caller going away does: the workers
/// are sent a cancel, the slots stay held until they let go).
pub struct LocalBatch {
    dispatcher: Dispatcher,
    pool: LocalPool,
    principal: String,
    held_bytes: usize,
    starts: Vec<LocalStart>,
    slots: Vec<Slot>,
    running: usize,
    ready: VecDeque<(usize, ActivityOutcome)>,
    tx: mpsc::UnboundedSender<(usize, TaskId, Signal)>,
    signals: mpsc::UnboundedReceiver<(usize, TaskId, Signal)>,
    cancel: BatchCancel,
    timer: Pin<Box<Sleep>>,
    started: Instant,
}

impl std::fmt::Debug for LocalBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBatch")
            .field("pool", &self.pool)
            .field("starts", &self.starts)
            .field("running", &self.running)
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// Starts `entries` as local-only dispatches of `pool` for `caller`, in order, sharing one
    /// name check, one quota hold, one selection pass and one wait (see [`LocalBatch`]); a
    /// cancel through `cancel` reaches the dispatch of that index.
    ///
    /// Refused as a whole (nothing started) when a name of `pool` is invalid, the caller is
    /// not granted the namespace, or the inputs together would pass a held-bytes quota.
    pub fn dispatch_local_batch(
        &self,
        caller: &CallerIdentity,
        pool: LocalPool,
        entries: Vec<LocalEntry>,
        cancel: BatchCancel,
    ) -> Result<LocalBatch, DispatchError> {
        let names = ActivityRequest {
            namespace: pool.namespace,
            task_queue: pool.task_queue,
            activity_type: pool.activity_type,
            node: pool.node.filter(|node| !node.is_empty()),
            input: Bytes::new(),
            activity_id: None,
            timeout: Duration::ZERO,
        };
        self.check(caller, &names)?;
        let bytes = entries.iter().map(|entry| entry.input.len()).sum();
        let held = self.inner.quotas.hold(
            &self.inner.config,
            &names.namespace,
            &caller.principal,
            bytes,
            false,
        )?;
        let held_bytes = held.keep();
        let pool = LocalPool {
            task_queue: normalise_task_queue(&names.task_queue).to_owned(),
            namespace: names.namespace,
            activity_type: names.activity_type,
            node: names.node,
        };
        let (tx, signals) = mpsc::unbounded_channel();
        let started = Instant::now();
        let mut batch = LocalBatch {
            dispatcher: self.clone(),
            pool,
            principal: caller.principal.clone(),
            held_bytes,
            starts: Vec::with_capacity(entries.len()),
            slots: Vec::with_capacity(entries.len()),
            running: 0,
            ready: VecDeque::new(),
            tx,
            signals,
            cancel,
            timer: Box::pin(tokio::time::sleep_until(started)),
            started,
        };
        let max_timeout = self.inner.config.max_timeout;
        let wall_now = SystemTime::now();
        let mut selecting = !self.inner.shutting_down.load(Ordering::Acquire);
        for (index, entry) in entries.into_iter().enumerate() {
            let timeout = entry.timeout.min(max_timeout);
            let mut running = Running {
                task: TaskId::from_raw(0),
                input: entry.input,
                deadline: started + timeout,
                wall_deadline: wall_now + timeout,
                attempt_offset: entry.attempt_offset,
                deliveries: 0,
                budget: None,
                stopped: None,
            };
            let delivered = selecting
                && running.input.len() <= self.inner.config.max_input_bytes
                && match batch.deliver(index, &mut running) {
                    Delivery::Delivered => true,
                    Delivery::Refused => false,
                    Delivery::NoWorker => {
                        selecting = false;
                        false
                    }
                };
            if delivered {
                batch.starts.push(LocalStart::Delivered);
                batch.slots.push(Slot::Running(running));
                batch.running += 1;
            } else {
                batch.starts.push(LocalStart::Busy);
                batch.slots.push(Slot::Idle);
            }
        }
        batch.rearm();
        Ok(batch)
    }
}

/// What one selection and delivery came to.
enum Delivery {
    Delivered,
    /// The legs refused the task (full, closed, too large); others may still take the next.
    Refused,
    /// No free slot in the pool.
    NoWorker,
}

impl LocalBatch {
    /// How each dispatch of the batch started, in the batch's order.
    pub fn starts(&self) -> &[LocalStart] {
        &self.starts
    }

    /// Dispatches delivered and not yet ended.
    pub fn running(&self) -> usize {
        self.running
    }

    /// The next end of a delivered dispatch, `(index, outcome)`, each exactly once; `None`
    /// once every delivered dispatch has ended.
    pub async fn next(&mut self) -> Option<(usize, ActivityOutcome)> {
        loop {
            if let Some(ended) = self.ready.pop_front() {
                return Some(ended);
            }
            if self.running == 0 {
                return None;
            }
            tokio::select! {
                biased;
                Some((index, task, signal)) = self.signals.recv() => {
                    self.signalled(index, task, signal);
                }
                () = self.cancel.shared.notify.notified() => {
                    for index in self.cancel.take() {
                        self.stop(index, CancelReason::Requested, ActivityOutcome::Cancelled);
                    }
                }
                () = &mut self.timer => self.expire(Instant::now()),
            }
        }
    }

    /// Selects a worker for dispatch `index` and hands it the task.
    fn deliver(&self, index: usize, running: &mut Running) -> Delivery {
        let inner = &self.dispatcher.inner;
        for _ in 0..DELIVERY_TRIES {
            inner.selections.fetch_add(1, Ordering::Relaxed);
            let Some((worker, reservation)) = inner.registry.select_and_reserve(
                &self.pool.namespace,
                &self.pool.task_queue,
                &self.pool.activity_type,
                self.pool.node.as_deref(),
            ) else {
                return Delivery::NoWorker;
            };
            let task = TaskId::from_raw(inner.next_task.fetch_add(1, Ordering::Relaxed));
            let signal = SignalTx::Batch {
                tx: self.tx.clone(),
                index,
                task,
            };
            let replaced = inner.lock_tasks().insert(
                task,
                PendingTask::new(
                    Arc::clone(worker.delivery()),
                    reservation,
                    Some(signal),
                    worker.has_session(),
                ),
            );
            drop(replaced);
            // As for a single dispatch: no task goes out once shutdown counted the table, and
            // a worker that left before the task was tracked never saw it.
            let delivered = if inner.shutting_down.load(Ordering::Acquire) {
                Err(DeliveryError::Closed)
            } else if inner.registry.is_registered(worker.id()) {
                worker.delivery().deliver(WorkerMessage::Task(ActivityTask {
                    task_id: task,
                    namespace: self.pool.namespace.clone(),
                    task_queue: self.pool.task_queue.clone(),
                    activity_type: self.pool.activity_type.clone(),
                    input: running.input.clone(),
                    attempt: running
                        .attempt_offset
                        .saturating_add(running.deliveries + 1),
                    deadline: running.wall_deadline,
                }))
            } else {
                Err(DeliveryError::Closed)
            };
            match delivered {
                Ok(()) => {
                    running.task = task;
                    running.deliveries += 1;
                    return Delivery::Delivered;
                }
                Err(error) => {
                    let removed = inner.lock_tasks().remove(task);
                    drop(removed);
                    inner.ended();
                    tracing::debug!(worker = %worker.id(), %error, "batch delivery refused");
                    if matches!(error, DeliveryError::TooLarge { .. })
                        || inner.shutting_down.load(Ordering::Acquire)
                    {
                        return Delivery::Refused;
                    }
                }
            }
        }
        Delivery::Refused
    }

    /// Dispatch `index` ended with `outcome`.
    fn end(&mut self, index: usize, outcome: ActivityOutcome) {
        if let Some(slot) = self.slots.get_mut(index) {
            *slot = Slot::Idle;
        }
        self.running = self.running.saturating_sub(1);
        self.dispatcher
            .inner
            .metrics
            .ended(&outcome, self.started.elapsed());
        self.ready.push_back((index, outcome));
    }

    /// The signal of `task`, dispatch `index`'s current task (an older task's is stale).
    fn signalled(&mut self, index: usize, task: TaskId, signal: Signal) {
        let Some(Slot::Running(running)) = self.slots.get_mut(index) else {
            return;
        };
        if running.task != task {
            return;
        }
        let outcome = match (signal, running.stopped.take()) {
            (Signal::Result(TaskResult::Success(output)), _) => ActivityOutcome::Completed(output),
            (Signal::Result(TaskResult::Failure { message, retryable }), _) => {
                ActivityOutcome::Failed { message, retryable }
            }
            (_, Some(stopped)) => stopped,
            (Signal::Cancelled, None) => ActivityOutcome::Cancelled,
            (Signal::ShuttingDown, None) => ActivityOutcome::ShuttingDown,
            (Signal::Unreached, None) => {
                tracing::debug!(task = %task, "batch task never reached its resumed worker");
                return self.again(index);
            }
            (Signal::WorkerLost(transport), None) => {
                let inner = &self.dispatcher.inner;
                let budget = running.budget.get_or_insert_with(|| {
                    LossBudget::new(inner.config.loss_budget, inner.config.loss_window)
                });
                if budget.record(Instant::now()) {
                    return self.again(index);
                }
                ActivityOutcome::TransportLost {
                    transport,
                    attempts: running.deliveries,
                }
            }
        };
        self.end(index, outcome);
    }

    /// Delivers dispatch `index` again (its worker was lost or never got it), to a local
    /// worker or not at all.
    fn again(&mut self, index: usize) {
        let Some(slot) = self.slots.get_mut(index) else {
            return;
        };
        let mut running = match std::mem::replace(slot, Slot::Idle) {
            Slot::Running(running) => running,
            Slot::Idle => return,
        };
        if Instant::now() < running.deadline
            && matches!(self.deliver(index, &mut running), Delivery::Delivered)
        {
            if let Some(slot) = self.slots.get_mut(index) {
                *slot = Slot::Running(running);
            }
            return;
        }
        let outcome = self.dispatcher.unserved_now(&ActivityRequest {
            namespace: self.pool.namespace.clone(),
            task_queue: self.pool.task_queue.clone(),
            activity_type: self.pool.activity_type.clone(),
            node: self.pool.node.clone(),
            input: Bytes::new(),
            activity_id: None,
            timeout: Duration::ZERO,
        });
        self.end(index, outcome);
    }

    /// Stops dispatch `index` early for `reason` with `outcome`, unless its worker's answer is
    /// already on its way (then that answer decides, see [`Running::stopped`]).
    fn stop(&mut self, index: usize, reason: CancelReason, outcome: ActivityOutcome) {
        let Some(Slot::Running(running)) = self.slots.get_mut(index) else {
            return;
        };
        if running.stopped.is_some() {
            return;
        }
        if self.dispatcher.inner.abandon(running.task, reason) {
            self.end(index, outcome);
        } else {
            running.stopped = Some(outcome);
        }
    }

    /// Ends `TimedOut` every running dispatch whose deadline passed by `now`, and sets the
    /// timer for the next deadline.
    fn expire(&mut self, now: Instant) {
        let due: Vec<usize> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| match slot {
                Slot::Running(running) if running.deadline <= now => Some(index),
                _ => None,
            })
            .collect();
        for index in due {
            self.stop(
                index,
                CancelReason::DeadlineExceeded,
                ActivityOutcome::TimedOut,
            );
        }
        self.rearm();
    }

    /// Sets the timer to the earliest deadline of a dispatch still waiting for its worker.
    fn rearm(&mut self) {
        let next = self
            .slots
            .iter()
            .filter_map(|slot| match slot {
                Slot::Running(running) if running.stopped.is_none() => Some(running.deadline),
                _ => None,
            })
            .min();
        // Without one, an hour off: every running dispatch is stopped and only waits for its
        // worker's answer already on its way.
        let at = next.unwrap_or_else(|| Instant::now() + IDLE_TIMER);
        self.timer.as_mut().reset(at);
    }
}

impl Drop for LocalBatch {
    fn drop(&mut self) {
        let inner = &self.dispatcher.inner;
        for slot in &self.slots {
            if let Slot::Running(running) = slot {
                let _ = inner.abandon(running.task, CancelReason::CallerGone);
            }
        }
        inner
            .quotas
            .release(&self.pool.namespace, &self.principal, self.held_bytes);
    }
}
