//! The same credential gets the same answer on every transport and on the producer API: the
//! table "Credentials × transports" in `docs/security.md`, walked row by row over real sockets
//! against one gateway whose principal table knows a token and a certificate subject.
//!
//! Rows whose answer differs from the gateway before authentication had one vocabulary:
//! - `bearer t` (lower-case scheme) on the gRPC worker stream: was UNAUTHENTICATED (the worker
//!   service parsed `Bearer ` case-sensitively); now admitted, as on the producer API.
//! - a trusted certificate with an unknown subject on the gRPC worker stream: was admitted with
//!   no grant and refused PERMISSION_DENIED at registration; now UNAUTHENTICATED, as on QUIC
//!   and the producer API.
//!
//! A principal at `principals[].max_workers` is refused on QUIC as the limits table says: the
//! connection closed `UNAVAILABLE` with the key in its reason, counted on `/metrics`.
//!
//! The WebSocket transport takes no client certificate; its token rows are covered in its own
//! crate (`examples/transport-websocket`, `auth.rs` and `tests/wire.rs`).

// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use switchyard_gateway::{GatewayConfig, PrincipalSection, RoleName};
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::gateway_client::GatewayClient;
use switchyard_proto::v1::worker_gateway_client::WorkerGatewayClient;
use switchyard_test_support::{Issued, TestCa};
use switchyard_tests::{TestGateway, raw_registration};
use switchyard_transport_quic::{
    ActivityContext, ActivityError, ErrorCode, QuicLinkError, QuicWorker,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};

/// The namespace both known principals are granted.
const GRANTED: &str = "ops";
/// A namespace nobody is granted.
const NOT_GRANTED: &str = "payroll";
/// The token of principal `token-holder`.
const TOKEN: &str = "t-ops-0123456789";
/// The token of principal `producer-only` (roles `producer`), granted [`GRANTED`].
const PRODUCER_TOKEN: &str = "t-producer";
/// The token of principal `worker-only` (roles `worker`), granted [`GRANTED`].
const WORKER_TOKEN: &str = "t-worker";
/// The certificate subject of principal `operator`.
const KNOWN_SUBJECT: &str = "ops.example";
/// A subject the CA signs but the principal table does not know.
const UNKNOWN_SUBJECT: &str = "stranger.example";

/// The answer's family, the same on every transport.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    /// Authenticated and admitted (a worker registered, a producer call answered).
    Admitted,
    /// gRPC `UNAUTHENTICATED`, QUIC `UNAUTHENTICATED` close.
    Unauthenticated,
    /// gRPC `PERMISSION_DENIED`, QUIC `NAMESPACE_NOT_GRANTED` close (a namespace outside the
    /// grant, or a role the principal lacks).
    NotGranted,
    /// Anything else, with what it was.
    Other(String),
}

fn grpc_answer(status: &Status) -> Answer {
    match status.code() {
        Code::Unauthenticated => Answer::Unauthenticated,
        Code::PermissionDenied => Answer::NotGranted,
        _ => Answer::Other(format!("{status:?}")),
    }
}

/// An answer and, for a gRPC refusal, its message (empty otherwise).
struct Said {
    answer: Answer,
    message: String,
}

impl From<Answer> for Said {
    fn from(answer: Answer) -> Self {
        Self {
            answer,
            message: String::new(),
        }
    }
}

fn said(status: &Status) -> Said {
    Said {
        answer: grpc_answer(status),
        message: status.message().to_owned(),
    }
}

/// One row of the table.
struct Row {
    credential: &'static str,
    certificate: Option<&'static str>,
    /// The `authorization` value on gRPC; QUIC carries the bare token after the scheme.
    authorization: Option<&'static str>,
    namespace: &'static str,
    expected: Answer,
    /// The producer API's answer when it differs from the workers' (a role one has and the
    /// other needs).
    api: Option<Answer>,
    /// What the gRPC worker stream's refusal message says (each part), as the table quotes it.
    grpc_says: &'static [&'static str],
    /// What the producer API's refusal message says (each part), as the table quotes it.
    api_says: &'static [&'static str],
}

