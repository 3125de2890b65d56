//! Pending tasks: which worker holds what, and the one path a result takes back to its caller.

use std::collections::HashSet;
use std::sync::Arc;

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::address::WorkerId;
use crate::delivery::{CancelReason, TaskId, TransportName, WorkerDelivery};
use crate::id_hash::{IdMap, IdSet};
use crate::outcome::{CompletionRefused, TaskResult};

use crate::registry::{DispatchReservation, shrink_after_drain};

/// What ends a task's wait.
#[derive(Debug)]
pub(crate) enum Signal {
    /// The worker reported a result.
    Result(TaskResult),
    /// The worker left while holding the task.
    WorkerLost(TransportName),
    /// An operator cancelled every task the worker holds (a drain past its deadline).
    Cancelled,
    /// The worker resumed its session without ever having received the task: select again.
    Unreached,
    /// The shutdown grace ended with the task unfinished.
    ShuttingDown,
}

/// Where a task's [`Signal`] goes: the one dispatch waiting for it, or the batch it belongs to
/// (one channel for the whole batch, the signal tagged with the task's place in it).
#[derive(Debug)]
pub(crate) enum SignalTx {
    /// A single dispatch waits on its own channel.
    One(oneshot::Sender<Signal>),
    /// A local batch ([`super::LocalBatch`]) waits on one channel for all its tasks.
    Batch {
        tx: mpsc::UnboundedSender<(usize, TaskId, Signal)>,
        index: usize,
        task: TaskId,
    },
}

impl SignalTx {
    /// Hands `signal` to whoever waits; `Err` with it when nobody listens any more.
    pub(crate) fn send(self, signal: Signal) -> Result<(), Signal> {
        match self {
            Self::One(tx) => tx.send(signal),
            Self::Batch { tx, index, task } => tx
                .send((index, task, signal))
                .map_err(|mpsc::error::SendError((_, _, signal))| signal),
        }
    }
}

impl From<oneshot::Sender<Signal>> for SignalTx {
    fn from(tx: oneshot::Sender<Signal>) -> Self {
        Self::One(tx)
    }
}

/// A task delivered to a worker and not yet finished.
pub(crate) struct PendingTask {
    pub(crate) delivery: Arc<dyn WorkerDelivery>,
    /// Holds the worker's slot until the task is finished, acknowledged as cancelled, or lost.
    pub(crate) reservation: DispatchReservation,
    /// Taken when the dispatch ends early (cancel, deadline, shutdown, caller gone); the task
    /// then only waits for the worker to let go of its slot.
    pub(crate) signal: Option<SignalTx>,
    /// When the dispatch ended early; from then the worker has `cancel_ack_timeout` to let go.
    pub(crate) detached_at: Option<Instant>,
    /// The worker has a session (a lost connection suspends it): only then can a result be
    /// late.
    pub(crate) session: bool,
    /// Why the dispatch ended early, for the cancel re-sent after a resume.
    pub(crate) cancel_reason: Option<CancelReason>,
    /// The dispatch ended while the worker's connection was gone (its session suspended): a
    /// result it sends after resuming is refused as late.
    pub(crate) late: bool,
}

impl PendingTask {
    /// A task just delivered on `delivery`, holding `reservation`, its caller waiting on
    /// `signal`.
    pub(crate) fn new(
        delivery: Arc<dyn WorkerDelivery>,
        reservation: DispatchReservation,
        signal: Option<SignalTx>,
        session: bool,
    ) -> Self {
        Self {
            delivery,
            reservation,
            signal,
            detached_at: None,
            cancel_reason: None,
            session,
            late: false,
        }
    }

    /// Ends the caller's wait at `now` for `reason`; returns the caller's signal.
    fn detach(&mut self, now: Instant, reason: CancelReason) -> Option<SignalTx> {
        let signal = self.signal.take()?;
        self.detached_at = Some(now);
        self.cancel_reason = Some(reason);
        self.late = self.session && !self.delivery.is_connected();
        Some(signal)
    }
}

