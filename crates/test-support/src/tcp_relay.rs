//! A TCP relay on loopback between a worker and the gateway that can freeze (stop moving
//! bytes, keep every socket open: a hung peer, no FIN, no RST), sever (close every socket and
//! the listener: a crashed peer) or throttle the gateway-to-worker direction (a slow reader).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Forwards every connection made to [`TcpRelay::addr`] on to the upstream address; dropping
/// it severs.
#[derive(Debug)]
pub struct TcpRelay {
    addr: SocketAddr,
    frozen: CancellationToken,
    severed: CancellationToken,
}

impl TcpRelay {
    /// Listens on loopback and forwards each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        Self::paced(upstream, None).await
    }

    /// Like [`TcpRelay::start`], but the upstream-to-client direction moves at most 4 KiB per
    /// `pause`: a worker that reads slowly.
    pub async fn throttled(upstream: SocketAddr, pause: Duration) -> io::Result<Self> {
        Self::paced(upstream, Some(pause)).await
    }

    async fn paced(upstream: SocketAddr, pause: Option<Duration>) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (frozen, severed) = (CancellationToken::new(), CancellationToken::new());
        tokio::spawn(accept(
            listener,
            upstream,
            pause,
            frozen.clone(),
            severed.clone(),
        ));
        Ok(Self {
            addr,
            frozen,
            severed,
        })
    }

    /// Where the worker dials.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port of [`TcpRelay::addr`].
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Stops moving bytes in both directions; the sockets stay open until the relay is
    /// severed or dropped, and new connections are closed at once (a hung peer makes none).
    pub fn freeze(&self) {
        self.frozen.cancel();
    }

    /// Closes every relayed socket and the listener.
    pub fn sever(&self) {
        self.frozen.cancel();
        self.severed.cancel();
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.sever();
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    pause: Option<Duration>,
    frozen: CancellationToken,
    severed: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = severed.cancelled() => return,
        };
        let Ok((client, _)) = accepted else { return };
        if frozen.is_cancelled() {
            continue;
        }
        let Ok(server) = TcpStream::connect(upstream).await else {
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        tokio::spawn(pump(
            client_read,
            server_write,
            None,
            frozen.clone(),
            severed.clone(),
        ));
        tokio::spawn(pump(
            server_read,
            client_write,
            pause,
            frozen.clone(),
            severed.clone(),
        ));
    }
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    pause: Option<Duration>,
    frozen: CancellationToken,
    severed: CancellationToken,
) {
    let mut buffer = vec![0_u8; if pause.is_some() { 4 * 1024 } else { 16 * 1024 }];
    loop {
        let read = tokio::select! {
            biased;
            () = frozen.cancelled() => break,
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
                if let Some(pause) = pause {
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
    // Silent, both halves held open, until severed.
    severed.cancelled().await;
}
