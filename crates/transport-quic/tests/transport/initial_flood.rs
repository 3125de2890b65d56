//! A flood of QUIC Initial packets from addresses that never answer (what a spoofing attacker
//! sends, at no cost to itself) does not lock real workers out: beyond a bounded number of
//! handshakes the gateway answers with stateless Retries, which only a real peer completes.
//!
//! The flood is 1,100 real client Initials, each opening its own connection (its own
//! destination connection id), captured from a quinn client dialling a socket that never
//! answers, then replayed toward the gateway in about a second from ports that never answer
//! either.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use quinn::Endpoint;
use switchyard_auth::AllowAll;
use switchyard_transport_quic::{QuicServerConfig, RetryPolicy};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::observe::{LogLines, record_metrics, refused_total};
use crate::support::{Gateway, PATIENCE, client_config, eventually};

/// Initial packets in the flood.
const FLOOD: usize = 1_100;
/// Ports the flood is sent from.
const SOURCES: usize = 32;
/// Packets sent together, every [`PACE`]: the flood takes about a second. A burst stays well
/// inside a default socket receive buffer (~208 KiB, where a loopback datagram of 1,200 bytes
/// takes about 4 KiB).
const BURST: usize = 20;
const PACE: Duration = Duration::from_millis(20);
/// Answers to the flood that show the gateway's handshake budget (256 by default) was spent:
/// more than the budget, fewer than the whole flood, so a few lost datagrams do not matter.
const ANSWERED: usize = 500;

/// `n` client Initial packets of `n` distinct connections to `gateway`'s certificate, captured
/// [`BURST`] at a time so the capturing socket's buffer never overflows.
async fn captured_initials(gateway: &Gateway, n: usize) -> Vec<Vec<u8>> {
    let sink = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let sink_addr = sink.local_addr().unwrap();
    let client = Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let config = client_config(gateway);
    let mut seen = HashSet::new();
    let mut initials = Vec::with_capacity(n);
    let mut buf = vec![0u8; 2048];
    let deadline = Instant::now() + PATIENCE;
    while initials.len() < n {
        let batch = BURST.min(n - initials.len());
        // Dropped once captured, so their retransmissions do not crowd out the next batch.
        let _connecting: Vec<_> = (0..batch)
            .map(|_| {
                client
                    .connect_with(config.clone(), sink_addr, "localhost")
                    .unwrap()
            })
            .collect();
        let wanted = initials.len() + batch;
        while initials.len() < wanted {
            let len = tokio::time::timeout_at(deadline, sink.recv(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("{} of {n} Initials captured", initials.len()))
                .unwrap();
            let datagram = &buf[..len];
            // A retransmission repeats its connection's id; only distinct connections count.
            if let Some(id) = initial_connection_id(datagram) {
                if seen.insert(id.to_vec()) {
                    initials.push(datagram.to_vec());
                }
            }
        }
    }
    client.close(0u32.into(), b"");
    initials
}

/// The destination connection id of a QUIC v1 Initial packet.
fn initial_connection_id(datagram: &[u8]) -> Option<&[u8]> {
    // Long header, fixed bit, packet type 0 (Initial).
    if datagram.first()? & 0xf0 != 0xc0 {
        return None;
    }
    let len = usize::from(*datagram.get(5)?);
    datagram.get(6..6 + len)
}

/// A Retry packet: long header, fixed bit, packet type 3.
fn is_retry(datagram: &[u8]) -> bool {
    datagram.first().is_some_and(|first| first & 0xf0 == 0xf0)
}

/// The flood in flight: its sockets, which count the Retry packets the gateway answers with
/// and never answer anything themselves.
struct Flood {
    retries: Arc<AtomicUsize>,
    readers: Vec<JoinHandle<()>>,
}

impl Flood {
    /// Sends `initials` to `target` from [`SOURCES`] ports, [`BURST`] every [`PACE`].
    async fn send(target: SocketAddr, initials: &[Vec<u8>]) -> Self {
        let retries = Arc::new(AtomicUsize::new(0));
        let mut sockets = Vec::with_capacity(SOURCES);
        let mut readers = Vec::with_capacity(SOURCES);
        for _ in 0..SOURCES {
            let socket = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
            let (reader, retries) = (Arc::clone(&socket), Arc::clone(&retries));
            readers.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 2048];
                while let Ok(len) = reader.recv(&mut buf).await {
                    if is_retry(&buf[..len]) {
                        retries.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
            sockets.push(socket);
        }
        let mut pace = tokio::time::interval(PACE);
        for (burst, packets) in initials.chunks(BURST).enumerate() {
            pace.tick().await;
            for (i, packet) in packets.iter().enumerate() {
                let socket = &sockets[(burst * BURST + i) % SOURCES];
                socket.send_to(packet, target).await.unwrap();
            }
        }
        Self { retries, readers }
    }

    fn retries(&self) -> usize {
        self.retries.load(Ordering::Relaxed)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        for reader in &self.readers {
            reader.abort();
        }
    }
}

/// Fails on the code before Retry: the same flood refused every connection after it (see the
/// control below) until the flood's handshakes timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initial_flood_leaves_a_real_worker_able_to_register() {
    let gateway = Gateway::start().await;
    let initials = captured_initials(&gateway, FLOOD).await;
    let flood = Flood::send(gateway.addr(), &initials).await;
    // Retries go out only once the handshake budget is spent: the flood is holding all the
    // state it can while the worker connects.
    eventually("the flood's excess answered with Retries", || {
        flood.retries() >= ANSWERED
    })
    .await;

    let worker = tokio::time::timeout(PATIENCE, gateway.worker().connect())
        .await
        .expect("the worker registered during the flood")
        .expect("the worker was admitted");
    assert_eq!(gateway.registry().len(), 1, "the worker is in the registry");
    drop(worker);
}

/// Control: with Retry off, the same flood spends the handshake budget and the real worker
/// that follows is refused, naming the limit; its hundreds of refusals are counted and
/// written as one log line.
#[tokio::test]
async fn with_retry_off_the_same_flood_locks_a_real_worker_out_and_logs_one_line() {
    record_metrics();
    let (lines, _guard) = LogLines::capture();
    let config = QuicServerConfig {
        retry: RetryPolicy::Off,
        ..QuicServerConfig::default()
    };
    let gateway = Gateway::with(config, AllowAll).await;
    let limit = "max_unvalidated_handshakes";
    let before = refused_total(limit);
    let initials = captured_initials(&gateway, FLOOD).await;
    let _flood = Flood::send(gateway.addr(), &initials).await;
    eventually("the flood's excess refused", || {
        refused_total(limit) - before >= ANSWERED as u64
    })
    .await;

    let client = Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let refused = client
        .connect_with(client_config(&gateway), gateway.addr(), "localhost")
        .unwrap()
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, quinn::ConnectionError::ConnectionClosed(close)
            if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED),
        "{refused}"
    );
    assert!(gateway.registry().is_empty());

    let refusals = refused_total(limit) - before;
    let logged = lines.containing("`quic.max_unvalidated_handshakes` (256) reached");
    assert_eq!(
        logged.len(),
        1,
        "{refusals} refusals must write one line: {logged:#?}"
    );
    assert!(refusals > ANSWERED as u64, "{refusals}");
}