/// What a resumed worker's report comes to (see [`TaskTable::reconcile`]).
#[derive(Default)]
pub(crate) struct Reconciled {
    /// Tasks the worker reported that core still holds for it.
    pub(crate) held: Vec<TaskId>,
    /// Held tasks whose dispatch already ended, with the cancel to send again.
    pub(crate) cancels: Vec<(TaskId, CancelReason)>,
    /// Tasks the worker never received, out of the table (dropping frees their slots).
    pub(crate) unreached: Vec<PendingTask>,
}

/// What a removal hands back; dropped outside the table lock (dropping frees the slot).
pub(crate) type Removed = Option<PendingTask>;

#[derive(Default)]
pub(crate) struct TaskTable {
    pending: IdMap<TaskId, PendingTask>,
    by_worker: IdMap<WorkerId, IdSet<TaskId>>,
}

impl TaskTable {
    /// Tracks `task` on the worker its reservation holds. Tracking a task again replaces the
    /// first entry, which is handed back (dropping it frees that slot), so a task tracked twice
    /// holds one slot.
    pub(crate) fn insert(&mut self, task: TaskId, pending: PendingTask) -> Removed {
        let replaced = self.remove(task);
        self.by_worker
            .entry(pending.reservation.worker())
            .or_default()
            .insert(task);
        self.pending.insert(task, pending);
        replaced
    }

    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Tasks whose caller still waits.
    pub(crate) fn awaited(&self) -> usize {
        self.pending.values().filter(|p| p.signal.is_some()).count()
    }

    pub(crate) fn remove(&mut self, task: TaskId) -> Removed {
        let pending = self.pending.remove(&task)?;
        if let Some(tasks) = self.by_worker.get_mut(&pending.reservation.worker()) {
            tasks.remove(&task);
            if tasks.is_empty() {
                self.by_worker.remove(&pending.reservation.worker());
                shrink_after_drain(&mut self.by_worker);
            }
        }
        shrink_after_drain(&mut self.pending);
        Some(pending)
    }

    /// Takes the entry of `task` out for the result `worker` reports. Refused, and left in
    /// place, when nothing is pending under that id or another worker holds it. The caller
    /// frees the slot (drops the entry) before handing the result on, so whoever hears back
    /// finds the slot free.
    pub(crate) fn take_for_result(
        &mut self,
        worker: WorkerId,
        task: TaskId,
    ) -> Result<PendingTask, CompletionRefused> {
        match self.pending.get(&task) {
            None => Err(CompletionRefused::UnknownTask { task }),
            Some(p) if p.reservation.worker() != worker => {
                Err(CompletionRefused::NotHeldByWorker { task, worker })
            }
            Some(_) => self
                .remove(task)
                .ok_or(CompletionRefused::UnknownTask { task }),
        }
    }

    /// The worker confirmed it stopped a cancelled task: free its slot.
    pub(crate) fn acknowledge_cancel(
        &mut self,
        worker: WorkerId,
        task: TaskId,
    ) -> (Result<(), CompletionRefused>, Removed) {
        match self.pending.get(&task) {
            None => (Err(CompletionRefused::UnknownTask { task }), None),
            Some(p) if p.reservation.worker() != worker => (
                Err(CompletionRefused::NotHeldByWorker { task, worker }),
                None,
            ),
            // An acknowledgement for a task nobody cancelled changes nothing.
            Some(p) if p.signal.is_some() => (Err(CompletionRefused::UnknownTask { task }), None),
            Some(_) => (Ok(()), self.remove(task)),
        }
    }

    /// Ends the caller's wait without a result; the entry stays (holding the slot) until the
    /// worker acknowledges, answers or leaves. Returns the delivery to send the cancel on, or
    /// `None` if the wait had already ended.
    pub(crate) fn detach(
        &mut self,
        task: TaskId,
        now: Instant,
        reason: CancelReason,
    ) -> Option<Arc<dyn WorkerDelivery>> {
        let pending = self.pending.get_mut(&task)?;
        pending.detach(now, reason)?;
        Some(Arc::clone(&pending.delivery))
    }

