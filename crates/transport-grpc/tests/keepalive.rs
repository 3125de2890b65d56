//! HTTP/2 keepalive: a peer that stops answering at the connection level is detected by the
//! server and its worker deregistered, long before core's own heartbeat window.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use switchyard_core::{DisconnectReason, LivenessConfig};
use switchyard_transport_grpc::GrpcServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use support::{Gateway, TRUSTED_TOKEN, fast_liveness, open, raw_client_at, register};

/// A TCP relay to `upstream` that, once frozen, stops moving bytes in both directions while
/// keeping both sockets open: to the server, a peer that went silent without a FIN or RST.
async fn freezable_proxy(upstream: SocketAddr, frozen: CancellationToken) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect(upstream).await.unwrap();
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(relay(client_read, server_write, frozen.clone()));
            tokio::spawn(relay(server_read, client_write, frozen.clone()));
        }
    });
    addr
}

async fn relay(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: CancellationToken,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            () = frozen.cancelled() => break,
            read = from.read(&mut buffer) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if to.write_all(&buffer[..n]).await.is_err() {
                        return;
                    }
                }
            },
        }
    }
    // Hold both sockets open, silent, until the test's runtime ends.
    std::future::pending::<()>().await;
    drop((from, to));
}

#[tokio::test]
async fn keepalive_deregisters_a_peer_that_stops_answering() {
    let gateway = Gateway::builder()
        .config(GrpcServerConfig {
            keepalive_interval: Some(Duration::from_millis(100)),
            keepalive_timeout: Duration::from_millis(300),
            ..GrpcServerConfig::default()
        })
        // Core's own silence verdict is far away, so only keepalive can end this worker.
        .liveness(LivenessConfig {
            heartbeat_window: Duration::from_secs(600),
            ..fast_liveness()
        })
        .start()
        .await;
    let mut events = gateway.core.registry().subscribe_events();
    let frozen = CancellationToken::new();
    let proxy = freezable_proxy(gateway.addr, frozen.clone()).await;
    let endpoint = format!("https://localhost:{}", proxy.port());
    let mut client = raw_client_at(&endpoint, gateway.pki.client_tls()).await;
    let mut stream = open(&mut client, Some(TRUSTED_TOKEN)).await.unwrap();
    let worker = stream.register(register(&["ns"], &["echo"], Some(1))).await;

    // Control: a responsive peer survives many keepalive periods (pings come every 200 ms,
    // keepalive times out after 300 ms).
    stream.answer_pings(8).await;
    assert!(gateway.core.registry().is_registered(worker));

    frozen.cancel();
    let reason = support::disconnected(&mut events, worker).await;
    assert_eq!(reason, DisconnectReason::Disconnect);
    assert!(!gateway.core.registry().is_registered(worker));
}
