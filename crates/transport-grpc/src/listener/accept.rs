//! The accept loop: admits each TCP connection against the [`ConnectionTable`], closes the
//! ones over a limit, and waits instead of spinning when accepting fails for want of file
//! descriptors or memory.

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use switchyard_core::{Backoff, KeyedThrottle, Throttle};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::Stream;

use super::table::{ConnectionLimits, ConnectionRefusal, ConnectionTable};

/// Counter of connections closed at accept, labelled `listener` and `limit`.
pub const CONNECTIONS_REFUSED_TOTAL: &str = "switchyard_connections_refused_total";

/// The wait after a failed accept: 5 ms, doubling up to 1 s while accepting keeps failing.
const ACCEPT_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(5),
    max: Duration::from_secs(1),
};

/// Accepted connections waiting for the server to take them.
const HANDOFF: usize = 64;

/// How one listener accepts: its name in logs and metrics (and the prefix of its
/// configuration keys), its connection limits and TCP_NODELAY.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptConfig {
    /// The listener's name (`grpc`, `ops`): the `listener` label, and the section its limits
    /// are configured in.
    pub name: &'static str,
    /// Connections held at once.
    pub limits: ConnectionLimits,
    /// Disable Nagle's algorithm on accepted sockets.
    pub nodelay: bool,
}

/// The connections `listener` accepts within `config`'s limits, as a stream a tonic or hyper
/// server takes; each one holds its place in the limits until it is dropped.
///
/// Accepting runs on a task of its own that ends when the stream is dropped.
pub fn limited_incoming(listener: TcpListener, config: AcceptConfig) -> LimitedIncoming {
    let table = Arc::new(Mutex::new(ConnectionTable::new(config.limits)));
    let (handoff, receiver) = mpsc::channel(HANDOFF);
    let task = tokio::spawn(accept_loop(listener, config, table, handoff));
    LimitedIncoming { receiver, task }
}

/// The stream of [`limited_incoming`]; never yields an error (failed accepts are waited out
/// and logged).
#[derive(Debug)]
pub struct LimitedIncoming {
    receiver: mpsc::Receiver<Limited<TcpStream>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LimitedIncoming {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Stream for LimitedIncoming {
    type Item = Result<Limited<TcpStream>, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.receiver.poll_recv(cx).map(|next| next.map(Ok))
    }
}

async fn accept_loop(
    listener: TcpListener,
    config: AcceptConfig,
    table: Arc<Mutex<ConnectionTable>>,
    handoff: mpsc::Sender<Limited<TcpStream>>,
) {
    // One warning line per limit per interval: a flood at one limit hides no other's.
    let mut refusals = KeyedThrottle::default();
    let mut errors = Throttle::default();
    let mut failures: u32 = 0;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = handoff.closed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => {
                failures = 0;
                accepted
            }
            Err(error) if is_per_connection(&error) => continue,
            Err(error) => {
                let wait = ACCEPT_BACKOFF.ceiling(failures);
                failures = failures.saturating_add(1);
                if let Some(suppressed) = errors.allow(Instant::now().into_std()) {
                    tracing::warn!(listener = config.name, %error, retry_in_ms =
                        wait.as_millis() as u64, suppressed, "accepting connections failed");
                }
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        let admitted = lock(&table).admit(peer.ip());
        if let Err(refusal) = admitted {
            refused(&config, &refusal, &mut refusals, Instant::now().into_std());
            drop(stream);
            continue;
        }
        let guard = ConnectionGuard {
            table: Arc::clone(&table),
            address: peer.ip(),
        };
        if config.nodelay {
            // A socket that refuses the option still serves, only with Nagle on.
            let _ = stream.set_nodelay(true);
        }
        let connection = Limited {
            io: stream,
            _guard: guard,
        };
        if handoff.send(connection).await.is_err() {
            return;
        }
    }
}

/// Errors about one connection that went away before it was accepted; the next accept is
/// unaffected, so they are not waited out.
fn is_per_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// Counts a connection closed at accept for `refusal` and warns of it at `now`, unless a line
/// for the same limit went out less than the interval ago; returns the count the line carried
/// (`None`: held back).
fn refused(
    config: &AcceptConfig,
    refusal: &ConnectionRefusal,
    throttles: &mut KeyedThrottle,
    now: std::time::Instant,
) -> Option<u64> {
    let limit = refusal.limit_name();
    metrics::counter!(CONNECTIONS_REFUSED_TOTAL, "listener" => config.name, "limit" => limit)
        .increment(1);
    let suppressed = throttles.allow(limit, now)?;
    tracing::warn!(
        listener = config.name,
        suppressed,
        "connection closed at accept: {}.{refusal}",
        config.name
    );
    Some(suppressed)
}

fn lock(table: &Mutex<ConnectionTable>) -> std::sync::MutexGuard<'_, ConnectionTable> {
    // The table is counts only; a panic elsewhere cannot leave it half-updated.
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A connection's place in its listener's limits, given back when it is dropped.
#[derive(Debug)]
struct ConnectionGuard {
    table: Arc<Mutex<ConnectionTable>>,
    address: IpAddr,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        lock(&self.table).release(self.address);
    }
}

/// An accepted connection holding its place in its listener's limits.
#[derive(Debug)]
pub struct Limited<IO> {
    io: IO,
    _guard: ConnectionGuard,
}

