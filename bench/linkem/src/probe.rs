//! Small blocking UDP probes run inside the namespaces: a paced sender, a counting sink, an
//! echo server and a ping client.
//!
//! Every datagram starts with its sequence number (8 bytes, big-endian). Every probe stops by
//! itself: after a count, after an idle period, or at a hard time limit.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Bytes of the sequence number that opens every probe datagram.
pub const SEQ_LEN: usize = 8;

/// Largest datagram a probe sends or reads.
const MAX_DATAGRAM: usize = 65_507;

/// Longest single wait on a socket, so time limits are checked at least this often.
const POLL_SLICE: Duration = Duration::from_millis(100);

/// Options of [`udp_sink`].
#[derive(Debug, Clone)]
pub struct SinkOptions {
    /// Address to receive on.
    pub bind: SocketAddr,
    /// Stop once this many distinct sequence numbers (`0..expect`) have arrived.
    pub expect: u64,
    /// Stop this long after the last datagram (once one has arrived).
    pub idle: Duration,
    /// Stop after this long in any case.
    pub limit: Duration,
}

/// What [`udp_sink`] received.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SinkReport {
    /// Datagrams received.
    pub received: u64,
    /// Distinct sequence numbers in `0..expect` received.
    pub distinct: u64,
    /// Datagrams repeating a sequence number already seen.
    pub duplicates: u64,
    /// Datagrams too short for a sequence number or beyond `expect`.
    pub unexpected: u64,
}

/// Counts datagrams on `options.bind`; calls `ready` once bound.
pub fn udp_sink(options: &SinkOptions, ready: impl FnOnce(SocketAddr)) -> io::Result<SinkReport> {
    let socket = UdpSocket::bind(options.bind)?;
    ready(socket.local_addr()?);
    let expect = usize::try_from(options.expect).unwrap_or(usize::MAX);
    let mut seen = vec![false; expect.min(16 * 1024 * 1024)];
    let mut report = SinkReport::default();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let started = Instant::now();
    let mut last = None;
    while report.distinct < options.expect {
        let stop_at = match last {
            Some(at) => (started + options.limit).min(at + options.idle),
            None => started + options.limit,
        };
        let Some(len) = recv_until(&socket, &mut buf, stop_at)?.map(|(len, _)| len) else {
            break;
        };
        last = Some(Instant::now());
        report.received += 1;
        match sequence(&buf[..len]).and_then(|s| usize::try_from(s).ok()) {
            Some(seq) if seq < seen.len() => {
                if seen[seq] {
                    report.duplicates += 1;
                } else {
                    seen[seq] = true;
                    report.distinct += 1;
                }
            }
            _ => report.unexpected += 1,
        }
    }
    Ok(report)
}

/// Options of [`udp_send`].
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Destination.
    pub to: SocketAddr,
    /// Datagrams to send, numbered `0..count`.
    pub count: u64,
    /// Datagram size in bytes (at least [`SEQ_LEN`]).
    pub size: usize,
    /// Datagrams per second.
    pub per_second: u32,
}

/// What [`udp_send`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SendReport {
    /// Datagrams the kernel accepted.
    pub sent: u64,
    /// Datagrams the kernel refused.
    pub errors: u64,
}

/// Sends `count` numbered datagrams paced at `per_second`.
pub fn udp_send(options: &SendOptions) -> io::Result<SendReport> {
    let socket = UdpSocket::bind(unspecified_like(options.to))?;
    let mut payload = vec![0u8; options.size.clamp(SEQ_LEN, MAX_DATAGRAM)];
    let interval = Duration::from_secs(1) / options.per_second.max(1);
    let started = Instant::now();
    let mut report = SendReport::default();
    for seq in 0..options.count {
        let due = started + interval * u32::try_from(seq).unwrap_or(u32::MAX);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        payload[..SEQ_LEN].copy_from_slice(&seq.to_be_bytes());
        match socket.send_to(&payload, options.to) {
            Ok(_) => report.sent += 1,
            Err(_) => report.errors += 1,
        }
    }
    Ok(report)
}

/// Options of [`udp_echo`].
#[derive(Debug, Clone)]
pub struct EchoOptions {
    /// Address to serve on.
    pub bind: SocketAddr,
    /// Stop after echoing this many datagrams.
    pub count: u64,
    /// Stop this long after the last datagram (once one has arrived).
    pub idle: Duration,
    /// Stop after this long in any case.
    pub limit: Duration,
}

/// Echoes datagrams back to their sender; calls `ready` once bound. Returns the number
/// echoed.
pub fn udp_echo(options: &EchoOptions, ready: impl FnOnce(SocketAddr)) -> io::Result<u64> {
    let socket = UdpSocket::bind(options.bind)?;
    ready(socket.local_addr()?);
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let started = Instant::now();
    let mut last = None;
    let mut echoed = 0u64;
    while echoed < options.count {
        let stop_at = match last {
            Some(at) => (started + options.limit).min(at + options.idle),
            None => started + options.limit,
        };
        let Some((len, peer)) = recv_until(&socket, &mut buf, stop_at)? else {
            break;
        };
        last = Some(Instant::now());
        socket.send_to(&buf[..len], peer)?;
        echoed += 1;
    }
    Ok(echoed)
}

