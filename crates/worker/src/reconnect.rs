//! A worker over any [`Link`]: the first registration, then the reconnect loop, which resumes
//! the session first when there is one.

use std::time::Duration;

use switchyard_core::{ResumeRequest, SessionGrant, WorkerId};
use tokio::time::Instant;

use crate::{
    ConnectionContext, ConnectionEnd, Link, LinkError, Registered, TaskKeeper, TaskRunner,
    WorkerError, WorkerHandle, WorkerOptions,
};

/// A registered worker on link `L`; [`Worker::run`] serves it until it stops for good.
pub struct Worker<L: Link> {
    link: L,
    options: WorkerOptions,
    runner: TaskRunner,
    keeper: TaskKeeper,
    handle: WorkerHandle,
    first: Option<L::Connection>,
    registered: Registered,
}

impl<L: Link> std::fmt::Debug for Worker<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("transport", &L::TRANSPORT)
            .field("registered", &self.registered)
            .finish_non_exhaustive()
    }
}

/// A session whose connection was lost, resumable until `until` on the worker's clock.
struct LostSession {
    grant: SessionGrant,
    until: Instant,
}

impl LostSession {
    /// The longest wait between resume attempts: at least two attempts fit in the grace.
    fn max_delay(&self) -> Duration {
        self.grant.grace / 3
    }
}

impl<L: Link> Worker<L> {
    /// Validates `options`, then opens and registers once over `link` (no retry here).
    pub async fn connect(link: L, options: WorkerOptions) -> Result<Self, WorkerError> {
        options.validate()?;
        let runner = TaskRunner::new(options.activities.clone(), options.max_concurrency);
        let keeper = TaskKeeper::new(runner.clone());
        let handle = WorkerHandle::new(
            L::TRANSPORT,
            (L::CAN_DRAIN, L::CAN_RESIZE),
            runner.clone(),
            options.max_concurrency,
        );
        let (connection, registered) = open(&link, &options, None)
            .await
            .map_err(|failure| failure.error)?;
        keeper.keep_unacknowledged(registered.session.is_some());
        handle.set_registered(Some(registered.worker_id));
        Ok(Self {
            link,
            options,
            runner,
            keeper,
            handle,
            first: Some(connection),
            registered,
        })
    }

    /// A handle to drain, resize, stop or observe the worker while it runs.
    pub fn handle(&self) -> WorkerHandle {
        self.handle.clone()
    }

    /// The id of the first registration (a fresh registration gets a new id; a resume keeps
    /// it).
    pub fn worker_id(&self) -> WorkerId {
        self.registered.worker_id
    }

    /// The task queue the gateway registered the worker in (never empty).
    pub fn task_queue(&self) -> &str {
        &self.registered.task_queue
    }

    /// The link, for transport-specific controls.
    pub fn link(&self) -> &L {
        &self.link
    }

