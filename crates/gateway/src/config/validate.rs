//! Checks across keys that the types alone cannot express, including security by default.

use std::collections::HashSet;
use std::net::SocketAddr;

use super::{ConfigError, GatewayConfig, StoreBackendName};

/// Refuses a configuration that is inconsistent or would expose the gateway unauthenticated.
pub(super) fn validate(config: &GatewayConfig) -> Result<(), ConfigError> {
    positive(config)?;
    store(config)?;
    principals(config)?;
    namespaces(config)?;
    tls(config)?;
    listeners(config)?;
    super::cluster::validate(&config.cluster)?;
    super::cluster::validate_durability(config)?;
    security(config)
}

fn positive(config: &GatewayConfig) -> Result<(), ConfigError> {
    let durations = [
        (
            "grpc.registration_deadline",
            config.grpc.registration_deadline,
        ),
        ("grpc.keepalive_interval", config.grpc.keepalive_interval),
        ("grpc.keepalive_timeout", config.grpc.keepalive_timeout),
        ("grpc.handshake_timeout", config.grpc.handshake_timeout),
        ("ops.header_read_timeout", config.ops.header_read_timeout),
        ("ops.idle_timeout", config.ops.idle_timeout),
        (
            "quic.registration_timeout",
            config.quic.registration_timeout,
        ),
        ("dispatch.default_timeout", config.dispatch.default_timeout),
        ("dispatch.max_timeout", config.dispatch.max_timeout),
        ("dispatch.loss_window", config.dispatch.loss_window),
        (
            "dispatch.cancel_ack_timeout",
            config.dispatch.cancel_ack_timeout,
        ),
        (
            "registry.namespace_idle_expiry",
            config.registry.namespace_idle_expiry,
        ),
        ("liveness.ping_interval", config.liveness.ping_interval),
        ("liveness.ping_timeout", config.liveness.ping_timeout),
        (
            "dispatch.slow_consumer_timeout",
            config.dispatch.slow_consumer_timeout,
        ),
        (
            "liveness.heartbeat_window",
            config.liveness.heartbeat_window,
        ),
        // A zero RTT would start every connection's loss timers at quinn's floor of a few
        // milliseconds, whatever the link; a zero idle timeout advertises none, so a dead
        // connection would be timed out only if the worker asked for it (RFC 9000, 10.1).
        ("quic.initial_rtt", config.quic.initial_rtt),
        ("quic.max_idle_timeout", config.quic.max_idle_timeout),
    ];
    for (key, value) in durations {
        if value.get().is_zero() {
            return Err(ConfigError::invalid(
                key,
                "must be longer than 0s".to_owned(),
            ));
        }
    }
    let counts = [
        ("grpc.max_message_size", config.grpc.max_message_size),
        (
            "grpc.max_workers_per_connection",
            config.grpc.max_workers_per_connection,
        ),
        (
            "grpc.max_concurrent_streams",
            config.grpc.max_concurrent_streams as usize,
        ),
        ("grpc.max_connections", config.grpc.max_connections),
        (
            "grpc.max_connections_per_address",
            config.grpc.max_connections_per_address,
        ),
        ("grpc.max_health_watchers", config.grpc.max_health_watchers),
        ("ops.max_connections", config.ops.max_connections),
        (
            "dispatch.max_in_flight_per_stream",
            config.dispatch.max_in_flight_per_stream,
        ),
        (
            "dispatch.max_stream_outstanding",
            config.dispatch.max_stream_outstanding,
        ),
        (
            "dispatch.max_parked_per_namespace",
            config.dispatch.max_parked_per_namespace,
        ),
        (
            "dispatch.max_parked_per_principal",
            config.dispatch.max_parked_per_principal,
        ),
        (
            "dispatch.max_held_input_bytes_per_namespace",
            config.dispatch.max_held_input_bytes_per_namespace,
        ),
        (
            "dispatch.max_held_input_bytes_per_principal",
            config.dispatch.max_held_input_bytes_per_principal,
        ),
        (
            "dispatch.max_unresponsive_tasks",
            config.dispatch.max_unresponsive_tasks as usize,
        ),
        ("registry.max_namespaces", config.registry.max_namespaces),
        (
            "liveness.probation_pings",
            config.liveness.probation_pings as usize,
        ),
        (
            "liveness.miss_threshold",
            config.liveness.miss_threshold as usize,
        ),
        (
            "quic.stream_receive_window",
            config.quic.stream_receive_window as usize,
        ),
        ("quic.receive_window", config.quic.receive_window as usize),
        ("quic.send_window", config.quic.send_window as usize),
        (
            "quic.max_control_frame",
            config.quic.max_control_frame as usize,
        ),
        ("quic.max_lane_frame", config.quic.max_lane_frame as usize),
        (
            "registry.max_concurrency_limit",
            config.registry.max_concurrency_limit as usize,
        ),
        (
            "quic.max_unregistered_connections",
            config.quic.max_unregistered_connections,
        ),
        (
            "quic.max_unvalidated_handshakes",
            config.quic.max_unvalidated_handshakes,
        ),
        (
            "quic.max_connections_per_address",
            config.quic.max_connections_per_address,
        ),
    ];
    for (key, value) in counts {
        if value == 0 {
            return Err(ConfigError::invalid(key, "must be at least 1".to_owned()));
        }
    }
    let max_buffer = switchyard_transport_quic::MAX_SOCKET_BUFFER;
    if config.quic.socket_buffer > max_buffer {
        return Err(ConfigError::invalid(
            "quic.socket_buffer",
            format!(
                "{} is above the limit of {max_buffer}",
                config.quic.socket_buffer
            ),
        ));
    }
    let max_threshold = switchyard_transport_quic::MAX_ACK_ELICITING_THRESHOLD;
    if config.quic.ack_eliciting_threshold > max_threshold {
        return Err(ConfigError::invalid(
            "quic.ack_eliciting_threshold",
            format!(
                "{} is above the limit of {max_threshold}",
                config.quic.ack_eliciting_threshold
            ),
        ));
    }
    let max_grace = switchyard_transport_quic::MAX_RECONNECT_GRACE;
    if config.quic.reconnect_grace.get() > max_grace {
        return Err(ConfigError::invalid(
            "quic.reconnect_grace",
            format!(
                "{} is above the limit of {}ms (the wire carries milliseconds in 32 bits)",
                config.quic.reconnect_grace,
                max_grace.as_millis()
            ),
        ));
    }
    if config.dispatch.default_timeout > config.dispatch.max_timeout {
        return Err(ConfigError::invalid(
            "dispatch.default_timeout",
            format!(
                "{} is longer than dispatch.max_timeout {}",
                config.dispatch.default_timeout, config.dispatch.max_timeout
            ),
        ));
    }
    if config.liveness.ping_timeout >= config.liveness.heartbeat_window {
        return Err(ConfigError::invalid(
            "liveness.ping_timeout",
            format!(
                "{} must be shorter than liveness.heartbeat_window {}: a worker would be \
                 deregistered before a missed ping is counted",
                config.liveness.ping_timeout, config.liveness.heartbeat_window
            ),
        ));
    }
    if config.liveness.heartbeat_window <= config.liveness.ping_interval {
        return Err(ConfigError::invalid(
            "liveness.heartbeat_window",
            format!(
                "{} must be longer than liveness.ping_interval {}",
                config.liveness.heartbeat_window, config.liveness.ping_interval
            ),
        ));
    }
    Ok(())
}

