//! A configuration the gateway cannot use stops it at start with the key (and its environment
//! variable) at fault; a listener that cannot bind names its transport.

use switchyard_gateway::{ConfigError, Gateway, GatewayConfig, StartError};
use switchyard_tests::test_config;

fn load(vars: &[(&str, &str)]) -> Result<GatewayConfig, ConfigError> {
    let env = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
    GatewayConfig::load(None, env, &[])
}

#[test]
fn each_bad_value_names_its_key_and_variable() {
    let cases = [
        ("SWITCHYARD_GRPC_LISTEN", "localhost", "grpc.listen"),
        ("SWITCHYARD_OPS_LISTEN", "127.0.0.1:http", "ops.listen"),
        ("SWITCHYARD_QUIC_ENABLED", "maybe", "quic.enabled"),
        (
            "SWITCHYARD_SHUTDOWN_DRAIN_TIMEOUT",
            "30",
            "shutdown.drain_timeout",
        ),
        ("SWITCHYARD_LOG_FORMAT", "xml", "log.format"),
        ("SWITCHYARD_NAMESPACES_POLICY", "ajar", "namespaces.policy"),
        (
            "SWITCHYARD_GRPC_MAX_MESSAGE_SIZE",
            "0",
            "grpc.max_message_size",
        ),
    ];
    for (var, value, key) in cases {
        let error = load(&[(var, value)]).expect_err(var);
        assert_eq!(error.key(), Some(key), "{var}={value}: {error}");
        let message = error.to_string();
        assert!(message.contains(key) && message.contains(var), "{message}");
    }
}

#[test]
fn a_public_address_without_principals_is_refused_with_the_reason() {
    let error = load(&[("SWITCHYARD_GRPC_LISTEN", "0.0.0.0:7700")]).unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with("refusing to start: grpc.listen"),
        "{message}"
    );
    assert!(message.contains("no principal is configured"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_names_the_transport_that_could_not_bind() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let data_dir = tempfile::tempdir().unwrap();
    let mut config = test_config(data_dir.path());
    config.quic.enabled = false;
    config.grpc.listen = taken.local_addr().unwrap();
    let error = Gateway::builder(config).start().await.unwrap_err();
    assert!(
        matches!(&error, StartError::Transport { name, .. } if name == "grpc"),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains(&taken.local_addr().unwrap().to_string())
    );
}
