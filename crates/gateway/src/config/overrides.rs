//! The gateway's defaults held against the libraries' own `Default`s: every key that configures
//! a library setting defaults to the library's value, but for the overrides listed here, each
//! with its reason.

use switchyard_core::{
    DEFAULT_MAX_CONCURRENCY_LIMIT, DEFAULT_MAX_NAMESPACES_LIVE, DEFAULT_NAMESPACE_IDLE_EXPIRY,
    DispatchConfig, DurableConfig, LivenessConfig,
};
use switchyard_store_sqlite::SqliteOptions;
use switchyard_transport_grpc::GrpcServerConfig;
use switchyard_transport_quic::QuicServerConfig;

use super::GatewayConfig;
use crate::api::ApiConfig;
use crate::quic::QuicTransport;

/// Every library setting the gateway configures, as the gateway hands it over.
#[derive(Clone, Debug, PartialEq)]
struct Libraries {
    grpc: GrpcServerConfig,
    quic: QuicServerConfig,
    dispatch: DispatchConfig,
    liveness: LivenessConfig,
    api: ApiConfig,
    durable: DurableConfig,
    sqlite: SqliteOptions,
    max_concurrency_limit: u32,
    max_namespaces: usize,
    namespace_idle_expiry: std::time::Duration,
}

impl Libraries {
    fn defaults() -> Self {
        Self {
            grpc: GrpcServerConfig::default(),
            quic: QuicServerConfig::default(),
            dispatch: DispatchConfig::default(),
            liveness: LivenessConfig::default(),
            api: ApiConfig::default(),
            durable: DurableConfig::default(),
            sqlite: SqliteOptions::default(),
            max_concurrency_limit: DEFAULT_MAX_CONCURRENCY_LIMIT,
            max_namespaces: DEFAULT_MAX_NAMESPACES_LIVE,
            namespace_idle_expiry: DEFAULT_NAMESPACE_IDLE_EXPIRY,
        }
    }

    /// What the gateway's own conversions make of `config`.
    fn from_gateway(config: &GatewayConfig) -> Self {
        let core = crate::gateway::core_config(config);
        Self {
            grpc: crate::grpc_server::worker_config(&config.grpc),
            quic: QuicTransport::new(config.quic.clone()).server_config(),
            dispatch: core.dispatch,
            liveness: core.liveness,
            api: crate::gateway::api_settings(config),
            durable: crate::store::durable_config(&config.store),
            sqlite: crate::store::sqlite_options(&config.store),
            max_concurrency_limit: config.registry.max_concurrency_limit,
            max_namespaces: config.registry.max_namespaces,
            namespace_idle_expiry: config.registry.namespace_idle_expiry.get(),
        }
    }
}

/// Gateway defaults that differ from their library's on purpose: (what, why).
const OVERRIDES: &[(&str, &str)] = &[
    (
        "quic.listen",
        "127.0.0.1:7701, not the library's [::]:7443: the gateway binds loopback until \
         principals are configured, its three listeners on adjacent ports",
    ),
    (
        "the dispatch input limit",
        "computed at start by limits.rs from grpc.max_message_size and quic.max_lane_frame, so \
         an accepted input fits every enabled worker leg; core's default assumes no transport",
    ),
];

/// Copies the overridden setting from `gateway` into `expected`.
fn apply(what: &str, gateway: &Libraries, expected: &mut Libraries) {
    match what {
        "quic.listen" => expected.quic.listen = gateway.quic.listen,
        "the dispatch input limit" => {
            expected.dispatch.max_input_bytes = gateway.dispatch.max_input_bytes;
        }
        other => panic!("override {other:?} is listed but not applied"),
    }
}

#[test]
fn gateway_defaults_are_the_library_defaults_but_for_the_listed_overrides() {
    let gateway = Libraries::from_gateway(&GatewayConfig::default());
    let mut expected = Libraries::defaults();
    for (what, why) in OVERRIDES {
        assert!(!why.is_empty(), "{what} has no reason");
        let before = expected.clone();
        apply(what, &gateway, &mut expected);
        assert_ne!(
            before, expected,
            "{what} no longer differs: drop the override"
        );
    }
    assert_eq!(gateway, expected);
}

#[test]
fn a_retyped_default_that_drifts_is_caught() {
    // Control: the divergence this test exists for (keepalive 20 s / 10 s against 10 s / 20 s)
    // makes the comparison fail.
    let mut drifted = GatewayConfig::default();
    drifted.grpc.keepalive_interval = super::ConfigDuration::secs(10);
    drifted.grpc.keepalive_timeout = super::ConfigDuration::secs(20);
    let gateway = Libraries::from_gateway(&drifted);
    let mut expected = Libraries::defaults();
    for (what, _) in OVERRIDES {
        apply(what, &gateway, &mut expected);
    }
    assert_ne!(gateway, expected);
    assert_ne!(
        gateway.grpc.keepalive_timeout,
        expected.grpc.keepalive_timeout
    );
}
