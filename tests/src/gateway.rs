//! A gateway started in-process on ephemeral loopback ports, with its own data directory.

use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use switchyard_gateway::{ConfigDuration, Gateway, GatewayBuilder, GatewayConfig};
use switchyard_proto::v1::gateway_client::GatewayClient;
use switchyard_transport_quic::ClientTls;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// A configuration for tests: every listener on `127.0.0.1:0`, development TLS material in
/// `data_dir`, liveness fast enough for tests to observe, a short drain.
pub fn test_config(data_dir: &std::path::Path) -> GatewayConfig {
    let mut config = GatewayConfig::default();
    config.grpc.listen = "127.0.0.1:0".parse().expect("literal address");
    config.quic.listen = "127.0.0.1:0".parse().expect("literal address");
    config.ops.listen = "127.0.0.1:0".parse().expect("literal address");
    config.tls.data_dir = data_dir.display().to_string();
    config.liveness.ping_interval = ConfigDuration::millis(200);
    config.liveness.ping_timeout = ConfigDuration::millis(400);
    config.liveness.heartbeat_window = ConfigDuration::secs(10);
    config.shutdown.drain_timeout = ConfigDuration::secs(2);
    config
}

/// Adds `authorization: Bearer <token>` when set.
#[derive(Clone, Debug)]
pub struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok(request)
    }
}

/// A producer/operator API client.
pub type ApiClient = GatewayClient<InterceptedService<Channel, Bearer>>;

/// A TLS channel (one HTTP/2 connection) to the gRPC port at `addr`, trusting `ca_pem` and
/// naming the gateway `127.0.0.1`; connecting gives up after 5 s.
pub async fn tls_channel(
    addr: std::net::SocketAddr,
    ca_pem: &str,
) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("https://127.0.0.1:{}", addr.port()))
        .expect("valid endpoint")
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem)))
        .expect("tls config")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

/// A TLS client of the producer API at `addr` trusting `ca_pem`, with `token` as bearer when
/// given; for tests that connect while the [`TestGateway`] is busy shutting down.
pub async fn api_client_at(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    token: Option<&str>,
) -> Result<ApiClient, tonic::transport::Error> {
    let channel = tls_channel(addr, ca_pem).await?;
    let token = token.map(|t| format!("Bearer {t}").parse().expect("ascii token"));
    Ok(GatewayClient::with_interceptor(channel, Bearer(token)))
}

/// A started gateway and the directory its TLS material lives in.
#[derive(Debug)]
pub struct TestGateway {
    gateway: Option<Gateway>,
    data_dir: tempfile::TempDir,
}

impl TestGateway {
    /// Starts a gateway from [`test_config`] changed by `configure`.
    pub async fn start(configure: impl FnOnce(&mut GatewayConfig)) -> Self {
        Self::start_with(configure, |builder| builder).await
    }

    /// Like [`TestGateway::start`], with a last say on the builder (extra transports).
    pub async fn start_with(
        configure: impl FnOnce(&mut GatewayConfig),
        build: impl FnOnce(GatewayBuilder) -> GatewayBuilder,
    ) -> Self {
        let data_dir = tempfile::tempdir().expect("temporary directory");
        let mut config = test_config(data_dir.path());
        configure(&mut config);
        let gateway = build(Gateway::builder(config))
            .start()
            .await
            .expect("gateway starts");
        Self {
            gateway: Some(gateway),
            data_dir,
        }
    }

    /// The running gateway.
    pub fn gateway(&self) -> &Gateway {
        self.gateway.as_ref().expect("gateway not yet shut down")
    }

    /// The development CA, PEM.
    pub fn ca_pem(&self) -> String {
        let path = self
            .gateway()
            .tls()
            .dev_ca_path()
            .expect("tests use development material")
            .to_owned();
        std::fs::read_to_string(path).expect("CA readable")
    }

    /// Roots trusting the development CA.
    pub fn ca_roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_pem().as_bytes()) {
            roots.add(cert.expect("CA parses")).expect("CA accepted");
        }
        roots
    }

    /// QUIC client TLS trusting the development CA, presenting no certificate.
    pub fn quic_tls(&self) -> ClientTls {
        ClientTls::new(self.ca_roots()).expect("client TLS")
    }

    /// QUIC client TLS trusting the development CA and presenting the client certificate
    /// `cert_pem` with its key `key_pem`.
    pub fn quic_tls_presenting(&self, cert_pem: &str, key_pem: &str) -> ClientTls {
        let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("client certificate parses");
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("client key parses");
        ClientTls::with_client_cert(self.ca_roots(), chain, key).expect("client TLS")
    }

    /// The data directory.
    pub fn data_dir(&self) -> &std::path::Path {
        self.data_dir.path()
    }

    /// A TLS client of the producer API, with `token` as bearer when given.
    pub async fn client(&self, token: Option<&str>) -> ApiClient {
        let addr = self.gateway().addr("grpc").expect("grpc listens");
        api_client_at(addr, &self.ca_pem(), token)
            .await
            .expect("connects to the gateway")
    }

    /// Shuts the gateway down gracefully (as SIGTERM would).
    pub async fn shutdown(&mut self) {
        if let Some(gateway) = self.gateway.take() {
            gateway.shutdown().await;
        }
    }
}
