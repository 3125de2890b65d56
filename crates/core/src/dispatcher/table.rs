//! Pending tasks: which worker holds what, and the one path a result takes back to its caller.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::address::WorkerId;
use crate::delivery::{TaskId, TransportName, WorkerDelivery};
use crate::outcome::{CompletionRefused, TaskResult};
use crate::registry::DispatchReservation;

/// What ends a task's wait.
#[derive(Debug)]
pub(crate) enum Signal {
    /// The worker reported a result.
    Result(TaskResult),
    /// The worker left while holding the task.
    WorkerLost(TransportName),
}

/// A task delivered to a worker and not yet finished.
pub(crate) struct PendingTask {
    pub(crate) delivery: Arc<dyn WorkerDelivery>,
    /// Holds the worker's slot until the task is finished, acknowledged as cancelled, or lost.
    pub(crate) reservation: DispatchReservation,
    /// Taken when the dispatch ends early (cancel, deadline, shutdown, caller gone); the task
    /// then only waits for the worker to let go of its slot.
    pub(crate) signal: Option<oneshot::Sender<Signal>>,
}

/// What a removal hands back; dropped outside the table lock (dropping frees the slot).
pub(crate) type Removed = Option<PendingTask>;

#[derive(Default)]
pub(crate) struct TaskTable {
    pending: HashMap<TaskId, PendingTask>,
    by_worker: HashMap<WorkerId, HashSet<TaskId>>,
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
            }
        }
        Some(pending)
    }

    /// Hands a worker's result to its caller. The entry leaves the table either way, freeing
    /// the slot, unless the worker quoting it does not hold it.
    pub(crate) fn complete(
        &mut self,
        worker: WorkerId,
        task: TaskId,
        result: TaskResult,
    ) -> (Result<(), CompletionRefused>, Removed) {
        match self.pending.get(&task) {
            None => return (Err(CompletionRefused::UnknownTask { task }), None),
            Some(p) if p.reservation.worker() != worker => {
                return (
                    Err(CompletionRefused::NotHeldByWorker { task, worker }),
                    None,
                );
            }
            Some(_) => {}
        }
        let mut removed = self.remove(task);
        let outcome = match removed.as_mut().and_then(|p| p.signal.take()) {
            // A caller that stopped listening this instant is the same as a late result.
            Some(signal) => signal
                .send(Signal::Result(result))
                .map_err(|_| CompletionRefused::Late { task }),
            None => Err(CompletionRefused::Late { task }),
        };
        (outcome, removed)
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
    pub(crate) fn detach(&mut self, task: TaskId) -> Option<Arc<dyn WorkerDelivery>> {
        let pending = self.pending.get_mut(&task)?;
        pending.signal.take()?;
        Some(Arc::clone(&pending.delivery))
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
