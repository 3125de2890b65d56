//! A throwaway certificate authority for tests, benchmarks and development gateways.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::{ClientTls, ServerTls, TlsError};

/// Why a self-signed identity could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SelfSignedError {
    /// Certificate generation failed.
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    /// The generated material was refused by rustls.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// A fresh CA, a server certificate it issued, and client certificates on demand.
///
/// # Examples
///
/// ```
/// use switchyard_transport_quic::SelfSigned;
///
/// let ca = SelfSigned::new(["localhost"])?;
/// let _server = ca.server_tls()?;
/// let _client = ca.client_tls()?;
/// # Ok::<(), switchyard_transport_quic::SelfSignedError>(())
/// ```
pub struct SelfSigned {
    ca: CertifiedIssuer<'static, KeyPair>,
    server_chain: Vec<CertificateDer<'static>>,
    server_key: Vec<u8>,
}

impl std::fmt::Debug for SelfSigned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelfSigned").finish_non_exhaustive()
    }
}

impl SelfSigned {
    /// A CA and a server certificate valid for `server_names` (DNS names or IP addresses).
    pub fn new<I, S>(server_names: I) -> Result<Self, SelfSignedError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(DnType::CommonName, "switchyard test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let names: Vec<String> = server_names.into_iter().map(Into::into).collect();
        let key = KeyPair::generate()?;
        let leaf = CertificateParams::new(names)?.signed_by(&key, &ca)?;
        Ok(Self {
            server_chain: vec![leaf.der().clone()],
            server_key: key.serialize_der(),
            ca,
        })
    }

    /// The CA certificate, to trust on either side.
    pub fn ca_certificate(&self) -> CertificateDer<'static> {
        self.ca.der().clone()
    }

    /// A root store holding only the CA.
    pub fn roots(&self) -> Result<RootCertStore, SelfSignedError> {
        let mut roots = RootCertStore::empty();
        roots
            .add(self.ca_certificate())
            .map_err(|error| SelfSignedError::Tls(error.into()))?;
        Ok(roots)
    }

    /// The gateway's TLS, server authentication only.
    pub fn server_tls(&self) -> Result<ServerTls, SelfSignedError> {
        Ok(ServerTls::new(
            self.server_chain.clone(),
            self.server_key(),
        )?)
    }

    /// The gateway's TLS, requiring client certificates issued by this CA.
    pub fn server_tls_mutual(&self) -> Result<ServerTls, SelfSignedError> {
        Ok(ServerTls::with_client_auth(
            self.server_chain.clone(),
            self.server_key(),
            self.roots()?,
        )?)
    }

    /// A worker's TLS trusting this CA, without a client certificate.
    pub fn client_tls(&self) -> Result<ClientTls, SelfSignedError> {
        Ok(ClientTls::new(self.roots()?)?)
    }

    /// A worker's TLS trusting this CA and presenting a fresh certificate for `common_name`.
    pub fn client_tls_with_cert(&self, common_name: &str) -> Result<ClientTls, SelfSignedError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok(ClientTls::with_client_cert(
            self.roots()?,
            vec![cert.der().clone()],
            key,
        )?)
    }

    fn server_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server_key.clone()))
    }
}