    /// Serves until a requested drain completes or the worker is stopped (`Ok`), or a
    /// reconnection fails for good (`Err`, see [`WorkerError::is_permanent`]). After the
    /// gateway shuts down or the connection is lost it reconnects with the options'
    /// [`Backoff`](switchyard_core::Backoff), logging what happened and when it tries again.
    ///
    /// A lost connection with a session is resumed within its grace (the waits capped so at
    /// least two attempts fit in it): running tasks keep running through the break and
    /// unacknowledged results are sent again. After the grace, a refused resume, or without a
    /// session, the worker registers afresh and lets go of every task it held.
    pub async fn run(mut self) -> Result<(), WorkerError> {
        let stop = self.handle.shutdown_token();
        let drain = self.handle.drain_requested().clone();
        let mut attempt: u32 = 0;
        let mut lost: Option<LostSession> = None;
        let mut at_once = false;
        loop {
            let connection = match self.first.take() {
                Some(connection) => connection,
                None => {
                    if lost.as_ref().is_some_and(|l| Instant::now() >= l.until) {
                        lost = None;
                        self.let_go("the reconnect grace passed");
                    }
                    let mut delay = self.options.backoff.delay(attempt, &mut rand::rng());
                    if let Some(lost) = &lost {
                        delay = delay.min(lost.max_delay());
                    }
                    if std::mem::take(&mut at_once) {
                        delay = Duration::ZERO;
                    }
                    attempt = attempt.saturating_add(1);
                    let request: Option<ResumeRequest> = lost
                        .as_ref()
                        .map(|lost| self.keeper.resume_request(&lost.grant));
                    // A resize since the options were set is the capacity the gateway kept for
                    // a session, and the one to register with afresh: a link opens with it (a
                    // QUIC resume grants a stream per slot of it before the gateway answers).
                    self.options.max_concurrency = self.handle.current_capacity();
                    let opened = tokio::select! {
                        () = stop.cancelled() => return Ok(()),
                        // Nothing reaches a disconnected worker, so a drain ends it now; what
                        // it still held goes back to the gateway.
                        () = drain.cancelled() => return Ok(()),
                        opened = async {
                            tokio::time::sleep(delay).await;
                            open(&self.link, &self.options, request.as_ref()).await
                        } => opened,
                    };
                    match opened {
                        Ok((connection, registered)) => {
                            match (&request, &registered.held) {
                                (Some(_), Some(held)) => {
                                    tracing::info!(worker = %registered.worker_id, attempt,
                                        held = held.len(), transport = L::TRANSPORT,
                                        "resumed the session");
                                    self.keeper.reconcile(held);
                                }
                                _ => {
                                    tracing::info!(worker = %registered.worker_id, attempt,
                                        transport = L::TRANSPORT, "reconnected to the gateway");
                                    self.let_go("registered afresh");
                                }
                            }
                            lost = None;
                            self.keeper
                                .keep_unacknowledged(registered.session.is_some());
                            self.handle.set_registered(Some(registered.worker_id));
                            self.registered = registered;
                            attempt = 0;
                            connection
                        }
                        Err(failure) if failure.resume_refused => {
                            tracing::warn!(error = %failure.error,
                                "session resume refused; registering afresh");
                            lost = None;
                            self.let_go("the resume was refused");
                            at_once = true;
                            continue;
                        }
                        Err(failure) if failure.error.is_permanent() => return Err(failure.error),
                        Err(failure) => {
                            let retry_within = self.options.backoff.ceiling(attempt);
                            tracing::warn!(error = %failure.error, attempt, ?retry_within,
                                resuming = lost.is_some(), "reconnection failed; retrying");
                            continue;
                        }
                    }
                }
            };
            let context = ConnectionContext {
                options: &self.options,
                runner: &self.runner,
                keeper: &self.keeper,
                handle: &self.handle,
            };
            // Dropping the connection on stop closes it; the keeper stops the handlers when
            // the worker is dropped.
            let ended = tokio::select! {
                ended = self.link.serve(connection, context) => ended,
                () = stop.cancelled() => ConnectionEnd::Drained,
            };
            self.handle.set_registered(None);
            let retry_within = self.options.backoff.ceiling(attempt);
            let mut resumable = true;
            match ended {
                ConnectionEnd::Drained => return Ok(()),
                ConnectionEnd::Failed(error) if error.is_permanent() => {
                    return Err(WorkerError::link(L::TRANSPORT, error));
                }
                _ if drain.is_cancelled() => {
                    tracing::info!("connection ended while draining; worker stopping");
                    return Ok(());
                }
                ConnectionEnd::ComeBack {
                    reason,
                    shutting_down: true,
                } => {
                    // A session does not outlive its gateway process.
                    resumable = false;
                    tracing::info!(%reason, ?retry_within,
                        "lost the gateway: it is shutting down; reconnecting with backoff");
                }
                ConnectionEnd::ComeBack { reason, .. } => {
                    tracing::warn!(%reason, ?retry_within, "lost the gateway; reconnecting")
                }
                ConnectionEnd::Failed(error) => {
                    tracing::warn!(%error, ?retry_within, "lost the gateway; reconnecting")
                }
            }
            match self.registered.session.clone() {
                Some(grant) if resumable && self.options.resume => {
                    lost = Some(LostSession {
                        until: Instant::now() + grant.grace,
                        grant,
                    });
                }
                _ => self.let_go("the connection had no session"),
            }
        }
    }

    /// Lets go of every task held (the gateway dispatches them again), saying why.
    fn let_go(&self, why: &'static str) {
        let held = self.keeper.held();
        if held > 0 {
            tracing::info!(held, why, "letting go of the tasks held");
        }
        self.keeper.abandon();
    }
}

/// A failed open, with whether it was a refused resume.
struct OpenFailure {
    error: WorkerError,
    resume_refused: bool,
}

