use std::io::Write;
use std::path::PathBuf;

use super::*;

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn file(contents: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "switchyard-config-{}-{}.toml",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(contents.as_bytes())
        .unwrap();
    path
}

fn invalid_key(error: &ConfigError) -> (&str, &str) {
    match error {
        ConfigError::Invalid { key, env, .. } | ConfigError::Insecure { key, env, .. } => {
            (key, env)
        }
        other => panic!("expected an error naming a key, got {other}"),
    }
}

#[test]
fn no_file_no_env_no_flags_is_the_documented_default() {
    let config = GatewayConfig::load(None, env(&[]), &[]).unwrap();
    assert_eq!(config, GatewayConfig::default());
    assert_eq!(config.grpc.listen.to_string(), "127.0.0.1:7700");
    assert_eq!(config.quic.listen.to_string(), "127.0.0.1:7701");
    assert_eq!(config.ops.listen.to_string(), "127.0.0.1:7702");
}

#[test]
fn flags_beat_env_which_beats_the_file() {
    let path = file(
        r#"
        [grpc]
        listen = "127.0.0.1:9000"
        registration_deadline = "3s"
        [dispatch]
        loss_budget = 9
        "#,
    );
    let config = GatewayConfig::load(
        Some(&path),
        env(&[
            ("SWITCHYARD_GRPC_LISTEN", "127.0.0.1:9001"),
            ("SWITCHYARD_DISPATCH_LOSS_BUDGET", "5"),
            ("SWITCHYARD_QUIC_ENABLED", "false"),
        ]),
        &[Override::flag(
            "grpc.listen",
            "grpc-listen",
            "127.0.0.1:9002",
        )],
    )
    .unwrap();
    assert_eq!(
        config.grpc.listen.to_string(),
        "127.0.0.1:9002",
        "flag wins"
    );
    assert_eq!(config.dispatch.loss_budget, 5, "env beats the file");
    assert_eq!(
        config.grpc.registration_deadline,
        ConfigDuration::secs(3),
        "file beats the default"
    );
    assert!(!config.quic.enabled);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn lists_of_tables_come_from_the_environment_as_inline_toml() {
    let config = GatewayConfig::load(
        None,
        env(&[(
            "SWITCHYARD_PRINCIPALS",
            r#"[{ name = "billing", token = "t1-0123456789abcdef", namespaces = ["billing"] }]"#,
        )]),
        &[],
    )
    .unwrap();
    assert_eq!(config.principals.len(), 1);
    assert_eq!(config.principals[0].name, "billing");
    assert_eq!(config.principals[0].namespaces, vec!["billing".to_owned()]);
}

#[test]
fn a_bad_env_value_names_its_key_and_variable() {
    let error =
        GatewayConfig::load(None, env(&[("SWITCHYARD_GRPC_LISTEN", "nowhere")]), &[]).unwrap_err();
    assert_eq!(
        invalid_key(&error),
        ("grpc.listen", "SWITCHYARD_GRPC_LISTEN")
    );
    let error = GatewayConfig::load(
        None,
        env(&[("SWITCHYARD_DISPATCH_LOSS_BUDGET", "lots")]),
        &[],
    )
    .unwrap_err();
    assert_eq!(
        invalid_key(&error),
        ("dispatch.loss_budget", "SWITCHYARD_DISPATCH_LOSS_BUDGET")
    );
    assert!(error.to_string().contains("lots"), "{error}");
}

#[test]
fn a_bad_file_value_names_its_key_and_variable() {
    let path = file("[liveness]\nping_interval = \"2 fortnights\"\n");
    let error = GatewayConfig::load(Some(&path), env(&[]), &[]).unwrap_err();
    assert_eq!(
        invalid_key(&error),
        (
            "liveness.ping_interval",
            "SWITCHYARD_LIVENESS_PING_INTERVAL"
        )
    );
    std::fs::remove_file(path).unwrap();

    let path = file("[namespaces]\npolicy = \"ajar\"\n");
    let error = GatewayConfig::load(Some(&path), env(&[]), &[]).unwrap_err();
    assert_eq!(invalid_key(&error).0, "namespaces.policy");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn unknown_keys_and_variables_are_refused_by_name() {
    let path = file("[grpc]\nlisten_on = \"127.0.0.1:1\"\n");
    let error = GatewayConfig::load(Some(&path), env(&[]), &[]).unwrap_err();
    assert!(error.to_string().contains("listen_on"), "{error}");
    std::fs::remove_file(path).unwrap();

    let error = GatewayConfig::load(None, env(&[("SWITCHYARD_GRPC_LISTN", "x")]), &[]).unwrap_err();
    assert!(
        matches!(&error, ConfigError::UnknownEnvVar { name } if name == "SWITCHYARD_GRPC_LISTN"),
        "{error}"
    );
    let unrelated = env(&[("PATH", "/bin"), ("SWITCHYARD_TOKEN", "client-only")]);
    assert!(GatewayConfig::load(None, unrelated, &[]).is_ok());
    // `docs/configuration.md`: the five client variables, all set, are left alone.
    let client = env(&[
        ("SWITCHYARD_ENDPOINT", "https://gw:7700"),
        ("SWITCHYARD_TOKEN", "client-only"),
        ("SWITCHYARD_CA", "/etc/ca.pem"),
        ("SWITCHYARD_CLIENT_CERT", "/etc/cert.pem"),
        ("SWITCHYARD_CLIENT_KEY", "/etc/key.pem"),
    ]);
    assert!(GatewayConfig::load(None, client, &[]).is_ok());
    assert_eq!(CLIENT_ENV_VARS.len(), 5);
}

#[test]
fn non_loopback_bind_without_principals_is_refused_with_the_reason() {
    let error = GatewayConfig::load(
        None,
        env(&[("SWITCHYARD_GRPC_LISTEN", "0.0.0.0:7700")]),
        &[],
    )
    .unwrap_err();
    assert!(matches!(error, ConfigError::Insecure { .. }), "{error}");
    assert_eq!(
        invalid_key(&error),
        ("grpc.listen", "SWITCHYARD_GRPC_LISTEN")
    );
    assert!(error.to_string().contains("no principal"), "{error}");

    let error = GatewayConfig::load(None, env(&[("SWITCHYARD_QUIC_LISTEN", "[::]:7701")]), &[])
        .unwrap_err();
    assert_eq!(invalid_key(&error).0, "quic.listen");

    let principals = r#"[{ name = "a", token = "t-0123456789abcdef", namespaces = ["*"] }]"#;
    let secured = GatewayConfig::load(
        None,
        env(&[
            ("SWITCHYARD_GRPC_LISTEN", "0.0.0.0:7700"),
            ("SWITCHYARD_PRINCIPALS", principals),
        ]),
        &[],
    );
    assert!(secured.is_ok(), "principals make a public bind acceptable");

    let plaintext = GatewayConfig::load(
        None,
        env(&[
            ("SWITCHYARD_GRPC_LISTEN", "0.0.0.0:7700"),
            ("SWITCHYARD_GRPC_TLS", "false"),
            ("SWITCHYARD_PRINCIPALS", principals),
        ]),
        &[],
    )
    .unwrap_err();
    assert_eq!(invalid_key(&plaintext).0, "grpc.tls");
}

#[test]
fn inconsistent_principals_and_namespaces_name_the_entry() {
    let cases = [
        (
            r#"[{ name = "a", namespaces = ["x"] }]"#,
            "SWITCHYARD_PRINCIPALS",
            "principals[0].token",
        ),
        (
            r#"[{ name = "a", token = "t-0123456789abcdef", namespaces = [] }]"#,
            "SWITCHYARD_PRINCIPALS",
            "principals[0].namespaces",
        ),
        (
            r#"[{ name = "a", token = "t-0123456789abcdef", namespaces = ["x"] }, { name = "b", token = "t-0123456789abcdef", namespaces = ["y"] }]"#,
            "SWITCHYARD_PRINCIPALS",
            "principals[1].token",
        ),
        (
            r#"[{ name = "a", token = "token-of-principal-a", namespaces = ["x"], roles = [] }]"#,
            "SWITCHYARD_PRINCIPALS",
            "principals[0].roles",
        ),
        (
            r#"[{ name = "a", token = "token-of-principal-a", namespaces = ["x"], max_workers = 0 }]"#,
            "SWITCHYARD_PRINCIPALS",
            "principals[0].max_workers",
        ),
        (
            r#"[{ name = "edge", pinned = ["n1"], prefer = ["n2"] }]"#,
            "SWITCHYARD_NAMESPACES_KNOWN",
            "namespaces.known[0].prefer",
        ),
        (
            r#"[{ name = "a", token = "token-of-principal-a", namespaces = ["x"] }, { name = "a", token = "token-of-principal-b", namespaces = ["y"] }]"#,
            "SWITCHYARD_PRINCIPALS",
            "principals[1].name",
        ),
        (
            r#"[{ name = "a", cert_subject = "CN=w", namespaces = ["x"] }, { name = "b", cert_subject = "CN=w", namespaces = ["y"] }]"#,
            "SWITCHYARD_PRINCIPALS",
            "principals[1].cert_subject",
        ),
    ];
    for (value, var, key) in cases {
        let error = GatewayConfig::load(None, env(&[(var, value)]), &[]).unwrap_err();
        assert_eq!(invalid_key(&error), (key, var), "{value}");
    }
    // Control: two principals differing in name, token and subject load, and a principal's
    // `max_workers` defaults to the documented 1000.
    let loaded = GatewayConfig::load(
        None,
        env(&[(
            "SWITCHYARD_PRINCIPALS",
            r#"[{ name = "a", token = "token-of-principal-a", namespaces = ["x"] }, { name = "b", cert_subject = "CN=w", namespaces = ["y"] }]"#,
        )]),
        &[],
    )
    .expect("distinct principals load");
    assert_eq!(loaded.principals.len(), 2);
    assert!(loaded.principals.iter().all(|p| p.max_workers == 1000));
}

#[test]
fn zero_and_contradictory_limits_are_refused() {
    for (var, value, key) in [
        (
            "SWITCHYARD_DISPATCH_MAX_IN_FLIGHT_PER_STREAM",
            "0",
            "dispatch.max_in_flight_per_stream",
        ),
        (
            "SWITCHYARD_LIVENESS_PING_INTERVAL",
            "0s",
            "liveness.ping_interval",
        ),
        (
            "SWITCHYARD_DISPATCH_MAX_STREAM_OUTSTANDING",
            "0",
            "dispatch.max_stream_outstanding",
        ),
        (
            "SWITCHYARD_DISPATCH_SLOW_CONSUMER_TIMEOUT",
            "0s",
            "dispatch.slow_consumer_timeout",
        ),
        (
            "SWITCHYARD_GRPC_MAX_WORKERS_PER_CONNECTION",
            "0",
            "grpc.max_workers_per_connection",
        ),
        (
            "SWITCHYARD_DISPATCH_MAX_PARKED_PER_NAMESPACE",
            "0",
            "dispatch.max_parked_per_namespace",
        ),
        (
            "SWITCHYARD_DISPATCH_MAX_HELD_INPUT_BYTES_PER_PRINCIPAL",
            "0",
            "dispatch.max_held_input_bytes_per_principal",
        ),
        (
            "SWITCHYARD_DISPATCH_CANCEL_ACK_TIMEOUT",
            "0s",
            "dispatch.cancel_ack_timeout",
        ),
        (
            "SWITCHYARD_DISPATCH_MAX_UNRESPONSIVE_TASKS",
            "0",
            "dispatch.max_unresponsive_tasks",
        ),
        (
            "SWITCHYARD_REGISTRY_MAX_NAMESPACES",
            "0",
            "registry.max_namespaces",
        ),
        (
            "SWITCHYARD_REGISTRY_NAMESPACE_IDLE_EXPIRY",
            "0s",
            "registry.namespace_idle_expiry",
        ),
        (
            "SWITCHYARD_DISPATCH_DEFAULT_TIMEOUT",
            "2h",
            "dispatch.default_timeout",
        ),
        ("SWITCHYARD_TLS_CERT", "/some/cert.pem", "tls.key"),
        (
            "SWITCHYARD_TLS_REQUIRE_CLIENT_CERT",
            "true",
            "tls.require_client_cert",
        ),
        (
            "SWITCHYARD_QUIC_SOCKET_BUFFER",
            "4294967296",
            "quic.socket_buffer",
        ),
        (
            "SWITCHYARD_QUIC_MAX_CONNECTIONS_PER_ADDRESS",
            "0",
            "quic.max_connections_per_address",
        ),
        (
            "SWITCHYARD_QUIC_MAX_UNVALIDATED_HANDSHAKES",
            "0",
            "quic.max_unvalidated_handshakes",
        ),
        ("SWITCHYARD_QUIC_RETRY", "sometimes", "quic.retry"),
        (
            "SWITCHYARD_QUIC_ACK_ELICITING_THRESHOLD",
            "65",
            "quic.ack_eliciting_threshold",
        ),
        (
            "SWITCHYARD_QUIC_ACK_ELICITING_THRESHOLD",
            "-1",
            "quic.ack_eliciting_threshold",
        ),
        (
            "SWITCHYARD_QUIC_SEND_FAIRNESS",
            "sometimes",
            "quic.send_fairness",
        ),
    ] {
        let error = GatewayConfig::load(None, env(&[(var, value)]), &[]).unwrap_err();
        assert_eq!(invalid_key(&error).0, key, "{var}={value}");
    }
}

#[test]
fn every_key_has_a_variable_and_is_documented() {
    let doc = include_str!("../../../../docs/configuration.md");
    let keys = keys();
    assert!(keys.len() > 30, "only {} keys found", keys.len());
    for key in &keys {
        assert!(
            doc.contains(&format!("`{key}`")),
            "{key} is not in docs/configuration.md"
        );
        let var = env_var_for(key);
        assert!(doc.contains(&var), "{var} is not in docs/configuration.md");
    }
}

#[test]
fn every_documented_default_is_the_default() {
    let doc = include_str!("../../../../docs/configuration.md");
    let defaults = defaults_table();
    let mut checked = 0;
    for key in keys() {
        let row = format!("| `{key}` | `{}` | ", env_var_for(&key));
        let Some(at) = doc.find(&row) else { continue };
        let rest = &doc[at + row.len()..];
        let documented = rest.split(" |").next().unwrap().trim_matches('`');
        let value = key
            .split('.')
            .try_fold(&defaults, |table, part| match &table[part] {
                toml::Value::Table(inner) => Ok(inner),
                leaf => Err(leaf),
            })
            .unwrap_err();
        let actual = match value {
            toml::Value::String(text) if text.is_empty() => "empty".to_owned(),
            toml::Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        // Durations may be written in another unit (`60s` for `1m`).
        let same_duration = matches!(
            (documented.parse::<ConfigDuration>(), actual.parse::<ConfigDuration>()),
            (Ok(doc), Ok(code)) if doc == code
        );
        assert!(
            documented == actual || same_duration,
            "{key}: documented {documented}, default {actual}"
        );
        checked += 1;
    }
    assert_eq!(checked, keys().len(), "every key has a row");
}

#[test]
fn required_client_certificates_need_tls_on_the_grpc_listener() {
    let vars = [
        ("SWITCHYARD_TLS_REQUIRE_CLIENT_CERT", "true"),
        ("SWITCHYARD_TLS_CLIENT_CA", "/some/ca.pem"),
    ];
    GatewayConfig::load(None, env(&vars), &[]).expect("certificates required, with a CA");
    let plaintext = [vars[0], vars[1], ("SWITCHYARD_GRPC_TLS", "false")];
    let error = GatewayConfig::load(None, env(&plaintext), &[]).unwrap_err();
    assert_eq!(invalid_key(&error).0, "tls.require_client_cert");
}

#[test]
fn roles_parse_by_name_and_an_unknown_role_is_refused() {
    let principals = r#"[{ name = "a", token = "token-of-principal-a", namespaces = ["x"], roles = ["worker", "operator"], max_workers = 5 }]"#;
    let config = GatewayConfig::load(None, env(&[("SWITCHYARD_PRINCIPALS", principals)]), &[])
        .expect("valid roles");
    assert_eq!(
        config.principals[0].roles,
        Some(vec![RoleName::Worker, RoleName::Operator])
    );
    assert_eq!(config.principals[0].max_workers, 5);
    // Control: a role the gateway does not know is not silently dropped.
    let unknown =
        r#"[{ name = "a", token = "token-of-principal-a", namespaces = ["x"], roles = ["root"] }]"#;
    assert!(GatewayConfig::load(None, env(&[("SWITCHYARD_PRINCIPALS", unknown)]), &[]).is_err());
}

#[test]
fn the_store_defaults_to_a_synchronous_sqlite_file_in_the_data_directory() {
    let config = GatewayConfig::load(None, env(&[]), &[]).unwrap();
    assert_eq!(config.store.backend, StoreBackendName::Sqlite);
    assert_eq!(config.store.synchronous, SynchronousName::Full);
    assert_eq!(config.store.outcome_retention, ConfigDuration::secs(86_400));
    assert_eq!(config.dispatch.durability, DurabilityName::Ephemeral);
    let data_dir = std::path::Path::new("/var/lib/switchyard");
    assert_eq!(
        config.store.resolved_path(data_dir),
        data_dir.join("dispatches.sqlite3")
    );
    // Control: an explicit path wins over the data directory.
    let moved = GatewayConfig::load(
        None,
        env(&[
            ("SWITCHYARD_STORE_PATH", "/srv/store.db"),
            ("SWITCHYARD_STORE_SYNCHRONOUS", "normal"),
        ]),
        &[],
    )
    .unwrap();
    assert_eq!(
        moved.store.resolved_path(data_dir),
        PathBuf::from("/srv/store.db")
    );
    assert_eq!(moved.store.synchronous, SynchronousName::Normal);
}

#[test]
fn unusable_store_settings_are_refused_naming_their_key() {
    for (var, value, key) in [
        (
            "SWITCHYARD_STORE_OUTCOME_RETENTION",
            "0s",
            "store.outcome_retention",
        ),
        (
            "SWITCHYARD_STORE_MAX_QUEUED_PER_NAMESPACE",
            "0",
            "store.max_queued_per_namespace",
        ),
        ("SWITCHYARD_STORE_MAX_BYTES", "0", "store.max_bytes"),
        ("SWITCHYARD_STORE_BACKEND", "postgres", "store.backend"),
        ("SWITCHYARD_STORE_SYNCHRONOUS", "off", "store.synchronous"),
        (
            "SWITCHYARD_DISPATCH_DURABILITY",
            "sometimes",
            "dispatch.durability",
        ),
    ] {
        let error = GatewayConfig::load(None, env(&[(var, value)]), &[]).unwrap_err();
        assert_eq!(invalid_key(&error), (key, var), "{var}={value}: {error}");
    }
    let error = GatewayConfig::load(
        None,
        env(&[
            ("SWITCHYARD_STORE_BACKEND", "memory"),
            ("SWITCHYARD_STORE_PATH", "/srv/store.db"),
        ]),
        &[],
    )
    .unwrap_err();
    assert_eq!(invalid_key(&error).0, "store.path");
    assert!(error.to_string().contains("\"memory\""), "{error}");
    // Control: the memory backend alone, and each bound at 1, are accepted.
    let config = GatewayConfig::load(
        None,
        env(&[
            ("SWITCHYARD_STORE_BACKEND", "memory"),
            ("SWITCHYARD_STORE_MAX_QUEUED_PER_NAMESPACE", "1"),
            ("SWITCHYARD_STORE_MAX_BYTES", "1"),
        ]),
        &[],
    )
    .unwrap();
    assert_eq!(config.store.backend, StoreBackendName::Memory);
}

#[test]
fn a_namespace_durability_is_read_and_absent_follows_the_dispatch_default() {
    let path = file(
        r#"
        [dispatch]
        durability = "durable"
        [[namespaces.known]]
        name = "billing"
        durability = "ephemeral"
        [[namespaces.known]]
        name = "edge"
        "#,
    );
    let config = GatewayConfig::load(Some(&path), env(&[]), &[]).unwrap();
    assert_eq!(config.dispatch.durability, DurabilityName::Durable);
    assert_eq!(
        config.namespaces.known[0].durability,
        Some(DurabilityName::Ephemeral)
    );
    assert_eq!(config.namespaces.known[1].durability, None);
    // Control: an unknown value in an entry is refused, not read as the default.
    let bad = file(
        r#"
        [[namespaces.known]]
        name = "billing"
        durability = "forever"
        "#,
    );
    let error = GatewayConfig::load(Some(&bad), env(&[]), &[]).unwrap_err();
    assert!(error.to_string().contains("namespaces.known"), "{error}");
}

#[test]
fn durable_by_default_in_cluster_mode_needs_the_jetstream_store_naming_it() {
    let cluster = ("SWITCHYARD_CLUSTER_NATS_URL", "nats://127.0.0.1:4222");
    let durable = ("SWITCHYARD_DISPATCH_DURABILITY", "durable");
    let error = GatewayConfig::load(None, env(&[cluster, durable]), &[]).unwrap_err();
    assert_eq!(invalid_key(&error).0, "store.backend");
    let text = error.to_string();
    assert!(
        text.contains("dispatch.durability is \"durable\""),
        "{text}"
    );
    assert!(text.contains("store.backend = \"jetstream\""), "{text}");
    let path = file(
        r#"
        [cluster]
        nats_url = "nats://127.0.0.1:4222"
        [[namespaces.known]]
        name = "billing"
        durability = "durable"
        "#,
    );
    let error = GatewayConfig::load(Some(&path), env(&[]), &[]).unwrap_err();
    assert!(
        error.to_string().contains("namespace \"billing\""),
        "{error}"
    );
    // The jetstream store needs cluster mode.
    let jetstream = ("SWITCHYARD_STORE_BACKEND", "jetstream");
    let error = GatewayConfig::load(None, env(&[jetstream]), &[]).unwrap_err();
    assert_eq!(invalid_key(&error).0, "store.backend");
    // Controls: durable by default alone (one node), cluster mode with ephemeral defaults, and
    // cluster mode with the jetstream store all start.
    assert!(GatewayConfig::load(None, env(&[durable]), &[]).is_ok());
    let config = GatewayConfig::load(None, env(&[cluster]), &[]).unwrap();
    assert!(super::cluster::durable_refusal(&config).is_some());
    let config = GatewayConfig::load(None, env(&[cluster, durable, jetstream]), &[]).unwrap();
    assert_eq!(super::cluster::durable_refusal(&config), None);
}

#[test]
fn every_toml_example_of_the_configuration_page_is_accepted() {
    let doc = include_str!("../../../../docs/configuration.md");
    let examples: Vec<&str> = doc
        .split("```toml")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .collect();
    assert_eq!(examples.len(), 2, "the page's examples");
    for example in examples {
        let path = file(example);
        let loaded = GatewayConfig::load(Some(&path), env(&[]), &[]);
        let _ = std::fs::remove_file(&path);
        if let Err(error) = loaded {
            panic!("docs/configuration.md's example is refused: {error}\n{example}");
        }
    }
}

#[test]
fn a_reconnect_grace_past_what_the_wire_carries_is_refused_naming_the_key() {
    let load = |grace: &str| {
        GatewayConfig::load(
            None,
            env(&[("SWITCHYARD_QUIC_RECONNECT_GRACE", grace)]),
            &[],
        )
    };
    let refused = load("4294967296ms").unwrap_err();
    assert_eq!(
        invalid_key(&refused),
        ("quic.reconnect_grace", "SWITCHYARD_QUIC_RECONNECT_GRACE")
    );
    assert!(refused.to_string().contains("4294967295ms"), "{refused}");
    // Control: the most the wire carries, and no grace at all, are accepted.
    assert!(load("4294967295ms").is_ok());
    assert!(load("0s").is_ok());
}

/// Each key's zero, when its default is a positive count or a duration: `0` or `0s`.
fn zero_of(default: &toml::Value) -> Option<&'static str> {
    match default {
        toml::Value::Integer(n) if *n > 0 => Some("0"),
        toml::Value::String(text)
            if text.starts_with(|c: char| c.is_ascii_digit())
                && text.ends_with(['s', 'm', 'h'])
                && !text.starts_with('0') =>
        {
            Some("0s")
        }
        _ => None,
    }
}

/// "A zero duration or limit is refused naming the key" (`docs/configuration.md`), for every
/// key there is (with a cluster configured for the `cluster.*` keys, which are read only then),
/// but the ones whose zero the table gives a meaning.
#[test]
fn every_zero_duration_or_limit_is_refused_naming_its_key() {
    let defaults = defaults_table();
    let default_of = |key: &str| -> Option<toml::Value> {
        let mut parts: Vec<&str> = key.split('.').collect();
        let leaf = parts.pop()?;
        let table = parts
            .iter()
            .try_fold(&defaults, |table, part| match table.get(*part) {
                Some(toml::Value::Table(inner)) => Some(inner),
                _ => None,
            })?;
        table.get(leaf).cloned()
    };
    let mut accepted = Vec::new();
    let mut tried = 0;
    for key in keys() {
        let Some(zero) = default_of(&key).as_ref().and_then(zero_of) else {
            continue;
        };
        tried += 1;
        let var = env_var_for(&key);
        let mut vars = vec![(var.as_str(), zero)];
        if key.starts_with("cluster.") {
            vars.push(("SWITCHYARD_CLUSTER_NATS_URL", "nats://127.0.0.1:4222"));
        }
        match GatewayConfig::load(None, env(&vars), &[]) {
            Ok(_) => accepted.push(key),
            Err(error) => assert_eq!(invalid_key(&error).0, key, "{var}={zero}: {error}"),
        }
    }
    assert!(tried > 40, "only {tried} keys tried");
    // The zeros the table gives a meaning: no sessions, no keep-alive packets, the kernel's
    // socket buffer, no delivery after a loss, no wait at shutdown, no hold of a full pool's
    // offer subscription.
    assert_eq!(
        accepted,
        [
            "cluster.offer_hold",
            "dispatch.loss_budget",
            "grpc.reconnect_grace",
            "quic.keep_alive_interval",
            "quic.reconnect_grace",
            "quic.socket_buffer",
            "shutdown.drain_timeout",
        ]
    );
}

#[test]
fn a_heartbeat_window_not_longer_than_the_ping_interval_is_refused() {
    let error = GatewayConfig::load(
        None,
        env(&[
            ("SWITCHYARD_LIVENESS_PING_INTERVAL", "40s"),
            ("SWITCHYARD_LIVENESS_HEARTBEAT_WINDOW", "30s"),
        ]),
        &[],
    )
    .unwrap_err();
    assert_eq!(
        invalid_key(&error).0,
        "liveness.heartbeat_window",
        "{error}"
    );
    // Control: a window one second longer than the interval loads.
    assert!(
        GatewayConfig::load(
            None,
            env(&[
                ("SWITCHYARD_LIVENESS_PING_INTERVAL", "29s"),
                ("SWITCHYARD_LIVENESS_HEARTBEAT_WINDOW", "30s"),
            ]),
            &[],
        )
        .is_ok()
    );
}

/// `[cluster]`'s checks, each refused naming its key, and what the node is given to connect
/// with.
#[test]
fn the_cluster_section_is_checked_by_key_and_carries_its_credentials() {
    let url = (
        "SWITCHYARD_CLUSTER_NATS_URL",
        "nats://10.0.0.1:4222,nats://10.0.0.2:4222",
    );
    for (var, value, key) in [
        ("SWITCHYARD_CLUSTER_NAME", "a.b", "cluster.name"),
        ("SWITCHYARD_CLUSTER_NODE", "n*", "cluster.node"),
        (
            "SWITCHYARD_CLUSTER_TLS_CERT",
            "/etc/nats/node.pem",
            "cluster.tls_cert",
        ),
        (
            "SWITCHYARD_CLUSTER_TLS_KEY",
            "/etc/nats/node.key",
            "cluster.tls_cert",
        ),
        (
            "SWITCHYARD_CLUSTER_REFRESH_EVERY",
            "10s",
            "cluster.refresh_every",
        ),
    ] {
        let error = GatewayConfig::load(None, env(&[url, (var, value)]), &[]).unwrap_err();
        assert_eq!(invalid_key(&error).0, key, "{var}={value}: {error}");
        // Control: without [cluster] the section is not read at all.
        assert!(
            GatewayConfig::load(None, env(&[(var, value)]), &[]).is_ok(),
            "{var}"
        );
    }
    let config = GatewayConfig::load(
        None,
        env(&[
            url,
            ("SWITCHYARD_CLUSTER_NODE", "n-1"),
            (
                "SWITCHYARD_CLUSTER_CREDENTIALS_FILE",
                "/etc/nats/node.creds",
            ),
            ("SWITCHYARD_CLUSTER_TLS_CA", "/etc/nats/ca.pem"),
            ("SWITCHYARD_CLUSTER_TLS_CERT", "/etc/nats/node.pem"),
            ("SWITCHYARD_CLUSTER_TLS_KEY", "/etc/nats/node.key"),
            ("SWITCHYARD_CLUSTER_REFRESH_EVERY", "2s"),
            ("SWITCHYARD_CLUSTER_MEMBER_TTL", "6s"),
        ]),
        &[],
    )
    .unwrap();
    let node = super::cluster::cluster_config(&config.cluster, config.store.backend, None, None);
    assert_eq!(node.nats_url, url.1);
    assert_eq!(node.node, "n-1");
    let path = |p: &str| Some(PathBuf::from(p));
    assert_eq!(node.credentials_file, path("/etc/nats/node.creds"));
    assert_eq!(node.tls_ca_file, path("/etc/nats/ca.pem"));
    assert_eq!(
        node.tls_client,
        Some((
            PathBuf::from("/etc/nats/node.pem"),
            PathBuf::from("/etc/nats/node.key")
        ))
    );
    assert_eq!(node.refresh_every, std::time::Duration::from_secs(2));
    assert_eq!(node.member_ttl, std::time::Duration::from_secs(6));
    // Control: none of them set, none given.
    let bare = GatewayConfig::load(None, env(&[url]), &[]).unwrap();
    let bare = super::cluster::cluster_config(&bare.cluster, bare.store.backend, None, None);
    assert_eq!(
        (bare.credentials_file, bare.tls_ca_file, bare.tls_client),
        (None, None, None)
    );
}
