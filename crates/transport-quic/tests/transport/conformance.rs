//! Core's conformance kit, run against the QUIC transport over real UDP loopback sockets:
//! the gateway is a `QuicServer`, every worker the SDK's `QuicWorker` behind a relay that
//! can freeze its link.

use async_trait::async_trait;
use bytes::Bytes;
use switchyard_core::testkit::{
    self, BoxError, ConformanceWorker, Handler, HarnessError, TaskCall, TransportHarness,
    WorkerSpec,
};
use switchyard_core::{Core, RefusalKind, TaskResult, WorkerEvent, WorkerId};
use switchyard_test_support::UdpRelay;
use switchyard_transport_quic::{
    ActivityContext, ActivityError, ActivityFuture, ErrorCode, QuicLinkError, QuicServer,
    QuicServerConfig, QuicWorker, SelfSigned, WorkerError,
};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::support::PATIENCE;

struct QuicHarness;

struct Gateway {
    core: Core,
    server: QuicServer,
    ca: SelfSigned,
}

struct Worker {
    id: WorkerId,
    run: JoinHandle<Result<(), WorkerError>>,
    relay: UdpRelay,
}

impl ConformanceWorker for Worker {
    fn worker_id(&self) -> WorkerId {
        self.id
    }

    /// Dropping the worker's session drops its connection: QUIC sends a bare close, the
    /// nearest thing to a process dying, with no drain or goodbye frame of the protocol.
    fn sever(&self) {
        self.run.abort();
    }

    fn freeze(&self) {
        self.relay.freeze();
    }

    /// The link goes dark for a second: the connection dies of its short idle timeout (the
    /// kit's session workers use 400 ms) and the SDK, still running, resumes once it is back.
    fn break_link(&self) {
        self.relay.blackout(std::time::Duration::from_secs(1));
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.run.abort();
    }
}

#[async_trait]
impl TransportHarness for QuicHarness {
    type Gateway = Gateway;
    type Worker = Worker;

    async fn start(&self, core: Core) -> Result<Gateway, BoxError> {
        let ca = SelfSigned::new(["localhost"])?;
        // Each kit caller authenticates with its principal as its token.
        let tokens = testkit::callers()
            .into_iter()
            .fold(switchyard_auth::CallerTable::new(), |table, caller| {
                table.with_token(caller.principal.clone(), caller)
            });
        let server = QuicServer::builder(core.clone(), ca.server_tls()?)
            .config(QuicServerConfig {
                listen: "127.0.0.1:0".parse()?,
                ..QuicServerConfig::default()
            })
            .authenticator(std::sync::Arc::new(tokens))
            .bind()
            .await?;
        Ok(Gateway { core, server, ca })
    }

    fn supports_resume(&self) -> bool {
        true
    }

    async fn connect(&self, gateway: &Gateway, spec: WorkerSpec) -> Result<Worker, HarnessError> {
        let transport = |error: BoxError| HarnessError::Transport(error);
        let relay = UdpRelay::start(gateway.server.local_addr())
            .await
            .map_err(|e| transport(e.into()))?;
        let registration = spec.registration;
        // The kit asks for a session by giving the registration a grace; the gateway's own
        // grace (15 s by default) is the one in force.
        let resumable = !registration.reconnect_grace.is_zero();
        let client_tls = gateway.ca.client_tls().map_err(|e| transport(e.into()))?;
        let mut builder = QuicWorker::builder(relay.addr(), "localhost")
            .tls(client_tls)
            .token(spec.caller.principal.clone())
            .namespaces(registration.namespaces)
            .task_queue(registration.task_queue)
            .identity(registration.identity)
            .resume(resumable)
            .max_concurrency(registration.max_concurrency.unwrap_or(1));
        if resumable {
            // A link that dies within half a second of going dark, so `break_link` ends it.
            builder = builder.connection(switchyard_transport_quic::ConnectionConfig {
                max_idle_timeout: std::time::Duration::from_millis(400),
                keep_alive_interval: Some(std::time::Duration::from_millis(100)),
                ..switchyard_transport_quic::ConnectionConfig::default()
            });
        }
        if let Some(node) = registration.node {
            builder = builder.node(node.as_str());
        }
        for activity in registration.activity_types {
            builder = builder.activity(activity, adapt(spec.handler.clone()));
        }
        let mut events = gateway.core.registry().subscribe_events();
        let worker = builder.connect().await.map_err(refusal)?;
        let id = worker.worker_id();
        let mut run = tokio::spawn(worker.run());
        match tokio::time::timeout(PATIENCE, capacity_settled(&mut events, &mut run, id)).await {
            Ok(Ok(())) => Ok(Worker { id, run, relay }),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(transport("capacity never settled".into())),
        }
    }
}

/// Resolves when core took the worker's capacity, or with the refusal that closed it.
async fn capacity_settled(
    events: &mut broadcast::Receiver<WorkerEvent>,
    run: &mut JoinHandle<Result<(), WorkerError>>,
    id: WorkerId,
) -> Result<(), HarnessError> {
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(WorkerEvent::CapacityAnnounced { worker, .. }) if worker == id => return Ok(()),
                Ok(_) => {}
                Err(error) => return Err(HarnessError::Transport(error.into())),
            },
            ended = &mut *run => {
                return Err(match ended {
                    Ok(Err(error)) => refusal(error),
                    Ok(Ok(())) => HarnessError::Transport("the worker stopped".into()),
                    Err(error) => HarnessError::Transport(error.into()),
                });
            }
        }
    }
}

/// A worker error as the kit's refusal, its family recovered from the close code.
fn refusal(error: WorkerError) -> HarnessError {
    if let WorkerError::Invalid { .. } = &error {
        return HarnessError::Refused {
            kind: RefusalKind::Invalid,
            message: error.to_string(),
        };
    }
    let (kind, message) = match error.link_error::<QuicLinkError>() {
        Some(QuicLinkError::Refused { code, reason }) => {
            let kind = match code {
                ErrorCode::RegistrationInvalid | ErrorCode::CapacityRefused => RefusalKind::Invalid,
                ErrorCode::NamespaceNotGranted | ErrorCode::Unauthenticated => {
                    RefusalKind::Unauthorised
                }
                ErrorCode::NamespaceUnknown => RefusalKind::NotFound,
                ErrorCode::PlacementRefused => RefusalKind::Placement,
                ErrorCode::Unavailable => RefusalKind::Unavailable,
                _ => return HarnessError::Transport(error.into()),
            };
            (kind, reason.clone())
        }
        _ => return HarnessError::Transport(error.into()),
    };
    HarnessError::Refused { kind, message }
}

/// The kit's handler as an SDK handler.
fn adapt(
    handler: Handler,
) -> impl Fn(ActivityContext, Bytes) -> ActivityFuture + Send + Sync + 'static {
    move |ctx: ActivityContext, input: Bytes| {
        let call = TaskCall {
            activity_type: ctx.activity_type().to_owned(),
            input,
            cancelled: ctx.cancellation().clone(),
        };
        let running = handler.call(call);
        Box::pin(async move {
            match running.await {
                TaskResult::Success(output) => Ok(output),
                TaskResult::Failure { message, retryable } => Err(if retryable {
                    ActivityError::retryable(message)
                } else {
                    ActivityError::fatal(message)
                }),
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_transport_passes_the_conformance_kit() {
    if let Err(failures) = testkit::run_conformance(&QuicHarness).await {
        panic!("{failures}");
    }
}
