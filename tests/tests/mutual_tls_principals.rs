//! With a client CA configured, a producer or a worker presenting a client certificate is the
//! principal its subject names, granted what that principal is granted; callers without one
//! fall back to tokens, unless `tls.require_client_cert` refuses them in the handshake. A
//! certificate that does not chain to the CA is refused in the handshake either way.

// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use switchyard_gateway::{GatewayConfig, PrincipalSection};
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::gateway_client::GatewayClient;
use switchyard_test_support::TestCa;
use switchyard_tests::TestGateway;
use switchyard_transport_quic::{
    ActivityContext, ActivityError, QuicLinkError, QuicWorker, WorkerError,
};
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};

struct ClientCertificates {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn client_certificates(common_name: &str) -> ClientCertificates {
    let ca = TestCa::new("test client CA");
    let client = ca.client(common_name);
    ClientCertificates {
        ca_pem: ca.pem(),
        cert_pem: client.cert_pem,
        key_pem: client.key_pem,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_names_the_principal() {
    let certs = client_certificates("ops.example");
    let (gateway, _ca_dir) = gateway_with_client_ca(&certs.ca_pem, false, "other").await;
    let addr = gateway.gateway().addr("grpc").unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(gateway.ca_pem()))
        .identity(Identity::from_pem(&certs.cert_pem, &certs.key_pem));
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", addr.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("the gateway accepts the client certificate");
    let mut with_cert = GatewayClient::new(channel);

    let describe = |namespace: &str| pb::DescribePoolRequest {
        namespace: namespace.to_owned(),
        activity_type: "echo".to_owned(),
        ..pb::DescribePoolRequest::default()
    };
    with_cert
        .describe_pool(describe("ops"))
        .await
        .expect("the certificate's principal is granted ops");
    let denied = with_cert
        .describe_pool(describe("other"))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert!(
        denied.message().contains("operator"),
        "{}",
        denied.message()
    );

    // Without a certificate: the token still works, and nothing is unauthenticated.
    let mut with_token = gateway.client(Some("t")).await;
    with_token
        .describe_pool(describe("other"))
        .await
        .expect("the token's principal is granted other");
    let mut anonymous = gateway.client(None).await;
    let refused = anonymous.describe_pool(describe("ops")).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
}

/// A gateway whose client CA is `ca_pem` (certificates required with `require`), knowing
/// principal `operator` by the certificate subject `ops.example`, granted `ops`, and principal
/// `token-holder` by token `t`, granted `token_namespace`.
async fn gateway_with_client_ca(
    ca_pem: &str,
    require: bool,
    token_namespace: &str,
) -> (TestGateway, tempfile::TempDir) {
    let ca_dir = tempfile::tempdir().unwrap();
    let ca_path = ca_dir.path().join("client-ca.pem");
    std::fs::write(&ca_path, ca_pem).unwrap();
    let gateway = TestGateway::start(|config: &mut GatewayConfig| {
        config.tls.client_ca = ca_path.display().to_string();
        config.tls.require_client_cert = require;
        config.principals = vec![
            PrincipalSection {
                name: "operator".to_owned(),
                cert_subject: "ops.example".to_owned(),
                namespaces: vec!["ops".to_owned()],
                ..PrincipalSection::default()
            },
            PrincipalSection {
                name: "token-holder".to_owned(),
                token: "t".to_owned(),
                namespaces: vec![token_namespace.to_owned()],
                ..PrincipalSection::default()
            },
        ];
    })
    .await;
    (gateway, ca_dir)
}

/// One producer API call over a fresh TLS connection presenting `cert` and `token`; a failed
/// connection is reported as `UNAVAILABLE` with the connection error.
async fn describe_ops(
    gateway: &TestGateway,
    cert: Option<&ClientCertificates>,
    token: Option<&str>,
) -> Result<(), Status> {
    let addr = gateway.gateway().addr("grpc").unwrap();
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(gateway.ca_pem()));
    if let Some(cert) = cert {
        tls = tls.identity(Identity::from_pem(&cert.cert_pem, &cert.key_pem));
    }
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", addr.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|error| Status::unavailable(format!("connect: {error:?}")))?;
    let mut request = Request::new(pb::DescribePoolRequest {
        namespace: "ops".to_owned(),
        activity_type: "echo".to_owned(),
        ..pb::DescribePoolRequest::default()
    });
    if let Some(token) = token {
        let value: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
    }
    tokio::time::timeout(
        Duration::from_secs(5),
        GatewayClient::new(channel).describe_pool(request),
    )
    .await
    .map_err(|_| Status::deadline_exceeded("no answer in 5 s"))?
    .map(drop)
}

/// A refusal in the TLS handshake: the connection failed (the client's connect, or — with
/// TLS 1.3, where the server checks the client's certificate after the client is done — the
/// first call, whose status then carries the transport error as its source), so the call
/// never reached the service: neither an answer nor a status from the authentication layer,
/// nor a hang.
fn assert_refused_in_handshake(result: Result<(), Status>, what: &str) {
    let status = match result {
        Ok(()) => panic!("{what}: the call succeeded"),
        Err(status) => status,
    };
    let failed_to_connect = status.message().starts_with("connect: ");
    let transport_error = std::error::Error::source(&status)
        .is_some_and(|source| source.is::<tonic::transport::Error>());
    assert!(
        failed_to_connect || transport_error,
        "{what}: not a connection failure: {status:?}"
    );
    assert!(
        !matches!(
            status.code(),
            Code::Ok | Code::Unauthenticated | Code::PermissionDenied | Code::DeadlineExceeded
        ),
        "{what}: {status:?}"
    );
}

/// A QUIC worker refused in the handshake: the connection failed before any registration
/// answer (a refused registration would be `QuicLinkError::Refused`).
fn assert_quic_refused_in_handshake(result: Result<QuicWorker, WorkerError>, what: &str) {
    match result.as_ref().map_err(|e| e.link_error::<QuicLinkError>()) {
        Err(Some(QuicLinkError::Connection(_))) => {}
        other => panic!("{what}: expected a failed handshake, got {other:?}"),
    }
}

/// A QUIC SDK worker serving `ops`, presenting `cert` (or not) and `token` (or not).
async fn quic_worker_connects(
    gateway: &TestGateway,
    cert: Option<&ClientCertificates>,
    token: Option<&str>,
) -> Result<QuicWorker, WorkerError> {
    let tls = match cert {
        None => gateway.quic_tls(),
        Some(cert) => gateway.quic_tls_presenting(&cert.cert_pem, &cert.key_pem),
    };
    let mut builder = QuicWorker::builder(gateway.gateway().addr("quic").unwrap(), "localhost")
        .namespaces(["ops"])
        .max_concurrency(1)
        .tls(tls)
        .connect_timeout(Duration::from_secs(5))
        .activity("echo", |_: ActivityContext, input: Bytes| async move {
            Ok::<_, ActivityError>(input)
        });
    if let Some(token) = token {
        builder = builder.token(token);
    }
    // Returned alive: dropping the worker closes its connection and deregisters it.
    builder.connect().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_an_untrusted_ca_is_refused_in_the_handshake() {
    let trusted = client_certificates("ops.example");
    // Same subject, signed by a CA the gateway does not trust.
    let forged = client_certificates("ops.example");
    let (gateway, _ca_dir) = gateway_with_client_ca(&trusted.ca_pem, false, "ops").await;

    assert_refused_in_handshake(
        describe_ops(&gateway, Some(&forged), None).await,
        "gRPC, untrusted certificate",
    );
    // Even a valid token does not rescue a connection presenting an untrusted certificate.
    assert_refused_in_handshake(
        describe_ops(&gateway, Some(&forged), Some("t")).await,
        "gRPC, untrusted certificate with a valid token",
    );
    assert_quic_refused_in_handshake(
        quic_worker_connects(&gateway, Some(&forged), None).await,
        "QUIC, untrusted certificate",
    );
    assert!(gateway.gateway().core().registry().is_empty());

    // Controls: the trusted certificate and a token alone both get in.
    describe_ops(&gateway, Some(&trusted), None)
        .await
        .expect("the trusted certificate is accepted");
    describe_ops(&gateway, None, Some("t"))
        .await
        .expect("certificates are optional here");
    let worker = quic_worker_connects(&gateway, Some(&trusted), None)
        .await
        .expect("a QUIC worker with the trusted certificate registers");
    assert!(
        gateway
            .gateway()
            .core()
            .registry()
            .is_registered(worker.worker_id())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_client_certificates_refuse_token_only_callers_in_the_handshake() {
    let trusted = client_certificates("ops.example");
    let (gateway, _ca_dir) = gateway_with_client_ca(&trusted.ca_pem, true, "ops").await;

    assert_refused_in_handshake(
        describe_ops(&gateway, None, Some("t")).await,
        "gRPC, valid token but no certificate",
    );
    assert_refused_in_handshake(
        describe_ops(&gateway, None, None).await,
        "gRPC, no credential",
    );
    assert_quic_refused_in_handshake(
        quic_worker_connects(&gateway, None, Some("t")).await,
        "QUIC, valid token but no certificate",
    );
    assert!(gateway.gateway().core().registry().is_empty());

    // Control: the certificate gets in on both listeners.
    describe_ops(&gateway, Some(&trusted), None)
        .await
        .expect("the trusted certificate is accepted");
    let worker = quic_worker_connects(&gateway, Some(&trusted), None)
        .await
        .expect("a QUIC worker with the certificate registers");
    assert!(
        gateway
            .gateway()
            .core()
            .registry()
            .is_registered(worker.worker_id())
    );
}
