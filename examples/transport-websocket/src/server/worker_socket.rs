//! One worker socket from its `register` frame to its deregistration.

use std::sync::Arc;

use futures::{SinkExt, Stream, StreamExt};
use switchyard_core::{
    Core, DisconnectReason, RegistrationToken, TaskId, WorkerId, normalise_task_queue,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

use super::state::ServerState;
use super::writer;
use crate::auth::authenticate;
use crate::delivery::WsDelivery;
use crate::protocol::{self, CloseCode, GatewayFrame, RegisterFrame, WorkerFrame, millis};
use crate::socket::{Incoming, close_frame, finish_close, next_message};

/// Why the gateway closes a socket: the close code and the sentence behind it.
#[derive(Debug)]
struct Closing {
    code: CloseCode,
    message: String,
}

impl Closing {
    fn new(code: CloseCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    fn frame(&self) -> CloseFrame {
        close_frame(self.code, &self.message)
    }

    /// Whether the socket closes because the worker broke the protocol (a frame it may not
    /// send, or one too large), not because the gateway lets it go.
    fn breaks_protocol(&self) -> bool {
        matches!(
            self.code,
            CloseCode::ProtocolError
                | CloseCode::UnsupportedData
                | CloseCode::InvalidPayload
                | CloseCode::TooBig
        )
    }
}

/// How a registered socket's read loop ended.
#[derive(Debug)]
enum End {
    /// The worker sent a close frame.
    WorkerClosed,
    /// The connection broke, or writing to it failed.
    Lost(String),
    /// The gateway closes the socket for this reason.
    Closing(Closing),
}

/// A worker that passed the gate, before its acknowledgement.
struct Admitted {
    token: RegistrationToken,
    delivery: Arc<WsDelivery>,
    queued: mpsc::Receiver<GatewayFrame>,
    task_queue: String,
}

/// Runs the registration, then serves the worker until its socket ends.
pub(super) async fn run<S>(
    state: Arc<ServerState>,
    mut socket: WebSocketStream<S>,
    authorization: Option<HeaderValue>,
    deadline: Instant,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match admit(&state, &mut socket, authorization.as_ref(), deadline).await {
        Ok(admitted) => serve_registered(&state, socket, admitted).await,
        Err(Some(refusal)) => refuse(&state, socket, refusal).await,
        Err(None) => {}
    }
}

/// Reads the `register` frame, authenticates the caller and passes the admission gate.
/// `Err(None)` means the socket ended first.
async fn admit<S>(
    state: &ServerState,
    socket: &mut WebSocketStream<S>,
    authorization: Option<&HeaderValue>,
    deadline: Instant,
) -> Result<Admitted, Option<Closing>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (registration, frame_token) = first_frame(state, socket, deadline)
        .await?
        .into_registration();
    let caller = authenticate(authorization, frame_token.as_deref(), state.auth.as_ref())
        .map_err(|error| Closing::new(CloseCode::Unauthenticated, error.to_string()))?;
    let span = tracing::Span::current();
    span.record("principal", caller.principal.as_str());
    span.record(
        "namespaces",
        tracing::field::debug(&registration.namespaces),
    );
    if state.accepting.is_cancelled() {
        return Err(Some(shutting_down()));
    }
    let task_queue = normalise_task_queue(&registration.task_queue).to_owned();
    let (queue, queued) = mpsc::channel(state.config.queue_size(registration.max_concurrency));
    let delivery = Arc::new(WsDelivery::new(queue));
    let token = state
        .core
        .registry()
        .admit_unannounced(&caller, registration, Arc::clone(&delivery) as _)
        .await
        .map_err(|error| Closing::new(CloseCode::for_refusal(error.kind()), error.to_string()))?;
    Ok(Admitted {
        token,
        delivery,
        queued,
        task_queue,
    })
}

/// Acknowledges the registration, serves the worker's frames while a writer task sends core's
/// messages, then deregisters the worker and closes the socket with the code naming why.
async fn serve_registered<S>(
    state: &ServerState,
    mut socket: WebSocketStream<S>,
    admitted: Admitted,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Admitted {
        token,
        delivery,
        queued,
        task_queue,
    } = admitted;
    let core = &state.core;
    let worker = token.worker_id();
    tracing::Span::current().record("worker", tracing::field::display(worker));
    let ack = GatewayFrame::Registered {
        worker_id: worker.get(),
        task_queue,
        ping_interval_ms: millis(core.liveness().config().ping_interval),
    };
    if let Err(error) = send(&mut socket, &ack).await {
        tracing::info!(%error, "the registration acknowledgement could not be sent");
        return;
    }
    // Core pings, dispatches and drains the worker only once the acknowledgement is out.
    token.announce();
    tracing::info!("worker registered");

    let (sink, mut stream) = socket.split();
    let writer_stop = CancellationToken::new();
    let writer_failed = CancellationToken::new();
    let mut writer = tokio::spawn(writer::run(
        sink,
        queued,
        writer_stop.clone(),
        writer_failed.clone(),
    ));
    let end = serve(state, &token, &mut stream, &writer_failed).await;

    delivery.close();
    let reason = match &end {
        End::WorkerClosed if delivery.drain_requested() => DisconnectReason::Drained,
        // A worker that broke the protocol leaves at once: never a suspended session.
        End::Closing(closing) if closing.breaks_protocol() => DisconnectReason::Closed,
        _ => DisconnectReason::Disconnect,
    };
    let deregistered = token.deregister(reason);
    match &end {
        End::WorkerClosed => tracing::info!(deregistered, ?reason, "worker closed its socket"),
        End::Lost(detail) => tracing::info!(deregistered, %detail, "worker socket lost"),
        End::Closing(closing) => tracing::info!(deregistered, code = closing.code.code(),
            message = %closing.message, "closing worker socket"),
    }

    writer_stop.cancel();
    let close_timeout = state.config.close_timeout;
    let sink = match tokio::time::timeout(close_timeout, &mut writer).await {
        Ok(Ok(sink)) => sink,
        Ok(Err(_)) | Err(_) => {
            writer.abort();
            return;
        }
    };
    let frame = match end {
        End::Lost(_) => return,
        End::WorkerClosed => None,
        End::Closing(closing) => Some(closing.frame()),
    };
    if let Ok(mut socket) = stream.reunite(sink) {
        finish_close(&mut socket, frame, close_timeout).await;
    }
}

/// Waits for the `register` frame. `Err(None)` means the socket ended first.
async fn first_frame<S>(
    state: &ServerState,
    socket: &mut WebSocketStream<S>,
    deadline: Instant,
) -> Result<RegisterFrame, Option<Closing>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let incoming = tokio::select! {
        () = state.accepting.cancelled() => return Err(Some(shutting_down())),
        incoming = tokio::time::timeout_at(deadline, next_message(socket)) => incoming,
    };
    let Ok(incoming) = incoming else {
        let timeout = state.config.registration_timeout;
        return Err(Some(Closing::new(
            CloseCode::RegistrationTimeout,
            format!("no register frame within {timeout:?} of connecting"),
        )));
    };
    match incoming {
        Incoming::Text(text) => match protocol::decode_worker(&text) {
            Ok(WorkerFrame::Register(register)) => Ok(register),
            Ok(other) => Err(Some(Closing::new(
                CloseCode::ProtocolError,
                format!("the first frame must be register, not {}", other.kind()),
            ))),
            Err(error) => Err(Some(Closing::new(
                CloseCode::InvalidPayload,
                error.to_string(),
            ))),
        },
        other => Err(violation(other)),
    }
}

