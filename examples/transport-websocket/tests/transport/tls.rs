//! `wss://`: a task round trip over TLS, and the handshakes that must fail.
// Helpers outside `#[test]` functions fail their test loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use bytes::Bytes;
use switchyard_core::{ActivityOutcome, ActivityRequest, CallerIdentity};
use switchyard_transport_websocket::client::WsLinkError;
use switchyard_transport_websocket::{ActivityContext, ActivityError, WsServerConfig, WsWorker};

use crate::support::gateway::{NAMESPACE, TOKEN, TestGateway};
use crate::support::pki::Pki;
use crate::support::raw::STEP;

async fn shout(_: ActivityContext, input: Bytes) -> Result<Bytes, ActivityError> {
    Ok(Bytes::from(input.to_ascii_uppercase()))
}

async fn tls_gateway(pki: &Pki) -> TestGateway {
    TestGateway::start(WsServerConfig {
        tls: Some(Arc::clone(&pki.server)),
        ..WsServerConfig::default()
    })
    .await
}

fn worker(url: String) -> switchyard_transport_websocket::WsWorkerBuilder {
    WsWorker::builder(url)
        .namespaces([NAMESPACE])
        .token(TOKEN)
        .activity("shout", shout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_round_trips_a_task_over_wss() {
    let pki = Pki::new();
    let gateway = tls_gateway(&pki).await;
    let port = gateway.server.local_addr().port();
    for host in ["127.0.0.1", "localhost"] {
        let worker = worker(format!("wss://{host}:{port}/"))
            .tls(Arc::clone(&pki.client))
            .connect()
            .await
            .unwrap();
        let id = worker.worker_id();
        let run = tokio::spawn(worker.run());
        let request = ActivityRequest {
            namespace: NAMESPACE.to_owned(),
            task_queue: String::new(),
            activity_type: "shout".to_owned(),
            node: None,
            input: Bytes::from_static(b"over tls"),
            activity_id: None,
            timeout: STEP,
        };
        let outcome = gateway
            .core
            .dispatcher()
            .dispatch(&CallerIdentity::trusted("producer"), request)
            .await
            .unwrap();
        assert_eq!(
            outcome,
            ActivityOutcome::Completed(Bytes::from_static(b"OVER TLS")),
            "{host}"
        );
        // Leave before the next host's worker comes, so each dispatch has one candidate.
        let mut events = gateway.core.registry().subscribe_events();
        run.abort();
        let left = async {
            while gateway.core.registry().is_registered(id) {
                let _ = events.recv().await;
            }
        };
        tokio::time::timeout(STEP, left)
            .await
            .expect("the stopped worker leaves");
    }
}

#[tokio::test]
async fn a_client_refuses_a_gateway_certificate_it_does_not_trust() {
    let pki = Pki::new();
    let gateway = tls_gateway(&pki).await;
    let stranger = Pki::new();
    let url = format!("wss://127.0.0.1:{}/", gateway.server.local_addr().port());
    let error = worker(url.clone())
        .tls(stranger.client)
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(error, WsLinkError::Handshake(_)), "{error}");
    assert!(
        error.to_string().to_lowercase().contains("certificate"),
        "{error}"
    );
    assert!(gateway.core.registry().is_empty());
    // Control: the certificate's own trust root connects.
    let admitted = worker(url).tls(pki.client).connect().await.unwrap();
    assert!(gateway.core.registry().is_registered(admitted.worker_id()));
}

#[tokio::test]
async fn a_plain_client_cannot_register_on_a_tls_listener() {
    let pki = Pki::new();
    let gateway = tls_gateway(&pki).await;
    let url = format!("ws://127.0.0.1:{}/", gateway.server.local_addr().port());
    let error = worker(url).connect().await.unwrap_err();
    assert!(matches!(error, WsLinkError::Handshake(_)), "{error}");
    assert!(gateway.core.registry().is_empty());
}
