//! The values `docs/quic-protocol.md` states in its defaults table, checked against the
//! crate-private constants that set them (the integration test `spec_tables_match_the_code`
//! checks what the crate exports).

/// The protocol document, as its table rows are checked.
const SPEC: &str = include_str!("../../../docs/quic-protocol.md");

/// The defaults-table row whose first cell is `name`, trimmed.
fn row(name: &str) -> &'static str {
    let start = format!("| {name} |");
    SPEC.lines()
        .find(|line| line.starts_with(&start))
        .unwrap_or_else(|| panic!("docs/quic-protocol.md has no row {start}"))
}

#[test]
fn the_defaults_table_states_the_values_the_code_uses() {
    use crate::redundancy::{DATAGRAM_RECEIVE_BUFFER, DATAGRAM_SEND_BUFFER, MAX_ECHOES};
    use crate::server::acks::{ACK_BATCH_DELAY, ACK_BATCH_IDS};

    assert_eq!(
        (DATAGRAM_RECEIVE_BUFFER, DATAGRAM_SEND_BUFFER),
        (65_536, 65_536)
    );
    assert!(row("datagram receive / send buffer").contains("| 64 KiB each |"));
    assert_eq!(MAX_ECHOES, 16);
    assert!(row("lane copies a lane may owe the gateway").contains("| 16 |"));
    assert_eq!((ACK_BATCH_IDS, ACK_BATCH_DELAY.as_millis()), (256, 20));
    assert!(row("`results_ack` batch").contains("| 256 ids, or 20 ms after the oldest |"));
    assert_eq!(switchyard_core::MAX_RESUME_TASKS, 65_536);
    assert!(row("task ids per `resume` list").contains("| 65,536 |"));
    assert_eq!(crate::WORKER_KEEP_ALIVE.as_secs(), 2);
    assert_eq!(
        crate::ConnectionConfig::default()
            .keep_alive_interval
            .map(|every| every.as_secs()),
        Some(10)
    );
    assert!(row("QUIC keep-alive").contains("| 10 s (the SDK worker: 2 s) |"));
    assert_eq!(crate::redundancy::COPY_SPACING.as_millis(), 5);
    assert!(SPEC.contains("send the datagram 5 ms after queueing the lane copy (`COPY_SPACING`)"));
}
