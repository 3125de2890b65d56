//! The gRPC transport, with the real worker SDK on the far end, passes core's conformance kit
//! over TLS loopback sockets.
//!
//! Each kit worker is a [`GrpcWorker`] dialling the gateway through its own [`TcpRelay`], so the
//! kit can sever its connection (sockets closed, as a crashed process) or freeze it (sockets
//! open and silent, as a hung one) below the SDK.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::unwrap_used, clippy::panic)]

use async_trait::async_trait;
use bytes::Bytes;
use switchyard_core::testkit::{
    self, BoxError, ConformanceFailures, ConformanceWorker, Handler, HarnessError, TaskCall,
    TransportHarness, WorkerSpec,
};
use switchyard_core::{Core, RefusalKind, TaskResult, WorkerId};
use switchyard_transport_grpc::{
    ActivityContext, ActivityError, Backoff, GrpcLinkError, GrpcServerConfig, GrpcWorker,
    WorkerError,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::support::{Gateway, TcpRelay, https_endpoint};

struct GrpcHarness;

/// The bearer token the gateway maps to the kit's `index`th caller.
fn token(index: usize) -> String {
    format!("conformance-caller-{index}")
}

#[async_trait]
impl TransportHarness for GrpcHarness {
    type Gateway = Gateway;
    type Worker = KitWorker;

    async fn start(&self, core: Core) -> Result<Gateway, BoxError> {
        let directory = testkit::callers().into_iter().enumerate().fold(
            switchyard_auth::CallerTable::new(),
            |directory, (index, caller)| directory.with_token(token(index), caller),
        );
        Ok(Gateway::serve(core, directory, GrpcServerConfig::default()).await)
    }

    fn supports_resume(&self) -> bool {
        true
    }

    async fn connect(
        &self,
        gateway: &Gateway,
        spec: WorkerSpec,
    ) -> Result<KitWorker, HarnessError> {
        let index = testkit::callers()
            .iter()
            .position(|caller| *caller == spec.caller)
            .ok_or_else(|| HarnessError::Transport("caller unknown to the harness".into()))?;
        let proxy = TcpRelay::start(gateway.addr).await.unwrap();
        let registration = spec.registration;
        // The kit asks for a session by giving the registration a grace; the gateway's own
        // grace (5 s by default) is the one in force.
        let resumable = !registration.reconnect_grace.is_zero();
        let mut builder = GrpcWorker::builder(https_endpoint(proxy.addr()))
            .tls(gateway.pki.client_tls())
            .token(token(index))
            .namespaces(registration.namespaces)
            .task_queue(registration.task_queue)
            .node(
                registration
                    .node
                    .map(|n| n.as_str().to_owned())
                    .unwrap_or_default(),
            )
            .identity(registration.identity)
            .resume(resumable)
            .max_concurrency(registration.max_concurrency.unwrap_or(0))
            .backoff(Backoff {
                initial: std::time::Duration::from_millis(10),
                max: std::time::Duration::from_millis(200),
            });
        for activity in registration.activity_types {
            builder = builder.activity(activity, adapt(spec.handler.clone()));
        }
        let worker = builder.connect().await.map_err(refusal)?;
        let id = worker.worker_id();
        let stop = worker.shutdown_token();
        let run = tokio::spawn(worker.run());
        Ok(KitWorker {
            id,
            proxy,
            stop,
            run,
        })
    }
}

/// Runs a kit handler as an SDK activity handler.
fn adapt(
    handler: Handler,
) -> impl Fn(ActivityContext, Bytes) -> switchyard_transport_grpc::ActivityFuture + Send + Sync + 'static
{
    move |context: ActivityContext, input: Bytes| {
        let call = TaskCall {
            activity_type: context.activity_type().to_owned(),
            input,
            cancelled: context.cancellation().clone(),
        };
        let running = handler.call(call);
        Box::pin(async move {
            match running.await {
                TaskResult::Success(output) => Ok(output),
                TaskResult::Failure {
                    message,
                    retryable: true,
                } => Err(ActivityError::retryable(message)),
                TaskResult::Failure { message, .. } => Err(ActivityError::fatal(message)),
            }
        })
    }
}

fn refusal(error: WorkerError) -> HarnessError {
    if let WorkerError::Invalid { .. } = &error {
        // The runtime refuses what the gate would, before dialling.
        return HarnessError::Refused {
            kind: RefusalKind::Invalid,
            message: error.to_string(),
        };
    }
    let Some(GrpcLinkError::Refused(status)) = error.link_error::<GrpcLinkError>() else {
        return HarnessError::Transport(Box::new(error));
    };
    let kind = match status.code() {
        Code::InvalidArgument => RefusalKind::Invalid,
        Code::PermissionDenied => RefusalKind::Unauthorised,
        Code::NotFound => RefusalKind::NotFound,
        Code::FailedPrecondition => RefusalKind::Placement,
        _ => return HarnessError::Transport(Box::new(error)),
    };
    HarnessError::Refused {
        kind,
        message: status.message().to_owned(),
    }
}

struct KitWorker {
    id: WorkerId,
    proxy: TcpRelay,
    stop: CancellationToken,
    run: JoinHandle<Result<(), WorkerError>>,
}

impl ConformanceWorker for KitWorker {
    fn worker_id(&self) -> WorkerId {
        self.id
    }

    fn sever(&self) {
        // Cut the sockets first so the gateway sees a dead connection, not a goodbye; then stop
        // the SDK so it does not come back under a new id.
        self.proxy.sever();
        self.stop.cancel();
    }

    fn freeze(&self) {
        self.proxy.freeze();
    }

    /// The relay cuts the live sockets and refuses new ones for a moment, as a link blip that
    /// ends the stream; the SDK keeps running and reconnects through it.
    fn break_link(&self) {
        self.proxy.blackout(std::time::Duration::from_millis(300));
    }
}

impl Drop for KitWorker {
    fn drop(&mut self) {
        self.stop.cancel();
        self.run.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_transport_conforms() -> Result<(), ConformanceFailures> {
    testkit::run_conformance(&GrpcHarness).await
}