/// Options of [`udp_ping`].
#[derive(Debug, Clone)]
pub struct PingOptions {
    /// The echo server.
    pub to: SocketAddr,
    /// Pings to send, one at a time.
    pub count: u32,
    /// How long to wait for each reply.
    pub timeout: Duration,
    /// Datagram size in bytes (at least [`SEQ_LEN`]).
    pub size: usize,
}

/// Round-trip times measured by [`udp_ping`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PingReport {
    /// Pings sent.
    pub sent: u32,
    /// Replies received in time.
    pub received: u32,
    /// Each reply's round-trip time in microseconds, in order.
    pub rtt_us: Vec<u64>,
}

/// Sends numbered pings one at a time and times each echo.
pub fn udp_ping(options: &PingOptions) -> io::Result<PingReport> {
    let socket = UdpSocket::bind(unspecified_like(options.to))?;
    socket.connect(options.to)?;
    let mut payload = vec![0u8; options.size.clamp(SEQ_LEN, MAX_DATAGRAM)];
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut report = PingReport::default();
    for seq in 0..u64::from(options.count) {
        payload[..SEQ_LEN].copy_from_slice(&seq.to_be_bytes());
        let sent_at = Instant::now();
        socket.send(&payload)?;
        report.sent += 1;
        let deadline = sent_at + options.timeout;
        // Replies to earlier, timed-out pings are skipped; the loop ends at the deadline.
        while let Some((len, _)) = recv_until(&socket, &mut buf, deadline)? {
            if sequence(&buf[..len]) == Some(seq) {
                let rtt = sent_at.elapsed().as_micros();
                report.rtt_us.push(u64::try_from(rtt).unwrap_or(u64::MAX));
                report.received += 1;
                break;
            }
        }
    }
    Ok(report)
}

/// Receives one datagram, or `None` once `deadline` passes.
fn recv_until(
    socket: &UdpSocket,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<Option<(usize, SocketAddr)>> {
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return Ok(None);
        };
        if left.is_zero() {
            return Ok(None);
        }
        socket.set_read_timeout(Some(left.min(POLL_SLICE)))?;
        match socket.recv_from(buf) {
            Ok(got) => return Ok(Some(got)),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            // An ICMP error from an earlier datagram; not this socket's failure.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
            Err(e) => return Err(e),
        }
    }
}

fn sequence(datagram: &[u8]) -> Option<u64> {
    let bytes: [u8; SEQ_LEN] = datagram.get(..SEQ_LEN)?.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

fn unspecified_like(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::thread;

    use super::*;

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    #[test]
    fn the_sink_counts_what_the_sender_sent_and_stops_at_the_expected_count() {
        let (tx, rx) = mpsc::channel();
        let sink = thread::spawn(move || {
            let options = SinkOptions {
                bind: loopback(),
                expect: 200,
                idle: Duration::from_secs(5),
                limit: Duration::from_secs(10),
            };
            udp_sink(&options, |addr| tx.send(addr).unwrap())
        });
        let to = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let sent = udp_send(&SendOptions {
            to,
            count: 200,
            size: 64,
            per_second: 20_000,
        })
        .unwrap();
        assert_eq!(
            sent,
            SendReport {
                sent: 200,
                errors: 0
            }
        );
        let report = sink.join().unwrap().unwrap();
        assert_eq!(report.distinct, 200);
        assert_eq!(report.duplicates, 0);
    }

    #[test]
    fn the_sink_stops_when_idle_and_reports_what_is_missing() {
        let (tx, rx) = mpsc::channel();
        let sink = thread::spawn(move || {
            let options = SinkOptions {
                bind: loopback(),
                expect: 100,
                idle: Duration::from_millis(200),
                limit: Duration::from_secs(10),
            };
            udp_sink(&options, |addr| tx.send(addr).unwrap())
        });
        let to = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        udp_send(&SendOptions {
            to,
            count: 40,
            size: 8,
            per_second: 20_000,
        })
        .unwrap();
        let report = sink.join().unwrap().unwrap();
        assert_eq!(report.distinct, 40);
    }

    #[test]
    fn ping_times_every_echo_and_the_echo_server_counts_them() {
        let (tx, rx) = mpsc::channel();
        let echo = thread::spawn(move || {
            let options = EchoOptions {
                bind: loopback(),
                count: 5,
                idle: Duration::from_secs(5),
                limit: Duration::from_secs(10),
            };
            udp_echo(&options, |addr| tx.send(addr).unwrap())
        });
        let to = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let report = udp_ping(&PingOptions {
            to,
            count: 5,
            timeout: Duration::from_secs(2),
            size: 32,
        })
        .unwrap();
        assert_eq!(report.sent, 5);
        assert_eq!(report.received, 5);
        assert_eq!(report.rtt_us.len(), 5);
        assert_eq!(echo.join().unwrap().unwrap(), 5);
    }

    #[test]
    fn ping_without_a_server_times_out_and_receives_nothing() {
        // A bound socket that never answers.
        let silent = UdpSocket::bind(loopback()).unwrap();
        let report = udp_ping(&PingOptions {
            to: silent.local_addr().unwrap(),
            count: 2,
            timeout: Duration::from_millis(50),
            size: 8,
        })
        .unwrap();
        assert_eq!(report.sent, 2);
        assert_eq!(report.received, 0);
    }
}
