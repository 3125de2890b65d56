//! End-to-end tests of Switchyard over real sockets; the tests live in `tests/`, this library
//! holds what they share: a gateway started on ephemeral ports ([`TestGateway`]), an in-process
//! transport plugged in through the gateway's `Transport` trait for workers whose every move
//! a test scripts ([`ScriptedTransport`]), real workers built with both transports' SDKs
//! ([`grpc_worker`], [`quic_worker`]), and a minimal HTTP GET for the operations listener.
#![forbid(unsafe_code)]
// Test support only: a setup step that fails must fail the test that called it, with the step
// named, which is exactly what `expect` does.
#![allow(clippy::expect_used, clippy::panic)]

mod fault;
mod gateway;
mod http;
mod raw_grpc;
mod scripted;
mod sdk;

pub use fault::{
    FaultSpec, FaultWorker, Gauge, Seeded, Work, grpc_fault_worker, long_tests, quic_fault_worker,
};
pub use gateway::{ApiClient, TestGateway, api_client_at, test_config, tls_channel};
pub use http::{counter, http_get, http_get_with_head, http_request};
pub use raw_grpc::{RawEnd, RawGrpcWorker, pong, raw_registration, success};
pub use scripted::{ScriptedTransport, ScriptedWorker, WorkerControl, registration};
pub use sdk::{RunningWorker, WorkerSpec, grpc_worker, quic_worker, wait_eligible};
pub use switchyard_test_support::{TcpRelay, UdpRelay};
