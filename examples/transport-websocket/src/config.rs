//! Server-side settings of the WebSocket worker transport.

use std::sync::Arc;
use std::time::Duration;

use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

/// Settings for [`WsServer`](crate::WsServer).
#[derive(Clone, Debug)]
pub struct WsServerConfig {
    /// TLS for `wss://` (default `None`: plain `ws://`, for loopback or behind a terminating
    /// proxy). Build it with `rustls::ServerConfig::builder_with_provider`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Largest WebSocket message accepted from a worker, in bytes (default 16 MiB); bounds the
    /// `register` frame and every result. Task input and output travel as base64, so the
    /// largest payload is three quarters of this.
    pub max_message_bytes: usize,
    /// How long a new connection may take from TCP accept to its `register` frame, TLS and
    /// the upgrade included (default 10 s).
    pub registration_timeout: Duration,
    /// Extra room in each worker's push queue beyond its capacity, for pings, cancels and the
    /// drain request (default 32).
    pub control_headroom: usize,
    /// Largest push queue of one worker, whatever capacity it states (default 65 536): pushes
    /// beyond it are refused as full.
    pub max_queue: usize,
    /// Most connections served at once, registered or not (default 10 000); further clients
    /// wait in the listen backlog.
    pub max_connections: usize,
    /// How long closing a socket may take: flushing what is queued, sending the close frame
    /// and hearing the peer's (default 5 s).
    pub close_timeout: Duration,
}

impl Default for WsServerConfig {
    fn default() -> Self {
        Self {
            tls: None,
            max_message_bytes: 16 * 1024 * 1024,
            registration_timeout: Duration::from_secs(10),
            control_headroom: 32,
            max_queue: 65_536,
            max_connections: 10_000,
            close_timeout: Duration::from_secs(5),
        }
    }
}

impl WsServerConfig {
    /// The push-queue size for a worker stating `capacity`.
    pub(crate) fn queue_size(&self, capacity: Option<u32>) -> usize {
        let capacity = capacity.map_or(0, |c| usize::try_from(c).unwrap_or(usize::MAX));
        capacity
            .min(self.max_queue)
            .saturating_add(self.control_headroom)
            .max(1)
    }

    /// The WebSocket limits for one connection.
    pub(crate) fn websocket(&self) -> WebSocketConfig {
        websocket_config(self.max_message_bytes)
    }
}

/// WebSocket limits with every incoming message and frame bounded by `max_message_bytes`.
pub(crate) fn websocket_config(max_message_bytes: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(max_message_bytes))
        .max_frame_size(Some(max_message_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_holds_capacity_plus_headroom_within_the_cap() {
        let config = WsServerConfig {
            control_headroom: 8,
            max_queue: 100,
            ..WsServerConfig::default()
        };
        assert_eq!(config.queue_size(Some(4)), 12);
        assert_eq!(config.queue_size(Some(u32::MAX)), 108);
        assert_eq!(config.queue_size(None), 8);
        let no_headroom = WsServerConfig {
            control_headroom: 0,
            ..config
        };
        assert_eq!(
            no_headroom.queue_size(None),
            1,
            "a queue is never zero-sized"
        );
    }
}
