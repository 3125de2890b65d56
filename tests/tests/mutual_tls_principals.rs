//! With a client CA configured, a producer or a worker presenting a client certificate is the
//! principal its subject names, granted what that principal is granted; callers without one
//! fall back to tokens.

// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::unwrap_used)]

use switchyard_gateway::PrincipalConfig;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::gateway_client::GatewayClient;
use switchyard_tests::TestGateway;
use tonic::Code;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

struct ClientCertificates {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn client_certificates(common_name: &str) -> ClientCertificates {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "test client CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, &ca_key);
    let mut client = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    client.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = rcgen::KeyPair::generate().unwrap();
    let client_cert = client.signed_by(&client_key, &issuer).unwrap();
    ClientCertificates {
        ca_pem: ca_cert.pem(),
        cert_pem: client_cert.pem(),
        key_pem: client_key.serialize_pem(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_names_the_principal() {
    let certs = client_certificates("ops.example");
    let ca_dir = tempfile::tempdir().unwrap();
    let ca_path = ca_dir.path().join("client-ca.pem");
    std::fs::write(&ca_path, &certs.ca_pem).unwrap();
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.tls.client_ca = ca_path.display().to_string();
        config.principals = vec![
            PrincipalConfig {
                name: "operator".to_owned(),
                cert_subject: "ops.example".to_owned(),
                namespaces: vec!["ops".to_owned()],
                ..PrincipalConfig::default()
            },
            PrincipalConfig {
                name: "token-holder".to_owned(),
                token: "t".to_owned(),
                namespaces: vec!["other".to_owned()],
                ..PrincipalConfig::default()
            },
        ];
    })
    .await;
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
