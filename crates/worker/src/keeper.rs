//! The tasks a worker holds across its connections: handlers still running, replies not yet
//! written, and results written but not yet acknowledged by the gateway.
//!
//! A link hands every inbound task to [`TaskKeeper::start`], every cancel to
//! [`TaskKeeper::cancel`] and every results acknowledgement to [`TaskKeeper::acknowledged`],
//! and writes what [`TaskKeeper::next_reply`] yields. Handlers run on the runtime, not inside
//! the link's `serve`, so a lost connection does not stop them: with a session the reconnect
//! loop resumes ([`TaskKeeper::resume_request`], then [`TaskKeeper::reconcile`] with what the
//! gateway still holds), without one it lets go of everything ([`TaskKeeper::abandon`]).
//!
//! A link whose writes never wait may also install a [`ReplySink`]: a reply then goes out from
//! the task that finished, without a turn of the link's loop, whenever nothing is queued ahead
//! of it and the sink knows where it goes; otherwise it waits in the queue as before.
//!
//! Memory is bounded by the gateway: it holds at most the worker's capacity of tasks, and a
//! result is kept only until the gateway's acknowledgement (or the next reconcile) names it.

use std::collections::hash_map::Entry;
use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use switchyard_core::{ActivityTask, IdMap, ResumeRequest, SessionGrant, TaskId};
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use crate::{RunningTask, TaskReply, TaskRunner};

/// Owns a worker's tasks across connections: the handlers still running, the replies not yet
/// written and the results not yet acknowledged.
pub struct TaskKeeper {
    tasks: TaskStarter,
}

/// Starts and cancels tasks of a [`TaskKeeper`], for a link that reads its frames on tasks of
/// its own (QUIC lanes): cloneable, and it owns nothing, so dropping it lets go of no task.
#[derive(Clone)]
pub struct TaskStarter {
    runner: TaskRunner,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TaskStarter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskStarter").finish_non_exhaustive()
    }
}

/// Writes a reply at once from the task that finished, for a link whose writes never wait.
pub trait ReplySink: Send + Sync {
    /// Writes `reply` now and returns true, or returns false (it then waits for
    /// [`TaskKeeper::next_reply`]). Called with the keeper's lock held, so that an
    /// acknowledgement cannot overtake the keeping of the result: it must not call back into
    /// the keeper.
    fn try_write(&self, reply: &TaskReply) -> bool;
}

struct Shared {
    state: Mutex<KeeperState>,
    /// Woken when a reply is queued.
    ready: Notify,
}

#[derive(Default)]
struct KeeperState {
    /// Tasks whose handler has not finished.
    running: IdMap<TaskId, Running>,
    /// Replies finished and not yet taken by a link, in order (re-sent results first).
    ready: VecDeque<TaskReply>,
    /// Results taken by a link and not yet acknowledged, kept while `keep_unacked`.
    unacked: IdMap<TaskId, TaskReply>,
    /// True while the connection has a session, so an unacknowledged result can be re-sent.
    keep_unacked: bool,
    /// The current link's sink, if it installed one.
    sink: Option<Arc<dyn ReplySink>>,
}

impl KeeperState {
    /// A reply the link took (from the queue or through its sink): kept until acknowledged
    /// while the connection has a session.
    fn taken(&mut self, reply: TaskReply) {
        if let (true, TaskReply::Result { task_id, .. }) = (self.keep_unacked, &reply) {
            self.unacked.insert(*task_id, reply);
        }
    }

    /// A finished task's reply: written through the sink when nothing is queued ahead of it,
    /// else queued. Returns true when it was queued (the link must be woken).
    fn finished(&mut self, reply: TaskReply) -> bool {
        let written = self.ready.is_empty()
            && self
                .sink
                .as_ref()
                .is_some_and(|sink| sink.try_write(&reply));
        if written {
            self.taken(reply);
            false
        } else {
            self.ready.push_back(reply);
            true
        }
    }
}

struct Running {
    canceller: CancellationToken,
    /// `None` while the task runs inline in its reader ([`InlineTask`]).
    abort: Option<AbortHandle>,
}

impl Running {
    fn stop(&self) {
        self.canceller.cancel();
        if let Some(abort) = &self.abort {
            abort.abort();
        }
    }
}

