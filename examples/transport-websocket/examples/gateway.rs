//! A gateway serving workers over gRPC, QUIC and WebSocket: the same gateway `switchyard serve`
//! assembles, with this crate's transport added through `Gateway::builder`.
//!
//! ```text
//! cargo run -p switchyard-transport-websocket --example gateway -- \
//!     --config switchyard.toml --websocket-listen 127.0.0.1:7444
//! ```
//!
//! Configuration comes from the file and `SWITCHYARD_*` environment variables exactly as for
//! `switchyard serve`; WebSocket workers use the same principals and, unless
//! `--websocket-plaintext`, the same certificate.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use switchyard_gateway::{Gateway, GatewayConfig, init_logging};
use switchyard_transport_websocket::WsTransport;

/// Runs a gateway with the WebSocket worker transport next to gRPC and QUIC.
#[derive(Debug, Parser)]
struct Args {
    /// TOML configuration file, as for `switchyard serve`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address WebSocket workers connect to.
    #[arg(long, default_value = "127.0.0.1:7444")]
    websocket_listen: SocketAddr,
    /// Serve plain `ws://` (loopback, or behind a proxy that terminates TLS).
    #[arg(long)]
    websocket_plaintext: bool,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let config = GatewayConfig::load(args.config.as_deref(), std::env::vars(), &[])?;
    init_logging(&config.log)?;
    let mut websocket = WsTransport::new(args.websocket_listen);
    if args.websocket_plaintext {
        websocket = websocket.plaintext();
    }
    let gateway = Gateway::builder(config)
        .transport(websocket)
        .start()
        .await?;
    for (transport, listen) in gateway.listeners() {
        println!("{transport}: {} {}", listen.protocol, listen.addr);
    }
    gateway
        .run_until(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
