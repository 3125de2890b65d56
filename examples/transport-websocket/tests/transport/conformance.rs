//! Core's transport conformance kit, run against the WebSocket transport over real loopback
//! sockets, in plain `ws://` and over TLS.

use crate::support::harness::WsHarness;
use switchyard_core::testkit::run_conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_transport_passes_the_conformance_kit() {
    if let Err(failures) = run_conformance(&WsHarness::plain()).await {
        panic!("{failures}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_transport_over_tls_passes_the_conformance_kit() {
    if let Err(failures) = run_conformance(&WsHarness::tls()).await {
        panic!("{failures}");
    }
}
