//! A TCP relay on loopback between a worker and the gateway that can freeze (stop moving
//! bytes, keep every socket open: a hung peer, no FIN, no RST), sever (close every socket and
//! the listener: a crashed peer), black out (close every socket and refuse new ones for a
//! while: a link blip), throttle the gateway-to-worker direction (a slow reader) or freeze the
//! worker-to-gateway direction alone (a peer that hears but is not heard).

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Forwards every connection made to [`TcpRelay::addr`] on to the upstream address; dropping
/// it severs.
#[derive(Debug)]
pub struct TcpRelay {
    addr: SocketAddr,
    frozen: CancellationToken,
    /// Cancelled by [`TcpRelay::freeze_upstream`] (and with `frozen`).
    frozen_upstream: CancellationToken,
    severed: CancellationToken,
    blackout: Arc<Blackout>,
}

/// The live connections' token (cancelled by a blackout) and when new ones are let through.
#[derive(Debug)]
struct Blackout {
    live: Mutex<CancellationToken>,
    until: Mutex<Option<Instant>>,
}

impl Blackout {
    fn live(&self) -> CancellationToken {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn refusing(&self) -> bool {
        self.until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|until| Instant::now() < until)
    }
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
        let frozen_upstream = frozen.child_token();
        let blackout = Arc::new(Blackout {
            live: Mutex::new(CancellationToken::new()),
            until: Mutex::new(None),
        });
        tokio::spawn(accept(
            listener,
            upstream,
            pause,
            (frozen.clone(), frozen_upstream.clone(), severed.clone()),
            Arc::clone(&blackout),
        ));
        Ok(Self {
            addr,
            frozen,
            frozen_upstream,
            severed,
            blackout,
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

    /// Stops moving bytes from the client to the upstream only, on every connection; the
    /// upstream's bytes still reach the client (a peer that hears but is not heard), and new
    /// connections are closed at once.
    pub fn freeze_upstream(&self) {
        self.frozen_upstream.cancel();
    }

    /// A link blip: closes every relayed socket now (both peers see the connection end) and
    /// closes each new connection at once for `duration`; after it, relays again.
    pub fn blackout(&self, duration: Duration) {
        *self
            .blackout
            .until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + duration);
        let old = std::mem::replace(
            &mut *self
                .blackout
                .live
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            CancellationToken::new(),
        );
        old.cancel();
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
    (frozen, frozen_upstream, severed): (CancellationToken, CancellationToken, CancellationToken),
    blackout: Arc<Blackout>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = severed.cancelled() => return,
        };
        let Ok((client, _)) = accepted else { return };
        if frozen_upstream.is_cancelled() || blackout.refusing() {
            continue;
        }
        let Ok(server) = TcpStream::connect(upstream).await else {
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let live = blackout.live();
        tokio::spawn(pump(
            client_read,
            server_write,
            None,
            (frozen_upstream.clone(), severed.clone()),
            live.clone(),
        ));
        tokio::spawn(pump(
            server_read,
            client_write,
            pause,
            (frozen.clone(), severed.clone()),
            live,
        ));
    }
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    pause: Option<Duration>,
    (frozen, severed): (CancellationToken, CancellationToken),
    live: CancellationToken,
) {
    let mut buffer = vec![0_u8; if pause.is_some() { 4 * 1024 } else { 16 * 1024 }];
    loop {
        let read = tokio::select! {
            biased;
            // A blackout: dropping both halves closes the socket.
            () = live.cancelled() => return,
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
    // Silent, both halves held open, until severed or blacked out.
    tokio::select! {
        () = severed.cancelled() => {}
        () = live.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream that echoes every byte back, on every connection.
    async fn echo_upstream() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0_u8; 64];
                    while let Ok(n @ 1..) = socket.read(&mut buffer).await {
                        if socket.write_all(&buffer[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    /// Whether a round trip of one byte through `relay` works on a new connection.
    async fn round_trip(relay: &TcpRelay) -> bool {
        let Ok(mut socket) = TcpStream::connect(relay.addr()).await else {
            return false;
        };
        let mut byte = [0_u8; 1];
        socket.write_all(b"x").await.is_ok()
            && matches!(
                tokio::time::timeout(Duration::from_secs(5), socket.read(&mut byte)).await,
                Ok(Ok(1))
            )
    }

    #[tokio::test]
    async fn freezing_the_upstream_direction_still_relays_the_other() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = TcpRelay::start(listener.local_addr().unwrap())
            .await
            .unwrap();
        let mut client = TcpStream::connect(relay.addr()).await.unwrap();
        let (mut upstream, _) = listener.accept().await.unwrap();
        let mut byte = [0_u8; 1];
        // Control: both directions move.
        client.write_all(b"a").await.unwrap();
        upstream.read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"a");
        upstream.write_all(b"b").await.unwrap();
        client.read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"b");
        relay.freeze_upstream();
        client.write_all(b"c").await.unwrap();
        let heard =
            tokio::time::timeout(Duration::from_millis(300), upstream.read(&mut byte)).await;
        assert!(heard.is_err(), "the client's byte got through: {heard:?}");
        upstream.write_all(b"d").await.unwrap();
        client.read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"d", "the upstream's bytes still arrive");
    }

    #[tokio::test]
    async fn a_blackout_ends_live_connections_refuses_new_ones_then_relays_again() {
        let relay = TcpRelay::start(echo_upstream().await).await.unwrap();
        let mut live = TcpStream::connect(relay.addr()).await.unwrap();
        live.write_all(b"x").await.unwrap();
        let mut byte = [0_u8; 1];
        assert_eq!(live.read(&mut byte).await.unwrap(), 1, "control: it relays");
        relay.blackout(Duration::from_millis(300));
        let ended = tokio::time::timeout(Duration::from_secs(5), live.read(&mut byte)).await;
        assert!(
            matches!(ended, Ok(Ok(0) | Err(_))),
            "the live connection ends"
        );
        assert!(!round_trip(&relay).await, "a new connection is refused");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            round_trip(&relay).await,
            "after the blackout it relays again"
        );
    }
}
