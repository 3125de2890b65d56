//! Why a caller is not authenticated.

/// Why a caller's credentials were refused; every variant means "not authenticated" on the wire.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// No client certificate and no bearer token, and anonymous callers are refused.
    #[error("no credential: present a client certificate or an authorization bearer token")]
    NoCredential,
    /// The `authorization` value is not `Bearer <token>`.
    #[error("authorization is not of the form \"Bearer <token>\"")]
    MalformedAuthorization,
    /// A bearer token came twice (e.g. in a header and in a registration frame).
    #[error("bearer token given twice")]
    TokenGivenTwice,
    /// The bearer token names no known caller.
    #[error("bearer token not recognised")]
    TokenNotRecognised,
    /// The verified client certificate names no known caller.
    #[error("client certificate subject {0:?} not recognised")]
    SubjectNotRecognised(String),
    /// The client certificate's subject could not be read.
    #[error("client certificate unreadable: {0}")]
    UnreadableCertificate(String),
    /// Refused by an embedder's own policy, with its reason.
    #[error("{0}")]
    Refused(String),
}