impl<IO> Limited<IO> {
    /// The connection.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Limited<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Limited<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Limited<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio_stream::StreamExt;

    use super::*;

    fn config(total: usize, per_address: usize) -> AcceptConfig {
        AcceptConfig {
            name: "test",
            limits: ConnectionLimits {
                max_connections: total,
                max_connections_per_address: per_address,
            },
            nodelay: true,
        }
    }

    async fn listener() -> (TcpListener, std::net::SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (listener, addr)
    }

    #[tokio::test]
    async fn a_connection_over_the_limit_is_closed_and_a_dropped_one_makes_room() {
        let (listener, addr) = listener().await;
        let mut incoming = limited_incoming(listener, config(10, 1));
        let _first = TcpStream::connect(addr).await.unwrap();
        let held = incoming.next().await.unwrap().unwrap();
        let mut second = TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(10), second.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "the extra connection is closed: {read:?}"
        );
        // Control: once the held connection is dropped, the address may connect again.
        drop(held);
        let _third = TcpStream::connect(addr).await.unwrap();
        let admitted = tokio::time::timeout(Duration::from_secs(10), incoming.next()).await;
        assert!(matches!(admitted, Ok(Some(Ok(_)))), "{admitted:?}");
    }

    /// A connection to `addr` from the loopback address `from`.
    async fn connect_from(from: [u8; 4], addr: std::net::SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((from, 0).into()).unwrap();
        socket.connect(addr).await.unwrap()
    }

    #[tokio::test]
    async fn the_listener_limit_closes_a_connection_from_any_address_once_reached() {
        let (listener, addr) = listener().await;
        // One connection in all; each address could hold ten.
        let mut incoming = limited_incoming(listener, config(1, 10));
        let _first = connect_from([127, 0, 0, 1], addr).await;
        let held = incoming.next().await.unwrap().unwrap();
        let mut other = connect_from([127, 0, 0, 2], addr).await;
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(10), other.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "another address is refused too once the listener is full: {read:?}"
        );
        // Control: once the held connection is dropped, the other address connects.
        drop(held);
        let _again = connect_from([127, 0, 0, 2], addr).await;
        let admitted = tokio::time::timeout(Duration::from_secs(10), incoming.next()).await;
        assert!(matches!(admitted, Ok(Some(Ok(_)))), "{admitted:?}");
    }

    /// `docs/security.md`: accept warnings are one line per 10 s per kind, counting the ones
    /// held back.
    #[test]
    fn accept_warnings_are_throttled_per_limit() {
        let config = config(1, 1);
        let mut throttles = KeyedThrottle::default();
        let address = ConnectionRefusal::Address {
            limit: 1,
            address: [127, 0, 0, 1].into(),
        };
        let listener = ConnectionRefusal::Listener { limit: 1 };
        let start = std::time::Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        assert_eq!(refused(&config, &address, &mut throttles, at(0)), Some(0));
        assert_eq!(refused(&config, &address, &mut throttles, at(1)), None);
        // Another limit's line is not held back by the first one's flood.
        assert_eq!(refused(&config, &listener, &mut throttles, at(2)), Some(0));
        assert_eq!(refused(&config, &address, &mut throttles, at(3)), None);
        // 10 s after the first, the next line counts the two held back.
        assert_eq!(refused(&config, &address, &mut throttles, at(10)), Some(2));
        assert_eq!(refused(&config, &listener, &mut throttles, at(11)), None);
    }

    #[tokio::test]
    async fn an_accepted_connection_has_tcp_nodelay_as_configured() {
        for nodelay in [true, false] {
            let (listener, addr) = listener().await;
            let mut incoming = limited_incoming(
                listener,
                AcceptConfig {
                    nodelay,
                    ..config(10, 10)
                },
            );
            let _client = TcpStream::connect(addr).await.unwrap();
            let accepted = incoming.next().await.unwrap().unwrap();
            // Control (`false`): the kernel's default for an accepted socket is Nagle on.
            assert_eq!(accepted.io.nodelay().unwrap(), nodelay);
        }
    }

    #[tokio::test]
    async fn dropping_the_stream_stops_accepting() {
        let (listener, addr) = listener().await;
        let incoming = limited_incoming(listener, config(10, 10));
        drop(incoming);
        tokio::task::yield_now().await;
        // The listener is closed with the task; a connect is refused or reset.
        let mut refused = false;
        for _ in 0..100 {
            match TcpStream::connect(addr).await {
                Err(_) => {
                    refused = true;
                    break;
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        assert!(refused, "the listener outlived its stream");
    }

    #[test]
    fn accept_failures_wait_longer_up_to_a_second() {
        assert_eq!(ACCEPT_BACKOFF.ceiling(0), Duration::from_millis(5));
        assert_eq!(ACCEPT_BACKOFF.ceiling(1), Duration::from_millis(10));
        assert_eq!(ACCEPT_BACKOFF.ceiling(20), Duration::from_secs(1));
        let emfile = io::Error::from_raw_os_error(24);
        assert!(!is_per_connection(&emfile), "EMFILE is waited out");
        assert!(is_per_connection(&io::Error::from(
            io::ErrorKind::ConnectionAborted
        )));
    }
}
