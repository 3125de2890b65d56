//! A WebSocket worker transport for Switchyard, built as an outside crate on core's public API.
//!
//! For workers that can only reach the gateway over HTTPS-only networks or from a browser:
//! [`WsServer`] accepts `ws://` or `wss://` (TLS via rustls) connections, speaks the JSON
//! protocol described in [`protocol`], admits each worker through core's one admission gate,
//! and implements [`WorkerDelivery`](switchyard_core::WorkerDelivery) with a bounded queue per
//! socket. [`client::WsWorker`] is a small Rust worker over the same protocol. With the default
//! `gateway` feature, `WsTransport` plugs it into `switchyard-gateway`'s `Gateway::builder`.
//!
//! The crate touches nothing inside core; `docs/writing-a-transport.md` walks through it as
//! the example of adding a transport, and its tests run core's conformance kit against it.
#![forbid(unsafe_code)]

mod auth;
pub mod client;
mod config;
mod delivery;
#[cfg(feature = "gateway")]
mod gateway;
pub mod protocol;
mod server;
mod socket;

pub use client::{
    ActivityContext, ActivityError, ActivityHandler, RunError, WsLinkError, WsWorker,
    WsWorkerBuilder,
};
pub use config::WsServerConfig;
pub use delivery::TRANSPORT;
#[cfg(feature = "gateway")]
pub use gateway::WsTransport;
pub use protocol::{CloseCode, SUBPROTOCOL};
pub use server::WsServer;
