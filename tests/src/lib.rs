//! End-to-end tests of Switchyard over real sockets; the tests live in `tests/`, this library
//! holds what they share: a gateway started on ephemeral ports ([`TestGateway`]), an in-process
//! transport plugged in through the gateway's `Transport` trait for workers whose every move
//! a test scripts ([`ScriptedTransport`]), and a minimal HTTP GET for the operations listener.
#![forbid(unsafe_code)]

mod gateway;
mod http;
mod scripted;

pub use gateway::{ApiClient, TestGateway, test_config};
pub use http::http_get;
pub use scripted::{ScriptedTransport, ScriptedWorker, registration};