    /// Takes out `task` if its dispatch ended at least `timeout` before `now` and its worker
    /// has neither answered nor acknowledged since (dropping the entry frees the slot). A task
    /// whose worker's connection is gone is not overdue: the worker cannot hear the cancel, and
    /// a suspended session worker's clock starts again when it resumes
    /// ([`TaskTable::reconcile`]).
    pub(crate) fn reclaim(&mut self, task: TaskId, now: Instant, timeout: Duration) -> Removed {
        let overdue = self
            .pending
            .get(&task)
            .filter(|pending| pending.delivery.is_connected())
            .and_then(|pending| pending.detached_at)
            .is_some_and(|at| now.saturating_duration_since(at) >= timeout);
        if overdue { self.remove(task) } else { None }
    }

    /// Ends the wait of every dispatch `worker` holds, as [`TaskTable::detach`] does for one;
    /// returns each task with its delivery (for the cancel) and its caller's signal.
    pub(crate) fn detach_all(
        &mut self,
        worker: WorkerId,
        now: Instant,
        reason: CancelReason,
    ) -> Vec<(TaskId, Arc<dyn WorkerDelivery>, SignalTx)> {
        let Some(tasks) = self.by_worker.get(&worker) else {
            return Vec::new();
        };
        let mut detached = Vec::new();
        for task in tasks {
            if let Some(pending) = self.pending.get_mut(task) {
                if let Some(signal) = pending.detach(now, reason) {
                    detached.push((*task, Arc::clone(&pending.delivery), signal));
                }
            }
        }
        detached
    }

    /// Ends the wait of every dispatch still waiting, as [`TaskTable::detach`] does for one;
    /// returns each task with its delivery (for the cancel) and its caller's signal.
    pub(crate) fn detach_every(
        &mut self,
        now: Instant,
        reason: CancelReason,
    ) -> Vec<(TaskId, Arc<dyn WorkerDelivery>, SignalTx)> {
        let mut detached = Vec::new();
        for (task, pending) in &mut self.pending {
            if let Some(signal) = pending.detach(now, reason) {
                detached.push((*task, Arc::clone(&pending.delivery), signal));
            }
        }
        detached
    }

    /// Squares the tasks `worker` holds with what it reported on resuming at `now`
    /// (`reported`: the tasks it still runs or holds an unacknowledged result for). Reported
    /// and held: kept (a cancel to re-send if the dispatch ended meanwhile, the worker's time
    /// to acknowledge it counted from `now`). Held but not reported: the task never reached
    /// the worker, so it leaves the table. Reported but not held: not listed, so the worker
    /// lets go of it.
    pub(crate) fn reconcile(
        &mut self,
        worker: WorkerId,
        reported: &HashSet<TaskId>,
        now: Instant,
    ) -> Reconciled {
        let mut reconciled = Reconciled::default();
        let Some(tasks) = self.by_worker.get(&worker) else {
            return reconciled;
        };
        let mut unreached = Vec::new();
        for task in tasks {
            if !reported.contains(task) {
                unreached.push(*task);
                continue;
            }
            reconciled.held.push(*task);
            if let Some(pending) = self.pending.get_mut(task) {
                if let Some(reason) = pending.cancel_reason {
                    pending.detached_at = Some(now);
                    reconciled.cancels.push((*task, reason));
                }
            }
        }
        reconciled.held.sort_unstable();
        unreached.sort_unstable();
        reconciled.unreached = unreached
            .into_iter()
            .filter_map(|task| self.remove(task))
            .collect();
        reconciled
    }

    /// Removes every task of a departed worker; their callers are told the worker was lost.
    pub(crate) fn worker_lost(&mut self, worker: WorkerId) -> Vec<PendingTask> {
        let Some(tasks) = self.by_worker.remove(&worker) else {
            return Vec::new();
        };
        tasks
            .into_iter()
            .filter_map(|task| self.pending.remove(&task))
            .collect()
    }
}
