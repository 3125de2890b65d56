//! End-to-end tests of the WebSocket transport and its worker client over real loopback
//! sockets.

mod client;
mod conformance;
#[cfg(feature = "gateway")]
mod gateway;
mod support;
mod tls;
mod wire;
