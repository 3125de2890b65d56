//! gRPC worker transport for Switchyard, and the Rust worker SDK that speaks it.
//!
//! Workers open one `switchyard.v1.WorkerGateway/ConnectWorker` stream each (the contract is
//! `proto/proto/switchyard/v1/worker.proto`; any gRPC stack can implement it). The server side
//! is [`WorkerService`]: it authenticates the caller ([`CallerDirectory`]), passes the first
//! frame through core's admission gate, pushes tasks, pings, cancels and drain requests
//! through a bounded per-worker queue, and hands results, pongs and cancel acknowledgements to
//! core. The stream is the registration: it ending deregisters the worker once.
#![forbid(unsafe_code)]

mod activity;
mod auth;
pub mod client;
mod config;
mod delivery;
mod outbound;
mod serve;
mod service;
mod session;
mod status;
mod wire;

pub use activity::{ActivityContext, ActivityError, ActivityFuture, ActivityHandler};
pub use auth::{AuthenticationError, CallerDirectory, StaticDirectory, certificate_principal};
pub use client::{Backoff, ConnectError, GrpcWorker, GrpcWorkerBuilder};
pub use config::GrpcServerConfig;
pub use delivery::TRANSPORT;
pub use outbound::Outbound;
pub use serve::{ServeError, serve};
pub use service::WorkerService;
pub use status::{SessionError, admission_status};
