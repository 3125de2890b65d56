//! Who a connecting worker is: from its auth token and, under mutual TLS, its certificate.

use std::collections::HashMap;
use std::net::SocketAddr;

use rustls_pki_types::CertificateDer;
use switchyard_core::CallerIdentity;

/// What the gateway knows about a peer when its registration frame arrives.
#[derive(Debug)]
pub struct PeerCredentials<'a> {
    /// `QuicRegister.auth_token`, when not empty.
    pub token: Option<&'a str>,
    /// The client certificate chain (leaf first) rustls verified; empty without mutual TLS.
    pub certificates: &'a [CertificateDer<'static>],
    /// The peer's address at registration.
    pub remote: SocketAddr,
}

/// Why the gateway refused a peer's credentials (closed with `UNAUTHENTICATED`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// A token is required and `auth_token` was empty.
    #[error("auth_token is required")]
    MissingToken,
    /// The token is not one the gateway knows.
    #[error("auth_token is not recognised")]
    UnknownToken,
    /// A client certificate is required and none was presented.
    #[error("a client certificate is required")]
    CertificateRequired,
    /// Refused by an integrator's policy, with its reason.
    #[error("{0}")]
    Refused(String),
}

/// Turns a peer's credentials into the identity the admission gate checks.
///
/// Runs once per connection, after TLS (so any client certificate is already verified) and
/// before admission. It must not block: it runs on the connection's task.
pub trait Authenticator: Send + Sync + 'static {
    /// The caller identity for `peer`, or why it is refused.
    fn authenticate(&self, peer: &PeerCredentials<'_>) -> Result<CallerIdentity, AuthError>;
}

/// Accepts everyone as principal `anonymous` granted every namespace (development, or a
/// deployment where mutual TLS alone decides who may connect).
#[derive(Clone, Copy, Debug, Default)]
pub struct AllowAll;

impl Authenticator for AllowAll {
    fn authenticate(&self, _peer: &PeerCredentials<'_>) -> Result<CallerIdentity, AuthError> {
        Ok(CallerIdentity::trusted("anonymous"))
    }
}

/// A fixed table of bearer tokens, each mapped to the identity it grants.
///
/// # Examples
///
/// ```
/// use switchyard_core::CallerIdentity;
/// use switchyard_transport_quic::{AuthError, Authenticator, PeerCredentials, StaticTokens};
///
/// let tokens = StaticTokens::new([("s3cret", CallerIdentity::granted("billing-workers", ["billing"]))]);
/// let peer = PeerCredentials {
///     token: Some("s3cret"),
///     certificates: &[],
///     remote: "127.0.0.1:4000".parse().unwrap(),
/// };
/// assert_eq!(tokens.authenticate(&peer)?.principal, "billing-workers");
/// # Ok::<(), AuthError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct StaticTokens {
    tokens: HashMap<String, CallerIdentity>,
}

impl StaticTokens {
    /// A table from `(token, identity)` pairs.
    pub fn new<I, T>(entries: I) -> Self
    where
        I: IntoIterator<Item = (T, CallerIdentity)>,
        T: Into<String>,
    {
        Self {
            tokens: entries
                .into_iter()
                .map(|(token, identity)| (token.into(), identity))
                .collect(),
        }
    }
}

impl Authenticator for StaticTokens {
    fn authenticate(&self, peer: &PeerCredentials<'_>) -> Result<CallerIdentity, AuthError> {
        let token = peer.token.ok_or(AuthError::MissingToken)?;
        self.tokens
            .get(token)
            .cloned()
            .ok_or(AuthError::UnknownToken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(token: Option<&str>) -> PeerCredentials<'_> {
        PeerCredentials {
            token,
            certificates: &[],
            remote: SocketAddr::from(([127, 0, 0, 1], 1)),
        }
    }

    #[test]
    fn static_tokens_refuse_missing_and_unknown_tokens() {
        let tokens = StaticTokens::new([("a", CallerIdentity::trusted("alice"))]);
        assert_eq!(
            tokens.authenticate(&peer(Some("a"))).unwrap().principal,
            "alice"
        );
        assert_eq!(
            tokens.authenticate(&peer(None)),
            Err(AuthError::MissingToken)
        );
        assert_eq!(
            tokens.authenticate(&peer(Some("b"))),
            Err(AuthError::UnknownToken)
        );
    }
}
