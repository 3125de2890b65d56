//! The built-in gRPC transport: one TCP port carrying the producer API, the gRPC worker
//! service, the standard health service and server reflection.
//!
//! It is started through [`Transport`] like any other transport. The producer API is always
//! mounted; `grpc.workers = false` leaves the worker service out. Workers and producers are
//! identified against the same principal table.
//!
//! Before any credential is checked a connection is bounded: it is counted against
//! `grpc.max_connections` and `grpc.max_connections_per_address` at accept, has
//! `grpc.handshake_timeout` to finish TLS, and may open `grpc.max_concurrent_streams` HTTP/2
//! streams. Health needs no credential, so its `Watch` streams have a ceiling of their own;
//! reflection needs one unless `grpc.reflection = "open"`.

mod health;
mod reflection;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use switchyard_proto::v1::gateway_server::GatewayServer;
use tokio::net::TcpListener;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use switchyard_transport_grpc::{AcceptConfig, GrpcServerConfig, WorkerService, limited_incoming};

use crate::api::{ApiConfig, DurabilityDefaults, GatewayApi, OversizedAsExhausted};
use crate::config::GrpcSection;
use crate::tls::TlsMaterial;
use crate::transport::{
    ListenAddr, Listening, Protocol, Transport, TransportContext, TransportError,
};

/// How long the server may take to finish its last connections after `close` fires.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// `grpc.max_health_watchers`'s default: health `Watch` streams open at once.
pub(crate) const DEFAULT_MAX_HEALTH_WATCHERS: usize = 1024;

/// The built-in gRPC transport and producer API server.
#[derive(Clone, Debug)]
pub struct GrpcTransport {
    section: GrpcSection,
    api: ApiConfig,
    durability: DurabilityDefaults,
}

impl GrpcTransport {
    /// A transport serving `section` with the producer API configured by `api`; a dispatch
    /// that leaves `durable` unset is ephemeral.
    pub fn new(section: GrpcSection, api: ApiConfig) -> Self {
        Self {
            section,
            api,
            durability: DurabilityDefaults::default(),
        }
    }

    /// Makes a dispatch that leaves `durable` unset durable as the configuration says.
    pub(crate) fn with_durability(mut self, durability: DurabilityDefaults) -> Self {
        self.durability = durability;
        self
    }
}

fn server_tls(tls: &TlsMaterial) -> ServerTlsConfig {
    let mut config =
        ServerTlsConfig::new().identity(Identity::from_pem(tls.cert_pem(), tls.key_pem()));
    if let Some(ca) = tls.client_ca_pem() {
        // Unless required, callers without a certificate may still authenticate with a token;
        // a certificate that is presented must chain to the CA either way.
        config = config
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(!tls.client_cert_required());
    }
    config
}

/// The worker service's settings from the gateway's `[grpc]` section.
pub(crate) fn worker_config(section: &GrpcSection) -> GrpcServerConfig {
    GrpcServerConfig {
        registration_deadline: section.registration_deadline.get(),
        keepalive_interval: Some(section.keepalive_interval.get()),
        keepalive_timeout: section.keepalive_timeout.get(),
        max_message_bytes: section.max_message_size,
        tcp_nodelay: section.tcp_nodelay,
        max_workers_per_connection: section.max_workers_per_connection,
        handshake_timeout: section.handshake_timeout.get(),
        max_concurrent_streams: section.max_concurrent_streams,
        max_connections: section.max_connections,
        max_connections_per_address: section.max_connections_per_address,
        reconnect_grace: section.reconnect_grace.get(),
        ..GrpcServerConfig::default()
    }
}

#[async_trait]
impl Transport for GrpcTransport {
    fn name(&self) -> &str {
        "grpc"
    }

    async fn start(
        self: Box<Self>,
        context: TransportContext,
    ) -> Result<Listening, TransportError> {
        let section = self.section;
        let addr = section.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| TransportError::Bind { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| TransportError::Bind { addr, source })?;
        let library = worker_config(&section);
        let incoming = limited_incoming(
            listener,
            AcceptConfig {
                name: "grpc",
                limits: library.connection_limits(),
                nodelay: library.tcp_nodelay,
            },
        );

        let mut server = library.server_builder();
        if section.tls {
            server = server
                .tls_config(library.tls(server_tls(&context.tls)))
                .map_err(|error| TransportError::Tls(error.to_string()))?;
        }

        let health = tonic_health::server::HealthReporter::new();
        health.set_serving::<GatewayServer<GatewayApi>>().await;
        let health_service =
            health::CappedHealth::new(health.clone(), section.max_health_watchers).into_server();
        let reflection = reflection::service(section.reflection, &context.principals)?;
        let max_input = context.core.dispatcher().max_input_bytes();
        let api = GatewayApi::new(
            context.core.clone(),
            context.durable.clone(),
            Arc::clone(&context.principals),
            self.api,
        )
        .durability(self.durability)
        .ending_on(context.close.clone())
        .cluster_wide(context.cluster.clone())
        .into_service()
        .max_decoding_message_size(crate::limits::api_decode_limit(
            section.max_message_size,
            max_input,
        ))
        .max_encoding_message_size(section.max_message_size);
        let api = OversizedAsExhausted::new(api, max_input);

        let workers = section.workers.then(|| {
            WorkerService::new(
                context.core.clone(),
                context.principals.clone(),
                worker_config(&section),
            )
            .into_server()
        });

        let router = server
            .add_service(health_service)
            .add_optional_service(reflection)
            .add_service(api)
            .add_optional_service(workers);

        let stop_accepting = context.stop_accepting.clone();
        let close = context.close.clone();
        let serving = async move {
            // The listener keeps accepting through the shutdown grace: producers still get a
            // `shutting_down` outcome for a new dispatch (and core refuses new workers) instead
            // of a transport error. Health reports not serving from the start of the grace;
            // the listener closes (and HTTP/2 GOAWAY goes out) only once `close` fires.
            let not_serving = {
                let health = health.clone();
                async move {
                    stop_accepting.cancelled().await;
                    health.set_not_serving::<GatewayServer<GatewayApi>>().await;
                    // The whole server too: the empty name is what a default probe asks for.
                    health
                        .set_service_status("", tonic_health::ServingStatus::NotServing)
                        .await;
                }
            };
            let serve =
                router.serve_with_incoming_shutdown(incoming, close.clone().cancelled_owned());
            tokio::pin!(serve);
            tokio::pin!(not_serving);
            let mut reported = false;
            loop {
                tokio::select! {
                    result = &mut serve => return result.map_err(TransportError::other),
                    () = &mut not_serving, if !reported => reported = true,
                    () = close.cancelled() => break,
                }
            }
            // Connections still open after the drain get a short grace, then are left to end
            // with the process.
            match tokio::time::timeout(CLOSE_GRACE, serve).await {
                Ok(result) => result.map_err(TransportError::other),
                Err(_) => Ok(()),
            }
        };
        Ok(Listening {
            addrs: vec![ListenAddr {
                protocol: Protocol::Tcp,
                addr: bound,
            }],
            serving: Box::pin(serving),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tcp_nodelay_key_reaches_the_listener() {
        let config = crate::GatewayConfig::load(
            None,
            [("SWITCHYARD_GRPC_TCP_NODELAY".to_owned(), "false".to_owned())],
            &[],
        )
        .unwrap();
        assert!(!worker_config(&config.grpc).tcp_nodelay);
        // Control: the documented default is on.
        let default =
            crate::GatewayConfig::load(None, Vec::<(String, String)>::new(), &[]).unwrap();
        assert!(worker_config(&default.grpc).tcp_nodelay);
    }
}
