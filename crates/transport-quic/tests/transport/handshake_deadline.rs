//! A TLS handshake still unfinished at the registration deadline: the gateway drops the
//! connection without a code of its own (`docs/quic-protocol.md`, `REGISTRATION_TIMEOUT`).

use std::sync::Arc;
use std::time::Duration;

use quinn::{ConnectionError, Endpoint, TransportErrorCode};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::ring::default_provider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use switchyard_auth::AllowAll;
use switchyard_transport_quic::{ALPN, ErrorCode, QuicServerConfig};

use crate::support::Gateway;

/// The registration deadline of these tests.
const DEADLINE: Duration = Duration::from_millis(300);

/// Verifies the gateway's certificate as usual, after holding the client's handshake `stall`
/// long (the verifier runs inside the handshake, before the client's Finished).
#[derive(Debug)]
struct Stalling {
    inner: Arc<WebPkiServerVerifier>,
    stall: Duration,
}

impl ServerCertVerifier for Stalling {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // This blocks the client's own runtime thread, on purpose: the handshake goes no
        // further meanwhile, while the gateway's runtime runs on.
        std::thread::sleep(self.stall);
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Connects to `gateway` from a runtime of its own, the client's handshake held `stall`
/// long, and returns how the connection ended: `None` while it is still open after the
/// handshake and twice the deadline more.
fn connect_stalled(gateway: &Gateway, stall: Duration) -> Option<ConnectionError> {
    let provider = Arc::new(default_provider());
    let inner = WebPkiServerVerifier::builder_with_provider(
        Arc::new(gateway.ca.roots().unwrap()),
        Arc::clone(&provider),
    )
    .build()
    .unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Stalling { inner, stall }))
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let config = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    let addr = gateway.addr();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let endpoint = Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
            let connecting = endpoint.connect_with(config, addr, "localhost").unwrap();
            let conn = match connecting.await {
                Ok(conn) => conn,
                Err(error) => return Some(error),
            };
            tokio::time::timeout(2 * DEADLINE, conn.closed()).await.ok()
        })
    })
    .join()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_unfinished_at_the_registration_deadline_is_dropped_without_a_code() {
    let config = QuicServerConfig {
        registration_timeout: DEADLINE,
        ..QuicServerConfig::default()
    };
    let gateway = Gateway::with(config, AllowAll).await;
    // Control: a handshake that finishes in time, with no registration after it, is closed
    // at the deadline with the code that says so.
    let gateway_ref = &gateway;
    let finished = tokio::task::block_in_place(|| connect_stalled(gateway_ref, Duration::ZERO));
    match finished {
        Some(ConnectionError::ApplicationClosed(close)) => assert_eq!(
            close.error_code,
            ErrorCode::RegistrationTimeout.var_int(),
            "{:?}",
            close.reason
        ),
        other => panic!("expected REGISTRATION_TIMEOUT, got {other:?}"),
    }
    // Held past the deadline, the handshake never finishes: the gateway drops the connection,
    // and the worker sees application code 0 or, before 1-RTT keys, APPLICATION_ERROR.
    let unfinished = tokio::task::block_in_place(|| connect_stalled(gateway_ref, 3 * DEADLINE));
    match unfinished {
        Some(ConnectionError::ApplicationClosed(close)) => {
            assert_eq!(close.error_code, quinn::VarInt::from_u32(0), "{close:?}");
        }
        Some(ConnectionError::ConnectionClosed(close)) => {
            assert_eq!(
                close.error_code,
                TransportErrorCode::APPLICATION_ERROR,
                "{close:?}"
            );
        }
        other => panic!("expected the connection dropped without a code, got {other:?}"),
    }
    assert!(gateway.registry().is_empty());
}
