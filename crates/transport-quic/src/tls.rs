//! TLS for both ends: TLS 1.3 only, the `switchyard-worker/1` ALPN, optional mutual TLS.

#[cfg(feature = "self-signed")]
mod self_signed;

use std::sync::Arc;

use quinn::crypto::rustls::{
    QuicClientConfig as QuinnClientCrypto, QuicServerConfig as QuinnServerCrypto,
};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[cfg(feature = "self-signed")]
pub use self_signed::{SelfSigned, SelfSignedError};

use crate::protocol::ALPN;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// rustls refused the certificate, key or settings.
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built from the roots given.
    #[error("tls client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The configuration lacks what QUIC needs (TLS 1.3 and its initial cipher suite).
    #[error("tls config unusable for QUIC: {0}")]
    NotQuic(#[from] quinn::crypto::rustls::NoInitialCipherSuite),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The gateway's TLS identity, and the client roots when mutual TLS is required.
#[derive(Clone)]
pub struct ServerTls {
    config: Arc<QuinnServerCrypto>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Server authentication only: workers are authenticated by token, if at all.
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, TlsError> {
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        Self::from_rustls(config)
    }

    /// Mutual TLS: every worker must present a certificate chaining to `client_roots`.
    pub fn with_client_auth(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        client_roots: RootCertStore,
    ) -> Result<Self, TlsError> {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(client_roots), provider())
                .build()?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)?;
        Self::from_rustls(config)
    }

    /// Wraps a prepared rustls config; the ALPN list is replaced by `switchyard-worker/1`.
    pub fn from_rustls(mut config: rustls::ServerConfig) -> Result<Self, TlsError> {
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(Self {
            config: Arc::new(QuinnServerCrypto::try_from(config)?),
        })
    }

    pub(crate) fn quic(&self) -> Arc<QuinnServerCrypto> {
        Arc::clone(&self.config)
    }
}

/// What a worker trusts, and its own certificate when the gateway requires mutual TLS.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<QuinnClientCrypto>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts gateways whose certificate chains to `roots`.
    pub fn new(roots: RootCertStore) -> Result<Self, TlsError> {
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Self::from_rustls(config)
    }

    /// Like [`ClientTls::new`], presenting `chain` for mutual TLS.
    pub fn with_client_cert(
        roots: RootCertStore,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, TlsError> {
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        Self::from_rustls(config)
    }

    /// Wraps a prepared rustls config; the ALPN list is replaced by `switchyard-worker/1`.
    pub fn from_rustls(mut config: rustls::ClientConfig) -> Result<Self, TlsError> {
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(Self {
            config: Arc::new(QuinnClientCrypto::try_from(config)?),
        })
    }

    pub(crate) fn quic(&self) -> Arc<QuinnClientCrypto> {
        Arc::clone(&self.config)
    }
}
