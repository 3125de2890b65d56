//! Opening a worker socket: TCP, TLS, the upgrade, and the registration exchange.

use std::sync::Arc;
use std::time::Duration;

use futures::SinkExt;
use switchyard_core::WorkerId;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use switchyard_worker::WorkerOptions;

use super::DialConfig;
use super::error::WsLinkError;
use crate::config::websocket_config;
use crate::protocol::{self, GatewayFrame, RegisterFrame, SUBPROTOCOL, WorkerFrame};
use crate::socket::{Incoming, finish_close, next_message};

/// The socket this worker speaks on.
pub(crate) type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A registered socket and what the gateway said about it.
pub(crate) struct RegisteredSocket {
    pub(crate) socket: Socket,
    pub(crate) worker_id: WorkerId,
    pub(crate) task_queue: String,
    pub(crate) ping_interval: Duration,
}

/// Connects and registers, within the connect timeout.
pub(super) async fn open(
    settings: &DialConfig,
    options: &WorkerOptions,
) -> Result<RegisteredSocket, WsLinkError> {
    let register = connect_and_register(settings, options);
    tokio::time::timeout(options.connect_timeout, register)
        .await
        .map_err(|_| WsLinkError::Timeout(options.connect_timeout))?
}

async fn connect_and_register(
    settings: &DialConfig,
    options: &WorkerOptions,
) -> Result<RegisteredSocket, WsLinkError> {
    let invalid = |problem: String| WsLinkError::InvalidUrl {
        url: settings.url.clone(),
        problem,
    };
    let mut request = settings
        .url
        .as_str()
        .into_client_request()
        .map_err(|error| invalid(error.to_string()))?;
    let uri = request.uri();
    let tls = match uri.scheme_str() {
        Some("wss") => true,
        Some("ws") => false,
        _ => return Err(invalid("the scheme must be ws or wss".to_owned())),
    };
    let host = uri
        .host()
        .ok_or_else(|| invalid("no host".to_owned()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let headers = request.headers_mut();
    headers.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(SUBPROTOCOL),
    );
    if let Some(token) = &options.token {
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| WsLinkError::InvalidToken)?;
        headers.insert(header::AUTHORIZATION, value);
    }

    let tcp = TcpStream::connect((host.as_str(), port)).await?;
    if let Err(error) = tcp.set_nodelay(true) {
        tracing::debug!(%error, "could not disable Nagle's algorithm");
    }
    let connector = if tls {
        Connector::Rustls(match &settings.tls {
            Some(config) => Arc::clone(config),
            None => public_roots()?,
        })
    } else {
        Connector::Plain
    };
    let (mut socket, _response) = tokio_tungstenite::client_async_tls_with_config(
        request,
        tcp,
        Some(websocket_config(settings.max_message_bytes)),
        Some(connector),
    )
    .await
    .map_err(WsLinkError::Handshake)?;

    let register = WorkerFrame::Register(RegisterFrame {
        namespaces: options.namespaces.clone(),
        task_queue: options.task_queue.clone(),
        node: Some(options.node.clone()).filter(|node| !node.is_empty()),
        activity_types: options.activities.keys().cloned().collect(),
        identity: options.identity.clone(),
        max_concurrency: Some(options.max_concurrency),
        token: None,
    });
    let text =
        protocol::encode(&register).map_err(|error| WsLinkError::Protocol(error.to_string()))?;
    socket
        .send(Message::text(text))
        .await
        .map_err(WsLinkError::Handshake)?;
    answer(socket, settings).await
}

/// Reads the gateway's answer to the `register` frame.
async fn answer(
    mut socket: Socket,
    settings: &DialConfig,
) -> Result<RegisteredSocket, WsLinkError> {
    let text = match next_message(&mut socket).await {
        Incoming::Text(text) => text,
        Incoming::Closed(frame) => {
            let detail = frame.map_or_else(
                || "closed without a code".to_owned(),
                |frame| format!("closed ({}): {}", u16::from(frame.code), frame.reason),
            );
            return Err(WsLinkError::Closed(detail));
        }
        Incoming::Lost(detail) => return Err(WsLinkError::Closed(detail)),
        other => {
            return Err(WsLinkError::Protocol(format!(
                "unexpected answer: {other:?}"
            )));
        }
    };
    match protocol::decode_gateway(&text) {
        Ok(GatewayFrame::Registered {
            worker_id,
            task_queue,
            ping_interval_ms,
        }) => Ok(RegisteredSocket {
            socket,
            worker_id: WorkerId::from_raw(worker_id),
            task_queue,
            ping_interval: Duration::from_millis(ping_interval_ms),
        }),
        Ok(GatewayFrame::Refused { code, message }) => {
            // Answer the gateway's close so it is not left waiting for it.
            finish_close(&mut socket, None, settings.close_timeout).await;
            Err(WsLinkError::Refused { code, message })
        }
        Ok(_) => Err(WsLinkError::Protocol(
            "the answer to register was neither registered nor refused".to_owned(),
        )),
        Err(error) => Err(WsLinkError::Protocol(error.to_string())),
    }
}

/// A client TLS configuration trusting the public web's roots, on the ring provider.
fn public_roots() -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}
