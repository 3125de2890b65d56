//! A raw WebSocket peer writing the protocol's JSON by hand, as a browser's script would, so
//! the tests check the documented wire format rather than the crate's own types.

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::client::Response;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{Bytes, Message};

/// Longest wait for any one expected message.
pub const STEP: Duration = Duration::from_secs(10);
/// Most messages read while looking for one.
const MAX_MESSAGES: usize = 1000;

pub type Raw = WebSocketStream<TcpStream>;

/// Opens a socket to `addr`, with an `Authorization` header if given, offering `subprotocols`.
pub async fn connect(
    addr: SocketAddr,
    authorization: Option<&str>,
    subprotocols: &[&str],
) -> (Raw, Response) {
    let mut request = format!("ws://{addr}/").into_client_request().unwrap();
    if let Some(value) = authorization {
        request
            .headers_mut()
            .insert("authorization", HeaderValue::from_str(value).unwrap());
    }
    if !subprotocols.is_empty() {
        request.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_str(&subprotocols.join(", ")).unwrap(),
        );
    }
    let tcp = TcpStream::connect(addr).await.unwrap();
    tokio_tungstenite::client_async(request, tcp).await.unwrap()
}

/// A `register` frame for the test namespace with capacity `capacity`.
pub fn register(capacity: u32) -> Value {
    json!({
        "type": "register",
        "namespaces": [super::gateway::NAMESPACE],
        "activity_types": ["add"],
        "identity": "raw test peer",
        "max_concurrency": capacity,
    })
}

pub async fn send(socket: &mut Raw, frame: &Value) {
    socket.send(Message::text(frame.to_string())).await.unwrap();
}

pub async fn send_text(socket: &mut Raw, text: &str) {
    socket.send(Message::text(text)).await.unwrap();
}

pub async fn send_binary(socket: &mut Raw, bytes: &'static [u8]) {
    socket
        .send(Message::Binary(Bytes::from_static(bytes)))
        .await
        .unwrap();
}

/// The next text frame, parsed; panics on anything else or after [`STEP`].
pub async fn next(socket: &mut Raw) -> Value {
    let message = tokio::time::timeout(STEP, socket.next())
        .await
        .expect("a frame within the step")
        .expect("the socket is open")
        .expect("the socket is healthy");
    match message {
        Message::Text(text) => serde_json::from_str(&text).unwrap(),
        other => panic!("expected a text frame, got {other:?}"),
    }
}

/// How a socket ended: the text frames read on the way, then the close code and reason.
#[derive(Debug)]
pub struct Closed {
    pub frames: Vec<Value>,
    pub code: u16,
    pub reason: String,
}

/// Reads until the gateway's close frame, answering pings with pongs on the way if `answer`.
pub async fn closed(socket: &mut Raw, answer: bool) -> Closed {
    let mut frames = Vec::new();
    for _ in 0..MAX_MESSAGES {
        let message = tokio::time::timeout(STEP, socket.next())
            .await
            .expect("the gateway closes within the step")
            .expect("a close frame before the end of the stream")
            .expect("the socket is healthy until the close frame");
        match message {
            Message::Text(text) => {
                let frame: Value = serde_json::from_str(&text).unwrap();
                if answer && frame["type"] == "ping" {
                    send(socket, &json!({"type": "pong", "seq": frame["seq"]})).await;
                }
                frames.push(frame);
            }
            Message::Close(Some(close)) => {
                return Closed {
                    frames,
                    code: close.code.into(),
                    reason: close.reason.to_string(),
                };
            }
            other => panic!("unexpected message before the close: {other:?}"),
        }
    }
    panic!("no close frame within {MAX_MESSAGES} messages");
}

/// Reads frames, answering pings, until one of type `wanted` arrives.
pub async fn until(socket: &mut Raw, wanted: &str) -> Value {
    for _ in 0..MAX_MESSAGES {
        let frame = next(socket).await;
        if frame["type"] == wanted {
            return frame;
        }
        if frame["type"] == "ping" {
            send(socket, &json!({"type": "pong", "seq": frame["seq"]})).await;
        }
    }
    panic!("no {wanted} frame within {MAX_MESSAGES} frames");
}
