//! One source address holds at most `max_connections_per_address` connections; the excess is
//! refused with `CONNECTION_REFUSED` and counted, and other addresses are unaffected.

use std::net::SocketAddr;

use quinn::{Connection, ConnectionError, Endpoint, TransportErrorCode};
use switchyard_auth::AllowAll;
use switchyard_transport_quic::{ErrorCode, QuicServerConfig, RetryPolicy};

use crate::observe::{record_metrics, refused_total};
use crate::support::{Gateway, PATIENCE, Raw, client_config, closed_with, register_frame};

const LIMIT: &str = "max_connections_per_address";

/// Held by each test here: both refuse for [`LIMIT`], and the first counts those refusals.
static COUNTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn connect_from(
    gateway: &Gateway,
    local: &str,
) -> (Endpoint, Result<Connection, ConnectionError>) {
    let local: SocketAddr = local.parse().unwrap();
    let endpoint = Endpoint::client(local).unwrap();
    let connecting = endpoint
        .connect_with(client_config(gateway), gateway.addr(), "localhost")
        .unwrap();
    let result = tokio::time::timeout(PATIENCE, connecting)
        .await
        .expect("the gateway answered");
    (endpoint, result)
}

fn is_refused(result: &Result<Connection, ConnectionError>) -> bool {
    matches!(result, Err(ConnectionError::ConnectionClosed(close))
        if close.error_code == TransportErrorCode::CONNECTION_REFUSED)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_per_address_cap_are_refused_and_other_addresses_are_not() {
    let _counter = COUNTER.lock().await;
    record_metrics();
    // Every address validated before its handshake, so each connection counts from its first
    // packet and the third one's refusal does not race the second one's handshake.
    let config = QuicServerConfig {
        retry: RetryPolicy::Always,
        max_connections_per_address: 2,
        ..QuicServerConfig::default()
    };
    let gateway = Gateway::with(config, AllowAll).await;
    let before = refused_total(LIMIT);
    // One registered and one still registering: both count.
    let mut registered = Raw::connect(&gateway).await;
    registered.register(register_frame(&["work"])).await;
    let registering = Raw::connect(&gateway).await;

    let (_third, third) = connect_from(&gateway, "127.0.0.1:0").await;
    assert!(is_refused(&third), "{third:?}");
    assert_eq!(refused_total(LIMIT) - before, 1, "the refusal is counted");

    // Another address (Linux routes all of 127/8 to loopback) has its own share.
    let (_elsewhere, elsewhere) = connect_from(&gateway, "127.0.0.2:0").await;
    assert!(elsewhere.is_ok(), "{elsewhere:?}");

    // Control: once one of the address's connections ends, its place is free again.
    registering.conn.close(0u32.into(), b"bye");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut attempts = 0;
    loop {
        let (_endpoint, again) = connect_from(&gateway, "127.0.0.1:0").await;
        if again.is_ok() {
            break;
        }
        assert!(is_refused(&again), "{again:?}");
        attempts += 1;
        assert!(
            attempts < 1_000 && tokio::time::Instant::now() < deadline,
            "the address's place was never given back"
        );
    }
}

/// A connection whose address was not validated before its handshake (here with Retry off)
/// is counted against its address once the handshake proves it, and closed with the
/// application code naming the limit when the address is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_finds_its_address_full_is_closed_naming_the_limit() {
    let _counter = COUNTER.lock().await;
    let config = QuicServerConfig {
        retry: RetryPolicy::Off,
        max_connections_per_address: 1,
        // The first connection never registers: on a loaded machine the default registration
        // timeout could close it (and free the place) before the second handshake is judged.
        registration_timeout: std::time::Duration::from_secs(120),
        ..QuicServerConfig::default()
    };
    let gateway = Gateway::with(config, AllowAll).await;
    let first = Raw::connect(&gateway).await;
    let (_second, second) = connect_from(&gateway, "127.0.0.1:0").await;
    let second = second.unwrap();
    // The client's handshake ends before the gateway's, so on a loaded machine the second
    // connection's handshake can be judged before the first's: then the first is the one that
    // finds its address full. Either way exactly that one is closed, naming the limit.
    let (code, reason) = tokio::select! {
        closed = closed_with(&second) => closed,
        closed = closed_with(&first.conn) => closed,
    };
    assert_eq!(code, ErrorCode::ConnectionRefused);
    assert_eq!(reason, "`quic.max_connections_per_address` (1) reached");
    // Control: from another address the connection goes on to register.
    let mut elsewhere =
        Raw::connect_from(&gateway, "127.0.0.2:0", client_config(&gateway), None).await;
    elsewhere.register(register_frame(&["work"])).await;
}
