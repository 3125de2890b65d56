//! A one-connection TCP relay on loopback that can freeze (stop forwarding, keep both sockets
//! open) or sever (drop both sockets) the connection it carries, as a stuck or crashed worker
//! would, without test hooks in the worker client.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Forwards the first connection to `127.0.0.1:port()` on to `upstream`; dropping it severs.
pub struct Relay {
    port: u16,
    frozen: CancellationToken,
    task: JoinHandle<()>,
}

impl Relay {
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let frozen = CancellationToken::new();
        let task = tokio::spawn(relay(listener, upstream, frozen.clone()));
        Ok(Self { port, frozen, task })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops forwarding in both directions; both sockets stay open.
    pub fn freeze(&self) {
        self.frozen.cancel();
    }

    /// Drops both sockets at once.
    pub fn sever(&self) {
        self.task.abort();
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(listener: TcpListener, upstream: SocketAddr, frozen: CancellationToken) {
    let Ok((client, _)) = listener.accept().await else {
        return;
    };
    drop(listener);
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, frozen.clone()),
        pump(server_read, client_write, frozen),
    );
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, frozen: CancellationToken) {
    let mut buffer = vec![0_u8; 64 * 1024];
    loop {
        let read = tokio::select! {
            biased;
            () = frozen.cancelled() => {
                // Hold both halves, unread and unwritten, until the relay is dropped.
                std::future::pending::<()>().await;
                return;
            }
            read = from.read(&mut buffer) => read,
        };
        match read {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => {
                if to.write_all(&buffer[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