impl std::fmt::Debug for TaskKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.tasks.shared.lock();
        f.debug_struct("TaskKeeper")
            .field("running", &state.running.len())
            .field("ready", &state.ready.len())
            .field("unacked", &state.unacked.len())
            .finish()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, KeeperState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The handler of `task_id` finished with `reply`.
    fn finish(&self, task_id: TaskId, reply: TaskReply) {
        let mut state = self.lock();
        // Absent: the task was let go (not held after a resume, or abandoned).
        if state.running.remove(&task_id).is_some() && state.finished(reply) {
            drop(state);
            self.ready.notify_one();
        }
    }
}

/// A task of the keeper run inline by its reader (see [`TaskStarter::start_inline`]); resolves
/// once its reply was handed on.
pub struct InlineTask {
    task_id: TaskId,
    running: Option<RunningTask>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for InlineTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineTask")
            .field("task_id", &self.task_id)
            .finish_non_exhaustive()
    }
}

impl Future for InlineTask {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(running) = self.running.as_mut() else {
            return Poll::Ready(());
        };
        let reply = std::task::ready!(Pin::new(running).poll(cx));
        self.running = None;
        self.shared.finish(self.task_id, reply);
        Poll::Ready(())
    }
}

impl Drop for InlineTask {
    fn drop(&mut self) {
        let Some(running) = self.running.take() else {
            return;
        };
        // Outside a runtime (it is shutting down) the handler cannot go on anyway.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut state = self.shared.lock();
        // Absent: the task was let go meanwhile; dropping `running` stops it.
        let Some(entry) = state.running.get_mut(&self.task_id) else {
            return;
        };
        let shared = Arc::clone(&self.shared);
        let task_id = self.task_id;
        let abort = runtime.spawn(async move {
            let reply = running.await;
            shared.finish(task_id, reply);
        });
        entry.abort = Some(abort.abort_handle());
    }
}

impl TaskKeeper {
    /// A keeper starting tasks on `runner`.
    pub fn new(runner: TaskRunner) -> Self {
        Self {
            tasks: TaskStarter {
                runner,
                shared: Arc::new(Shared {
                    state: Mutex::new(KeeperState::default()),
                    ready: Notify::new(),
                }),
            },
        }
    }

    /// A starter of this keeper's tasks, for lanes read on their own tasks.
    pub fn starter(&self) -> TaskStarter {
        self.tasks.clone()
    }

    /// Starts `task` on its own runtime task; its reply comes out of
    /// [`TaskKeeper::next_reply`]. A task already held is not started twice.
    pub fn start(&self, task: ActivityTask) {
        self.tasks.start(task);
    }

    /// Fires the handler's cancellation token of `task`, if it still runs; it then answers
    /// with a cancel acknowledgement.
    pub fn cancel(&self, task: TaskId) {
        self.tasks.cancel(task);
    }

    /// The gateway processed the results of `tasks`: forget them.
    pub fn acknowledged(&self, tasks: impl IntoIterator<Item = TaskId>) {
        let mut state = self.tasks.shared.lock();
        for task in tasks {
            state.unacked.remove(&task);
        }
    }

    /// The next reply to write, in order; waits for one. A result is kept as unacknowledged
    /// (while the connection has a session) until [`TaskKeeper::acknowledged`] names it.
    /// Cancel-safe: a reply is taken only when it is returned.
    pub async fn next_reply(&self) -> TaskReply {
        loop {
            if let Some(reply) = self.try_next_reply() {
                return reply;
            }
            self.tasks.shared.ready.notified().await;
        }
    }

    /// The next reply to write if one is ready, without waiting; kept as
    /// [`TaskKeeper::next_reply`] keeps it. A link that was woken for one reply takes the rest
    /// this way, instead of waiting (and being woken) once per reply.
    pub fn try_next_reply(&self) -> Option<TaskReply> {
        let mut state = self.tasks.shared.lock();
        let reply = state.ready.pop_front()?;
        state.taken(reply.clone());
        Some(reply)
    }

