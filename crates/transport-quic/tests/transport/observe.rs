//! What the listener says about itself: its counters (through a Prometheus recorder installed
//! once for this test binary) and its log lines (through a subscriber on the test's thread).

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use switchyard_transport_quic::{
    CONNECTIONS_REFUSED_TOTAL, LISTENER_LABEL, QUIC_DATAGRAM_COPIES_TOTAL,
    QUIC_DATAGRAM_COPY_BYTES_TOTAL, register_metrics,
};

fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new().install_recorder().unwrap();
        register_metrics();
        handle
    })
}

/// Installs the recorder; call it before the counters to be read are first written.
pub(crate) fn record_metrics() {
    recorder();
}

/// `switchyard_connections_refused_total{listener="quic",limit}` as recorded so far in this
/// test binary (tests run in parallel: compare before and after).
pub(crate) fn refused_total(limit: &str) -> u64 {
    let text = recorder().render();
    let listener = format!("listener=\"{LISTENER_LABEL}\"");
    let limit = format!("limit=\"{limit}\"");
    text.lines()
        .find(|line| {
            line.starts_with(CONNECTIONS_REFUSED_TOTAL)
                && line.contains(&listener)
                && line.contains(&limit)
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse::<f64>().ok())
        .map_or(0, |value| value as u64)
}

/// `switchyard_quic_datagram_copies_total{event}` as recorded so far in this test binary (tests
/// run in parallel: compare before and after).
pub(crate) fn copies_total(event: &str) -> u64 {
    let text = recorder().render();
    let event = format!("event=\"{event}\"");
    text.lines()
        .find(|line| line.starts_with(QUIC_DATAGRAM_COPIES_TOTAL) && line.contains(&event))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse::<f64>().ok())
        .map_or(0, |value| value as u64)
}

/// `switchyard_quic_datagram_copy_bytes_total` as recorded so far in this test binary.
pub(crate) fn copy_bytes_total() -> u64 {
    let text = recorder().render();
    let prefix = format!("{QUIC_DATAGRAM_COPY_BYTES_TOTAL} ");
    text.lines()
        .find(|line| line.starts_with(&prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse::<f64>().ok())
        .map_or(0, |value| value as u64)
}

/// Log lines written on the current thread (a current-thread runtime's tasks included) while
/// the guard of [`LogLines::capture`] lives.
#[derive(Clone, Default)]
pub(crate) struct LogLines(Arc<Mutex<Vec<u8>>>);

impl Write for LogLines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogLines {
    /// Starts capturing this thread's WARN and ERROR lines.
    pub(crate) fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let lines = Self::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .finish();
        (lines, tracing::subscriber::set_default(subscriber))
    }

    /// The lines captured that contain `needle`.
    pub(crate) fn containing(&self, needle: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|line| line.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}
