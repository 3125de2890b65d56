//! HTTP/2 keepalive: a peer that stops answering at the connection level is detected by the
//! server and its worker deregistered, long before core's own heartbeat window.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use switchyard_core::{DisconnectReason, LivenessConfig};
use switchyard_transport_grpc::GrpcServerConfig;

use crate::support;
use crate::support::{
    Gateway, TRUSTED_TOKEN, TcpRelay, fast_liveness, https_endpoint, open, raw_client_at, register,
};

#[tokio::test]
async fn keepalive_deregisters_a_peer_that_stops_answering() {
    let gateway = Gateway::builder()
        .config(GrpcServerConfig {
            keepalive_interval: Some(Duration::from_millis(100)),
            keepalive_timeout: Duration::from_millis(300),
            ..GrpcServerConfig::default()
        })
        // Core's own silence verdict is far away, so only keepalive can end this worker.
        .liveness(LivenessConfig {
            heartbeat_window: Duration::from_secs(600),
            ..fast_liveness()
        })
        .start()
        .await;
    let mut events = gateway.core.registry().subscribe_events();
    let proxy = TcpRelay::start(gateway.addr).await.unwrap();
    let mut client = raw_client_at(&https_endpoint(proxy.addr()), gateway.pki.client_tls()).await;
    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    let worker = stream.register(register(&["ns"], &["echo"], Some(1))).await;

    // Control: a responsive peer survives many keepalive periods (pings come every 200 ms,
    // keepalive times out after 300 ms).
    stream.answer_pings(8).await;
    assert!(gateway.core.registry().is_registered(worker));

    proxy.freeze();
    let reason = support::disconnected(&mut events, worker).await;
    assert_eq!(reason, DisconnectReason::Disconnect);
    assert!(!gateway.core.registry().is_registered(worker));
}
