//! Who is calling: the principal behind a worker stream, and what it is granted.
//!
//! A caller that presents a TLS client certificate (mTLS) is the certificate's subject; the
//! TLS layer has already verified the chain against the server's client CA. Otherwise the
//! caller is whoever holds the `authorization: Bearer <token>` metadata entry, looked up in the
//! embedder's [`CallerDirectory`]. With neither, the configured anonymous identity applies, or
//! the call is refused. Which namespaces the principal may register into is core's decision,
//! made at the admission gate from the grant found here.

mod certificate;

use std::collections::HashMap;

use switchyard_core::{CallerIdentity, NamespaceGrant};
use tonic::metadata::MetadataMap;

pub use certificate::certificate_principal;

/// Where the transport looks up callers; provided by the embedder (the gateway's principal
/// table).
pub trait CallerDirectory: Send + Sync + 'static {
    /// The caller holding bearer `token`; `None` when the token is unknown.
    fn by_token(&self, token: &str) -> Option<CallerIdentity>;

    /// The caller named `principal` by a verified client certificate; `None` when the
    /// directory does not know it (the caller is then granted no namespace).
    fn by_certificate(&self, principal: &str) -> Option<CallerIdentity>;
}

/// A fixed [`CallerDirectory`] built in memory.
///
/// # Examples
///
/// ```
/// use switchyard_core::{CallerIdentity, NamespaceGrant};
/// use switchyard_transport_grpc::{CallerDirectory, StaticDirectory};
///
/// let directory = StaticDirectory::new()
///     .with_token("s3cret", CallerIdentity::granted("billing-workers", ["billing"]))
///     .with_certificate("worker-1.example", NamespaceGrant::All);
/// assert_eq!(directory.by_token("s3cret").unwrap().principal, "billing-workers");
/// assert!(directory.by_token("guess").is_none());
/// ```
#[derive(Clone, Debug, Default)]
pub struct StaticDirectory {
    tokens: HashMap<String, CallerIdentity>,
    certificates: HashMap<String, NamespaceGrant>,
}

impl StaticDirectory {
    /// An empty directory: every token is unknown and every certificate principal has no grant.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a bearer token and the caller it authenticates.
    pub fn with_token(mut self, token: impl Into<String>, caller: CallerIdentity) -> Self {
        self.tokens.insert(token.into(), caller);
        self
    }

    /// Grants `grant` to the certificate principal `principal` (see [`certificate_principal`]).
    pub fn with_certificate(mut self, principal: impl Into<String>, grant: NamespaceGrant) -> Self {
        self.certificates.insert(principal.into(), grant);
        self
    }
}

impl CallerDirectory for StaticDirectory {
    fn by_token(&self, token: &str) -> Option<CallerIdentity> {
        self.tokens.get(token).cloned()
    }

    fn by_certificate(&self, principal: &str) -> Option<CallerIdentity> {
        self.certificates
            .get(principal)
            .map(|grant| CallerIdentity {
                principal: principal.to_owned(),
                grant: grant.clone(),
            })
    }
}

/// Why a caller could not be authenticated; every variant maps to UNAUTHENTICATED.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthenticationError {
    /// Neither a client certificate nor a bearer token, and anonymous callers are refused.
    #[error("no client certificate and no authorization bearer token")]
    NoCredentials,
    /// The `authorization` metadata entry is not `Bearer <token>`.
    #[error("authorization metadata is not of the form \"Bearer <token>\"")]
    MalformedAuthorization,
    /// The bearer token is not in the directory.
    #[error("bearer token not recognised")]
    UnknownToken,
    /// The client certificate's subject could not be read.
    #[error("client certificate unreadable: {0}")]
    UnreadableCertificate(String),
}

/// Resolves the caller of one call from its verified client certificate chain (leaf first)
/// and its metadata.
pub(crate) fn authenticate(
    peer_certificates: Option<&[impl AsRef<[u8]>]>,
    metadata: &MetadataMap,
    directory: &dyn CallerDirectory,
    anonymous: Option<&CallerIdentity>,
) -> Result<CallerIdentity, AuthenticationError> {
    if let Some(leaf) = peer_certificates.and_then(<[_]>::first) {
        let principal = certificate_principal(leaf.as_ref())?;
        return Ok(directory
            .by_certificate(&principal)
            .unwrap_or_else(|| CallerIdentity {
                principal,
                grant: NamespaceGrant::Only(Default::default()),
            }));
    }
    let Some(value) = metadata.get("authorization") else {
        return anonymous.cloned().ok_or(AuthenticationError::NoCredentials);
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(AuthenticationError::MalformedAuthorization)?;
    directory
        .by_token(token)
        .ok_or(AuthenticationError::UnknownToken)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(authorization: Option<&str>) -> MetadataMap {
        let mut map = MetadataMap::new();
        if let Some(value) = authorization {
            map.insert("authorization", value.parse().unwrap());
        }
        map
    }

    fn directory() -> StaticDirectory {
        StaticDirectory::new()
            .with_token("t1", CallerIdentity::granted("alice", ["a"]))
            .with_certificate("worker.test", NamespaceGrant::All)
    }

    const NO_CERTS: Option<&[Vec<u8>]> = None;

    #[test]
    fn bearer_token_resolves_through_the_directory() {
        let caller =
            authenticate(NO_CERTS, &metadata(Some("Bearer t1")), &directory(), None).unwrap();
        assert_eq!(caller, CallerIdentity::granted("alice", ["a"]));
        let unknown = authenticate(NO_CERTS, &metadata(Some("Bearer t2")), &directory(), None);
        assert_eq!(unknown, Err(AuthenticationError::UnknownToken));
    }

    #[test]
    fn malformed_authorization_is_refused() {
        for value in ["t1", "Basic dTpw", "Bearer ", "bearer t1"] {
            let refused = authenticate(NO_CERTS, &metadata(Some(value)), &directory(), None);
            assert_eq!(
                refused,
                Err(AuthenticationError::MalformedAuthorization),
                "{value}"
            );
        }
    }

    #[test]
    fn no_credentials_is_refused_unless_anonymous_is_configured() {
        let refused = authenticate(NO_CERTS, &metadata(None), &directory(), None);
        assert_eq!(refused, Err(AuthenticationError::NoCredentials));
        let guest = CallerIdentity::granted("anonymous", ["public"]);
        let admitted = authenticate(NO_CERTS, &metadata(None), &directory(), Some(&guest));
        assert_eq!(admitted, Ok(guest));
    }

    fn certificate(common_name: &str) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn certificate_wins_over_token() {
        let certs = [certificate("worker.test")];
        let caller = authenticate(
            Some(&certs[..]),
            &metadata(Some("Bearer t1")),
            &directory(),
            None,
        )
        .unwrap();
        assert_eq!(caller.principal, "worker.test");
        assert_eq!(caller.grant, NamespaceGrant::All);
    }

    #[test]
    fn unknown_certificate_principal_is_granted_nothing() {
        let certs = [certificate("stranger")];
        let caller = authenticate(Some(&certs[..]), &metadata(None), &directory(), None).unwrap();
        assert_eq!(caller.principal, "stranger");
        assert!(!caller.grant.allows("a"));
    }
}
