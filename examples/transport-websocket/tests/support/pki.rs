//! A self-signed certificate for `localhost` and `127.0.0.1`, and TLS configs trusting it.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::ring::default_provider;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A server config presenting a fresh self-signed certificate, and a client config trusting
/// exactly that certificate.
#[derive(Clone, Debug)]
pub struct Pki {
    pub server: Arc<rustls::ServerConfig>,
    pub client: Arc<rustls::ClientConfig>,
}

impl Pki {
    pub fn new() -> Self {
        let issued = rcgen::generate_simple_self_signed(vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
        ])
        .expect("generate a self-signed certificate");
        let cert: CertificateDer<'static> = issued.cert.der().clone();
        let key =
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(issued.signing_key.serialize_der()));
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key)
            .expect("the generated key matches its certificate");
        Self {
            server: Arc::new(server),
            client: client_trusting(cert),
        }
    }
}

/// A client config trusting only `cert`.
pub fn client_trusting(cert: CertificateDer<'static>) -> Arc<rustls::ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(cert)
        .expect("a freshly generated certificate is a valid root");
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}
