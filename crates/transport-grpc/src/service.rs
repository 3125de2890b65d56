//! [`WorkerService`]: the tonic implementation of `switchyard.v1.WorkerGateway` over [`Core`].

use std::sync::{Arc, Mutex, PoisonError};

use switchyard_core::{Core, Throttle};
use switchyard_proto::v1::WorkerFrame;
use switchyard_proto::v1::worker_gateway_server::{WorkerGateway, WorkerGatewayServer};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use switchyard_auth::Authenticate;

use crate::auth::authenticate_request;
use crate::config::GrpcServerConfig;
use crate::connection_streams::ConnectionStreams;
use crate::outbound::Outbound;
use crate::status::SessionError;
use crate::worker_stream::WorkerStream;

/// The worker stream service, cheap to clone; mount it with [`WorkerService::into_server`].
///
/// Each `ConnectWorker` call authenticates its caller, then runs one stream on its own task: the
/// registration deadline, the admission gate, the acknowledgement, and the frame loop that
/// hands results, pongs and cancel acknowledgements to core. The registration token lives in
/// that task, so the stream ending for any reason deregisters the worker exactly once; a
/// worker that core lets go (liveness timeout) has its stream ended with UNAVAILABLE when the
/// token reports its departure; and a
/// drained worker that holds no task any more has its stream ended after its `drain` frame:
/// cleanly for a requested drain, with UNAVAILABLE ("come back later") for a shutdown.
///
/// # Examples
///
/// Mounting the service next to others on one tonic server:
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use switchyard_auth::CallerTable;
/// use switchyard_core::{Core, CoreConfig, Registry};
/// use switchyard_transport_grpc::{GrpcServerConfig, WorkerService};
///
/// let core = Core::start(Registry::builder(), CoreConfig::default());
/// let config = GrpcServerConfig::default();
/// let workers = WorkerService::new(core, Arc::new(CallerTable::new()), config.clone());
/// config
///     .server_builder()
///     .add_service(workers.into_server())
///     .serve("127.0.0.1:7233".parse()?)
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct WorkerService {
    inner: Arc<ServiceState>,
}

pub(crate) struct ServiceState {
    pub(crate) core: Core,
    pub(crate) config: GrpcServerConfig,
    auth: Arc<dyn Authenticate>,
    streams: Arc<ConnectionStreams>,
    /// One log line per interval for refused credentials, which a peer can send at will.
    refused_log: Mutex<Throttle>,
}

impl std::fmt::Debug for WorkerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerService")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl WorkerService {
    /// A service admitting workers into `core`, authenticating callers with `auth`.
    pub fn new(core: Core, auth: Arc<dyn Authenticate>, config: GrpcServerConfig) -> Self {
        let streams = ConnectionStreams::new(config.max_workers_per_connection);
        let inner = Arc::new(ServiceState {
            core,
            config,
            auth,
            streams,
            refused_log: Mutex::new(Throttle::default()),
        });
        Self { inner }
    }

    /// The configuration in force.
    pub fn config(&self) -> &GrpcServerConfig {
        &self.inner.config
    }

    /// The tonic service, with the configured message size limits, ready to mount.
    pub fn into_server(self) -> WorkerGatewayServer<Self> {
        let limit = self.inner.config.max_message_bytes;
        WorkerGatewayServer::new(self)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit)
    }
}

#[cfg(fuzzing)]
impl WorkerService {
    /// The state every stream of this service shares (for the fuzzing entry).
    pub(crate) fn shared(&self) -> Arc<ServiceState> {
        Arc::clone(&self.inner)
    }
}

#[tonic::async_trait]
impl WorkerGateway for WorkerService {
    type ConnectWorkerStream = Outbound;

    async fn connect_worker(
        &self,
        request: Request<Streaming<WorkerFrame>>,
    ) -> Result<Response<Self::ConnectWorkerStream>, Status> {
        let peer = request.remote_addr();
        let caller = authenticate_request(self.inner.auth.as_ref(), &request).map_err(|error| {
            let logged = self
                .inner
                .refused_log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .allow(std::time::Instant::now());
            if let Some(suppressed) = logged {
                tracing::info!(?peer, %error, suppressed, "worker stream refused");
            }
            SessionError::from(error).status()
        })?;
        let place = self.inner.streams.open(peer).map_err(|error| {
            tracing::debug!(?peer, %error, "worker stream refused");
            error.status()
        })?;
        let span = tracing::info_span!("grpc_worker", principal = %caller.principal, ?peer,
            worker = tracing::field::Empty, namespaces = tracing::field::Empty);
        let (outbound, control) = Outbound::new();
        let stream = WorkerStream::new(Arc::clone(&self.inner), caller, control);
        let inbound = request.into_inner();
        tokio::spawn(
            async move {
                let _place = place;
                stream.run(inbound).await;
            }
            .instrument(span),
        );
        Ok(Response::new(outbound))
    }
}
