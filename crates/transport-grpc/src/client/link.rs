//! Opening one worker stream: connect, register, wait for the acknowledgement.

use switchyard_proto::v1::worker_gateway_client::WorkerGatewayClient;
use switchyard_proto::v1::{
    GatewayFrame, RegisterAck, RegisterWorker, ResumeWorker, WorkerFrame, gateway_frame,
    worker_frame,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status, Streaming};

use std::time::Duration;

use switchyard_core::{ResumeRequest, ResumeSecret, SessionGrant, TaskId, WorkerId};
use switchyard_worker::{LinkError, Registered, WorkerOptions};

use super::DialConfig;

/// Why a worker could not open a registered stream.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GrpcLinkError {
    /// The endpoint is not a valid URI, or its TLS settings were rejected.
    #[error("endpoint {endpoint:?} rejected: {source}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// The bearer token cannot be carried in gRPC metadata.
    #[error("bearer token is not valid ASCII metadata")]
    InvalidToken,
    /// The connection to the gateway failed.
    #[error("gateway unreachable: {0}")]
    Unreachable(#[source] tonic::transport::Error),
    /// The gateway refused the worker (authentication or the admission gate); retrying
    /// unchanged will not help.
    #[error("registration refused ({}): {}", .0.code(), .0.message())]
    Refused(Status),
    /// The stream ended with a status before the registration was acknowledged.
    #[error("stream failed before registration ({}): {}", .0.code(), .0.message())]
    Stream(Status),
    /// The gateway's first frame was not the acknowledgement, or it sent none.
    #[error("gateway did not acknowledge the registration")]
    NoAcknowledgement,
    /// The gateway refused to resume the session (its status message names the reason:
    /// `resume refused: <reason>`); the worker registers afresh.
    #[error("{} ({})", .0.message(), .0.code())]
    ResumeRefused(Status),
}

impl LinkError for GrpcLinkError {
    fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::InvalidEndpoint { .. } | Self::InvalidToken | Self::Refused(_)
        )
    }

    fn is_resume_refused(&self) -> bool {
        matches!(self, Self::ResumeRefused(_))
    }
}

impl GrpcLinkError {
    /// Classifies a status ending a stream: the gate's refusals are permanent.
    pub(crate) fn from_status(status: Status) -> Self {
        match status.code() {
            Code::InvalidArgument
            | Code::PermissionDenied
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::Unauthenticated => Self::Refused(status),
            _ => Self::Stream(status),
        }
    }
}

/// A registered stream.
pub(crate) struct Stream {
    pub(crate) ack: RegisterAck,
    pub(crate) outbound: mpsc::Sender<WorkerFrame>,
    pub(crate) inbound: Streaming<GatewayFrame>,
}

/// The endpoint to dial, with TLS and HTTP/2 keepalive applied; built once per worker.
pub(crate) fn endpoint(
    settings: &DialConfig,
    connect_timeout: std::time::Duration,
) -> Result<Endpoint, GrpcLinkError> {
    let invalid = |source| GrpcLinkError::InvalidEndpoint {
        endpoint: settings.endpoint.clone(),
        source,
    };
    let mut endpoint = Endpoint::from_shared(settings.endpoint.clone())
        .map_err(invalid)?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(settings.keepalive_interval)
        .keep_alive_timeout(settings.keepalive_timeout)
        .keep_alive_while_idle(true);
    if let Some(tls) = &settings.tls {
        endpoint = endpoint.tls_config(tls.clone()).map_err(invalid)?;
    }
    Ok(endpoint)
}

/// The start of every status message refusing a resume.
const RESUME_REFUSED: &str = "resume refused:";

/// Dials `endpoint`, opens the stream, registers (or resumes the session in `resume`) and
/// waits for the acknowledgement.
pub(crate) async fn open(
    endpoint: &Endpoint,
    settings: &DialConfig,
    options: &WorkerOptions,
    resume: Option<&ResumeRequest>,
) -> Result<(Stream, Registered), GrpcLinkError> {
    let refused = |status: Status| {
        if resume.is_some() && status.message().starts_with(RESUME_REFUSED) {
            GrpcLinkError::ResumeRefused(status)
        } else {
            GrpcLinkError::from_status(status)
        }
    };
    let channel: Channel = endpoint
        .connect()
        .await
        .map_err(GrpcLinkError::Unreachable)?;
    let mut client = WorkerGatewayClient::new(channel)
        .max_decoding_message_size(settings.max_message_bytes)
        .max_encoding_message_size(settings.max_message_bytes);
    let (outbound, frames) = mpsc::channel(outbound_queue(options.max_concurrency));
    let first = match resume {
        Some(request) => worker_frame::Frame::Resume(ResumeWorker {
            session_id: request.session_id.get(),
            resume_secret: request.secret.clone().into(),
            running_task_ids: request.running.iter().map(|id| id.get()).collect(),
            unacked_task_ids: request.unacked.iter().map(|id| id.get()).collect(),
        }),
        None => worker_frame::Frame::Register(RegisterWorker {
            namespaces: options.namespaces.clone(),
            task_queue: options.task_queue.clone(),
            node: options.node.clone(),
            activity_types: options.activities.keys().cloned().collect(),
            identity: options.identity.clone(),
            max_concurrency: Some(options.max_concurrency),
            resumable: options.resume,
        }),
    };
    let register = WorkerFrame { frame: Some(first) };
    // The queue is empty and its receiver alive, so the first frame always fits.
    outbound
        .try_send(register)
        .map_err(|_| GrpcLinkError::NoAcknowledgement)?;
    let mut request = Request::new(ReceiverStream::new(frames));
    if let Some(token) = &options.token {
        let value = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| GrpcLinkError::InvalidToken)?;
        request.metadata_mut().insert("authorization", value);
    }
    let mut inbound = client
        .connect_worker(request)
        .await
        .map_err(refused)?
        .into_inner();
    match inbound.message().await {
        Ok(Some(GatewayFrame {
            frame: Some(gateway_frame::Frame::RegisterAck(ack)),
        })) => {
            let registered = Registered {
                session: session(&ack),
                held: ack.resumed.then(|| {
                    ack.held_task_ids
                        .iter()
                        .copied()
                        .map(TaskId::from_raw)
                        .collect()
                }),
                ..Registered::new(WorkerId::from_raw(ack.worker_id), ack.task_queue.clone())
            };
            let stream = Stream {
                ack,
                outbound,
                inbound,
            };
            Ok((stream, registered))
        }
        Ok(_) => Err(GrpcLinkError::NoAcknowledgement),
        Err(status) => Err(refused(status)),
    }
}

/// The session an acknowledgement grants; none unless it carries an id, a 32-byte secret and
/// a grace.
fn session(ack: &RegisterAck) -> Option<SessionGrant> {
    if ack.session_id == 0 || ack.reconnect_grace_ms == 0 {
        return None;
    }
    Some(SessionGrant {
        session_id: WorkerId::from_raw(ack.session_id),
        secret: ResumeSecret::from_slice(&ack.resume_secret)?,
        grace: Duration::from_millis(u64::from(ack.reconnect_grace_ms)),
    })
}

/// Room in the outbound queue beyond one result per task, for pongs and cancel acks.
const OUTBOUND_HEADROOM: usize = 16;

/// One result per task the worker may hold, plus room for pongs and cancel acks.
fn outbound_queue(max_concurrency: u32) -> usize {
    usize::try_from(max_concurrency)
        .unwrap_or(usize::MAX)
        .min(65_536)
        .saturating_add(OUTBOUND_HEADROOM)
}
