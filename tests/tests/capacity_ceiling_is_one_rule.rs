//! The capacity ceiling is one rule of the admission gate, configured once
//! (`registry.max_concurrency_limit`): a gRPC worker stating too much in its registration is
//! refused with the same sentence as a QUIC worker announcing too much, each in its
//! transport's family (gRPC `INVALID_ARGUMENT`, QUIC `CAPACITY_REFUSED`); at the ceiling both
//! are admitted.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use switchyard_core::{AdmissionError, WorkerId};
use switchyard_tests::{RawGrpcWorker, TestGateway, raw_registration, wait_eligible};
use switchyard_transport_quic::{
    ActivityContext, ClientTls, ErrorCode, QuicLinkError, QuicWorker, QuicWorkerBuilder,
};
use tonic::Code;

const WAIT: Duration = Duration::from_secs(10);
const CEILING: u32 = 8;

/// The gate's sentence for `max_concurrency` above [`CEILING`].
fn sentence(max_concurrency: u32) -> String {
    AdmissionError::CapacityAboveLimit {
        max_concurrency,
        limit: CEILING,
    }
    .to_string()
}

async fn gateway_with_the_ceiling() -> TestGateway {
    TestGateway::start(|config| config.registry.max_concurrency_limit = CEILING).await
}

fn quic_builder(gateway: &TestGateway, namespace: &str, capacity: u32) -> QuicWorkerBuilder {
    let addr = gateway.gateway().addr("quic").expect("quic listens");
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(gateway.ca_pem().as_bytes()) {
        roots.add(cert.expect("CA parses")).expect("CA accepted");
    }
    QuicWorker::builder(addr, "localhost")
        .namespaces([namespace])
        .max_concurrency(capacity)
        .tls(ClientTls::new(roots).expect("client TLS"))
        .activity("work", |_: ActivityContext, input: Bytes| async move {
            Ok::<_, switchyard_transport_quic::ActivityError>(input)
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_the_ceiling_both_transports_refuse_with_the_gates_sentence() {
    let gateway = gateway_with_the_ceiling().await;
    let registry = gateway.gateway().core().registry();
    assert_eq!(registry.max_concurrency_limit(), CEILING);

    let mut grpc = RawGrpcWorker::open(&gateway).await.expect("call opens");
    let refused = grpc
        .try_register(raw_registration("above", "work", CEILING + 1))
        .await
        .expect_err("gRPC registration above the ceiling is refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert_eq!(refused.message(), sentence(CEILING + 1));

    // The QUIC worker registers without capacity and is refused when it announces it.
    let quic = quic_builder(&gateway, "above", CEILING + 1)
        .connect()
        .await
        .expect("QUIC registration carries no capacity");
    let ended = tokio::time::timeout(WAIT, quic.run())
        .await
        .expect("the gateway closes the connection");
    match ended.as_ref().map_err(|e| e.link_error::<QuicLinkError>()) {
        Err(Some(QuicLinkError::Refused { code, reason })) => {
            assert_eq!(*code, ErrorCode::CapacityRefused);
            assert_eq!(*reason, sentence(CEILING + 1));
        }
        other => panic!("expected CAPACITY_REFUSED, got {other:?}"),
    }
    assert_eq!(
        registry.admission_audit().refusals(),
        2,
        "one gate audits both refusals"
    );
    assert_eq!(registry.pool_census("above", "", "work", None).eligible, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_ceiling_both_transports_are_admitted() {
    let gateway = gateway_with_the_ceiling().await;
    let registry = gateway.gateway().core().registry();

    let mut grpc = RawGrpcWorker::open(&gateway).await.expect("call opens");
    let ack = grpc
        .try_register(raw_registration("at", "work", CEILING))
        .await
        .expect("gRPC registration at the ceiling is admitted");
    let grpc_id = WorkerId::from_raw(ack.worker_id);

    let quic = quic_builder(&gateway, "at", CEILING)
        .connect()
        .await
        .expect("QUIC worker registers");
    let quic_id = quic.worker_id();
    let handle = quic.handle();
    let running = tokio::spawn(quic.run());

    // The raw gRPC worker answers no probation ping, so only the QUIC one becomes eligible;
    // its capacity being applied is what it took to get there.
    wait_eligible(&gateway, "at", "work", 1).await;
    assert_eq!(
        registry.worker(grpc_id).and_then(|w| w.capacity),
        Some(CEILING)
    );
    assert_eq!(
        registry.worker(quic_id).and_then(|w| w.capacity),
        Some(CEILING)
    );
    assert_eq!(registry.admission_audit().refusals(), 0);
    handle.drain().unwrap();
    running.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_ceiling_refuses_a_grpc_worker_declaring_u32_max() {
    let gateway = TestGateway::start(|_| {}).await;
    let limit = gateway.gateway().core().registry().max_concurrency_limit();
    assert_eq!(limit, switchyard_core::DEFAULT_MAX_CONCURRENCY_LIMIT);

    let mut grpc = RawGrpcWorker::open(&gateway).await.expect("call opens");
    let refused = grpc
        .try_register(raw_registration("huge", "work", u32::MAX))
        .await
        .expect_err("u32::MAX is above the default ceiling");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert_eq!(
        refused.message(),
        format!(
            "max_concurrency {} exceeds this gateway's limit of {limit}",
            u32::MAX
        )
    );

    // Control: the default ceiling itself is admitted.
    let mut at = RawGrpcWorker::open(&gateway).await.expect("call opens");
    at.try_register(raw_registration("huge", "work", limit))
        .await
        .expect("at the default ceiling is admitted");
}
