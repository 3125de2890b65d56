//! [`WsTransport`]: the WebSocket transport as a `switchyard-gateway` [`Transport`], so a
//! gateway of one's own serves it next to the built-in gRPC and QUIC transports.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use switchyard_gateway::{
    ListenAddr, Listening, Protocol, TlsMaterial, Transport, TransportContext, TransportError,
};
use tokio::net::TcpListener;

use crate::config::WsServerConfig;
use crate::server::WsServer;

/// The name the gateway lists this transport under.
const NAME: &str = "websocket";

/// How long closing sockets may hold up the gateway's stop; a peer that never answers its
/// close frame finishes on its own within the server's close timeout.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Serves WebSocket workers inside a [`Gateway`](switchyard_gateway::Gateway).
///
/// Workers authenticate with the bearer tokens of the gateway's principal table (in
/// development mode, with no principals configured, every caller is `anonymous` and granted
/// every namespace, as on the other transports). The socket is `wss://` with the gateway's
/// own certificate unless [`WsTransport::plaintext`] or a TLS config in
/// [`WsTransport::config`] says otherwise. On shutdown it stops taking workers when the
/// gateway stops accepting, keeps registered ones through the drain, and closes the rest
/// with 1001 when the gateway closes.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use switchyard_gateway::{Gateway, GatewayConfig};
/// use switchyard_transport_websocket::WsTransport;
///
/// let config = GatewayConfig::load(None, std::env::vars(), &[])?;
/// let gateway = Gateway::builder(config)
///     .transport(WsTransport::new("0.0.0.0:7444".parse()?))
///     .start()
///     .await?;
/// println!("websocket workers connect to wss://{:?}/", gateway.addr("websocket"));
/// gateway.run_until(async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct WsTransport {
    listen: SocketAddr,
    plaintext: bool,
    config: WsServerConfig,
}

impl WsTransport {
    /// A transport listening on `listen` over TLS with the gateway's certificate.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            plaintext: false,
            config: WsServerConfig::default(),
        }
    }

    /// Serves plain `ws://`: for loopback, or behind a proxy that terminates TLS.
    pub fn plaintext(mut self) -> Self {
        self.plaintext = true;
        self
    }

    /// Limits and timeouts; a `tls` set here replaces the gateway's certificate.
    pub fn config(mut self, config: WsServerConfig) -> Self {
        self.config = config;
        self
    }
}

#[async_trait]
impl Transport for WsTransport {
    fn name(&self) -> &str {
        NAME
    }

    async fn start(
        self: Box<Self>,
        context: TransportContext,
    ) -> Result<Listening, TransportError> {
        let mut config = self.config;
        if config.tls.is_none() && !self.plaintext {
            config.tls = Some(server_tls(&context.tls)?);
        }
        let listener =
            TcpListener::bind(self.listen)
                .await
                .map_err(|source| TransportError::Bind {
                    addr: self.listen,
                    source,
                })?;
        let server = WsServer::serve(listener, context.core.clone(), context.principals, config)
            .map_err(TransportError::other)?;
        let addr = server.local_addr();
        let TransportContext {
            stop_accepting,
            close,
            ..
        } = context;
        let serving = async move {
            tokio::select! {
                () = stop_accepting.cancelled() => {}
                () = close.cancelled() => {}
            }
            server.stop_accepting();
            // Registered workers keep their sockets while core drains them.
            close.cancelled().await;
            if tokio::time::timeout(CLOSE_GRACE, server.shutdown())
                .await
                .is_err()
            {
                tracing::debug!("some worker sockets are still closing; not waiting for them");
            }
            Ok(())
        };
        Ok(Listening {
            addrs: vec![ListenAddr {
                protocol: Protocol::Tcp,
                addr,
            }],
            serving: Box::pin(serving),
        })
    }
}

/// The gateway's certificate and key as a rustls server config on the ring provider, offering
/// HTTP/1.1 by ALPN (the WebSocket upgrade is an HTTP/1.1 request).
fn server_tls(tls: &TlsMaterial) -> Result<Arc<rustls::ServerConfig>, TransportError> {
    let refused = |error: &dyn std::fmt::Display| TransportError::Tls(error.to_string());
    let chain = tls.cert_chain().map_err(|error| refused(&error))?;
    let key = tls.private_key().map_err(|error| refused(&error))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|error| refused(&error))?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(|error| refused(&error))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