fn rows() -> Vec<Row> {
    vec![
        Row {
            credential: "valid token, `Bearer`",
            certificate: None,
            authorization: Some("Bearer t-ops-0123456789"),
            namespace: GRANTED,
            expected: Answer::Admitted,
            api: None,
            grpc_says: &[],
            api_says: &[],
        },
        Row {
            credential: "valid token, `bearer`",
            certificate: None,
            authorization: Some("bearer t-ops-0123456789"),
            namespace: GRANTED,
            expected: Answer::Admitted,
            api: None,
            grpc_says: &[],
            api_says: &[],
        },
        Row {
            credential: "unknown token",
            certificate: None,
            authorization: Some("Bearer guess"),
            namespace: GRANTED,
            expected: Answer::Unauthenticated,
            api: None,
            grpc_says: &["bearer token not recognised"],
            api_says: &["bearer token not recognised"],
        },
        Row {
            credential: "no credential",
            certificate: None,
            authorization: None,
            namespace: GRANTED,
            expected: Answer::Unauthenticated,
            api: None,
            grpc_says: &["no credential: "],
            api_says: &["no credential: "],
        },
        Row {
            credential: "another scheme (`Basic`)",
            certificate: None,
            authorization: Some("Basic dC1vcHM6dC1vcHM="),
            namespace: GRANTED,
            expected: Answer::Unauthenticated,
            api: None,
            grpc_says: &[],
            api_says: &[],
        },
        Row {
            credential: "trusted certificate, known subject",
            certificate: Some(KNOWN_SUBJECT),
            authorization: None,
            namespace: GRANTED,
            expected: Answer::Admitted,
            api: None,
            grpc_says: &[],
            api_says: &[],
        },
        Row {
            credential: "trusted certificate, unknown subject (with a valid token)",
            certificate: Some(UNKNOWN_SUBJECT),
            authorization: Some("Bearer t-ops-0123456789"),
            namespace: GRANTED,
            expected: Answer::Unauthenticated,
            api: None,
            grpc_says: &["client certificate subject", "not recognised"],
            api_says: &["client certificate subject", "not recognised"],
        },
        Row {
            credential: "valid token, namespace not granted",
            certificate: None,
            authorization: Some("Bearer t-ops-0123456789"),
            namespace: NOT_GRANTED,
            expected: Answer::NotGranted,
            api: None,
            grpc_says: &[],
            api_says: &[],
        },
        Row {
            credential: "valid token, principal without the `worker` role",
            certificate: None,
            authorization: Some("Bearer t-producer"),
            namespace: GRANTED,
            expected: Answer::NotGranted,
            api: Some(Answer::Admitted),
            grpc_says: &["principal `producer-only` lacks role `worker` to register a worker"],
            api_says: &[],
        },
        Row {
            credential: "valid token, principal with only the `worker` role",
            certificate: None,
            authorization: Some("Bearer t-worker"),
            namespace: GRANTED,
            expected: Answer::Admitted,
            api: Some(Answer::NotGranted),
            grpc_says: &[],
            api_says: &[
                "principal `worker-only` lacks role `producer` or `operator` for DescribePool",
            ],
        },
        Row {
            credential: "known certificate, namespace not granted",
            certificate: Some(KNOWN_SUBJECT),
            authorization: None,
            namespace: NOT_GRANTED,
            expected: Answer::NotGranted,
            api: None,
            grpc_says: &[],
            api_says: &[],
        },
    ]
}

/// A client CA and the certificates it issues.
struct Pki {
    ca: TestCa,
    ca_pem: String,
}

impl Pki {
    fn new() -> Self {
        let ca = TestCa::new("test client CA");
        Self {
            ca_pem: ca.pem(),
            ca,
        }
    }

    fn issue(&self, common_name: &str) -> Issued {
        self.ca.client(common_name)
    }
}

