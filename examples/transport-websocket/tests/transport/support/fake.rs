//! A scripted gateway on loopback that speaks the protocol by hand, to drive the worker client
//! through situations a real gateway never creates (over-delivery, cancel before start).

use serde_json::{Value, json};
use switchyard_transport_websocket::SUBPROTOCOL;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::http::HeaderValue;

use super::raw::{self, Raw};

pub struct FakeGateway {
    listener: TcpListener,
}

impl FakeGateway {
    pub async fn bind() -> Self {
        Self {
            listener: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        }
    }

    pub fn url(&self) -> String {
        format!("ws://{}/", self.listener.local_addr().unwrap())
    }

    /// Accepts one worker, reads its `register` frame and admits it as worker 1.
    pub async fn accept(&self) -> (Raw, Value) {
        let (tcp, _) = self.listener.accept().await.unwrap();
        // Like the real gateway, pick the protocol's subprotocol when offered; clients that
        // offer one refuse an upgrade that picks none.
        #[allow(clippy::result_large_err)]
        let pick = |_: &Request, mut response: Response| {
            response.headers_mut().insert(
                "sec-websocket-protocol",
                HeaderValue::from_static(SUBPROTOCOL),
            );
            Ok(response)
        };
        let mut socket = tokio_tungstenite::accept_hdr_async(tcp, pick)
            .await
            .unwrap();
        let register = raw::next(&mut socket).await;
        assert_eq!(register["type"], "register", "{register}");
        let registered = json!({
            "type": "registered", "worker_id": "1", "task_queue": "default", "ping_interval_ms": 100,
        });
        raw::send(&mut socket, &registered).await;
        (socket, register)
    }
}

/// A `task` frame for activity `activity` with id `id`.
pub fn task(id: u64, activity: &str) -> Value {
    json!({
        "type": "task", "task_id": id.to_string(), "namespace": "shop", "task_queue": "default",
        "activity_type": activity, "input": "", "attempt": 1, "deadline_unix_ms": 4_000_000_000_000_u64,
    })
}
