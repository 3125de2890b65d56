//! Who is calling the API: the principal behind a gRPC request.

use switchyard_core::CallerIdentity;
use switchyard_transport_grpc::authenticate_request;
use tonic::{Request, Status};

use crate::auth::Principals;

/// Identifies the caller of `request` from its verified client certificate or its
/// `authorization: Bearer` metadata, exactly as a gRPC worker stream on the same port is;
/// UNAUTHENTICATED when they name no principal.
pub(crate) fn identify<T>(
    principals: &Principals,
    request: &Request<T>,
) -> Result<CallerIdentity, Status> {
    authenticate_request(principals, request)
        .map_err(|error| Status::unauthenticated(error.to_string()))
}