fn store(config: &GatewayConfig) -> Result<(), ConfigError> {
    let store = &config.store;
    if store.outcome_retention.get().is_zero() {
        return Err(ConfigError::invalid(
            "store.outcome_retention",
            "must be longer than 0s: an outcome must be readable after it is recorded".to_owned(),
        ));
    }
    for (key, value) in [
        (
            "store.max_queued_per_namespace",
            store.max_queued_per_namespace,
        ),
        ("store.max_bytes", store.max_bytes),
    ] {
        if value == 0 {
            return Err(ConfigError::invalid(key, "must be at least 1".to_owned()));
        }
    }
    if store.backend == StoreBackendName::Memory && !store.path.is_empty() {
        return Err(ConfigError::invalid(
            "store.path",
            format!(
                "is {:?} while store.backend is \"memory\", which keeps no file; remove the \
                 path or use backend \"sqlite\"",
                store.path
            ),
        ));
    }
    Ok(())
}

fn principals(config: &GatewayConfig) -> Result<(), ConfigError> {
    let mut names = HashSet::new();
    let mut tokens = HashSet::new();
    let mut subjects = HashSet::new();
    for (i, principal) in config.principals.iter().enumerate() {
        let at = |field: &str| format!("principals[{i}].{field}");
        if principal.name.is_empty() {
            return Err(ConfigError::invalid(&at("name"), "is empty".to_owned()));
        }
        if !names.insert(principal.name.as_str()) {
            return Err(ConfigError::invalid(
                &at("name"),
                format!("principal {:?} is listed twice", principal.name),
            ));
        }
        if principal.token.is_empty() && principal.cert_subject.is_empty() {
            return Err(ConfigError::invalid(
                &at("token"),
                format!(
                    "principal {:?} has neither a token nor a cert_subject, so nothing can \
                     authenticate as it",
                    principal.name
                ),
            ));
        }
        if !principal.token.is_empty() {
            token_strength(&at("token"), &principal.token)?;
        }
        if !principal.token.is_empty() && !tokens.insert(principal.token.as_str()) {
            return Err(ConfigError::invalid(
                &at("token"),
                "the same token is given to two principals".to_owned(),
            ));
        }
        if !principal.cert_subject.is_empty() && !subjects.insert(principal.cert_subject.as_str()) {
            return Err(ConfigError::invalid(
                &at("cert_subject"),
                format!(
                    "subject {:?} is given to two principals",
                    principal.cert_subject
                ),
            ));
        }
        if principal.namespaces.is_empty() {
            return Err(ConfigError::invalid(
                &at("namespaces"),
                format!(
                    "principal {:?} is granted no namespace; list some, or \"*\" for all",
                    principal.name
                ),
            ));
        }
        if principal.namespaces.iter().any(String::is_empty) {
            return Err(ConfigError::invalid(
                &at("namespaces"),
                "contains an empty namespace name".to_owned(),
            ));
        }
        if principal.roles.as_ref().is_some_and(Vec::is_empty) {
            return Err(ConfigError::invalid(
                &at("roles"),
                format!(
                    "principal {:?} holds no role, so it could do nothing; list some of \
                     worker, producer, operator, admin (or remove the key for admin)",
                    principal.name
                ),
            ));
        }
        if principal.max_workers == 0 {
            return Err(ConfigError::invalid(
                &at("max_workers"),
                "must be at least 1; to forbid registering, leave `worker` out of roles".to_owned(),
            ));
        }
    }
    Ok(())
}

