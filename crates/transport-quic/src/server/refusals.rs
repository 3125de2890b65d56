//! How a refused connection is reported: always counted, logged at most once per interval and
//! limit with the number held back since, so a flood of refusals cannot flood the log. The
//! same holds for connections that end their registration without a worker (a refused
//! credential, a deadline missed): one line per kind and interval.

use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::intake::{Limit, Refusal};
use crate::metrics;
use crate::protocol::ErrorCode;
use switchyard_core::Throttle;

/// At most one refusal line per limit in this long.
pub(crate) const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// How a registration ended without a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RegistrationEnd {
    /// Refused with this code: a credential, a malformed registration, the gate.
    Refused(ErrorCode),
    /// No registration within the deadline.
    TimedOut,
}

impl RegistrationEnd {
    /// Its throttle's place.
    const fn index(self) -> usize {
        match self {
            Self::Refused(_) => 0,
            Self::TimedOut => 1,
        }
    }
}

/// The refusal counters and the throttled lines, one throttle per limit and per kind of
/// registration end.
#[derive(Debug)]
pub(crate) struct Refusals {
    throttles: Mutex<[Throttle; 3]>,
    registrations: Mutex<[Throttle; 2]>,
}

impl Default for Refusals {
    fn default() -> Self {
        Self {
            throttles: Mutex::new(Limit::ALL.map(|_| Throttle::new(REFUSAL_LOG_INTERVAL))),
            registrations: Mutex::new([(); 2].map(|()| Throttle::new(REFUSAL_LOG_INTERVAL))),
        }
    }
}

impl Refusals {
    /// Counts a connection from `remote` refused at `now`, and logs it unless a line for the
    /// same limit was written less than [`REFUSAL_LOG_INTERVAL`] ago.
    pub(crate) fn refused(&self, refusal: Refusal, remote: SocketAddr, now: Instant) {
        metrics::refused(refusal.limit.label()).increment(1);
        let allowed = self
            .throttles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[refusal.limit as usize]
            .allow(now.into_std());
        if let Some(suppressed) = allowed {
            tracing::warn!(
                %remote,
                limit = refusal.limit.label(),
                suppressed,
                "refusing QUIC connections: {refusal}; `suppressed` more were refused \
                 for this limit since the last such line"
            );
        }
    }
}

impl Refusals {
    /// Logs a registration that ended without a worker, for `reason`, unless a line for the
    /// same kind was written less than [`REFUSAL_LOG_INTERVAL`] ago.
    pub(crate) fn registration_ended(&self, end: RegistrationEnd, reason: &str, now: Instant) {
        let allowed = self
            .registrations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[end.index()]
        .allow(now.into_std());
        let Some(suppressed) = allowed else {
            return;
        };
        match end {
            RegistrationEnd::Refused(code) => {
                tracing::info!(%code, %reason, suppressed, "registration refused");
            }
            RegistrationEnd::TimedOut => {
                tracing::info!(%reason, suppressed, "registration timed out");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;

    use super::*;

    /// Log lines written through a test subscriber.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn capture(lines: &Lines) -> tracing::subscriber::DefaultGuard {
        let lines = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || lines.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    const REMOTE: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 4433);

    fn cap() -> Refusal {
        Refusal {
            limit: Limit::ConnectionsPerAddress,
            value: 2,
        }
    }

    #[test]
    fn a_thousand_refusals_write_one_line_and_the_next_one_counts_them() {
        let lines = Lines::default();
        let _guard = capture(&lines);
        let refusals = Refusals::default();
        let start = Instant::now();
        for i in 0..1_000 {
            refusals.refused(cap(), REMOTE, start + Duration::from_millis(i));
        }
        let text = lines.text();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains("`quic.max_connections_per_address` (2) reached"),
            "the line names the limit and its value: {text}"
        );
        assert!(text.contains("suppressed=0"), "{text}");

        refusals.refused(cap(), REMOTE, start + REFUSAL_LOG_INTERVAL);
        let text = lines.text();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            text.lines().nth(1).unwrap().contains("suppressed=999"),
            "{text}"
        );
    }

    #[test]
    fn refused_registrations_write_one_line_per_interval() {
        let lines = Lines::default();
        let _guard = capture(&lines);
        let refusals = Refusals::default();
        let start = Instant::now();
        for i in 0..100 {
            refusals.registration_ended(
                RegistrationEnd::Refused(ErrorCode::Unauthenticated),
                "bearer token not recognised",
                start + Duration::from_millis(i),
            );
        }
        // Control: the other kind has its own line.
        refusals.registration_ended(RegistrationEnd::TimedOut, "no registration", start);
        let text = lines.text();
        assert_eq!(text.lines().count(), 2, "{text}");
        refusals.registration_ended(
            RegistrationEnd::Refused(ErrorCode::Unauthenticated),
            "bearer token not recognised",
            start + REFUSAL_LOG_INTERVAL,
        );
        let text = lines.text();
        assert!(
            text.lines().nth(2).unwrap().contains("suppressed=99"),
            "{text}"
        );
    }

    #[test]
    fn each_limit_has_its_own_line() {
        // Control for the test above: a refusal for another limit is not held back by the
        // first limit's line.
        let lines = Lines::default();
        let _guard = capture(&lines);
        let refusals = Refusals::default();
        let now = Instant::now();
        refusals.refused(cap(), REMOTE, now);
        let handshakes = Refusal {
            limit: Limit::UnvalidatedHandshakes,
            value: 256,
        };
        refusals.refused(handshakes, REMOTE, now);
        let text = lines.text();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            text.contains("`quic.max_unvalidated_handshakes` (256) reached"),
            "{text}"
        );
    }
}
