//! Server-side settings of the gRPC worker transport.

use std::time::Duration;

/// Settings for [`WorkerService`](crate::WorkerService) and the HTTP/2 server that carries it.
///
/// The per-stream rules (registration deadline, message size, queue headroom) are applied by the service itself; the connection rules (HTTP/2 keepalive,
/// TCP_NODELAY) belong to the server, so an embedder mounting the service on its own tonic
/// server applies them with [`GrpcServerConfig::server_builder`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcServerConfig {
    /// How long a new stream may take to send its `RegisterWorker` frame (default 10 s).
    pub registration_deadline: Duration,
    /// Interval between HTTP/2 PING frames the server sends on each connection (default 20 s);
    /// `None` sends none.
    pub keepalive_interval: Option<Duration>,
    /// How long an HTTP/2 PING may stay unanswered before the connection is closed and every
    /// worker on it deregistered (default 10 s: shorter than the interval, so each ping is
    /// judged before the next is due, and a dead peer is found within 30 s, the liveness
    /// heartbeat window's default).
    pub keepalive_timeout: Duration,
    /// Largest encoded message accepted or sent on a worker stream, in bytes (default 4 MiB:
    /// the QUIC transport's lane frame limit, and the receive limit stock gRPC clients default
    /// to, so a result a worker may send is one a producer can receive); bounds both task
    /// inputs and results. Workers are told it in `RegisterAck`; a task whose frame would
    /// exceed it is refused to its producer without touching the worker.
    pub max_message_bytes: usize,
    /// Disables Nagle's algorithm on accepted sockets (default true: tasks and results are
    /// small and latency-bound).
    pub tcp_nodelay: bool,
    /// Extra room in each worker's push queue beyond its capacity, for pings, cancels and the
    /// drain request (default 32).
    pub control_headroom: usize,
    /// Largest push queue of one worker, whatever capacity it states (default 65 536): a
    /// worker stating more still registers, and pushes beyond the queue are refused as full.
    pub max_queue: usize,
    /// Worker streams one HTTP/2 connection may carry at once (default 64); one more is
    /// refused RESOURCE_EXHAUSTED naming `grpc.max_workers_per_connection`.
    pub max_workers_per_connection: usize,
    /// How long a new connection has to complete its TLS handshake before it is closed
    /// (default 10 s); no credential is checked before it ends.
    pub handshake_timeout: Duration,
    /// HTTP/2 streams one connection may have open at once (default 256); the client is told
    /// in its SETTINGS and a stream beyond it is refused.
    pub max_concurrent_streams: u32,
    /// Connections the listener holds at once (default 768: with the operations listener's
    /// 64, below a 1 024 file-descriptor soft limit with room for the rest of the process).
    pub max_connections: usize,
    /// Connections the listener holds from one source IP address (default 256).
    pub max_connections_per_address: usize,
    /// How long a resumable worker's session outlives its lost stream (default 5 s): a
    /// `resume` within it keeps the worker's id, slots and tasks. `ZERO` grants no sessions.
    pub reconnect_grace: Duration,
}

impl Default for GrpcServerConfig {
    fn default() -> Self {
        Self {
            registration_deadline: Duration::from_secs(10),
            keepalive_interval: Some(Duration::from_secs(20)),
            keepalive_timeout: Duration::from_secs(10),
            max_message_bytes: 4 * 1024 * 1024,
            tcp_nodelay: true,
            control_headroom: 32,
            max_queue: 65_536,
            max_workers_per_connection: 64,
            handshake_timeout: Duration::from_secs(10),
            max_concurrent_streams: 256,
            max_connections: 768,
            max_connections_per_address: 256,
            reconnect_grace: Duration::from_secs(5),
        }
    }
}

impl GrpcServerConfig {
    /// A tonic server builder with this configuration's HTTP/2 keepalive, stream limit and
    /// TCP_NODELAY applied; add TLS (through [`GrpcServerConfig::tls`]) and services to it.
    ///
    /// TCP_NODELAY and the connection limits only take effect on the listener
    /// [`serve`](crate::serve) or [`limited_incoming`](crate::limited_incoming) is given.
    pub fn server_builder(&self) -> tonic::transport::Server {
        tonic::transport::Server::builder()
            .http2_keepalive_interval(self.keepalive_interval)
            .http2_keepalive_timeout(Some(self.keepalive_timeout))
            .max_concurrent_streams(Some(self.max_concurrent_streams))
            .tcp_nodelay(self.tcp_nodelay)
    }

    /// `tls` with this configuration's handshake timeout.
    pub fn tls(&self, tls: tonic::transport::ServerTlsConfig) -> tonic::transport::ServerTlsConfig {
        tls.timeout(self.handshake_timeout)
    }

    /// The listener's connection limits.
    pub fn connection_limits(&self) -> crate::ConnectionLimits {
        crate::ConnectionLimits {
            max_connections: self.max_connections,
            max_connections_per_address: self.max_connections_per_address,
        }
    }

    /// The push-queue size for a worker stating `capacity`.
    pub(crate) fn queue_size(&self, capacity: Option<u32>) -> usize {
        let capacity = capacity.map_or(0, |c| usize::try_from(c).unwrap_or(usize::MAX));
        capacity
            .min(self.max_queue)
            .saturating_add(self.control_headroom)
            .max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_is_capacity_plus_headroom_and_capped() {
        let config = GrpcServerConfig {
            control_headroom: 4,
            max_queue: 100,
            ..GrpcServerConfig::default()
        };
        assert_eq!(config.queue_size(Some(8)), 12);
        assert_eq!(config.queue_size(Some(u32::MAX)), 104);
        assert_eq!(config.queue_size(None), 4);
    }
}
