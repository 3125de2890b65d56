//! The gRPC listener's switches (`docs/configuration.md`, `[grpc]`): `grpc.workers = false`
//! leaves the worker service out and keeps the producer API; `grpc.tls = false` serves
//! plaintext HTTP/2 on loopback.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use bytes::Bytes;
use switchyard_proto::v1 as pb;
use switchyard_tests::{RawGrpcWorker, TestGateway};
use tonic::Code;
use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// A dispatch to a queue nobody serves, answered within its 200 ms.
async fn unserved_dispatch_answers(gateway: &TestGateway) {
    let reply = gateway
        .client(None)
        .await
        .dispatch(pb::DispatchRequest {
            namespace: "ns".to_owned(),
            activity_type: "nobody".to_owned(),
            input: Bytes::from_static(b"x"),
            timeout_ms: 200,
            ..pb::DispatchRequest::default()
        })
        .await
        .expect("the producer API answers")
        .into_inner();
    assert!(
        matches!(
            reply.outcome.and_then(|o| o.outcome),
            Some(pb::dispatch_outcome::Outcome::Unserved(_))
        ),
        "an unserved outcome"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_worker_service_a_worker_call_is_unimplemented_and_producers_are_served() {
    for workers in [true, false] {
        let gateway = TestGateway::start(|config| {
            config.quic.enabled = false;
            config.grpc.workers = workers;
        })
        .await;
        let opened = RawGrpcWorker::open(&gateway).await;
        if workers {
            // Control: with the service, the same call opens.
            assert!(opened.is_ok(), "{:?}", opened.err());
        } else {
            let Err(status) = opened else {
                panic!("a worker call opened without the worker service");
            };
            assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
        }
        unserved_dispatch_answers(&gateway).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tls_off_the_listener_speaks_plaintext_http2() {
    for tls in [true, false] {
        let gateway = TestGateway::start(|config| {
            config.quic.enabled = false;
            config.grpc.tls = tls;
        })
        .await;
        let addr = gateway.gateway().addr("grpc").expect("grpc listens");
        let channel = Endpoint::from_shared(format!("http://127.0.0.1:{}", addr.port()))
            .expect("valid endpoint")
            .connect()
            .await
            .expect("TCP connects");
        let checked = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await;
        if tls {
            // Control: the TLS listener does not answer plaintext.
            assert!(checked.is_err(), "a TLS listener answered plaintext");
        } else {
            let status = checked.expect("plaintext health check").into_inner().status;
            assert_eq!(status, ServingStatus::Serving as i32);
        }
    }
}