/// Shortest bearer token accepted, in bytes.
const MIN_TOKEN_BYTES: usize = 16;

/// A token short enough to guess, or padded with whitespace a client header would never carry
/// (so it could never match), cannot work.
fn token_strength(key: &str, token: &str) -> Result<(), ConfigError> {
    if token.trim() != token {
        return Err(ConfigError::invalid(
            key,
            "has leading or trailing whitespace, which no bearer header carries".to_owned(),
        ));
    }
    if token.len() < MIN_TOKEN_BYTES {
        return Err(ConfigError::invalid(
            key,
            format!(
                "is {} bytes; a token needs at least {MIN_TOKEN_BYTES}",
                token.len()
            ),
        ));
    }
    Ok(())
}

fn namespaces(config: &GatewayConfig) -> Result<(), ConfigError> {
    let mut names = HashSet::new();
    for (i, namespace) in config.namespaces.known.iter().enumerate() {
        let at = |field: &str| format!("namespaces.known[{i}].{field}");
        if namespace.name.is_empty() {
            return Err(ConfigError::invalid(&at("name"), "is empty".to_owned()));
        }
        if !names.insert(namespace.name.as_str()) {
            return Err(ConfigError::invalid(
                &at("name"),
                format!("namespace {:?} is listed twice", namespace.name),
            ));
        }
        if !namespace.pinned.is_empty() && !namespace.prefer.is_empty() {
            return Err(ConfigError::invalid(
                &at("prefer"),
                format!(
                    "namespace {:?} is both pinned and preferring; give one of pinned or prefer",
                    namespace.name
                ),
            ));
        }
        for (field, nodes) in [("pinned", &namespace.pinned), ("prefer", &namespace.prefer)] {
            if nodes.iter().any(String::is_empty) {
                return Err(ConfigError::invalid(
                    &at(field),
                    "contains an empty node label".to_owned(),
                ));
            }
        }
    }
    Ok(())
}

