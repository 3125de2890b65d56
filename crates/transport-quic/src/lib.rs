//! QUIC push transport for Switchyard workers on constrained links, and its Rust worker SDK.
//!
//! Workers dial the gateway over QUIC (quinn, TLS 1.3, ALPN `switchyard-worker/1`) and open
//! one control stream to register (without capacity) and then announce `max_concurrency`.
//! The gateway pushes tasks over *lanes*: long-lived bidirectional streams it opens toward the
//! worker, one per capacity slot, each carrying one task at a time with its pings, cancel and
//! result. Lanes keep tasks independent (a lost packet delays one lane only) while paying for
//! a stream once, not per task; the worker's stream credit is its capacity, so the link itself
//! refuses work the worker could not run. A worker that can resume gets a session: after a
//! lost connection it comes back on a new one within the reconnect grace, keeping its worker
//! id, its running tasks and its unacknowledged results. `docs/quic-protocol.md` is the wire
//! specification.
//!
//! - [`QuicServer`]: the gateway side, admitting every worker through core's one gate.
//! - [`QuicWorker`]: the worker SDK (builder, handlers, reconnection, drain).
//! - [`frame`]: the frame codec, public for tools and other implementations.
//! - [`Redundancy`]: optional QUIC datagram copies of small tasks and results, so one lost
//!   packet costs no retransmission round trip (negotiated at registration).
//!
//! # Examples
//!
//! A gateway and one worker over loopback (certificates from the `self-signed` feature):
//!
//! ```
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use switchyard_core::{
//!     ActivityOutcome, ActivityRequest, CallerIdentity, Core, CoreConfig, Registry,
//! };
//! use switchyard_transport_quic::{
//!     ActivityContext, ActivityError, QuicServer, QuicWorker, SelfSigned, QuicServerConfig,
//! };
//!
//! # let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2)
//! #     .enable_all().build()?;
//! # runtime.block_on(async {
//! let ca = SelfSigned::new(["localhost"])?;
//! let core = Core::start(Registry::builder(), CoreConfig::default());
//! let server = QuicServer::builder(core.clone(), ca.server_tls()?)
//!     .config(QuicServerConfig { listen: "127.0.0.1:0".parse()?, ..QuicServerConfig::default() })
//!     .bind()
//!     .await?;
//!
//! let worker = QuicWorker::builder(server.local_addr(), "localhost")
//!     .namespaces(["billing"])
//!     .activity("charge", |_ctx: ActivityContext, input: Bytes| async move {
//!         Ok::<_, ActivityError>(input)
//!     })
//!     .max_concurrency(4)
//!     .tls(ca.client_tls()?)
//!     .connect()
//!     .await?;
//! tokio::spawn(worker.run());
//!
//! let request = ActivityRequest {
//!     namespace: "billing".into(),
//!     task_queue: String::new(),
//!     activity_type: "charge".into(),
//!     node: None,
//!     input: Bytes::from_static(b"42"),
//!     activity_id: None,
//!     timeout: Duration::from_secs(10),
//! };
//! let outcome = core.dispatcher().dispatch(&CallerIdentity::trusted("shop"), request).await?;
//! assert_eq!(outcome, ActivityOutcome::Completed(Bytes::from_static(b"42")));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

mod client;
mod config;
mod convert;
mod fault;
pub mod frame;
mod metrics;
mod outbox;
mod protocol;
mod redundancy;
mod server;
#[cfg(test)]
mod spec_values;
mod tls;

pub use crate::metrics::{
    CONNECTIONS_REFUSED_TOTAL, COPY_EVENTS, LIMIT_LABELS, LISTENER_LABEL,
    QUIC_DATAGRAM_COPIES_TOTAL, QUIC_DATAGRAM_COPY_BYTES_TOTAL, QUIC_RETRIES_TOTAL,
    register_metrics,
};
pub use client::{
    ActivityContext, ActivityError, ActivityFuture, ActivityHandler, Backoff, QuicLinkError,
    QuicWorker, QuicWorkerBuilder, QuicWorkerHandle, WORKER_KEEP_ALIVE, WorkerError, WorkerOptions,
};
pub use config::{
    ConfigError, CongestionControl, ConnectionConfig, DEFAULT_RECONNECT_GRACE, FrameLimits,
    MAX_ACK_ELICITING_THRESHOLD, MAX_RECONNECT_GRACE, MAX_SOCKET_BUFFER, QuicServerConfig,
    RetryPolicy,
};
pub use protocol::{
    ALPN, DEFAULT_MAX_CONTROL_FRAME, DEFAULT_MAX_LANE_FRAME, ErrorCode, LENGTH_PREFIX_BYTES,
    PROTOCOL_VERSION,
};
pub use redundancy::{Redundancy, RedundancyStats};
pub use server::{QuicServer, QuicServerBuilder, ServerError, TRANSPORT};
pub use tls::{ClientTls, ServerTls, TlsError};
#[cfg(feature = "self-signed")]
pub use tls::{SelfSigned, SelfSignedError};
