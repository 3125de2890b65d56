//! The series the QUIC listener records, so an embedder can export them at zero from the start.

/// `switchyard_connections_refused_total{listener="quic",limit}`: connections refused because a
/// limit was reached, by the limit's setting.
pub const CONNECTIONS_REFUSED_TOTAL: &str = "switchyard_connections_refused_total";

/// `switchyard_quic_retries_total`: new connections answered with a stateless Retry.
pub const QUIC_RETRIES_TOTAL: &str = "switchyard_quic_retries_total";

/// `switchyard_quic_datagram_copies_total{event}`: datagram copies of small frames
/// (`quic.redundancy = "datagram"`) the listener handled, by [`COPY_EVENTS`].
pub const QUIC_DATAGRAM_COPIES_TOTAL: &str = "switchyard_quic_datagram_copies_total";

/// `switchyard_quic_datagram_copy_bytes_total`: payload bytes of the datagram copies the
/// listener sent (QUIC framing excluded).
pub const QUIC_DATAGRAM_COPY_BYTES_TOTAL: &str = "switchyard_quic_datagram_copy_bytes_total";

/// Every `event` label of [`QUIC_DATAGRAM_COPIES_TOTAL`]: `sent` (task copies sent), `used` (a
/// result copy arrived before its lane copy and ended the task), `dropped` (a result copy
/// arrived after its lane copy, or for a lane or task no longer held), `lane_copy_dropped`
/// (a result's lane copy arrived after its datagram copy had been used).
pub const COPY_EVENTS: [&str; 4] = ["sent", "used", "dropped", "lane_copy_dropped"];

/// The `listener` label of [`CONNECTIONS_REFUSED_TOTAL`] for this listener.
pub const LISTENER_LABEL: &str = "quic";

/// Every `limit` label of [`CONNECTIONS_REFUSED_TOTAL`] for this listener: the settings of
/// [`QuicServerConfig`](crate::QuicServerConfig) a refusal names.
pub const LIMIT_LABELS: [&str; 3] = [
    "max_unvalidated_handshakes",
    "max_unregistered_connections",
    "max_connections_per_address",
];

/// Registers every series the listener records, at zero, with the installed `metrics`
/// recorder. Idempotent; call it once the recorder is installed.
pub fn register_metrics() {
    for limit in LIMIT_LABELS {
        refused(limit).increment(0);
    }
    metrics::counter!(QUIC_RETRIES_TOTAL).increment(0);
    for event in COPY_EVENTS {
        copies(event).increment(0);
    }
    metrics::counter!(QUIC_DATAGRAM_COPY_BYTES_TOTAL).increment(0);
}

/// The datagram-copy counter of `event`.
pub(crate) fn copies(event: &'static str) -> metrics::Counter {
    metrics::counter!(QUIC_DATAGRAM_COPIES_TOTAL, "event" => event)
}

/// The refusal counter of `limit`.
pub(crate) fn refused(limit: &'static str) -> metrics::Counter {
    metrics::counter!(CONNECTIONS_REFUSED_TOTAL, "listener" => LISTENER_LABEL, "limit" => limit)
}

/// Counts one Retry sent.
pub(crate) fn retried() {
    metrics::counter!(QUIC_RETRIES_TOTAL).increment(1);
}
