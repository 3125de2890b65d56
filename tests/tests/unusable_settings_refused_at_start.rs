//! Settings that cannot work are refused when the configuration is loaded, each naming its key
//! (and its environment variable): a zero QUIC registration timeout, a ping timeout not shorter
//! than the heartbeat window, tokens short enough to guess or padded with whitespace, a zero
//! listener limit, and an operations listener on a public address next to principals.
// The helper below fails the test that called it, like the tests do.
#![allow(clippy::expect_used)]

use switchyard_gateway::{ConfigError, GatewayConfig};

fn load(vars: &[(&str, &str)]) -> Result<GatewayConfig, ConfigError> {
    let env = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
    GatewayConfig::load(None, env, &[])
}

/// Asserts `vars` is refused naming `key` in the error and in its message.
fn refused_naming(vars: &[(&str, &str)], key: &str) -> String {
    let error = load(vars).expect_err(key);
    assert_eq!(error.key(), Some(key), "{error}");
    let message = error.to_string();
    assert!(message.contains(key), "{message}");
    message
}

fn principals(token: &str) -> String {
    format!(r#"[{{ name = "a", token = "{token}", namespaces = ["*"] }}]"#)
}

#[test]
fn a_zero_quic_registration_timeout_is_refused() {
    let message = refused_naming(
        &[("SWITCHYARD_QUIC_REGISTRATION_TIMEOUT", "0s")],
        "quic.registration_timeout",
    );
    assert!(
        message.contains("SWITCHYARD_QUIC_REGISTRATION_TIMEOUT"),
        "{message}"
    );
    // Control: any positive timeout loads.
    assert!(load(&[("SWITCHYARD_QUIC_REGISTRATION_TIMEOUT", "1s")]).is_ok());
}

#[test]
fn a_ping_timeout_not_shorter_than_the_heartbeat_window_is_refused() {
    let message = refused_naming(
        &[
            ("SWITCHYARD_LIVENESS_PING_TIMEOUT", "40s"),
            ("SWITCHYARD_LIVENESS_HEARTBEAT_WINDOW", "30s"),
        ],
        "liveness.ping_timeout",
    );
    assert!(message.contains("liveness.heartbeat_window"), "{message}");
    // Control: shorter than the window loads.
    assert!(
        load(&[
            ("SWITCHYARD_LIVENESS_PING_TIMEOUT", "20s"),
            ("SWITCHYARD_LIVENESS_HEARTBEAT_WINDOW", "30s"),
        ])
        .is_ok()
    );
}

#[test]
fn a_token_shorter_than_16_bytes_is_refused() {
    let short = principals("s3cret");
    let message = refused_naming(&[("SWITCHYARD_PRINCIPALS", &short)], "principals[0].token");
    assert!(message.contains("at least 16"), "{message}");
    // Control: 16 bytes load.
    let long = principals("0123456789abcdef");
    assert!(load(&[("SWITCHYARD_PRINCIPALS", &long)]).is_ok());
}

#[test]
fn a_token_with_surrounding_whitespace_is_refused() {
    let padded = principals(" 0123456789abcdef0123 ");
    let message = refused_naming(&[("SWITCHYARD_PRINCIPALS", &padded)], "principals[0].token");
    assert!(message.contains("whitespace"), "{message}");
}

#[test]
fn zero_listener_limits_are_refused() {
    for (var, key) in [
        ("SWITCHYARD_GRPC_MAX_CONNECTIONS", "grpc.max_connections"),
        (
            "SWITCHYARD_GRPC_MAX_CONNECTIONS_PER_ADDRESS",
            "grpc.max_connections_per_address",
        ),
        (
            "SWITCHYARD_GRPC_MAX_CONCURRENT_STREAMS",
            "grpc.max_concurrent_streams",
        ),
        (
            "SWITCHYARD_GRPC_MAX_HEALTH_WATCHERS",
            "grpc.max_health_watchers",
        ),
        ("SWITCHYARD_OPS_MAX_CONNECTIONS", "ops.max_connections"),
        (
            "SWITCHYARD_GRPC_HANDSHAKE_TIMEOUT",
            "grpc.handshake_timeout",
        ),
        (
            "SWITCHYARD_OPS_HEADER_READ_TIMEOUT",
            "ops.header_read_timeout",
        ),
        ("SWITCHYARD_OPS_IDLE_TIMEOUT", "ops.idle_timeout"),
    ] {
        let zero = if key.ends_with("timeout") { "0s" } else { "0" };
        refused_naming(&[(var, zero)], key);
    }
}

#[test]
fn a_public_ops_listener_with_principals_is_refused_unless_allowed() {
    let principals = principals("0123456789abcdef");
    let message = refused_naming(
        &[
            ("SWITCHYARD_OPS_LISTEN", "0.0.0.0:7702"),
            ("SWITCHYARD_PRINCIPALS", &principals),
        ],
        "ops.listen",
    );
    assert!(
        message.starts_with("refusing to start: ops.listen"),
        "{message}"
    );
    assert!(message.contains("ops.allow_remote"), "{message}");
    // Control: the operator's explicit consent loads it.
    assert!(
        load(&[
            ("SWITCHYARD_OPS_LISTEN", "0.0.0.0:7702"),
            ("SWITCHYARD_PRINCIPALS", &principals),
            ("SWITCHYARD_OPS_ALLOW_REMOTE", "true"),
        ])
        .is_ok()
    );
}
