//! Connecting the command-line client to a gateway's producer/operator API.

use std::path::PathBuf;

use clap::Args;
use switchyard_proto::v1::gateway_client::GatewayClient;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

use super::Failure;

/// Where the gateway is and how to authenticate to it.
#[derive(Args, Clone, Debug)]
pub(crate) struct ClientArgs {
    /// Gateway API endpoint; `https://` uses TLS, `http://` plaintext.
    #[arg(
        long,
        env = "SWITCHYARD_ENDPOINT",
        default_value = "https://127.0.0.1:7700"
    )]
    pub(crate) endpoint: String,
    /// PEM CA the gateway's certificate chains to [default: the development CA in the data
    /// directory]
    #[arg(long, env = "SWITCHYARD_CA")]
    pub(crate) ca: Option<PathBuf>,
    /// Bearer token of a configured principal (not needed in development mode).
    #[arg(long, env = "SWITCHYARD_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// Data directory holding the development CA [default: as `serve` resolves it]
    #[arg(long)]
    pub(crate) data_dir: Option<PathBuf>,
    /// PEM client certificate chain to present (mutual TLS; with --key)
    #[arg(long, env = "SWITCHYARD_CLIENT_CERT", requires = "key")]
    pub(crate) cert: Option<PathBuf>,
    /// PEM private key of --cert
    #[arg(long, env = "SWITCHYARD_CLIENT_KEY", requires = "cert")]
    pub(crate) key: Option<PathBuf>,
}

/// A client certificate chain and its key, PEM, as read from `--cert` and `--key`.
#[derive(Clone, Debug)]
pub(crate) struct ClientIdentity {
    /// The chain.
    pub(crate) cert_pem: String,
    /// Its key.
    pub(crate) key_pem: String,
}

impl ClientArgs {
    /// The CA file to trust: `--ca`, else the development CA.
    pub(crate) fn ca_path(&self) -> PathBuf {
        self.ca.clone().unwrap_or_else(|| {
            let data_dir = match &self.data_dir {
                Some(dir) => dir.clone(),
                None => switchyard_gateway::resolve_data_dir(""),
            };
            data_dir.join("tls").join("ca.pem")
        })
    }

    /// The client certificate to present, when `--cert` and `--key` are given.
    pub(crate) fn identity(&self) -> Result<Option<ClientIdentity>, Failure> {
        let (cert, key) = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => (cert, key),
            (None, None) => return Ok(None),
            _ => return Err(Failure::usage("--cert and --key go together")),
        };
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read_to_string(path).map_err(|error| {
                Failure::runtime(format!("{flag} {}: cannot read: {error}", path.display()))
            })
        };
        Ok(Some(ClientIdentity {
            cert_pem: read("--cert", cert)?,
            key_pem: read("--key", key)?,
        }))
    }
}

/// Adds `authorization: Bearer <token>` to every call when a token is set.
#[derive(Clone, Debug)]
pub(crate) struct BearerToken(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for BearerToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// The API client type the commands use.
pub(crate) type ApiClient = GatewayClient<InterceptedService<Channel, BearerToken>>;

/// Connects to the gateway.
pub(crate) async fn connect(args: &ClientArgs) -> Result<ApiClient, Failure> {
    let mut endpoint = Endpoint::from_shared(args.endpoint.clone())
        .map_err(|error| Failure::usage(format!("--endpoint {}: {error}", args.endpoint)))?;
    if args.endpoint.starts_with("https://") {
        let ca_path = args.ca_path();
        let ca = std::fs::read_to_string(&ca_path).map_err(|error| {
            Failure::runtime(format!(
                "cannot read the CA {}: {error} (start `switchyard serve` once, or pass --ca)",
                ca_path.display()
            ))
        })?;
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some(identity) = args.identity()? {
            tls = tls.identity(Identity::from_pem(identity.cert_pem, identity.key_pem));
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|error| Failure::runtime(format!("tls: {error}")))?;
    }
    let channel = endpoint.connect().await.map_err(|error| {
        Failure::runtime(format!("cannot connect to {}: {error}", args.endpoint))
    })?;
    let token = match &args.token {
        Some(token) => Some(
            format!("Bearer {token}")
                .parse()
                .map_err(|_| Failure::usage("--token holds characters not allowed in a header"))?,
        ),
        None => None,
    };
    Ok(GatewayClient::with_interceptor(channel, BearerToken(token)))
}
