//! gRPC worker transport for Switchyard, and the Rust worker SDK that speaks it.
//!
//! Workers open one `switchyard.v1.WorkerGateway/ConnectWorker` stream each (the contract is
//! `proto/proto/switchyard/v1/worker.proto`; any gRPC stack can implement it). The server side
//! is [`WorkerService`]: it authenticates the caller (an
//! [`Authenticate`](switchyard_auth::Authenticate), see [`authenticate_request`]), passes the first
//! frame through core's admission gate, pushes tasks, pings, cancels and drain requests
//! through a bounded per-worker queue, and hands results, pongs and cancel acknowledgements to
//! core. The stream is the registration: it ending deregisters the worker once, unless the
//! worker has a session (it registered `resumable` and [`GrpcServerConfig::reconnect_grace`] is
//! above zero): then it is suspended until a `resume` on a new stream or the grace's end.
//!
//! The worker side is [`GrpcWorker`]: activity handlers are async functions of
//! ([`ActivityContext`], input bytes) returning output bytes or an [`ActivityError`]; the
//! runtime answers pings, bounds concurrency, honours cancels and drains, and reconnects
//! after a lost stream or a gateway shutdown (only a requested drain is final), resuming its
//! session when it has one: running tasks keep running and unacknowledged results are sent
//! again.
//!
//! # Examples
//!
//! A gateway and a worker in one process, over plaintext loopback (use TLS with
//! [`serve`]'s `tls` and [`GrpcWorkerBuilder::tls`] anywhere else):
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use switchyard_auth::CallerTable;
//! use switchyard_core::{ActivityOutcome, ActivityRequest, CallerIdentity, Core, CoreConfig,
//!     Registry};
//! use switchyard_transport_grpc::{ActivityContext, ActivityError, GrpcServerConfig,
//!     GrpcWorker, WorkerService, serve};
//!
//! async fn greet(_: ActivityContext, name: Bytes) -> Result<Bytes, ActivityError> {
//!     let name = std::str::from_utf8(&name).map_err(|_| ActivityError::fatal("not utf-8"))?;
//!     Ok(Bytes::from(format!("hello, {name}")))
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! // Gateway side: core, plus the worker service; callers without credentials are trusted.
//! let core = Core::start(Registry::builder(), CoreConfig::default());
//! let callers = CallerTable::new().anonymous(CallerIdentity::trusted("local"));
//! let service = WorkerService::new(core.clone(), Arc::new(callers), GrpcServerConfig::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let endpoint = format!("http://{}", listener.local_addr()?);
//! tokio::spawn(serve(listener, None, service, std::future::pending()));
//!
//! // Worker side.
//! let worker = GrpcWorker::builder(endpoint)
//!     .namespaces(["demo"])
//!     .activity("greet", greet)
//!     .max_concurrency(4)
//!     .connect()
//!     .await?;
//! tokio::spawn(worker.run());
//!
//! // Producer side: the dispatch waits until the worker has answered its first pings.
//! let request = ActivityRequest {
//!     namespace: "demo".into(),
//!     task_queue: String::new(),
//!     activity_type: "greet".into(),
//!     node: None,
//!     input: Bytes::from_static(b"switchyard"),
//!     activity_id: None,
//!     timeout: Duration::from_secs(10),
//! };
//! let outcome = core.dispatcher().dispatch(&CallerIdentity::trusted("app"), request).await?;
//! assert_eq!(outcome, ActivityOutcome::Completed(Bytes::from_static(b"hello, switchyard")));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).map_err(|e| e.to_string())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

mod auth;
mod client;
mod config;
mod connection_streams;
mod delivery;
mod listener;
mod outbound;
mod serve;
mod service;
mod status;
mod wire;
mod worker_stream;

pub use auth::authenticate_request;
pub use client::{
    Backoff, GrpcLinkError, GrpcWorker, GrpcWorkerBuilder, WorkerError, WorkerHandle, WorkerOptions,
};
pub use config::GrpcServerConfig;
pub use delivery::TRANSPORT;
pub use listener::{
    AcceptConfig, CONNECTIONS_REFUSED_TOTAL, ConnectionLimits, ConnectionRefusal, Limited,
    LimitedIncoming, limited_incoming,
};
pub use outbound::Outbound;
pub use serve::{ServeError, serve};
pub use service::WorkerService;
pub use status::{SessionError, admission_status};
pub use switchyard_core::{ActivityContext, ActivityError, ActivityFuture, ActivityHandler};
#[cfg(fuzzing)]
pub use worker_stream::fuzz_registered_frames;
