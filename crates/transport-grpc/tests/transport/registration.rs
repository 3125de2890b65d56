//! Registration over real TLS loopback streams: authentication, the admission gate's refusals
//! and their status codes, and the first-frame rules.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use switchyard_core::{
    AdmissionError, DisconnectReason, InMemoryNamespaceStore, NamespacePolicy, NamespaceRecord,
    NamespaceStore, Node, Placement, Registry, StoreError,
};
use switchyard_proto::v1::{Pong, gateway_frame, worker_frame};
use switchyard_transport_grpc::GrpcServerConfig;
use tonic::Code;

use crate::support;
use crate::support::{
    BILLING_PRINCIPAL, BILLING_TOKEN, CERT_PRINCIPAL, Gateway, TRUSTED_TOKEN, frame, open, register,
};

/// A gateway whose namespace policy is closed, knowing `billing` (unplaced) and `edge`
/// (pinned to node `n1`).
async fn closed_gateway() -> Gateway {
    let store = InMemoryNamespaceStore::with_records([
        NamespaceRecord {
            name: "billing".into(),
            placement: Placement::Unplaced,
        },
        NamespaceRecord {
            name: "edge".into(),
            placement: Placement::Pinned(Node::new("n1").into_iter().collect::<BTreeSet<_>>()),
        },
    ]);
    Gateway::builder()
        .registry(
            Registry::builder()
                .namespace_store(Arc::new(store))
                .namespace_policy(NamespacePolicy::Closed),
        )
        .start()
        .await
}

/// Registers `frame` with `token` and returns the status the stream is closed with.
async fn refusal(
    gateway: &Gateway,
    token: &str,
    frame: switchyard_proto::v1::WorkerFrame,
) -> tonic::Status {
    let mut client = gateway.raw_client().await;
    let mut stream = open(&mut client, Some(token)).await.unwrap();
    stream.send(frame).await;
    stream.closing_status().await
}

#[tokio::test]
async fn each_admission_refusal_has_its_status_code_and_the_gate_sentence() {
    let gateway = closed_gateway().await;
    let mut pinned = register(&["edge"], &["echo"], Some(1));
    if let Some(worker_frame::Frame::Register(r)) = pinned.frame.as_mut() {
        r.node = "n2".into();
    }
    let cases = [
        (
            TRUSTED_TOKEN,
            register(&["billing"], &["echo"], Some(0)),
            Code::InvalidArgument,
            AdmissionError::ZeroCapacity,
        ),
        (
            TRUSTED_TOKEN,
            register(&["billing"], &["echo"], None),
            Code::InvalidArgument,
            AdmissionError::MissingCapacity,
        ),
        (
            TRUSTED_TOKEN,
            register(&[], &["echo"], Some(1)),
            Code::InvalidArgument,
            AdmissionError::Empty {
                field: "namespaces",
            },
        ),
        (
            TRUSTED_TOKEN,
            register(&["billing"], &[], Some(1)),
            Code::InvalidArgument,
            AdmissionError::Empty {
                field: "activity_types",
            },
        ),
        (
            BILLING_TOKEN,
            register(&["billing", "payroll"], &["echo"], Some(1)),
            Code::PermissionDenied,
            AdmissionError::NamespaceNotGranted {
                principal: BILLING_PRINCIPAL.into(),
                namespace: "payroll".into(),
            },
        ),
        (
            TRUSTED_TOKEN,
            register(&["nowhere"], &["echo"], Some(1)),
            Code::NotFound,
            AdmissionError::UnknownNamespace {
                namespace: "nowhere".into(),
            },
        ),
        (
            TRUSTED_TOKEN,
            pinned,
            Code::FailedPrecondition,
            AdmissionError::PlacementViolated {
                namespace: "edge".into(),
                node: Node::new("n2"),
                required: Node::new("n1").into_iter().collect(),
            },
        ),
    ];
    for (token, frame, code, error) in cases {
        let status = refusal(&gateway, token, frame).await;
        assert_eq!(status.code(), code, "{error}");
        assert_eq!(status.message(), error.to_string());
    }
    assert!(
        gateway.core.registry().is_empty(),
        "no refused worker is registered"
    );

    // Control: the same gateway admits a well-formed registration.
    let mut client = gateway.raw_client().await;
    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    let worker = stream
        .register(register(&["billing"], &["echo"], Some(1)))
        .await;
    assert!(gateway.core.registry().is_registered(worker));
}

#[tokio::test]
async fn callers_without_valid_credentials_are_unauthenticated() {
    let gateway = Gateway::start().await;
    let mut client = gateway.raw_client().await;
    let no_credentials = open(&mut client, None).await.err().unwrap();
    assert_eq!(no_credentials.code(), Code::Unauthenticated);
    assert_eq!(
        no_credentials.message(),
        "no credential: present a client certificate or an authorization bearer token"
    );
    let unknown = open(&mut client, Some("guessed")).await.err().unwrap();
    assert_eq!(unknown.code(), Code::Unauthenticated);
    assert_eq!(unknown.message(), "bearer token not recognised");

    // Control: a known token opens a stream on the same connection.
    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    stream
        .register(register(&["any"], &["echo"], Some(1)))
        .await;
}

