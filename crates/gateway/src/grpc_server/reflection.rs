//! Server reflection, gated by `grpc.reflection`: off, open to every caller, or (the default)
//! only for callers a principal's credential identifies.

use std::sync::Arc;

use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Status};
use tonic_reflection::server::v1::{ServerReflection, ServerReflectionServer};

use crate::api::identify;
use crate::auth::Principals;
use crate::config::ReflectionName;
use crate::transport::TransportError;

/// Lets a reflection call through when the mode allows its caller.
#[derive(Clone, Debug)]
pub(crate) struct ReflectionGate {
    open: bool,
    principals: Arc<Principals>,
}

impl ReflectionGate {
    /// The gate for `mode`; callers are identified against `principals`.
    fn new(mode: ReflectionName, principals: &Arc<Principals>) -> Self {
        Self {
            open: mode == ReflectionName::Open,
            principals: Arc::clone(principals),
        }
    }
}

impl Interceptor for ReflectionGate {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if !self.open {
            identify(&self.principals, &request)?;
        }
        Ok(request)
    }
}

/// The reflection service `mode` asks for, listing the gateway's and health's services;
/// `None` when it is off.
pub(crate) fn service(
    mode: ReflectionName,
    principals: &Arc<Principals>,
) -> Result<
    Option<InterceptedService<ServerReflectionServer<impl ServerReflection>, ReflectionGate>>,
    TransportError,
> {
    if mode == ReflectionName::Off {
        return Ok(None);
    }
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(switchyard_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(TransportError::other)?;
    Ok(Some(InterceptedService::new(
        reflection,
        ReflectionGate::new(mode, principals),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PrincipalSection;

    fn principals() -> Arc<Principals> {
        Arc::new(Principals::new(&[PrincipalSection {
            name: "ops".to_owned(),
            token: "ops-token-0123456789".to_owned(),
            namespaces: vec!["*".to_owned()],
            ..PrincipalSection::default()
        }]))
    }

    fn request(token: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().unwrap();
            request.metadata_mut().insert("authorization", value);
        }
        request
    }

    #[test]
    fn authenticated_reflection_needs_a_credential_and_open_does_not() {
        let mut gate = ReflectionGate::new(ReflectionName::Authenticated, &principals());
        let refused = gate.call(request(None)).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        // Control: the principal's token lets the same call through.
        assert!(gate.call(request(Some("ops-token-0123456789"))).is_ok());
        let mut open = ReflectionGate::new(ReflectionName::Open, &principals());
        assert!(open.call(request(None)).is_ok());
    }

    #[test]
    fn off_serves_no_reflection() {
        assert!(
            service(ReflectionName::Off, &principals())
                .unwrap()
                .is_none()
        );
        assert!(
            service(ReflectionName::Authenticated, &principals())
                .unwrap()
                .is_some()
        );
    }
}
