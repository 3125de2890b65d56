//! Limits a TCP listener applies at accept, before a byte of TLS or HTTP is read: connections
//! in all and per source address, and a wait instead of a spin when accepting fails.
//!
//! [`limited_incoming`] turns a bound `TcpListener` into the stream tonic's
//! `serve_with_incoming` (or a hyper accept loop) takes; the gateway's gRPC and operations
//! listeners and this crate's [`serve`](crate::serve) all accept through it.

mod accept;
mod table;

pub use accept::{
    AcceptConfig, CONNECTIONS_REFUSED_TOTAL, Limited, LimitedIncoming, limited_incoming,
};
pub use table::{ConnectionLimits, ConnectionRefusal};