/// Serves a registered worker's frames until its socket ends or the gateway closes it.
async fn serve<S>(
    state: &ServerState,
    token: &RegistrationToken,
    stream: &mut S,
    writer_failed: &CancellationToken,
) -> End
where
    S: Stream<Item = Result<Message, WsError>> + Unpin,
{
    let core = &state.core;
    let worker = token.worker_id();
    loop {
        let incoming = tokio::select! {
            incoming = next_message(stream) => incoming,
            reason = token.departed() => return End::Closing(evicted(reason)),
            () = state.stop.cancelled() => return End::Closing(shutting_down()),
            () = writer_failed.cancelled() => {
                return End::Lost("writing to the socket failed".to_owned());
            }
        };
        match incoming {
            Incoming::Text(text) => {
                if let Err(closing) = handle(core, worker, &text) {
                    return End::Closing(closing);
                }
            }
            Incoming::Closed(_) => return End::WorkerClosed,
            Incoming::Lost(detail) => return End::Lost(detail),
            other => {
                if let Some(closing) = violation(other) {
                    return End::Closing(closing);
                }
            }
        }
    }
}

/// Hands one frame of a registered worker to core.
fn handle(core: &Core, worker: WorkerId, text: &str) -> Result<(), Closing> {
    let invalid =
        |error: protocol::DecodeError| Closing::new(CloseCode::InvalidPayload, error.to_string());
    match protocol::decode_worker(text).map_err(invalid)? {
        WorkerFrame::Pong { seq } => core.record_pong(worker, seq),
        WorkerFrame::Result(result) => {
            let (task, result) = result.into_result().map_err(invalid)?;
            if let Err(refusal) = core.complete(worker, task, result) {
                // Core counts refused results; a late one is normal after a cancel or a deadline.
                tracing::debug!(%task, %refusal, "result refused");
            }
        }
        WorkerFrame::CancelAck { task_id } => {
            let task = TaskId::from_raw(task_id);
            if let Err(refusal) = core.cancel_acknowledged(worker, task) {
                tracing::debug!(%task, %refusal, "cancel acknowledgement refused");
            }
        }
        WorkerFrame::Register(_) => {
            return Err(Closing::new(
                CloseCode::ProtocolError,
                format!("register sent twice: already registered as worker {worker}"),
            ));
        }
        // A frame from a later protocol revision: it still proves the worker alive.
        WorkerFrame::Unknown => core.record_frame(worker),
    }
    Ok(())
}

