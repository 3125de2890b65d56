//! What a caller presented on a connection or a call.

use std::net::SocketAddr;

use crate::{AuthError, certificate_principal};

/// What a transport found on a connection or call, handed to [`crate::Authenticate`].
///
/// Built with [`Credentials::new`] and the setters, so a transport fills in only what it has.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct Credentials<'a> {
    /// The DER leaf of the client certificate chain the TLS layer verified, if one was presented.
    pub certificate: Option<&'a [u8]>,
    /// The bearer token (already out of its `authorization` value, see
    /// [`crate::bearer_token`]), if one was presented.
    pub bearer_token: Option<&'a str>,
    /// The caller's address, when the transport knows it.
    pub remote: Option<SocketAddr>,
}

impl<'a> Credentials<'a> {
    /// No credential at all.
    pub fn new() -> Self {
        Self::default()
    }

    /// With the verified client certificate chain (leaf first); an empty chain adds nothing.
    pub fn certificate_chain<C: AsRef<[u8]>>(mut self, chain: &'a [C]) -> Self {
        self.certificate = chain.first().map(AsRef::as_ref);
        self
    }

    /// With a bearer token; an empty or blank token adds nothing.
    pub fn bearer_token(mut self, token: Option<&'a str>) -> Self {
        self.bearer_token = token.map(str::trim).filter(|token| !token.is_empty());
        self
    }

    /// With the caller's address.
    pub fn remote(mut self, remote: SocketAddr) -> Self {
        self.remote = Some(remote);
        self
    }

    /// The principal the certificate names ([`certificate_principal`]); `None` without one.
    pub fn certificate_principal(&self) -> Result<Option<String>, AuthError> {
        self.certificate.map(certificate_principal).transpose()
    }
}