/// One attempt to open and register (or resume), bounded by the connect timeout.
async fn open<L: Link>(
    link: &L,
    options: &WorkerOptions,
    resume: Option<&ResumeRequest>,
) -> Result<(L::Connection, Registered), OpenFailure> {
    match tokio::time::timeout(options.connect_timeout, link.open(options, resume)).await {
        Ok(Ok(opened)) => Ok(opened),
        Ok(Err(error)) => Err(OpenFailure {
            resume_refused: error.is_resume_refused(),
            error: WorkerError::link(L::TRANSPORT, error),
        }),
        Err(_) => Err(OpenFailure {
            error: WorkerError::Timeout(options.connect_timeout),
            resume_refused: false,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::time::Duration;

    use bytes::Bytes;
    use switchyard_core::{ActivityContext, ActivityError, Backoff};
    use tokio::time::Instant;

    use super::*;
    use crate::TaskReply;
    use switchyard_core::TaskId;

    #[derive(Debug, thiserror::Error)]
    #[error("scripted failure")]
    struct Scripted {
        permanent: bool,
    }

    impl LinkError for Scripted {
        fn is_permanent(&self) -> bool {
            self.permanent
        }
    }

    enum Step {
        Open(Result<(), bool>),
        End(ConnectionEnd<Scripted>),
    }

    /// A link that follows a script and records when each open happened.
    struct ScriptedLink {
        script: Mutex<VecDeque<Step>>,
        opens: Mutex<Vec<Instant>>,
        next_id: Mutex<u64>,
    }

    impl ScriptedLink {
        fn new(steps: impl IntoIterator<Item = Step>) -> Self {
            Self {
                script: Mutex::new(steps.into_iter().collect()),
                opens: Mutex::new(Vec::new()),
                next_id: Mutex::new(0),
            }
        }

        fn next(&self) -> Option<Step> {
            self.script.lock().ok()?.pop_front()
        }
    }

    impl Link for ScriptedLink {
        type Connection = ();
        type Error = Scripted;
        const TRANSPORT: &'static str = "scripted";
        const CAN_DRAIN: bool = true;
        const CAN_RESIZE: bool = false;

        async fn open(
            &self,
            _: &WorkerOptions,
            _: Option<&ResumeRequest>,
        ) -> Result<((), Registered), Scripted> {
            if let Ok(mut opens) = self.opens.lock() {
                opens.push(Instant::now());
            }
            match self.next() {
                Some(Step::Open(Ok(()))) | None => {
                    let mut id = self
                        .next_id
                        .lock()
                        .map_err(|_| Scripted { permanent: true })?;
                    *id += 1;
                    let registered = Registered::new(WorkerId::from_raw(*id), "q".into());
                    Ok(((), registered))
                }
                Some(Step::Open(Err(permanent))) => Err(Scripted { permanent }),
                Some(Step::End(_)) => Err(Scripted { permanent: true }),
            }
        }

        async fn serve(&self, (): (), _: ConnectionContext<'_>) -> ConnectionEnd<Scripted> {
            match self.next() {
                Some(Step::End(end)) => end,
                _ => std::future::pending().await,
            }
        }
    }

    fn options() -> WorkerOptions {
        let mut options = WorkerOptions::default();
        options.namespaces(["ns"]);
        options.activity("echo", |_: ActivityContext, input: Bytes| async move {
            Ok::<_, ActivityError>(input)
        });
        options.backoff = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        };
        options
    }

    fn come_back() -> Step {
        Step::End(ConnectionEnd::ComeBack {
            reason: "lost".into(),
            shutting_down: false,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_connection_comes_back_under_a_new_registration() {
        // After the loss the second connection never ends by itself.
        let link = ScriptedLink::new([Step::Open(Ok(())), come_back(), Step::Open(Ok(()))]);
        let Ok(worker) = Worker::connect(link, options()).await else {
            panic!("first registration");
        };
        assert_eq!(worker.worker_id(), WorkerId::from_raw(1));
        let handle = worker.handle();
        let mut registrations = handle.registrations();
        let run = tokio::spawn(worker.run());
        let second = registrations
            .wait_for(|id| *id == Some(WorkerId::from_raw(2)))
            .await
            .map(|id| *id);
        assert_eq!(second.ok(), Some(Some(WorkerId::from_raw(2))));
        // Control: the worker is still running until it is stopped.
        assert!(!run.is_finished());
        handle.shutdown();
        assert!(matches!(run.await, Ok(Ok(()))));
        assert_eq!(handle.worker_id(), None, "no registration after the stop");
    }

    #[tokio::test(start_paused = true)]
    async fn the_waits_grow_with_each_failed_attempt() {
        let link = std::sync::Arc::new(ScriptedLink::new([
            Step::Open(Ok(())),
            come_back(),
            Step::Open(Err(false)),
            Step::Open(Err(false)),
            Step::Open(Err(false)),
            Step::Open(Ok(())),
            Step::End(ConnectionEnd::Drained),
        ]));
        let Ok(worker) =
            Worker::connect(SharedScript(std::sync::Arc::clone(&link)), options()).await
        else {
            panic!("first registration");
        };
        assert!(matches!(worker.run().await, Ok(())));
        let opens = link.opens.lock().map(|o| o.clone()).unwrap_or_default();
        assert_eq!(
            opens.len(),
            5,
            "one first open and four reconnection attempts"
        );
        let waits: Vec<Duration> = opens.windows(2).map(|w| w[1] - w[0]).collect();
        let backoff = options().backoff;
        for (attempt, wait) in waits.iter().enumerate() {
            let ceiling = backoff.ceiling(u32::try_from(attempt).unwrap_or(u32::MAX));
            assert!(
                *wait >= ceiling / 2 && *wait <= ceiling,
                "attempt {attempt}: {wait:?}"
            );
        }
        // Control: the fourth wait cannot fit in the first one's range.
        assert!(waits[3] > backoff.ceiling(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_permanent_failure_stops_the_worker_and_a_transient_one_does_not() {
        let link = ScriptedLink::new([
            Step::Open(Ok(())),
            Step::End(ConnectionEnd::Failed(Scripted { permanent: false })),
            Step::Open(Err(true)),
        ]);
        let Ok(worker) = Worker::connect(link, options()).await else {
            panic!("first registration");
        };
        let ended = worker.run().await;
        let Err(error) = ended else {
            panic!("a permanent refusal ends the worker");
        };
        assert!(error.is_permanent());
        // Control: the transient failure before it did not end the worker; the permanent
        // one came from the reconnection attempt.
        assert!(error.link_error::<Scripted>().is_some_and(|e| e.permanent));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_run_and_an_unsupported_resize_is_typed() {
        let Ok(worker) = Worker::connect(ScriptedLink::new([]), options()).await else {
            panic!("first registration");
        };
        let handle = worker.handle();
        assert!(matches!(
            handle.set_max_concurrency(4),
            Err(WorkerError::Unsupported {
                operation: "set_max_concurrency",
                transport: "scripted"
            })
        ));
        assert!(
            handle.drain().is_ok(),
            "control: the scripted link can drain"
        );
        handle.shutdown();
        assert!(matches!(worker.run().await, Ok(())));
    }

    /// A link that can resize: records the capacity each open was made with; its first
    /// connection is lost at once, the next ones serve until the worker stops.
    #[derive(Default)]
    struct ResizableLink {
        opened_with: Mutex<Vec<u32>>,
    }

    impl Link for std::sync::Arc<ResizableLink> {
        type Connection = ();
        type Error = Scripted;
        const TRANSPORT: &'static str = "resizable";
        const CAN_DRAIN: bool = true;
        const CAN_RESIZE: bool = true;

        async fn open(
            &self,
            options: &WorkerOptions,
            _: Option<&ResumeRequest>,
        ) -> Result<((), Registered), Scripted> {
            let mut opened = self
                .opened_with
                .lock()
                .map_err(|_| Scripted { permanent: true })?;
            opened.push(options.max_concurrency);
            let id = u64::try_from(opened.len()).unwrap_or(u64::MAX);
            Ok(((), Registered::new(WorkerId::from_raw(id), "q".into())))
        }

        async fn serve(&self, (): (), _: ConnectionContext<'_>) -> ConnectionEnd<Scripted> {
            let first = self
                .opened_with
                .lock()
                .map(|o| o.len() == 1)
                .unwrap_or(false);
            if first {
                return ConnectionEnd::ComeBack {
                    reason: "lost".into(),
                    shutting_down: false,
                };
            }
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconnection_opens_with_the_capacity_of_the_last_resize() {
        let link = std::sync::Arc::new(ResizableLink::default());
        let mut options = options();
        options.max_concurrency = 4;
        let Ok(worker) = Worker::connect(std::sync::Arc::clone(&link), options).await else {
            panic!("first registration");
        };
        let handle = worker.handle();
        assert!(handle.set_max_concurrency(2000).is_ok());
        let mut registrations = handle.registrations();
        let run = tokio::spawn(worker.run());
        let second = registrations
            .wait_for(|id| *id == Some(WorkerId::from_raw(2)))
            .await
            .map(|id| *id);
        assert_eq!(second.ok(), Some(Some(WorkerId::from_raw(2))));
        let opened = link
            .opened_with
            .lock()
            .map(|o| o.clone())
            .unwrap_or_default();
        // Control: the first open, before the resize, used the options' capacity.
        assert_eq!(opened, vec![4, 2000]);
        handle.shutdown();
        assert!(matches!(run.await, Ok(Ok(()))));
    }

    /// A link shared with the test, so the test can read what it recorded.
    struct SharedScript(std::sync::Arc<ScriptedLink>);

    impl Link for SharedScript {
        type Connection = ();
        type Error = Scripted;
        const TRANSPORT: &'static str = "scripted";
        const CAN_DRAIN: bool = true;
        const CAN_RESIZE: bool = false;

        async fn open(
            &self,
            options: &WorkerOptions,
            resume: Option<&ResumeRequest>,
        ) -> Result<((), Registered), Scripted> {
            self.0.open(options, resume).await
        }

        async fn serve(
            &self,
            connection: (),
            context: ConnectionContext<'_>,
        ) -> ConnectionEnd<Scripted> {
            self.0.serve(connection, context).await
        }
    }

    /// What a [`SessionLink`] open answers.
    enum Answer {
        /// A fresh registration under this id, with a session.
        Fresh(u64),
        /// The resume is accepted; the gateway still holds these tasks.
        Resumed(Vec<u64>),
        /// The resume is refused.
        Refused,
        /// The gateway cannot be reached.
        Unreachable,
    }

    /// What one connection of a [`SessionLink`] does before it ends.
    struct Serve {
        /// Tasks the gateway pushes.
        start: Vec<(u64, &'static str)>,
        /// Replies written before the connection ends.
        write: usize,
        /// How it ends; `None` serves until the worker stops.
        end: Option<ConnectionEnd<Scripted>>,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("scripted session failure")]
    struct SessionFailure {
        refused: bool,
    }

    impl LinkError for SessionFailure {
        fn is_permanent(&self) -> bool {
            false
        }

        fn is_resume_refused(&self) -> bool {
            self.refused
        }
    }

    /// A link with sessions that follows a script and records the resume requests it got and
    /// the replies each connection wrote.
    #[derive(Default)]
    struct SessionLink {
        answers: Mutex<VecDeque<Answer>>,
        serves: Mutex<VecDeque<Serve>>,
        requests: Mutex<Vec<Option<ResumeRequest>>>,
        written: Mutex<Vec<(usize, TaskReply)>>,
        connections: Mutex<usize>,
        last_id: Mutex<u64>,
    }

    fn grant(id: u64) -> SessionGrant {
        SessionGrant {
            session_id: WorkerId::from_raw(id),
            secret: switchyard_core::ResumeSecret::from_slice(&[id as u8; 32])
                .unwrap_or_else(|| unreachable!("32 bytes")),
            grace: Duration::from_secs(5),
        }
    }

    impl Link for std::sync::Arc<SessionLink> {
        type Connection = ();
        type Error = SessionFailure;
        const TRANSPORT: &'static str = "session";
        const CAN_DRAIN: bool = false;
        const CAN_RESIZE: bool = false;

        async fn open(
            &self,
            _: &WorkerOptions,
            resume: Option<&ResumeRequest>,
        ) -> Result<((), Registered), SessionFailure> {
            self.requests.lock().unwrap().push(resume.cloned());
            let answer = self.answers.lock().unwrap().pop_front();
            let last = *self.last_id.lock().unwrap();
            let registered = match answer {
                Some(Answer::Fresh(id)) => Registered {
                    session: Some(grant(id)),
                    ..Registered::new(WorkerId::from_raw(id), "q".into())
                },
                Some(Answer::Resumed(held)) => Registered {
                    session: Some(grant(last)),
                    held: Some(held.into_iter().map(TaskId::from_raw).collect()),
                    ..Registered::new(WorkerId::from_raw(last), "q".into())
                },
                Some(Answer::Refused) => return Err(SessionFailure { refused: true }),
                Some(Answer::Unreachable) | None => {
                    return Err(SessionFailure { refused: false });
                }
            };
            *self.last_id.lock().unwrap() = registered.worker_id.get();
            Ok(((), registered))
        }

        async fn serve(
            &self,
            (): (),
            context: ConnectionContext<'_>,
        ) -> ConnectionEnd<SessionFailure> {
            let connection = {
                let mut connections = self.connections.lock().unwrap();
                *connections += 1;
                *connections
            };
            let step = self.serves.lock().unwrap().pop_front();
            let Some(step) = step else {
                return std::future::pending().await;
            };
            for (id, activity) in step.start {
                context.keeper.start(task(id, activity));
            }
            for _ in 0..step.write {
                let reply = context.keeper.next_reply().await;
                self.written.lock().unwrap().push((connection, reply));
            }
            match step.end {
                Some(ConnectionEnd::Drained) => ConnectionEnd::Drained,
                Some(ConnectionEnd::ComeBack {
                    reason,
                    shutting_down,
                }) => ConnectionEnd::ComeBack {
                    reason,
                    shutting_down,
                },
                Some(ConnectionEnd::Failed(_)) => {
                    ConnectionEnd::Failed(SessionFailure { refused: false })
                }
                None => std::future::pending().await,
            }
        }
    }

    fn task(id: u64, activity_type: &str) -> switchyard_core::ActivityTask {
        switchyard_core::ActivityTask {
            task_id: TaskId::from_raw(id),
            namespace: "ns".into(),
            task_queue: "q".into(),
            activity_type: activity_type.into(),
            input: Bytes::from_static(b"in"),
            attempt: 1,
            deadline: std::time::SystemTime::UNIX_EPOCH,
        }
    }

    fn session_options() -> WorkerOptions {
        let mut options = options();
        options.activity("slow", |ctx: ActivityContext, input: Bytes| async move {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(2)) => Ok(input),
                () = ctx.cancelled() => Err(ActivityError::retryable("stopped")),
            }
        });
        options.backoff = Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(60),
        };
        options
    }

    fn lost() -> Option<ConnectionEnd<Scripted>> {
        Some(ConnectionEnd::ComeBack {
            reason: "link blip".into(),
            shutting_down: false,
        })
    }

    fn result(id: u64) -> TaskReply {
        TaskReply::Result {
            task_id: TaskId::from_raw(id),
            result: switchyard_core::TaskResult::Success(Bytes::from_static(b"in")),
        }
    }

    fn ids(raw: &[u64]) -> Vec<TaskId> {
        raw.iter().copied().map(TaskId::from_raw).collect()
    }

    /// Runs `link` as a worker until its script ends in a drain, or `limit` passes.
    async fn run_script(link: &std::sync::Arc<SessionLink>, options: WorkerOptions) -> WorkerId {
        let Ok(worker) = Worker::connect(std::sync::Arc::clone(link), options).await else {
            panic!("first registration");
        };
        let first = worker.worker_id();
        let handle = worker.handle();
        let run = tokio::spawn(worker.run());
        if tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .is_err()
        {
            handle.shutdown();
        }
        first
    }

    #[tokio::test(start_paused = true)]
    async fn a_resume_within_the_grace_keeps_a_running_task_and_resends_its_result() {
        let link = std::sync::Arc::new(SessionLink::default());
        *link.answers.lock().unwrap() = [Answer::Fresh(1), Answer::Resumed(vec![1, 2])].into();
        *link.serves.lock().unwrap() = [
            // Task 1's result is written but never acknowledged; task 2 still runs.
            Serve {
                start: vec![(1, "echo"), (2, "slow")],
                write: 1,
                end: lost(),
            },
            Serve {
                start: vec![],
                write: 2,
                end: Some(ConnectionEnd::Drained),
            },
        ]
        .into();
        run_script(&link, session_options()).await;
        let requests = link.requests.lock().unwrap().clone();
        assert_eq!(requests.len(), 2);
        let Some(resume) = &requests[1] else {
            panic!("the reconnection resumes: {requests:?}");
        };
        assert_eq!(resume.session_id, WorkerId::from_raw(1));
        assert_eq!(resume.secret, vec![1; 32]);
        assert_eq!(resume.running, ids(&[2]));
        assert_eq!(resume.unacked, ids(&[1]));
        let written = link.written.lock().unwrap().clone();
        // The unacknowledged result goes again, first; the task that ran through the break
        // answers on the new connection with its result (control: not a cancel ack).
        assert_eq!(written, [(1, result(1)), (2, result(1)), (2, result(2))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_resume_registers_afresh_and_lets_go_of_what_it_held() {
        let link = std::sync::Arc::new(SessionLink::default());
        *link.answers.lock().unwrap() =
            [Answer::Fresh(1), Answer::Refused, Answer::Fresh(2)].into();
        *link.serves.lock().unwrap() = [
            Serve {
                start: vec![(1, "echo"), (2, "slow")],
                write: 1,
                end: lost(),
            },
            Serve {
                start: vec![(3, "echo")],
                write: 1,
                end: Some(ConnectionEnd::Drained),
            },
        ]
        .into();
        run_script(&link, session_options()).await;
        let requests = link.requests.lock().unwrap().clone();
        assert_eq!(requests.len(), 3);
        assert!(requests[1].is_some(), "control: a resume was tried first");
        assert!(requests[2].is_none(), "then a fresh registration");
        let written = link.written.lock().unwrap().clone();
        // Neither task 1's unacknowledged result nor task 2's reply is written again.
        assert_eq!(written, [(1, result(1)), (2, result(3))]);
    }

    #[tokio::test(start_paused = true)]
    async fn acknowledged_results_are_not_listed_in_the_resume() {
        let link = std::sync::Arc::new(SessionLink::default());
        *link.answers.lock().unwrap() = [Answer::Fresh(1), Answer::Resumed(vec![])].into();
        *link.serves.lock().unwrap() = [Serve {
            start: vec![(1, "echo"), (2, "echo")],
            write: 2,
            end: None,
        }]
        .into();
        let Ok(worker) = Worker::connect(std::sync::Arc::clone(&link), session_options()).await
        else {
            panic!("first registration");
        };
        let handle = worker.handle();
        // Reach into the keeper the way a link does, before the loss.
        let run = tokio::spawn(async move {
            let keeper = &worker.keeper;
            keeper.start(task(1, "echo"));
            keeper.start(task(2, "echo"));
            let _ = keeper.next_reply().await;
            let _ = keeper.next_reply().await;
            keeper.acknowledged(ids(&[1]));
            keeper.resume_request(&grant(1))
        });
        let Ok(request) = run.await else {
            panic!("the keeper task");
        };
        handle.shutdown();
        // Control: task 2's result, never acknowledged, is still listed.
        assert_eq!(request.unacked, ids(&[2]));
        assert!(request.running.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_grace_the_worker_registers_afresh() {
        let link = std::sync::Arc::new(SessionLink::default());
        let mut answers: VecDeque<Answer> = [Answer::Fresh(1)].into();
        // Every resume attempt finds the gateway unreachable; the grace is 5 s.
        answers.extend((0..64).map(|_| Answer::Unreachable));
        *link.answers.lock().unwrap() = answers;
        *link.serves.lock().unwrap() = [Serve {
            start: vec![(2, "slow")],
            write: 0,
            end: lost(),
        }]
        .into();
        let Ok(worker) = Worker::connect(std::sync::Arc::clone(&link), session_options()).await
        else {
            panic!("first registration");
        };
        let handle = worker.handle();
        let run = tokio::spawn(worker.run());
        tokio::time::sleep(Duration::from_secs(120)).await;
        handle.shutdown();
        let _ = run.await;
        let requests = link.requests.lock().unwrap().clone();
        let resumes = requests.iter().filter(|r| r.is_some()).count();
        assert!(
            resumes >= 2,
            "at least two resume attempts fit in the grace: {resumes}"
        );
        let first_fresh = requests
            .iter()
            .skip(1)
            .position(Option::is_none)
            .unwrap_or(usize::MAX);
        assert_eq!(
            first_fresh, resumes,
            "resumes first, then only fresh registrations"
        );
        assert!(
            requests.len() > resumes + 1,
            "control: it kept trying after the grace"
        );
    }
}