/// A gateway trusting `pki`'s client certificates (optional), knowing principal `operator` by
/// [`KNOWN_SUBJECT`] and principal `token-holder` by [`TOKEN`], both granted [`GRANTED`].
async fn gateway(pki: &Pki) -> (TestGateway, tempfile::TempDir) {
    let ca_dir = tempfile::tempdir().unwrap();
    let ca_path = ca_dir.path().join("client-ca.pem");
    std::fs::write(&ca_path, &pki.ca_pem).unwrap();
    let gateway = TestGateway::start(|config: &mut GatewayConfig| {
        config.tls.client_ca = ca_path.display().to_string();
        config.tls.require_client_cert = false;
        config.principals = vec![
            PrincipalSection {
                name: "operator".to_owned(),
                cert_subject: KNOWN_SUBJECT.to_owned(),
                namespaces: vec![GRANTED.to_owned()],
                ..PrincipalSection::default()
            },
            PrincipalSection {
                name: "token-holder".to_owned(),
                token: TOKEN.to_owned(),
                namespaces: vec![GRANTED.to_owned()],
                ..PrincipalSection::default()
            },
            PrincipalSection {
                name: "producer-only".to_owned(),
                token: PRODUCER_TOKEN.to_owned(),
                namespaces: vec![GRANTED.to_owned()],
                roles: Some(vec![RoleName::Producer]),
                ..PrincipalSection::default()
            },
            PrincipalSection {
                name: "worker-only".to_owned(),
                token: WORKER_TOKEN.to_owned(),
                namespaces: vec![GRANTED.to_owned()],
                roles: Some(vec![RoleName::Worker]),
                ..PrincipalSection::default()
            },
        ];
    })
    .await;
    (gateway, ca_dir)
}