    /// Installs the current link's [`ReplySink`] until the returned guard is dropped (at the
    /// latest when the link's `serve` ends, so no reply goes to a connection that is gone).
    pub fn install_sink(&self, sink: Arc<dyn ReplySink>) -> SinkGuard<'_> {
        self.tasks.shared.lock().sink = Some(sink);
        SinkGuard(self)
    }

    /// True when no handler runs and no reply waits to be written: a drain is complete.
    pub fn is_idle(&self) -> bool {
        let state = self.tasks.shared.lock();
        state.running.is_empty() && state.ready.is_empty()
    }

    /// Whether results written from now on are kept until acknowledged (the connection has a
    /// session); set by the runtime for each connection.
    pub(crate) fn keep_unacknowledged(&self, keep: bool) {
        let mut state = self.tasks.shared.lock();
        state.keep_unacked = keep;
        if !keep {
            state.unacked.clear();
        }
    }

    /// The resume frame's content for `grant`: the tasks still running (and finished but not
    /// yet written) and the results written but not acknowledged.
    pub fn resume_request(&self, grant: &SessionGrant) -> ResumeRequest {
        let state = self.tasks.shared.lock();
        let mut running: Vec<TaskId> = state.running.keys().copied().collect();
        running.extend(state.ready.iter().map(reply_task));
        running.sort_unstable();
        let mut unacked: Vec<TaskId> = state.unacked.keys().copied().collect();
        unacked.sort_unstable();
        ResumeRequest {
            session_id: grant.session_id,
            secret: grant.secret.as_bytes().to_vec(),
            running,
            unacked,
        }
    }

    /// Applies a resume's acknowledgement: the gateway still waits on `held`. Every other task
    /// is let go (its handler cancelled, its reply dropped); unacknowledged results of held
    /// tasks are queued to be written again, ahead of the rest.
    pub fn reconcile(&self, held: &[TaskId]) {
        let held: HashSet<TaskId> = held.iter().copied().collect();
        let mut state = self.tasks.shared.lock();
        state.running.retain(|task, running| {
            let keep = held.contains(task);
            if !keep {
                running.stop();
            }
            keep
        });
        state
            .ready
            .retain(|reply| held.contains(&reply_task(reply)));
        let mut resend: Vec<TaskReply> = state
            .unacked
            .drain()
            .filter(|(task, _)| held.contains(task))
            .map(|(_, reply)| reply)
            .collect();
        resend.sort_unstable_by_key(reply_task);
        for reply in resend.into_iter().rev() {
            state.ready.push_front(reply);
        }
        let ready = !state.ready.is_empty();
        drop(state);
        if ready {
            self.tasks.shared.ready.notify_one();
        }
    }

    /// Lets go of every task: handlers cancelled and stopped, replies and results dropped (a
    /// fresh registration, or the worker stopping; the gateway dispatches them again).
    pub fn abandon(&self) {
        let mut state = self.tasks.shared.lock();
        for running in state.running.values() {
            running.stop();
        }
        state.running.clear();
        state.ready.clear();
        state.unacked.clear();
    }

    /// Tasks held in any form: running, waiting to be written, or unacknowledged.
    pub fn held(&self) -> usize {
        let state = self.tasks.shared.lock();
        state.running.len() + state.ready.len() + state.unacked.len()
    }
}

/// Keeps a link's [`ReplySink`] installed in its [`TaskKeeper`]; dropping it removes the sink.
#[must_use = "the sink is removed when the guard is dropped"]
pub struct SinkGuard<'a>(&'a TaskKeeper);

impl std::fmt::Debug for SinkGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkGuard").finish_non_exhaustive()
    }
}

impl Drop for SinkGuard<'_> {
    fn drop(&mut self) {
        self.0.tasks.shared.lock().sink = None;
    }
}

impl TaskStarter {
    /// Starts `task` on its own runtime task; its reply comes out of
    /// [`TaskKeeper::next_reply`] (or its sink). A task already held is not started twice.
    pub fn start(&self, task: ActivityTask) {
        let running = self.runner.start(task);
        let task_id = running.task_id();
        let canceller = running.canceller();
        let shared = Arc::clone(&self.shared);
        // Held under the lock while spawning, so a handler finishing at once finds its entry.
        let mut state = self.shared.lock();
        let Entry::Vacant(entry) = state.running.entry(task_id) else {
            return;
        };
        let abort = tokio::spawn(async move {
            let reply = running.await;
            shared.finish(task_id, reply);
        })
        .abort_handle();
        entry.insert(Running {
            canceller,
            abort: Some(abort),
        });
    }