#[tokio::test]
async fn anonymous_callers_get_the_configured_identity() {
    let gateway = Gateway::builder()
        .anonymous(switchyard_core::CallerIdentity::granted(
            "anonymous",
            ["public"],
        ))
        .start()
        .await;
    let mut client = gateway.raw_client().await;
    let mut stream = open(&mut client, None).await.unwrap();
    let worker = stream
        .register(register(&["public"], &["echo"], Some(1)))
        .await;
    let principal = gateway
        .core
        .registry()
        .worker(worker)
        .unwrap()
        .worker
        .principal()
        .to_owned();
    assert_eq!(principal, "anonymous");

    let mut stream = open(&mut client, None).await.unwrap();
    stream
        .send(register(&["private"], &["echo"], Some(1)))
        .await;
    assert_eq!(stream.closing_status().await.code(), Code::PermissionDenied);
}

#[tokio::test]
async fn mtls_principal_is_the_client_certificate_subject() {
    let gateway = Gateway::start().await;
    let mut client = gateway
        .raw_client_with(gateway.pki.client_tls_as(CERT_PRINCIPAL))
        .await;
    let mut stream = open(&mut client, None).await.unwrap();
    let worker = stream
        .register(register(&["billing"], &["echo"], Some(1)))
        .await;
    let snapshot = gateway.core.registry().worker(worker).unwrap();
    assert_eq!(snapshot.worker.principal(), CERT_PRINCIPAL);

    // The certificate outranks a token granting everything.
    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    stream
        .send(register(&["payroll"], &["echo"], Some(1)))
        .await;
    let status = stream.closing_status().await;
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(
        status.message(),
        AdmissionError::NamespaceNotGranted {
            principal: CERT_PRINCIPAL.into(),
            namespace: "payroll".into()
        }
        .to_string()
    );

    // A trusted certificate naming no known principal is not authenticated, whatever token
    // rides along.
    let mut client = gateway
        .raw_client_with(gateway.pki.client_tls_as("stranger"))
        .await;
    let status = open(&mut client, Some(TRUSTED_TOKEN)).await.err().unwrap();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(
        status.message(),
        "client certificate subject \"stranger\" not recognised"
    );
}

#[tokio::test]
async fn a_frame_before_registration_closes_the_stream() {
    let gateway = Gateway::start().await;
    let mut client = gateway.raw_client().await;
    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    stream
        .send(frame(worker_frame::Frame::Pong(Pong { seq: 1 })))
        .await;
    let status = stream.closing_status().await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "the first frame must be register or resume, got pong"
    );

    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    stream
        .send(switchyard_proto::v1::WorkerFrame { frame: None })
        .await;
    let status = stream.closing_status().await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "the first frame must be register or resume, got an empty frame"
    );
    assert!(gateway.core.registry().is_empty());
}

#[tokio::test]
async fn a_second_registration_closes_the_stream_and_deregisters_once() {
    let gateway = Gateway::start().await;
    let mut events = gateway.core.registry().subscribe_events();
    let mut client = gateway.raw_client().await;
    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    let worker = stream.register(register(&["ns"], &["echo"], Some(1))).await;
    stream.send(register(&["ns"], &["echo"], Some(1))).await;
    let status = stream.closing_status().await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        format!("second register frame on one stream (already registered as worker {worker})")
    );
    let reason = support::disconnected(&mut events, worker).await;
    // A protocol fault leaves at once, never suspends.
    assert_eq!(reason, DisconnectReason::Closed);
    assert!(!gateway.core.registry().is_registered(worker));
}

#[tokio::test]
async fn a_silent_stream_is_closed_at_the_registration_deadline() {
    let deadline = Duration::from_millis(200);
    let gateway = Gateway::builder()
        .config(GrpcServerConfig {
            registration_deadline: deadline,
            ..GrpcServerConfig::default()
        })
        .start()
        .await;
    let mut client = gateway.raw_client().await;
    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    let status = stream.closing_status().await;
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert_eq!(
        status.message(),
        format!("no register frame within the registration deadline of {deadline:?}")
    );

    // Control: registering in time is acknowledged.
    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    stream.send(register(&["ns"], &["echo"], Some(1))).await;
    assert!(matches!(
        stream.next_non_ping().await,
        Ok(Some(gateway_frame::Frame::RegisterAck(_)))
    ));
}

/// A namespace store that cannot be reached.
struct BrokenStore;

#[async_trait::async_trait]
impl NamespaceStore for BrokenStore {
    async fn get(&self, _: &str) -> Result<Option<NamespaceRecord>, StoreError> {
        Err(StoreError("connection refused".into()))
    }

    async fn create_if_absent(&self, _: NamespaceRecord) -> Result<NamespaceRecord, StoreError> {
        Err(StoreError("connection refused".into()))
    }
}

#[tokio::test]
async fn an_undecidable_registration_is_unavailable() {
    let gateway = Gateway::builder()
        .registry(Registry::builder().namespace_store(Arc::new(BrokenStore)))
        .start()
        .await;
    let status = refusal(
        &gateway,
        TRUSTED_TOKEN,
        register(&["billing"], &["echo"], Some(1)),
    )
    .await;
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.message(),
        AdmissionError::Store(StoreError("connection refused".into())).to_string()
    );
}
