//! The worker runtime at the far end of a memory link: answers pings itself, runs handlers,
//! stops cancelled tasks, drains, counts what it holds, and outlives a broken link.
//!
//! Handlers run on the runtime, not on a link, so a broken link leaves them running. The
//! runtime keeps every result it sent until the gateway acknowledges it; after a break it
//! resumes its session (listing the tasks it runs and the results not yet acknowledged),
//! lets go of what the gateway no longer holds and re-sends the held results first. Without a
//! session, or refused, it lets go of everything and registers afresh.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

use super::dial::Dialer;
use super::link::{Down, Frame, Link};
use crate::address::WorkerId;
use crate::delivery::{TaskId, WorkerMessage};
use crate::outcome::TaskResult;
use crate::session::{ResumeRequest, SessionGrant};
use crate::testkit::handler::{Handler, TaskCall};

/// Longest a worker whose link broke waits for the gateway to see the link end before it
/// dials again; only reached if the gateway's side is stuck.
const NOTICE: Duration = Duration::from_secs(5);

/// Worker-side counters, read by tests through [`super::MemoryWorker`].
#[derive(Debug, Default)]
pub(super) struct Stats {
    /// Tasks received and not yet answered.
    pub(super) held: AtomicU32,
    /// The most tasks ever held at once.
    pub(super) peak_held: AtomicU32,
    /// Tasks that arrived while the worker already held its capacity (refused, never run).
    pub(super) overcommits: AtomicU32,
}

/// What the worker handle and the runtime share: the current link and id, and break requests.
pub(super) struct Shared {
    worker: Mutex<WorkerId>,
    severed: Mutex<Arc<AtomicBool>>,
    /// Notified by `break_link`: the runtime cuts its link and reconnects.
    pub(super) breaks: Notify,
}

impl Shared {
    pub(super) fn new(worker: WorkerId, link: &Link) -> Self {
        Self {
            worker: Mutex::new(worker),
            severed: Mutex::new(Arc::clone(&link.severed)),
            breaks: Notify::new(),
        }
    }