/// A fresh TLS channel to the gRPC port, presenting `certificate` when given.
async fn grpc_channel(gateway: &TestGateway, certificate: Option<&Issued>) -> Channel {
    let addr = gateway.gateway().addr("grpc").unwrap();
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(gateway.ca_pem()));
    if let Some(certificate) = certificate {
        tls = tls.identity(Identity::from_pem(
            &certificate.cert_pem,
            &certificate.key_pem,
        ));
    }
    Endpoint::from_shared(format!("https://127.0.0.1:{}", addr.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap()
}

fn with_authorization<T>(message: T, authorization: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(value) = authorization {
        request
            .metadata_mut()
            .insert("authorization", value.parse().unwrap());
    }
    request
}

/// A producer API call (`DescribePool` on the row's namespace).
async fn producer_api(gateway: &TestGateway, certificate: Option<&Issued>, row: &Row) -> Said {
    let mut client = GatewayClient::new(grpc_channel(gateway, certificate).await);
    let request = with_authorization(
        pb::DescribePoolRequest {
            namespace: row.namespace.to_owned(),
            activity_type: "echo".to_owned(),
            ..pb::DescribePoolRequest::default()
        },
        row.authorization,
    );
    match tokio::time::timeout(Duration::from_secs(5), client.describe_pool(request)).await {
        Err(_) => Answer::Other("no answer in 5 s".to_owned()).into(),
        Ok(Ok(_)) => Answer::Admitted.into(),
        Ok(Err(status)) => said(&status),
    }
}

/// A gRPC worker stream registering for the row's namespace.
async fn grpc_worker(gateway: &TestGateway, certificate: Option<&Issued>, row: &Row) -> Said {
    let mut client = WorkerGatewayClient::new(grpc_channel(gateway, certificate).await);
    let (send, frames) = mpsc::channel(4);
    send.send(raw_registration(row.namespace, "echo", 1))
        .await
        .unwrap();
    let request = with_authorization(ReceiverStream::new(frames), row.authorization);
    let answered = tokio::time::timeout(Duration::from_secs(5), async {
        let mut replies = match client.connect_worker(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return said(&status),
        };
        loop {
            match replies.message().await {
                Ok(Some(pb::GatewayFrame {
                    frame: Some(pb::gateway_frame::Frame::RegisterAck(_)),
                })) => return Answer::Admitted.into(),
                Ok(Some(_)) => {}
                Ok(None) => return Answer::Other("stream ended without an answer".into()).into(),
                Err(status) => return said(&status),
            }
        }
    })
    .await;
    drop(send);
    answered.unwrap_or_else(|_| Answer::Other("no answer in 5 s".to_owned()).into())
}

/// A QUIC SDK worker registering for the row's namespace; the token is the part of the row's
/// `authorization` after the scheme (QUIC's registration carries a bare token).
async fn quic_worker(gateway: &TestGateway, certificate: Option<&Issued>, row: &Row) -> Answer {
    let tls = match certificate {
        None => gateway.quic_tls(),
        Some(certificate) => {
            gateway.quic_tls_presenting(&certificate.cert_pem, &certificate.key_pem)
        }
    };
    let mut builder = QuicWorker::builder(gateway.gateway().addr("quic").unwrap(), "localhost")
        .namespaces([row.namespace])
        .max_concurrency(1)
        .tls(tls)
        .connect_timeout(Duration::from_secs(5))
        .activity("echo", |_: ActivityContext, input: Bytes| async move {
            Ok::<_, ActivityError>(input)
        });
    if let Some((_scheme, token)) = row.authorization.and_then(|value| value.split_once(' ')) {
        builder = builder.token(token);
    }
    let error = match builder.connect().await {
        Ok(_worker) => return Answer::Admitted,
        Err(error) => error,
    };
    match error.link_error::<QuicLinkError>() {
        Some(QuicLinkError::Refused {
            code: ErrorCode::Unauthenticated,
            ..
        }) => Answer::Unauthenticated,
        Some(QuicLinkError::Refused {
            code: ErrorCode::NamespaceNotGranted,
            ..
        }) => Answer::NotGranted,
        _ => Answer::Other(error.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_credential_gets_the_same_answer_on_every_transport() {
    let pki = Pki::new();
    let known = pki.issue(KNOWN_SUBJECT);
    let unknown = pki.issue(UNKNOWN_SUBJECT);
    let (gateway, _ca_dir) = gateway(&pki).await;

    let mut mismatches = Vec::new();
    for row in rows() {
        let certificate = match row.certificate {
            Some(KNOWN_SUBJECT) => Some(&known),
            Some(_) => Some(&unknown),
            None => None,
        };
        let answers = [
            (
                "gRPC worker stream",
                grpc_worker(&gateway, certificate, &row).await,
                row.grpc_says,
            ),
            (
                "QUIC worker",
                quic_worker(&gateway, certificate, &row).await.into(),
                &[],
            ),
            (
                "producer API",
                producer_api(&gateway, certificate, &row).await,
                row.api_says,
            ),
        ];
        for (transport, Said { answer, message }, says) in answers {
            let expected = match (&row.api, transport) {
                (Some(api), "producer API") => api,
                _ => &row.expected,
            };
            if &answer != expected {
                mismatches.push(format!(
                    "{} on the {transport}: expected {expected:?}, got {answer:?}",
                    row.credential
                ));
            }
            if let Some(part) = says.iter().find(|part| !message.contains(*part)) {
                mismatches.push(format!(
                    "{} on the {transport}: the message does not say {part:?}: {message:?}",
                    row.credential
                ));
            }
        }
    }
    // Every transport is asked every row, and the rows hold admissions and both refusal
    // families, so a transport that admitted everyone, or refused everyone alike, fails here.
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_at_max_workers_is_refused_over_quic_closing_unavailable_naming_the_key() {
    const CAPPED: &str = "t-capped-quic-worker";
    let gateway = TestGateway::start(|config: &mut GatewayConfig| {
        config.principals = vec![PrincipalSection {
            name: "capped".to_owned(),
            token: CAPPED.to_owned(),
            namespaces: vec![GRANTED.to_owned()],
            max_workers: 1,
            ..PrincipalSection::default()
        }];
    })
    .await;
    let connect = || {
        QuicWorker::builder(gateway.gateway().addr("quic").unwrap(), "localhost")
            .namespaces([GRANTED])
            .max_concurrency(1)
            .tls(gateway.quic_tls())
            .token(CAPPED)
            .connect_timeout(Duration::from_secs(5))
            .activity("echo", |_: ActivityContext, input: Bytes| async move {
                Ok::<_, ActivityError>(input)
            })
            .connect()
    };
    let refusals = || async {
        let ops = gateway.gateway().ops_addr().unwrap();
        let reason = "reason=\"principal_max_workers\"";
        switchyard_tests::counter(ops, "switchyard_admission_refusals_total", reason)
            .await
            .unwrap()
    };
    // Control: the principal's first worker is within its limit.
    let first = connect().await.expect("the first worker is admitted");
    // Served, so it answers the gateway's pings and stays registered however slow this run.
    let serving = tokio::spawn(first.run());
    assert_eq!(refusals().await, 0);
    let error = match connect().await {
        Ok(_) => panic!("a second worker of a principal with max_workers 1 was admitted"),
        Err(error) => error,
    };
    match error.link_error::<QuicLinkError>() {
        Some(QuicLinkError::Refused {
            code: ErrorCode::Unavailable,
            reason,
        }) => assert!(
            reason.contains("`principals[].max_workers` (1) reached for principal `capped`"),
            "{reason}"
        ),
        _ => panic!("expected a close with UNAVAILABLE: {error}"),
    }
    assert_eq!(refusals().await, 1, "the refusal is counted");
    assert!(!serving.is_finished(), "the first worker is still served");
    serving.abort();
}
