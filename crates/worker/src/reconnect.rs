//! A worker over any [`Link`]: the first registration, then the reconnect loop.

use switchyard_core::WorkerId;

use crate::{
    ConnectionContext, ConnectionEnd, Link, LinkError, Registered, TaskRunner, WorkerError,
    WorkerHandle, WorkerOptions,
};

/// A registered worker on link `L`; [`Worker::run`] serves it until it stops for good.
pub struct Worker<L: Link> {
    link: L,
    options: WorkerOptions,
    runner: TaskRunner,
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

impl<L: Link> Worker<L> {
    /// Validates `options`, then opens and registers once over `link` (no retry here).
    pub async fn connect(link: L, options: WorkerOptions) -> Result<Self, WorkerError> {
        options.validate()?;
        let runner = TaskRunner::new(options.activities.clone(), options.max_concurrency);
        let handle = WorkerHandle::new(
            L::TRANSPORT,
            (L::CAN_DRAIN, L::CAN_RESIZE),
            runner.clone(),
            options.max_concurrency,
        );
        let (connection, registered) = open(&link, &options).await?;
        handle.set_registered(Some(registered.worker_id));
        Ok(Self {
            link,
            options,
            runner,
            handle,
            first: Some(connection),
            registered,
        })
    }

    /// A handle to drain, resize, stop or observe the worker while it runs.
    pub fn handle(&self) -> WorkerHandle {
        self.handle.clone()
    }

    /// The id of the first registration (a reconnection registers under a new id).
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
    pub async fn run(mut self) -> Result<(), WorkerError> {
        let stop = self.handle.shutdown_token();
        let drain = self.handle.drain_requested().clone();
        let mut attempt: u32 = 0;
        loop {
            let connection = match self.first.take() {
                Some(connection) => connection,
                None => {
                    let delay = self.options.backoff.delay(attempt, &mut rand::rng());
                    attempt = attempt.saturating_add(1);
                    let opened = tokio::select! {
                        () = stop.cancelled() => return Ok(()),
                        // Nothing is held while disconnected, so a drain is already complete.
                        () = drain.cancelled() => return Ok(()),
                        opened = async {
                            tokio::time::sleep(delay).await;
                            open(&self.link, &self.options).await
                        } => opened,
                    };
                    match opened {
                        Ok((connection, registered)) => {
                            tracing::info!(worker = %registered.worker_id, attempt,
                                transport = L::TRANSPORT, "reconnected to the gateway");
                            self.handle.set_registered(Some(registered.worker_id));
                            attempt = 0;
                            connection
                        }
                        Err(error) if error.is_permanent() => return Err(error),
                        Err(error) => {
                            let retry_within = self.options.backoff.ceiling(attempt);
                            tracing::warn!(%error, attempt, ?retry_within,
                                "reconnection failed; retrying");
                            continue;
                        }
                    }
                }
            };
            let context = ConnectionContext {
                options: &self.options,
                runner: &self.runner,
                handle: &self.handle,
            };
            // Dropping the connection on stop drops its handlers and closes the connection.
            let ended = tokio::select! {
                ended = self.link.serve(connection, context) => ended,
                () = stop.cancelled() => ConnectionEnd::Drained,
            };
            self.handle.set_registered(None);
            let retry_within = self.options.backoff.ceiling(attempt);
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
                } => tracing::info!(%reason, ?retry_within,
                    "lost the gateway: it is shutting down; reconnecting with backoff"),
                ConnectionEnd::ComeBack { reason, .. } => {
                    tracing::warn!(%reason, ?retry_within, "lost the gateway; reconnecting")
                }
                ConnectionEnd::Failed(error) => {
                    tracing::warn!(%error, ?retry_within, "lost the gateway; reconnecting")
                }
            }
        }
    }
}

/// One attempt to open and register, bounded by the connect timeout.
async fn open<L: Link>(
    link: &L,
    options: &WorkerOptions,
) -> Result<(L::Connection, Registered), WorkerError> {
    match tokio::time::timeout(options.connect_timeout, link.open(options)).await {
        Ok(Ok(opened)) => Ok(opened),
        Ok(Err(error)) => Err(WorkerError::link(L::TRANSPORT, error)),
        Err(_) => Err(WorkerError::Timeout(options.connect_timeout)),
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

        async fn open(&self, _: &WorkerOptions) -> Result<((), Registered), Scripted> {
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
                    let registered = Registered {
                        worker_id: WorkerId::from_raw(*id),
                        task_queue: "q".into(),
                    };
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

    /// A link shared with the test, so the test can read what it recorded.
    struct SharedScript(std::sync::Arc<ScriptedLink>);

    impl Link for SharedScript {
        type Connection = ();
        type Error = Scripted;
        const TRANSPORT: &'static str = "scripted";
        const CAN_DRAIN: bool = true;
        const CAN_RESIZE: bool = false;

        async fn open(&self, options: &WorkerOptions) -> Result<((), Registered), Scripted> {
            self.0.open(options).await
        }

        async fn serve(
            &self,
            connection: (),
            context: ConnectionContext<'_>,
        ) -> ConnectionEnd<Scripted> {
            self.0.serve(connection, context).await
        }
    }
}