    /// The worker's id on its current link.
    pub(super) fn worker(&self) -> WorkerId {
        *self.worker.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cuts the current link (the gateway's leg reports closed at once).
    pub(super) fn cut(&self) {
        self.severed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .store(true, Ordering::Release);
    }

    fn switch(&self, worker: WorkerId, link: &Link) {
        *self.worker.lock().unwrap_or_else(PoisonError::into_inner) = worker;
        *self.severed.lock().unwrap_or_else(PoisonError::into_inner) = Arc::clone(&link.severed);
    }
}

/// What a finished handler hands back to the runtime loop.
struct Finished {
    task: TaskId,
    result: TaskResult,
    cancelled: bool,
}

/// How serving one link ended.
enum LinkEnd {
    /// The gateway closed it, the worker drained, or the gateway is gone: the runtime stops.
    Closed,
    /// `break_link`: the runtime reconnects.
    Broken,
}

/// What woke the serving loop.
enum Wake {
    Frozen,
    Broken,
    Finished(Result<Finished, JoinError>),
    Inbound(Option<Down>),
}

/// One worker process: its tasks, its unacknowledged results, and how to dial its gateway.
pub(super) struct Runtime {
    pub(super) capacity: u32,
    pub(super) handler: Handler,
    pub(super) frozen: CancellationToken,
    pub(super) stats: Arc<Stats>,
    pub(super) shared: Arc<Shared>,
    pub(super) dialer: Dialer,
    running: JoinSet<Finished>,
    cancels: HashMap<TaskId, CancellationToken>,
    /// Results sent and not yet acknowledged.
    unacked: HashMap<TaskId, TaskResult>,
    /// Tasks let go (the gateway no longer holds them): their handlers' answers are dropped.
    let_go: HashSet<TaskId>,
    /// Held results to send first on the next link.
    resend: Vec<TaskId>,
    draining: bool,
}

impl Runtime {
    /// A runtime with no task yet.
    pub(super) fn new(
        capacity: u32,
        handler: Handler,
        frozen: CancellationToken,
        stats: Arc<Stats>,
        shared: Arc<Shared>,
        dialer: Dialer,
    ) -> Self {
        Self {
            capacity,
            handler,
            frozen,
            stats,
            shared,
            dialer,
            running: JoinSet::new(),
            cancels: HashMap::new(),
            unacked: HashMap::new(),
            let_go: HashSet::new(),
            resend: Vec::new(),
            draining: false,
        }
    }

    /// Runs until the gateway closes the link, the worker finishes a drain, a reconnection
    /// fails, or it is aborted.
    pub(super) async fn run(mut self, mut link: Link, mut session: Option<SessionGrant>) {
        loop {
            if let LinkEnd::Closed = self.serve(&mut link).await {
                return;
            }
            let closed = link.cut();
            // Like a socket's peer seeing the reset, the gateway sees the link end before the
            // worker's next connection arrives, so a session is suspended, then resumed.
            let _ = tokio::time::timeout(NOTICE, closed.cancelled()).await;
            match self.reconnect(session.take()).await {
                Some((next, grant)) => {
                    link = next;
                    session = grant;
                }
                None => return,
            }
        }
    }

    /// Resumes `session` if there is one, else (or refused) registers afresh.
    async fn reconnect(
        &mut self,
        session: Option<SessionGrant>,
    ) -> Option<(Link, Option<SessionGrant>)> {
        if let Some(grant) = session {
            match self.dialer.resume(self.resume_request(&grant)).await {
                Ok((link, held)) => {
                    self.reconcile(&held);
                    self.shared.switch(grant.session_id, &link);
                    return Some((link, Some(grant)));
                }
                Err(refusal) => tracing::debug!(%refusal, "resume refused; registering afresh"),
            }
        }
        self.abandon();
        match self.dialer.register().await {
            Ok(opened) => {
                self.shared.switch(opened.worker, &opened.link);
                Some((opened.link, opened.session))
            }
            Err(refusal) => {
                tracing::debug!(%refusal, "registering afresh was refused; the worker stops");
                None
            }
        }
    }

    fn resume_request(&self, grant: &SessionGrant) -> ResumeRequest {
        let forgets = self.dialer.policy.forgets_tasks_on_resume;
        let running = self
            .cancels
            .keys()
            .filter(|task| !forgets && !self.let_go.contains(task))
            .copied()
            .collect();
        let unacked = self.unacked.keys().filter(|_| !forgets).copied().collect();
        ResumeRequest {
            session_id: grant.session_id,
            secret: grant.secret.as_bytes().to_vec(),
            running,
            unacked,
        }
    }

    /// Applies a resume's `held`: lets go of running tasks and results the gateway no longer
    /// holds, and queues the held results for re-sending.
    fn reconcile(&mut self, held: &[TaskId]) {
        let held: HashSet<TaskId> = held.iter().copied().collect();
        for (task, cancelled) in &self.cancels {
            if !held.contains(task) {
                cancelled.cancel();
                self.let_go.insert(*task);
            }
        }
        self.unacked.retain(|task, _| held.contains(task));
        self.resend = self.unacked.keys().copied().collect();
    }

    /// Lets go of every task and result (a fresh registration follows).
    fn abandon(&mut self) {
        for (task, cancelled) in &self.cancels {
            cancelled.cancel();
            self.let_go.insert(*task);
        }
        self.unacked.clear();
        self.resend.clear();
    }

    /// Serves one link until it closes or breaks.
    async fn serve(&mut self, link: &mut Link) -> LinkEnd {
        for task in std::mem::take(&mut self.resend) {
            if let Some(result) = self.unacked.get(&task).cloned()
                && link
                    .outbox
                    .send(Frame::Result { task, result })
                    .await
                    .is_err()
            {
                return LinkEnd::Closed;
            }
        }
        loop {
            if self.draining && self.running.is_empty() {
                let _ = link.outbox.send(Frame::Goodbye).await;
                return LinkEnd::Closed;
            }
            let wake = tokio::select! {
                biased;
                () = self.frozen.cancelled() => Wake::Frozen,
                () = self.shared.breaks.notified() => Wake::Broken,
                Some(joined) = self.running.join_next(), if !self.running.is_empty() => {
                    Wake::Finished(joined)
                }
                message = link.inbox.recv() => Wake::Inbound(message),
            };
            let frame = match wake {
                Wake::Frozen => {
                    // Stop reading and answering, but keep both ends of the link (and the
                    // running handlers) alive until the worker handle is dropped.
                    std::future::pending::<()>().await;
                    return LinkEnd::Closed;
                }
                Wake::Broken => return LinkEnd::Broken,
                Wake::Finished(joined) => match joined {
                    Ok(finished) => self.finished(finished),
                    Err(_) => None,
                },
                Wake::Inbound(None) => return LinkEnd::Closed,
                Wake::Inbound(Some(Down::ResultsAck(task))) => {
                    self.unacked.remove(&task);
                    None
                }
                Wake::Inbound(Some(Down::Message(message))) => self.received(message),
            };
            if let Some(frame) = frame
                && link.outbox.send(frame).await.is_err()
            {
                return LinkEnd::Closed;
            }
        }
    }

    /// A handler ended: its answer, unless the task was let go.
    fn finished(&mut self, finished: Finished) -> Option<Frame> {
        let Finished {
            task,
            result,
            cancelled,
        } = finished;
        self.cancels.remove(&task);
        self.stats.held.fetch_sub(1, Ordering::AcqRel);
        if self.let_go.remove(&task) {
            return None;
        }
        if cancelled {
            return Some(Frame::CancelAck { task });
        }
        self.unacked.insert(task, result.clone());
        Some(Frame::Result { task, result })
    }

    /// A message from core: the frame to answer with, if any.
    fn received(&mut self, message: WorkerMessage) -> Option<Frame> {
        match message {
            WorkerMessage::Ping { seq } => Some(Frame::Pong { seq }),
            WorkerMessage::Task(task) => {
                let held = self.stats.held.load(Ordering::Acquire);
                if held >= self.capacity {
                    // Never run more than the capacity, and never hide a gateway that
                    // over-delivers: answer at once with a retryable failure, and count it.
                    self.stats.overcommits.fetch_add(1, Ordering::AcqRel);
                    return Some(Frame::Result {
                        task: task.task_id,
                        result: TaskResult::Failure {
                            message: format!(
                                "worker over capacity: holds {held} of {}",
                                self.capacity
                            ),
                            retryable: true,
                        },
                    });
                }
                let held = self.stats.held.fetch_add(1, Ordering::AcqRel) + 1;
                self.stats.peak_held.fetch_max(held, Ordering::AcqRel);
                let cancelled = CancellationToken::new();
                self.cancels.insert(task.task_id, cancelled.clone());
                let handler = self.handler.clone();
                self.running.spawn(async move {
                    let call = TaskCall {
                        activity_type: task.activity_type,
                        input: task.input,
                        cancelled: cancelled.clone(),
                    };
                    let result = handler.call(call).await;
                    Finished {
                        task: task.task_id,
                        result,
                        cancelled: cancelled.is_cancelled(),
                    }
                });
                None
            }
            WorkerMessage::Cancel { task_id, .. } => {
                if let Some(cancelled) = self.cancels.get(&task_id) {
                    cancelled.cancel();
                }
                None
            }
            WorkerMessage::Drain | WorkerMessage::ShuttingDown => {
                self.draining = true;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::Core;
    use crate::registration::{CallerIdentity, Registration};
    use crate::registry::Registry;
    use crate::session::ResumeSecret;
    use crate::testkit::conformance_config;
    use crate::testkit::memory::dial::Policy;

    fn runtime(forgets_tasks_on_resume: bool) -> Runtime {
        let core = Core::start(Registry::builder(), conformance_config());
        let dialer = Dialer {
            core,
            caller: CallerIdentity::trusted("runtime-test"),
            registration: Registration::default(),
            policy: Policy {
                announces_capacity: false,
                ignores_departures: false,
                grants_sessions: true,
                forgets_tasks_on_resume,
            },
            stopped: CancellationToken::new(),
        };
        let shared = Shared {
            worker: Mutex::new(WorkerId::from_raw(7)),
            severed: Mutex::new(Arc::new(AtomicBool::new(false))),
            breaks: Notify::new(),
        };
        Runtime::new(
            2,
            Handler::echo(),
            CancellationToken::new(),
            Arc::default(),
            Arc::new(shared),
            dialer,
        )
    }

    fn grant() -> SessionGrant {
        SessionGrant {
            session_id: WorkerId::from_raw(7),
            secret: ResumeSecret::from_slice(&[9; 32]).expect("32 bytes"),
            grace: Duration::from_secs(5),
        }
    }

    fn sorted(mut tasks: Vec<TaskId>) -> Vec<TaskId> {
        tasks.sort_by_key(|task| task.get());
        tasks
    }

    /// Two tasks running (1, 2) and two results unacknowledged (3, 4).
    fn with_work(runtime: &mut Runtime) -> [CancellationToken; 2] {
        let tokens = [CancellationToken::new(), CancellationToken::new()];
        for (raw, token) in [1, 2].into_iter().zip(&tokens) {
            runtime.cancels.insert(TaskId::from_raw(raw), token.clone());
        }
        for raw in [3, 4] {
            let output = bytes::Bytes::from(format!("result {raw}"));
            runtime
                .unacked
                .insert(TaskId::from_raw(raw), TaskResult::Success(output));
        }
        tokens
    }

    #[tokio::test(start_paused = true)]
    async fn a_resume_lists_running_and_unacked_tasks_and_keeps_only_what_is_held() {
        let mut runtime = runtime(false);
        let [one, two] = with_work(&mut runtime);
        let request = runtime.resume_request(&grant());
        assert_eq!(request.session_id, WorkerId::from_raw(7));
        assert_eq!(request.secret, vec![9; 32]);
        assert_eq!(sorted(request.running), [1, 2].map(TaskId::from_raw));
        assert_eq!(sorted(request.unacked), [3, 4].map(TaskId::from_raw));

        runtime.reconcile(&[TaskId::from_raw(1), TaskId::from_raw(3)]);
        assert!(!one.is_cancelled(), "a held running task keeps running");
        assert!(two.is_cancelled(), "a running task not held is cancelled");
        assert_eq!(runtime.let_go, HashSet::from([TaskId::from_raw(2)]));
        assert_eq!(
            runtime.resend,
            [TaskId::from_raw(3)],
            "only the held result is re-sent"
        );
        assert!(
            !runtime.unacked.contains_key(&TaskId::from_raw(4)),
            "a result not held is forgotten"
        );
        // Control: a task let go is listed in no later resume.
        let again = runtime.resume_request(&grant());
        assert_eq!(again.running, [TaskId::from_raw(1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn abandoning_lets_go_of_everything_and_a_forgetful_runtime_lists_nothing() {
        let mut runtime = runtime(true);
        let tokens = with_work(&mut runtime);
        // (The runtime that does not forget lists its tasks: the test above.)
        let request = runtime.resume_request(&grant());
        assert!(request.running.is_empty() && request.unacked.is_empty());

        assert!(
            runtime.let_go.is_empty() && !tokens.iter().any(CancellationToken::is_cancelled),
            "control: nothing is let go before abandoning"
        );
        runtime.abandon();
        assert!(tokens.iter().all(CancellationToken::is_cancelled));
        assert_eq!(runtime.let_go.len(), 2);
        assert!(runtime.unacked.is_empty() && runtime.resend.is_empty());
    }
}