/// The closing for a message the protocol does not allow; `None` when the socket is gone.
fn violation(incoming: Incoming) -> Option<Closing> {
    match incoming {
        Incoming::Binary => Some(Closing::new(
            CloseCode::UnsupportedData,
            "binary messages are not part of the protocol: send JSON text",
        )),
        Incoming::TooBig(detail) => Some(Closing::new(CloseCode::TooBig, detail)),
        Incoming::Text(_) | Incoming::Closed(_) | Incoming::Lost(_) => None,
    }
}

fn shutting_down() -> Closing {
    Closing::new(CloseCode::GoingAway, "gateway shutting down")
}

fn evicted(reason: DisconnectReason) -> Closing {
    Closing::new(
        CloseCode::Deregistered,
        format!("deregistered by the gateway: {}", reason.as_str()),
    )
}

/// Tells the worker why it is refused (the whole sentence, in a `refused` frame), then closes
/// with the refusal's code.
async fn refuse<S>(state: &ServerState, mut socket: WebSocketStream<S>, refusal: Closing)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    tracing::info!(code = refusal.code.code(), message = %refusal.message, "worker refused");
    let frame = GatewayFrame::Refused {
        code: refusal.code.code(),
        message: refusal.message.clone(),
    };
    let limit = state.config.close_timeout;
    match tokio::time::timeout(limit, send(&mut socket, &frame)).await {
        Ok(Ok(())) => finish_close(&mut socket, Some(refusal.frame()), limit).await,
        Ok(Err(error)) => tracing::debug!(%error, "the refusal could not be sent"),
        Err(_) => tracing::debug!("the refusal could not be sent in time"),
    }
}

async fn send<S>(socket: &mut WebSocketStream<S>, frame: &GatewayFrame) -> Result<(), WsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let text = protocol::encode(frame).map_err(|error| WsError::Io(error.into()))?;
    socket.send(Message::text(text)).await
}