    /// Starts `task` to run inline in the caller, which polls the returned [`InlineTask`]: no
    /// runtime task of its own while the caller lives, and its reply goes out as a spawned
    /// task's would. Dropping it unfinished moves what is left onto a runtime task, so the
    /// handler outlives its reader as every task of the keeper does. `None` when the task is
    /// already held (it is not started twice).
    pub fn start_inline(&self, task: ActivityTask) -> Option<InlineTask> {
        let running = self.runner.start(task);
        let task_id = running.task_id();
        let canceller = running.canceller();
        let mut state = self.shared.lock();
        let Entry::Vacant(entry) = state.running.entry(task_id) else {
            return None;
        };
        entry.insert(Running {
            canceller,
            abort: None,
        });
        Some(InlineTask {
            task_id,
            running: Some(running),
            shared: Arc::clone(&self.shared),
        })
    }

    /// Fires the handler's cancellation token of `task`, if it still runs; it then answers
    /// with a cancel acknowledgement.
    pub fn cancel(&self, task: TaskId) {
        if let Some(running) = self.shared.lock().running.get(&task) {
            running.canceller.cancel();
        }
    }
}

impl Drop for TaskKeeper {
    fn drop(&mut self) {
        self.abandon();
    }
}

fn reply_task(reply: &TaskReply) -> TaskId {
    match reply {
        TaskReply::Result { task_id, .. } | TaskReply::CancelAck { task_id } => *task_id,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::{Duration, SystemTime};

    use bytes::Bytes;
    use switchyard_core::{
        ActivityContext, ActivityError, ActivityHandler, ResumeSecret, TaskResult, WorkerId,
    };

    use super::*;

    pub(crate) fn keeper() -> TaskKeeper {
        let mut activities: BTreeMap<String, Arc<dyn ActivityHandler>> = BTreeMap::new();
        let echo = |_: ActivityContext, input: Bytes| async move { Ok(input) };
        let slow = |ctx: ActivityContext, input: Bytes| async move {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(2)) => Ok(input),
                () = ctx.cancelled() => Err(ActivityError::retryable("stopped")),
            }
        };
        activities.insert("echo".into(), Arc::new(echo));
        activities.insert("slow".into(), Arc::new(slow));
        TaskKeeper::new(TaskRunner::new(activities, 4))
    }

    pub(crate) fn task(id: u64, activity_type: &str) -> ActivityTask {
        ActivityTask {
            task_id: TaskId::from_raw(id),
            namespace: "ns".into(),
            task_queue: "q".into(),
            activity_type: activity_type.into(),
            input: Bytes::from_static(b"in"),
            attempt: 1,
            deadline: SystemTime::UNIX_EPOCH,
        }
    }

    fn grant() -> SessionGrant {
        SessionGrant {
            session_id: WorkerId::from_raw(9),
            secret: ResumeSecret::from_slice(&[7; 32]).unwrap_or_else(|| unreachable!()),
            grace: Duration::from_secs(5),
        }
    }

    fn ids(raw: &[u64]) -> Vec<TaskId> {
        raw.iter().copied().map(TaskId::from_raw).collect()
    }

    fn result(id: u64) -> TaskReply {
        TaskReply::Result {
            task_id: TaskId::from_raw(id),
            result: TaskResult::Success(Bytes::from_static(b"in")),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_written_result_is_kept_until_acknowledged() {
        let keeper = keeper();
        keeper.keep_unacknowledged(true);
        keeper.start(task(1, "echo"));
        assert_eq!(keeper.next_reply().await, result(1));
        let request = keeper.resume_request(&grant());
        assert_eq!(request.unacked, ids(&[1]), "written, not acknowledged");
        assert_eq!(request.secret, vec![7; 32]);
        keeper.acknowledged(ids(&[1]));
        // Control: the acknowledgement is what made it forget.
        assert!(keeper.resume_request(&grant()).unacked.is_empty());
        assert_eq!(keeper.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn try_next_reply_takes_what_is_ready_and_keeps_it_as_next_reply_does() {
        let keeper = keeper();
        keeper.keep_unacknowledged(true);
        keeper.start(task(1, "echo"));
        keeper.start(task(2, "echo"));
        // Control: nothing is ready before the handlers ran.
        assert_eq!(keeper.try_next_reply(), None);
        while keeper.held() > keeper.tasks.shared.lock().ready.len() {
            tokio::task::yield_now().await;
        }
        let mut taken = vec![keeper.try_next_reply(), keeper.try_next_reply()];
        taken.sort_by_key(|reply| reply.as_ref().map(reply_task));
        assert_eq!(taken, [Some(result(1)), Some(result(2))]);
        assert_eq!(keeper.try_next_reply(), None, "each reply is taken once");
        assert_eq!(
            keeper.resume_request(&grant()).unacked,
            ids(&[1, 2]),
            "kept until acknowledged"
        );
    }

    /// A sink that takes replies while `open`, recording them.
    #[derive(Default)]
    struct Recorder {
        open: std::sync::atomic::AtomicBool,
        written: Mutex<Vec<TaskReply>>,
    }

    impl ReplySink for Recorder {
        fn try_write(&self, reply: &TaskReply) -> bool {
            let open = self.open.load(std::sync::atomic::Ordering::Relaxed);
            if open {
                self.written
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(reply.clone());
            }
            open
        }
    }

    async fn settle(keeper: &TaskKeeper) {
        while !keeper.tasks.shared.lock().running.is_empty() {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_sink_writes_replies_at_once_and_keeps_results_until_acknowledged() {
        let keeper = keeper();
        keeper.keep_unacknowledged(true);
        let sink = Arc::new(Recorder::default());
        sink.open.store(true, std::sync::atomic::Ordering::Relaxed);
        let installed = keeper.install_sink(Arc::clone(&sink) as Arc<dyn ReplySink>);
        keeper.start(task(1, "echo"));
        settle(&keeper).await;
        let written = sink.written.lock().map(|w| w.clone()).unwrap_or_default();
        assert_eq!(written, [result(1)], "written by the sink");
        assert_eq!(keeper.try_next_reply(), None, "not queued as well");
        assert_eq!(keeper.resume_request(&grant()).unacked, ids(&[1]));

        // Control: a sink that refuses, or one removed (even if it would take it), leaves the
        // reply in the queue.
        sink.open.store(false, std::sync::atomic::Ordering::Relaxed);
        keeper.start(task(2, "echo"));
        settle(&keeper).await;
        drop(installed);
        sink.open.store(true, std::sync::atomic::Ordering::Relaxed);
        keeper.start(task(3, "echo"));
        settle(&keeper).await;
        assert_eq!(keeper.try_next_reply(), Some(result(2)));
        assert_eq!(keeper.try_next_reply(), Some(result(3)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sink_never_overtakes_a_queued_reply() {
        let keeper = keeper();
        let sink = Arc::new(Recorder::default());
        let _installed = keeper.install_sink(Arc::clone(&sink) as Arc<dyn ReplySink>);
        keeper.start(task(1, "echo"));
        settle(&keeper).await;
        sink.open.store(true, std::sync::atomic::Ordering::Relaxed);
        keeper.start(task(2, "echo"));
        settle(&keeper).await;
        // Task 1's reply waits in the queue, so task 2's queues behind it.
        assert!(sink.written.lock().map(|w| w.is_empty()).unwrap_or(false));
        assert_eq!(keeper.try_next_reply(), Some(result(1)));
        assert_eq!(keeper.try_next_reply(), Some(result(2)));
        // Control: with the queue empty, the open sink takes the next one.
        keeper.start(task(3, "echo"));
        settle(&keeper).await;
        let written = sink.written.lock().map(|w| w.clone()).unwrap_or_default();
        assert_eq!(written, [result(3)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_starter_starts_and_cancels_the_keeper_s_tasks_and_owns_none() {
        let keeper = keeper();
        let starter = keeper.starter();
        starter.start(task(1, "slow"));
        starter.start(task(2, "slow"));
        drop(starter);
        tokio::task::yield_now().await;
        assert_eq!(keeper.held(), 2, "dropping the starter let go of nothing");
        keeper.starter().cancel(TaskId::from_raw(1));
        assert_eq!(
            keeper.next_reply().await,
            TaskReply::CancelAck {
                task_id: TaskId::from_raw(1)
            }
        );
        // Control: the task not cancelled runs to its result.
        assert_eq!(keeper.next_reply().await, result(2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_inline_task_answers_like_any_other_and_outlives_its_reader() {
        let keeper = keeper();
        let starter = keeper.starter();
        let inline = starter.start_inline(task(1, "echo"));
        assert!(
            starter.start_inline(task(1, "echo")).is_none(),
            "not started twice"
        );
        if let Some(inline) = inline {
            inline.await;
        }
        assert_eq!(
            keeper.try_next_reply(),
            Some(result(1)),
            "run by its reader"
        );

        // Its reader ends while the handler runs: the handler goes on, on a task of its own.
        let inline = starter.start_inline(task(2, "slow"));
        tokio::task::yield_now().await;
        drop(inline);
        let carried_on = tokio::time::timeout(Duration::from_secs(5), keeper.next_reply()).await;
        assert_eq!(carried_on.ok(), Some(result(2)));

        // Control: a task let go before its reader ends is not carried on.
        let inline = starter.start_inline(task(3, "slow"));
        keeper.abandon();
        drop(inline);
        let none = tokio::time::timeout(Duration::from_secs(5), keeper.next_reply()).await;
        assert!(none.is_err(), "task 3 was let go: {none:?}");
        assert_eq!(keeper.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_session_nothing_is_kept() {
        let keeper = keeper();
        keeper.keep_unacknowledged(false);
        keeper.start(task(1, "echo"));
        assert_eq!(keeper.next_reply().await, result(1));
        assert_eq!(keeper.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn reconcile_keeps_held_tasks_and_resends_their_results_first() {
        let keeper = keeper();
        keeper.keep_unacknowledged(true);
        keeper.start(task(1, "echo"));
        keeper.start(task(2, "echo"));
        let mut written = vec![keeper.next_reply().await, keeper.next_reply().await];
        written.sort_by_key(reply_task);
        assert_eq!(written, [result(1), result(2)]);
        keeper.start(task(3, "slow"));
        keeper.start(task(4, "slow"));
        tokio::task::yield_now().await;
        let request = keeper.resume_request(&grant());
        assert_eq!(request.running, ids(&[3, 4]));
        assert_eq!(request.unacked, ids(&[1, 2]));
        // The gateway still waits on 2 (its result never arrived) and 3; 1 was applied, 4 is
        // no longer wanted.
        keeper.reconcile(&ids(&[2, 3]));
        assert_eq!(keeper.next_reply().await, result(2), "re-sent first");
        assert_eq!(keeper.next_reply().await, result(3), "held task ran on");
        tokio::time::sleep(Duration::from_secs(5)).await;
        // Control: task 4 was let go, so it never answers.
        let none = tokio::time::timeout(Duration::from_secs(5), keeper.next_reply()).await;
        assert!(none.is_err(), "task 4 dropped: {none:?}");
        assert_eq!(keeper.resume_request(&grant()).unacked, ids(&[2, 3]));
    }

    #[tokio::test(start_paused = true)]
    async fn abandon_lets_go_of_everything() {
        let keeper = keeper();
        keeper.keep_unacknowledged(true);
        keeper.start(task(1, "echo"));
        assert_eq!(keeper.next_reply().await, result(1));
        keeper.start(task(2, "slow"));
        tokio::task::yield_now().await;
        assert_eq!(keeper.held(), 2, "control: one running, one unacknowledged");
        keeper.abandon();
        assert_eq!(keeper.held(), 0);
        assert!(keeper.is_idle());
        let none = tokio::time::timeout(Duration::from_secs(5), keeper.next_reply()).await;
        assert!(none.is_err(), "the abandoned task never answers");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancel_makes_the_task_answer_with_a_cancel_ack() {
        let keeper = keeper();
        keeper.start(task(1, "slow"));
        tokio::task::yield_now().await;
        assert!(!keeper.is_idle());
        keeper.cancel(TaskId::from_raw(1));
        assert_eq!(
            keeper.next_reply().await,
            TaskReply::CancelAck {
                task_id: TaskId::from_raw(1)
            }
        );
        assert!(keeper.is_idle());
    }
}
