//! A certificate authority made fresh per test, and the server and client certificates it
//! issues, as PEM strings, DER values, files or rustls configs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls::RootCertStore;
use rustls::crypto::ring::default_provider;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A test certificate authority: a self-signed CA certificate and its key.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

/// A certificate a [`TestCa`] issued, with its private key.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key (PKCS#8), PEM.
    pub key_pem: String,
    cert_der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl TestCa {
    /// A fresh CA whose subject common name is `common_name`.
    pub fn new(common_name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::new()).expect("empty CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let key = KeyPair::generate().expect("generate the CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("self-sign the CA");
        Self { issuer }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA certificate, DER.
    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// Writes the CA certificate to `dir/name` and returns that path.
    pub fn write_to(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.pem()).expect("write the CA certificate");
        path
    }

    /// A server certificate for `localhost` and `127.0.0.1`.
    pub fn server(&self) -> Issued {
        let params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("server names are valid");
        self.issue(params)
    }

    /// A client certificate (client-auth usage) whose subject common name is `common_name`.
    pub fn client(&self, common_name: &str) -> Issued {
        let mut params = CertificateParams::new(Vec::new()).expect("empty client params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    /// A rustls client config trusting only this CA, presenting no certificate.
    pub fn rustls_client(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.der()).expect("a fresh CA is a valid root");
        Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth(),
        )
    }

    fn issue(&self, params: CertificateParams) -> Issued {
        let key = KeyPair::generate().expect("generate a key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("the CA signs the certificate");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }
}

impl Issued {
    /// The certificate, DER.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert_der.clone()
    }

    /// The private key, DER.
    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }

    /// Writes the certificate to `dir/cert_name` and the key to `dir/key_name`; returns the
    /// two paths in that order.
    pub fn write_to(&self, dir: &Path, cert_name: &str, key_name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (dir.join(cert_name), dir.join(key_name));
        std::fs::write(&cert, &self.cert_pem).expect("write the certificate");
        std::fs::write(&key, &self.key_pem).expect("write the key");
        (cert, key)
    }

    /// A rustls server config presenting this certificate, asking for no client certificate.
    pub fn rustls_server(&self) -> Arc<rustls::ServerConfig> {
        Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_no_client_auth()
                .with_single_cert(vec![self.cert_der()], self.key_der())
                .expect("the key matches its certificate"),
        )
    }
}