fn tls(config: &GatewayConfig) -> Result<(), ConfigError> {
    match (config.tls.cert.is_empty(), config.tls.key.is_empty()) {
        (false, true) => Err(ConfigError::invalid(
            "tls.key",
            "is empty while tls.cert is set; give both or neither".to_owned(),
        )),
        (true, false) => Err(ConfigError::invalid(
            "tls.cert",
            "is empty while tls.key is set; give both or neither".to_owned(),
        )),
        _ if config.tls.require_client_cert && !config.grpc.tls => Err(ConfigError::invalid(
            "tls.require_client_cert",
            "is true while grpc.tls is false: a plaintext listener cannot ask for certificates"
                .to_owned(),
        )),
        _ if config.tls.require_client_cert && config.tls.client_ca.is_empty() => {
            Err(ConfigError::invalid(
                "tls.require_client_cert",
                "is true while tls.client_ca is empty; name the CA client certificates must \
                 chain to"
                    .to_owned(),
            ))
        }
        _ => Ok(()),
    }
}

fn listeners(config: &GatewayConfig) -> Result<(), ConfigError> {
    let grpc = config.grpc.listen;
    let ops = config.ops.listen;
    if config.ops.enabled && grpc.port() != 0 && grpc == ops {
        return Err(ConfigError::invalid(
            "ops.listen",
            format!("{ops} is also grpc.listen; the two TCP listeners need different addresses"),
        ));
    }
    Ok(())
}

fn security(config: &GatewayConfig) -> Result<(), ConfigError> {
    let mut exposed: Vec<(&str, SocketAddr)> = vec![("grpc.listen", config.grpc.listen)];
    if config.quic.enabled {
        exposed.push(("quic.listen", config.quic.listen));
    }
    let ops = config.ops.listen;
    if config.ops.enabled
        && !ops.ip().is_loopback()
        && !config.principals.is_empty()
        && !config.ops.allow_remote
    {
        return Err(ConfigError::insecure(
            "ops.listen",
            format!(
                "binds {ops}, which is not a loopback address, while principals are \
                 configured: the operations listener serves every worker's identity and \
                 principal without a credential. Bind 127.0.0.1, or set ops.allow_remote = true"
            ),
        ));
    }
    for (key, addr) in exposed {
        if addr.ip().is_loopback() {
            continue;
        }
        if config.principals.is_empty() {
            return Err(ConfigError::insecure(
                key,
                format!(
                    "binds {addr}, which is not a loopback address, and no principal is \
                     configured: anyone who can reach it could register workers and dispatch \
                     into any namespace. Add [[principals]] with tokens or certificate subjects, \
                     or bind 127.0.0.1"
                ),
            ));
        }
        if key == "grpc.listen" && !config.grpc.tls {
            return Err(ConfigError::insecure(
                "grpc.tls",
                format!(
                    "is false while grpc.listen binds {addr}, which is not a loopback address: \
                     bearer tokens would cross the network in clear text. Enable TLS or bind \
                     127.0.0.1"
                ),
            ));
        }
    }
    Ok(())
}
