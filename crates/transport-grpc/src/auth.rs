//! Who is calling: the credentials a gRPC call carries, handed to the embedder's
//! [`Authenticate`].
//!
//! A call presents the TLS client certificate chain the server verified (mTLS) and/or an
//! `authorization: Bearer <token>` metadata entry; what they mean is `switchyard-auth`'s rule,
//! the same for worker streams and the gateway's producer API on the same port.

use switchyard_auth::{AuthError, Authenticate, Credentials, bearer_token};
use switchyard_core::CallerIdentity;
use tonic::Request;

/// The caller of `request`, from its verified client certificate chain and its
/// `authorization` metadata, as `auth` decides.
pub fn authenticate_request<T>(
    auth: &dyn Authenticate,
    request: &Request<T>,
) -> Result<CallerIdentity, AuthError> {
    let token = match request.metadata().get("authorization") {
        Some(value) => {
            let value = value
                .to_str()
                .map_err(|_| AuthError::MalformedAuthorization)?;
            bearer_token(value)?
        }
        None => None,
    };
    let chain = request.peer_certs();
    let mut credentials = Credentials::new().bearer_token(token);
    if let Some(chain) = chain.as_deref() {
        credentials = credentials.certificate_chain(chain);
    }
    if let Some(remote) = request.remote_addr() {
        credentials = credentials.remote(remote);
    }
    auth.authenticate(&credentials)
}

#[cfg(test)]
mod tests {
    use switchyard_auth::CallerTable;

    use super::*;

    fn request(authorization: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(value) = authorization {
            request
                .metadata_mut()
                .insert("authorization", value.parse().unwrap());
        }
        request
    }

    fn table() -> CallerTable {
        CallerTable::new().with_token("t1", CallerIdentity::granted("alice", ["a"]))
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        for value in ["Bearer t1", "bearer t1", " BEARER  t1 "] {
            let caller = authenticate_request(&table(), &request(Some(value)));
            assert_eq!(
                caller,
                Ok(CallerIdentity::granted("alice", ["a"])),
                "{value}"
            );
        }
    }

    #[test]
    fn malformed_unknown_and_missing_credentials_are_refused_by_name() {
        let cases = [
            (Some("t1"), AuthError::MalformedAuthorization),
            (Some("Basic dTpw"), AuthError::MalformedAuthorization),
            (Some("Bearer t2"), AuthError::TokenNotRecognised),
            (Some("Bearer "), AuthError::NoCredential),
            (None, AuthError::NoCredential),
        ];
        for (value, expected) in cases {
            let refused = authenticate_request(&table(), &request(value));
            assert_eq!(refused, Err(expected), "{value:?}");
        }
    }
}
