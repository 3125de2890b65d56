//! Who is calling the API: the principal behind a gRPC request.

use switchyard_core::CallerIdentity;
use tonic::{Request, Status};

use switchyard_transport_grpc::certificate_principal;

use crate::auth::{AuthError, Credentials, Principals, bearer_token};

/// Identifies the caller of `request` from its verified client certificate or its
/// `authorization: Bearer` metadata; UNAUTHENTICATED when neither names a principal.
pub(crate) fn identify<T>(
    principals: &Principals,
    request: &Request<T>,
) -> Result<CallerIdentity, Status> {
    let subject = match request
        .peer_certs()
        .as_deref()
        .and_then(|certs| certs.first())
    {
        Some(cert) => Some(
            certificate_principal(cert)
                .map_err(|error| unauthenticated(AuthError::BadCertificate(error.to_string())))?,
        ),
        None => None,
    };
    let token = request
        .metadata()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .and_then(bearer_token);
    principals
        .identify(Credentials {
            cert_subject: subject.as_deref(),
            bearer_token: token,
        })
        .map_err(unauthenticated)
}

fn unauthenticated(error: AuthError) -> Status {
    Status::unauthenticated(error.to_string())
}
