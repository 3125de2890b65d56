//! The Switchyard gateway, embeddable: one process-wide core shared by every worker transport,
//! the producer and operator gRPC API, the dispatch store behind durable dispatches,
//! configuration, development TLS material and the operations HTTP listener.
//!
//! [`Gateway::builder`] assembles the same gateway `switchyard serve` runs. Transports, the
//! built-in gRPC and QUIC ones included, are started through the one [`Transport`] trait; an
//! integrator adds their own with [`GatewayBuilder::transport`].
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use switchyard_gateway::{Gateway, GatewayConfig};
//!
//! let config = GatewayConfig::load(None, std::env::vars(), &[])?;
//! let gateway = Gateway::builder(config).start().await?;
//! println!("producer API on {:?}", gateway.addr("grpc"));
//! gateway.run_until(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

mod api;
mod auth;
mod config;
mod gateway;
mod grpc_server;
mod limits;
mod logging;
mod ops;
mod quic;
mod readiness;
mod store;
#[cfg(test)]
mod test_log;
mod tls;
mod transport;

pub use api::{ApiConfig, GatewayApi};
pub use auth::Principals;
pub use config::{
    CLIENT_ENV_VARS, ClusterSection, ConfigDuration, ConfigError, CongestionName,
    DEFAULT_STORE_FILE, DispatchSection, DurabilityName, DurationSyntax, ENV_PREFIX, GatewayConfig,
    GrpcSection, LivenessSection, LogFormat, LogSection, NamespacePolicyName, NamespaceSection,
    NamespacesSection, OpsSection, Override, PrincipalSection, QuicSection, RedundancyName,
    ReflectionName, RegistrySection, RetryName, RoleName, ShutdownSection, StoreBackendName,
    StoreSection, SynchronousName, TlsSection, env_var_for, keys as config_keys,
};
pub use gateway::{Gateway, GatewayBuilder, StartError};
pub use grpc_server::GrpcTransport;
pub use logging::{LogError, init as init_logging};
pub use quic::QuicTransport;
pub use readiness::{NotReady, Readiness};
pub use tls::{TlsError, TlsMaterial, resolve_data_dir};
pub use transport::{ListenAddr, Listening, Protocol, Transport, TransportContext, TransportError};
